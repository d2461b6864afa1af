"""Dynamically quantized models (onnxruntime's quantize_dynamic and the older onnx.quantize
tool) turned back into float ones, so that they can be quantized statically.

Such a model computes each activation's scale at run time:

    x -> DynamicQuantizeLinear -> (x_q, x_scale, x_zp)
    ConvInteger / MatMulInteger (x_q, W_q, x_zp, w_zp) [-> Add (bias as int32)] -> Cast(float)
      -> Mul (by x_scale * w_scale) -> y

The TPU's requantization is static (scales fixed when the program is written), so this chain
cannot run there as it is.  Its weights are what the user trained, though: each chain is
rewritten here as the float Conv / MatMul it approximates, with W = (W_q - w_zp) * w_scale
and the float bias the int32 one was made from (the older tool quantizes the bias at run time
from its float initializer: Floor(b / (x_scale * w_scale))).  The compiler then calibrates
and quantizes the model like any float one, every chain's weights going to the TPU.

An LSTM becomes onnxruntime's contrib DynamicQuantizeLSTM (com.microsoft): the ONNX LSTM's
inputs, attributes and outputs, but W and R as int8/uint8 with a scale and zero point per
direction (or per direction and gate column), and transposed: W_q is (directions,
input_size, 4 * hidden) where the LSTM's W is (directions, 4 * hidden, input_size).  It is
read back as that float LSTM, W = ((W_q - zp) * scale) transposed, so that the LSTM
unrolling (prepare.py) puts its gate Gemms on the TPU like any float LSTM's.

The constant weights it dequantizes itself (an embedding table: Gather(W_q, ids) ->
DequantizeLinear) are read back as float constants too.  So are the transformer forms it
writes over onnxruntime's transformer optimizer (the int8 BERT recipe: optimize_model, then
quantize_dynamic): com.microsoft QAttention (x quantized at run time, its packed Q/K/V
weights int8) is the float Attention of W = (W_q - zp) * scale over x (ortfusions.py then
reads that as standard nodes), QEmbedLayerNormalization the EmbedLayerNormalization of its
dequantized tables.

A chain of another shape is left as it is (it runs on the host, with its reason)."""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from tpuasm.compiler.front.prepare import _Index, drop_unused_initializers

_INTEGER_OPS = ("ConvInteger", "MatMulInteger")
# onnxruntime's fusions of those chains (com.microsoft), as a session saves its optimized
# model: DynamicQuantizeMatMul(x, W_q, w_scale, w_zp, bias) quantizes x itself,
# MatMulIntegerToFloat(x_q, W_q, x_scale, w_scale, x_zp, w_zp, bias) reads a
# DynamicQuantizeLinear's outputs
_FUSED_OPS = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat")


def _is_quantized_lstm(node) -> bool:
    return node.op_type == "DynamicQuantizeLSTM" and node.domain == "com.microsoft"


def is_dynamically_quantized(model) -> bool:
    """quantize_dynamic's marks: DynamicQuantizeLinear, a DynamicQuantizeLSTM, or a
    MatMulInteger reading an int8 table's Gather (a model whose only quantized activations
    are embedding rows)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    return any(n.op_type == "DynamicQuantizeLinear" or _is_quantized_lstm(n)
               or (n.op_type in _FUSED_OPS and n.domain == "com.microsoft")
               or (n.op_type == "MatMulInteger" and n.input and
                   getattr(producer.get(n.input[0]), "op_type", None) == "Gather")
               for n in model.graph.node)


def dequantize_dynamic(model) -> int:
    """Rewrite (in place) every dynamically quantized Conv/MatMul chain and LSTM into float;
    the count rewritten.  Nodes left without a consumer are dropped."""
    idx = _Index(model)
    replaced: dict[str, list] = {}    # the chain's last node (its first output) -> float nodes
    dead: set[str] = set()            # the other nodes of the chains (their first outputs)
    for node in model.graph.node:
        if _is_quantized_lstm(node):
            lstm = _float_lstm(node, idx)
            if lstm is not None:
                replaced[node.output[0]] = [lstm]
            continue
        if node.op_type == "DequantizeLinear":
            table = float_table(node, idx)
            if table is not None:
                replaced[node.output[0]] = table[1]
                dead.update(n.output[0] for n in table[0])
            continue
        if node.op_type in _FUSED_OPS and node.domain == "com.microsoft":
            fused = _fused_matmul(node, idx)
            if fused is not None:
                replaced[node.output[0]] = fused
            continue
        if node.op_type in _TRANSFORMER_OPS and node.domain == "com.microsoft":
            read = _TRANSFORMER_OPS[node.op_type](node, idx)
            if read is not None:
                replaced[node.output[0]] = [read]
            continue
        if node.op_type not in _INTEGER_OPS:
            continue
        chain = _chain(node, idx)
        if chain is None:
            continue
        last, nodes, new = chain
        replaced[last.output[0]] = new
        dead.update(n.output[0] for n in nodes)
    if not replaced:
        return 0
    kept = []
    for n in model.graph.node:
        first = n.output[0] if n.output else None
        if first in replaced:
            kept.extend(replaced[first])
        elif first not in dead:
            kept.append(n)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    _drop_unused(model)
    return len(replaced)


def _fused_matmul(node, idx: _Index):
    """[MatMul, Add of the bias] in float for one of _FUSED_OPS with constant weights, or
    None."""
    inputs = list(node.input) + [""] * (7 - len(node.input))
    if node.op_type == "DynamicQuantizeMatMul":
        x, w, scale, zero, bias = (inputs[i] for i in (0, 1, 2, 3, 4))
    else:
        source = idx.producer.get(inputs[0])
        if source is None or source.op_type != "DynamicQuantizeLinear" or \
                inputs[2] != source.output[1] or inputs[4] not in ("", source.output[2]):
            return None               # not x quantized at run time: another chain's form
        x = source.input[0]
        w, scale, zero, bias = (inputs[i] for i in (1, 3, 5, 6))
    w_q, w_scale = idx.const(w), idx.const(scale)
    w_zp = idx.const(zero) if zero else np.zeros((), np.int8)
    b = idx.const(bias) if bias else None
    if w_q is None or w_scale is None or w_zp is None or w_q.ndim != 2 or \
            (bias and (b is None or b.size != w_q.shape[1])):
        return None
    weight = _float_weight("MatMulInteger", w_q, w_zp, w_scale)
    if weight is None:
        return None
    y = node.output[0]
    name = node.name or y
    w_name = idx.add_init(weight, f"{name}_dequantized")
    b_name = None if b is None else idx.add_init(b.astype(np.float32).reshape(-1),
                                                 f"{y}_bias")
    return float_matmul(idx, x, w_name, y, name, b_name)


def _float_attention(node, idx: _Index):
    """QAttention(x_q, W_q, bias, x_scale, w_scale, mask, x_zp, w_zp[, past]) over x
    quantized at run time, as the float Attention(x, W, bias, mask), or None."""
    inputs = list(node.input) + [""] * (9 - len(node.input))
    source = idx.producer.get(inputs[0])
    if source is None or source.op_type != "DynamicQuantizeLinear" or inputs[8] or \
            inputs[3] != source.output[1] or inputs[6] not in ("", source.output[2]):
        return None
    w_q, w_scale = idx.const(inputs[1]), idx.const(inputs[4])
    w_zp = idx.const(inputs[7]) if inputs[7] else np.zeros((), np.int8)
    if w_q is None or w_scale is None or w_zp is None or w_q.ndim != 2:
        return None
    weight = _float_weight("MatMulInteger", w_q, w_zp, w_scale)
    if weight is None:
        return None
    name = node.name or node.output[0]
    ins = [source.input[0], idx.add_init(weight, f"{name}_qkv_dequantized"), inputs[2],
           inputs[5]]
    while not ins[-1]:
        ins.pop()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return helper.make_node("Attention", ins, list(node.output), name=name,
                            domain="com.microsoft", **attrs)


def _float_embed_layer_norm(node, idx: _Index):
    """QEmbedLayerNormalization(ids, segments, 5 int8 tables, mask, their 5 scales, their 5
    zero points) as the EmbedLayerNormalization of the dequantized tables, or None."""
    inputs = list(node.input) + [""] * (18 - len(node.input))
    tables = []
    for i in range(5):
        q, scale, zero = inputs[2 + i], inputs[8 + i], inputs[13 + i]
        if not q:
            tables.append("")
            continue
        q_v, s_v = idx.const(q), idx.const(scale)
        z_v = idx.const(zero) if zero else np.zeros((), np.uint8)
        if q_v is None or s_v is None or z_v is None or s_v.size != 1 or z_v.size != 1:
            return None
        value = (q_v.astype(np.float32) - np.float32(z_v)) * np.float32(s_v)
        tables.append(idx.add_init(value.astype(np.float32), f"{q}_dequantized"))
    ins = [inputs[0], inputs[1], *tables, inputs[7]]
    while not ins[-1]:
        ins.pop()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return helper.make_node("EmbedLayerNormalization", ins, list(node.output),
                            name=node.name or node.output[0], domain="com.microsoft",
                            **attrs)


_TRANSFORMER_OPS = {"QAttention": _float_attention,
                    "QEmbedLayerNormalization": _float_embed_layer_norm}


def float_matmul(idx: _Index, x: str, weight: str, y: str, name: str,
                 bias: str | None = None) -> list:
    """MatMul(x, weight) -> y under the quantized node's name, and the Add of `bias` (a
    tensor) after it where there is one: what a read-back chain or contrib node becomes."""
    if not bias:
        return [helper.make_node("MatMul", [x, weight], [y], name=name)]
    product = idx.unique(f"{y}_product")
    return [helper.make_node("MatMul", [x, weight], [product], name=name),
            helper.make_node("Add", [product, bias], [y], name=idx.unique(f"{name}_bias_add"))]


def _only_consumer(tensor: str, idx: _Index, op_type: str):
    user = idx.sole_consumer(tensor)
    return user if user is not None and user.op_type == op_type else None


def _chain(node, idx: _Index):
    """(the chain's last node, its nodes, the float nodes replacing them), or None."""
    inputs = list(node.input) + [""] * (4 - len(node.input))
    source = idx.producer.get(inputs[0])
    w_q = idx.const(inputs[1])
    if source is None or w_q is None:
        return None
    w_zp = idx.const(inputs[3]) if inputs[3] else np.zeros((), w_q.dtype)
    if w_zp is None:
        return None
    gathered = None             # an int8 table's rows (quantize_dynamic's Gather) instead
    if source.op_type == "DynamicQuantizeLinear":
        x, x_scale = source.input[0], source.output[1]
    elif node.op_type == "MatMulInteger" and source.op_type == "Gather":
        gathered = _table_rows(source, inputs[2], idx)
        if gathered is None:
            return None
        x, x_scale = gathered.output[0], None
    else:
        return None
    nodes = [node]
    out = node.output[0]
    bias = None
    add = _only_consumer(out, idx, "Add")
    if add is not None:
        other = add.input[1] if add.input[0] == out else add.input[0]
        bias = _float_bias(other, idx)
        if bias is None:
            return None
        nodes.append(add)
        out = add.output[0]
    cast = _only_consumer(out, idx, "Cast")
    if cast is None:
        return None
    mul = _only_consumer(cast.output[0], idx, "Mul")
    if mul is None:
        return None
    scale = mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]
    # the table's rows stay in its integer steps: the whole scale goes to the weights
    w_scale = _weight_scale(scale, x_scale, idx) if gathered is None else \
        _constant_scale(scale, idx)
    if w_scale is None:
        return None
    nodes += [cast, mul]
    weight = _float_weight(node.op_type, w_q, w_zp, w_scale)
    if weight is None:
        return None
    w_name = idx.add_init(weight, f"{node.name or node.output[0]}_dequantized")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    y = mul.output[0]
    if node.op_type == "ConvInteger":
        ins = [x, w_name]
        if bias is not None:
            ins.append(idx.add_init(bias.reshape(-1), f"{node.name or y}_bias"))
        return mul, nodes, [helper.make_node("Conv", ins, [y], name=node.name or y, **attrs)]
    first = [gathered] if gathered is not None else []
    b_name = None if bias is None else idx.add_init(bias.reshape(-1), f"{y}_bias")
    return mul, nodes, first + float_matmul(idx, x, w_name, y, node.name or y, b_name)


def float_table(node, idx: _Index):
    """(the nodes it replaces, the float nodes) for a DequantizeLinear of a constant weight,
    or None.  quantize_dynamic writes an embedding table as int8 with one scale:
    Gather(W_q, ids) -> DequantizeLinear; it becomes Gather(W, ids).  A DequantizeLinear
    of a constant itself becomes that constant in float."""
    inputs = list(node.input) + [""] * (3 - len(node.input))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    scale = idx.const(inputs[1])
    zero = idx.const(inputs[2]) if inputs[2] else np.zeros((), np.int8)
    if scale is None or zero is None or attrs.get("block_size", 0):
        return None
    y = node.output[0]
    w = float_constant(node, idx)
    if w is not None:
        idx.model.graph.initializer.append(numpy_helper.from_array(w, y))
        return [], []
    gather = idx.producer.get(inputs[0])
    if gather is None or gather.op_type != "Gather" or scale.size != 1 or zero.size != 1 \
            or idx.sole_consumer(gather.output[0]) is not node:
        return None
    table = idx.const(gather.input[0])
    if table is None:
        return None
    w = (table.astype(np.float32) - np.float32(zero.reshape(()))) * np.float32(
        scale.reshape(()))
    w_name = idx.add_init(w.astype(np.float32), f"{gather.input[0]}_dequantized")
    g_attrs = {a.name: helper.get_attribute_value(a) for a in gather.attribute}
    return [gather], [helper.make_node("Gather", [w_name, gather.input[1]], [y],
                                       name=gather.name or y, **g_attrs)]


def float_constant(node, idx: _Index):
    """The float value of a DequantizeLinear of a constant, (W_q - zero point) * scale
    along its axis (per tensor, per channel, or per block of `block_size` along the axis:
    opset 21's block-wise form), or None (not a constant, or scales that do not fit its
    axis)."""
    inputs = list(node.input) + [""] * (3 - len(node.input))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    w_q, scale = idx.const(inputs[0]), idx.const(inputs[1])
    zero = idx.const(inputs[2]) if inputs[2] else np.zeros((), np.int8)
    if w_q is None or scale is None or zero is None:
        return None
    axis = attrs.get("axis", 1) % max(w_q.ndim, 1)
    block = attrs.get("block_size", 0)
    if block:                         # scales (and zero points) of w_q's shape, the axis
        if w_q.ndim == 0 or scale.ndim != w_q.ndim or \
                scale.shape[axis] != -(-w_q.shape[axis] // block) or \
                zero.size > 1 and zero.shape != scale.shape:     # divided into blocks
            return None
        size = w_q.shape[axis]
        scale = np.repeat(scale, block, axis).take(range(size), axis)
        zero = np.repeat(zero, block, axis).take(range(size), axis) if zero.size > 1 else zero
        return ((w_q.astype(np.float32) - zero.astype(np.float32)) *
                scale.astype(np.float32)).astype(np.float32)
    per = tuple(-1 if d == axis else 1 for d in range(w_q.ndim))
    if scale.size > 1 and (w_q.ndim == 0 or scale.size != w_q.shape[axis]):
        return None
    if zero.size > 1 and zero.size != scale.size:
        return None
    w = (w_q.astype(np.float32) - np.asarray(zero, np.float32).reshape(
        per if zero.size > 1 else ())) * scale.astype(np.float32).reshape(
        per if scale.size > 1 else ())
    return w.astype(np.float32)


def _float_lstm(node, idx: _Index):
    """The float ONNX LSTM a DynamicQuantizeLSTM stands for, or None (weights that are not
    constants, scales of another shape)."""
    inputs = list(node.input) + [""] * (12 - len(node.input))
    weights = []
    for data, scale, zero in ((1, 8, 9), (2, 10, 11)):
        w_q, w_scale = idx.const(inputs[data]), idx.const(inputs[scale])
        w_zp = idx.const(inputs[zero]) if inputs[zero] else np.zeros((), np.int8)
        if w_q is None or w_scale is None or w_zp is None or w_q.ndim != 3:
            return None
        w = _lstm_weight(w_q, w_zp, w_scale)
        if w is None:
            return None
        weights.append(idx.add_init(w, f"{inputs[data]}_dequantized"))
    ins = [inputs[0], *weights, *inputs[3:8]]
    while ins and not ins[-1]:
        ins.pop()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return helper.make_node("LSTM", ins, list(node.output), name=node.name or node.output[0],
                            **attrs)


def _lstm_weight(w_q: np.ndarray, w_zp: np.ndarray, w_scale: np.ndarray):
    """(directions, K, 4H) int weights -> the LSTM's (directions, 4H, K) float ones: the
    scale and the zero point each one per direction, or per direction and column."""
    dirs, _, cols = w_q.shape

    def spread(v):
        v = np.asarray(v, np.float32)
        shapes = {1: (), dirs: (dirs, 1, 1), dirs * cols: (dirs, 1, cols)}
        return v.reshape(shapes[v.size]) if v.size in shapes else None

    zp, scale = spread(w_zp), spread(w_scale)
    if zp is None or scale is None:
        return None
    w = (w_q.astype(np.float32) - zp) * scale
    return np.ascontiguousarray(w.transpose(0, 2, 1), np.float32)


def _table_rows(gather, x_zero: str, idx: _Index):
    """A float Gather of an int8 table's rows less their zero point (in the table's integer
    steps), for a MatMulInteger that reads quantize_dynamic's Gather(W_q, ids) directly;
    or None (a table or zero point that is not a constant, a zero point per column)."""
    table = idx.const(gather.input[0])
    zero = idx.const(x_zero) if x_zero else np.zeros((), np.uint8)
    if table is None or zero is None or zero.size != 1:
        return None
    rows = table.astype(np.float32) - np.float32(zero.reshape(()))
    name = idx.add_init(rows, f"{gather.input[0]}_steps")
    attrs = {a.name: helper.get_attribute_value(a) for a in gather.attribute}
    return helper.make_node("Gather", [name, gather.input[1]],
                            [idx.unique(f"{gather.output[0]}_steps")],
                            name=idx.unique(f"{gather.name or gather.output[0]}_steps"), **attrs)


def _constant_scale(scale: str, idx: _Index):
    """The value of a constant scale: a constant, or the Mul of two (the table's scale
    times the weights' that quantize_dynamic writes), or None."""
    value = idx.const(scale)
    if value is not None:
        return np.asarray(value, np.float32)
    mul = idx.producer.get(scale)
    if mul is None or mul.op_type != "Mul":
        return None
    a, b = idx.const(mul.input[0]), idx.const(mul.input[1])
    if a is None or b is None:
        return None
    return (np.asarray(a, np.float32) * np.asarray(b, np.float32)).astype(np.float32)


def _weight_scale(scale: str, x_scale: str, idx: _Index):
    """The constant w_scale of scale = Mul(x_scale, w_scale), or None."""
    mul = idx.producer.get(scale)
    if mul is None or mul.op_type != "Mul" or x_scale not in mul.input:
        return None
    other = mul.input[1] if mul.input[0] == x_scale else mul.input[0]
    value = idx.const(other)
    return None if value is None else np.asarray(value, np.float32)


def _float_bias(tensor: str, idx: _Index):
    """The float bias an int32 bias input stands for: a constant one is not (the scale is
    only known at run time), the older tool's Reshape(Cast(Floor(Div(b, scale)))) is b."""
    node = idx.producer.get(tensor)
    while node is not None and node.op_type in ("Reshape", "Cast", "Floor"):
        node = idx.producer.get(node.input[0])
    if node is None or node.op_type != "Div":
        return None
    value = idx.const(node.input[0])
    return None if value is None else np.asarray(value, np.float32)


def _float_weight(op_type: str, w_q: np.ndarray, w_zp: np.ndarray, w_scale: np.ndarray):
    w = w_q.astype(np.float32)
    zp = np.asarray(w_zp, np.float32)
    if op_type == "ConvInteger":
        per = (-1,) + (1,) * (w.ndim - 1)          # per output channel: axis 0
    else:
        per = (1,) * (w.ndim - 1) + (-1,)          # per output column: the last axis
    zp = zp.reshape(per) if zp.size > 1 else zp
    scale = w_scale.reshape(per) if w_scale.size > 1 else w_scale
    try:
        return ((w - zp) * scale).astype(np.float32)
    except ValueError:                             # a scale that does not broadcast
        return None


def _drop_unused(model) -> None:
    """Drop the nodes nothing reads any more (the DynamicQuantizeLinear nodes, the scale
    arithmetic), then the initializers no node reads."""
    from tpuasm.compiler.front.graph import implicit_inputs
    graph = model.graph
    needed = {o.name for o in graph.output}
    kept = []
    for n in reversed(graph.node):
        if any(o in needed for o in n.output):
            kept.append(n)
            needed.update(i for i in (*n.input, *implicit_inputs(n)) if i)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    drop_unused_initializers(model)

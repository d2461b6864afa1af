"""A QDQ model given calibration data read back as the float model it was made from, so
that the compiler quantizes all of it itself.

onnxruntime's quantize_static quantizes only the operators it has a QDQ form for: an LSTM,
a GRU or an RNN stays float between the quantized layers, and as one float node it runs on
the host.  Compiled from a float model, such a node is unrolled into gate MatMuls the TPU
takes (prepare.py).  So, asked to calibrate a QDQ model (`--calibrate`), the compiler drops
its quantization and compiles the float model:

- a DequantizeLinear of a constant (a weight, a bias) becomes that constant in float,
  W = (W_q - zero point) * scale, along its axis (dynamicquant.float_constant);
- a QuantizeLinear -> DequantizeLinear pair on an activation is dropped, its readers
  reading the float tensor before it; where the quantized range starts or ends at its zero
  point, a Clip to that range takes its place (onnxruntime's quantizer removes a Relu,
  Relu6 or Clip after a quantized node and lets the output's range do the clipping).

A QOperator model comes here in its QDQ form (qoperator.py).  The user's scales are
replaced by the calibration's.  Any other quantized operator (MatMulInteger in a static
model, a QuantizeLinear read by other than DequantizeLinear or layout nodes) leaves the
model as it is, and the compile says why."""
from __future__ import annotations

import numpy as np

from tpuasm.compiler.front.dynamicquant import float_constant, float_table
from tpuasm.compiler.front.prepare import _Index, drop_unused_initializers
from tpuasm.compiler.front.scales import MASK_RANGE
from tpuasm.compiler.front.widths import integer_limits

_QDQ = ("QuantizeLinear", "DequantizeLinear")


def read_back(model) -> tuple[int, str | None]:
    """Rewrite the QDQ `model` in place as float; (the quantized tensors read back, None),
    or (0, why not) leaving it as it is."""
    other = sorted({n.op_type for n in model.graph.node
                    if n.op_type not in _QDQ and _is_quantized_op(n)})
    if other:
        return 0, f"it has quantized operators other than QuantizeLinear/DequantizeLinear " \
                  f"({', '.join(other)})"
    idx = _Index(model)
    rename: dict[str, str] = {}       # a dequantized activation -> the float tensor before Q
    constants = {}                    # a dequantized constant -> its float value
    clips: dict[str, tuple] = {}      # a Q's output -> (its Clip's output, the Clip node)
    gathers: dict[str, object] = {}   # a dequantized table's rows -> the float Gather
    dropped: set[str] = set()         # the quantized Gathers they replace
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        value = float_constant(node, idx)
        if value is not None:
            constants[node.output[0]] = value
            continue
        table = float_table(node, idx)     # an int8 table's rows: Gather(W_q) -> DQ
        if table is not None and table[1]:
            gathers[node.output[0]] = table[1][0]
            dropped.update(n.output[0] for n in table[0])
            continue
        q = _quantizer(node.input[0], idx)
        if q is None:
            return 0, (f"DequantizeLinear '{node.name or node.output[0]}' reads "
                       f"'{node.input[0]}', which is neither a constant nor a QuantizeLinear's "
                       f"output (through layout nodes)")
        source = q.input[0]
        if _saturates(q, idx):
            if q.output[0] not in clips:
                clips[q.output[0]] = _saturation(q, idx)
            source = clips[q.output[0]][0]
        if idx.producer.get(node.input[0]) is q:
            rename[node.output[0]] = source
        else:                         # Q -> Transpose, MaxPool ... on bytes -> DQ: in float
            rename[q.output[0]] = source
            rename[node.output[0]] = node.input[0]
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and any(
                c.op_type != "DequantizeLinear" and c.op_type not in _PASS
                for c in idx.consumers.get(node.output[0], [])):
            return 0, (f"QuantizeLinear '{node.name or node.output[0]}' has readers other than "
                       f"DequantizeLinear and layout nodes")
        if node.op_type == "QuantizeLinear" and node.output[0] in idx.outputs:
            return 0, f"the model's output '{node.output[0]}' is quantized"
    for name in rename:               # DQ -> Q -> DQ (a requantization): to the first float
        src = rename[name]
        for _ in range(len(rename)):
            if src not in rename:
                break
            src = rename[src]
        rename[name] = src
    for name, value in constants.items():
        model.graph.initializer.append(_tensor(value, name))
    # a dequantized output: the float tensor before it takes its name (an Identity only
    # where that tensor is a graph input or another output)
    names = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    produced = {}
    extra = []
    for o in model.graph.output:
        src = rename.get(o.name)
        if src is None:
            continue
        if src in names or src in produced:
            extra.append(_identity(src, o.name))
        else:
            produced[src] = o.name
    kept = []
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.output[0] in clips:
            node = clips[node.output[0]][1]       # its saturation, where it stood
        elif node.output and node.output[0] in gathers:
            node = gathers[node.output[0]]
        elif node.op_type in _QDQ or (node.output and node.output[0] in dropped):
            continue
        for i, name in enumerate(node.input):
            name = rename.get(name, name)
            node.input[i] = produced.get(name, name)
        for i, name in enumerate(node.output):
            node.output[i] = produced.get(name, name)
        kept.append(node)
    kept.extend(extra)
    del model.graph.value_info[:]     # the quantizer's, of tensors now gone or renamed
    del model.graph.node[:]
    model.graph.node.extend(kept)
    drop_unused_initializers(model)
    return len(rename) + len(constants), None


# nodes that move or select a quantized tensor's bytes: in float they give the values the
# DequantizeLinear after them would (MaxPool: max commutes with a monotonic dequantization)
_PASS = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "MaxPool"}


def _quantizer(name: str, idx: _Index):
    """The QuantizeLinear whose output reaches `name` through _PASS nodes, or None."""
    for _ in range(64):
        node = idx.producer.get(name)
        if node is None:
            return None
        if node.op_type == "QuantizeLinear":
            return node
        if node.op_type not in _PASS or not node.input:
            return None
        name = node.input[0]
    return None


def _saturates(q, idx: _Index) -> bool:
    """Whether a QuantizeLinear's range starts or ends at its zero point: onnxruntime folds
    a Relu, Relu6 or Clip after a quantized node into its output's range (a uint8 zero
    point of 0 is a Relu), so without the quantization that clipping must stay."""
    zero = idx.const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.zeros((), np.uint8)
    scale = idx.const(q.input[1])
    if zero is None or scale is None or zero.size != 1 or scale.size != 1 or \
            not np.isfinite(scale).all():
        return False                  # an infinite range (a mask's -inf) clips nothing
    limits = integer_limits(zero.dtype)     # (a float8 grid's ends are not its zero)
    if limits is None or int(zero.reshape(())) not in limits:
        return False
    # a range reaching an attention mask's float minimum ends at 0 only because the
    # quantizer widens every range to hold 0: no activation was folded into it, and a Clip
    # at 0 there cut every positive attention score (BERT's QDQ model read back: 69.5 % of
    # its float model's top-1)
    z, step = int(zero.reshape(())), float(np.asarray(scale).reshape(()))
    return max(abs(limits[0] - z), abs(limits[1] - z)) * step < MASK_RANGE


def _saturation(q, idx: _Index):
    """(the output, the node) of a Clip to the values a QuantizeLinear can represent."""
    from onnx import helper
    zero = idx.const(q.input[2]) if len(q.input) > 2 and q.input[2] else np.zeros((), np.uint8)
    scale = float(np.asarray(idx.const(q.input[1])).reshape(()))
    low, high = integer_limits(zero.dtype)
    z = int(zero.reshape(()))
    lo = idx.add_init(np.array((low - z) * scale, np.float32), f"{q.output[0]}_low")
    hi = idx.add_init(np.array((high - z) * scale, np.float32), f"{q.output[0]}_high")
    out = idx.unique(f"{q.input[0]}_saturated")
    return out, helper.make_node("Clip", [q.input[0], lo, hi], [out],
                                 name=idx.unique(f"{q.name or q.output[0]}_saturation"))


def _is_quantized_op(node) -> bool:
    from tpuasm.compiler.front.reader import QUANTIZED_OPS
    return node.op_type in QUANTIZED_OPS or node.domain == "com.microsoft" and \
        node.op_type.startswith("QLinear")


def _tensor(value, name: str):
    from onnx import numpy_helper
    return numpy_helper.from_array(value, name)


def _identity(src: str, dst: str):
    from onnx import helper
    return helper.make_node("Identity", [src], [dst], name=f"{dst}_float")

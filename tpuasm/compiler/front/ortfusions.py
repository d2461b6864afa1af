"""onnxruntime's saved graph optimizations read back as the standard nodes they compute.

A model saved by an onnxruntime session (`SessionOptions.optimized_model_filepath`, as
optimizing pipelines ship models) holds the session's fusions, contrib operators the
matcher does not know, so their products ran on the host:

- at the extended level, the level onnxruntime recommends for saving a model offline,
  a float model's Conv and its activation (and a residual Add before it) become
  com.microsoft **FusedConv**, a Gemm and its activation **FusedGemm**, a MatMul with a
  Transpose or a scalar Mul **FusedMatMul**, a bias Add and an erf GELU **BiasGelu**
  (and a FastGelu with its bias input, as Optimum's fusions write it)
  (`unfuse_float_operators`, a float model's first rewrite in prepare.py);
- at the all level (a session's default) a float model's convolutions go to MLAS's
  blocked layout, NCHWc (com.microsoft.nchwc: ReorderInput, Conv with its filter
  reordered into blocks, pools, ReorderOutput; `unblock_nchwc`, before the rest);
- at the all level a quantized model's convolutions go channels-last (onnxruntime's
  NhwcTransformer): com.microsoft QLinearConv, QLinearAveragePool and
  QLinearGlobalAveragePool with `channels_last = 1` between Transposes, and NhwcMaxPool
  (`channels_first_quantized`, for a quantized model).

Each fused node becomes the standard nodes of the same arithmetic, the first one keeping
its name (the report speaks of the user's node); a form this module does not know stays
as it is, with its reason.  The channels-last nodes become their channels-first forms
between Transposes, and each pair of Transposes that undo each other is then dropped, so
the convolutions read the bytes the model quantized, as in the QDQ model it was saved
from."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.front.prepare import (NotRewritten, _attr, _expand_nodes, _Index,
                                           _ranks)
from tpuasm.compiler.front.provenance import Provenance

MICROSOFT = "com.microsoft"

# FusedGemm's activations that are standard ONNX operators, with the attributes each takes
# (FusedGemm writes them as activation_alpha, activation_beta, activation_gamma)
_GEMM_ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "Softsign": (), "Softplus": (),
                     "LeakyRelu": ("alpha",), "Elu": ("alpha",), "ThresholdedRelu": ("alpha",),
                     "HardSigmoid": ("alpha", "beta"), "Selu": ("alpha", "gamma")}
# FusedConv's activations (MLAS's kinds) and the names of their activation_params
_CONV_ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": ("alpha",),
                     "HardSigmoid": ("alpha", "beta"), "Clip": ("min", "max"),
                     "HardSwish": ()}
_SINCE = {"HardSwish": 14}          # an activation's first ONNX opset


def unfuse_float_operators(model: onnx.ModelProto, prov: Provenance,
                           reasons: dict[str, str]) -> int:
    """Every FusedConv, FusedGemm, FusedMatMul and BiasGelu of a float model, in place, as
    the standard nodes it computes; the count done (a form not known keeps its node and
    its reason in `reasons`)."""
    readers = {"FusedConv": _fused_conv, "FusedGemm": _fused_gemm,
               "FusedMatMul": _fused_matmul, "BiasGelu": _bias_gelu, "FastGelu": _bias_gelu,
               "Attention": _attention}

    def wanted(n) -> bool:           # a FastGelu with its bias input (Optimum's fusion)
        return n.domain == MICROSOFT and n.op_type in readers and (
            n.op_type != "FastGelu" or (len(n.input) > 1 and bool(n.input[1])))

    if not any(wanted(n) for n in model.graph.node):
        return 0                        # the common case: no shape inference pass
    idx = _Index(model)
    ranks = _ranks(model)
    return _expand_nodes(model, prov, reasons, "read back", wanted,
                         lambda n: readers[n.op_type](idx, n, ranks))


def _activation(idx: _Index, node, kind: str, params: dict[str, float], x: str,
                y: list[str]) -> onnx.NodeProto:
    name = idx.unique(f"{node.name}/{kind}")
    if idx.opset < _SINCE.get(kind, 1):
        raise NotRewritten(f"its activation {kind} is an ONNX operator only from opset "
                           f"{_SINCE[kind]} (the model's: {idx.opset})")
    if kind == "Clip":
        low, high = params.get("min", -np.inf), params.get("max", np.inf)
        if idx.opset < 11:
            return helper.make_node("Clip", [x], y, name=name, min=low, max=high)
        bounds = [idx.add_init(np.asarray(v, np.float32), f"{node.name}_{k}")
                  for k, v in (("min", low), ("max", high))]
        return helper.make_node("Clip", [x, *bounds], y, name=name)
    return helper.make_node(kind, [x], y, name=name, **params)


def _fused_conv(idx: _Index, node, ranks, weight: str | None = None) -> list:
    """FusedConv(X, W, B, Z) = activation(Conv(X, W, B) + Z) (`weight` in W's place)."""
    kind = _attr(node, "activation", b"")
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind and kind not in _CONV_ACTIVATIONS:
        raise NotRewritten(f"its activation {kind} is not a standard operator")
    values = list(_attr(node, "activation_params", []) or [])
    names = _CONV_ACTIVATIONS.get(kind, ())
    if kind and len(values) < len(names):
        raise NotRewritten(f"its {kind} has {len(values)} of its {len(names)} parameters")
    conv_attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
                  if not a.name.startswith("activation")}
    inputs = [node.input[0], weight or node.input[1], *node.input[2:3]]
    while inputs and not inputs[-1]:
        inputs.pop()
    residual = node.input[3] if len(node.input) > 3 and node.input[3] else ""
    made, out = [], list(node.output)
    conv_out = [idx.unique(f"{node.name}_conv")] if kind or residual else out
    made.append(helper.make_node("Conv", inputs, conv_out, name=node.name, **conv_attrs))
    last = conv_out[0]
    if residual:
        summed = [idx.unique(f"{node.name}_sum")] if kind else out
        made.append(helper.make_node("Add", [last, residual], summed,
                                     name=idx.unique(f"{node.name}/Add")))
        last = summed[0]
    if kind:
        made.append(_activation(idx, node, kind, dict(zip(names, values)), last, out))
    return made


def _fused_gemm(idx: _Index, node, ranks) -> list:
    """FusedGemm(A, B, C) = activation(Gemm(A, B, C))."""
    kind = _attr(node, "activation", b"")
    kind = kind.decode() if isinstance(kind, bytes) else kind
    if kind and kind not in _GEMM_ACTIVATIONS:
        raise NotRewritten(f"its activation {kind} is not a standard operator")
    gemm_attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
                  if not a.name.startswith("activation") and a.name != "leaky_relu_alpha"}
    params = {k: _attr(node, f"activation_{k}") for k in _GEMM_ACTIVATIONS.get(kind, ())}
    if kind == "LeakyRelu" and params["alpha"] is None:
        params["alpha"] = _attr(node, "leaky_relu_alpha")   # onnxruntime's older spelling
    params = {k: v for k, v in params.items() if v is not None}
    if not kind:
        return [helper.make_node("Gemm", list(node.input), list(node.output),
                                 name=node.name, **gemm_attrs)]
    product = idx.unique(f"{node.name}_gemm")
    return [helper.make_node("Gemm", list(node.input), [product], name=node.name,
                             **gemm_attrs),
            _activation(idx, node, kind, params, product, list(node.output))]


def _fused_matmul(idx: _Index, node, ranks) -> list:
    """FusedMatMul(A, B) = alpha * op(A) op(B), op a transpose of the last two axes where
    transA / transB say so (not the batch-axis forms, transBatchA / transBatchB)."""
    if _attr(node, "transBatchA", 0) or _attr(node, "transBatchB", 0):
        raise NotRewritten("it transposes batch axes (transBatchA / transBatchB)")
    alpha = float(_attr(node, "alpha", 1.0))
    a, b = node.input[0], node.input[1]
    made = []
    for operand, flag in ((0, "transA"), (1, "transB")):
        if not _attr(node, flag, 0):
            continue
        name = node.input[operand]
        const = idx.const(name)
        if const is not None and const.ndim >= 2:
            value = np.swapaxes(const, -1, -2) * (alpha if operand == 1 else 1.0)
            swapped = idx.add_init(value.astype(const.dtype), f"{name}_T")
            alpha = 1.0 if operand == 1 else alpha
        else:
            rank = len(ranks.get(name, ()))
            if rank < 2:
                raise NotRewritten(f"the rank of its input '{name}' is unknown")
            perm = [*range(rank - 2), rank - 1, rank - 2]
            swapped = idx.unique(f"{name}_T")
            made.append(helper.make_node("Transpose", [name], [swapped], perm=perm,
                                         name=idx.unique(f"{node.name}/Transpose{operand}")))
        a, b = (swapped, b) if operand == 0 else (a, swapped)
    const_b = idx.const(b)
    if alpha != 1.0 and const_b is not None:
        b = idx.add_init((const_b * alpha).astype(const_b.dtype), f"{node.name}_B")
        alpha = 1.0
    if alpha == 1.0:
        return [*made, helper.make_node("MatMul", [a, b], list(node.output), name=node.name)]
    product = idx.unique(f"{node.name}_product")
    scale = idx.add_init(np.asarray(alpha, np.float32), f"{node.name}_alpha")
    return [*made, helper.make_node("MatMul", [a, b], [product], name=node.name),
            helper.make_node("Mul", [product, scale], list(node.output),
                             name=idx.unique(f"{node.name}/Mul"))]


def _bias_gelu(idx: _Index, node, ranks) -> list:
    """BiasGelu(A, B) = Gelu(A + B), the erf form, and FastGelu(A, B) = FastGelu(A + B),
    the tanh form (the one-input com.microsoft nodes gelu.py makes: lookup tables)."""
    summed = idx.unique(f"{node.name}_sum")
    gelu = "FastGelu" if node.op_type == "FastGelu" else "Gelu"
    return [helper.make_node("Add", list(node.input[:2]), [summed], name=node.name),
            helper.make_node(gelu, [summed], list(node.output), domain=MICROSOFT,
                             name=idx.unique(f"{node.name}/{gelu}"))]


def _attention(idx: _Index, node, ranks) -> list:
    """com.microsoft Attention (onnxruntime's transformer optimizer fuses a BERT layer's
    self-attention into it) as the nodes it computes: x times the packed Q/K/V weights plus
    bias (a MatMul with a weight: the TPU's), split, heads apart, softmax(Q K^T * scale +
    mask) V, heads together.  The mask as onnxruntime reads it: none, a key's end position
    per row (B,), or 0/1 per key (B, S); a key masked adds mask_filter_value.  Not read: a
    past state, an attention bias, a causal (unidirectional) or rotary form."""
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x, weight, bias, mask = inputs[:4]
    if any(inputs[4:]) or _attr(node, "unidirectional", 0) or _attr(node, "do_rotary", 0) \
            or any(node.output[1:]):
        raise NotRewritten("it has a past state, an attention bias, or a causal or rotary "
                           "form")
    w = idx.const(weight)
    heads = _attr(node, "num_heads")
    if w is None or w.ndim != 2 or not heads or len(ranks.get(x, ())) != 3:
        raise NotRewritten("its weights are not a constant (I, 3H) or its input not (B, S, I)")
    sizes = list(_attr(node, "qkv_hidden_sizes", None) or [w.shape[1] // 3] * 3)
    if sum(sizes) != w.shape[1] or sizes[0] != sizes[1] or any(h % heads for h in sizes):
        raise NotRewritten(f"its hidden sizes {sizes} do not split its weights into "
                           f"{heads} heads")
    mask_dims = ranks.get(mask, ()) if mask else ()
    if mask and len(mask_dims) not in (1, 2):
        raise NotRewritten(f"its mask of rank {len(mask_dims)} is not read back")
    head = sizes[0] // heads
    scale = float(_attr(node, "scale", 0.0) or 1.0 / np.sqrt(head))
    name = node.name
    made: list = []

    def emit(op, ins, tag, **attrs) -> str:
        out = idx.unique(f"{name}_{tag}")
        made.append(helper.make_node(op, ins, [out], name=idx.unique(f"{name}/{tag}"),
                                     **attrs))
        return out

    def const(value, tag) -> str:
        return idx.add_init(np.asarray(value), f"{name}_{tag}")

    qkv = emit("MatMul", [x, weight], "qkv")
    made[-1].name = name                       # the report's row: the user's node
    if bias:
        qkv = emit("Add", [qkv, bias], "qkv_bias")
    parts = [idx.unique(f"{name}_{t}") for t in "qkv"]
    made.append(helper.make_node("Split", [qkv, const(np.array(sizes, np.int64), "sizes")],
                                 parts, axis=2, name=idx.unique(f"{name}/split")))
    by_heads = const(np.array([0, 0, heads, -1], np.int64), "heads")
    q, k, v = (emit("Reshape", [p, by_heads], f"{t}_heads") for p, t in zip(parts, "qkv"))
    q = emit("Transpose", [q], "q_t", perm=[0, 2, 1, 3])
    k = emit("Transpose", [k], "k_t", perm=[0, 2, 3, 1])
    v = emit("Transpose", [v], "v_t", perm=[0, 2, 1, 3])
    scores = emit("Mul", [emit("MatMul", [q, k], "scores"),
                          const(np.float32(scale), "scale")], "scaled")
    if mask:
        filler = float(_attr(node, "mask_filter_value", -10000.0))
        if len(mask_dims) == 1:              # each row's keys before its end position
            steps = emit("Gather", [emit("Shape", [x], "shape"),
                                    const(np.int64(1), "seq_axis")], "steps")
            keys = emit("Range", [const(np.int64(0), "zero"), steps,
                                  const(np.int64(1), "one")], "keys")
            end = emit("Unsqueeze", [emit("Cast", [mask], "end", to=onnx.TensorProto.INT64),
                                     const(np.array([1], np.int64), "end_axis")], "end_2d")
            kept = emit("Less", [keys, end], "kept")
        else:                                # 0/1 per key
            kept = emit("Greater", [mask, const(np.zeros((), _numpy_type(idx, mask)),
                                                "mask_zero")], "kept")
        added = emit("Where", [kept, const(np.float32(0.0), "open"),
                               const(np.float32(filler), "masked")], "mask_add")
        added = emit("Unsqueeze", [added, const(np.array([1, 2], np.int64), "mask_axes")],
                     "mask_4d")
        scores = emit("Add", [scores, added], "masked_scores")
    probs = emit("Softmax", [scores], "probs", axis=-1)
    context = emit("Transpose", [emit("MatMul", [probs, v], "context")], "context_t",
                   perm=[0, 2, 1, 3])
    made.append(helper.make_node("Reshape", [context, const(np.array([0, 0, -1], np.int64),
                                                            "merged")],
                                 list(node.output[:1]), name=idx.unique(f"{name}/merge")))
    return made


def _numpy_type(idx: _Index, tensor: str):
    """The numpy type of a graph input or a value with a declared type (int32 by default:
    onnxruntime's masks are)."""
    for v in [*idx.model.graph.input, *idx.model.graph.value_info]:
        if v.name == tensor and v.type.tensor_type.elem_type:
            return onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
    return np.int32


# --- a float model saved in MLAS's blocked layout (NCHWc) ---------------------------------

NCHWC = "com.microsoft.nchwc"
_NCHWC_POOLS = {"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool", "Upsample"}


@functools.lru_cache(maxsize=1)
def machine_block() -> int | None:
    """The channel block of this machine's NCHWc kernels (8 with AVX2, 16 with AVX-512),
    as onnxruntime's all-level session writes it for a 2-channel Conv, or None where it
    writes no NCHWc form.  A blocked model is only valid where its block is the machine's:
    onnxruntime's kernels read it with their own."""
    import onnxruntime as ort
    from onnx import TensorProto, numpy_helper
    weight = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 1, 8, 8))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with tempfile.TemporaryDirectory(prefix="tpuasm-nchwc-") as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "probe.onnx")
        options.log_severity_level = 3    # not its warning that the form is the machine's
        try:
            ort.InferenceSession(model.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"])
            saved = onnx.load(options.optimized_model_filepath)
        except Exception:                 # onnxruntime's own failure: no form to read
            return None
    for node in saved.graph.node:
        if node.domain == NCHWC and node.op_type == "Conv":
            return next(t.dims[0] for t in saved.graph.initializer if t.name == node.input[1])
    return None


def unblock_nchwc(model: onnx.ModelProto, prov: Provenance, reasons: dict[str, str]) -> int:
    """Every com.microsoft.nchwc node of a float model, in place, as the standard nodes it
    computes on NCHW tensors whose channels are padded to the block (the padded channels
    are what the blocked kernels compute there; a ReorderOutput slices them off); the count
    done.  A model of another block than this machine's keeps its nodes, each with its
    reason."""
    if not any(n.domain == NCHWC for n in model.graph.node):
        return 0
    block = machine_block()
    idx = _Index(model)
    ranks = _ranks(model)             # up to the blocked nodes: the reorders' inputs
    blocked = {o for n in model.graph.node if n.domain == NCHWC and
               n.op_type != "ReorderOutput" for o in n.output}
    for node in model.graph.node:         # element-wise nodes between blocked tensors
        if node.domain != NCHWC and any(i in blocked for i in node.input):
            blocked.update(node.output)
    convs = [n for n in model.graph.node if n.domain == NCHWC and n.op_type == "Conv"]
    why = None
    if block is None:
        why = "onnxruntime writes no NCHWc form on this machine"
    elif any(idx.const(n.input[1]) is None or idx.const(n.input[1]).ndim < 3 for n in convs):
        why = "a blocked Conv's filter is not a constant in the model"
    elif any(idx.const(n.input[1]).shape[0] % block for n in convs):
        why = (f"its filters are not blocks of this machine's {block} channels (saved on "
               f"another machine)")
    if why:
        for node in model.graph.node:
            if node.domain == NCHWC:
                reasons[node.name] = f"NCHWc layout not read back: {why}"
        return 0

    def expand(node) -> list:
        if node.op_type == "ReorderInput":
            dims = ranks.get(node.input[0], ())
            made = _reorder_input(idx, node, block, dims)
            if made[-1].op_type == "Pad":
                padded[made[-1].output[0]] = dims[-1 if _attr(node, "channels_last", 0)
                                                  else 1]
            return made
        if node.op_type == "ReorderOutput":
            return _reorder_output(idx, node, ranks.get(node.input[0], ()))
        if node.op_type == "Conv":
            w = idx.const(node.input[1])
            by_blocks = node.input[0] in blocked and _attr(node, "group", 1) == 1
            name = idx.add_init(_unblocked_filter(w, block, by_blocks), f"{node.input[1]}_oihw")
            filters.add(name)
            return _fused_conv(idx, node, {}, name)
        if node.op_type in _NCHWC_POOLS:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            return [helper.make_node(node.op_type, list(node.input), list(node.output),
                                     name=node.name, **attrs)]
        raise NotRewritten(f"{node.domain}.{node.op_type} is not known")

    # all or nothing: a blocked node left between read-back ones would read NCHW tensors
    made, failed = [], {}
    padded: dict[str, int] = {}          # a ReorderInput's padded output -> real channels
    filters: set[str] = set()            # the read-back Convs' filters
    for node in model.graph.node:
        if node.domain != NCHWC:
            made.append([node])
            continue
        try:
            made.append(expand(node))
        except NotRewritten as e:
            failed[node.name] = f"{node.op_type} not read back: {e}"
    if failed:
        first = next(iter(failed.values()))
        for node in model.graph.node:
            if node.domain == NCHWC:
                reasons[node.name] = failed.get(
                    node.name, f"NCHWc layout not read back: another of its nodes was not "
                               f"({first})")
        return 0
    done = 0
    for node, nodes in zip(model.graph.node, made):
        if node.domain == NCHWC:
            done += 1
            for n in nodes:
                prov.derive(n.name, node.name)
    del model.graph.node[:]
    model.graph.node.extend(n for nodes in made for n in nodes)
    _strip_padded_channels(_Index(model), block, padded, filters)
    return done


# nodes that compute each channel from the same channel of their inputs
_PER_CHANNEL = {"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh",
                "Identity", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
_BINARY = {"Add", "Mul", "Sub", "Div", "Max", "Min"}


def _strip_padded_channels(idx: _Index, block: int, padded: dict[str, int],
                           filters: set[str]) -> bool:
    """The channels a read-back model carries only because the blocks padded them, dropped
    (the TPU then does the network's products, and the report counts them): a Conv's
    trailing output channels of zero filter rows and zero bias (at most a block's less
    one; their values are the activation of 0, which the next filters weigh by zeros), the
    next filters' columns for them (which must be zeros), the ReorderInput's Pad.  Done only
    where every reader of a padded tensor is a Conv, a node per channel, an element-wise node
    of equally padded tensors or the ReorderOutput's Slice; else the model stays padded.
    `padded`: each ReorderInput's Pad output and its real channels; `filters`: the
    read-back Convs' filters.  True when done."""
    g = idx.model.graph
    real: dict[str, int] = {}            # padded tensor -> its real channels
    convs: list[tuple] = []              # (node, its real output channels, real input)
    pads = []
    for node in g.node:
        padded_inputs = [i for i in node.input if i in real]
        if node.op_type == "Pad" and node.output[0] in padded:
            pads.append(node)
            real[node.output[0]] = padded[node.output[0]]
            continue
        if node.op_type == "Conv" and node.input[1] in filters and \
                padded_inputs in ([], node.input[:1]):
            w = idx.const(node.input[1])
            b = idx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            group = _attr(node, "group", 1)
            cin = real.get(node.input[0], w.shape[1] * group)
            if group == 1:
                if np.any(w[:, cin:]):
                    return False             # a padded channel weighed: not padding
                o = _real_rows(w[:, :cin], b, block)
            elif group == w.shape[0] and w.shape[1] == 1:
                o = cin                      # depthwise: one output per input channel
            else:
                return False
            convs.append((node, o, cin))
            real[node.output[0]] = o
            continue
        if not padded_inputs:
            continue
        if node.op_type in _PER_CHANNEL and padded_inputs == [node.input[0]]:
            real[node.output[0]] = real[node.input[0]]
        elif node.op_type in _BINARY and len(set(real[i] for i in padded_inputs)) == 1 and \
                all(i in real or _is_scalar(idx, i) for i in node.input):
            real[node.output[0]] = real[padded_inputs[0]]
        elif node.op_type == "Slice" and _slice_keeps(idx, node, real[node.input[0]]):
            continue
        else:
            return False                   # a reader that sees the padded channels
    if not any(o < idx.const(n.input[1]).shape[0] for n, o, _ in convs) and not pads:
        return False
    outputs = {v.name for v in g.output}
    if outputs & set(real):
        return False
    for node, o, cin in convs:
        w = idx.const(node.input[1])
        group = _attr(node, "group", 1)
        w = w[:o, :cin] if group == 1 else w[:o]
        node.input[1] = idx.add_init(np.ascontiguousarray(w), node.input[1])
        if len(node.input) > 2 and node.input[2]:
            node.input[2] = idx.add_init(idx.const(node.input[2])[:o], node.input[2])
        if group != 1:
            for a in node.attribute:
                if a.name == "group":
                    a.i = o
    for node in pads:
        node.op_type = "Identity"
        del node.input[1:]
    return True


def _real_rows(w: np.ndarray, b: np.ndarray | None, block: int) -> int:
    """A blocked filter's real output channels: the padded rows are its trailing rows of
    zeros (with zero bias), fewer than a block."""
    rows = w.shape[0]
    while rows > w.shape[0] - block + 1 and not np.any(w[rows - 1]) and \
            (b is None or b[rows - 1] == 0):
        rows -= 1
    return rows


def _is_scalar(idx: _Index, name: str) -> bool:
    value = idx.const(name)
    return value is not None and value.size == 1


def _slice_keeps(idx: _Index, node, channels: int) -> bool:
    """A ReorderOutput's Slice (its first `channels` channels at most)."""
    if len(node.input) < 4:
        return False
    starts, ends, axes = (idx.const(i) for i in node.input[1:4])
    return starts is not None and ends is not None and axes is not None and \
        list(axes) == [1] and list(starts) == [0] and int(ends[0]) <= channels


def _unblocked_filter(w: np.ndarray, block: int, by_blocks: bool) -> np.ndarray:
    """A blocked filter (O, I, kH, kW as declared) in OIHW order: MLAS stores it as
    OIHWBiBo (O/B, I/B, kH, kW, Bi, Bo) over a blocked input, else (an NCHW input, a
    depthwise filter) as OIHWBo (O/B, I, kH, kW, Bo)."""
    o, i, *kernel = w.shape
    if by_blocks:
        blocks = w.reshape(o // block, i // block, *kernel, block, block)
        order = (0, blocks.ndim - 1, 1, blocks.ndim - 2, *range(2, blocks.ndim - 2))
    else:
        blocks = w.reshape(o // block, i, *kernel, block)
        order = (0, blocks.ndim - 1, *range(1, blocks.ndim - 1))
    return np.ascontiguousarray(blocks.transpose(order)).reshape(w.shape)


def _reorder_input(idx: _Index, node, block: int, dims: tuple) -> list:
    """ReorderInput(X): X (N, C, H, W), or (N, H, W, C) where channels_last, as NCHW with
    C padded with zero channels up to the block."""
    made, x = [], node.input[0]
    rank = len(dims)
    if rank < 3:
        raise NotRewritten(f"the rank of its input '{x}' is unknown")
    if _attr(node, "channels_last", 0):
        first = idx.unique(f"{x}_channels_first")
        made.append(helper.make_node("Transpose", [x], [first],
                                     perm=[0, rank - 1, *range(1, rank - 1)],
                                     name=idx.unique(f"{node.name}/Transpose")))
        x = first
    channels = dims[-1 if _attr(node, "channels_last", 0) else 1]
    if channels is None:
        raise NotRewritten(f"the channels of its input '{node.input[0]}' are unknown")
    pad = -channels % block
    if not pad:
        made.append(helper.make_node("Identity", [x], list(node.output), name=node.name))
        return made
    pads = idx.add_init(np.asarray([0] * rank + [0, pad] + [0] * (rank - 2), np.int64),
                        f"{node.name}_pads")
    made.append(helper.make_node("Pad", [x, pads], list(node.output), name=node.name))
    return made


def _reorder_output(idx: _Index, node, dims: tuple) -> list:
    """ReorderOutput(X; channels): the first `channels` channels, NCHW (or NHWC where
    channels_last)."""
    channels = _attr(node, "channels")
    if channels is None:
        raise NotRewritten("it has no channels attribute")
    const = functools.partial(idx.add_init, name=f"{node.name}_slice")
    sliced = list(node.output)
    last = _attr(node, "channels_last", 0)
    if last:
        sliced = [idx.unique(f"{node.output[0]}_channels_first")]
    made = [helper.make_node("Slice", [node.input[0], const(np.asarray([0], np.int64)),
                                       const(np.asarray([channels], np.int64)),
                                       const(np.asarray([1], np.int64))], sliced,
                             name=node.name)]
    if last:
        rank = len(dims) or 4          # onnx infers no shape past a blocked node
        if rank < 3:
            raise NotRewritten("the rank of its input is unknown")
        made.append(helper.make_node("Transpose", sliced, list(node.output),
                                     perm=[0, *range(2, rank), 1],
                                     name=idx.unique(f"{node.name}/Transpose")))
    return made


# --- a quantized model saved channels-last ---------------------------------------------

_CHANNELS_LAST = {"QLinearConv", "QLinearAveragePool", "QLinearGlobalAveragePool"}


def channels_first_quantized(model: onnx.ModelProto, prov: Provenance) -> int:
    """Every channels-last node of onnxruntime's NhwcTransformer, in place, as its
    channels-first form between Transposes, then the Transposes that undo each other
    dropped; the count of nodes read back."""
    def wanted(n) -> bool:
        return n.domain == MICROSOFT and (
            n.op_type == "NhwcMaxPool" or
            (n.op_type in _CHANNELS_LAST and _attr(n, "channels_last", 0)))

    if not any(wanted(n) for n in model.graph.node):
        return 0
    idx = _Index(model)
    ranks = dict(_ranks(model))   # onnx infers nothing past a contrib node: filled below
    done = _expand_nodes(model, prov, {}, "read back", wanted,
                         lambda n: _channels_first(idx, n, ranks))
    drop_inverse_transposes(model)
    return done


def _channels_first(idx: _Index, node, ranks: dict) -> list:
    """The node between Transposes; `ranks` learns its output's rank (the next node's
    input: onnx's inference stops at the contrib node)."""
    weight = ranks.get(node.input[3], ()) if node.op_type == "QLinearConv" else ()
    rank = len(ranks.get(node.input[0], ())) or len(weight)
    if rank < 3:
        raise NotRewritten("the rank of its input is unknown")
    ranks[node.output[0]] = (None,) * rank
    to_first = [0, rank - 1, *range(1, rank - 1)]
    to_last = [0, *range(2, rank), 1]
    x, y = node.input[0], node.output[0]
    first_x, first_y = idx.unique(f"{x}_channels_first"), idx.unique(f"{y}_channels_first")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
             if a.name != "channels_last"}
    # NhwcMaxPool is ONNX's MaxPool on channels-last bytes; QLinearConv is ONNX's own
    op, domain = {"NhwcMaxPool": ("MaxPool", ""), "QLinearConv": ("QLinearConv", "")}.get(
        node.op_type, (node.op_type, MICROSOFT))
    return [helper.make_node("Transpose", [x], [first_x], perm=to_first,
                             name=idx.unique(f"{node.name}/to_channels_first")),
            helper.make_node(op, [first_x, *node.input[1:]], [first_y], name=node.name,
                             domain=domain, **attrs),
            helper.make_node("Transpose", [first_y], [y], perm=to_last,
                             name=idx.unique(f"{node.name}/to_channels_last"))]


def drop_inverse_transposes(model: onnx.ModelProto) -> int:
    """Each Transpose that undoes the Transpose before it: its readers read that one's
    input (an Identity where it is a graph output), and a Transpose nothing reads any more
    is dropped; the count of pairs undone."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    outputs = {v.name for v in g.output}
    renamed: dict[str, str] = {}
    undone = 0
    for node in g.node:
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            continue
        before = producer.get(node.input[0])
        if before is None or before.op_type != "Transpose" or \
                before.domain not in ("", "ai.onnx"):
            continue
        p, q = _attr(before, "perm"), _attr(node, "perm")
        if p is None or q is None or len(p) != len(q) or \
                [p[i] for i in q] != list(range(len(p))):
            continue
        source = renamed.get(before.input[0], before.input[0])
        if node.output[0] in outputs:
            node.op_type = "Identity"
            node.input[0] = source
            del node.attribute[:]
        else:
            renamed[node.output[0]] = source
        undone += 1
    if not undone:
        return 0
    for node in g.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
    read = {i for n in g.node for i in n.input} | outputs
    keep = [n for n in g.node if not (n.op_type == "Transpose" and n.output[0] not in read)]
    while len(keep) != len(g.node):          # a dropped Transpose's own Transpose input
        del g.node[:]
        g.node.extend(keep)
        read = {i for n in g.node for i in n.input} | outputs
        keep = [n for n in g.node if not (n.op_type == "Transpose" and n.output[0] not in read)]
    return undone

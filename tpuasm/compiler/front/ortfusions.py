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
  blocked layout, NCHWc (nchwc.py, read back before the rest);
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

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.front.prepare import (NotRewritten, _attr, _expand_nodes, _Index,
                                           _ranks, _value_types)
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
                raise NotRewritten(f"its input '{name}' is not known to be a matrix "
                                   f"(rank 2 or more)")
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
    """com.microsoft Attention (onnxruntime's transformer optimizer fuses a BERT or GPT-2
    layer's self-attention into it) as the nodes it computes: x times the packed Q/K/V
    weights plus bias (a MatMul with a weight: the TPU's), split, heads apart, a past
    state's keys and values before the new ones (present: both, stacked), then
    softmax(Q K^T * scale + mask + attention bias) V, heads together.  The terms added to
    the scores as onnxruntime's kernel adds them: mask_filter_value for a key the mask
    hides (none; end positions (B,), or end then start positions (2B,); 0/1 per key
    (B, T); 0/1 per query and key (B, S, T)) and, when unidirectional, for a key after
    the query's own position (past keys come first).  Not read: a rotary form, a past
    shared with present (a buffer of its own length), a Megatron (4-D) mask."""
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x, weight, bias, mask, past, attention_bias = inputs[:6]
    if any(inputs[6:]) or _attr(node, "do_rotary", 0) or \
            _attr(node, "past_present_share_buffer", 0):
        raise NotRewritten("it has a rotary form or a past buffer shared with present")
    if (past == "") != (len(node.output) < 2 or node.output[1] == ""):
        raise NotRewritten("it has a past state without its present, or a present without "
                           "a past")
    w = idx.const(weight)
    heads = _attr(node, "num_heads")
    if w is None or w.ndim != 2 or not heads or len(ranks.get(x, ())) != 3:
        raise NotRewritten("its weights are not a constant (I, 3H) or its input not (B, S, I)")
    sizes = list(_attr(node, "qkv_hidden_sizes", None) or [w.shape[1] // 3] * 3)
    if sum(sizes) != w.shape[1] or sizes[0] != sizes[1] or any(h % heads for h in sizes):
        raise NotRewritten(f"its hidden sizes {sizes} do not split its weights into "
                           f"{heads} heads")
    if past and sizes[1] != sizes[2]:
        raise NotRewritten(f"its past state stacks keys and values of different sizes "
                           f"{sizes[1:]}")
    mask_rank = len(ranks.get(mask, ())) if mask else 0
    if mask and mask_rank not in (1, 2, 3):
        raise NotRewritten(f"its mask of rank {mask_rank} is not read back")
    if past and len(ranks.get(past, ())) != 5:
        raise NotRewritten("its past state is not (2, B, heads, P, head)")
    made: list = []
    emit = _emitter(idx, node.name, made)
    qkv = emit("MatMul", [x, weight], "qkv")
    made[-1].name = node.name                  # the report's row: the user's node
    if bias:
        qkv = emit("Add", [qkv, bias], "qkv_bias")
    parts = [idx.unique(f"{node.name}_{t}") for t in "qkv"]
    made.append(helper.make_node("Split", [qkv, emit.const(np.array(sizes, np.int64),
                                                           "sizes")],
                                 parts, axis=2, name=idx.unique(f"{node.name}/split")))
    by_heads = emit.const(np.array([0, 0, heads, -1], np.int64), "heads")
    q, k, v = (emit("Transpose", [emit("Reshape", [p, by_heads], f"{t}_heads")], f"{t}_t",
                    perm=[0, 2, 1, 3]) for p, t in zip(parts, "qkv"))   # (B, N, S, head)
    if past:
        k, v = _with_past(emit, past, k, v, node.output[1])
    scale = float(_attr(node, "scale", 0.0) or 1.0 / np.sqrt(sizes[0] // heads))
    scores = emit("Mul", [emit("MatMul", [q, emit("Transpose", [k], "k_tt",
                                                  perm=[0, 1, 3, 2])], "scores"),
                          emit.const(np.float32(scale), "scale")], "scaled")
    filler = float(_attr(node, "mask_filter_value", -10000.0))
    for term in _hidden_keys(idx, emit, scores, mask, mask_rank, filler,
                             bool(_attr(node, "unidirectional", 0))):
        scores = emit("Add", [scores, term], "masked_scores")
    if attention_bias:
        scores = emit("Add", [scores, attention_bias], "biased_scores")
    probs = emit("Softmax", [scores], "probs", axis=-1)
    context = emit("Transpose", [emit("MatMul", [probs, v], "context")], "context_t",
                   perm=[0, 2, 1, 3])
    made.append(helper.make_node("Reshape", [context, emit.const(
        np.array([0, 0, -1], np.int64), "merged")], list(node.output[:1]),
        name=idx.unique(f"{node.name}/merge")))
    return made


def _emitter(idx: _Index, name: str, made: list):
    """emit(op, inputs, tag, out=None, **attrs) -> the output (`out`, else a new name) of a
    new node appended to `made`; emit.const(value, tag) -> a new initializer's name."""
    def emit(op, ins, tag, out=None, **attrs) -> str:
        out = out or idx.unique(f"{name}_{tag}")
        made.append(helper.make_node(op, ins, [out], name=idx.unique(f"{name}/{tag}"),
                                     **attrs))
        return out

    emit.const = lambda value, tag: idx.add_init(np.asarray(value), f"{name}_{tag}")
    return emit


def _with_past(emit, past: str, k: str, v: str, present: str) -> tuple[str, str]:
    """The keys and values (B, N, P + S, head): past's (2, B, N, P, head) before the new
    ones; `present` is the two stacked."""
    axis0 = emit.const(np.array([0], np.int64), "stack_axis")
    old_k, old_v = (emit("Gather", [past, emit.const(np.int64(i), f"past_{t}")],
                         f"past_{t}_all", axis=0) for i, t in enumerate("kv"))
    k = emit("Concat", [old_k, k], "k_all", axis=2)
    v = emit("Concat", [old_v, v], "v_all", axis=2)
    emit("Concat", [emit("Unsqueeze", [k, axis0], "k_stacked"),
                    emit("Unsqueeze", [v, axis0], "v_stacked")], "present", out=present,
         axis=0)
    return k, v


def _hidden_keys(idx: _Index, emit, scores: str, mask: str, mask_rank: int, filler: float,
                 causal: bool) -> list[str]:
    """The terms onnxruntime's kernel adds to the scores (B, N, S, T): `filler` for each
    key the mask hides, and (`causal`) for each key after the query's own position; the
    P = T - S past keys come first, so query i sees keys 0 .. P + i."""
    if not mask and not causal:
        return []
    dims = emit("Shape", [scores], "scores_shape")

    def dim(axis: int, tag: str) -> str:
        return emit("Gather", [dims, emit.const(np.int64(axis), f"{tag}_axis")], tag)

    def axes(values, tag) -> str:
        return emit.const(np.array(values, np.int64), tag)

    total = dim(3, "total")
    one = emit.const(np.int64(1), "one")
    keys = emit("Range", [emit.const(np.int64(0), "zero"), total, one], "keys")
    open_, hidden = emit.const(np.float32(0.0), "open"), emit.const(np.float32(filler),
                                                                    "masked")

    def added(kept: str, tag: str, unsqueeze=None) -> str:
        term = emit("Where", [kept, open_, hidden], f"{tag}_add")
        return emit("Unsqueeze", [term, axes(unsqueeze, f"{tag}_axes")], f"{tag}_4d") \
            if unsqueeze else term

    terms = []
    if mask_rank == 1:              # end positions (B,), or ends then starts (2B,)
        batch = emit("Unsqueeze", [dim(0, "batch"), axes([0], "batch_axis")], "batch_1d")
        ends = emit("Cast", [mask], "ends", to=onnx.TensorProto.INT64)
        padded = emit("Concat", [ends, emit("Expand", [emit.const(np.int64(0), "no_start"),
                                                       batch], "no_starts")],
                      "ends_starts", axis=0)
        first = axes([0], "first")
        end = emit("Slice", [padded, first, batch], "end")
        start = emit("Slice", [padded, batch, emit("Add", [batch, batch], "two_batches")],
                     "start")
        column = axes([1], "column")
        kept = emit("And", [
            emit("GreaterOrEqual", [keys, emit("Unsqueeze", [start, column], "start_2d")],
                 "after_start"),
            emit("Less", [keys, emit("Unsqueeze", [end, column], "end_2d")], "before_end")],
            "kept")
        terms.append(added(kept, "mask", [1, 2]))
    elif mask:                      # 0/1 per key (B, T), or per query and key (B, S, T)
        mask_type = _value_types(idx.model).get(mask, onnx.TensorProto.INT32)
        zero = np.zeros((), helper.tensor_dtype_to_np_dtype(mask_type))
        kept = emit("Greater", [mask, emit.const(zero, "mask_zero")], "kept")
        terms.append(added(kept, "mask", [1, 2] if mask_rank == 2 else [1]))
    if causal:
        rows = emit("Range", [emit("Sub", [total, dim(2, "steps")], "past_steps"), total, one],
                    "positions")
        seen = emit("LessOrEqual", [keys, emit("Unsqueeze", [rows, axes([1], "row_axis")],
                                               "positions_2d")], "seen")
        terms.append(added(seen, "causal"))
    return terms


# --- a quantized model saved channels-last ---------------------------------------------

_CHANNELS_LAST = {"QLinearConv", "QLinearAveragePool", "QLinearGlobalAveragePool"}


def channels_first_quantized(model: onnx.ModelProto, prov: Provenance,
                             reasons: dict[str, str]) -> int:
    """Every channels-last node of onnxruntime's NhwcTransformer, in place, as its
    channels-first form between Transposes, then the Transposes that undo each other
    dropped; the count of nodes read back (a node not read back: its reason in
    `reasons`)."""
    def wanted(n) -> bool:
        return n.domain == MICROSOFT and (
            n.op_type == "NhwcMaxPool" or
            (n.op_type in _CHANNELS_LAST and _attr(n, "channels_last", 0)))

    if not any(wanted(n) for n in model.graph.node):
        return 0
    idx = _Index(model)
    ranks = dict(_ranks(model))   # onnx infers nothing past a contrib node: filled below
    done = _expand_nodes(model, prov, reasons, "read back", wanted,
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

"""A float model saved in MLAS's blocked layout, NCHWc, read back as standard nodes.

At the all level (a session's default) onnxruntime's NchwcTransformer moves a float model's
convolutions to com.microsoft.nchwc: a ReorderInput into blocks of channels, Convs whose
filters are stored in blocks (and which fuse their activation and a residual Add), pools,
and a ReorderOutput back.  The block is the machine's (8 channels with AVX2, 16 with
AVX-512): the file is only valid where its block is onnxruntime's there.  Each blocked
tensor is read as the NCHW tensor of its channels padded to the block: the filters put back
in OIHW order, ReorderInput a Pad of zero channels, ReorderOutput a Slice; the padded
channels are then dropped where that is exact (see docs/compiler.md, *onnxruntime's
optimized float models*)."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.front.ortfusions import _fused_conv
from tpuasm.compiler.front.prepare import NotRewritten, _attr, _Index, _ranks
from tpuasm.compiler.front.provenance import Provenance

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

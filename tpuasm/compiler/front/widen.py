"""Which activation tensors are quantized to 16 bits (the TPU v1's 8-bit weights x 16-bit
activations, at half the multiply rate: MatrixMultiply's H flag reads an int16 vector from
two UB rows, Activate's act_out = 2 writes one).

A tensor can be int16 when every TPU operator that touches it does matrix work:
- it is made by a matrix node (Conv, Gemm, MatMul, with its fused Relu / Clip or bias Add)
  that Activate requantizes, or it comes from the host (a model input, a host node's
  output: the runtime quantizes it);
- every quantized node that reads it (through layout nodes: Flatten, Reshape, ...) is a
  matrix node reading it as its activation.
Lookup tables (the L flag maps bytes), pooling and VADD/VMUL take 8-bit tensors only, so a
tensor one of them reads or writes stays 8-bit (`refusals` says why).  Host nodes read the
dequantized float value either way.  Weights stay int8 per channel.

onnxruntime quantizes a chosen tensor as QInt16 through its TensorQuantOverrides (the model
is moved to opset 21, whose QuantizeLinear / DequantizeLinear take int16).

The accumulators stay int32 and wrap (spec/isa.md 5.4): an int16 input makes each product
256 times larger than an 8-bit one.  `accumulator_refusals` estimates, from the float
model's values on the calibration data, the largest sum each reader of a chosen tensor
would hold (its int32 bias plus ACC_HEADROOM times its products' largest sum, in units of
input step x weight step); a tensor whose readers would not fit int32 stays 8-bit, with
the figure as its reason."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from tpuasm.compiler.errors import CompileError

MATRIX_OPS = {"Conv", "Gemm", "MatMul"}
LAYOUT_OPS = {"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity"}
_FUSED_ACTIVATIONS = {"Relu", "Clip"}


def eligible(model: onnx.ModelProto, chosen: set[str]) -> tuple[dict, dict]:
    """({tensor: [tensors quantized alike]}, {tensor: why it stays 8-bit}) over the
    activation tensors that a quantized matrix node reads or writes; `chosen`: the
    quantized nodes (quantize.tpu_nodes).  Each key is the tensor as its producer writes it (before any
    layout node); its list holds it and the layout nodes' outputs that carry its values."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output if o}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            if i:
                consumers.setdefault(i, []).append(n)
    roots: dict[str, None] = {}
    for n in g.node:
        if n.name in chosen and n.op_type in MATRIX_OPS and n.input and n.input[0] not in inits:
            roots[_root(n.input[0], producer, chosen)] = None
            roots[_written(n, consumers, chosen)] = None      # its result (host readers)
    groups, refusals = {}, {}
    for root in roots:
        why = _producer_refusal(root, producer, consumers, chosen)
        members = _carried(root, consumers, chosen)
        if why is None:
            why = _reader_refusal(members, consumers, chosen)
        if why is None:
            groups[root] = members
        else:
            refusals[root] = why
    return groups, refusals


def _root(name: str, producer: dict, chosen: set) -> str:
    """The tensor before the quantized layout nodes that lead to `name`."""
    for _ in range(64):
        node = producer.get(name)
        if node is None or node.name not in chosen or node.op_type not in LAYOUT_OPS:
            return name
        name = node.input[0]
    return name


def _written(node, consumers: dict, chosen: set) -> str:
    """The tensor a matrix node's Activate writes: its output, or that of the Relu / Clip or
    bias Add fused into it."""
    out = node.output[0]
    readers = consumers.get(out, [])
    if len(readers) == 1 and readers[0].name in chosen and (
            readers[0].op_type in _FUSED_ACTIVATIONS or
            (readers[0].op_type == "Add" and node.op_type == "MatMul")):
        return readers[0].output[0]
    return out


def _carried(root: str, consumers: dict, chosen: set) -> list[str]:
    """`root` and the outputs of the quantized layout nodes that read it (recursively)."""
    members, todo = [root], [root]
    while todo:
        for node in consumers.get(todo.pop(), ()):
            if node.name in chosen and node.op_type in LAYOUT_OPS:
                for out in node.output:
                    if out and out not in members:
                        members.append(out)
                        todo.append(out)
    return members


def _producer_refusal(root: str, producer: dict, consumers: dict, chosen: set) -> str | None:
    node = producer.get(root)
    if node is None or node.name not in chosen or node.op_type in MATRIX_OPS:
        return None
    if node.op_type in _FUSED_ACTIVATIONS and node.input:
        before = producer.get(node.input[0])
        if before is not None and before.name in chosen and before.op_type in MATRIX_OPS \
                and len(consumers.get(node.input[0], ())) == 1:
            return None                 # Relu / Clip fused into the matrix op's Activate
    if node.op_type == "Add" and any(
            producer.get(i) is not None and producer[i].op_type == "MatMul" and
            producer[i].name in chosen for i in node.input):
        return None                     # a MatMul's bias Add (fused into it)
    return f"made by {node.op_type} '{node.name}' on the TPU, which writes 8-bit only"


def _reader_refusal(members: list[str], consumers: dict, chosen: set) -> str | None:
    names = set(members)
    for t in members:
        for node in consumers.get(t, ()):
            if node.name not in chosen:
                continue                # the host reads the dequantized float value
            if node.op_type in LAYOUT_OPS and node.output and node.output[0] in names:
                continue
            if node.op_type in MATRIX_OPS and node.input and node.input[0] == t and \
                    t not in node.input[1:]:
                continue
            return (f"read by {node.op_type} '{node.name}' on the TPU, which reads 8-bit only "
                    f"(lookup tables, pooling, VADD/VMUL)")
    return None


def choose(model: onnx.ModelProto, chosen: set[str], options, path="the model",
           reader=None, notes: dict | None = None) -> dict:
    """{tensor: [tensors quantized alike]} of the 16-bit tensors `options` asks for:
    every eligible one with activation_bits 16, and those named by wide_tensors (the user's;
    a name that is not an eligible tensor is refused with its reason) or checked_wide (the
    calibration check's).  With `reader` (calibration feeds), a tensor whose readers'
    accumulators could wrap stays 8-bit (accumulator_refusals): `notes` gets
    {"kept 8-bit": {tensor: why}}."""
    groups, refusals = eligible(model, chosen)
    carrier = {m: root for root, members in groups.items() for m in members}
    picked: dict[str, list] = {}
    if options.activation_bits == 16:
        picked.update(groups)
    for name in options.wide_tensors:
        root = carrier.get(name)
        if root is None:
            why = refusals.get(name)
            known = {o for n in model.graph.node for o in n.output} | \
                {v.name for v in model.graph.input}
            if why is None:
                why = ("no tensor of that name in the model" if name not in known else
                       "not an activation that a matrix operator on the TPU reads")
            raise CompileError(f"{path}: --wide-tensor {name}: cannot be 16-bit: {why}")
        picked[root] = groups[root]
    for name in options.checked_wide:
        root = carrier.get(name)
        if root is not None:
            picked[root] = groups[root]
    for root in [r for r, members in picked.items()
                 if set(members) & set(options.narrow_tensors)]:
        del picked[root]
    if reader is not None and picked:
        refused = accumulator_refusals(model, picked, chosen, reader, options.per_channel)
        for root in refused:
            picked.pop(root, None)
        if notes is not None and refused:
            notes.setdefault("kept 8-bit", {}).update(refused)
    return picked


INT32_LIMIT = 2 ** 31 - 1
ACC_HEADROOM = 4          # the calibration data's largest accumulator, times this, must fit


def accumulator_refusals(model: onnx.ModelProto, picked: dict, chosen: set[str], reader,
                         per_channel: bool = True) -> dict[str, str]:
    """{tensor of `picked`: why its readers' int32 accumulators could wrap with it int16}.
    One onnxruntime pass of the float model over the calibration feeds of `reader`, with
    the picked tensors and their matrix readers' outputs (before any fused Relu: what the
    accumulators hold) as extra outputs.  Per output channel n of a reader, at the input's
    int16 step s_x and the weight step s_w[n] onnxruntime will choose: the int32 bias
    |b[n]| / (s_x s_w[n]) plus ACC_HEADROOM times the products' largest sum
    max |y[n] - b[n]| / (s_x s_w[n]) must fit int32 (the sums wrap modulo 2^32, so only the
    final value matters)."""
    if not picked:
        return {}
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    readers = {}                 # picked root -> [(matrix node, weight steps, bias or None)]
    for root, members in picked.items():
        names = set(members)
        for node in g.node:
            if node.name in chosen and node.op_type in MATRIX_OPS and node.input and \
                    node.input[0] in names and len(node.input) > 1 and node.input[1] in inits:
                bias = None
                if node.op_type != "MatMul" and len(node.input) > 2 and node.input[2] in inits:
                    bias = numpy_helper.to_array(inits[node.input[2]]).astype(
                        np.float64).reshape(-1)
                readers.setdefault(root, []).append(
                    (node, _weight_steps(node, inits[node.input[1]], per_channel), bias))
    biases = {n.output[0]: b for rs in readers.values() for n, _, b in rs if b is not None}
    outputs = sorted(set(picked) | set(n.output[0] for rs in readers.values()
                                       for n, _, _ in rs))
    low = {t: math.inf for t in picked}
    high = {t: -math.inf for t in picked}
    peak: dict[str, np.ndarray] = {}          # reader output -> max |y - b| per channel
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t)
                              for t in outputs if t not in known)
    from tpuasm.compiler.ort import session
    try:
        run = session(probe, threads=0)
        while (feed := reader.get_next()) is not None:
            for t, value in zip(outputs, run.run(outputs, feed)):
                value = np.asarray(value, np.float64)
                if not value.size:
                    continue
                if t in low:
                    low[t] = min(low[t], float(value.min()))
                    high[t] = max(high[t], float(value.max()))
                channels = -1 if _last_axis(t, g) else (1 if value.ndim >= 2 else 0)
                moved = np.moveaxis(value, channels, 0)
                moved = moved.reshape(moved.shape[0], -1)
                bias = biases.get(t)
                if bias is not None and bias.size == moved.shape[0]:
                    moved = moved - bias[:, None]
                per = np.abs(moved).max(axis=1)
                peak[t] = per if t not in peak else np.maximum(peak[t], per)
    except Exception:                   # noqa: BLE001 - no figures: decide without them
        return {}
    refusals = {}
    for root, rs in readers.items():
        lo, hi = min(low[root], 0.0), max(high[root], 0.0)
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo <= 0:
            continue
        step = (hi - lo) / 65535
        worst, culprit = 0.0, ""
        for node, w_steps, bias in rs:
            products = peak.get(node.output[0])
            if products is None:
                continue
            w = np.broadcast_to(w_steps, products.shape) if w_steps.size == 1 else w_steps
            if w.shape != products.shape:
                w = np.full(products.shape, float(np.max(w_steps)))
            b = np.zeros(products.shape) if bias is None or bias.size != products.size \
                else np.abs(bias)
            # onnxruntime widens a weight step until the bias fits int32 (its
            # _adjust_weight_scale_for_int32_bias): the bias then nearly fills it
            w = np.maximum(w, 1.0001 * 2 * b / ((2.0 ** 32 - 2) * step))
            with np.errstate(divide="ignore", invalid="ignore"):
                need = np.where(w > 0, (b + ACC_HEADROOM * products) / (step * w), 0.0)
            if need.size and float(need.max()) > worst:
                worst, culprit = float(need.max()), node.name
        if worst > INT32_LIMIT:
            refusals[root] = (f"int16, the accumulators of '{culprit}' would reach "
                              f"{worst:.3g} on the calibration data with {ACC_HEADROOM}x "
                              f"headroom on the products (int32 holds {INT32_LIMIT:.3g})")
    return refusals


def _last_axis(tensor: str, graph) -> bool:
    """A MatMul's output: its channels are the last axis."""
    for node in graph.node:
        if tensor in node.output:
            return node.op_type == "MatMul"
    return False


def _weight_steps(node, weight, per_channel: bool) -> np.ndarray:
    """The int8 weight step per output channel (max |w| / 127, the symmetric scale)."""
    w = np.abs(numpy_helper.to_array(weight).astype(np.float64))
    if node.op_type == "Conv":
        per = w.reshape(w.shape[0], -1).max(axis=1)
    elif node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
        per = w.reshape(w.shape[0], -1).max(axis=1)
    else:
        per = w.reshape(-1, w.shape[-1]).max(axis=0)
    if not per_channel:
        per = np.full_like(per, per.max(initial=0.0))
    steps = per / 127.0
    # a channel whose weights vanish becomes int8 zeros at scale 1 (scales.py): its sum is
    # its bias alone, at the input's scale
    from tpuasm.compiler.front.scales import VANISHING_SCALE
    steps[steps < VANISHING_SCALE] = 1.0
    return steps

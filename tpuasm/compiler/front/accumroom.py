"""A quantized model's matrix nodes whose integer sums could outgrow the TPU's int32
accumulators, given coarser weight steps where they must.

onnxruntime runs a QDQ model's DequantizeLinear -> Conv / MatMul / Gemm in float, so a
16-bit model (quantize_static's QInt16 / QUInt16 activations and weights, opset 21) never
overflows there.  On the TPU the same node sums integer products in int32 accumulators,
which wrap: an int16 input times int16 weights is up to 2^31 per product, and a 16-input
MatMul of such a model wrapped on 6 % of its outputs (58,751 output steps off).  Without
data the compiler knows each input's range only as its grid's (the int16 range around its
zero point), so for each output column it bounds the sum by

    max |x_q - z_x| x sum_k |w_q[k] - z_w| + |bias_q|

and, where that exceeds 2^31 - 1, re-rounds the column's weights (and its int32 bias) to a
step f times its own, the least f that fits.  The weights keep 16 - log2(f) bits of the
user's 16: far finer than 8-bit ones.  The rewritten QDQ model is what OUTDIR keeps as its
oracle, so onnxruntime on it still says exactly what the TPU computes, and the report names
each node and its factor.  An 8-bit model never needs it: 255 x 127 per product leaves room
for 66,000 inputs."""
from __future__ import annotations

import numpy as np

from tpuasm.compiler.front.prepare import _attr, _Index, _set_attr, drop_unused_initializers
from tpuasm.compiler.front.widths import integer_limits, integer_reach

_LIMIT = (1 << 31) - 1
_BIASED = {"Conv": 2, "Gemm": 2}          # op -> index of its bias input


def fit_accumulators(model, notes: dict[str, str] | None = None) -> int:
    """Rewrite (in place) the weights of every quantized Conv / MatMul / Gemm whose sums
    could overflow int32 (see the module's note); the count of nodes rewritten.  `notes`
    gets node -> what was done."""
    idx = _Index(model)
    count = 0
    for node in list(model.graph.node):
        if node.op_type not in ("Conv", "MatMul", "Gemm") or len(node.input) < 2:
            continue
        x_dq, w_dq = _behind_layout(node.input[0], idx), idx.producer.get(node.input[1])
        if not (_dequantizes(x_dq) and _dequantizes(w_dq)) or x_dq.input[0] in idx.inits:
            continue
        reach = _input_reach(x_dq, idx)
        weight = _weight(w_dq, node, idx)
        if reach is None or weight is None:
            continue
        w_q, zero, scale, out_axis = weight
        bias_dq = _bias_dequantizer(node, idx)
        bias = idx.const(bias_dq.input[0]) if bias_dq is not None else None
        columns = np.moveaxis(np.abs(w_q.astype(np.int64) - zero), out_axis, 0)
        sums = reach * columns.reshape(columns.shape[0], -1).sum(axis=1)
        if bias is not None and bias.size == sums.size:
            sums = sums + np.abs(bias.astype(np.int64)).reshape(-1)
        if sums.max(initial=0) <= _LIMIT:
            continue
        factors = _factors(w_q.astype(np.int64) - zero, out_axis, reach, bias)
        _rewrite(node, w_dq, bias_dq, w_q, zero, scale, out_axis, factors, idx)
        if notes is not None:
            notes[node.name] = (f"its int16 sums could reach {sums.max():,} (beyond int32): "
                                f"the weights of {int((factors > 1).sum())} of its "
                                f"{factors.size} output channels re-rounded to a step up to "
                                f"{int(factors.max())} times coarser")
        count += 1
    if count:
        drop_unused_initializers(model)
    return count


# nodes between a DequantizeLinear and a matrix node that keep its values in its range
_LAYOUT = {"Pad", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity",
           "Slice", "MaxPool"}


def _behind_layout(tensor: str, idx: _Index):
    """The node making `tensor`, past layout nodes (a QDQ model's Pad before a Conv)."""
    node = idx.producer.get(tensor)
    for _ in range(8):
        if node is None or node.op_type not in _LAYOUT or not node.input:
            break
        node = idx.producer.get(node.input[0])
    return node


def _dequantizes(node) -> bool:
    return node is not None and node.op_type == "DequantizeLinear" and len(node.input) >= 2


def _input_reach(dq, idx: _Index) -> int | None:
    """max |x_q - z| over the input's grid (per tensor), or None."""
    scale = idx.const(dq.input[1])
    zero = idx.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if scale is None or scale.size != 1 or (zero is not None and zero.size != 1):
        return None
    z = int(zero.reshape(-1)[0]) if zero is not None else 0
    # (None for a float8 grid: no integer sums on the TPU)
    return integer_reach(zero.dtype if zero is not None else np.uint8, z)


def _weight(dq, node, idx: _Index):
    """(W_q, its zero point broadcast to W_q, its scale per output channel, the output
    axis), or None where the weight is not a constant of an integer type or its
    quantization is block-wise."""
    w_q, scale = idx.const(dq.input[0]), idx.const(dq.input[1])
    zero = idx.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if w_q is None or scale is None or w_q.ndim < 2 or _attr(dq, "block_size", 0) or \
            not np.issubdtype(w_q.dtype, np.integer):
        return None
    if node.op_type == "MatMul":
        out_axis = w_q.ndim - 1
    elif node.op_type == "Gemm":
        out_axis = 0 if _attr(node, "transB", 0) else 1
    else:
        out_axis = 0
    channels = w_q.shape[out_axis]
    axis = _attr(dq, "axis", 1) % w_q.ndim
    if scale.size not in (1, channels) or (scale.size > 1 and axis != out_axis):
        return None
    if zero is not None and zero.size != scale.size:
        return None
    shape = [1] * w_q.ndim
    shape[out_axis] = -1
    zeros = np.zeros(w_q.shape, np.int64) if zero is None else np.broadcast_to(
        zero.astype(np.int64).reshape(shape if zero.size > 1 else ()), w_q.shape)
    scales = np.broadcast_to(scale.astype(np.float32).reshape(-1), (channels,))
    return w_q, zeros, scales, out_axis


def _bias_dequantizer(node, idx: _Index):
    at = _BIASED.get(node.op_type)
    if at is None or len(node.input) <= at or not node.input[at]:
        return None
    dq = idx.producer.get(node.input[at])
    return dq if _dequantizes(dq) and idx.const(dq.input[0]) is not None else None


def _factors(centred, out_axis: int, reach: int, bias) -> np.ndarray:
    """Per output channel, the least integer f >= 1 whose re-rounded weights and bias fit
    (a column's bound falls as f grows: a binary search)."""
    columns = np.moveaxis(centred, out_axis, 0).reshape(centred.shape[out_axis], -1)
    b = np.zeros(columns.shape[0], np.int64) if bias is None or \
        bias.size != columns.shape[0] else bias.astype(np.int64).reshape(-1)
    factors = np.ones(columns.shape[0], np.int64)
    for n in range(columns.shape[0]):
        if fits(columns[n], b[n], reach, 1):
            continue
        low, high = 1, 2              # low never fits, high does
        while not fits(columns[n], b[n], reach, high):
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if fits(columns[n], b[n], reach, middle) else \
                (middle, high)
        factors[n] = high
    return factors


def fits(column, bias, reach: int, f: int) -> bool:
    """Whether one output column's sums, its weights and bias re-rounded to f times their
    step, stay within int32 for any input on the grid."""
    return reach * int(np.abs(_divide(column, f)).sum()) + abs(int(_divide(bias, f))) <= _LIMIT


def _divide(values, f):
    """round_half_even(values / f), as onnxruntime's QuantizeLinear rounds."""
    return np.rint(np.asarray(values, np.float64) / f).astype(np.int64)


def _rewrite(node, w_dq, bias_dq, w_q, zeros, scales, out_axis, factors, idx: _Index):
    shape = [1] * w_q.ndim
    shape[out_axis] = -1
    signed = np.dtype(f"int{8 * w_q.dtype.itemsize}")   # centred: zero point 0
    coarse = np.clip(_divide(w_q.astype(np.int64) - zeros, factors.reshape(shape)),
                     *integer_limits(signed))
    name = w_dq.input[0]
    w_dq.input[0] = idx.add_init(coarse.astype(signed), f"{name}_fitted")
    while len(w_dq.input) < 3:
        w_dq.input.append("")
    w_dq.input[1] = idx.add_init((scales * factors).astype(np.float32), f"{name}_scale_fitted")
    w_dq.input[2] = idx.add_init(np.zeros(factors.size, signed), f"{name}_zero_fitted")
    _set_attr(w_dq, "axis", out_axis)
    if bias_dq is not None:
        bias = idx.const(bias_dq.input[0])
        b_scale = idx.const(bias_dq.input[1])
        if bias is not None and b_scale is not None and bias.size == factors.size:
            b_scale = np.broadcast_to(b_scale.astype(np.float32).reshape(-1), (factors.size,))
            b = bias_dq.input[0]
            bias_dq.input[0] = idx.add_init(_divide(bias.reshape(-1), factors).astype(
                bias.dtype), f"{b}_fitted")
            bias_dq.input[1] = idx.add_init((b_scale * factors).astype(np.float32),
                                            f"{b}_scale_fitted")
            if len(bias_dq.input) > 2 and bias_dq.input[2]:
                bias_dq.input[2] = idx.add_init(np.zeros(factors.size, bias.dtype),
                                                f"{b}_zero_fitted")
            _set_attr(bias_dq, "axis", 0)

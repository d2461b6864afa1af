"""A numpy evaluation of the compiler's IR (tpuasm.compiler.ir): the oracle the back end's
programs are checked against, and the front end's own check against onnxruntime.

Every operator takes a batch of quantized inputs `(B, *input.shape)` (int8 or uint8, as the
input's QParams say) and returns `(B, *output.shape)` in the output's integer type.

Arithmetic follows onnxruntime's CPU kernels (MLAS), so that "reference == onnxruntime" holds
bit for bit except on a few rounding near-ties:
- products and sums are exact: int8 x int8 sums are evaluated in float64 (exact below 2^53)
  and wrapped to int32 like an int32 accumulator;
- requantization is float32, in MLAS's order: multiplier = (x.scale * w.scale[n]) / y.scale,
  value = float32(acc) * multiplier, rounded half to even, plus the zero point, clamped;
- average pooling is onnxruntime's float kernel (a float32 sum of dequantized values), which
  an integer machine matches except on rounding near-ties; global average pooling is MLAS's
  integer sum with a float32 multiplier;
- Elementwise is MLAS's QLinearAdd / QLinearMul in float32: the scale ratios s_a / s_c,
  s_b / s_c (add) or s_a * s_b / s_c (mul) rounded to float32; add as MLAS's x86 kernel
  (z_c - the zero points' share folded into one constant, two fused multiply-adds of the
  raw integers), mul as the product of the centred integers times the ratio; rounded half
  to even, clamped.  A Sub, which has no QLinear form, is onnxruntime's float32 Sub of the
  two dequantized operands and QuantizeLinear's division, and so are an add and a mul with
  an int16 operand or output (onnxruntime has no int16 QLinear form; a Lookup of an int16
  input quantizes its dequantized value to the 8-bit index first).  A constant or broadcast b
  broadcasts per channel (or per sample) as ONNX does.  The chip (VADD /
  VMUL) computes the exact real value with 31-bit ratios instead: the two differ by one unit
  where float32's error moves a value across a rounding boundary (a near-tie; spec/isa.md
  5.11 measures 99.9998 % identical).
"""
from __future__ import annotations

import numpy as np

from tpuasm.compiler.ir import (Activation, Conv, Dense, Elementwise, Lookup, Operator, Pool,
                                QParams, Segment)


def _as_int32(acc: np.ndarray) -> np.ndarray:
    """Exact integer sums (float64 or int64) as the int32 an accumulator would hold."""
    return np.asarray(acc).astype(np.int64).astype(np.int32)


def activation_bounds(act: Activation, y: QParams) -> tuple[int, int]:
    """The quantized clamp range [lo, hi] of an output after its fused activation."""
    lo, hi = y.qmin, y.qmax
    if act.kind == "relu":
        lo = max(lo, y.zero_point)
    elif act.kind == "clip":
        scale = np.float32(y.scale)
        if act.lo is not None:
            lo = max(lo, int(np.rint(np.float32(act.lo) / scale)) + y.zero_point)
        if act.hi is not None:
            hi = min(hi, int(np.rint(np.float32(act.hi) / scale)) + y.zero_point)
    elif act.kind != "none":
        raise ValueError(f"unknown activation {act.kind!r}")
    return lo, hi


def requantize(acc: np.ndarray, x_scale: float, weight_scale: np.ndarray, y: QParams,
               activation: Activation = Activation()) -> np.ndarray:
    """int32 accumulators (..., N) -> y's integers, with one weight scale per last-axis n."""
    multiplier = (np.float32(x_scale) * np.asarray(weight_scale, np.float32)) / np.float32(y.scale)
    value = _as_int32(acc).astype(np.float32) * multiplier.astype(np.float32)
    q = np.rint(value).astype(np.float64) + y.zero_point
    lo, hi = activation_bounds(activation, y)
    return np.clip(q, lo, hi).astype(_dtype(y))


def _dtype(q: QParams):
    return q.dtype


def _centered(x: np.ndarray, q: QParams) -> np.ndarray:
    """x - zero_point as float64 (exact)."""
    return np.asarray(x).astype(np.float64) - q.zero_point


def dense(op: Dense, x: np.ndarray) -> np.ndarray:
    xc = _centered(x, op.input.quant).reshape(len(x), -1)
    acc = xc @ op.weight.astype(np.float64)
    if op.bias is not None:
        acc = acc + op.bias.astype(np.float64)
    return requantize(acc, op.input.quant.scale, op.weight_scale, op.output.quant,
                      op.activation).reshape(len(x), *op.output.shape)


def _pad_image(x: np.ndarray, pads, value) -> np.ndarray:
    top, left, bottom, right = pads
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def _out_size(size: int, before: int, after: int, kernel: int, stride: int) -> int:
    return (size + before + after - kernel) // stride + 1


def _taps(xp: np.ndarray, kernel, strides, out_hw):
    """Yield (i, j, view) for every kernel tap: view (B, C, Ho, Wo) of the padded image."""
    (kh, kw), (sh, sw), (ho, wo) = kernel, strides, out_hw
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]


def conv(op: Conv, x: np.ndarray) -> np.ndarray:
    # Padding with real zeros is padding the centred input with 0.
    xp = _pad_image(_centered(x, op.input.quant), op.pads, 0.0)
    o, c, kh, kw = op.weight.shape
    top, left, bottom, right = op.pads
    ho = _out_size(x.shape[2], top, bottom, kh, op.strides[0])
    wo = _out_size(x.shape[3], left, right, kw, op.strides[1])
    w = op.weight.astype(np.float64)
    g = op.groups
    if g < 1 or o % g or x.shape[1] != c * g:
        raise ValueError(f"{op.name}: weight {op.weight.shape} with {g} groups does not fit "
                         f"an input of {x.shape[1]} channels")
    acc = np.zeros((len(x), ho, wo, g, o // g), np.float64)
    wg = w.reshape(g, o // g, c, kh, kw)
    for i, j, view in _taps(xp, (kh, kw), op.strides, (ho, wo)):
        # group k: its output channels read only its own c input channels
        vg = view.reshape(len(x), g, c, ho, wo)
        acc += np.einsum("bgchw,goc->bhwgo", vg, wg[:, :, :, i, j], optimize=True)
    acc = acc.reshape(len(x), ho, wo, o)
    if op.bias is not None:
        acc += op.bias.astype(np.float64)
    y = requantize(acc, op.input.quant.scale, op.weight_scale, op.output.quant, op.activation)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def pool(op: Pool, x: np.ndarray) -> np.ndarray:
    top, left, bottom, right = op.pads
    kh, kw = op.kernel
    ho = _out_size(x.shape[2], top, bottom, kh, op.strides[0])
    wo = _out_size(x.shape[3], left, right, kw, op.strides[1])
    xq = op.input.quant
    if op.kind == "max":
        # ONNX max pooling ignores padding: pad with the smallest value, which never wins
        # a window that holds at least one real element.
        xp = _pad_image(np.asarray(x), op.pads, xq.qmin)
        out = None
        for _, _, view in _taps(xp, op.kernel, op.strides, (ho, wo)):
            out = view.copy() if out is None else np.maximum(out, view)
        return out.astype(_dtype(op.output.quant))
    if op.kind != "avg":
        raise ValueError(f"unknown pooling kind {op.kind!r}")
    yq = op.output.quant
    if op.kernel == tuple(x.shape[2:]) and not any(op.pads):
        return _global_average(x, xq, yq)
    # onnxruntime's QLinearAveragePool (and its fusion of DequantizeLinear -> AveragePool ->
    # QuantizeLinear): float32 sum of the dequantized values over the window, row by row,
    # divided by the count, then nearbyint(mean / y.scale + y.zero_point).
    q = np.rint(average_before_rounding(op, x, np.float32))
    return np.clip(q, yq.qmin, yq.qmax).astype(_dtype(yq))


def average_before_rounding(op: Pool, x: np.ndarray, dtype=np.float64) -> np.ndarray:
    """An average pool's mean / y.scale + y.zero_point before rounding, in `dtype`:
    float32 is onnxruntime's arithmetic, float64 (all but) the exact value the chip rounds,
    whose ties (x.5) the two may round apart."""
    xq, yq = op.input.quant, op.output.quant
    kh, kw = op.kernel
    top, left, bottom, right = op.pads
    ho = _out_size(x.shape[2], top, bottom, kh, op.strides[0])
    wo = _out_size(x.shape[3], left, right, kw, op.strides[1])
    real = (dtype(xq.scale) * (np.asarray(x, np.int32) - xq.zero_point)).astype(dtype)
    xp = _pad_image(real, op.pads, dtype(0))
    inside = _pad_image(np.ones((1, 1) + x.shape[2:]), op.pads, 0.0)
    total = np.zeros((len(x), x.shape[1], ho, wo), dtype)
    count = np.zeros((1, 1, ho, wo))
    for (_, _, view), (_, _, ones) in zip(_taps(xp, op.kernel, op.strides, (ho, wo)),
                                          _taps(inside, op.kernel, op.strides, (ho, wo))):
        total += view
        count += ones
    if op.count_include_pad:
        count[:] = kh * kw
    mean = total / count.astype(dtype)
    return mean / dtype(yq.scale) + dtype(yq.zero_point)


def _global_average(x: np.ndarray, xq: QParams, yq: QParams) -> np.ndarray:
    """onnxruntime's QLinearGlobalAveragePool (MLAS): an exact integer sum, requantized by
    the float32 multiplier x.scale / (y.scale * count)."""
    count = x.shape[2] * x.shape[3]
    acc = np.asarray(x, np.int64).sum(axis=(2, 3), keepdims=True) - xq.zero_point * count
    multiplier = np.float32(xq.scale) / (np.float32(yq.scale) * np.float32(count))
    q = np.rint(acc.astype(np.float32) * multiplier) + yq.zero_point
    return np.clip(q, yq.qmin, yq.qmax).astype(_dtype(yq))


def lookup(op: Lookup, x: np.ndarray) -> np.ndarray:
    if op.index is not None:         # an int16 input: onnxruntime's convert to 8 bits first
        x = op.index.quantize(op.input.quant.dequantize(x))
    index = np.asarray(x).astype(np.int64) % 256      # int8 -128 -> 128, as (x + 256) % 256
    return np.asarray(op.table)[index].astype(_dtype(op.output.quant))


def constant_operand(op: Elementwise, ndim: int) -> np.ndarray:
    """An Elementwise's constant b as integers broadcastable against a batch of `a`
    (B, C, ...): one value per channel (axis 1)."""
    values = np.asarray(op.constant).astype(np.int32).reshape(-1)
    if values.size not in (1, op.a.shape[0]):
        raise ValueError(f"{op.name}: {values.size} constant values for {op.a.shape[0]} "
                         f"channels")
    return values.reshape((1, -1) + (1,) * (ndim - 2))


def elementwise(op: Elementwise, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """onnxruntime's QLinearAdd / QLinearMul (MLAS, float32), or its float Sub between a
    DequantizeLinear pair and a QuantizeLinear; then the fused clamp.  A constant b
    broadcasts per channel."""
    qa, qc = op.a.quant, op.output.quant
    if op.b is None:
        b, qb = constant_operand(op, np.ndim(a)), op.constant_quant
    else:
        qb = op.b.quant
        if op.broadcasts_b:          # one pixel per sample: (B, C) -> (B, C, 1, ...)
            b = np.asarray(b).reshape((len(b), -1) + (1,) * (np.ndim(a) - 2))
    f32 = np.float32
    if any(q.wide for q in (qa, qb, qc)) and op.op != "sub":
        # no int16 QLinearAdd / QLinearMul: onnxruntime runs the QDQ nodes, in float32
        ra, rb = qa.dequantize(a), qb.dequantize(b)
        value = (ra + rb) if op.op == "add" else (ra * rb)
        q = np.rint(value.astype(f32) / f32(qc.scale)).astype(np.float64) + qc.zero_point
    elif op.op == "add":
        # MLAS's x86 kernel: uncentred integers, the zero points folded into one float32
        # constant, two fused multiply-adds (b's first), each rounded once to float32
        ratio_a = f32(qa.scale) / f32(qc.scale)
        ratio_b = f32(qb.scale) / f32(qc.scale)
        fixed = f32(qc.zero_point) - (ratio_a * f32(qa.zero_point) + ratio_b * f32(qb.zero_point))
        inner = (np.asarray(b, np.float64) * float(ratio_b) + float(fixed)).astype(f32)
        value = (np.asarray(a, np.float64) * float(ratio_a) + inner.astype(np.float64)
                 ).astype(f32)
        q = np.rint(value).astype(np.float64)
    elif op.op == "sub":
        # no QLinearSub: onnxruntime dequantizes both (float32), subtracts, and
        # QuantizeLinear divides by the scale and rounds half to even
        ra = ((np.asarray(a, np.int32) - qa.zero_point) * f32(qa.scale)).astype(f32)
        rb = ((np.asarray(b, np.int32) - qb.zero_point) * f32(qb.scale)).astype(f32)
        diff = (rb - ra) if op.reverse else (ra - rb)
        q = np.rint(diff.astype(f32) / f32(qc.scale)).astype(np.float64) + qc.zero_point
    elif op.op == "mul":
        ca = (np.asarray(a, np.int32) - qa.zero_point).astype(f32)
        cb = (np.asarray(b, np.int32) - qb.zero_point).astype(f32)
        ratio = f32(qa.scale) * f32(qb.scale) / f32(qc.scale)
        q = np.rint((ca * cb) * ratio).astype(np.float64) + qc.zero_point
    else:
        raise ValueError(f"{op.name}: unknown element-wise operation {op.op!r}")
    lo, hi = activation_bounds(op.activation, qc)
    return np.clip(q, lo, hi).astype(_dtype(qc))


_EVALUATORS = {Dense: dense, Conv: conv, Pool: pool, Lookup: lookup}


def evaluate(op: Operator, *xs: np.ndarray) -> np.ndarray:
    """One operator on a batch of quantized inputs, one (B, *shape) array per op.inputs."""
    xs = [np.asarray(x) for x in xs]
    if len(xs) != len(op.inputs):
        raise ValueError(f"{op.name}: {len(xs)} inputs, expected {len(op.inputs)}")
    for x, t in zip(xs, op.inputs):
        expected = (len(xs[0]),) + tuple(t.shape)
        if x.ndim < 1 or x.shape != expected:
            which = f" ({t.name})" if len(xs) > 1 else ""
            raise ValueError(f"{op.name}: input of shape {x.shape}, expected {expected}{which}")
    if isinstance(op, Elementwise):
        return elementwise(op, *xs)
    return _EVALUATORS[type(op)](op, xs[0])


def run_segment(segment: Segment, inputs: dict[str, np.ndarray], every: bool = False
                ) -> dict[str, np.ndarray]:
    """Evaluate a segment's operators in order; `inputs` and the result are keyed by tensor
    name, each (B, *shape) in the tensor's integer type.  `every`: every tensor's value,
    not only the segment's outputs."""
    values = {t.name: np.asarray(inputs[t.name]) for t in segment.inputs}
    for op in segment.operators:
        values[op.output.name] = evaluate(op, *(values[t.name] for t in op.inputs))
    return values if every else {t.name: values[t.name] for t in segment.outputs}

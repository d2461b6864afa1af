"""Requantization parameters for Activate's P flag (spec/isa.md 5.5).

A quantized layer's output is round_half_even(acc * r[n]) + z_y with the real multiplier
r[n] = s_x * s_w[n] / s_y.  Two forms:

- float (`act_float = 1`, what the compiler emits for Dense, Conv and global average
  pooling): MULT[n] holds r[n]'s float32 bits and the machine computes as onnxruntime's
  MLAS does, fl32(fl32(acc) * r[n]) rounded half to even, so the output is bit-identical to
  onnxruntime's QLinearConv / QGemm / QLinearGlobalAveragePool (float_words);
- exact fixed point (`act_float = 0`): the machine multiplies by MULT[n] and divides by
  2^SHIFT[n] (times the pooling count), r[n] written as a 31-bit mantissa and an exponent;
  it differs from onnxruntime's float32 product on near-ties (one unit, grown by later
  layers), and stays for average pooling whose windows' counts differ (fixed_point).
"""
from __future__ import annotations

import math

import numpy as np

SHIFT_MAX = 46              # the machine saturates P's shift byte here
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def fixed_point(real: float) -> tuple[int, int]:
    """(mult, shift) with mult * 2^-shift ~= real, mult < 2^31, 0 <= shift <= SHIFT_MAX."""
    real = float(real)
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"requantization multiplier {real} is not a finite non-negative number")
    if real == 0.0:
        return 0, 0
    mantissa, exponent = math.frexp(real)          # real = mantissa * 2^exponent, [0.5, 1)
    mult = round(mantissa * (1 << 31))
    if mult == 1 << 31:
        mult, exponent = 1 << 30, exponent + 1
    shift = 31 - exponent
    if shift < 0:
        raise ValueError(f"requantization multiplier {real} is too large (>= 2^31)")
    if shift > SHIFT_MAX:                         # tiny multipliers lose mantissa bits
        mult = round(real * (1 << SHIFT_MAX))
        shift = SHIFT_MAX
    return int(mult), int(shift)


def multipliers(reals) -> tuple[np.ndarray, np.ndarray]:
    """Per-column (mult, shift) arrays (int64) for an array of real multipliers."""
    pairs = [fixed_point(r) for r in np.asarray(reals, np.float64).ravel()]
    return (np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64))


def float_words(reals) -> np.ndarray:
    """Per-column float32 multipliers as P's multiplier words under act_float: the IEEE
    bits as int64 (what parameter_rows writes as int32 byte planes)."""
    r = np.ascontiguousarray(np.asarray(reals, np.float64).ravel().astype(np.float32))
    if not np.all(np.isfinite(r)) or np.any(r < 0):
        raise ValueError(f"requantization multipliers {r} are not finite non-negative float32")
    return r.view(np.uint32).astype(np.int64)


def wrap_int32(values) -> np.ndarray:
    """Two's complement wrap to int32 (the accumulators and P's bias add wrap the same way,
    so a folded bias that overflows still gives the exact sum whenever that sum fits)."""
    v = np.asarray(values, np.int64)
    return (((v - INT32_MIN) & 0xFFFFFFFF) + INT32_MIN).astype(np.int64)


def folded_bias(bias, column_sums, zero_point: int) -> np.ndarray:
    """The bias with the input zero point folded in: sum_k (x_k - z) w_kn + b_n
    = sum_k x_k w_kn + (b_n - z * sum_k w_kn), so the array multiplies raw x."""
    b = np.zeros(len(column_sums), np.int64) if bias is None else np.asarray(bias, np.int64)
    return wrap_int32(b - int(zero_point) * np.asarray(column_sums, np.int64))


def clip_bounds(activation, out_quant) -> tuple[int, int]:
    """(act_lo, act_hi) in the output's quantized units: the type's range narrowed by ReLU
    (the quantized zero) or Clip (the quantized bounds), as spec'd in compiler/ir.py."""
    lo, hi = out_quant.qmin, out_quant.qmax
    if activation.kind == "relu":
        lo = max(lo, out_quant.zero_point)
    elif activation.kind == "clip":
        if activation.lo is not None:
            lo = max(lo, _quantized_bound(activation.lo, out_quant))
        if activation.hi is not None:
            hi = min(hi, _quantized_bound(activation.hi, out_quant))
    elif activation.kind != "none":
        raise ValueError(f"activation {activation.kind!r} is not one the back end maps")
    return lo, hi


def _quantized_bound(real: float, quant) -> int:
    # float32, as onnxruntime (and compiler/reference.py) compute it
    return int(np.rint(np.float32(real) / np.float32(quant.scale))) + int(quant.zero_point)


def layer_multipliers(x_scale, weight_scale, y_scale) -> np.ndarray:
    """(x_scale * weight_scale[n]) / y_scale in float32, MLAS's order (QLinearConv's
    output_scales; QGemm's alpha * a * b / y with alpha = 1 is the same number): the float
    form writes these very numbers, and fixed_point() represents each exactly too (a float32
    has a 24-bit mantissa)."""
    return (np.float32(x_scale) * np.asarray(weight_scale, np.float32)) / np.float32(y_scale)


def global_average_multiplier(x_scale, y_scale, count: int) -> np.float32:
    """MLAS's QLinearGlobalAveragePool multiplier, x.scale / (y.scale * count) in float32
    (the float form's multiplier holds the count: the machine does not divide by it)."""
    return np.float32(x_scale) / (np.float32(y_scale) * np.float32(count))


def parameter_rows(bias, mult, shift, n: int) -> np.ndarray:
    """The 9 UB rows of one column block (spec/isa.md 5.5): bias and multiplier as int32
    little-endian byte planes, then the shift byte; columns beyond len(bias) are zero.
    Under act_float `mult` is float_words' bits and the shift row is not read (zeros)."""
    rows = np.zeros((9, n), np.uint8)
    for base, values in ((0, bias), (4, mult)):
        u = np.asarray(values, np.int64) & 0xFFFFFFFF
        for r in range(4):
            rows[base + r, :len(u)] = (u >> (8 * r)) & 0xFF
    rows[8, :len(shift)] = np.asarray(shift, np.int64)
    return rows

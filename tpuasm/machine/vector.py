"""The vector unit's arithmetic (VADD and VMUL, spec/isa.md 5.11): one place for the
element formula and for reading and writing its 8- and 16-bit operands, shared by the
emulator's kernels (numba, AOT and the plain-Python run of pure.py), and for the registers
a compiler sets (qlinear_registers, also used by benchmarks/vector_exactness.py).  The
numpy reference model (reference.py) keeps its own Python-integer version on purpose: it
is the oracle.

    VADD: t = (A - za) * ma + (B - zb) * mb
    VMUL: t = (A - za) * (B - zb) * ma
    y = round_half_even(t / 2^shift) + zc,  saturated to int8 (uint8 when unsigned), or
        to int16 for a 16-bit C (flag Z)

A, B are int8 / uint8 from one UB row a vector, or int16 (flags X, Y) from two: the low
bytes row, then the high bytes row.  The zero points lie in -32768..32767, so |A - z| <=
2^16 - 1 and |m| <= 2^31: VMUL's |t| <= (2^16 - 1)^2 * 2^31 < 2^63 and VADD's < 2^48,
exact in int64 for every width and register value (no multiplier limit needed).
"""
from __future__ import annotations

import numpy as np

from .decoded import VEC_LOOKUP, VEC_UNSIGNED, VEC_WIDE_A, VEC_WIDE_B, VEC_WIDE_C
from .jit import njit

OP_ADD, OP_MUL = 0, 1


@njit(cache=True)
def shift_round_half_even(t, shift):
    """t / 2^shift rounded to the nearest integer, ties to even (shift 0..62)."""
    if shift == 0:
        return t
    q = t >> shift                      # floor
    r = t - (q << shift)                # 0 <= r < 2^shift
    half = np.int64(1) << (shift - 1)
    if r > half or (r == half and (q & 1) == 1):
        q += 1
    return q


@njit(cache=True)
def signed8(v):
    """A raw byte (0..255) as int8."""
    return v - ((v & 128) << 1)


@njit(cache=True)
def rows_per_vector(flags):
    """UB rows one vector of A, B and C takes (2 for a 16-bit operand, else 1)."""
    return (2 if flags & VEC_WIDE_A else 1, 2 if flags & VEC_WIDE_B else 1,
            2 if flags & VEC_WIDE_C else 1)


@njit(cache=True)
def load_vector(ub, r, x, dst, unsigned_in, wide_in):
    """x[dst] = the vector at UB row r (rows r, r+1 with wide_in: low bytes, then high
    bytes, as Activate writes int16): MatrixMultiply's input vectors (H: int16, uint16
    with U) and the vector unit's operands (X, Y: always int16).  int32 arithmetic so the
    loops vectorize 16 wide; every value fits (|x| < 2^16).  One loop per width and
    signedness: a width tested inside the element loop kept numba from vectorizing it
    (VADD at 45 M elements/s instead of ~2,000 M)."""
    n = x.shape[1]
    out = x[dst]
    lo = ub[r]
    if wide_in:
        hi = ub[r + 1]
        if unsigned_in:
            for j in range(n):
                out[j] = np.int32(lo[j]) + 256 * np.int32(hi[j])
        else:
            for j in range(n):
                out[j] = np.int32(lo[j]) + 256 * signed8(np.int32(hi[j]))
    elif unsigned_in:
        for j in range(n):
            out[j] = lo[j]
    else:
        for j in range(n):
            out[j] = signed8(np.int32(lo[j]))


@njit(cache=True)
def combine(kind, x, y, ma, mb, za, zb, shift, zc):
    """y before saturation, from the operand values x (A) and y (B)."""
    if kind == OP_ADD:
        t = (x - za) * ma + (y - zb) * mb
    else:
        t = (x - za) * (y - zb) * ma
    return shift_round_half_even(t, shift) + zc


@njit(cache=True)
def store_result(out, j, v, wide, unsigned):
    """Column j of C's vector into out: int16 as two bytes (out[0] low, out[1] high) when
    wide, else one saturated byte."""
    if wide:
        v = min(max(v, -32768), 32767)
        out[0, j] = v & 0xFF
        out[1, j] = (v >> 8) & 0xFF
    else:
        out[0, j] = min(max(v, 0), 255) if unsigned else min(max(v, -128), 127) & 0xFF


@njit(cache=True)
def apply_table(row, table):
    """L: every byte b of an 8-bit result row becomes table[b] (a pass of its own: the
    gather inside the arithmetic's loop kept it from vectorizing)."""
    for j in range(row.shape[0]):
        row[j] = table[row[j]]


@njit(cache=True)
def element(kind, a, b, ma, mb, za, zb, shift, zc, unsigned):
    """One 8-bit output value (0..255 as stored) from two stored operand bytes a, b."""
    if unsigned:
        x, y = np.int64(a), np.int64(b)
    else:
        x, y = signed8(np.int64(a)), signed8(np.int64(b))
    v = combine(kind, x, y, ma, mb, za, zb, shift, zc)
    if unsigned:
        return min(max(v, 0), 255)
    return min(max(v, -128), 127) & 0xFF


@njit(cache=True)
def _value(stored, raw, unsigned):
    """An operand element: from its byte when raw (int8, or uint8 when unsigned), else
    already read by load_vector."""
    if raw and not unsigned:
        return signed8(np.int64(stored))
    return np.int64(stored)


@njit(cache=True)
def _results(kind, x, y, out, wide, raw, ma, mb, za, zb, shift, zc, unsigned):
    """out = C's vector from A's and B's elements x, y: their bytes (raw) or load_vector's
    values.  wide and raw are constants at every call, so they fold out of the loop."""
    for j in range(out.shape[1]):
        v = combine(kind, _value(x[j], raw, unsigned), _value(y[j], raw, unsigned), ma, mb,
                    za, zb, shift, zc)
        store_result(out, j, v, wide, unsigned)


@njit(cache=True)
def vector_row(kind, flags, a, ra, b, rb, out, values, ma, mb, za, zb, shift, zc, table):
    """C's vector from vector ra of the operand rows a and vector rb of b (flags X, Y, Z
    choose the widths, U the 8-bit signedness, L the table) into out (2, N): row 0, and
    row 1 too for a 16-bit C.  values: (2, N) int64 scratch for A's and B's elements."""
    unsigned = (flags & VEC_UNSIGNED) != 0
    per_a, per_b, _ = rows_per_vector(flags)
    wide_c = (flags & VEC_WIDE_C) != 0
    # widths are constants in each call below: a width tested per element kept numba from
    # vectorizing the loop (45 M elements/s instead of ~2,000 M)
    if per_a == 1 and per_b == 1:         # two 8-bit operands: straight from their bytes
        if wide_c:
            _results(kind, a[ra], b[rb], out, True, True, ma, mb, za, zb, shift, zc, unsigned)
        else:
            _results(kind, a[ra], b[rb], out, False, True, ma, mb, za, zb, shift, zc, unsigned)
    else:
        # U applies to the 8-bit operands only: a 16-bit one is int16
        load_vector(a, per_a * ra, values, 0, unsigned and per_a == 1, per_a == 2)
        load_vector(b, per_b * rb, values, 1, unsigned and per_b == 1, per_b == 2)
        if wide_c:
            _results(kind, values[0], values[1], out, True, False, ma, mb, za, zb, shift, zc,
                     unsigned)
        else:
            _results(kind, values[0], values[1], out, False, False, ma, mb, za, zb, shift, zc,
                     unsigned)
    if flags & VEC_LOOKUP:
        apply_table(out[0], table)


def fixed_point(ratios, max_shift: int = 62) -> tuple[list[int], int]:
    """Multipliers and the common shift for real `ratios`: the largest shift <= max_shift
    at which every round(ratio * 2^shift) fits int32 (the larger gets a 31-bit mantissa).
    What a compiler sets in vec_mult_a / vec_mult_b / vec_shift (spec/isa.md 5.11), for
    8- and 16-bit operands alike (the int64 bound in the module docstring needs no
    narrower multiplier)."""
    ratios = [float(r) for r in ratios]
    for shift in range(max_shift, -1, -1):
        mults = [int(round(r * 2.0 ** shift)) for r in ratios]
        if all(-(1 << 31) <= m < (1 << 31) for m in mults):
            return mults, shift
    raise ValueError(f"scale ratios {ratios} are too large for a 32-bit multiplier")


def qlinear_registers(op: str, a_scale: float, a_zero: int, b_scale: float, b_zero: int,
                      c_scale: float, c_zero: int) -> dict[str, int]:
    """The configuration registers that make VADD ("add", also "sub") or VMUL ("mul")
    compute onnxruntime's QLinearAdd / QLinearMul (and a Sub with B negated) with these
    scales and zero points: {register name: value} for CFG (spec/isa.md 5.11).  The same
    registers serve 8- and 16-bit operands (flags X, Y, Z)."""
    if op in ("add", "sub"):
        ratios = [a_scale / c_scale, (-1 if op == "sub" else 1) * b_scale / c_scale]
    elif op == "mul":
        ratios = [a_scale * b_scale / c_scale]
    else:
        raise ValueError(f"unknown vector operation {op!r} (add, sub, mul)")
    mults, shift = fixed_point(ratios)
    regs = {"vec_mult_a": mults[0], "vec_shift": shift, "vec_zero_a": int(a_zero),
            "vec_zero_b": int(b_zero), "vec_zero_c": int(c_zero)}
    if len(mults) > 1:
        regs["vec_mult_b"] = mults[1]
    return regs


def float_bits(value) -> int:
    """The IEEE float32 bits of `value` as a signed int32 (a register's range)."""
    return int(np.array([value], np.float32).view(np.int32)[0])


def qlinear_float_registers(op: str, a_scale: float, a_zero: int, b_scale: float,
                            b_zero: int, c_scale: float, c_zero: int) -> dict[str, int]:
    """The registers for VADD ("add") / VMUL ("mul") with vec_float = 1 (spec/isa.md
    5.11): onnxruntime's own float32 ratios, so the result is its QLinearAdd / QLinearMul
    bit for bit."""
    f32 = np.float32
    if op == "add":
        mults = {"vec_mult_a": float_bits(f32(a_scale) / f32(c_scale)),
                 "vec_mult_b": float_bits(f32(b_scale) / f32(c_scale))}
    elif op == "mul":
        mults = {"vec_mult_a": float_bits(f32(a_scale) * f32(b_scale) / f32(c_scale))}
    else:
        raise ValueError(f"vec_float computes add and mul only, not {op!r}")
    return {**mults, "vec_float": 1, "vec_zero_a": int(a_zero), "vec_zero_b": int(b_zero),
            "vec_zero_c": int(c_zero)}

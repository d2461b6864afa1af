"""The vector unit's arithmetic (VADD and VMUL, spec/isa.md 5.11): one place for the
element formula, shared by the emulator's kernels (numba, AOT and the plain-Python run
of pure.py) and by tpuasm/machine/vector_exactness.py.  The numpy reference model
(reference.py) keeps its own Python-integer version on purpose: it is the oracle.

    VADD: t = (A - za) * ma + (B - zb) * mb
    VMUL: t = (A - za) * (B - zb) * ma
    y = round_half_even(t / 2^shift) + zc,  saturated to int8 (uint8 when unsigned)

|A - z| <= 383 and |m| <= 2^31, so |t| < 2^50: exact in int64.
"""
from __future__ import annotations

import numpy as np

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
def element(kind, a, b, ma, mb, za, zb, shift, zc, unsigned):
    """One output value (0..255 as stored) from two stored operand bytes a, b (0..255)."""
    if unsigned:
        x, y = np.int64(a), np.int64(b)
    else:
        x, y = np.int64(a) - ((np.int64(a) & 128) << 1), np.int64(b) - ((np.int64(b) & 128) << 1)
    if kind == OP_ADD:
        t = (x - za) * ma + (y - zb) * mb
    else:
        t = (x - za) * (y - zb) * ma
    v = shift_round_half_even(t, shift) + zc
    if unsigned:
        return min(max(v, 0), 255)
    return min(max(v, -128), 127) & 0xFF


@njit(cache=True)
def vector_row(kind, a_row, b_row, out, ma, mb, za, zb, shift, zc, unsigned, table, lookup):
    """out[j] = element(a_row[j], b_row[j]) (through `table` when lookup) for one vector."""
    for j in range(out.shape[0]):
        v = element(kind, a_row[j], b_row[j], ma, mb, za, zb, shift, zc, unsigned)
        out[j] = table[v] if lookup else v


def fixed_point(ratios, max_shift: int = 62) -> tuple[list[int], int]:
    """Multipliers and the common shift for real `ratios`: the largest shift <= max_shift
    at which every round(ratio * 2^shift) fits int32 (the larger gets a 31-bit mantissa).
    What a compiler sets in vec_mult_a / vec_mult_b / vec_shift (spec/isa.md 5.11)."""
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
    scales and zero points: {register name: value} for CFG (spec/isa.md 5.11)."""
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

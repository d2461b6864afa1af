"""The exact definition of Activate's sigmoid and tanh (spec/isa.md, section 5.5).

Both are tables of Q15 results indexed by a Q8 input t in [-4096, 4095].  They are
defined by `compute_tables()`, which works in decimal arithmetic (40 significant
digits), so they are the same on every host whatever its libm does.  Computing them
takes about a second, so the package ships them in function_tables.npz
(`python -m tpuasm.functions` rewrites it) and a test proves the file equals the
definition; the emulator and the reference model read the arrays below.
"""
from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from pathlib import Path

import numpy as np

T_MIN, T_MAX = -4096, 4095          # Q8 input domain: (-16, 16)
IN_FRAC = 8                         # fractional bits of the table input
OUT_ONE = 1 << 15                   # Q15: 1.0


def _table(fn) -> np.ndarray:
    out = np.empty(T_MAX - T_MIN + 1, dtype=np.int32)
    with localcontext() as ctx:
        ctx.prec = 40
        for i, t in enumerate(range(T_MIN, T_MAX + 1)):
            value = fn(Decimal(t) / 256) * OUT_ONE
            out[i] = int(value.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))
    out.setflags(write=False)
    return out


def _sigmoid(x: Decimal) -> Decimal:
    return 1 / (1 + (-x).exp())


def _tanh(x: Decimal) -> Decimal:
    e = (2 * x).exp()
    return (e - 1) / (e + 1)


TABLE_FILE = Path(__file__).with_name("function_tables.npz")


def compute_tables() -> dict[str, np.ndarray]:
    return {"sigmoid": _table(_sigmoid), "tanh": _table(_tanh)}


def _shipped() -> dict[str, np.ndarray]:
    with np.load(TABLE_FILE, allow_pickle=False) as z:
        tables = {k: z[k].astype(np.int32) for k in ("sigmoid", "tanh")}
    for t in tables.values():
        t.setflags(write=False)
    return tables


_TABLES = _shipped()
SIGMOID_Q15 = _TABLES["sigmoid"]
TANH_Q15 = _TABLES["tanh"]


def to_q8(x: int, in_frac: int) -> int:
    """The table index (before the T_MIN offset) for accumulator value x."""
    if in_frac < IN_FRAC:
        t = x << (IN_FRAC - in_frac)
    elif in_frac == IN_FRAC:
        t = x
    else:
        t = (x + (1 << (in_frac - IN_FRAC - 1))) >> (in_frac - IN_FRAC)
    return min(max(t, T_MIN), T_MAX)


if __name__ == "__main__":
    np.savez_compressed(TABLE_FILE, **compute_tables())
    print(f"wrote {TABLE_FILE}")

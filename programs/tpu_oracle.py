"""The math the regression programs compute, modelled independently in numpy.

Every gen.py builds its expected output with these functions, written from
spec/isa.md alone.  Nothing here imports the emulator or tpuasm.machine.reference;
the only thing taken from tpuasm is the sigmoid/tanh tables of tpuasm/functions.py,
which *are* the definition of those functions (spec/isa.md 5.5).

Conventions: matrices are exact int64 numpy arrays; `out = x @ w` with x (B, K) and
w (K, N), input element k times w[k, n] feeding output n (OpenTPU orientation).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

N = 256                         # array size of TPU v1
INT32 = 1 << 32


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_int8(g: np.random.Generator, shape, low=-128, high=127) -> np.ndarray:
    return g.integers(low, high + 1, size=shape, dtype=np.int16).astype(np.int8)


def read_equs(tasm: Path) -> dict[str, int]:
    """The plain-integer `.equ NAME, value` constants of a program, so the generator
    and the program share one definition of every size and shift."""
    out = {}
    for line in Path(tasm).read_text().splitlines():
        m = re.match(r"\s*\.equ\s+(\w+)\s*,\s*(-?(?:0x[0-9a-fA-F_]+|[0-9_]+))\s*(?:[;#].*)?$", line)
        if m:
            out[m.group(1)] = int(m.group(2), 0)
    return out


# ---------------------------------------------------------------- matrix unit

def wrap_int32(v: np.ndarray) -> np.ndarray:
    """Two's-complement int32 wrap of exact integers (the accumulators' adders)."""
    v = np.asarray(v, dtype=np.int64)
    return ((v + (1 << 31)) % INT32 - (1 << 31)).astype(np.int64)


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact x @ w for 8-bit operands.  float64 holds every partial sum exactly as long
    as |sum| < 2^53, which int8 x int8 products over K < 2^37 terms never exceed;
    BLAS float64 is ~100x faster than numpy's integer matmul."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    assert x.shape[-1] * 256 * 256 < 2 ** 53
    return np.rint(x64 @ w64).astype(np.int64)


def pad_to(a: np.ndarray, multiple: int, axes=(0, 1)) -> np.ndarray:
    pad = [(0, 0)] * a.ndim
    for ax in axes:
        pad[ax] = (0, -a.shape[ax] % multiple)
    return np.pad(a, pad)


def weight_tiles(w: np.ndarray) -> np.ndarray:
    """Cut a (K, M) weight matrix (multiples of N) into N x N tiles.

    Tile index n * KT + k holds w[kN:(k+1)N, nN:(n+1)N] (all K tiles of output
    block 0 first), the order a tiled multiply switches through them.
    """
    k_tiles, n_tiles = w.shape[0] // N, w.shape[1] // N
    tiles = w.reshape(k_tiles, N, n_tiles, N).transpose(2, 0, 1, 3)   # (n, k, N, N)
    return np.ascontiguousarray(tiles.reshape(n_tiles * k_tiles, N, N))


def k_chunks(x: np.ndarray) -> np.ndarray:
    """(B, K) inputs -> (K/N * B, N) UB/host rows: chunk k holds columns kN..kN+N-1 of
    every vector, chunk after chunk (the layout `rep_ub_stride = B` walks)."""
    b, k = x.shape
    return np.ascontiguousarray(x.reshape(b, k // N, N).transpose(1, 0, 2).reshape(-1, N))


def n_blocks(y: np.ndarray) -> np.ndarray:
    """(B, M) outputs -> (M/N * B, N) rows, output block after output block."""
    return k_chunks(y)


# ---------------------------------------------------------------- Activate (5.5)

def q8_index(x: np.ndarray, in_frac: int) -> np.ndarray:
    """Accumulator values -> Q8 table inputs, clipped to [-4096, 4095]."""
    x = np.asarray(x, dtype=np.int64)
    if in_frac < 8:
        t = x << (8 - in_frac)
    elif in_frac == 8:
        t = x
    else:
        t = (x + (1 << (in_frac - 9))) >> (in_frac - 8)
    return np.clip(t, -4096, 4095)


def _tables():
    from tpuasm.functions import SIGMOID_Q15, T_MIN, TANH_Q15   # the definition itself
    return SIGMOID_Q15.astype(np.int64), TANH_Q15.astype(np.int64), T_MIN


def apply_function(x: np.ndarray, fn: str | None, in_frac: int = 0) -> np.ndarray:
    x = np.asarray(x, dtype=np.int64)
    if fn is None:
        return x
    if fn == "relu":
        return np.maximum(x, 0)
    sig, tanh, t_min = _tables()
    table = {"sigmoid": sig, "tanh": tanh}[fn]
    return table[q8_index(x, in_frac) - t_min]


def max_pool_2d(x: np.ndarray, width: int, k: int) -> np.ndarray:
    """Rows of an image of `width` pixels per row, pooled in k x k windows (row-major)."""
    rows, n = x.shape
    h = rows // width
    img = x.reshape(h // k, k, width // k, k, n)
    return img.max(axis=(1, 3)).reshape(-1, n)


def avg_pool_2d(x: np.ndarray, width: int, k: int) -> np.ndarray:
    """Average of k x k windows, rounded as spec/isa.md 5.5: floor((sum + count // 2) / count)."""
    rows, n = x.shape
    h = rows // width
    total = np.asarray(x, np.int64).reshape(h // k, k, width // k, k, n).sum(axis=(1, 3))
    count = k * k
    return ((total + count // 2) // count).reshape(-1, n)


def requantize(x: np.ndarray, mult: int = 1, shift: int = 0, zero: int = 0,
               out: str = "int8") -> np.ndarray:
    """y = x * mult; rounding arithmetic shift (half up); + zero; saturate to the output type."""
    y = np.asarray(x, dtype=np.int64) * mult
    if shift > 0:
        y = (y + (1 << (shift - 1))) >> shift
    y = y + zero
    if out == "int8":
        return np.clip(y, -128, 127).astype(np.int8)
    if out == "uint8":
        return np.clip(y, 0, 255).astype(np.uint8)
    raise ValueError(out)


def activate(acc, fn=None, in_frac=0, mult=1, shift=0, zero=0, out="int8"):
    """Activate without pooling: function, then requantization."""
    return requantize(apply_function(acc, fn, in_frac), mult, shift, zero, out)


# ---------------------------------------------------------------- vector unit (5.11)

def _round_half_even_shift(t: np.ndarray, shift: int) -> np.ndarray:
    """t / 2^shift to the nearest integer, ties to even (exact: floor division)."""
    if shift == 0:
        return t
    d = 1 << shift
    q = t // d
    r = t - q * d
    up = (2 * r > d) | ((2 * r == d) & (q % 2 == 1))
    return q + up


def vector(op: str, a, b, mult_a=1, mult_b=1, shift=0, zero_a=0, zero_b=0, zero_c=0,
           unsigned=False, table=None) -> np.ndarray:
    """VADD ("add") / VMUL ("mul") of int8 (uint8) arrays, spec/isa.md 5.11."""
    x = np.asarray(a, np.int64) - zero_a
    y = np.asarray(b, np.int64) - zero_b
    t = x * mult_a + y * mult_b if op == "add" else x * y * mult_a
    v = _round_half_even_shift(t, shift) + zero_c
    out = np.clip(v, 0, 255).astype(np.uint8) if unsigned else np.clip(v, -128, 127).astype(np.int8)
    if table is not None:
        out = np.asarray(table, np.uint8)[out.view(np.uint8)].view(out.dtype)
    return out


# ---------------------------------------------------------------- files

def save(out_dir: Path, **arrays) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(out_dir / f"{name}.npy", a, allow_pickle=False)


def host_image(rows: int, **blocks) -> np.ndarray:
    """A zero int8 host image of `rows` rows with blocks placed at given rows:
    host_image(512, x=(0, x_rows))."""
    img = np.zeros((rows, N), dtype=np.int8)
    for start, data in blocks.values():
        img[start:start + len(data)] = data.view(np.int8) if data.dtype == np.uint8 else data
    return img

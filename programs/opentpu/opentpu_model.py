"""OpenTPU's semantics, modelled independently in numpy for the OpenTPU-style programs.

Written from the facts (TPU_FACTS.md, OpenTPU section) and spec/opentpu.md alone; it
imports nothing from tpuasm, so the regression runner compares the emulator against a
second, separate reading of the rules:

- MMC: input vector k-th element times tile[k, n] feeds output n; products summed
  exactly and wrapped to int32 (OpenTPU's 32-bit accumulators); O overwrites, the
  default adds; S makes the next tile from the FIFO active.
- ACT: ReLU `max(x, 0)`, sigmoid `int(255 / (1 + exp(-x)))` in float64 exactly as
  OpenTPU's Python evaluates it, or nothing; then the low 8 bits go to the int8 UB.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

INT32 = 1 << 32


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def random_int8(g, shape, low=-128, high=127) -> np.ndarray:
    return g.integers(low, high + 1, size=shape, dtype=np.int16).astype(np.int8)


def mmc(x: np.ndarray, tile: np.ndarray) -> np.ndarray:
    """x (rows, N) int8 times tile (N, N) int8: exact, then wrapped to int32 (as int64)."""
    exact = x.astype(np.int64) @ tile.astype(np.int64)
    return wrap_int32(exact)


def wrap_int32(v: np.ndarray) -> np.ndarray:
    return (np.asarray(v, np.int64) + (1 << 31)) % INT32 - (1 << 31)


def sigmoid(acc: np.ndarray) -> np.ndarray:
    """int(255 / (1 + exp(-x))) in float64.  Where exp overflows (x <= -710, where
    OpenTPU's Python raises) numpy gives inf and the quotient 0, the limit."""
    with np.errstate(over="ignore"):
        return np.floor(255.0 / (1.0 + np.exp(-np.asarray(acc, np.float64)))).astype(np.int64)


def act(acc: np.ndarray, fn: str = "none") -> np.ndarray:
    """OpenTPU's Activate: the function, then the low 8 bits, as int8 UB rows."""
    acc = np.asarray(acc, np.int64)
    y = {"none": lambda a: a, "relu": lambda a: np.maximum(a, 0), "sigmoid": sigmoid}[fn](acc)
    return (y & 0xFF).astype(np.uint8).view(np.int8)


def save(out_dir: Path, **arrays) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(out_dir / f"{name}.npy", a)

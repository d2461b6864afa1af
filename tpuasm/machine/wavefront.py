"""The systolic wavefront the timing model claims (spec/timing.md section 6.1).

Geometry of the N x N matrix unit (OpenTPU orientation, `out[v, n] = sum_k x[v, k] w[k, n]`):
cell (k, n) sits in row k, column n and holds weight w[k, n].  Input vectors enter from
the left, partial sums move down, results leave the bottom into the accumulators.

For one *stream* (one iteration of a MatrixMultiply: `vectors` input vectors entering one
per `rate` cycles from cycle `start` on; rate 2 with H or D, 4 with both):

* vector v enters the array (cell (0, 0)) in cycle `start + rate*v`; the input skew delays
  its element k by k cycles (it reaches row k after k cycles) and it moves one column to the
  right per cycle (it reaches column n after n more), so vector v is in cell (k, n) during
  the `rate` cycles from `start + rate*v + k + n` on: the diagonal wavefront;
* the partial sum of vector v for column n moves down with it: in cell (k, n) it becomes
  `sum_{j <= k} x[v, j] w[j, n]`; it leaves row N-1 at the end of cycle
  `start + rate*(v+1) - 1 + (N-1) + n`, crosses to the accumulators in the next cycle and is
  added into them in the cycle after (`accumulate_cycle`), visible from the cycle after that;
* so the last result of the stream is in the accumulators at `last_in + 2N`, where
  `last_in = start + rate*vectors` is the cycle after the last vector entered: exactly the
  MatrixMultiply's finish with `mmc_latency` = 2N (the TPU v1 default).

A weight switch travels with the first vector of its stream: cell (k, n) uses the new tile
from cycle `start + k + n` on, so a stream never sees the previous tile and the vectors of
the previous stream still in the array never see the new one.

`streams(machine, index)` gives the timing model's streams of an issued MatrixMultiply and
`array_view(machine, cycle)` which instruction, iteration and vector are in each cell at a
cycle; the debugger's array view draws this, and tests/test_wavefront.py checks it against
hand-computed cells and the timing model's start and finish cycles.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import core
from .decoded import (COL_FLAGS, COL_HEIGHT, COL_LEN, COL_OP, COL_REPEAT, COL_WIDTH, MMC_CONV,
                      MMC_SWITCH, MMC_WIDE_IN, MMC_WIDE_W, OP_MMC)


@dataclass(frozen=True)
class Stream:
    """One MatrixMultiply iteration streaming through an n x n array."""
    start: int              # cycle vector 0 enters cell (0, 0)
    vectors: int            # input vectors in this iteration
    n: int                  # array size N
    rate: int = 1           # cycles per vector (2 with H or D, 4 with both)
    index: int = -1         # the MatrixMultiply (program index), -1 when not from a machine
    iteration: int = 0

    @property
    def last_in(self) -> int:
        """The cycle after the last vector entered: the matrix stage is free again."""
        return self.start + self.rate * self.vectors

    @property
    def done(self) -> int:
        """First cycle at which every result of the stream is in the accumulators."""
        return self.last_in + 2 * self.n

    def enter_cycle(self, v: int, k: int, n: int) -> int:
        """First cycle vector v is in cell (k, n) (it stays `rate` cycles)."""
        return self.start + self.rate * v + k + n

    def vector_at(self, cycle: int, k: int, n: int) -> int | None:
        """The vector in cell (k, n) during `cycle`, or None."""
        d = cycle - self.start - k - n
        if d < 0:
            return None
        v = d // self.rate
        return v if v < self.vectors else None

    def cells(self, cycle: int) -> np.ndarray:
        """(N, N) int64: the vector in each cell during `cycle`, -1 where none."""
        k = np.arange(self.n)
        d = cycle - self.start - k[:, None] - k[None, :]
        v = np.where(d >= 0, d // self.rate, -1)
        return np.where(v < self.vectors, v, -1)

    def accumulate_cycle(self, v: int, n: int) -> int:
        """The cycle vector v's sum for column n is added into the accumulators (visible
        from the next cycle on)."""
        return self.start + self.rate * (v + 1) + self.n + n


def partial_sum(x: np.ndarray, w: np.ndarray, k: int, n: int) -> int:
    """The partial sum a vector x (length N, exact ints) carries out of cell (k, n) with
    weights w (N x N): `sum_{j <= k} x[j] w[j, n]` (before the int32 wrap of the adders)."""
    return int(np.dot(np.asarray(x[:k + 1], np.int64), np.asarray(w[:k + 1, n], np.int64)))


def _rate(row) -> int:
    f = int(row[COL_FLAGS])
    return (2 if f & MMC_WIDE_IN else 1) * (2 if f & MMC_WIDE_W else 1)


def _vectors(row) -> int:
    if int(row[COL_FLAGS]) & MMC_CONV:
        return int(row[COL_HEIGHT] * row[COL_WIDTH])
    return int(row[COL_LEN])


def streams(machine, index: int) -> list[Stream]:
    """The timing model's streams of MatrixMultiply `index` (one per iteration), or [] when
    it has not issued (or is not an MMC).  Iterations with S begin at their tile's switch;
    without S they follow each other back to back from the MMC's start."""
    prog = machine.prog
    if not 0 <= index < len(prog) or int(prog[index, COL_OP]) != OP_MMC:
        return []
    times = machine.times
    if times[index, core.TM_ISSUE] < 0:
        return []
    row = prog[index]
    n = machine.config.array_size
    rate, vectors, reps = _rate(row), _vectors(row), int(row[COL_REPEAT])
    if int(row[COL_FLAGS]) & MMC_SWITCH:
        per = 2 if int(row[COL_FLAGS]) & MMC_WIDE_W else 1
        q = _first_tile(machine, index)
        begins = [int(machine.tl[core.T_SW, q + per * i]) for i in range(reps)]
    else:
        s = int(times[index, core.TM_START])
        begins = [s + i * rate * vectors for i in range(reps)]
    return [Stream(b, vectors, n, rate, index, i) for i, b in enumerate(begins)]


def _first_tile(machine, index: int) -> int:
    """Queue position of the first tile MatrixMultiply `index` switches to: the tiles the
    earlier MMC.S instructions consumed, in program order (FIFO order)."""
    prog = machine.prog[:index]
    sel = (prog[:, COL_OP] == OP_MMC) & ((prog[:, COL_FLAGS] & MMC_SWITCH) != 0)
    per = np.where(prog[sel, COL_FLAGS] & MMC_WIDE_W, 2, 1)
    return int((prog[sel, COL_REPEAT] * per).sum())


@dataclass(frozen=True)
class ArrayView:
    """What each cell of the array holds during one cycle (-1 where nothing)."""
    cycle: int
    instruction: np.ndarray     # (N, N) program index of the MatrixMultiply
    iteration: np.ndarray       # (N, N) its iteration
    vector: np.ndarray          # (N, N) the input vector within that iteration


def array_view(machine, cycle: int | None = None) -> ArrayView:
    """Which MatrixMultiply, iteration and input vector is in each cell during `cycle`
    (default: the machine's next cycle, `machine.cycle`).  Only issued instructions are
    known, so a cycle beyond the machine's issue horizon may show fewer streams than a
    longer run would."""
    c = machine.cycle if cycle is None else int(cycle)
    n = machine.config.array_size
    ins = np.full((n, n), -1, np.int64)
    it = np.full((n, n), -1, np.int64)
    vec = np.full((n, n), -1, np.int64)
    mmcs = np.flatnonzero((machine.prog[:, COL_OP] == OP_MMC)
                          & (machine.times[:len(machine.prog), core.TM_ISSUE] >= 0))
    for i in mmcs:
        for s in streams(machine, int(i)):
            if s.start <= c < s.done:
                v = s.cells(c)
                hit = v >= 0
                ins[hit], it[hit], vec[hit] = s.index, s.iteration, v[hit]
    return ArrayView(c, ins, it, vec)

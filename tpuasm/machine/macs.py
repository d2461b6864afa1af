"""Useful MACs: the multiply-accumulates a program's MatrixMultiplies really perform.

The array multiplies every input vector by a whole N x N tile, so the *array-active MAC
slots* of an MMC are vectors x N x N (`array_mac_slots`).  A layer whose weights are K x n
fills a tile only up to its K rows and n columns and the rest is zero padding.  The useful
MACs of an MMC are vectors x K x n, with K and n the tile's *extent*: one past its last
row and its last column holding a non-zero weight (a 16-bit pair: the larger of its two
tiles' extents).  So padding never counts, and a whole zero tile counts nothing: runs on
zero weight images (timing-only profiles) have no useful MACs of their own, and the tools
that time them count the network's MACs from its shapes instead (tpuasm profile, the sweep
targets, the compiler's report).  Zeros inside the extent are the network's own weights and
count.  spec/timing.md section 8 defines both counters.

Only retired MatrixMultiplies count, like every counter; the tiles each one used are
replayed from the tile table in program order (MMCs issue in order, each S iteration takes
the next tile, or pair of tiles, from the FIFO; without S an MMC reuses the active one).
"""
from __future__ import annotations

import numpy as np

from . import core
from .decoded import (COL_FLAGS, COL_HEIGHT, COL_LEN, COL_OP, COL_REPEAT, COL_WIDTH, MMC_CONV,
                      MMC_SWITCH, MMC_WIDE_W, OP_MMC)


def tile_extent(tile: np.ndarray) -> tuple[int, int]:
    """(rows, columns) of a tile up to its last non-zero weight: its real K x N."""
    rows = np.flatnonzero(tile.any(axis=1))
    cols = np.flatnonzero(tile.any(axis=0))
    return (int(rows[-1]) + 1 if rows.size else 0, int(cols[-1]) + 1 if cols.size else 0)


def useful_macs(prog, times, tl, nreq: int, weights, cycle: int, cache: dict) -> int:
    """Useful MACs of the MMCs retired by `cycle`.  `cache` keeps each weight tile's extent
    between calls (the Weight Memory is read-only while a program runs)."""
    count = len(prog)
    if count == 0:
        return 0
    mmc = np.flatnonzero((prog[:, COL_OP] == OP_MMC) & (times[:count, core.TM_ISSUE] >= 0))
    if mmc.size == 0:
        return 0
    rows = prog[mmc]
    flags = rows[:, COL_FLAGS]
    reps = rows[:, COL_REPEAT]
    vectors = np.where(flags & MMC_CONV, rows[:, COL_HEIGHT] * rows[:, COL_WIDTH],
                       rows[:, COL_LEN])
    per = 1 + ((flags & MMC_WIDE_W) != 0)
    switch = (flags & MMC_SWITCH) != 0
    taken = np.where(switch, reps * per, 0)
    first = np.cumsum(taken) - taken           # the tile-table slot each MMC starts at
    finish = times[mmc, core.TM_FINISH]
    retired = (finish >= 0) & (finish <= cycle)
    # one entry per (tile or pair, vectors through it): each S iteration its own tile
    sw = np.flatnonzero(retired & switch)
    r = reps[sw]
    entry = np.repeat(sw, r)
    iteration = np.arange(int(r.sum())) - np.repeat(np.cumsum(r) - r, r)
    keep = np.flatnonzero(retired & ~switch)
    slot = np.concatenate([first[entry] + iteration * per[entry], first[keep] - per[keep]])
    weight = np.concatenate([vectors[entry], vectors[keep] * reps[keep]])
    pair = np.concatenate([per[entry], per[keep]]) == 2
    k, n = _slot_extents(tl[core.T_TILE, :nreq], weights, cache)
    slot = np.where((slot >= 0) & (slot < nreq), slot, nreq)      # nreq: the (0, 0) slot
    hi = np.where(pair & (slot + 1 < nreq), slot + 1, nreq)
    kk = np.maximum(k[slot], np.where(pair, k[hi], 0))
    nn = np.maximum(n[slot], np.where(pair, n[hi], 0))
    return int(np.sum(weight * kk * nn))


def _slot_extents(tiles, weights, cache: dict):
    """K and N of each tile-table slot, and a last (0, 0) slot for "no tile"."""
    k = np.zeros(len(tiles) + 1, np.int64)
    n = np.zeros(len(tiles) + 1, np.int64)
    unique, inverse = np.unique(tiles, return_inverse=True)
    _fill_extents([int(t) for t in unique if int(t) not in cache], weights, cache)
    extents = np.array([cache[int(t)] for t in unique], np.int64).reshape(-1, 2)
    if len(tiles):
        k[:-1], n[:-1] = extents[inverse, 0], extents[inverse, 1]
    return k, n


# tiles scanned per numpy call: whole blocks at a time instead of one call per tile
# (CNN1 on a 64 x 64 array uses 25k tiles: 1.3 s tile by tile, a pass over its bytes here)
_EXTENT_BYTES = 1 << 24


def _fill_extents(tiles: list[int], weights, cache: dict) -> None:
    """Put each tile's extent (tile_extent) into `cache`; tiles outside the image: (0, 0)."""
    inside = [t for t in tiles if 0 <= t < len(weights)]
    for t in tiles:
        if not 0 <= t < len(weights):
            cache[t] = (0, 0)
    if not inside:
        return
    n = weights.shape[-1]
    step = max(1, _EXTENT_BYTES // max(weights[0].nbytes, 1))
    rows_at = np.arange(1, weights.shape[-2] + 1)
    cols_at = np.arange(1, n + 1)
    for i in range(0, len(inside), step):
        chunk = np.array(inside[i:i + step])
        nonzero = weights[chunk] != 0
        # one past the last row / column holding a non-zero weight (0: none)
        k = (nonzero.any(axis=2) * rows_at).max(axis=1)
        m = (nonzero.any(axis=1) * cols_at).max(axis=1)
        for t, kk, mm in zip(chunk.tolist(), k.tolist(), m.tolist()):
            cache[t] = (kk, mm)

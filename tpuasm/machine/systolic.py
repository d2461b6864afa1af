"""A register-level model of the systolic matrix unit, for small arrays (N <= 16).

Every MAC cell, every cycle, with register semantics (all registers take their new values
at the end of a cycle from the old ones).  It is an independent check of the timestamp
model (core.py) and of the wavefront geometry it claims (wavefront.py, spec/timing.md 6.1);
tests/test_systolic.py drives it with random MatrixMultiply programs.

What it takes from the timing model is only *when* things start: each stream's first cycle
(an MMC iteration's begin) and each weight tile's shift start (core's tile table).  From
there every value moves by itself, one register per cycle:

* **inputs** enter from the left: element k of the vector (or 16-bit pass) that enters in
  cycle e is pushed into row k's skew delay line and reaches cell (k, 0) in cycle e + k; in
  each cell it meets the partial sum coming from above and moves one column right per cycle;
* **partial sums** move down: cell (k, n) adds `x * w` to the sum it received from (k-1, n)
  in the previous cycle; row N-1's sums cross to the accumulators in one cycle and are
  added in the next (the sum's tag says which accumulator row, and whether it overwrites);
* **weights** are preloaded from the top: a tile's rows travel down each column through
  transit registers, last row first, column n starting n cycles late (the same skew as the
  inputs), and each cell latches its own weight into its shadow register when that weight
  passes (all of column n at once, N cycles after its first row entered);
* **switch**: the first vector of an S iteration carries a switch bit; each cell copies its
  shadow into its active register when that vector reaches it, so the switch is a diagonal
  wavefront too and vectors of the previous stream still in the array keep the old tile.

The model checks its own consistency as it goes (an input and the partial sum it meets
carry the same tag; a switch never finds an unloaded shadow; a shift never overwrites a
shadow the switch wavefront has not read yet) and raises SystolicError otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import core
from .decoded import (COL_ACC, COL_FLAGS, COL_HEIGHT, COL_LEN, COL_OP, COL_REG, COL_REPEAT,
                      COL_UB, COL_VALUE, COL_WIDTH, MMC_CONV, MMC_OVERWRITE, MMC_SWITCH,
                      MMC_UNSIGNED_IN, MMC_UNSIGNED_W, MMC_WIDE_IN, MMC_WIDE_W, OP_CFG, OP_MMC,
                      reset_registers)
from ..isa import ISA_TABLE
from .wavefront import Stream, streams

MAX_ARRAY = 16
_REG = {name: r.index for name, r in ISA_TABLE.registers.items()}


class SystolicError(Exception):
    """The register-level model cannot run the program, or found an inconsistency."""


@dataclass
class SystolicResult:
    acc: np.ndarray                     # (acc_rows, N) int32: what the array accumulated
    # per cycle in which the array holds anything: (N, N) global vector id per cell, -1 none
    cells: dict[int, np.ndarray] = field(default_factory=dict)
    accumulated: dict[int, int] = field(default_factory=dict)    # MMC index -> last add cycle
    # stream s (in issue order): its MMC, iteration, Stream, and its vectors' first global id
    streams: list[tuple[int, int, Stream, int]] = field(default_factory=list)


def check_size(n: int) -> None:
    """Refuse arrays the model cannot simulate cell by cell in reasonable time and memory."""
    if n > MAX_ARRAY:
        raise SystolicError(f"the register-level systolic model simulates arrays of at most "
                            f"{MAX_ARRAY} x {MAX_ARRAY} cells (every cell, every cycle); this "
                            f"machine's array is {n} x {n}: use array_size <= {MAX_ARRAY}")


def _plan(row, regs):
    """Per iteration: (UB base, vector offsets, accumulator rows, overwrite), by the rules of
    spec/isa.md 5.4 (a vector at offset o is UB row base + o, or with H the rows
    base + 2o and base + 2o + 1)."""
    flags = int(row[COL_FLAGS])
    reps = int(row[COL_REPEAT])
    out = []
    if flags & MMC_CONV:
        h, w = int(row[COL_HEIGHT]), int(row[COL_WIDTH])
        s, kw = int(regs[_REG["conv_stride"]]), int(regs[_REG["conv_kw"]])
        pitch = int(regs[_REG["conv_pitch"]]) or w
        for i in range(reps):
            dy, dx = i // kw, i % kw
            offs = [(y * s + dy) * pitch + (x * s + dx) for y in range(h) for x in range(w)]
            out.append((int(row[COL_UB]), offs,
                        [int(row[COL_ACC]) + p for p in range(h * w)],
                        bool(flags & MMC_OVERWRITE) and i == 0))
        return out
    length = int(row[COL_LEN])
    us, ac = int(regs[_REG["rep_ub_stride"]]), int(regs[_REG["rep_acc_stride"]])
    for i in range(reps):
        out.append((int(row[COL_UB]) + i * us, list(range(length)),
                    [int(row[COL_ACC]) + i * ac + v for v in range(length)],
                    bool(flags & MMC_OVERWRITE) and (i == 0 or ac != 0)))
    return out


def _wrap(v):
    return ((v + (1 << 31)) & ((1 << 32) - 1)) - (1 << 31)


def replay(machine, ub0: np.ndarray, acc0: np.ndarray, record_cells: bool = True) -> SystolicResult:
    """Run the MatrixMultiplies of a machine that has run (its timing model fixed every
    stream's start and every tile's shift start) through the register-level array, from UB
    contents `ub0` (the program must not write the UB: RW / MMC / CFG programs) and
    accumulators `acc0`.  Returns the accumulators the array computed, which global vector
    each cell held in each cycle, and the cycle each MMC's last sum was added."""
    n = machine.config.array_size
    check_size(n)
    prog = machine.prog
    tl = machine.tl
    ub = np.asarray(ub0, np.uint8)
    acc = np.asarray(acc0, np.int32).astype(np.int64)
    result = SystolicResult(acc=acc)

    # ---- the schedule: each pass of each vector entering cell (0, 0); tag = gv * 4 + pass
    regs = reset_registers().copy()
    entries = {}                        # cycle -> (tag, (N,) input values, switch bit)
    acc_row = []                        # per global vector: its accumulator row
    tag_shift, tag_plane, tag_signed_w, tag_overwrite = {}, {}, {}, {}
    for i in range(len(prog)):
        row = prog[i]
        op = int(row[COL_OP])
        if op == OP_CFG:
            regs[int(row[COL_REG])] = int(row[COL_VALUE])
            continue
        if op != OP_MMC or machine.times[i, core.TM_ISSUE] < 0:
            continue
        flags = int(row[COL_FLAGS])
        wide_in, wide_w = bool(flags & MMC_WIDE_IN), bool(flags & MMC_WIDE_W)
        u_in, u_w = bool(flags & MMC_UNSIGNED_IN), bool(flags & MMC_UNSIGNED_W)
        for st, (base, offs, accs, overwrite) in zip(streams(machine, i), _plan(row, regs)):
            g0 = len(acc_row)
            result.streams.append((i, st.iteration, st, g0))
            for v, (o, a) in enumerate(zip(offs, accs)):
                gv = g0 + v
                acc_row.append(a)
                for p in range(st.rate):
                    # passes: H splits the input into low (unsigned) and high bytes, D the
                    # weights into their low (unsigned) and high planes
                    p_in, p_w = ((p // 2, p % 2) if (wide_in and wide_w) else
                                 (p, 0) if wide_in else (0, p))
                    raw = ub[base + 2 * o + p_in] if wide_in else ub[base + o]
                    signed_in = not u_in and not (wide_in and p_in == 0)
                    vals = raw.view(np.int8).astype(np.int64) if signed_in else raw.astype(np.int64)
                    tag = gv * 4 + p
                    tag_shift[tag] = 8 * (p_in + p_w)
                    tag_plane[tag] = p_w
                    tag_signed_w[tag] = not u_w and not (wide_w and p_w == 0)
                    tag_overwrite[tag] = overwrite and p == 0
                    c = st.start + st.rate * v + p
                    if c in entries:
                        raise SystolicError(f"two passes enter the array in cycle {c}")
                    entries[c] = (tag, vals, bool(flags & MMC_SWITCH) and v == 0 and p == 0,
                                  wide_w)
    if not entries:
        result.acc = acc.astype(np.int32)
        return result
    # ---- weight shifts: (cycle, column) -> (raw weight byte, its row, plane) at the top
    top = {}
    for q in range(int(machine.st[core.S_NREQ])):
        ss = int(tl[core.T_SS, q])
        if ss < 0:
            continue
        tile = machine.weights[int(tl[core.T_TILE, q])]
        plane = int(tl[core.T_HI, q] != 0)
        for col in range(n):
            for t in range(n):          # last row first, column n from cycle ss + n on
                top[(ss + col + t, col)] = (int(tile[n - 1 - t, col]), n - 1 - t, plane)
    first = min(min(entries), min((c for c, _ in top), default=min(entries)))
    last = max(entries) + 2 * n + 2
    span = last - first
    # the left edge as dense per-cycle arrays: what enters cell (k, 0) in cycle c is what
    # entered row k's skew delay line in cycle c - k
    f_tag = np.full((span, n), -1, np.int64)
    f_val = np.zeros((span, n), np.int64)
    f_sw = np.zeros((span, n), bool)
    f_wide = np.zeros((span, n), bool)
    for c, (tag, vals, sw, wide) in entries.items():
        for k in range(n):
            if c + k - first < span:
                j = c + k - first
                f_tag[j, k], f_val[j, k], f_sw[j, k], f_wide[j, k] = tag, vals[k], sw, wide
    t_val = np.zeros((span, n), np.int64)
    t_row = np.full((span, n), -1, np.int64)
    t_plane = np.zeros((span, n), np.int64)
    for (c, col), (val, r, pl) in top.items():
        if c - first < span:
            t_val[c - first, col], t_row[c - first, col], t_plane[c - first, col] = val, r, pl
    mmc_of_gv = np.zeros(len(acc_row), np.int64)
    for mmc, _it, st_, g0 in result.streams:
        mmc_of_gv[g0:g0 + st_.vectors] = mmc
    kk = np.arange(n)[:, None]
    maxtag = 4 * len(acc_row)
    shift_arr = np.zeros(maxtag, np.int64)
    plane_arr = np.zeros(maxtag, np.int64)
    signed_arr = np.zeros(maxtag, bool)
    over_arr = np.zeros(maxtag, bool)
    for t, v in tag_shift.items():
        shift_arr[t], plane_arr[t] = v, tag_plane[t]
        signed_arr[t], over_arr[t] = tag_signed_w[t], tag_overwrite[t]
    acc_rows = np.asarray(acc_row, np.int64)

    # ---- registers (value, tag) of every cell
    x_val = np.zeros((n, n), np.int64)
    x_tag = np.full((n, n), -1, np.int64)
    x_sw = np.zeros((n, n), bool)                    # the switch bit travels with its input
    x_wide = np.zeros((n, n), bool)
    p_val = np.zeros((n, n), np.int64)
    p_tag = np.full((n, n), -1, np.int64)
    active = np.zeros((2, n, n), np.int64)           # raw weight bytes: low plane, high plane
    shadow = np.zeros((2, n, n), np.int64)
    loaded = np.zeros((2, n, n), bool)               # shadow loaded, not yet switched in
    tr_val = np.zeros((n, n), np.int64)              # weight transit registers (per column)
    tr_row = np.full((n, n), -1, np.int64)
    tr_plane = np.zeros((n, n), np.int64)
    link_val = np.zeros(n, np.int64)                 # row N-1 -> accumulators
    link_tag = np.full(n, -1, np.int64)
    for c in range(first, last):
        # -- accumulators: add what crossed the link in the previous cycle
        cols = np.flatnonzero(link_tag >= 0)
        if len(cols):
            t = link_tag[cols]
            rows = acc_rows[t >> 2]
            add = link_val[cols] << shift_arr[t]
            ov = over_arr[t]
            acc[rows, cols] = _wrap(np.where(ov, add, acc[rows, cols] + add))
            for mmc in set(mmc_of_gv[t >> 2].tolist()):
                result.accumulated[mmc] = c
        n_link_val, n_link_tag = p_val[n - 1].copy(), p_tag[n - 1].copy()
        # -- inputs move one column right; column 0 takes row k's skew line (entered at c-k)
        nx_val, nx_tag = np.empty_like(x_val), np.empty_like(x_tag)
        nx_sw, nx_wide = np.empty_like(x_sw), np.empty_like(x_wide)
        nx_val[:, 1:], nx_tag[:, 1:] = x_val[:, :-1], x_tag[:, :-1]
        nx_sw[:, 1:], nx_wide[:, 1:] = x_sw[:, :-1], x_wide[:, :-1]
        j = c - first
        nx_tag[:, 0], nx_val[:, 0], nx_sw[:, 0], nx_wide[:, 0] = f_tag[j], f_val[j], f_sw[j], f_wide[j]
        # -- a switching vector arriving in a cell makes its shadow active
        for pl in (0, 1):
            m = nx_sw & (nx_wide if pl else True)
            if m.any():
                if not loaded[pl][m].all():
                    raise SystolicError(f"cycle {c}: a switch found a shadow register "
                                        f"that holds no new weight")
                active[pl][m] = shadow[pl][m]
                loaded[pl][m] = False
        # -- MACs
        live = nx_tag >= 0
        tg = np.where(live, nx_tag, 0)
        w_raw = np.where(plane_arr[tg] == 1, active[1], active[0])
        w = np.where(signed_arr[tg] & (w_raw >= 128), w_raw - 256, w_raw)
        prod = np.where(live, nx_val * w, 0)
        here, above = nx_tag[1:], p_tag[:-1]
        bad = (here >= 0) & (above != here)
        if bad.any():
            k, col = (int(a[0]) for a in np.nonzero(bad))
            raise SystolicError(f"cycle {c}: cell ({k + 1}, {col}) holds input {int(here[k, col])} "
                                f"but receives partial sum {int(above[k, col])}")
        np_val, np_tag = np.empty_like(p_val), np.empty_like(p_tag)
        np_val[0], np_tag[0] = prod[0], nx_tag[0]
        np_val[1:] = np.where(here >= 0, p_val[:-1] + prod[1:], 0)
        np_tag[1:] = here
        # -- weights travel down the transit registers; each cell latches its own
        ntr_val, ntr_row, ntr_plane = np.empty_like(tr_val), np.empty_like(tr_row), np.empty_like(tr_plane)
        ntr_val[1:], ntr_row[1:], ntr_plane[1:] = tr_val[:-1], tr_row[:-1], tr_plane[:-1]
        ntr_val[0], ntr_row[0], ntr_plane[0] = t_val[j], t_row[j], t_plane[j]
        latch = ntr_row == kk
        if latch.any():
            for pl in (0, 1):
                m = latch & (ntr_plane == pl)
                if loaded[pl][m].any():
                    raise SystolicError(f"cycle {c}: a weight shift overwrote a shadow register "
                                        f"before the switch wavefront read it")
                shadow[pl][m] = ntr_val[m]
                loaded[pl][m] = True
        # -- end of the cycle: every register takes its new value
        x_val, x_tag, x_sw, x_wide = nx_val, nx_tag, nx_sw, nx_wide
        p_val, p_tag = np_val, np_tag
        tr_val, tr_row, tr_plane = ntr_val, ntr_row, ntr_plane
        link_val, link_tag = n_link_val, n_link_tag
        if record_cells and live.any():
            result.cells[c] = np.where(live, nx_tag >> 2, -1)
    result.acc = acc.astype(np.int32)
    return result


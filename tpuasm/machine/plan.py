"""The data path's plan: a program and its weight image turned, once per run_batches call,
into flat lists of the work that is known ahead, so that each batch does only arithmetic.

A compiled layer narrower than the array leaves most of each weight tile zero: the digits
CNN's tiles hold 8 x 16 non-zero weights of 256 x 256, and its codegen emits one 16-row
convolving MatrixMultiply per sample and tap (830 a batch).  Run one by one, each paid
~1.3 us of fixed costs (the tile's plan, views and their reference counts, full 256-column
accumulator rows) for a few thousand MACs.  The weight image cannot change during a data
path run and nothing about a MatrixMultiply's addresses depends on the data, so here,
before the first batch:

- every MatrixMultiply whose tiles all take the direct box loops (kernels.box_path:
  8-bit operands, a small bounding box) becomes segments, one per iteration -- its
  tile's box, its weights converted once (one copy per tile and signedness), overwrite or
  accumulate -- over a list of (UB row, accumulator row) vectors, its convolution's pixel
  addressing resolved; consecutive such MatrixMultiplies (only CFG, Read_Weights or
  instructions without a stage between them) run as one call over their segments;
- every accumulator row gets a bound (`top`) past which it is zero at every point of
  every run of this program with these weights: each MatrixMultiply iteration writes
  non-zero values only in its tiles' box columns (the weights elsewhere are zero), and
  nothing else writes the accumulators.  A planned overwrite therefore clears the row
  only up to that bound, not all N columns, and the rows zeroed between batches likewise;
- every Activate is told the least multiple of 16 from which the accumulator rows it
  reads are zero (kernels._zero_columns' `columns`), instead of finding it by reading them.

Everything else (DMA, Activate's arithmetic, VADD/VMUL, MatrixMultiplies on the int8
kernel or 16-bit ones) runs through kernels.execute_instruction as before, in program
order, so its semantics are the pipeline's by construction.
"""
from __future__ import annotations

import numpy as np

from .core import OP_STAGE, PORT_WEIGHTS
from .decoded import (COL_ACC, COL_FLAGS, COL_LEN, COL_OP, COL_REG, COL_REPEAT, COL_TILE,
                      COL_UB, COL_VALUE, MMC_CONV, MMC_OVERWRITE, MMC_SWITCH,
                      MMC_UNSIGNED_IN, MMC_UNSIGNED_W, MMC_WIDE_IN, MMC_WIDE_W, OP_ACT,
                      OP_CFG, OP_HLT, OP_MMC, REG_REP_ACC_STRIDE, REG_REP_UB_STRIDE)
from .jit import njit
from .kernels import (_OPT_INT8, BOX_DIRECT, _conv_geometry, _input_row, _iterations,
                      _signed8, _tile_box, box_path, execute_activate, execute_instruction)

# What a program row is to the plan
PLAN_GENERIC, PLAN_DIRECT, PLAN_ACT = 0, 1, 2
# Columns of a segment (one planned MatrixMultiply iteration): its vectors v0..v1-1, the
# box rows k0..k0+height-1 and columns j0..j0+width-1, its weights at wbuf[w:], overwrite
# and unsigned inputs (0/1)
SEG_V0, SEG_V1, SEG_K0, SEG_HEIGHT, SEG_J0, SEG_WIDTH, SEG_W, SEG_OVERWRITE, \
    SEG_UNSIGNED_IN, SEG_COLS = range(10)


@njit(cache=True)
def fetched_tiles(prog) -> int:
    """How many tiles the program's Read_Weights queue up to its Halt."""
    total = 0
    for pc in range(prog.shape[0]):
        op = prog[pc, COL_OP]
        if op == OP_HLT:
            break
        if OP_STAGE[op] == PORT_WEIGHTS:
            total += prog[pc, COL_REPEAT]
    return total


@njit(cache=True)
def _mmc_rows(row, regs, i):
    """(first accumulator row, vectors, first UB row) of MatrixMultiply iteration i."""
    if (row[COL_FLAGS] & MMC_CONV) != 0:
        height, width, pitch, kw, stride = _conv_geometry(row, regs)
        return row[COL_ACC], height * width, row[COL_UB]
    return (row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE], row[COL_LEN],
            row[COL_UB] + i * regs[REG_REP_UB_STRIDE])


@njit(cache=True)
def _box_of(weights, t, scratch, boxes):
    """Tile t's bounding box (k0, k1, j0, j1) as boxes[t], found once per run."""
    if boxes[t, 0] < 0:
        found = _tile_box(weights, t, scratch)
        for q in range(4):
            boxes[t, q] = found[q]
    return boxes[t]


@njit(cache=True)
def _walk(prog, regs, weights, scratch, acc_rows, fill, plan):
    """One replay of the program's CFGs and weight queue, MatrixMultiply by MatrixMultiply.
    fill False: each MMC's kind, the rows' `top`s, the weight slots and the sizes (the
    counts in plan's `sizes`); fill True: the segments and vectors written."""
    kind, seg_lo, seg_hi, segs, vec_ub, vec_acc, wslot, top, boxes, sizes = plan
    n = weights.shape[1]
    n_tiles = weights.shape[0]
    int8 = scratch.options[_OPT_INT8] != 0
    queue = np.full(max(fetched_tiles(prog), 1), -1, np.int64)
    queued = 0
    taken = 0
    active0, active1 = np.int64(-1), np.int64(-1)
    segments, vectors = 0, 0
    for pc in range(prog.shape[0]):
        row = prog[pc]
        op = row[COL_OP]
        if op == OP_HLT:
            break
        if op == OP_CFG:
            regs[row[COL_REG]] = row[COL_VALUE]
            continue
        if OP_STAGE[op] == PORT_WEIGHTS:
            for k in range(row[COL_REPEAT]):
                queue[queued + k] = row[COL_TILE] + k
            queued += row[COL_REPEAT]
            continue
        if op != OP_MMC:
            continue
        flags = row[COL_FLAGS]
        wide_w = (flags & MMC_WIDE_W) != 0
        switch = (flags & MMC_SWITCH) != 0
        conv = (flags & MMC_CONV) != 0
        direct = not fill and (flags & (MMC_WIDE_IN | MMC_WIDE_W)) == 0
        mode = 1 if (flags & MMC_UNSIGNED_W) != 0 else 0
        height, width, pitch, kw, stride = _conv_geometry(row, regs)
        if fill and kind[pc] == PLAN_DIRECT:
            seg_lo[pc] = segments
        for i in range(_iterations(row)):
            if switch:
                active0 = queue[taken]
                taken += 1
                active1 = -1
                if wide_w:
                    active1 = queue[taken]
                    taken += 1
            a0, count, u0 = _mmc_rows(row, regs, i)
            if not fill:
                # the columns this iteration can make non-zero: its tiles' boxes
                reach = n
                if 0 <= active0 < n_tiles and (not wide_w or 0 <= active1 < n_tiles):
                    box = _box_of(weights, active0, scratch, boxes)
                    reach = box[3]
                    if wide_w:
                        reach = max(reach, _box_of(weights, active1, scratch, boxes)[3])
                    if direct and box_path(box[1] - box[0], box[3] - box[2], n,
                                           int8) != BOX_DIRECT:
                        direct = False
                else:
                    direct = False
                for r in range(max(a0, 0), min(a0 + count, acc_rows)):
                    top[r] = max(top[r], reach)
                continue
            if kind[pc] != PLAN_DIRECT:
                continue
            box = boxes[active0]
            seg = segs[segments]
            seg[SEG_V0], seg[SEG_V1] = vectors, vectors + count
            seg[SEG_K0], seg[SEG_HEIGHT] = box[0], box[1] - box[0]
            seg[SEG_J0], seg[SEG_WIDTH] = box[2], box[3] - box[2]
            seg[SEG_W] = wslot[active0, mode]
            seg[SEG_OVERWRITE] = 1 if (flags & MMC_OVERWRITE) != 0 and (
                i == 0 or (not conv and regs[REG_REP_ACC_STRIDE] != 0)) else 0
            seg[SEG_UNSIGNED_IN] = 1 if (flags & MMC_UNSIGNED_IN) != 0 else 0
            dy, dx = (i // kw, i % kw) if conv else (0, 0)
            for j in range(count):
                vec_ub[vectors + j] = _input_row(j, u0, 1, width if conv else 0, pitch,
                                                 stride, dy, dx)
                vec_acc[vectors + j] = a0 + j
            segments += 1
            vectors += count
        if fill:
            if kind[pc] == PLAN_DIRECT:
                seg_hi[pc] = segments
            continue
        if direct:
            kind[pc] = PLAN_DIRECT
            reps = _iterations(row)
            sizes[0] += reps
            if switch:          # the tiles of its iterations: each gets a weight slot
                for q in range(taken - reps, taken):
                    _slot(queue[q], mode, wslot, boxes, sizes)
            else:
                _slot(active0, mode, wslot, boxes, sizes)
            for i in range(reps):
                sizes[1] += _mmc_rows(row, regs, i)[1]


@njit(cache=True)
def _slot(t, mode, wslot, boxes, sizes):
    """Tile t's weights in signedness `mode` get a place in the weight buffer (its box's
    height x width int32s) unless they have one."""
    if wslot[t, mode] < 0:
        wslot[t, mode] = sizes[2]
        sizes[2] += (boxes[t, 1] - boxes[t, 0]) * (boxes[t, 3] - boxes[t, 2])


@njit(cache=True)
def build(prog, regs, weights, scratch, acc_rows):
    """The plan of `prog` (registers from `regs`, not changed) over `weights` for a run in
    progress (dataonly._begin: the boxes are the run's).  A tuple: kind per row, each
    planned MatrixMultiply's segments seg_lo..seg_hi-1, where the run of MatrixMultiplies
    starting there ends (group), the segments, the vectors' UB and accumulator rows, the
    weight buffer, the rows' `top`s and each Activate's `columns` (-1 elsewhere)."""
    count = prog.shape[0]
    n = weights.shape[1]
    kind = np.zeros(count, np.int64)
    seg_lo = np.zeros(count, np.int64)
    seg_hi = np.zeros(count, np.int64)
    wslot = np.full((max(weights.shape[0], 1), 2), -1, np.int64)
    top = np.zeros(acc_rows, np.int64)
    boxes = np.full((max(weights.shape[0], 1), 4), -1, np.int64)
    sizes = np.zeros(3, np.int64)           # segments, vectors, weight buffer
    empty = np.zeros((0, SEG_COLS), np.int64)
    none = np.zeros(0, np.int64)
    _walk(prog, regs.copy(), weights, scratch, acc_rows, False,
          (kind, seg_lo, seg_hi, empty, none, none, wslot, top, boxes, sizes))
    segs = np.zeros((sizes[0], SEG_COLS), np.int64)
    vec_ub = np.zeros(sizes[1], np.int64)
    vec_acc = np.zeros(sizes[1], np.int64)
    _walk(prog, regs.copy(), weights, scratch, acc_rows, True,
          (kind, seg_lo, seg_hi, segs, vec_ub, vec_acc, wslot, top, boxes, sizes))
    wbuf = np.zeros(max(sizes[2], 1), np.int32)
    for t in range(wslot.shape[0]):
        for mode in range(2):
            if wslot[t, mode] >= 0:
                _convert(weights[t], boxes[t], mode == 1, wbuf, wslot[t, mode])
    group = np.zeros(count, np.int64)
    columns = np.full(count, -1, np.int64)
    _groups_and_columns(prog, regs.copy(), kind, seg_hi, group, columns, top, n)
    return kind, seg_lo, group, segs, vec_ub, vec_acc, wbuf, top, columns


@njit(cache=True)
def _convert(tile, box, unsigned_w, wbuf, at):
    """The box of `tile` as int32 weights, row-major (box width wide), at wbuf[at:]."""
    width = box[3] - box[2]
    for k in range(box[0], box[1]):
        base = at + (k - box[0]) * width
        for j in range(width):
            v = np.int32(tile[k, box[2] + j])
            wbuf[base + j] = v if unsigned_w else _signed8(v)


@njit(cache=True)
def _groups_and_columns(prog, regs, kind, seg_hi, group, columns, top, n):
    """group[pc] for a planned MatrixMultiply: the end of the segments of the planned
    MatrixMultiplies from it on with nothing between them that touches a memory (only
    CFG, Read_Weights, instructions without a stage).  columns[pc] for an Activate: the
    least multiple of 16 (at most N) past every `top` of the accumulator rows it reads."""
    end = -1
    for pc in range(prog.shape[0] - 1, -1, -1):
        op = prog[pc, COL_OP]
        if kind[pc] == PLAN_DIRECT:
            if end < 0:
                end = seg_hi[pc]
            group[pc] = end
        elif op != OP_CFG and OP_STAGE[op] != PORT_WEIGHTS and OP_STAGE[op] >= 0:
            end = -1
    acc_rows = top.shape[0]
    for pc in range(prog.shape[0]):
        row = prog[pc]
        op = row[COL_OP]
        if op == OP_HLT:
            break
        if op == OP_CFG:
            regs[row[COL_REG]] = row[COL_VALUE]
        elif op == OP_ACT:
            reach = 0
            for i in range(_iterations(row)):
                a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
                for r in range(max(a0, 0), min(a0 + row[COL_LEN], acc_rows)):
                    reach = max(reach, top[r])
            columns[pc] = min((reach + 15) // 16 * 16, n)
            kind[pc] = PLAN_ACT


@njit(cache=True)
def run_segments(ub, acc, segs, vec_ub, vec_acc, wbuf, top, s0, s1):
    """Segments s0..s1-1 in order: each vector's box columns summed in int32 (exact: at
    most 256 products of 8-bit values), written into its accumulator row (the columns
    below the row's `top` outside the box zeroed) or added to it, wrapping.  The memories
    are indexed flat with unsigned offsets: numba then drops its negative-index wrap, and
    LLVM sees contiguous runs it vectorizes (a signed index made it gather: 6x slower)."""
    n = np.uint64(acc.shape[1])
    ub_flat = ub.reshape(ub.size)
    acc_flat = acc.reshape(acc.size)
    sums = np.zeros(acc.shape[1], np.int32)     # local: LLVM keeps it apart from the rest
    for s in range(s0, s1):
        seg = segs[s]
        k0, height = np.uint64(seg[SEG_K0]), seg[SEG_HEIGHT]
        j0, width = np.uint64(seg[SEG_J0]), seg[SEG_WIDTH]
        w0, step = np.uint64(seg[SEG_W]), np.uint64(width)
        overwrite = seg[SEG_OVERWRITE] != 0
        unsigned_in = seg[SEG_UNSIGNED_IN] != 0
        for v in range(seg[SEG_V0], seg[SEG_V1]):
            x0 = np.uint64(vec_ub[v]) * n + k0
            for j in range(width):
                sums[j] = 0
            base = w0
            for k in range(height):
                xv = np.int32(ub_flat[x0 + np.uint64(k)])
                if not unsigned_in:
                    xv = _signed8(xv)
                for j in range(width):
                    sums[j] += xv * wbuf[base + np.uint64(j)]
                base += step
            a = vec_acc[v]
            row = np.uint64(a) * n
            if overwrite:
                stop = top[a]
                for j in range(min(seg[SEG_J0], stop)):
                    acc_flat[row + np.uint64(j)] = 0
                for j in range(width):
                    acc_flat[row + j0 + np.uint64(j)] = sums[j]
                for j in range(seg[SEG_J0] + width, stop):
                    acc_flat[row + np.uint64(j)] = 0
            else:
                for j in range(width):
                    acc_flat[row + j0 + np.uint64(j)] += sums[j]


@njit(cache=True)
def run_program(prog, regs, tiles, ub, acc, host, weights, active, scratch, profile, plan):
    """dataonly._run_program with the plan: planned MatrixMultiplies run as their segments
    (a run of them at its first), Activates with their known columns, the rest through
    execute_instruction.  Returns the Halt's index."""
    kind, seg_lo, group, segs, vec_ub, vec_acc, wbuf, top, columns = plan
    queued = 0
    taken = 0
    done = 0                # segments run so far
    for pc in range(prog.shape[0]):
        row = prog[pc]
        op = row[COL_OP]
        if op == OP_HLT:
            return pc
        if op == OP_CFG:
            regs[row[COL_REG]] = row[COL_VALUE]
        elif OP_STAGE[op] == PORT_WEIGHTS:
            for k in range(row[COL_REPEAT]):
                tiles[queued + k] = row[COL_TILE] + k
            queued += row[COL_REPEAT]
        elif OP_STAGE[op] >= 0:
            count = 0
            if op == OP_MMC and (row[COL_FLAGS] & MMC_SWITCH) != 0:
                count = row[COL_REPEAT] * (2 if (row[COL_FLAGS] & MMC_WIDE_W) != 0 else 1)
            if kind[pc] == PLAN_DIRECT:
                if seg_lo[pc] >= done:
                    run_segments(ub, acc, segs, vec_ub, vec_acc, wbuf, top, seg_lo[pc],
                                 group[pc])
                    done = group[pc]
                if count > 0:           # the tile it leaves active (8-bit weights only)
                    active[0], active[1] = tiles[taken + count - 1], -1
            elif kind[pc] == PLAN_ACT:
                execute_activate(row, regs, acc, ub, scratch, profile, columns[pc])
            else:
                execute_instruction(row, regs, ub, acc, host, weights,
                                    tiles[taken:taken + count], active, scratch, profile)
            taken += count
    return prog.shape[0]

"""The data path's plan: a program and its weight image turned, once per run_batches call,
into flat lists of the work that is known ahead, so that each batch does only arithmetic.

A compiled layer narrower than the array leaves most of each weight tile zero: the digits
CNN's tiles hold 8 x 16 non-zero weights of 256 x 256, and its codegen emits one 16-row
convolving MatrixMultiply per sample and tap (830 a batch).  Run one by one, each paid
~1.3 us of fixed costs (the tile's plan and packing, views and their reference counts,
full 256-column accumulator rows) for a few thousand MACs.  The weight image cannot change
during a data-path run and nothing about a MatrixMultiply's addresses depends on the data,
so here, before the first batch:

- every MatrixMultiply with 8-bit operands whose tiles all have a small bounding box
  (kernels.box_path: the direct loops' or the corner tile's) becomes segments, one per
  iteration, over a list of vectors (UB row, accumulator row, overwrite or accumulate):
  its convolution's pixel addressing resolved, its tile's box converted once per run
  (one copy per tile and signedness).  With the int8 kernel a box whose corner tile (its
  side rounded up to 16) is at most N / 2 runs on that corner tile (PATH_KERNEL: the
  vectors' box rows gathered, one kernel call for a run of segments on the same tile --
  the 64 MatrixMultiplies of one convolution tap, 1,024 vectors), else as numba's integer
  loops (PATH_LOOPS);
- consecutive planned MatrixMultiplies (only CFG, Read_Weights or instructions without a
  stage between them) run as one call over their segments: their products depend on the
  UB and the weights alone, which none of them changes, and their stores keep their order;
- every accumulator row gets a bound (`top`) past which it is zero at every point of
  every run of this program with these weights: each MatrixMultiply iteration writes
  non-zero values only in its tiles' box columns (the weights elsewhere are zero), and
  nothing else writes the accumulators.  A planned overwrite clears the row only up to
  that bound, not all N columns, and so do the zeroings between batches;
- every Activate is told the least multiple of 16 from which the accumulator rows it
  reads are zero (kernels._zero_columns' `columns`), instead of finding it by reading them.

Everything else (DMA, Activate's arithmetic, VADD/VMUL, MatrixMultiplies on full tiles or
with 16-bit operands) runs through kernels.execute_instruction as before, in program order,
so its semantics are the pipeline's by construction.
"""
from __future__ import annotations

import numpy as np

from . import native as _native
from .core import OP_STAGE, PORT_WEIGHTS
from .decoded import (COL_ACC, COL_FLAGS, COL_LEN, COL_OP, COL_REG, COL_REPEAT, COL_TILE,
                      COL_UB, COL_VALUE, MMC_CONV, MMC_OVERWRITE, MMC_SWITCH,
                      MMC_UNSIGNED_IN, MMC_UNSIGNED_W, MMC_WIDE_IN, MMC_WIDE_W, OP_ACT,
                      OP_CFG, OP_HLT, OP_MMC, OP_RHM, OP_RHMA, OP_WHM, OP_WHMA,
                      REG_REP_ACC_STRIDE, REG_REP_UB_STRIDE)
from .jit import njit
from .kernels import (_OPT_INT8, _OPT_INT8_THREADS, BOX_DIRECT, _conv_geometry, _execute_dma,
                      _input_row, _iterations, _signed8, _tile_box, box_path,
                      execute_activate, execute_instruction)

# What a program row is to the plan
PLAN_GENERIC, PLAN_MMC, PLAN_ACT = 0, 1, 2
# How a segment runs
PATH_LOOPS, PATH_KERNEL = 0, 1
# Columns of a segment (one planned MatrixMultiply iteration): its vectors v0..v1-1, its
# box's rows k0..k0+height-1 and columns j0..j0+width-1, its weights (PATH_LOOPS: their
# offset in the loops' buffer; PATH_KERNEL: the corner tile's slot), its path, its
# inputs unsigned (0/1)
SEG_V0, SEG_V1, SEG_K0, SEG_HEIGHT, SEG_J0, SEG_WIDTH, SEG_WEIGHTS, SEG_PATH, \
    SEG_UNSIGNED_IN, SEG_COLS = range(10)
# Columns of a corner-tile slot: packed tile's offset, bias offset, side, signedness (2 x
# unsigned W + unsigned inputs)
SLOT_PACKED, SLOT_BIAS, SLOT_SIDE, SLOT_MODE = range(4)
KERNEL_ROWS = 4096          # vectors per int8 kernel call (the gather buffers' rows)
# The plan tuple (build's result), in order
(W_KIND, W_SEG_LO, W_GROUP, W_SEGS, W_VEC_UB, W_VEC_ACC, W_VEC_OVER, W_LOOPS, W_SLOTS,
 W_PACKED, W_BIAS, W_TOP, W_COLUMNS, W_INPUTS, W_PRODUCTS, W_ROWS) = range(16)


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
def corner_side(box) -> int:
    """The side of the square tile (a multiple of 16) that holds the box in its corner."""
    return (max(box[1] - box[0], box[3] - box[2]) + 15) // 16 * 16


@njit(cache=True)
def _path_of(box, n, int8):
    """A planned MatrixMultiply iteration's path on this box, or -1 (not planned: the full
    tile's kernels)."""
    height, width = box[1] - box[0], box[3] - box[2]
    if int8 and height * width > 0 and 2 * corner_side(box) <= n:
        return PATH_KERNEL
    if box_path(height, width, n, int8) == BOX_DIRECT:
        return PATH_LOOPS
    return -1


@njit(cache=True)
def _walk(prog, regs, weights, scratch, fill, plan):
    """One replay of the program's CFGs and weight queue, MatrixMultiply by MatrixMultiply.
    fill False: each MMC's kind, the rows' `top`s, the weight slots and the sizes (the
    counts in plan's `sizes`); fill True: the segments and vectors written."""
    kind, seg_lo, seg_hi, segs, vec_ub, vec_acc, vec_over, lslot, kslot, top, boxes, \
        sizes = plan
    n = weights.shape[1]
    n_tiles = weights.shape[0]
    acc_rows = top.shape[0]
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
        planned = not fill and (flags & (MMC_WIDE_IN | MMC_WIDE_W)) == 0
        mode_w = 1 if (flags & MMC_UNSIGNED_W) != 0 else 0
        mode = 2 * mode_w + (1 if (flags & MMC_UNSIGNED_IN) != 0 else 0)
        height, width, pitch, kw, stride = _conv_geometry(row, regs)
        if fill and kind[pc] == PLAN_MMC:
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
                    if planned and _path_of(box, n, int8) < 0:
                        planned = False
                else:
                    planned = False
                for r in range(max(a0, 0), min(a0 + count, acc_rows)):
                    top[r] = max(top[r], reach)
                continue
            if kind[pc] != PLAN_MMC:
                continue
            box = boxes[active0]
            path = _path_of(box, n, int8)
            seg = segs[segments]
            seg[SEG_V0], seg[SEG_V1] = vectors, vectors + count
            seg[SEG_K0], seg[SEG_HEIGHT] = box[0], box[1] - box[0]
            seg[SEG_J0], seg[SEG_WIDTH] = box[2], box[3] - box[2]
            seg[SEG_PATH] = path
            seg[SEG_WEIGHTS] = kslot[active0, mode] if path == PATH_KERNEL \
                else lslot[active0, mode_w]
            seg[SEG_UNSIGNED_IN] = mode & 1
            overwrite = (flags & MMC_OVERWRITE) != 0 and (
                i == 0 or (not conv and regs[REG_REP_ACC_STRIDE] != 0))
            dy, dx = (i // kw, i % kw) if conv else (0, 0)
            for j in range(count):
                vec_ub[vectors + j] = _input_row(j, u0, 1, width if conv else 0, pitch,
                                                 stride, dy, dx)
                vec_acc[vectors + j] = a0 + j
                vec_over[vectors + j] = overwrite
            segments += 1
            vectors += count
        if fill:
            if kind[pc] == PLAN_MMC:
                seg_hi[pc] = segments
            continue
        if planned:
            kind[pc] = PLAN_MMC
            reps = _iterations(row)
            sizes[0] += reps
            for q in range(reps):           # the tile of each iteration gets its weights
                t = queue[taken - reps + q] if switch else active0
                if _path_of(boxes[t], n, int8) == PATH_KERNEL:
                    if kslot[t, mode] < 0:
                        kslot[t, mode] = sizes[3]
                        sizes[3] += 1
                elif lslot[t, mode_w] < 0:
                    lslot[t, mode_w] = sizes[2]
                    sizes[2] += (boxes[t, 1] - boxes[t, 0]) * (boxes[t, 3] - boxes[t, 2])
            for i in range(reps):
                sizes[1] += _mmc_rows(row, regs, i)[1]


@njit(cache=True)
def build(prog, regs, weights, scratch, acc_rows):
    """The plan of `prog` (registers from `regs`, not changed) over `weights` for a run in
    progress (dataonly._begin: the boxes are the run's).  A tuple: kind per row, each
    planned MatrixMultiply's segments from seg_lo, where the run of planned ones starting
    there ends (group), the segments, the vectors' UB and accumulator rows and overwrite
    flags, the loops' weights, the corner tiles (slots, packed tiles, biases), the rows'
    `top`s and each Activate's `columns` (-1 elsewhere)."""
    count = prog.shape[0]
    n = weights.shape[1]
    tiles = max(weights.shape[0], 1)
    kind = np.zeros(count, np.int64)
    seg_lo = np.zeros(count, np.int64)
    seg_hi = np.zeros(count, np.int64)
    lslot = np.full((tiles, 2), -1, np.int64)      # (tile, unsigned W)
    kslot = np.full((tiles, 4), -1, np.int64)      # (tile, 2 * unsigned W + unsigned in)
    top = np.zeros(acc_rows, np.int64)
    boxes = np.full((tiles, 4), -1, np.int64)
    sizes = np.zeros(4, np.int64)       # segments, vectors, loops' weights, corner tiles
    empty = np.zeros((0, SEG_COLS), np.int64)
    none = np.zeros(0, np.int64)
    _walk(prog, regs.copy(), weights, scratch, False,
          (kind, seg_lo, seg_hi, empty, none, none, none, lslot, kslot, top, boxes, sizes))
    segs = np.zeros((sizes[0], SEG_COLS), np.int64)
    vec_ub = np.zeros(sizes[1], np.int64)
    vec_acc = np.zeros(sizes[1], np.int64)
    vec_over = np.zeros(sizes[1], np.int64)
    _walk(prog, regs.copy(), weights, scratch, True,
          (kind, seg_lo, seg_hi, segs, vec_ub, vec_acc, vec_over, lslot, kslot, top, boxes,
           sizes))
    wbuf = np.zeros(max(sizes[2], 1), np.int32)
    slots = np.zeros((max(sizes[3], 1), 4), np.int64)
    packed_size, bias_size = 0, 0
    for t in range(tiles):
        for mode in range(4):
            if kslot[t, mode] >= 0:
                side = corner_side(boxes[t])
                slot = slots[kslot[t, mode]]
                slot[SLOT_PACKED], slot[SLOT_BIAS] = packed_size, bias_size
                slot[SLOT_SIDE], slot[SLOT_MODE] = side, mode
                packed_size += 2 * side * side
                bias_size += side
    packed = np.zeros(max(packed_size, 1), np.int8)
    bias = np.zeros(max(bias_size, 1), np.int32)
    for t in range(tiles):
        for mode in range(2):
            if lslot[t, mode] >= 0:
                _convert(weights[t], boxes[t], mode == 1, wbuf, lslot[t, mode])
        for mode in range(4):
            if kslot[t, mode] >= 0:
                _pack_corner(weights[t], boxes[t], slots[kslot[t, mode]], packed, bias,
                             scratch.options[_OPT_INT8])
    group = np.zeros(count, np.int64)
    columns = np.full(count, -1, np.int64)
    _groups_and_columns(prog, regs.copy(), kind, seg_hi, group, columns, top, n)
    # staging for a part of a segment (or of a run on one corner tile): its gathered box
    # rows and its products, as wide as the widest, as many rows as the longest needs
    wide, longest = 1, 1
    for s in range(segs.shape[0]):
        seg = segs[s]
        wide = max(wide, slots[seg[SEG_WEIGHTS], SLOT_SIDE] if seg[SEG_PATH] == PATH_KERNEL
                   else seg[SEG_WIDTH])
        longest = max(longest, seg[SEG_V1] - seg[SEG_V0])
    staged = min(KERNEL_ROWS, max(longest, 64)) * wide
    inputs = np.zeros(staged, np.uint8)
    products = np.zeros(staged, np.int32)
    rows = np.arange(staged // wide)
    return (kind, seg_lo, group, segs, vec_ub, vec_acc, vec_over, wbuf, slots, packed, bias,
            top, columns, inputs, products, rows)


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
def _pack_corner(tile, box, slot, packed, bias, level):
    """The box of `tile` in the corner of a square tile of the slot's side, packed for the
    int8 kernel with the slot's signedness."""
    side, mode = slot[SLOT_SIDE], slot[SLOT_MODE]
    corner = np.zeros((side, side), np.uint8)
    for k in range(box[0], box[1]):
        for j in range(box[2], box[3]):
            corner[k - box[0], j - box[2]] = tile[k, j]
    p0, b0 = slot[SLOT_PACKED], slot[SLOT_BIAS]
    _native.pack_tile(corner, (mode & 2) == 0, (mode & 1) == 0, level,
                      packed[p0:p0 + 2 * side * side], bias[b0:b0 + side])


@njit(cache=True)
def _groups_and_columns(prog, regs, kind, seg_hi, group, columns, top, n):
    """group[pc] for a planned MatrixMultiply: the end of the segments of the planned
    MatrixMultiplies from it on with nothing between them that touches a memory (only
    CFG, Read_Weights, instructions without a stage).  columns[pc] for an Activate: the
    least multiple of 16 (at most N) past every `top` of the accumulator rows it reads."""
    end = -1
    for pc in range(prog.shape[0] - 1, -1, -1):
        op = prog[pc, COL_OP]
        if kind[pc] == PLAN_MMC:
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


# ------------------------------------------------------------------ running the segments
# The memories are indexed flat with unsigned offsets: numba then drops its negative-index
# wrap, and LLVM sees contiguous runs it vectorizes (a signed index made it gather: 6x
# slower).  Each function is a leaf, so numba prunes its arguments' reference counts.


@njit(cache=True)
def _loops(ub, seg, vec_ub, v0, m, wbuf, products):
    """Vectors v0..v0+m-1 of a PATH_LOOPS segment: their box sums into products[r] (int32,
    exact: at most N products of 8-bit values), by numba's loops over the box."""
    n = np.uint64(ub.shape[1])
    ub_flat = ub.reshape(ub.size)
    k0, height, width = np.uint64(seg[SEG_K0]), seg[SEG_HEIGHT], seg[SEG_WIDTH]
    step = np.uint64(width)
    unsigned_in = seg[SEG_UNSIGNED_IN] != 0
    sums = np.zeros(ub.shape[1], np.int32)      # local: LLVM keeps it apart from the rest
    for r in range(m):
        x0 = np.uint64(vec_ub[v0 + r]) * n + k0
        for j in range(width):
            sums[j] = 0
        base = np.uint64(seg[SEG_WEIGHTS])
        for k in range(height):
            xv = np.int32(ub_flat[x0 + np.uint64(k)])
            if not unsigned_in:
                xv = _signed8(xv)
            for j in range(width):
                sums[j] += xv * wbuf[base + np.uint64(j)]
            base += step
        for j in range(width):
            products[r, np.uint64(j)] = sums[j]


@njit(cache=True)
def _gather(ub, vec_ub, v0, m, k0, height, inputs):
    """inputs[r] = the box rows k0..k0+height-1 of vector v0 + r's UB row, zeros after them
    up to the corner tile's side (inputs' width)."""
    n = np.uint64(ub.shape[1])
    ub_flat = ub.reshape(ub.size)
    side = inputs.shape[1]
    for r in range(m):
        x0 = np.uint64(vec_ub[v0 + r]) * n + np.uint64(k0)
        for k in range(height):
            inputs[r, np.uint64(k)] = ub_flat[x0 + np.uint64(k)]
        for k in range(height, side):
            inputs[r, np.uint64(k)] = 0


@njit(cache=True)
def _store(acc, vec_acc, vec_over, v0, m, j0, width, top, products):
    """Vectors v0..v0+m-1's products (rows of `products`, box columns 0..width-1) into
    their accumulator rows at column j0: written (the row's other columns below its `top`
    zeroed) or added, wrapping."""
    n = np.uint64(acc.shape[1])
    acc_flat = acc.reshape(acc.size)
    for r in range(m):
        a = vec_acc[v0 + r]
        row = np.uint64(a) * n
        if vec_over[v0 + r] != 0:
            stop = top[a]
            for j in range(min(j0, stop)):
                acc_flat[row + np.uint64(j)] = 0
            for j in range(width):
                acc_flat[row + np.uint64(j0 + j)] = products[r, np.uint64(j)]
            for j in range(j0 + width, stop):
                acc_flat[row + np.uint64(j)] = 0
        else:
            for j in range(width):
                acc_flat[row + np.uint64(j0 + j)] += products[r, np.uint64(j)]


@njit(cache=True)
def run_segments(ub, acc, work, s0, s1, level, threads):
    """Segments s0..s1-1 of the plan `work` (build) in order, a part of up to the staging
    rows at a time: its products (PATH_LOOPS: numba's loops over the box; PATH_KERNEL: the
    int8 kernel on the corner tile, a run of segments on the same slot in one call), then
    stored."""
    segs, vec_ub, vec_acc, vec_over = work[W_SEGS], work[W_VEC_UB], work[W_VEC_ACC], \
        work[W_VEC_OVER]
    wbuf, slots, packed, bias = work[W_LOOPS], work[W_SLOTS], work[W_PACKED], work[W_BIAS]
    top, inputs, products, rows = work[W_TOP], work[W_INPUTS], work[W_PRODUCTS], work[W_ROWS]
    s = s0
    while s < s1:
        seg = segs[s]
        k0, height, j0, width = seg[SEG_K0], seg[SEG_HEIGHT], seg[SEG_J0], seg[SEG_WIDTH]
        last = s + 1
        side = max(width, 1)
        tile, tile_bias = packed[:0], bias[:0]
        signed_w, signed_in = True, True
        if seg[SEG_PATH] == PATH_KERNEL:      # and the next segments on the same corner tile
            while last < s1 and segs[last, SEG_PATH] == PATH_KERNEL \
                    and segs[last, SEG_WEIGHTS] == seg[SEG_WEIGHTS]:
                last += 1
            slot = slots[seg[SEG_WEIGHTS]]
            side = slot[SLOT_SIDE]
            p0, b0 = slot[SLOT_PACKED], slot[SLOT_BIAS]
            tile, tile_bias = packed[p0:p0 + 2 * side * side], bias[b0:b0 + side]
            signed_w, signed_in = (slot[SLOT_MODE] & 2) == 0, (slot[SLOT_MODE] & 1) == 0
        chunk = min(inputs.shape[0] // side, rows.shape[0])
        v, stop = seg[SEG_V0], segs[last - 1, SEG_V1]
        while v < stop:
            m = min(stop - v, chunk)
            c = products[:m * side].reshape((m, side))
            if seg[SEG_PATH] == PATH_LOOPS:
                _loops(ub, seg, vec_ub, v, m, wbuf, c)
            else:
                x = inputs[:m * side].reshape((m, side))
                _gather(ub, vec_ub, v, m, k0, height, x)
                _native.mmc_rows(x, rows, m, tile, tile_bias, signed_in, signed_w, c, 0,
                                 True, 0, level, threads)
            _store(acc, vec_acc, vec_over, v, m, j0, width, top, c)
            v += m
        s = last


@njit(cache=True)
def run_program(prog, regs, tiles, ub, acc, host, weights, active, scratch, profile, work):
    """dataonly's program loop with the plan `work` (build): planned MatrixMultiplies run as
    their segments (a run of them at its first), Activates with their known columns, the
    rest through execute_instruction.  Returns the Halt's index."""
    kind, seg_lo, group, columns = work[W_KIND], work[W_SEG_LO], work[W_GROUP], \
        work[W_COLUMNS]
    options, row_buf = scratch.options, scratch.row_buf
    level, threads = options[_OPT_INT8], options[_OPT_INT8_THREADS]
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
            if kind[pc] == PLAN_MMC:
                if seg_lo[pc] >= done:
                    run_segments(ub, acc, work, seg_lo[pc], group[pc], level, threads)
                    done = group[pc]
                if count > 0:           # the tile it leaves active (8-bit weights only)
                    active[0], active[1] = tiles[taken + count - 1], -1
            elif kind[pc] == PLAN_ACT:
                execute_activate(row, regs, acc, ub, options, row_buf, profile, columns[pc])
            elif op == OP_RHM or op == OP_RHMA or op == OP_WHM or op == OP_WHMA:
                _execute_dma(row, regs, ub, host)     # (execute_instruction's, without
                #                                        the scratch's reference counts)
            else:
                execute_instruction(row, regs, ub, acc, host, weights,
                                    tiles[taken:taken + count], active, scratch, profile)
            taken += count
    return prog.shape[0]

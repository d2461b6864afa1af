"""Batches as lanes: the data path over several batches at once, each instruction once.

TPU v1's program does not depend on its data, so running it on L batches one after another
(dataonly.run_batches) repeats every instruction's fixed costs L times: decoding, the weight
tile's plan and packing, and a MatrixMultiply's call into the int8 kernel for one batch's
rows -- a few hundred rows of a Table 1 MLP, too few for the kernel's second thread, or 16
rows of the digits CNN's convolution, where the call costs more than its products.  Here
each lane (batch) has its own Unified Buffer, accumulators and host image, stacked
batch-major -- ub (L, UB rows, N), acc (L, ACC rows, N), hosts (L, host rows, N) -- and:

- a MatrixMultiply runs once for all lanes: its tile planned and packed once, its input
  vectors listed lane after lane (lane b's UB row u is row b * UB rows + u of the stacked
  UB, so a 16-bit input's high byte row stays the next row) and multiplied in calls of up
  to the scratch's staging rows, the products then stored into each lane's accumulators
  (overwritten or added, wrapping), or summed over a padded tile's box in place;
- every other instruction (DMA, Activate, VADD/VMUL) runs lane by lane through the same
  kernel as always (kernels.execute_instruction on the lane's own memories), so its
  semantics are the pipeline's by construction;
- CFG, Read_Weights and the weight queue are shared: they depend on the program alone.

Each lane starts from the state `load` leaves, as in dataonly.run_batches: the rows the
program may write are zeroed in every lane first, and rows it never writes stay zero.  Only
the int8 kernel's MatrixMultiply is laned (scratch int8 level != 0); without the kernel
(an array size not a multiple of 16, no C compiler) MatrixMultiply too runs lane by lane.
"""
from __future__ import annotations

import numpy as np

from . import native as _native
from .core import OP_STAGE, PORT_WEIGHTS
from .dataonly import _begin, _dirty_spans, _end, _fetched_tiles, _zero
from .decoded import (COL_ACC, COL_FLAGS, COL_HEIGHT, COL_LEN, COL_OP, COL_REG, COL_REPEAT,
                      COL_TILE, COL_UB, COL_VALUE, COL_WIDTH, MMC_CONV, MMC_OVERWRITE, MMC_SWITCH,
                      MMC_UNSIGNED_IN, MMC_UNSIGNED_W, MMC_WIDE_IN, MMC_WIDE_W, OP_CFG,
                      OP_HLT, OP_MMC, REG_REP_ACC_STRIDE, REG_REP_UB_STRIDE, reset_registers)
from .jit import njit
from .kernels import (_active_packed, BOX_COMPACT, BOX_DIRECT, BOX_FULL, box_input, _box_plan,
                      box_result, _byte_part, compact_products, _compact_side, _conv_geometry,
                      _copy_words, execute_instruction, _input_row, _iterations, live_rows,
                      MEM_ACC, MEM_UB, _MMC_SHARED_MACS, _one_pass16, _OPT_INT8,
                      _OPT_INT8_THREADS, _OPT_TRUSTED, _signed8, switch_tiles)


@njit(cache=True)
def run_lanes(prog, regs, tiles, ub, acc, hosts, weights, active, scratch, profile):
    """The program once over the lanes hosts[b] (each batch's outputs written into its own
    image), every lane from the loaded state (see the module docstring).  ub (L, U, N)
    uint8 and acc (L, A, N) int32 must hold zeros outside the program's write set (fresh,
    or left by runs of this program).  Returns the Halt's index."""
    lanes = hosts.shape[0]
    n = ub.shape[2]
    ub_spans = _dirty_spans(prog, regs.copy(), MEM_UB, ub.shape[1], profile, n)
    acc_spans = _dirty_spans(prog, regs.copy(), MEM_ACC, acc.shape[1], profile, n)
    for b in range(lanes):
        for k in range(ub_spans.shape[0]):
            _zero(ub[b][ub_spans[k, 0]:ub_spans[k, 1]])
        for k in range(acc_spans.shape[0]):
            _zero(acc[b][acc_spans[k, 0]:acc_spans[k, 1]])
    tiles[:] = -1
    active[:] = -1
    _begin(scratch)                     # the weights cannot change during the run
    queued = 0                          # tiles fetched by Read_Weights so far
    taken = 0                           # tiles switched into the array so far
    halt = prog.shape[0]
    for pc in range(prog.shape[0]):
        row = prog[pc]
        op = row[COL_OP]
        if op == OP_HLT:
            halt = pc
            break
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
            if op == OP_MMC and scratch.options[_OPT_INT8] != 0:
                _lanes_mmc(row, regs, ub, acc, weights, tiles[taken:taken + count], active,
                           scratch)
            elif op == OP_MMC:          # the float path: lane by lane, the same switches
                first, second = active[0], active[1]
                for b in range(lanes):
                    active[0], active[1] = first, second
                    execute_instruction(row, regs, ub[b], acc[b], hosts[b], weights,
                                        tiles[taken:taken + count], active, scratch, profile)
            else:
                for b in range(lanes):
                    execute_instruction(row, regs, ub[b], acc[b], hosts[b], weights,
                                        tiles[taken:taken], active, scratch, profile)
            taken += count
    _end(scratch)
    return halt


@njit(cache=True)
def _lanes_mmc(row, regs, ub, acc, weights, tiles, active, scratch):
    """A MatrixMultiply on every lane: kernels._execute_mmc's iterations, tile switches and
    padded-tile plans (int8 kernel only), each iteration's vectors of all lanes together."""
    lanes, ub_rows, n = ub.shape[0], ub.shape[1], ub.shape[2]
    acc_rows = acc.shape[1]
    ub2 = ub.reshape((lanes * ub_rows, n))
    acc2 = acc.reshape((lanes * acc_rows, n))
    flags = row[COL_FLAGS]
    if row[COL_LEN] * lanes * n * n >= _MMC_SHARED_MACS:
        _native.pool_prepare(scratch.options[_OPT_INT8_THREADS])
    conv = (flags & MMC_CONV) != 0
    wide_in = (flags & MMC_WIDE_IN) != 0
    per = 2 if wide_in else 1
    rep_ub, rep_acc = regs[REG_REP_UB_STRIDE], regs[REG_REP_ACC_STRIDE]
    height, width, pitch, kw, stride = _conv_geometry(row, regs)
    switch = (flags & MMC_SWITCH) != 0
    rows = scratch.rows8
    # vectors per call: the staging rows (c32 as int32 products, x32 as compact inputs)
    chunk = min(rows.shape[0], scratch.c32.shape[0])
    used = 0
    path = BOX_FULL
    box = np.zeros(4, np.int64)
    for i in range(_iterations(row)):
        if switch:
            used = switch_tiles(active, tiles, used, (flags & MMC_WIDE_W) != 0)
        if switch or i == 0:        # without S the tile cannot change inside the instruction
            path = _box_plan(weights, active, flags, scratch, box, True)
            if path == BOX_FULL:
                _active_packed(weights, active, flags, scratch)
        overwrite = (flags & MMC_OVERWRITE) != 0 and (i == 0 or (not conv and rep_acc != 0))
        if conv:
            ub_base, acc_base, count, cw = row[COL_UB], row[COL_ACC], height * width, width
            dy, dx = i // kw, i % kw
        else:
            ub_base, acc_base, count, cw = row[COL_UB] + i * rep_ub, row[COL_ACC] + i * rep_acc, \
                row[COL_LEN], 0
            dy, dx = 0, 0
        total = count * lanes
        for first in range(0, total, chunk):
            m = min(chunk, total - first)
            for r in range(m):              # vector q = lane b's vector j
                q = first + r
                b = q // count
                rows[r] = b * ub_rows + _input_row(q - b * count, ub_base, per, cw, pitch,
                                                   stride, dy, dx)
            if path == BOX_DIRECT:
                _lanes_box(ub2, acc2, scratch, box, flags, m, first, count, acc_base, acc_rows,
                           overwrite)
            elif path == BOX_COMPACT:
                _lanes_compact(ub2, acc2, scratch, box, flags, m, first, count, acc_base,
                               acc_rows, overwrite)
            else:
                _lanes_full(ub2, acc2, scratch, flags, m, first, count, acc_base, acc_rows,
                            overwrite, live_rows(box, n))


@njit(cache=True)
def _acc_row(q, count, acc_base, acc_rows):
    """The stacked accumulator row of vector q (lane q // count's vector q % count)."""
    b = q // count
    return b * acc_rows + acc_base + (q - b * count)


@njit(cache=True)
def _lane_run(q, left, count):
    """How many of the `left` vectors from vector q are lane q // count's: a lane's
    vectors are consecutive rows of its accumulators, so such a run is one block."""
    return min(left, (q // count + 1) * count - q)


@njit(cache=True)
def _store(acc2, products, m, first, count, acc_base, acc_rows, overwrite):
    """Vectors first..first+m-1's products (m, N) int32 into their lanes' accumulators:
    copied (overwrite) or added, wrapping; a lane's vectors are consecutive rows, so each
    lane's part is one block."""
    n = acc2.shape[1]
    r = 0
    while r < m:
        q = first + r
        run = _lane_run(q, m - r, count)
        a = _acc_row(q, count, acc_base, acc_rows)
        if overwrite:
            _copy_words(acc2[a:a + run].reshape(run * n), products[r:r + run].reshape(run * n))
        else:
            dst = acc2[a:a + run].reshape(run * n)
            src = products[r:r + run].reshape(run * n)
            for k in range(run * n):
                dst[k] += src[k]
        r += run


@njit(cache=True)
def _lanes_full(ub2, acc2, scratch, flags, m, first, count, acc_base, acc_rows, overwrite,
                k_live):
    """kernels._mmc_iteration_int8 on vectors first..first+m-1 of the lanes (UB rows in
    scratch.rows8): in one pass straight into the lanes' accumulators, else (16-bit operands
    without VNNI) staged in scratch.c32 (as int32), then stored."""
    n = ub2.shape[1]
    rows = scratch.rows8
    wide_in = (flags & MMC_WIDE_IN) != 0
    wide_w = (flags & MMC_WIDE_W) != 0
    threads = scratch.options[_OPT_INT8_THREADS]
    one16 = _one_pass16(flags, scratch)
    if one16 or not (wide_in or wide_w):
        # one pass: the kernel adds into (or overwrites) each lane's accumulator rows
        # itself, a lane's vectors being consecutive rows (no staging and no second pass
        # over the products: every tap of a convolution stored and reloaded them)
        r = 0
        while r < m:
            q = first + r
            run = _lane_run(q, m - r, count)
            a = _acc_row(q, count, acc_base, acc_rows)
            if one16:
                _native.mmc_rows16(ub2, rows[r:r + run], run, scratch.packed8[0],
                                   scratch.bias8[0], (flags & MMC_UNSIGNED_IN) == 0, wide_in,
                                   (flags & MMC_UNSIGNED_W) == 0, wide_w, acc2, a, overwrite,
                                   threads)
            else:
                _native.mmc_rows(ub2, rows[r:r + run], run, scratch.packed8[0],
                                 scratch.bias8[0], (flags & MMC_UNSIGNED_IN) == 0,
                                 (flags & MMC_UNSIGNED_W) == 0, acc2, a, overwrite, 0,
                                 scratch.options[_OPT_INT8], threads, k_live)
            r += run
        return
    # 16-bit operands below the VNNI level: a pass per byte pair, staged
    products = scratch.c32.reshape(scratch.c32.size).view(np.int32)[:m * n].reshape((m, n))
    first_pass = True
    for xp in range(2 if wide_in else 1):
        signed_x, x_shift = _byte_part(xp, wide_in, (flags & MMC_UNSIGNED_IN) != 0)
        if xp == 1:                 # the high bytes: each input's next row
            for r in range(m):
                rows[r] += 1
        for wp in range(2 if wide_w else 1):
            signed_w, w_shift = _byte_part(wp, wide_w, (flags & MMC_UNSIGNED_W) != 0)
            _native.mmc_rows(ub2, rows, m, scratch.packed8[2 * wp + xp],
                             scratch.bias8[2 * wp + xp], signed_x, signed_w, products, 0,
                             first_pass, x_shift + w_shift, scratch.options[_OPT_INT8],
                             threads)
            first_pass = False
    _store(acc2, products, m, first, count, acc_base, acc_rows, overwrite)


@njit(cache=True)
def _lanes_compact(ub2, acc2, scratch, box, flags, m, first, count, acc_base, acc_rows,
                   overwrite):
    """kernels._mmc_iteration_compact on vectors first..first+m-1 of the lanes: the box's
    input rows gathered, the int8 kernel on the corner tile, the box's columns stored."""
    k0, k1, j0, j1 = box[0], box[1], box[2], box[3]
    height, width = k1 - k0, j1 - j0
    side = _compact_side(box)
    rows = scratch.rows8
    x = scratch.x32.reshape(scratch.x32.size).view(np.uint8)[:m * side].reshape((m, side))
    c = scratch.c32.reshape(scratch.c32.size).view(np.int32)[:m * side].reshape((m, side))
    for r in range(m):
        box_input(x[r], ub2[rows[r]], k0, height)
        rows[r] = r
    compact_products(x, rows, m, scratch, flags, c)
    for r in range(m):
        box_result(acc2[_acc_row(first + r, count, acc_base, acc_rows)], c[r], j0, j1, width,
                   overwrite)


@njit(cache=True)
def _lanes_box(ub2, acc2, scratch, box, flags, m, first, count, acc_base, acc_rows,
               overwrite):
    """kernels._mmc_iteration_box on vectors first..first+m-1 of the lanes (UB rows in
    scratch.rows8): the box's columns summed in int32, the others zeroed or left."""
    k0, k1, j0, j1 = box[0], box[1], box[2], box[3]
    height, width = k1 - k0, j1 - j0
    w = scratch.box_w           # row-major, `width` wide
    sums = np.zeros(width, np.int32)
    unsigned_in = (flags & MMC_UNSIGNED_IN) != 0
    rows = scratch.rows8
    for r in range(m):
        x = ub2[rows[r]]
        for j in range(width):
            sums[j] = 0
        for k in range(height):
            xv = np.int32(x[k0 + k])
            if not unsigned_in:
                xv = _signed8(xv)
            base = k * width
            for j in range(width):
                sums[j] += xv * w[base + j]
        dst = acc2[_acc_row(first + r, count, acc_base, acc_rows)]
        if overwrite:
            dst[:j0] = 0
            dst[j1:] = 0
            dst[j0:j1] = sums
        else:
            inside = dst[j0:j1]
            for j in range(width):
                inside[j] += sums[j]


# ------------------------------------------------------------------ the Python side
# The lanes' memories of one call stay below this (a digits CNN lane holds 6 MB, one of
# Table 1's MLP0 29 MB).
LANE_BYTES = 256 << 20
# Lanes pay where the MatrixMultiplies are GEMMs worth sharing among the kernel's threads
# (mmc_int8.c's SPLIT_MACS): Table 1's MLP0 at batch 200 ran its data path in 150 ms
# instead of 184 (280 ms CPU instead of 364).  Small ones lose: the digits CNN's 16-row
# convolution steps ran 2.9 ms a batch as 16 lanes against 2.1 alone, its accumulators
# then sixteen times the cache; the digits MLP was even.
WORTH_MACS = 1 << 23


def worth_it(prog: np.ndarray, array_size: int) -> bool:
    """Whether a program's MatrixMultiplies are large enough for lanes: their mean vector
    count (every iteration's) times N^2 at least WORTH_MACS."""
    mmc = prog[:, COL_OP] == OP_MMC
    if not mmc.any():
        return False
    rows = prog[mmc]
    conv = (rows[:, COL_FLAGS] & MMC_CONV) != 0
    per = np.where(conv, rows[:, COL_HEIGHT] * rows[:, COL_WIDTH], rows[:, COL_LEN])
    vectors = per * np.maximum(rows[:, COL_REPEAT], 1)
    return float(vectors.mean()) * array_size * array_size >= WORTH_MACS


def lane_bytes(ub_shape, acc_shape) -> int:
    return int(np.prod(ub_shape)) + 4 * int(np.prod(acc_shape))


def arguments(machine_args, hosts, ub, acc) -> tuple:
    """run_lanes' arguments (without the profile) for a machine's core arguments
    (Machine._args): registers from reset, an empty weight queue, no active tile."""
    prog, weights, scratch = machine_args[0], machine_args[14], machine_args[15]
    regs = reset_registers()
    tiles = np.full(max(_fetched_tiles(prog), 1), -1, dtype=np.int64)
    active = np.full(2, -1, dtype=np.int64)
    return prog, regs, tiles, ub, acc, hosts, weights, active, scratch


def run(machine_args, hosts: np.ndarray, ub: np.ndarray, acc: np.ndarray,
        profile: int) -> int:
    """run_lanes on `hosts` ((L, rows, N) uint8, C-contiguous) with lane memories ub and
    acc (the ahead-of-time build when it takes these arguments, else numba's JIT)."""
    from . import aot
    args = (*arguments(machine_args, hosts, ub, acc), np.int64(profile))
    entry = aot.runner(args[:-1], "run_lanes") or run_lanes
    try:
        return int(entry(*args))
    finally:
        args[8].options[_OPT_TRUSTED] = 0     # also when the run raised

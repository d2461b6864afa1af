"""The functional core of the emulator: numba kernels that check, bound and execute one
instruction on the machine state (spec/isa.md sections 3-5 and 7).

The pipeline (core.py) calls these from its own njit code: `check_instruction` and
`footprint` at issue, `execute_instruction` when the instruction completes.  All functions
are `@njit(cache=True)`.

Interface
---------
FAULT_NONE, FAULT_ADDRESS, FAULT_CONFIG, FAULT_SHAPE = 0, 1, 2, 3
MEM_UB, MEM_ACC, MEM_HOST, MEM_TILE = 0, 1, 2, 3

check_instruction(row, regs, ub_rows, acc_rows, host_rows, n_tiles, info, profile=0) -> fault
    row: one row of the decoded table (decoded.py), regs: the registers captured at issue,
    info: int64[>=3], written only on a fault:
      FAULT_ADDRESS  info = (MEM_*, address, limit): the first out-of-range row in execution
                     order -- iterations in order; within an iteration the source memory,
                     then the destination; within a memory the vectors in order (a 16-bit
                     vector reads its low row, then its high row; a convolve tap's output
                     pixels row-major).  RW: MEM_TILE, the first tile past the image.
                     (spec/isa.md section 7 states this rule.)
      FAULT_CONFIG   info = (register index, value, 0): CFG writes a value outside the
                     register's min..max (or names no register); for other instructions a
                     captured register outside its range (only a hand-made state can do that).
      FAULT_SHAPE    info = (length, pool_size, pool_width): an ACT.M/ACT.A whose length
                     does not divide into pooling windows; with info[3:5] (when info has
                     them), pool_size_x and 1 for a pool_stride_x without pool_stride.
    Order: config, then shape, then address.  FIFO/tile faults are the pipeline's.
footprint(row, regs, out, profile=0) -> count
    out: int64[8, 4]; entries (MEM_*, is_write, start, stop), stop exclusive: the bounding
    row range over all iterations.  RHM/RHMA read host, write UB; WHM/WHMA read UB, write
    host; MMC reads UB, writes ACC (one write entry also stands for the accumulate's read);
    ACT reads ACC, writes UB; VADD/VMUL read UB (a, b, the L table), write UB (c).
    Weight traffic is not included.  Other instructions: 0.
execute_instruction(row, regs, ub, acc, host, weights, tiles, active, scratch, profile)
    Runs every iteration.  ub uint8[:, :], acc int32[:, :], host uint8[:, :],
    weights uint8[:, :, :] (the weight image), tiles int64[:] (the tiles the switches
    consume, in order: one per iteration with S, two -- low, high -- with S and D),
    active int64[2] = (tile, high tile or -1), updated on each switch.  Assumes
    check_instruction passed and the pipeline checked the weight faults.
    `profile`: PROFILE_TPU 0 (spec/isa.md) or PROFILE_OPENTPU 1 (spec/opentpu.md section 4:
    Activate's Q is OpenTPU's sigmoid, no requantization, the low 8 bits, one UB row per
    vector; T, M and A work as in the tpu profile).  check_instruction and footprint take
    the same optional trailing `profile` (it changes ACT's UB row count when act_out = 2).
make_scratch(array_size, chunk_rows=1024, use_blas=None, int8_level=None, int8_threads=None,
             cached_tiles=0)
    A namedtuple of preallocated arrays (numba passes namedtuples of arrays to njit code
    as a heterogeneous tuple type): float32/float64 GEMM staging for `chunk_rows` rows,
    the converted-weight caches (float, and the int8 kernel's packed tile), their keys and
    the raw bytes they were converted from, options (use_blas, chunk_rows, int8 level,
    int8 threads), Activate's row buffer: about 7 MB for N = 256 (the float64 half is
    touched only by 16-bit modes).  use_blas=None means "if gemm.HAVE_BLAS";
    int8_level=None means native.level() when N is a multiple of 16 (0: the float path),
    int8_threads=None native.threads().  Make one per machine and reuse it.
    A cache hit needs the same tiles, U/W/D mode *and* bytes, so loading another weight
    image never needs an explicit invalidation.
    cached_tiles > 0 adds that many slots of packed tiles for the int8 kernel (the
    packed-tile cache, 3 N^2 bytes a slot; Machine.run_batches), with the same rule.

During a data-path run (dataonly.py sets scratch.options[_OPT_TRUSTED]) a MatrixMultiply
with 8-bit operands whose weight tile is zero outside a small bounding box runs on the box
alone ("padded tiles" below: direct integer loops, or the int8 kernel on a smaller corner
tile), bit-exact; the pipelined core always takes the full tile.  Activate's pooling,
fixed-point P and register requantization with an 8-bit output run a row at a time
(_act_fast), with the element-by-element loop kept for the rest and as the tests' oracle.
make_scratch's options also hold that flag and the run's number (_OPT_EPOCH), and the
scratch the boxes' cache and buffers (boxes, box_w, box_tile, box_packed, box_bias).

MatrixMultiply runs on the int8 kernel (native.py, mmc_int8.c: integer products summed in
int32 with AVX-512 VNNI or AVX2, straight from the UB into the accumulators; a 16-bit
operand as its two bytes) when the int8 level is not 0.  Otherwise it runs as an exact
float GEMM (gemm.py): float32 for 8-bit operands, float64 when either side is 16-bit (H or
D), chunked `chunk_rows` output vectors at a time, then an int32 wrapping accumulate.
With the int8 kernel, a large plain Activate (no pooling, ReLU or no function, none of
_execute_act_ext's features) runs on the kernel's threads (_act_shared, native.act_rows),
and a large MatrixMultiply wakes them before its set-up (native.pool_prepare).
Register limits, opcodes and the sigmoid/tanh tables are module globals, which numba
freezes into the compiled (and cached) code.
"""
from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
from .jit import njit

from ..functions import SIGMOID_Q15, T_MAX, T_MIN, TANH_Q15
from ..opentpu import INT32_MIN as OPENTPU_INT32_MIN
from ..opentpu import SIGMOID_HI as OPENTPU_SIGMOID_HI
from ..opentpu import SIGMOID_LO as OPENTPU_SIGMOID_LO
from ..opentpu import SIGMOID_TABLE as _OPENTPU_SIGMOID_TABLE
from . import gemm as _gemm
from . import native as _native
from .decoded import (ACT_AVGPOOL, ACT_MAXPOOL, ACT_OUT_INT8, ACT_OUT_INT16, ACT_OUT_UINT8,
                      ACT_OUT_WRAP8,
                      ACT_RELU, ACT_SIGMOID, ACT_TANH, COL_ACC, COL_FLAGS, COL_HEIGHT,
                      COL_HOST, COL_LEN, COL_OP, COL_REG, COL_REPEAT, COL_TILE, COL_UB,
                      COL_VALUE, COL_WIDTH, MMC_CONV, MMC_OVERWRITE, MMC_SWITCH,
                      MMC_UNSIGNED_IN, MMC_UNSIGNED_W, MMC_WIDE_IN, MMC_WIDE_W, NREGS, OP_ACT,
                      OP_CFG, OP_MMC, OP_RHM, OP_RHMA, OP_RW, OP_WHM, OP_WHMA,
                      REG_ACT_MULT, REG_ACT_OUT, REG_ACT_SHIFT, REG_ACT_ZERO,
                      REG_CONV_KW, REG_CONV_PITCH, REG_CONV_STRIDE, REG_DMA_HOST_STRIDE,
                      REG_DMA_UB_STRIDE, REG_FN_IN_FRAC, REG_POOL_SIZE, REG_POOL_WIDTH,
                      REG_REP_ACC_STRIDE, REG_REP_HOST_STRIDE, REG_REP_UB_STRIDE,
                      register_limits)
from .decoded import (COL_VA, COL_VB, COL_VC, OP_VADD, OP_VMUL, REG_VEC_MULT_A,
                      REG_VEC_MULT_B, REG_VEC_SHIFT, REG_VEC_ZERO_A, REG_VEC_ZERO_B,
                      REG_VEC_ZERO_C, VEC_BROADCAST, VEC_LOOKUP, VEC_UNSIGNED, VEC_WIDE_A,
                      VEC_WIDE_B, VEC_WIDE_C)
from .vector import OP_ADD as _VEC_ADD, OP_MUL as _VEC_MUL, vector_row as _vector_row
from .vector import rows_per_vector as _vector_rows_per
# one reader of 8- and 16-bit UB vectors for MatrixMultiply and the vector unit
from .vector import load_vector as _load_vector, signed8 as _signed8
from .vector import apply_table as _apply_table, store_result as _store_result
from .decoded import REG_ACT_FLOAT, REG_VEC_FLOAT
from .decoded import (ACT_LOOKUP, ACT_PER_COLUMN, REG_ACT_HI, REG_ACT_LO, REG_ACT_PARAMS,
                      REG_ACT_TABLE, REG_ACT_UB_PITCH, REG_ACT_UB_WIDTH, REG_POOL_COUNT_PAD,
                      REG_POOL_PAD, REG_POOL_PAD_END, REG_POOL_STRIDE)
from .decoded import (REG_POOL_PAD_END_X, REG_POOL_PAD_X, REG_POOL_SIZE_X,
                      REG_POOL_STRIDE_X)

FAULT_NONE, FAULT_ADDRESS, FAULT_CONFIG, FAULT_SHAPE = 0, 1, 2, 3
MEM_UB, MEM_ACC, MEM_HOST, MEM_TILE = 0, 1, 2, 3
MAX_FOOTPRINT = 8
PROFILE_TPU, PROFILE_OPENTPU = 0, 1

REG_MIN, REG_MAX = register_limits()          # baked into the compiled code as constants
SIGMOID_TABLE = np.ascontiguousarray(SIGMOID_Q15, dtype=np.int64)
OPENTPU_SIGMOID_TABLE = np.ascontiguousarray(_OPENTPU_SIGMOID_TABLE, dtype=np.int64)
TANH_TABLE = np.ascontiguousarray(TANH_Q15, dtype=np.int64)

# The weight-cache key slots: (tile, high tile or -1, mode); raw32/raw64 hold the tiles' bytes.
_KEY_EMPTY = -2

Scratch = namedtuple("Scratch", ["x32", "c32", "x64", "c64", "w32", "w64", "key32", "key64",
                                 "raw32", "raw64", "options", "row_buf", "packed8", "bias8",
                                 "key8", "raw8", "rows8", "cache8", "cache_bias8",
                                 "cache_key8", "cache_raw8", "boxes", "box_w", "box_tile",
                                 "box_packed", "box_bias"])
_OPT_BLAS, _OPT_CHUNK, _OPT_INT8, _OPT_INT8_THREADS = 0, 1, 2, 3
# Rows of one int8 kernel call (the length of rows8): an MLP's MatrixMultiply of a few
# thousand rows is one call, one job for the kernel's threads, rather than a job per
# chunk_rows (each a wake-up of the helpers and a wait for the slowest).
_INT8_CALL_ROWS = 16384
# The data path's run in progress (dataonly.py): 1 while one runs (the weight image cannot
# change during it, so a tile's bounding box found once stays true), and its number, which
# the box cache entries carry.
_OPT_TRUSTED, _OPT_EPOCH = 4, 5
# The last padded-tile plan (_box_plan): tile, mode, run number, path, then the box's
# k0, k1, j0, j1 -- its weights are still in box_w / box_packed.
_OPT_PLAN = 6
BOX_SLOTS = 1024                # direct-mapped slots of the tiles' bounding boxes


def make_scratch(array_size: int, chunk_rows: int = 1024, use_blas: bool | None = None,
                 int8_level: int | None = None, int8_threads: int | None = None,
                 cached_tiles: int = 0) -> Scratch:
    """Preallocated buffers for execute_instruction (see the module docstring);
    `cached_tiles` slots of packed tiles for the int8 kernel (_packed_from_cache)."""
    n = int(array_size)
    chunk = max(1, int(chunk_rows))
    if use_blas is None:
        use_blas = _gemm.HAVE_BLAS
    if use_blas and not _gemm.HAVE_BLAS:
        raise RuntimeError("OpenBLAS from numpy's wheel was not found; use use_blas=False")
    if int8_level is None:
        int8_level = _native.level() if n % 16 == 0 else _native.LEVEL_NONE
    if int8_level and not (n % 16 == 0 and int8_level <= _native.cpu_level()):
        raise RuntimeError(f"the int8 kernel at level {int8_level} needs a C compiler, a CPU "
                           f"with that level (this one: {_native.cpu_level()}) and an array "
                           f"size that is a multiple of 16; use int8_level=0")
    threads = _native.threads() if int8_threads is None else max(1, int(int8_threads))
    int8_n = n if int8_level else 0             # nothing to allocate for an unused path
    return Scratch(
        x32=np.zeros((chunk, n), np.float32), c32=np.zeros((chunk, n), np.float32),
        x64=np.zeros((chunk, n), np.float64), c64=np.zeros((chunk, n), np.float64),
        w32=np.zeros((n, n), np.float32), w64=np.zeros((n, n), np.float64),
        key32=np.full(3, _KEY_EMPTY, np.int64), key64=np.full(3, _KEY_EMPTY, np.int64),
        raw32=np.zeros((2, n, n), np.uint8), raw64=np.zeros((2, n, n), np.uint8),
        options=np.array([1 if use_blas else 0, chunk, int8_level, threads, 0, 0]
                         + [_KEY_EMPTY] * 8, np.int64),
        row_buf=np.zeros((2, n), np.int64),
        packed8=np.zeros((4, 2 * int8_n * int8_n), np.int8),
        bias8=np.zeros((4, int8_n), np.int32),
        key8=np.full(3, _KEY_EMPTY, np.int64), raw8=np.zeros((2, int8_n, int8_n), np.uint8),
        rows8=np.zeros(max(chunk, _INT8_CALL_ROWS) if int8_level else 0, np.int64),
        **_tile_cache(int8_n, cached_tiles if int8_level else 0),
        boxes=np.full((BOX_SLOTS, 6), _KEY_EMPTY, np.int64),
        box_w=np.zeros(n * n, np.int32), box_tile=np.zeros(int8_n * int8_n, np.uint8),
        box_packed=np.zeros(2 * int8_n * int8_n, np.int8), box_bias=np.zeros(int8_n, np.int32))


# ----------------------------------------------------------------------------- helpers


@njit(cache=True)
def _iterations(row):
    return max(row[COL_REPEAT], 1)


@njit(cache=True)
def _first_bad_run(a0, step, n, limit):
    """First address a0 + k*step (k = 0..n-1, in order) outside 0..limit-1: (bad, address)."""
    if n <= 0:
        return False, 0
    if a0 < 0 or a0 >= limit:
        return True, a0
    last = a0 + (n - 1) * step
    if step > 0 and last >= limit:
        k = (limit - a0 + step - 1) // step
        return True, a0 + k * step
    if step < 0 and last < 0:
        k = a0 // (-step) + 1
        return True, a0 + k * step
    return False, 0


@njit(cache=True)
def _first_bad_conv(ub, height, width, pitch, stride, dy, dx, wide, limit):
    """First out-of-range UB row of one convolve tap, in output-pixel order.

    Vector (y, x) is v = (y*s + dy)*pitch + x*s + dx.  The last vector of image row y grows
    with y and the vectors within a row grow with x, so the first bad vector is in the first
    row whose last vector is bad.  A 16-bit vector reads rows ub+2v and ub+2v+1."""
    per = 2 if wide else 1
    last = ub + per * (((height - 1) * stride + dy) * pitch + (width - 1) * stride + dx) + per - 1
    if last < limit:
        return False, 0                      # the common case: no scan
    for y in range(height):
        base = ub + per * ((y * stride + dy) * pitch + dx)
        if base + per * (width - 1) * stride + per - 1 < limit:
            continue
        if base >= limit:
            return True, base
        # first x with base + per*x*stride + per - 1 >= limit
        need = limit - (per - 1) - base
        step = per * stride
        x = (need + step - 1) // step
        addr = base + x * step
        if addr >= limit:
            return True, addr
        return True, limit        # the high row of a 16-bit vector whose low row fits
    return False, 0


@njit(cache=True)
def _set_info(info, a, b, c):
    info[0] = a
    info[1] = b
    info[2] = c


@njit(cache=True)
def _check_registers(regs, info):
    for r in range(NREGS):
        if regs[r] < REG_MIN[r] or regs[r] > REG_MAX[r]:
            _set_info(info, r, regs[r], 0)
            return FAULT_CONFIG
    return FAULT_NONE


@njit(cache=True)
def _act_shape(row, regs):
    """(valid, output vectors per iteration) of an Activate."""
    flags = row[COL_FLAGS]
    length = row[COL_LEN]
    if flags & (ACT_MAXPOOL | ACT_AVGPOOL) == 0:
        return True, length
    k = regs[REG_POOL_SIZE]
    width = regs[REG_POOL_WIDTH]
    if width == 0:
        return length % k == 0, length // k
    g = _pool_geometry(length, width, regs)
    return g[0], g[7] * g[8]


@njit(cache=True)
def _pool_geometry(length, width, regs):
    """2-D pooling (pool_width = width > 0) of an image of length / width rows:
    (valid, kh, kw, sy, sx, top, left, out_h, out_w) -- the window, the strides, the
    padding above and left, the output's size.  The column registers at reset (0, or -1 for
    the padding) take the row registers' values; pool_stride = 0 is windows that tile the
    image.  Every window must hold at least one image element (spec/isa.md 5.5)."""
    kh = regs[REG_POOL_SIZE]
    kw = regs[REG_POOL_SIZE_X] if regs[REG_POOL_SIZE_X] != 0 else kh
    sy = regs[REG_POOL_STRIDE]
    sx = regs[REG_POOL_STRIDE_X] if regs[REG_POOL_STRIDE_X] != 0 else sy
    if length % width != 0:
        return False, kh, kw, 1, 1, 0, 0, 0, 0
    height = length // width
    if sy == 0:
        ok = regs[REG_POOL_STRIDE_X] == 0 and width % kw == 0 and height % kh == 0
        return ok, kh, kw, kh, kw, 0, 0, height // kh, width // kw
    top, bottom = regs[REG_POOL_PAD], regs[REG_POOL_PAD_END]
    left = regs[REG_POOL_PAD_X] if regs[REG_POOL_PAD_X] >= 0 else top
    right = regs[REG_POOL_PAD_END_X] if regs[REG_POOL_PAD_END_X] >= 0 else bottom
    if top >= kh or bottom >= kh or left >= kw or right >= kw \
            or height + top + bottom < kh or width + left + right < kw:
        return False, kh, kw, sy, sx, top, left, 0, 0
    return (True, kh, kw, sy, sx, top, left, (height + top + bottom - kh) // sy + 1,
            (width + left + right - kw) // sx + 1)


@njit(cache=True)
def act_param_rows(flags, n):
    """(UB rows of P's per-column parameters, UB rows of L's table) an Activate reads."""
    p = 9 if flags & ACT_PER_COLUMN else 0
    t = (256 + n - 1) // n if flags & ACT_LOOKUP else 0
    return p, t


@njit(cache=True)
def _act_ub_rows(row, regs, profile):
    """UB rows one Activate iteration spans (the OpenTPU profile ignores act_out); with
    act_ub_pitch, from its first row to one past its last."""
    ok, out_rows = _act_shape(row, regs)
    per = 2 if regs[REG_ACT_OUT] == ACT_OUT_INT16 and profile != PROFILE_OPENTPU else 1
    if regs[REG_ACT_UB_PITCH] == 0 or out_rows <= 0:
        return per * out_rows
    top = 0
    for o in range(out_rows):
        top = max(top, _act_out_row(o, regs))
    return per * (top + 1)


@njit(cache=True)
def _act_out_row(o, regs):
    """Row (in output vectors) of Activate's output vector o: o itself, or its place in an
    image of act_ub_width vectors per row at act_ub_pitch (spec/isa.md 5.5)."""
    pitch = regs[REG_ACT_UB_PITCH]
    if pitch == 0:
        return o
    w = regs[REG_ACT_UB_WIDTH]
    return (o // w) * pitch + o % w


@njit(cache=True)
def _conv_geometry(row, regs):
    """(height, width, pitch, kw, stride) of a convolving MatrixMultiply: conv_pitch 0
    means the output width."""
    height, width = row[COL_HEIGHT], row[COL_WIDTH]
    pitch = regs[REG_CONV_PITCH] if regs[REG_CONV_PITCH] != 0 else width
    return height, width, pitch, regs[REG_CONV_KW], regs[REG_CONV_STRIDE]


@njit(cache=True)
def _check_two_runs(reps, m1, a1, rep1, step1, n1, lim1, m2, a2, rep2, step2, n2, lim2, info):
    """Per iteration: the source run, then the destination run."""
    for i in range(reps):
        bad, addr = _first_bad_run(a1 + i * rep1, step1, n1, lim1)
        if bad:
            _set_info(info, m1, addr, lim1)
            return FAULT_ADDRESS
        bad, addr = _first_bad_run(a2 + i * rep2, step2, n2, lim2)
        if bad:
            _set_info(info, m2, addr, lim2)
            return FAULT_ADDRESS
    return FAULT_NONE


@njit(cache=True)
def _check_mmc(row, regs, ub_rows, acc_rows, info):
    flags = row[COL_FLAGS]
    reps = _iterations(row)
    wide = (flags & MMC_WIDE_IN) != 0
    per = 2 if wide else 1
    if flags & MMC_CONV:
        height, width, pitch, kw, stride = _conv_geometry(row, regs)
        if height <= 0 or width <= 0:
            return FAULT_NONE
        for i in range(reps):
            bad, addr = _first_bad_conv(row[COL_UB], height, width, pitch, stride,
                                        i // kw, i % kw, wide, ub_rows)
            if bad:
                _set_info(info, MEM_UB, addr, ub_rows)
                return FAULT_ADDRESS
            bad, addr = _first_bad_run(row[COL_ACC], 1, height * width, acc_rows)
            if bad:
                _set_info(info, MEM_ACC, addr, acc_rows)
                return FAULT_ADDRESS
        return FAULT_NONE
    length = row[COL_LEN]
    return _check_two_runs(reps, MEM_UB, row[COL_UB], regs[REG_REP_UB_STRIDE], 1, per * length,
                           ub_rows, MEM_ACC, row[COL_ACC], regs[REG_REP_ACC_STRIDE], 1, length,
                           acc_rows, info)


# ----------------------------------------------------------------------------- check


@njit(cache=True)
def check_instruction(row, regs, ub_rows, acc_rows, host_rows, n_tiles, info, profile=0,
                      array_size=256):
    op = row[COL_OP]
    if op == OP_CFG:
        reg, value = row[COL_REG], row[COL_VALUE]
        if reg < 0 or reg >= NREGS or value < REG_MIN[reg] or value > REG_MAX[reg]:
            _set_info(info, reg, value, 0)
            return FAULT_CONFIG
        return FAULT_NONE
    if op == OP_RW:
        bad, addr = _first_bad_run(row[COL_TILE], 1, _iterations(row), n_tiles)
        if bad:
            _set_info(info, MEM_TILE, addr, n_tiles)
            return FAULT_ADDRESS
        return FAULT_NONE
    if op != OP_RHM and op != OP_RHMA and op != OP_WHM and op != OP_WHMA and op != OP_MMC \
            and op != OP_ACT and op != OP_VADD and op != OP_VMUL:
        return FAULT_NONE
    fault = _check_registers(regs, info)
    if fault != FAULT_NONE:
        return fault
    if op == OP_VADD or op == OP_VMUL:
        return _check_vector(row, regs, ub_rows, info, array_size)
    reps = _iterations(row)
    length = row[COL_LEN]
    ub_step, host_step = _dma_steps(op, regs)
    if op == OP_RHM or op == OP_RHMA:
        return _check_two_runs(reps, MEM_HOST, row[COL_HOST], regs[REG_REP_HOST_STRIDE],
                               host_step, length, host_rows, MEM_UB, row[COL_UB],
                               regs[REG_REP_UB_STRIDE], ub_step, length, ub_rows, info)
    if op == OP_WHM or op == OP_WHMA:
        return _check_two_runs(reps, MEM_UB, row[COL_UB], regs[REG_REP_UB_STRIDE], ub_step,
                               length, ub_rows, MEM_HOST, row[COL_HOST],
                               regs[REG_REP_HOST_STRIDE], host_step, length, host_rows, info)
    if op == OP_MMC:
        return _check_mmc(row, regs, ub_rows, acc_rows, info)
    # Activate
    ok, out_rows = _act_shape(row, regs)
    if not ok:
        _set_info(info, length, regs[REG_POOL_SIZE], regs[REG_POOL_WIDTH])
        if info.shape[0] >= 5:          # the column registers, for the message
            info[3] = regs[REG_POOL_SIZE_X]
            tiling_with_stride = regs[REG_POOL_STRIDE_X] != 0 and regs[REG_POOL_STRIDE] == 0 \
                and regs[REG_POOL_WIDTH] != 0
            info[4] = 1 if tiling_with_stride else 0
        return FAULT_SHAPE
    # P's parameter rows, then L's table rows, before the iterations' rows
    p_rows, t_rows = act_param_rows(row[COL_FLAGS], array_size)
    for base, count in ((regs[REG_ACT_PARAMS], p_rows), (regs[REG_ACT_TABLE], t_rows)):
        bad, addr = _first_bad_run(base, 1, count, ub_rows)
        if bad:
            _set_info(info, MEM_UB, addr, ub_rows)
            return FAULT_ADDRESS
    if regs[REG_ACT_UB_PITCH] != 0:
        return _check_act_pitched(row, regs, length, out_rows, acc_rows, ub_rows, info, profile)
    return _check_two_runs(reps, MEM_ACC, row[COL_ACC], regs[REG_REP_ACC_STRIDE], 1, length,
                           acc_rows, MEM_UB, row[COL_UB], regs[REG_REP_UB_STRIDE], 1,
                           _act_ub_rows(row, regs, profile), ub_rows, info)


@njit(cache=True)
def vector_table_rows(flags, n):
    """UB rows of the lookup table a VADD/VMUL with L reads first."""
    return (256 + n - 1) // n if flags & VEC_LOOKUP else 0


@njit(cache=True)
def vector_operand_rows(row):
    """UB rows one iteration of a VADD/VMUL reads of a and of b and writes of c: `length`
    vectors each, two rows a vector for a 16-bit operand, B's one vector with B."""
    flags, length = row[COL_FLAGS], row[COL_LEN]
    per_a, per_b, per_c = _vector_rows_per(flags)
    return (per_a * length, per_b if flags & VEC_BROADCAST else per_b * length,
            per_c * length)


@njit(cache=True)
def vector_cycles(row, n):
    """Cycles a VADD/VMUL streams after act_latency (spec/timing.md 4): the UB read port
    delivers a's and b's rows (B's once) and the write port takes c's, one row a cycle
    each and side by side, so the larger count; then the table rows with L."""
    reps = _iterations(row)
    rows_a, rows_b, rows_c = vector_operand_rows(row)
    reads = rows_a * reps + (rows_b if row[COL_FLAGS] & VEC_BROADCAST else rows_b * reps)
    return max(reads, rows_c * reps) + vector_table_rows(row[COL_FLAGS], n)


@njit(cache=True)
def _check_vector(row, regs, ub_rows, info, array_size):
    """VADD/VMUL: vec_float with a 16-bit operand (config), the table rows (L), then per
    iteration a's rows, b's, c's."""
    if regs[REG_VEC_FLOAT] != 0 and row[COL_FLAGS] & (VEC_WIDE_A | VEC_WIDE_B | VEC_WIDE_C):
        # onnxruntime's float32 kernels that vec_float copies take 8-bit operands only
        _set_info(info, REG_VEC_FLOAT, regs[REG_VEC_FLOAT], 1)
        return FAULT_CONFIG
    bad, addr = _first_bad_run(regs[REG_ACT_TABLE], 1,
                               vector_table_rows(row[COL_FLAGS], array_size), ub_rows)
    if bad:
        _set_info(info, MEM_UB, addr, ub_rows)
        return FAULT_ADDRESS
    step = regs[REG_REP_UB_STRIDE]
    broadcast = (row[COL_FLAGS] & VEC_BROADCAST) != 0
    rows_a, rows_b, rows_c = vector_operand_rows(row)
    for i in range(_iterations(row)):
        for base, n in ((row[COL_VA] + i * step, rows_a),
                        (row[COL_VB] + (0 if broadcast else i * step), rows_b),
                        (row[COL_VC] + i * step, rows_c)):
            bad, addr = _first_bad_run(base, 1, n, ub_rows)
            if bad:
                _set_info(info, MEM_UB, addr, ub_rows)
                return FAULT_ADDRESS
    return FAULT_NONE


@njit(cache=True)
def _check_act_pitched(row, regs, length, out_rows, acc_rows, ub_rows, info, profile):
    """Activate with act_ub_pitch: per iteration the accumulator rows, then each output
    vector's UB row(s) in order."""
    per = 2 if regs[REG_ACT_OUT] == ACT_OUT_INT16 and profile != PROFILE_OPENTPU else 1
    for i in range(_iterations(row)):
        bad, addr = _first_bad_run(row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE], 1, length,
                                   acc_rows)
        if bad:
            _set_info(info, MEM_ACC, addr, acc_rows)
            return FAULT_ADDRESS
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(out_rows):
            bad, addr = _first_bad_run(u0 + per * _act_out_row(o, regs), 1, per, ub_rows)
            if bad:
                _set_info(info, MEM_UB, addr, ub_rows)
                return FAULT_ADDRESS
    return FAULT_NONE


# ----------------------------------------------------------------------------- footprint


@njit(cache=True)
def _bounds(base, rep_step, reps, step, n):
    """Bounding [start, stop) of base + i*rep_step + k*step, i < reps, k < n."""
    lo = base + min(0, (reps - 1) * rep_step) + min(0, (n - 1) * step)
    hi = base + max(0, (reps - 1) * rep_step) + max(0, (n - 1) * step)
    return lo, hi + 1


@njit(cache=True)
def _put(out, k, mem, is_write, start, stop):
    out[k, 0] = mem
    out[k, 1] = is_write
    out[k, 2] = start
    out[k, 3] = stop
    return k + 1


@njit(cache=True)
def footprint(row, regs, out, profile=0, array_size=256):
    op = row[COL_OP]
    reps = _iterations(row)
    length = row[COL_LEN]
    if op == OP_RHM or op == OP_RHMA or op == OP_WHM or op == OP_WHMA:
        ub_step, host_step = _dma_steps(op, regs)
        if length <= 0:
            return 0
        h0, h1 = _bounds(row[COL_HOST], regs[REG_REP_HOST_STRIDE], reps, host_step, length)
        u0, u1 = _bounds(row[COL_UB], regs[REG_REP_UB_STRIDE], reps, ub_step, length)
        reading_host = op == OP_RHM or op == OP_RHMA
        k = _put(out, 0, MEM_HOST, 0 if reading_host else 1, h0, h1)
        return _put(out, k, MEM_UB, 1 if reading_host else 0, u0, u1)
    if op == OP_MMC:
        flags = row[COL_FLAGS]
        per = 2 if flags & MMC_WIDE_IN else 1
        if flags & MMC_CONV:
            height, width, pitch, kw, stride = _conv_geometry(row, regs)
            if height <= 0 or width <= 0:
                return 0
            dy_max = (reps - 1) // kw
            dx_max = min(reps - 1, kw - 1)
            v_max = ((height - 1) * stride + dy_max) * pitch + (width - 1) * stride + dx_max
            k = _put(out, 0, MEM_UB, 0, row[COL_UB], row[COL_UB] + per * v_max + per)
            return _put(out, k, MEM_ACC, 1, row[COL_ACC], row[COL_ACC] + height * width)
        if length <= 0:
            return 0
        u0, u1 = _bounds(row[COL_UB], regs[REG_REP_UB_STRIDE], reps, 1, per * length)
        a0, a1 = _bounds(row[COL_ACC], regs[REG_REP_ACC_STRIDE], reps, 1, length)
        k = _put(out, 0, MEM_UB, 0, u0, u1)
        return _put(out, k, MEM_ACC, 1, a0, a1)
    if op == OP_ACT:
        if length <= 0:
            return 0
        a0, a1 = _bounds(row[COL_ACC], regs[REG_REP_ACC_STRIDE], reps, 1, length)
        k = _put(out, 0, MEM_ACC, 0, a0, a1)
        p_rows, t_rows = act_param_rows(row[COL_FLAGS], array_size)
        if p_rows > 0:          # P and L read their parameter rows from the UB
            k = _put(out, k, MEM_UB, 0, regs[REG_ACT_PARAMS], regs[REG_ACT_PARAMS] + p_rows)
        if t_rows > 0:
            k = _put(out, k, MEM_UB, 0, regs[REG_ACT_TABLE], regs[REG_ACT_TABLE] + t_rows)
        n_ub = _act_ub_rows(row, regs, profile)
        if n_ub <= 0:
            return k
        u0, u1 = _bounds(row[COL_UB], regs[REG_REP_UB_STRIDE], reps, 1, n_ub)
        return _put(out, k, MEM_UB, 1, u0, u1)
    if op == OP_VADD or op == OP_VMUL:
        if length <= 0:
            return 0
        step = regs[REG_REP_UB_STRIDE]
        rows_a, rows_b, rows_c = vector_operand_rows(row)
        a0, a1 = _bounds(row[COL_VA], step, reps, 1, rows_a)
        k = _put(out, 0, MEM_UB, 0, a0, a1)
        if row[COL_FLAGS] & VEC_BROADCAST:
            k = _put(out, k, MEM_UB, 0, row[COL_VB], row[COL_VB] + rows_b)
        else:
            b0, b1 = _bounds(row[COL_VB], step, reps, 1, rows_b)
            k = _put(out, k, MEM_UB, 0, b0, b1)
        t_rows = vector_table_rows(row[COL_FLAGS], array_size)
        if t_rows > 0:
            k = _put(out, k, MEM_UB, 0, regs[REG_ACT_TABLE], regs[REG_ACT_TABLE] + t_rows)
        c0, c1 = _bounds(row[COL_VC], step, reps, 1, rows_c)
        return _put(out, k, MEM_UB, 1, c0, c1)
    return 0


# ----------------------------------------------------------------------------- DMA


@njit(cache=True)
def _copy_rows(src, dst, src_base, dst_base, n, src_step, dst_step, src_rep, dst_rep, reps):
    """dst[dst_base + i*dst_rep + k*dst_step] = src[src_base + i*src_rep + k*src_step],
    in order (i outer, k inner), so a later vector landing on the same row wins."""
    width = src.shape[1]
    for i in range(reps):
        s0 = src_base + i * src_rep
        d0 = dst_base + i * dst_rep
        if src_step == 1 and dst_step == 1:
            # 8 bytes at a time (numba's 2-D slice assignment went byte by byte: a digits
            # MLP batch spent a sixth of its data path here)
            _copy_words(dst[d0:d0 + n].reshape(n * width), src[s0:s0 + n].reshape(n * width))
            continue
        for k in range(n):
            _copy_words(dst[d0 + k * dst_step], src[s0 + k * src_step])


@njit(cache=True)
def _dma_steps(op, regs):
    """Rows between consecutive vectors (UB, host): 1 for RHM/WHM, the dma_* registers
    for the alternate (strided) transfers."""
    if op == OP_RHMA or op == OP_WHMA:
        return regs[REG_DMA_UB_STRIDE], regs[REG_DMA_HOST_STRIDE]
    return 1, 1


@njit(cache=True)
def _execute_dma(row, regs, ub, host):
    op = row[COL_OP]
    reps = _iterations(row)
    length = row[COL_LEN]
    ub_step, host_step = _dma_steps(op, regs)
    if op == OP_RHM or op == OP_RHMA:
        _copy_rows(host, ub, row[COL_HOST], row[COL_UB], length, host_step, ub_step,
                   regs[REG_REP_HOST_STRIDE], regs[REG_REP_UB_STRIDE], reps)
    else:
        _copy_rows(ub, host, row[COL_UB], row[COL_HOST], length, ub_step, host_step,
                   regs[REG_REP_UB_STRIDE], regs[REG_REP_HOST_STRIDE], reps)


# ----------------------------------------------------------------------------- MatrixMultiply


@njit(cache=True)
def _weight_value(weights, lo, hi, k, j, unsigned_w, wide_w):
    v = np.int32(weights[lo, k, j])
    if wide_w:
        h = np.int32(weights[hi, k, j])
        if not unsigned_w:
            h = _signed8(h)
        return v + 256 * h                      # the low byte is always unsigned
    if not unsigned_w:
        return _signed8(v)
    return v


@njit(cache=True)
def _convert_weights(weights, lo, hi, unsigned_w, wide_w, transposed, w):
    """w[k, n] (w[n, k] if transposed) = the active weight value as float (exact).
    The transposed walk goes column by column: its N source cache lines stay in L1 while
    the writes are contiguous."""
    n = w.shape[0]
    if transposed:
        for j in range(n):
            for k in range(n):
                w[j, k] = _weight_value(weights, lo, hi, k, j, unsigned_w, wide_w)
    else:
        for k in range(n):
            for j in range(n):
                w[k, j] = _weight_value(weights, lo, hi, k, j, unsigned_w, wide_w)


@njit(cache=True)
def _or_of_xors(a, b):
    diff = a.dtype.type(0)
    for i in range(a.size):
        diff |= a[i] ^ b[i]
    return diff


@njit(cache=True)
def _same_bytes(a, b):
    """a == b for two C-contiguous (N, N) uint8 tiles, 8 bytes at a time when N*N allows
    (OR of XORs without an early exit, so the loop vectorizes)."""
    fa = a.reshape(a.size)
    fb = b.reshape(b.size)
    if fa.size % 8 == 0:
        return _or_of_xors(fa.view(np.uint64), fb.view(np.uint64)) == 0
    return _or_of_xors(fa, fb) == 0


@njit(cache=True)
def _tile_unchanged(weights, active, wide, mode, key, raw):
    """The active tile (and its high tile with a wide W) was converted last, in `mode`, and
    its bytes are still those it was converted from (kept in `raw`, compared in well under a
    microsecond): a new weight image loaded at a reused address, or one modified in place,
    can never be served stale values."""
    lo = active[0]
    hi = active[1] if wide else -1
    return key[0] == lo and key[1] == hi and key[2] == mode \
        and _same_bytes(raw[0], weights[lo]) and (not wide or _same_bytes(raw[1], weights[hi]))


@njit(cache=True)
def _remember_tile(weights, active, wide, mode, key, raw):
    lo = active[0]
    hi = active[1] if wide else -1
    size = raw[0].size
    _copy_words(raw[0].reshape(size), weights[lo].reshape(size))
    if wide:
        _copy_words(raw[1].reshape(size), weights[hi].reshape(size))
    key[0], key[1], key[2] = lo, hi, mode


@njit(cache=True)
def _active_weights(weights, active, flags, transposed, w, key, raw):
    """The converted active tile for the float path (the BLAS path wants (K, N), the
    portable kernel the transpose), converting only on a change."""
    mode = (flags & (MMC_UNSIGNED_W | MMC_WIDE_W)) | (1024 if transposed else 0)
    wide = (flags & MMC_WIDE_W) != 0
    if not _tile_unchanged(weights, active, wide, mode, key, raw):
        _convert_weights(weights, active[0], active[1], (flags & MMC_UNSIGNED_W) != 0, wide,
                         transposed, w)
        _remember_tile(weights, active, wide, mode, key, raw)
    return w


@njit(cache=True)
def _byte_part(part, wide, unsigned):
    """(signed, shift) of byte `part` (0 low, 1 high) of an operand: an 8-bit operand is
    its one byte; a 16-bit one is a low byte, always unsigned, and a high byte worth 256."""
    if not wide:
        return not unsigned, 0
    if part == 0:
        return False, 0
    return not unsigned, 8


# ----------------------------------------------------------------------------- packed-tile cache
# Packing a tile for the int8 kernel costs more than a small batch's GEMM on it, and a
# program of more tiles than the one packed slot repacks every tile it switches to, in every
# batch.  A scratch made with cached_tiles > 0 (Machine.run_batches) keeps packed tiles in
# direct-mapped slots (tile index modulo slots), each with its key (tile, weight and input
# signedness) and the bytes it was packed from, so a hit is a compare and a copy, and a
# changed weight image is never served stale packings (like _tile_unchanged).


def _tile_cache(n: int, slots: int) -> dict:
    slots = max(0, int(slots)) if n else 0
    return dict(cache8=np.zeros((slots, 2 * n * n), np.int8),
                cache_bias8=np.zeros((slots, n), np.int32),
                cache_key8=np.full((slots, 3), _KEY_EMPTY, np.int64),
                cache_raw8=np.zeros((slots, n, n), np.uint8))


@njit(cache=True)
def _packed_from_cache(tile, index, signed_w, signed_x, scratch, k):
    """scratch.packed8[k], bias8[k] = weight tile `index` (bytes `tile`) packed, from the
    cache when it holds it, else packed and kept there."""
    slot = index % scratch.cache8.shape[0]
    key = scratch.cache_key8[slot]
    if key[0] == index and key[1] == signed_w and key[2] == signed_x \
            and _same_bytes(scratch.cache_raw8[slot], tile):
        _copy_words(scratch.packed8[k], scratch.cache8[slot])
        _copy_words(scratch.bias8[k], scratch.cache_bias8[slot])
        return
    _native.pack_tile(tile, signed_w, signed_x, scratch.options[_OPT_INT8],
                      scratch.packed8[k], scratch.bias8[k])
    _copy_words(scratch.cache8[slot], scratch.packed8[k])
    _copy_words(scratch.cache_bias8[slot], scratch.bias8[k])
    _copy_words(scratch.cache_raw8[slot].reshape(tile.size), tile.reshape(tile.size))
    key[0], key[1], key[2] = index, signed_w, signed_x


@njit(cache=True)
def _copy_words(dst, src):
    """dst[:] = src for two C-contiguous 1-D arrays of the same bytes, 8 bytes at a time
    when the size allows (numba's slice assignment of int8 rows ran at ~2 GB/s)."""
    if dst.nbytes % 8 == 0:
        d = dst.view(np.uint64)
        s = src.view(np.uint64)
        for i in range(d.size):
            d[i] = s[i]
    else:
        for i in range(dst.size):
            dst[i] = src[i]


@njit(cache=True)
def _one_pass16(flags, scratch):
    """A 16-bit MatrixMultiply (H, D or both) at the VNNI level runs in one vpdpwssd pass
    (native.mmc_rows16) instead of one pass per byte."""
    return ((flags & (MMC_WIDE_IN | MMC_WIDE_W)) != 0
            and scratch.options[_OPT_INT8] == _native.LEVEL_VNNI)


@njit(cache=True)
def _active_packed(weights, active, flags, scratch):
    """The active tile(s) in the int8 kernel's layout (native.py), packed only on a change:
    packed8[2 * weight byte + input byte], because the packing depends on both operands'
    signedness, and a 16-bit operand has two bytes of different signedness."""
    wide_w = (flags & MMC_WIDE_W) != 0
    wide_in = (flags & MMC_WIDE_IN) != 0
    mode = flags & (MMC_UNSIGNED_W | MMC_UNSIGNED_IN | MMC_WIDE_W | MMC_WIDE_IN)
    if _tile_unchanged(weights, active, wide_w, mode, scratch.key8, scratch.raw8):
        return
    if _one_pass16(flags, scratch):
        low = weights[active[0]]
        _native.pack_tile16(low, weights[active[1]] if wide_w else low,
                            (flags & MMC_UNSIGNED_W) == 0, wide_w,
                            (flags & MMC_UNSIGNED_IN) == 0, wide_in,
                            scratch.packed8[0], scratch.bias8[0])
        _remember_tile(weights, active, wide_w, mode, scratch.key8, scratch.raw8)
        return
    for wp in range(2 if wide_w else 1):
        signed_w, _ = _byte_part(wp, wide_w, (flags & MMC_UNSIGNED_W) != 0)
        for xp in range(2 if wide_in else 1):
            signed_x, _ = _byte_part(xp, wide_in, (flags & MMC_UNSIGNED_IN) != 0)
            if scratch.cache8.shape[0] > 0:
                _packed_from_cache(weights[active[wp]], active[wp], signed_w, signed_x,
                                   scratch, 2 * wp + xp)
                continue
            _native.pack_tile(weights[active[wp]], signed_w, signed_x,
                              scratch.options[_OPT_INT8], scratch.packed8[2 * wp + xp],
                              scratch.bias8[2 * wp + xp])
    _remember_tile(weights, active, wide_w, mode, scratch.key8, scratch.raw8)


@njit(cache=True)
def _input_row(j, ub_base, per, conv_width, pitch, stride, dy, dx):
    """The UB row of output vector j's input (its low row when 16-bit).  conv_width 0
    means a plain MatrixMultiply (vector j at UB row ub_base + j); otherwise the pixel of
    tap (dy, dx) feeding output pixel j of a conv_width-wide image."""
    if conv_width == 0:
        return ub_base + per * j
    y = j // conv_width
    x = j - y * conv_width
    return ub_base + per * ((y * stride + dy) * pitch + x * stride + dx)


@njit(cache=True)
def _store_products(c, m, acc, acc_rows_base, first, overwrite):
    """Accumulator rows for output vectors first..first+m-1 (+)= c[:m], int32 wrapping.
    float32 products are below 2^24 and convert straight to int32; float64 ones (16-bit
    modes, up to 2^41) go through int64 and wrap."""
    n = c.shape[1]
    narrow = c.itemsize == 4                 # float32 staging
    for r in range(m):
        dst = acc[acc_rows_base + first + r]
        cr = c[r]
        if narrow:
            if overwrite:
                for j in range(n):
                    dst[j] = np.int32(cr[j])
            else:
                for j in range(n):
                    dst[j] = np.int32(dst[j] + np.int32(cr[j]))
        elif overwrite:
            for j in range(n):
                dst[j] = np.int32(np.int64(cr[j]))
        else:
            for j in range(n):
                dst[j] = np.int32(np.int64(dst[j]) + np.int64(cr[j]))


@njit(cache=True)
def _mmc_iteration(ub, acc, w, x, c, use_blas, flags, ub_base, acc_base, count,
                   conv_width, pitch, stride, dy, dx, overwrite):
    """One iteration on the float path: `count` output vectors, chunked through the
    staging buffers."""
    unsigned_in = (flags & MMC_UNSIGNED_IN) != 0
    wide_in = (flags & MMC_WIDE_IN) != 0
    per = 2 if wide_in else 1
    chunk = x.shape[0]
    for first in range(0, count, chunk):
        m = min(chunk, count - first)
        for r in range(m):
            u = _input_row(first + r, ub_base, per, conv_width, pitch, stride, dy, dx)
            _load_vector(ub, u, x, r, unsigned_in, wide_in)
        if use_blas:
            _gemm.gemm_blas(x, w, c, m)
        else:
            _gemm.matmul_nt(x, w, c, m)            # w is transposed on this path
        _store_products(c, m, acc, acc_base, first, overwrite)


@njit(cache=True)
def _mmc_iteration_int8(ub, acc, scratch, flags, ub_base, acc_base, count,
                        conv_width, pitch, stride, dy, dx, overwrite, k_live):
    """One iteration on the int8 kernel: the UB reads and accumulator writes happen in C,
    this lists the input rows.  A 16-bit operand takes one pass per byte (low byte rows,
    then high byte rows), each product shifted by its bytes' weight."""
    rows = scratch.rows8
    chunk = rows.shape[0]
    wide_in = (flags & MMC_WIDE_IN) != 0
    wide_w = (flags & MMC_WIDE_W) != 0
    per = 2 if wide_in else 1
    if _one_pass16(flags, scratch):
        for first in range(0, count, chunk):
            m = min(chunk, count - first)
            for r in range(m):
                rows[r] = _input_row(first + r, ub_base, per, conv_width, pitch, stride, dy, dx)
            _native.mmc_rows16(ub, rows, m, scratch.packed8[0], scratch.bias8[0],
                               (flags & MMC_UNSIGNED_IN) == 0, wide_in,
                               (flags & MMC_UNSIGNED_W) == 0, wide_w, acc, acc_base + first,
                               overwrite, scratch.options[_OPT_INT8_THREADS])
        return
    for first in range(0, count, chunk):
        m = min(chunk, count - first)
        first_pass = True
        for xp in range(per):
            signed_x, x_shift = _byte_part(xp, wide_in, (flags & MMC_UNSIGNED_IN) != 0)
            for r in range(m):
                rows[r] = xp + _input_row(first + r, ub_base, per, conv_width, pitch, stride,
                                          dy, dx)
            for wp in range(2 if wide_w else 1):
                signed_w, w_shift = _byte_part(wp, wide_w, (flags & MMC_UNSIGNED_W) != 0)
                _native.mmc_rows(ub, rows, m, scratch.packed8[2 * wp + xp],
                                 scratch.bias8[2 * wp + xp], signed_x, signed_w, acc,
                                 acc_base + first, overwrite and first_pass, x_shift + w_shift,
                                 scratch.options[_OPT_INT8], scratch.options[_OPT_INT8_THREADS],
                                 k_live)
                first_pass = False


# ----------------------------------------------------------------------------- padded tiles
# A compiled layer smaller than the array leaves most of its weight tile zero (the digits
# CNN's tiles hold 8 x 16 non-zero weights of 256 x 256).  Weight rows outside the tile's
# bounding box of non-zero bytes multiply their inputs by zero, and its columns outside the
# box get zero products: so the box alone gives the same accumulators, exactly -- columns
# outside it are written 0 by an overwriting MatrixMultiply and left as they are by an
# accumulating one (adding 0).  During a data-path run (the weight image cannot change
# then) each tile's box is found once and a tile whose box is small runs as direct integer
# loops over the box (_mmc_iteration_box), with no packing, no tile compare and no GEMM.
# 8-bit operands only (H and D keep the general kernels).


@njit(cache=True)
def _find_box(tile, out):
    """out[0:4] = (k0, k1, j0, j1): the rows k0..k1-1 and columns j0..j1-1 that hold every
    non-zero byte of the (N, N) tile; (0, 0, 0, 0) when it is all zero."""
    n = tile.shape[1]
    columns = np.zeros(n, np.uint8)          # OR of every row, column by column
    k0, k1 = n, 0
    for k in range(n):
        row = tile[k]
        seen = np.uint8(0)
        for j in range(n):
            columns[j] |= row[j]
            seen |= row[j]
        if seen != 0:
            k0 = min(k0, k)
            k1 = k + 1
    if k1 == 0:
        out[0], out[1], out[2], out[3] = 0, 0, 0, 0
        return
    j0, j1 = n, 0
    for j in range(n):
        if columns[j] != 0:
            j0 = min(j0, j)
            j1 = j + 1
    out[0], out[1], out[2], out[3] = k0, k1, j0, j1


@njit(cache=True)
def _tile_box(weights, index, scratch):
    """Tile `index`'s bounding box (_find_box) as a view (k0, k1, j0, j1), found once per
    data-path run (the cache entry carries the run's number)."""
    boxes = scratch.boxes
    entry = boxes[index % boxes.shape[0]]
    epoch = scratch.options[_OPT_EPOCH]
    if entry[0] != epoch or entry[1] != index:
        _find_box(weights[index], entry[2:6])
        entry[0], entry[1] = epoch, index
    return entry[2:6]


BOX_FULL, BOX_DIRECT, BOX_COMPACT = 0, 1, 2


@njit(cache=True)
def live_rows(box, n):
    """The int8 kernel's k_live for a full tile of this box: the rows below its last
    non-zero one, rounded up to 16 (0: the whole tile, as for a box never found)."""
    k = (box[1] + 15) // 16 * 16
    return k if 0 < k < n else 0


@njit(cache=True)
def box_path(height, width, n, int8):
    """How a MatrixMultiply runs on a box of height x width weights in an N-wide array:
    BOX_DIRECT, numba's integer loops over the box (a few vector operations per input row:
    at most 16 rows of 16 columns' worth; on the float path any box up to N^2 / 16, and
    always at N < 16); BOX_COMPACT, the int8 kernel on the box copied into the corner of a
    smaller square tile (its side rounded up to 16, at most N / 2: a 64 x 64 box of a
    256-wide array runs 16 times fewer MACs); else BOX_FULL, the whole tile."""
    if height * width == 0:
        return BOX_DIRECT
    if not int8:
        return BOX_DIRECT if height * width <= max(n * n // 16, 64) else BOX_FULL
    if height * ((width + 15) // 16) <= 16:
        return BOX_DIRECT
    side = (max(height, width) + 15) // 16 * 16
    return BOX_COMPACT if 2 * side <= n else BOX_FULL


@njit(cache=True)
def _compact_side(box):
    return (max(box[1] - box[0], box[3] - box[2]) + 15) // 16 * 16


@njit(cache=True)
def _box_plan(weights, active, flags, scratch, box, int8):
    """The path of this MatrixMultiply (box_path; BOX_FULL outside a data-path run and for
    16-bit operands, `box` then left as it is), its tile's box in `box` (for BOX_FULL too:
    live_rows), and the box's weights made ready: converted
    into scratch.box_w (row-major, j1 - j0 wide) for BOX_DIRECT, packed for the int8 kernel
    as the corner of a square tile (scratch.box_packed, box_bias) for BOX_COMPACT."""
    if scratch.options[_OPT_TRUSTED] == 0 or (flags & (MMC_WIDE_IN | MMC_WIDE_W)) != 0:
        return BOX_FULL
    o = scratch.options
    mode = (flags & (MMC_UNSIGNED_W | MMC_UNSIGNED_IN)) + (4096 if int8 else 0)
    if o[_OPT_PLAN] == active[0] and o[_OPT_PLAN + 1] == mode \
            and o[_OPT_PLAN + 2] == o[_OPT_EPOCH]:
        # the same tile in the same mode as the last plan of this run (a MatrixMultiply
        # without S after the one that switched it in): its weights are ready
        for q in range(4):
            box[q] = o[_OPT_PLAN + 4 + q]
        return o[_OPT_PLAN + 3]
    found = _tile_box(weights, active[0], scratch)
    k0, k1, j0, j1 = found[0], found[1], found[2], found[3]
    path = box_path(k1 - k0, j1 - j0, weights.shape[1], int8)
    o[_OPT_PLAN], o[_OPT_PLAN + 1], o[_OPT_PLAN + 2] = active[0], mode, o[_OPT_EPOCH]
    o[_OPT_PLAN + 3] = path
    o[_OPT_PLAN + 4], o[_OPT_PLAN + 5], o[_OPT_PLAN + 6], o[_OPT_PLAN + 7] = k0, k1, j0, j1
    box[0], box[1], box[2], box[3] = k0, k1, j0, j1
    if path == BOX_FULL:
        return path
    tile = weights[active[0]]
    width = j1 - j0
    if path == BOX_DIRECT:
        w = scratch.box_w
        unsigned_w = (flags & MMC_UNSIGNED_W) != 0
        for k in range(k0, k1):
            base = (k - k0) * width
            for j in range(width):
                v = np.int32(tile[k, j0 + j])
                w[base + j] = v if unsigned_w else _signed8(v)
        return path
    side = _compact_side(box)
    corner = scratch.box_tile[:side * side].reshape((side, side))
    corner[:, :] = 0
    for k in range(k0, k1):
        dst = corner[k - k0]
        for j in range(width):
            dst[j] = tile[k, j0 + j]
    _native.pack_tile(corner, (flags & MMC_UNSIGNED_W) == 0, (flags & MMC_UNSIGNED_IN) == 0,
                      scratch.options[_OPT_INT8], scratch.box_packed, scratch.box_bias)
    return path


@njit(cache=True)
def _mmc_iteration_compact(ub, acc, scratch, box, flags, ub_base, acc_base, count,
                           conv_width, pitch, stride, dy, dx, overwrite):
    """One iteration on the int8 kernel with the box's corner tile (_box_plan): each input
    vector's box rows gathered into a row of the corner's width (in the float staging
    buffers, unused on this path), the products written to a staging row, then moved into
    the box's columns (the other columns zeroed or left, as in _mmc_iteration_box)."""
    k0, k1, j0, j1 = box[0], box[1], box[2], box[3]
    height, width = k1 - k0, j1 - j0
    side = _compact_side(box)
    rows = scratch.rows8
    chunk = rows.shape[0]
    inputs = scratch.x32.reshape(scratch.x32.size).view(np.uint8)
    products = scratch.c32.reshape(scratch.c32.size).view(np.int32)
    for first in range(0, count, chunk):
        m = min(chunk, count - first)
        x = inputs[:m * side].reshape((m, side))
        c = products[:m * side].reshape((m, side))
        for r in range(m):
            src = ub[_input_row(first + r, ub_base, 1, conv_width, pitch, stride, dy, dx)]
            box_input(x[r], src, k0, height)
            rows[r] = r
        compact_products(x, rows, m, scratch, flags, c)
        for r in range(m):
            box_result(acc[acc_base + first + r], c[r], j0, j1, width, overwrite)


@njit(cache=True)
def box_input(dst, src, k0, height):
    """A vector's box rows k0..k0+height-1 as one row of the corner tile's side (zeros
    after them)."""
    for k in range(height):
        dst[k] = src[k0 + k]
    for k in range(height, dst.shape[0]):
        dst[k] = 0


@njit(cache=True)
def compact_products(x, rows, m, scratch, flags, c):
    """The int8 kernel on the box's corner tile (scratch.box_packed): c[r] = x[r] @ box."""
    _native.mmc_rows(x, rows, m, scratch.box_packed, scratch.box_bias,
                     (flags & MMC_UNSIGNED_IN) == 0, (flags & MMC_UNSIGNED_W) == 0, c, 0,
                     True, 0, scratch.options[_OPT_INT8], scratch.options[_OPT_INT8_THREADS])


@njit(cache=True)
def switch_tiles(active, tiles, used, wide_weights) -> int:
    """MMC.S: the next tile of the Weight FIFO active (and its high-byte tile with D);
    the count of FIFO tiles taken so far."""
    active[0] = tiles[used]
    used += 1
    if wide_weights:
        active[1] = tiles[used]
        used += 1
    else:
        active[1] = -1
    return used


@njit(cache=True)
def box_result(dst, got, j0, j1, width, overwrite):
    """One accumulator row of a box MatrixMultiply (columns j0..j1 of the tile are live):
    the box's sums written (the other columns zeroed) or added."""
    if overwrite:
        dst[:j0] = 0
        dst[j1:] = 0
        dst[j0:j1] = got[:width]
    else:
        inside = dst[j0:j1]
        for j in range(width):
            inside[j] += got[j]


@njit(cache=True)
def _mmc_iteration_box(ub, acc, scratch, box, flags, ub_base, acc_base, count,
                       conv_width, pitch, stride, dy, dx, overwrite):
    """One iteration on the box alone (8-bit operands): for each output vector, the box's
    columns summed in int32 (wrapping: exact modulo 2^32 like the accumulators), the other
    columns zeroed (overwrite) or left (accumulate).  The sums live in a local array and
    each weight row is a row of a 2-D view, with no branch in the loop: LLVM vectorizes it
    (15 GMAC/s for a 64 x 64 box, five times the form with a shared buffer and a skip of
    zero inputs)."""
    k0, k1, j0, j1 = box[0], box[1], box[2], box[3]
    height, width = k1 - k0, j1 - j0
    w = scratch.box_w           # row-major, `width` wide: indexed, not a view per row
    sums = np.zeros(width, np.int32)
    unsigned_in = (flags & MMC_UNSIGNED_IN) != 0
    for r in range(count):
        u = _input_row(r, ub_base, 1, conv_width, pitch, stride, dy, dx)
        for j in range(width):
            sums[j] = 0
        for k in range(height):
            xv = np.int32(ub[u, k0 + k])
            if not unsigned_in:
                xv = _signed8(xv)
            base = k * width
            for j in range(width):
                sums[j] += xv * w[base + j]
        a = acc_base + r
        if overwrite:           # slice stores: 8x faster here than loops from j1 to n
            dst = acc[a]
            dst[:j0] = 0
            dst[j1:] = 0
            dst[j0:j1] = sums
        else:                   # indexed: no view (and its reference count) per row
            for j in range(width):
                acc[a, j0 + j] += sums[j]


@njit(cache=True)
def _execute_mmc(row, regs, ub, acc, weights, tiles, active, scratch):
    flags = row[COL_FLAGS]
    reps = _iterations(row)
    conv = (flags & MMC_CONV) != 0
    wide = (flags & (MMC_WIDE_IN | MMC_WIDE_W)) != 0
    if not wide:
        # float32 is exact while every partial sum fits 2^24 (N <= 256 always; larger arrays
        # with unsigned operands need float64).
        x_max = 255 if flags & MMC_UNSIGNED_IN else 128
        w_max = 255 if flags & MMC_UNSIGNED_W else 128
        wide = ub.shape[1] * x_max * w_max > (1 << 24)
    use_blas = scratch.options[_OPT_BLAS] != 0
    level = scratch.options[_OPT_INT8]
    both_wide = (flags & MMC_WIDE_IN) != 0 and (flags & MMC_WIDE_W) != 0
    # H with D takes four byte passes: at the AVX2 level the float64 GEMM is faster
    # (bench_kernels.py: 32 vs 49 GMAC/s); with VNNI the kernel is (85).
    int8 = level != 0 and not (both_wide and level == _native.LEVEL_AVX2)
    rep_ub, rep_acc = regs[REG_REP_UB_STRIDE], regs[REG_REP_ACC_STRIDE]
    height, width, pitch, kw, stride = _conv_geometry(row, regs)
    switch = (flags & MMC_SWITCH) != 0
    used = 0
    path = BOX_FULL
    box = np.zeros(4, np.int64)
    for i in range(reps):
        if switch:
            used = switch_tiles(active, tiles, used, (flags & MMC_WIDE_W) != 0)
        if switch or i == 0:        # without S the tile cannot change inside the instruction
            path = _box_plan(weights, active, flags, scratch, box, int8)
            if path != BOX_FULL:
                pass                # the box's weights are ready: nothing else to pack
            elif int8:
                _active_packed(weights, active, flags, scratch)
            elif wide:
                _active_weights(weights, active, flags, not use_blas, scratch.w64,
                                scratch.key64, scratch.raw64)
            else:
                _active_weights(weights, active, flags, not use_blas, scratch.w32,
                                scratch.key32, scratch.raw32)
        overwrite = (flags & MMC_OVERWRITE) != 0 and (i == 0 or (not conv and rep_acc != 0))
        if conv:
            ub_base, acc_base, count, cw = row[COL_UB], row[COL_ACC], height * width, width
            dy, dx = i // kw, i % kw
        else:
            ub_base, acc_base, count, cw = row[COL_UB] + i * rep_ub, row[COL_ACC] + i * rep_acc, \
                row[COL_LEN], 0
            dy, dx = 0, 0
        if path == BOX_COMPACT:
            _mmc_iteration_compact(ub, acc, scratch, box, flags, ub_base, acc_base, count, cw,
                                   pitch, stride, dy, dx, overwrite)
        elif path == BOX_DIRECT:
            _mmc_iteration_box(ub, acc, scratch, box, flags, ub_base, acc_base, count, cw,
                               pitch, stride, dy, dx, overwrite)
        elif int8:
            _mmc_iteration_int8(ub, acc, scratch, flags, ub_base, acc_base, count, cw, pitch,
                                stride, dy, dx, overwrite, live_rows(box, ub.shape[1]))
        elif wide:
            _mmc_iteration(ub, acc, scratch.w64, scratch.x64, scratch.c64, use_blas, flags,
                           ub_base, acc_base, count, cw, pitch, stride, dy, dx, overwrite)
        else:
            _mmc_iteration(ub, acc, scratch.w32, scratch.x32, scratch.c32, use_blas, flags,
                           ub_base, acc_base, count, cw, pitch, stride, dy, dx, overwrite)


# ----------------------------------------------------------------------------- Activate

_FN_NONE, _FN_RELU, _FN_SIGMOID, _FN_TANH, _FN_OPENTPU_SIGMOID = 0, 1, 2, 3, 4
_POOL_NONE, _POOL_MAX, _POOL_AVG = 0, 1, 2


@njit(cache=True)
def _to_q8(x, frac):
    """spec 5.5: the table index for accumulator value x with `frac` fractional bits."""
    if frac < 8:
        t = x << (8 - frac)
    elif frac == 8:
        t = x
    else:
        t = (x + (np.int64(1) << (frac - 9))) >> (frac - 8)
    return min(max(t, T_MIN), T_MAX)


@njit(cache=True)
def _opentpu_sigmoid(x):
    """OpenTPU's int(255 / (1 + exp(-x))) from its step table (spec/opentpu.md 4)."""
    if x == OPENTPU_INT32_MIN:          # OpenTPU's int32 negation wraps: exp(...) = 0
        return np.int64(255)
    t = min(max(x, OPENTPU_SIGMOID_LO), OPENTPU_SIGMOID_HI)
    return np.int64(OPENTPU_SIGMOID_TABLE[t - OPENTPU_SIGMOID_LO])


@njit(cache=True)
def _function_row(src, fn, frac, out):
    """out[j] = function(src[j]) in int64; one loop per function so each vectorizes (the
    table lookups gather)."""
    n = out.shape[0]
    if fn == _FN_RELU:
        for j in range(n):
            out[j] = max(np.int64(src[j]), 0)
    elif fn == _FN_SIGMOID:
        for j in range(n):
            out[j] = SIGMOID_TABLE[_to_q8(np.int64(src[j]), frac) - T_MIN]
    elif fn == _FN_TANH:
        for j in range(n):
            out[j] = TANH_TABLE[_to_q8(np.int64(src[j]), frac) - T_MIN]
    elif fn == _FN_OPENTPU_SIGMOID:
        for j in range(n):
            out[j] = _opentpu_sigmoid(np.int64(src[j]))
    else:
        for j in range(n):
            out[j] = src[j]


@njit(cache=True)
def _window_origin(o, out_w, sy, sx, top, left, pool):
    """The image row and column where output vector o's pooling window starts (may be
    negative: padding); o's own row when there is no pooling."""
    if pool == _POOL_NONE:
        return o, 0
    oy = o // out_w
    return oy * sy - top, (o - oy * out_w) * sx - left


@njit(cache=True)
def _gather_window(acc, a0, o, fn, frac, pool, k, pool_width, buf, tmp):
    """buf = the pooled function values of output vector o (int64, exact); tmp is a second
    row buffer for the window's other rows."""
    if pool == _POOL_NONE:
        _function_row(acc[a0 + o], fn, frac, buf)
        return
    n = buf.shape[0]
    if pool_width == 0:
        rows, cols, start, width = 1, k, a0 + o * k, 0
    else:
        out_w = pool_width // k
        oy = o // out_w
        ox = o - oy * out_w
        rows, cols, start, width = k, k, a0 + oy * k * pool_width + ox * k, pool_width
    _function_row(acc[start], fn, frac, buf)
    for dy in range(rows):
        for dx in range(cols):
            if dy == 0 and dx == 0:
                continue
            _function_row(acc[start + dy * width + dx], fn, frac, tmp)
            if pool == _POOL_MAX:
                for j in range(n):
                    buf[j] = max(buf[j], tmp[j])
            else:
                for j in range(n):
                    buf[j] += tmp[j]
    if pool == _POOL_AVG:
        _floor_divide_row(buf, rows * cols, buf.shape[0])


@njit(cache=True)
def _floor_divide_row(buf, count, n):
    """buf[j] = floor((buf[j] + count // 2) / count) for j < n, exactly.  A float64
    quotient is within 2^-5 of the true one (|numerator| < 2^48), so its floor is off by at
    most one and one integer remainder test fixes it; unlike an int64 division this
    vectorizes."""
    half = count // 2
    inv = 1.0 / count
    for j in range(n):
        a = buf[j] + half
        q = np.int64(np.floor(a * inv))
        r = a - q * count
        q -= r < 0
        q += r >= count
        buf[j] = q


@njit(cache=True)
def _requantize_store(buf, ub, u, mult, shift, zero, out_kind):
    """Requantize buf (int64) and write it as `out_kind` at UB row u (u, u+1 for int16).
    With shift = 0 the rounding term is 0 and `>> 0` is the identity, so one formula
    serves both cases; |x * mult| <= 2^62 leaves room for the rounding term in int64."""
    n = buf.shape[0]
    rounding = (np.int64(1) << (shift - 1)) if shift > 0 else np.int64(0)
    if out_kind == ACT_OUT_INT8:
        for j in range(n):
            y = ((buf[j] * mult + rounding) >> shift) + zero
            ub[u, j] = min(max(y, -128), 127) & 0xFF
    elif out_kind == ACT_OUT_UINT8:
        for j in range(n):
            y = ((buf[j] * mult + rounding) >> shift) + zero
            ub[u, j] = min(max(y, 0), 255)
    elif out_kind == ACT_OUT_INT16:
        for j in range(n):
            y = min(max(((buf[j] * mult + rounding) >> shift) + zero, -32768), 32767)
            ub[u, j] = y & 0xFF
            ub[u + 1, j] = (y >> 8) & 0xFF
    else:       # the reset clip bounds still clip to int32 before the low 8 bits
        for j in range(n):
            y = ((buf[j] * mult + rounding) >> shift) + zero
            ub[u, j] = min(max(y, _INT32_MIN), _INT32_MAX) & 0xFF


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_SHIFT_MAX_P = 46           # P's shift byte saturates here: count << shift stays below 2^63


@njit(cache=True)
def _apply_fn(v, fn, frac):
    """Step 1 of Activate on one int64 value (the scalar form of _function_row)."""
    if fn == _FN_RELU:
        return max(v, 0)
    if fn == _FN_SIGMOID:
        return SIGMOID_TABLE[_to_q8(v, frac) - T_MIN]
    if fn == _FN_TANH:
        return TANH_TABLE[_to_q8(v, frac) - T_MIN]
    if fn == _FN_OPENTPU_SIGMOID:
        return _opentpu_sigmoid(v)
    return v


@njit(cache=True)
def _int32_plane(ub, r):
    """Row r..r+3 of the UB as one int32 per column (little-endian byte planes)."""
    n = ub.shape[1]
    out = np.empty(n, np.int64)
    for j in range(n):
        v = np.int64(ub[r, j]) | (np.int64(ub[r + 1, j]) << 8) | \
            (np.int64(ub[r + 2, j]) << 16) | (np.int64(ub[r + 3, j]) << 24)
        out[j] = v - ((v & 0x80000000) << 1)
    return out


@njit(cache=True)
def _round_half_even_div(p, d):
    """round(p / d), ties to even, exactly (d > 0)."""
    q = p // d
    r2 = 2 * (p - q * d)
    if r2 > d or (r2 == d and (q & 1) == 1):
        q += 1
    return q


@njit(cache=True)
def _float32_of_bits(word):
    """The IEEE 754 float32 whose bits are the low 32 of `word`, as a float64 (exact)."""
    u = word & 0xFFFFFFFF
    sign = -1.0 if (u >> 31) & 1 else 1.0
    exponent = (u >> 23) & 0xFF
    fraction = u & 0x7FFFFF
    if exponent == 0xFF:
        return sign * np.inf if fraction == 0 else np.nan
    if exponent == 0:                                   # subnormal
        return sign * math.ldexp(float(fraction), -149)
    return sign * math.ldexp(float(fraction | 0x800000), exponent - 150)


@njit(cache=True)
def _float_requantize(v, f):
    """P with act_float (spec/isa.md 5.5), MLAS's arithmetic: fl32(fl32(v) * f), rounded
    half to even, saturated to int32 (NaN -> 0).  v is an int32, f a float32 held in a
    float64: fl32(v) * f is exact in float64 (two 24-bit mantissas), so rounding it to
    float32 once is the float32 multiply."""
    p = np.float64(np.float32(np.float64(np.float32(np.float64(v))) * f))
    if p != p:
        return np.int64(0)
    r = np.rint(p)
    if r >= 2147483647.0:
        return np.int64(_INT32_MAX)
    if r <= -2147483648.0:
        return np.int64(_INT32_MIN)
    return np.int64(r)


@njit(cache=True)
def _copy_tail(ub, u, src, m):
    """ub[u, m:] = src[m:]: indexed, no view of the row (whose reference counting cost
    more than the copy), unsigned column indices (numba then drops its negative-index
    wrap, which made LLVM copy byte by byte) so the loop becomes a block copy."""
    for j in range(m, ub.shape[1]):
        c = np.uint64(j)
        ub[u, c] = src[c]


@njit(cache=True)
def _float_columns_vectorize(fmult, m, zero, lo, hi):
    """_act_dense_float32 gives _float_requantize's outputs for columns 0..m-1: every
    multiplier finite (so no product is NaN), the zero point and the (merged) bounds small
    (so the bounds less the zero point are exact float32 integers, and clamping the rounded
    product to them is saturating it to int32, adding the zero point and clamping)."""
    limit = 1 << 23
    if abs(zero) > limit or abs(lo) > limit or abs(hi) > limit:
        return False
    for j in range(m):
        if not np.isfinite(fmult[j]):
            return False
    return True


@njit(cache=True)
def _act_dense_float32(row, regs, acc, ub, length, bias, fmult, m, zero, lo, hi, relu,
                       table, lookup):
    """_act_dense_float for columns 0..m-1 (ReLU or no function, bounds merged,
    _float_columns_vectorize true) in float32 with no branch, so that it vectorizes: the
    product fl32(fl32(v) * f) is the float32 multiply itself; rint and the clamp to
    [lo - zero, hi - zero] are exact on integer-valued float32 below 2^25, and a product
    beyond int32 lands on the same bound as its saturation would (zero point and bounds
    within 2^23).  Columns m.. get a zero accumulator's outputs.  The table and those
    columns follow each row's loop, not a pass over every iteration's rows after them:
    iterations that write the same row (rep_ub_stride 0) would look it up twice."""
    n = fmult.shape[0]
    f32 = np.empty(n, np.float32)
    b32 = np.empty(n, np.int32)
    for j in range(n):
        f32[j] = np.float32(fmult[j])
        b32[j] = np.int32(((bias[j] - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN)
    low = np.float32(lo - zero)
    high = np.float32(hi - zero)
    floor = np.int32(0) if relu else np.int32(_INT32_MIN)
    zeros = np.zeros(n, np.uint8)
    for j in range(m, n):
        r = np.rint(np.float32(max(b32[j], floor)) * f32[j])
        zeros[j] = np.uint8((np.int32(min(max(r, low), high)) + zero) & 0xFF)
        if lookup:
            zeros[j] = table[zeros[j]]
    for i in range(_iterations(row)):
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(length):
            src = acc[a0 + o]
            u = u0 + _act_out_row(o, regs)
            dst = ub[u]
            for j in range(m):
                v = max(np.int32(src[j] + b32[j]), floor)       # the bias add wraps
                r = np.rint(np.float32(v) * f32[j])
                y = min(max(r, low), high)
                dst[j] = np.uint8((np.int32(y) + zero) & 0xFF)
            if lookup:
                for j in range(m):
                    dst[j] = table[dst[j]]
            if m < n:
                _copy_tail(ub, u, zeros, m)


@njit(cache=True)
def _act_dense_float(row, regs, acc, ub, length, bias, fmult, fn, frac, zero, lo, hi,
                     out_kind, table, lookup, columns=-1):
    """_execute_act_ext's arithmetic for a compiled Dense / Conv layer (P with act_float,
    no pooling, 8-bit output): one output row per accumulator row.  The clip bounds and the
    output type's saturation are one clamp (bounds merged before the loop) and the table a
    pass over the finished row, so the loop over a row has no branch on the data: ten times
    the general loop's speed (benchmarks/bench_kernels.py, ACT.RP)."""
    n = acc.shape[1]
    # clip then saturate = one clamp to the bounds moved into the type's range (also when
    # act_lo > act_hi: both give the upper bound)
    if out_kind == ACT_OUT_INT8:
        lo, hi = min(max(lo, -128), 127), min(max(hi, -128), 127)
    elif out_kind == ACT_OUT_UINT8:
        lo, hi = min(max(lo, 0), 255), min(max(hi, 0), 255)
    elif out_kind == ACT_OUT_INT16:
        _act_dense_float16(row, regs, acc, ub, length, bias, fmult, fn, frac, zero,
                           min(max(lo, -32768), 32767), min(max(hi, -32768), 32767), columns)
        return
    relu = fn == _FN_RELU
    other = fn != _FN_RELU and fn != _FN_NONE
    # columns from m on are zero in every row read: they take a zero row's outputs
    m = _zero_columns(row, regs, acc, length, columns)
    if not other and _float_columns_vectorize(fmult, n, zero, lo, hi):
        _act_dense_float32(row, regs, acc, ub, length, bias, fmult, m, zero, lo, hi, relu,
                           table, lookup)
        return
    zeros = np.zeros(n, np.uint8)
    for j in range(m, n):
        v = ((bias[j] - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN
        v = _apply_fn(v, fn, frac)
        zeros[j] = min(max(_float_requantize(v, fmult[j]) + zero, lo), hi) & 0xFF
        if lookup:
            zeros[j] = table[zeros[j]]
    for i in range(_iterations(row)):
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(length):
            a, u = a0 + o, u0 + _act_out_row(o, regs)
            for j in range(m):
                v = ((np.int64(acc[a, j]) + bias[j] - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN
                if relu:
                    v = max(v, 0)
                elif other:
                    v = _apply_fn(v, fn, frac)
                ub[u, j] = min(max(_float_requantize(v, fmult[j]) + zero, lo), hi) & 0xFF
            if lookup:
                for j in range(m):
                    ub[u, j] = table[ub[u, j]]
            if m < n:
                _copy_tail(ub, u, zeros, m)


@njit(cache=True)
def _act_dense_float16(row, regs, acc, ub, length, bias, fmult, fn, frac, zero, lo, hi,
                       columns=-1):
    """_act_dense_float for an int16 output (act_out = 2, no table): each output vector's
    low bytes at UB row u, high bytes at u + 1 (spec/isa.md 5.5), `lo`/`hi` the clip
    bounds already moved into int16's range."""
    n = acc.shape[1]
    relu = fn == _FN_RELU
    other = fn != _FN_RELU and fn != _FN_NONE
    m = _zero_columns(row, regs, acc, length, columns)
    zeros = np.zeros(n, np.int64)
    for j in range(m, n):
        v = _apply_fn(((bias[j] - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN, fn, frac)
        zeros[j] = min(max(_float_requantize(v, fmult[j]) + zero, lo), hi)
    for i in range(_iterations(row)):
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(length):
            a, u = a0 + o, u0 + 2 * _act_out_row(o, regs)
            for j in range(m):
                v = ((np.int64(acc[a, j]) + bias[j] - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN
                if relu:
                    v = max(v, 0)
                elif other:
                    v = _apply_fn(v, fn, frac)
                y = min(max(_float_requantize(v, fmult[j]) + zero, lo), hi)
                ub[u, j] = y & 0xFF
                ub[u + 1, j] = (y >> 8) & 0xFF
            for j in range(m, n):
                ub[u, j] = zeros[j] & 0xFF
                ub[u + 1, j] = (zeros[j] >> 8) & 0xFF


@njit(cache=True)
def _window_values(acc, r, bias, fn, frac, out, n):
    """out[j] = function(acc[r, j] + bias[j]) for j < n, the bias add wrapping like the
    accumulators (bias all zero without P: then it is acc[r, j] itself).  One loop per
    function, no branch on the data: it vectorizes.  (The row is indexed, not passed as
    a view: a view per window element cost its reference counting.)"""
    if fn == _FN_RELU:
        for j in range(n):
            out[j] = max(((np.int64(acc[r, j]) + bias[j] - _INT32_MIN) & 0xFFFFFFFF)
                         + _INT32_MIN, 0)
    elif fn == _FN_NONE:
        for j in range(n):
            out[j] = ((np.int64(acc[r, j]) + bias[j] - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN
    else:
        for j in range(n):
            out[j] = _apply_fn(((np.int64(acc[r, j]) + bias[j] - _INT32_MIN) & 0xFFFFFFFF)
                               + _INT32_MIN, fn, frac)


@njit(cache=True)
def _pow2_exponent(c):
    """e with c == 2^e, or -1."""
    if c <= 0 or (c & (c - 1)) != 0:
        return -1
    e = 0
    while (np.int64(1) << e) < c:
        e += 1
    return e


@njit(cache=True)
def _requantize_row(v, out, u, n, kind, count, mult, shifts, fmult, mult_r, shift_r, zero,
                    lo, hi, out_kind, table, lookup, tmp):
    """out[u, :n] = the 8-bit outputs of the pooled values v[:n] (int64; v is clobbered), as the
    general loop of _execute_act_ext computes them: kind 0 P with act_float, 1 P in fixed
    point, 2 the act_mult/act_shift registers; `count` the window's divisor for average
    pooling (0 for other pooling).  (_act_fast's row loop calls the same steps itself.)"""
    if kind == 0:
        _requantize_float(v, tmp, n, fmult, zero)
    elif kind == 1:
        _requantize_fixed(v, tmp, n, count, mult, shifts, zero)
    else:
        _requantize_registers(v, tmp, n, count, mult_r, shift_r, zero)
    lo8, hi8 = _bounds8(lo, hi, out_kind)
    _store_clamped(tmp, out, u, n, lo8, hi8, table, lookup)


# The steps of _requantize_row, each a leaf (no call taking arrays, no code after a
# branch): numba's reference-count pruning then removes the increments and decrements of
# their array arguments, which otherwise cost more than a narrow row's arithmetic.


@njit(cache=True)
def _requantize_float(v, tmp, n, fmult, zero):
    for j in range(n):
        tmp[j] = _float_requantize(min(max(v[j], _INT32_MIN), _INT32_MAX), fmult[j]) + zero


@njit(cache=True)
def _requantize_fixed(v, tmp, n, count, mult, shifts, zero):
    e = _pow2_exponent(max(count, 1))
    if e >= 0:
        # round(p / 2^(e + shift)) half to even, by shifts (_round_half_even_div's rule)
        for j in range(n):
            p = min(max(v[j], _INT32_MIN), _INT32_MAX) * mult[j]
            sh = e + shifts[j]
            q = p >> sh
            r = p - (q << sh)
            half = (np.int64(1) << sh) >> 1
            q += ((r > half) | ((r == half) & ((q & 1) == 1) & (sh > 0)))
            tmp[j] = q + zero
    else:
        c = np.int64(max(count, 1))
        for j in range(n):
            p = min(max(v[j], _INT32_MIN), _INT32_MAX) * mult[j]
            tmp[j] = _round_half_even_div(p, c << shifts[j]) + zero


@njit(cache=True)
def _requantize_registers(v, tmp, n, count, mult_r, shift_r, zero):
    if count > 0:
        _floor_divide_row(v, count, n)
    rounding = (np.int64(1) << (shift_r - 1)) if shift_r > 0 else np.int64(0)
    for j in range(n):
        tmp[j] = ((v[j] * mult_r + rounding) >> shift_r) + zero


@njit(cache=True)
def _bounds8(lo, hi, out_kind):
    """The clip bounds, then the output type's saturation: one clamp for the 8-bit types."""
    if out_kind == ACT_OUT_INT8:
        return min(max(lo, -128), 127), min(max(hi, -128), 127)
    if out_kind == ACT_OUT_UINT8:
        return min(max(lo, 0), 255), min(max(hi, 0), 255)
    return lo, hi


@njit(cache=True)
def _store_clamped(tmp, out, u, n, lo, hi, table, lookup):
    for j in range(n):
        out[u, j] = min(max(tmp[j], lo), hi) & 0xFF
    if lookup:
        for j in range(n):
            out[u, j] = table[out[u, j]]


@njit(cache=True)
def _zero_columns(row, regs, acc, length, columns=-1):
    """The least multiple of 16 (or N) from which every accumulator row this Activate reads
    (`length` rows from each iteration's start) is zero: N as soon as a row's last 16
    columns are not (a full-width layer pays one row's look), else one pass ORing the rows
    together, column by column (it vectorizes; cheaper than the work it saves on a layer
    narrower than the array).  `columns` >= 0 is such a bound the caller knows (the data
    path's plan, machine/plan.py: every accumulator column from there on is zero), taken
    as it is: any bound past the last non-zero column gives the same outputs."""
    n = acc.shape[1]
    if columns >= 0:
        return min(columns, n)
    last = max(n - 16, 0)
    for i in range(_iterations(row)):   # a full-width layer ends here, at its first row
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        for r in range(a0, a0 + length):
            src = acc[r]
            tail = np.int32(0)
            for j in range(last, n):
                tail |= src[j]
            if tail != 0:
                return n
    seen = np.zeros(n, np.int32)
    for i in range(_iterations(row)):
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        for r in range(a0, a0 + length):
            src = acc[r]
            for j in range(n):
                seen[j] |= src[j]
    m = n
    while m > 0 and seen[m - 1] == 0:
        m -= 1
    return min((m + 15) // 16 * 16, n)


@njit(cache=True)
def _act_fast(row, regs, acc, ub, buf, fn, pool, kind, bias, mult, shifts, fmult, mult_r,
              shift_r, zero, lo, hi, out_kind, table, lookup, img_w, img_h, kh, kw, sy, sx,
              top, left, out_w, out_rows, count_pad, columns=-1):
    """_execute_act_ext's general loop for 8-bit outputs, a row at a time: each window
    element's row through its function (_window_values), pooled into buf[0] by a loop with
    no branch on the data, then requantized and stored (_requantize_row).  Returns False,
    having done nothing, when a window holds no image element (then the general loop keeps
    its own rule for it)."""
    for o in range(out_rows):                 # every window must see the image
        y0, x0 = _window_origin(o, out_w, sy, sx, top, left, pool)
        if min(y0 + kh, img_h) <= max(y0, 0) or min(x0 + kw, img_w) <= max(x0, 0):
            return False
    n = acc.shape[1]
    frac = regs[REG_FN_IN_FRAC]
    pooled = buf[0]
    tmp = buf[1]
    # Without average pooling, a column whose accumulators (in every row this Activate
    # reads) are all zero gives the output of a zero row in every window: columns from m on
    # (_zero_columns) take `zeros` as they are.
    m = n if pool == _POOL_AVG else _zero_columns(row, regs, acc, img_w * img_h, columns)
    zero_row = np.zeros((1, n), np.uint8)
    if m < n:
        _window_values(np.zeros((1, n), np.int32), 0, bias, fn, frac, pooled, n)
        _requantize_row(pooled, zero_row, 0, n, kind, 0, mult, shifts, fmult, mult_r, shift_r,
                        zero, lo, hi, out_kind, table, lookup, tmp)
    zeros = zero_row[0]
    lo8, hi8 = _bounds8(lo, hi, out_kind)
    for i in range(_iterations(row)):
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(out_rows):
            y0, x0 = _window_origin(o, out_w, sy, sx, top, left, pool)
            count = 0
            for yy in range(max(y0, 0), min(y0 + kh, img_h)):
                for xx in range(max(x0, 0), min(x0 + kw, img_w)):
                    r = a0 + yy * img_w + xx
                    if count == 0:
                        _window_values(acc, r, bias, fn, frac, pooled, m)
                    else:
                        _window_values(acc, r, bias, fn, frac, tmp, m)
                        if pool == _POOL_MAX:
                            for j in range(m):
                                pooled[j] = max(pooled[j], tmp[j])
                        else:
                            for j in range(m):
                                pooled[j] += tmp[j]
                    count += 1
            if pool == _POOL_AVG and count_pad:
                count = kh * kw
            u = u0 + _act_out_row(o, regs)
            # _requantize_row's steps, called from here: it would cost its arguments'
            # reference counts per row (see _requantize_float)
            if kind == 0:
                _requantize_float(pooled, tmp, m, fmult, zero)
            elif kind == 1:
                _requantize_fixed(pooled, tmp, m, count if pool == _POOL_AVG else 0, mult,
                                  shifts, zero)
            else:
                _requantize_registers(pooled, tmp, m, count if pool == _POOL_AVG else 0,
                                      mult_r, shift_r, zero)
            _store_clamped(tmp, ub, u, m, lo8, hi8, table, lookup)
            if m < n:
                _copy_tail(ub, u, zeros, m)
    return True


@njit(cache=True)
def _execute_act_ext(row, regs, acc, ub, buf, profile, fn, pool, fast=True, columns=-1):
    """Activate with the features added for compiled networks (spec/isa.md 5.5): P's per-column
    bias and requantization, L's table, the clip bounds and strided, padded 2-D pooling.  The
    original path (_execute_act) stays as it was for programs that use none of them."""
    flags = row[COL_FLAGS]
    n = acc.shape[1]
    opentpu = profile == PROFILE_OPENTPU
    per_col = (flags & ACT_PER_COLUMN) != 0 and not opentpu
    lookup = (flags & ACT_LOOKUP) != 0 and not opentpu
    bias = np.zeros(n, np.int64)
    mult = np.zeros(n, np.int64)
    shifts = np.zeros(n, np.int64)
    fmult = np.zeros(n, np.float64)
    as_float = regs[REG_ACT_FLOAT] != 0
    if per_col:
        p0 = regs[REG_ACT_PARAMS]
        bias = _int32_plane(ub, p0)
        mult = _int32_plane(ub, p0 + 4)
        bits = np.empty(n, np.uint32)
        for j in range(n):
            shifts[j] = min(np.int64(ub[p0 + 8, j]), _SHIFT_MAX_P)
            bits[j] = np.uint32(mult[j] & 0xFFFFFFFF)
        # the float32s of those bits, widened exactly (_float32_of_bits, without its
        # per-column ldexp: any NaN stays a NaN, which is all its readers look at)
        floats = bits.view(np.float32)
        for j in range(n):
            fmult[j] = np.float64(floats[j])
    table = np.zeros(256, np.int64)
    if lookup:
        t0 = regs[REG_ACT_TABLE]
        for i in range(256):
            table[i] = ub[t0 + i // n, i % n]
    out_kind = regs[REG_ACT_OUT]
    mult_r, shift_r, zero = regs[REG_ACT_MULT], regs[REG_ACT_SHIFT], regs[REG_ACT_ZERO]
    lo, hi = regs[REG_ACT_LO], regs[REG_ACT_HI]
    if opentpu:
        out_kind, mult_r, shift_r, zero, lo, hi = ACT_OUT_WRAP8, 1, 0, 0, _INT32_MIN, _INT32_MAX
    rounding = (np.int64(1) << (shift_r - 1)) if shift_r > 0 else np.int64(0)
    per = 2 if out_kind == ACT_OUT_INT16 else 1
    frac = regs[REG_FN_IN_FRAC]
    length = row[COL_LEN]
    # The pooling grid: windows of kh x kw image elements at strides sy x sx, padded by
    # `top` rows above and `left` columns left.
    k, width = regs[REG_POOL_SIZE], regs[REG_POOL_WIDTH]
    if pool == _POOL_NONE:
        img_w, kh, kw, sy, sx, top, left, out_w = 1, 1, 1, 1, 1, 0, 0, 1
        out_rows = length
    elif width == 0:                 # 1-D: groups of k consecutive rows
        img_w, kh, kw, sy, sx, top, left, out_w = length, 1, k, k, k, 0, 0, length // k
        out_rows = length // k
    else:
        _ok, kh, kw, sy, sx, top, left, oh, out_w = _pool_geometry(length, width, regs)
        img_w = width
        out_rows = oh * out_w
    img_h = length // img_w
    count_pad = regs[REG_POOL_COUNT_PAD] != 0
    acc_buf = buf[0]
    if pool == _POOL_NONE and per_col and as_float and fast and (
            out_kind != ACT_OUT_INT16 or not lookup):
        _act_dense_float(row, regs, acc, ub, length, bias, fmult, fn, frac, zero, lo, hi,
                         out_kind, table, lookup, columns)
        return
    if out_kind != ACT_OUT_INT16 and fast:
        kind = (0 if as_float else 1) if per_col else 2
        if _act_fast(row, regs, acc, ub, buf, fn, pool, kind, bias, mult, shifts, fmult, mult_r,
                     shift_r, zero, lo, hi, out_kind, table, lookup, img_w, img_h, kh, kw, sy,
                     sx, top, left, out_w, out_rows, count_pad, columns):
            return
    for i in range(_iterations(row)):
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(out_rows):
            y0, x0 = _window_origin(o, out_w, sy, sx, top, left, pool)
            count = 0
            for yy in range(max(y0, 0), min(y0 + kh, img_h)):
                for xx in range(max(x0, 0), min(x0 + kw, img_w)):
                    r = a0 + yy * img_w + xx
                    for j in range(n):
                        v = np.int64(acc[r, j])
                        if per_col:         # the bias add wraps like the accumulators
                            v = ((v + bias[j] - _INT32_MIN) & 0xFFFFFFFF) + _INT32_MIN
                        v = _apply_fn(v, fn, frac)
                        if count == 0:
                            acc_buf[j] = v
                        elif pool == _POOL_MAX:
                            acc_buf[j] = max(acc_buf[j], v)
                        else:
                            acc_buf[j] += v
                    count += 1
            if pool == _POOL_AVG and count_pad:
                count = kh * kw
            u = u0 + per * _act_out_row(o, regs)
            for j in range(n):
                v = acc_buf[j]
                if per_col and as_float:     # the count is in the multiplier
                    v = min(max(v, _INT32_MIN), _INT32_MAX)
                    y = _float_requantize(v, fmult[j]) + zero
                elif per_col:
                    c = count if pool == _POOL_AVG else 1
                    v = min(max(v, _INT32_MIN), _INT32_MAX)
                    y = _round_half_even_div(v * mult[j], np.int64(c) << shifts[j]) + zero
                else:
                    if pool == _POOL_AVG:
                        v = (v + count // 2) // count
                    y = ((v * mult_r + rounding) >> shift_r) + zero
                y = min(max(y, lo), hi)
                if out_kind == ACT_OUT_INT8:
                    b = min(max(y, -128), 127) & 0xFF
                elif out_kind == ACT_OUT_UINT8:
                    b = min(max(y, 0), 255)
                elif out_kind == ACT_OUT_INT16:
                    y16 = min(max(y, -32768), 32767)
                    b = y16 & 0xFF
                    b_hi = (y16 >> 8) & 0xFF
                    ub[u + 1, j] = table[b_hi] if lookup else b_hi
                else:
                    b = y & 0xFF
                ub[u, j] = table[b] if lookup else b


@njit(cache=True)
def _uses_act_extensions(row, regs):
    """True when an Activate needs _execute_act_ext (any feature of spec/isa.md 5.5 added for
    compiled networks)."""
    return (row[COL_FLAGS] & (ACT_PER_COLUMN | ACT_LOOKUP)) != 0 \
        or regs[REG_ACT_LO] != _INT32_MIN or regs[REG_ACT_HI] != _INT32_MAX \
        or regs[REG_ACT_UB_PITCH] != 0 \
        or ((regs[REG_POOL_STRIDE] != 0 or regs[REG_POOL_SIZE_X] != 0)
            and regs[REG_POOL_WIDTH] != 0
            and (row[COL_FLAGS] & (ACT_MAXPOOL | ACT_AVGPOOL)) != 0)


@njit(cache=True)
def _execute_act(row, regs, acc, ub, buf, profile, columns=-1):
    flags = row[COL_FLAGS]
    reps = _iterations(row)
    fn = _FN_NONE
    if flags & ACT_RELU:
        fn = _FN_RELU
    elif flags & ACT_SIGMOID:
        fn = _FN_OPENTPU_SIGMOID if profile == PROFILE_OPENTPU else _FN_SIGMOID
    elif flags & ACT_TANH:
        fn = _FN_TANH
    pool = _POOL_NONE
    if flags & ACT_MAXPOOL:
        pool = _POOL_MAX
    elif flags & ACT_AVGPOOL:
        pool = _POOL_AVG
    if _uses_act_extensions(row, regs):
        _execute_act_ext(row, regs, acc, ub, buf, profile, fn, pool, True, columns)
        return
    ok, out_rows = _act_shape(row, regs)
    out_kind = regs[REG_ACT_OUT]
    mult, shift, zero = regs[REG_ACT_MULT], regs[REG_ACT_SHIFT], regs[REG_ACT_ZERO]
    if profile == PROFILE_OPENTPU:        # spec/opentpu.md 4: no requantization, low 8 bits
        out_kind, mult, shift, zero = ACT_OUT_WRAP8, 1, 0, 0
    per = 2 if out_kind == ACT_OUT_INT16 else 1
    frac, k, pool_width = regs[REG_FN_IN_FRAC], regs[REG_POOL_SIZE], regs[REG_POOL_WIDTH]
    for i in range(reps):
        a0 = row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE]
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(out_rows):
            _gather_window(acc, a0, o, fn, frac, pool, k, pool_width, buf[0], buf[1])
            _requantize_store(buf[0], ub, u0 + per * o, mult, shift, zero, out_kind)


@njit(cache=True)
def _overlaps(x, nx, y, ny):
    """Rows x..x+nx-1 and y..y+ny-1 share a row."""
    return x < y + ny and y < x + nx


@njit(cache=True)
def _vector_float_row(kind, a, ra_, b, rb_, out, values, ra, rb, za, zb, zc, unsigned,
                      table, lookup):
    """VADD / VMUL with vec_float (spec/isa.md 5.11, 8-bit operands only): onnxruntime's
    float32 arithmetic on vector ra_ of a and rb_ of b.  ra, rb are float32; A * r + c is
    computed in float64 (A has 9 bits, r 24: the product is exact, and so is the sum at
    these magnitudes) and rounded once to float32, as the fused multiply-add MLAS uses."""
    fixed = np.float32(zc) - (ra * np.float32(za) + rb * np.float32(zb))   # float32 ops
    _load_vector(a, ra_, values, 0, unsigned, False)
    _load_vector(b, rb_, values, 1, unsigned, False)
    for j in range(out.shape[1]):
        x, y = values[0, j], values[1, j]
        if kind == _VEC_ADD:
            inner = np.float32(np.float64(y) * np.float64(rb) + np.float64(fixed))
            value = np.float32(np.float64(x) * np.float64(ra) + np.float64(inner))
            v = np.rint(np.float64(value))
        else:
            product = np.float32(np.float32(x - za) * np.float32(y - zb))
            v = np.rint(np.float64(np.float32(product * ra))) + zc
        if v != v:
            v = 0.0
        # saturate in float first: an infinity has no int64
        _store_result(out, j, np.int64(min(max(v, -256.0), 256.0)), False, unsigned)
    if lookup:
        _apply_table(out[0], table)


@njit(cache=True)
def _execute_vector(row, regs, ub):
    """VADD / VMUL (spec/isa.md 5.11): per iteration, every read before any write."""
    flags = row[COL_FLAGS]
    n = ub.shape[1]
    kind = _VEC_ADD if row[COL_OP] == OP_VADD else _VEC_MUL
    unsigned = (flags & VEC_UNSIGNED) != 0
    broadcast = (flags & VEC_BROADCAST) != 0
    lookup = (flags & VEC_LOOKUP) != 0
    rows_a, rows_b, rows_c = vector_operand_rows(row)
    per_c = _vector_rows_per(flags)[2]
    table = np.zeros(256, np.int64)
    if lookup:
        t0 = regs[REG_ACT_TABLE]
        for i in range(256):
            table[i] = ub[t0 + i // n, i % n]
    ma, mb, shift = regs[REG_VEC_MULT_A], regs[REG_VEC_MULT_B], regs[REG_VEC_SHIFT]
    za, zb, zc = regs[REG_VEC_ZERO_A], regs[REG_VEC_ZERO_B], regs[REG_VEC_ZERO_C]
    as_float = regs[REG_VEC_FLOAT] != 0
    fa, fb = np.float32(_float32_of_bits(ma)), np.float32(_float32_of_bits(mb))
    length = row[COL_LEN]
    step = regs[REG_REP_UB_STRIDE]
    out = np.empty((2, n), np.uint8)         # one vector of C: one row, two when 16-bit
    values = np.empty((2, n), np.int64)      # A's and B's elements of one vector
    for i in range(_iterations(row)):
        a0 = row[COL_VA] + i * step
        b0 = row[COL_VB] if broadcast else row[COL_VB] + i * step
        c0 = row[COL_VC] + i * step
        a = ub[a0:a0 + rows_a]
        b = ub[b0:b0 + rows_b]
        # a shifted overlap with the destination (only a hand-made binary has one: the
        # assembler rejects it) must still read the old rows; in place (the same rows at
        # the same width: vector r is read before it is written) needs no copy, and B's
        # one vector is read before every write
        if _overlaps(a0, rows_a, c0, rows_c) and not (a0 == c0 and rows_a == rows_c):
            a = a.copy()
        if _overlaps(b0, rows_b, c0, rows_c) and (broadcast or not (b0 == c0 and rows_b == rows_c)):
            b = b.copy()
        for r in range(length):
            rb = 0 if broadcast else r
            if as_float:
                _vector_float_row(kind, a, r, b, rb, out, values, fa, fb, za, zb, zc,
                                  unsigned, table, lookup)
            else:
                _vector_row(kind, flags, a, r, b, rb, out, values, ma, mb, za, zb, shift, zc,
                            table)
            ub[c0 + per_c * r:c0 + per_c * (r + 1), :] = out[:per_c]


# ----------------------------------------------------------------------------- dispatch

_ACT_SHARED_VALUES = 1 << 14    # smaller Activates stay on _execute_act (no call into C)
_MMC_SHARED_MACS = 1 << 23      # mmc_int8.c's SPLIT_MACS: the kernel shares such calls


@njit(cache=True)
def _act_shared(row, regs, acc, ub, options, profile):
    """A large plain Activate (no pooling, ReLU or no function, no extension of
    _execute_act_ext) on the C kernel's threads (native.act_rows: the same arithmetic as
    _execute_act, rows shared among the MatrixMultiply's pool), so that in an MLP the
    Activates between the MatrixMultiplies do not leave the other cores idle and their
    threads polling.  Returns False, having done nothing, for any other Activate or without
    the kernel (int8 level 0).  (The scratch's options alone are passed: a tuple of arrays
    as an argument costs a reference count per array and call.)"""
    level = options[_OPT_INT8]
    flags = row[COL_FLAGS]
    if level == 0 or row[COL_LEN] * acc.shape[1] < _ACT_SHARED_VALUES \
            or (flags & (ACT_SIGMOID | ACT_TANH | ACT_MAXPOOL | ACT_AVGPOOL)) != 0 \
            or _uses_act_extensions(row, regs):
        return False
    out_kind = regs[REG_ACT_OUT]
    mult, shift, zero = regs[REG_ACT_MULT], regs[REG_ACT_SHIFT], regs[REG_ACT_ZERO]
    if profile == PROFILE_OPENTPU:        # as _execute_act: no requantization, low 8 bits
        out_kind, mult, shift, zero = ACT_OUT_WRAP8, 1, 0, 0
    relu = (flags & ACT_RELU) != 0
    for i in range(_iterations(row)):     # in order: iterations may write the same rows
        _native.act_rows(acc, row[COL_ACC] + i * regs[REG_REP_ACC_STRIDE], ub,
                         row[COL_UB] + i * regs[REG_REP_UB_STRIDE], row[COL_LEN], relu,
                         mult, shift, zero, out_kind, level, options[_OPT_INT8_THREADS])
    return True


@njit(cache=True)
def execute_activate(row, regs, acc, ub, options, row_buf, profile, columns):
    """An Activate, on the kernel's threads when large and plain (_act_shared); options and
    row_buf the scratch's; `columns` as _zero_columns takes it (-1: found from the
    accumulators)."""
    if not _act_shared(row, regs, acc, ub, options, profile):
        _execute_act(row, regs, acc, ub, row_buf, profile, columns)


@njit(cache=True)
def execute_instruction(row, regs, ub, acc, host, weights, tiles, active, scratch, profile):
    op = row[COL_OP]
    if op == OP_MMC:
        if scratch.options[_OPT_INT8] != 0 \
                and row[COL_LEN] * ub.shape[1] * ub.shape[1] >= _MMC_SHARED_MACS:
            _native.pool_prepare(scratch.options[_OPT_INT8_THREADS])
        _execute_mmc(row, regs, ub, acc, weights, tiles, active, scratch)
    elif op == OP_ACT:
        execute_activate(row, regs, acc, ub, scratch.options, scratch.row_buf, profile, -1)
    elif op == OP_VADD or op == OP_VMUL:
        _execute_vector(row, regs, ub)
    elif op == OP_RHM or op == OP_RHMA or op == OP_WHM or op == OP_WHMA:
        _execute_dma(row, regs, ub, host)

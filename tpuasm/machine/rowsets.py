"""The exact rows an instruction reads and writes, as sorted runs [lo, hi).

The core's footprint (kernels.footprint) is one bounding range per memory and direction:
what the scoreboard and the watchpoints compare.  A strided access leaves gaps in that
range -- repeats at rep_*_stride, the alternate DMA strides, a convolution's taps over a
pitched image, strided pooling windows, Activate's act_ub_pitch -- and "who wrote ub[N]"
must not name an instruction for a row in a gap.  These are the rows the data path
(kernels._execute_dma / _execute_mmc / _execute_act) touches, derived with the kernels' own
helpers (run as plain Python, pure.py).

`exact_runs(row, regs, profile, n)` -> [(memory code, is_write, runs)], runs an (k, 2) int64
array of disjoint sorted [lo, hi); the same accesses, in the same order, as `footprint`.
"""
from __future__ import annotations

import numpy as np

from . import kernels
from .decoded import (ACT_AVGPOOL, ACT_MAXPOOL, ACT_OUT_INT16, REG_ACT_OUT, COL_ACC, COL_FLAGS, COL_HOST, COL_LEN, COL_OP,
                      COL_UB, MMC_CONV, MMC_WIDE_IN, OP_ACT, OP_MMC, OP_RHM, OP_RHMA, OP_WHM,
                      OP_WHMA, REG_ACT_PARAMS, REG_ACT_TABLE, REG_ACT_UB_PITCH, REG_POOL_SIZE,
                      REG_POOL_STRIDE, REG_POOL_WIDTH, REG_REP_ACC_STRIDE, REG_REP_HOST_STRIDE,
                      REG_REP_UB_STRIDE)
from .decoded import COL_VA, COL_VB, COL_VC, OP_VADD, OP_VMUL, VEC_BROADCAST
from .kernels import MEM_ACC, MEM_HOST, MEM_UB
from .pure import python

_dma_steps = python(kernels._dma_steps)
_conv_geometry = python(kernels._conv_geometry)
_act_shape = python(kernels._act_shape)
_act_out_row = python(kernels._act_out_row)
_act_param_rows = python(kernels.act_param_rows)
_act_ub_rows = python(kernels._act_ub_rows)
_pool_geometry = python(kernels._pool_geometry)
_uses_ext = python(kernels._uses_act_extensions)
_vector_table_rows = python(kernels.vector_table_rows)
_vector_operand_rows = python(kernels.vector_operand_rows)


def strided(row, regs) -> bool:
    """Whether the instruction's accesses may have gaps (else its footprint is exact)."""
    op = int(row[COL_OP])
    if int(row[kernels.COL_REPEAT]) > 1 or op in (OP_RHMA, OP_WHMA):
        return True
    if op == OP_MMC:
        return bool(int(row[COL_FLAGS]) & MMC_CONV)
    if op == OP_ACT:
        return bool(int(row[COL_FLAGS]) & (ACT_MAXPOOL | ACT_AVGPOOL)) or \
            int(regs[REG_ACT_UB_PITCH]) != 0
    return False


def runs_of(starts, width: int) -> np.ndarray:
    """Disjoint sorted runs covering [s, s + width) for every s in `starts`."""
    starts = np.unique(np.asarray(starts, np.int64).ravel())
    if not len(starts) or width <= 0:
        return np.zeros((0, 2), np.int64)
    ends = starts + width
    # a new run where a start lies beyond the furthest end so far
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), bool)
    new[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(starts)) - 1
    return np.stack([starts[first], reach[last]], axis=1)


def _grid(base, outer_step, outer, inner_step, inner):
    """base + i * outer_step + k * inner_step, i < outer, k < inner."""
    return (base + outer_step * np.arange(max(outer, 0))[:, None]
            + inner_step * np.arange(max(inner, 0))[None, :])


def exact_runs(row, regs, profile: int = 0, array_size: int = 256) -> list:
    op = int(row[COL_OP])
    reps = max(int(row[kernels.COL_REPEAT]), 1)
    length = int(row[COL_LEN])
    if op in (OP_RHM, OP_RHMA, OP_WHM, OP_WHMA):
        if length <= 0:
            return []
        ub_step, host_step = (int(x) for x in _dma_steps(op, regs))
        host = runs_of(_grid(int(row[COL_HOST]), int(regs[REG_REP_HOST_STRIDE]), reps,
                             host_step, length), 1)
        ub = runs_of(_grid(int(row[COL_UB]), int(regs[REG_REP_UB_STRIDE]), reps, ub_step,
                           length), 1)
        reading_host = op in (OP_RHM, OP_RHMA)
        return [(MEM_HOST, not reading_host, host), (MEM_UB, reading_host, ub)]
    if op == OP_MMC:
        flags = int(row[COL_FLAGS])
        per = 2 if flags & MMC_WIDE_IN else 1
        if flags & MMC_CONV:
            height, width, pitch, kw, stride = (int(x) for x in _conv_geometry(row, regs))
            if height <= 0 or width <= 0 or kw <= 0:
                return []
            taps = np.arange(reps)
            dy, dx = taps // kw, taps % kw
            j = np.arange(height * width)
            y, x = j // width, j % width
            v = (y[None, :] * stride + dy[:, None]) * pitch + x[None, :] * stride + dx[:, None]
            ub = runs_of(int(row[COL_UB]) + per * v, per)
            acc = runs_of([int(row[COL_ACC])], height * width)
            return [(MEM_UB, False, ub), (MEM_ACC, True, acc)]
        if length <= 0:
            return []
        ub = runs_of(_grid(int(row[COL_UB]), int(regs[REG_REP_UB_STRIDE]), reps, 0, 1),
                     per * length)
        acc = runs_of(_grid(int(row[COL_ACC]), int(regs[REG_REP_ACC_STRIDE]), reps, 0, 1),
                      length)
        return [(MEM_UB, False, ub), (MEM_ACC, True, acc)]
    if op == OP_ACT:
        if length <= 0:
            return []
        a0 = _grid(int(row[COL_ACC]), int(regs[REG_REP_ACC_STRIDE]), reps, 0, 1).ravel()
        out = [(MEM_ACC, False, runs_of((a0[:, None] + _act_acc_rows(row, regs)[None, :]), 1))]
        p_rows, t_rows = (int(x) for x in _act_param_rows(row[COL_FLAGS], array_size))
        if p_rows > 0:
            out.append((MEM_UB, False, runs_of([int(regs[REG_ACT_PARAMS])], p_rows)))
        if t_rows > 0:
            out.append((MEM_UB, False, runs_of([int(regs[REG_ACT_TABLE])], t_rows)))
        ok, out_rows = _act_shape(row, regs)
        if _act_ub_rows(row, regs, profile) <= 0 or out_rows <= 0:
            return out
        # int16 results take two rows (the OpenTPU profile ignores act_out)
        per = 2 if regs[REG_ACT_OUT] == ACT_OUT_INT16 and profile != kernels.PROFILE_OPENTPU else 1
        u0 = _grid(int(row[COL_UB]), int(regs[REG_REP_UB_STRIDE]), reps, 0, 1).ravel()
        rows = np.array([_act_out_row(o, regs) for o in range(int(out_rows))], np.int64)
        out.append((MEM_UB, True, runs_of(u0[:, None] + per * rows[None, :], per)))
        return out
    if op in (OP_VADD, OP_VMUL):
        if length <= 0:
            return []
        step = int(regs[REG_REP_UB_STRIDE])
        flags = int(row[COL_FLAGS])
        # each iteration's rows: two a vector for a 16-bit operand, B's one vector with B
        rows_a, rows_b, rows_c = (int(x) for x in _vector_operand_rows(row))
        a = runs_of(_grid(int(row[COL_VA]), step, reps, 0, 1), rows_a)
        if flags & VEC_BROADCAST:
            b = runs_of([int(row[COL_VB])], rows_b)
        else:
            b = runs_of(_grid(int(row[COL_VB]), step, reps, 0, 1), rows_b)
        out = [(MEM_UB, False, a), (MEM_UB, False, b)]
        t_rows = int(_vector_table_rows(flags, array_size))
        if t_rows > 0:
            out.append((MEM_UB, False, runs_of([int(regs[REG_ACT_TABLE])], t_rows)))
        out.append((MEM_UB, True, runs_of(_grid(int(row[COL_VC]), step, reps, 0, 1), rows_c)))
        return out
    return []


def _act_acc_rows(row, regs) -> np.ndarray:
    """Accumulator rows (from the iteration's first) one Activate iteration reads: the whole
    image, but for strided pooling windows that skip rows or columns."""
    flags = int(row[COL_FLAGS])
    length = int(row[COL_LEN])
    k, width = int(regs[REG_POOL_SIZE]), int(regs[REG_POOL_WIDTH])
    pooled = flags & (ACT_MAXPOOL | ACT_AVGPOOL)
    if not pooled or width == 0 or int(regs[REG_POOL_STRIDE]) == 0 or not _uses_ext(row, regs):
        if pooled and width == 0 and k > 0:           # 1-D: groups of k consecutive rows
            return np.arange((length // k) * k, dtype=np.int64)
        return np.arange(length, dtype=np.int64)
    ok, kh, kw, sy, sx, top, left, oh, ow = (int(v) for v in _pool_geometry(length, width, regs))
    height = length // width
    ys = np.unique([y for oy in range(oh) for y in range(oy * sy - top, oy * sy - top + kh)
                    if 0 <= y < height])
    xs = np.unique([x for ox in range(ow) for x in range(ox * sx - left, ox * sx - left + kw)
                    if 0 <= x < width])
    return (ys[:, None] * width + xs[None, :]).ravel().astype(np.int64)

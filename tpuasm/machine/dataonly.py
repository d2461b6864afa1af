"""The data path alone: a program's effects in program order, with no pipeline timing.

TPU v1's timing never depends on the data, and the interlocks make every timed run
equivalent to executing the instructions one after another (the reference model's
semantics, which the differential tests hold the emulator to).  So once a program has run to
its halt in timing-only mode (which finds every fault: faults depend on instructions and
addresses alone), each later run with other data needs only the effects: Read_Weights queues
its tiles, a switching MatrixMultiply takes them, CFG sets registers, and every staged
instruction runs through the same kernel the pipelined core calls at retirement
(kernels.execute_instruction) -- or, where its work is known before the run (a MatrixMultiply
on a small box of its tile, the columns an Activate must compute), through the run's plan
(machine/plan.py), built once per call before the first batch.  Machine.run_data is the
entry point; it proves the program first and reports the proven cycle count.

Machine.run_batches runs one program over many host images in one call (run_batches here):
each batch starts from the state `load` leaves -- zero Unified Buffer and accumulators, reset
registers, an empty weight queue -- and only the rows the program can write are zeroed
between batches (_dirty_spans: every instruction's footprint, the bounding rows the core's
hazard checks use, so never fewer than it touches), less the rows whose first access is
known to overwrite them whole (an RHM's, an MMC.O's: _full_writes; an Activate's output
rows: _activate_writes), which never show the last batch's bytes.  Rows it never writes
keep their loaded zeros, so every batch sees exactly the memories a fresh load would give
it.  An accumulator row is zeroed only up to
its plan's `top`: its columns past it are zero at every point of every run.

Both mark the scratch for the run (_begin/_end): the weight image cannot change during it,
so the kernels find each weight tile's bounding box of non-zero bytes once per run and run a
padded tile's MatrixMultiply on its box alone (kernels.py, padded tiles).
"""
from __future__ import annotations

import numpy as np

from .core import OP_STAGE, PORT_WEIGHTS
from .decoded import (COL_ACC, COL_FLAGS, COL_HEIGHT, COL_LEN, COL_OP, COL_REG, COL_REPEAT,
                      COL_UB, COL_VALUE, COL_WIDTH, MMC_CONV, MMC_OVERWRITE, OP_CFG, OP_HLT,
                      OP_MMC, OP_RHM, REG_REP_ACC_STRIDE, REG_REP_UB_STRIDE, reset_registers)
from .decoded import ACT_OUT_INT16, OP_ACT, REG_ACT_OUT
from . import plan
from .jit import njit
from .kernels import (_OPT_EPOCH, _OPT_TRUSTED, MAX_FOOTPRINT, MEM_ACC, MEM_UB,
                      PROFILE_OPENTPU, _act_out_row, _act_shape, footprint)


@njit(cache=True)
def _begin(scratch):
    """Mark a data-path run in progress on this scratch: the weight image cannot change
    until _end, so the kernels may keep what they find in a tile for the run (its bounding
    box, kernels.py's padded tiles) under the run's new number."""
    scratch.options[_OPT_EPOCH] += 1
    scratch.options[_OPT_TRUSTED] = 1


@njit(cache=True)
def _end(scratch):
    scratch.options[_OPT_TRUSTED] = 0


@njit(cache=True)
def run_sequential(prog, regs, tiles, ub, acc, host, weights, active, scratch, profile):
    """Apply every instruction of `prog` up to its Halt, in program order (the program must
    be one that halts without a fault: nothing is checked here), through the run's plan
    (machine/plan.py).  Returns the Halt's index."""
    _begin(scratch)
    work = plan.build(prog, regs, weights, scratch, acc.shape[0])
    pc = plan.run_program(prog, regs, tiles, ub, acc, host, weights, active, scratch,
                          profile, work)
    _end(scratch)
    return pc


@njit(cache=True)
def _full_writes(row, regs, memory, out):
    """The rows of `memory` this instruction overwrites whole before anything reads them,
    exactly, as (start, stop) spans in out (returns how many; 0 for any instruction but a
    plain RHM into the UB and an overwriting MatrixMultiply into the accumulators, whose
    footprints are then not needed): RHM copies whole host rows, MMC.O writes all N
    accumulators of each vector's row (iteration 0 of a convolution, every iteration of a
    MatrixMultiply whose iterations move in the accumulators, else the first)."""
    op = row[COL_OP]
    reps = max(row[COL_REPEAT], 1)
    if op == OP_RHM and memory == MEM_UB:
        step = regs[REG_REP_UB_STRIDE]
        for i in range(reps):
            out[i, 0] = row[COL_UB] + i * step
            out[i, 1] = out[i, 0] + row[COL_LEN]
        return reps
    if op == OP_MMC and memory == MEM_ACC and (row[COL_FLAGS] & MMC_OVERWRITE) != 0:
        if (row[COL_FLAGS] & MMC_CONV) != 0:
            out[0, 0] = row[COL_ACC]
            out[0, 1] = row[COL_ACC] + row[COL_HEIGHT] * row[COL_WIDTH]
            return 1
        step = regs[REG_REP_ACC_STRIDE]
        count = reps if step != 0 else 1
        for i in range(count):
            out[i, 0] = row[COL_ACC] + i * step
            out[i, 1] = out[i, 0] + row[COL_LEN]
        return count
    return 0


@njit(cache=True)
def _activate_writes(row, regs, profile, state):
    """state[r] = 1 (overwritten first) for every UB row r this Activate writes that nothing
    touched before: an Activate writes each of its output rows whole (all N columns, the
    zero-column tail included; an int16 output's two rows), exactly the rows
    _act_out_row places, which the footprint's bounding range (a pitched image's gaps
    included) does not say."""
    ok, out_rows = _act_shape(row, regs)
    per = 2 if regs[REG_ACT_OUT] == ACT_OUT_INT16 and profile != PROFILE_OPENTPU else 1
    rows = state.shape[0]
    for i in range(max(row[COL_REPEAT], 1)):
        u0 = row[COL_UB] + i * regs[REG_REP_UB_STRIDE]
        for o in range(out_rows):
            u = u0 + per * _act_out_row(o, regs)
            for r in range(max(u, 0), min(u + per, rows)):
                if state[r] == 0:
                    state[r] = 1


@njit(cache=True)
def _dirty_spans(prog, regs, memory, rows, profile, array_size):
    """The rows of `memory` a batch must find zeroed, as sorted, disjoint (start, stop)
    spans: those the program may write less those whose first access is a
    whole-row overwrite (_full_writes), which never see what the last batch left.  Every
    other footprint entry (any read, a write not known to be whole) counts as a first
    access that may see the row, over its whole bounding range (CFGs replayed in order)."""
    state = np.zeros(rows, np.uint8)        # 0 untouched, 1 overwritten first, 2 may see it
    out = np.zeros((MAX_FOOTPRINT, 4), np.int64)
    full = np.zeros((64, 2), np.int64)
    for pc in range(prog.shape[0]):
        row = prog[pc]
        op = row[COL_OP]
        if op == OP_HLT:
            break
        if op == OP_CFG:
            regs[row[COL_REG]] = row[COL_VALUE]
            continue
        reps = max(row[COL_REPEAT], 1)
        if reps > full.shape[0]:
            full = np.zeros((reps, 2), np.int64)
        whole = _full_writes(row, regs, memory, full)
        activate = op == OP_ACT and memory == MEM_UB
        for k in range(footprint(row, regs, out, profile, array_size)):
            if out[k, 0] != memory or ((whole > 0 or activate) and out[k, 1] != 0):
                continue                    # another memory, or the write done exactly
            for r in range(max(out[k, 2], 0), min(out[k, 3], rows)):
                if state[r] == 0:
                    state[r] = 2
        for k in range(whole):
            for r in range(max(full[k, 0], 0), min(full[k, 1], rows)):
                if state[r] == 0:
                    state[r] = 1
        if activate:                        # after its parameter and table rows' reads
            _activate_writes(row, regs, profile, state)
    count = 0                               # the runs of 2s, counted, then listed
    for r in range(rows):
        if state[r] == 2 and (r == 0 or state[r - 1] != 2):
            count += 1
    spans = np.zeros((count, 2), np.int64)
    count = 0
    for r in range(rows):
        if state[r] == 2:
            if r == 0 or state[r - 1] != 2:
                spans[count, 0] = r
                count += 1
            spans[count - 1, 1] = r + 1
    return spans


@njit(cache=True)
def _zero(rows):
    """rows[:] = 0 for C-contiguous rows, 8 bytes at a time when they allow (numba's fill
    of a 2-D slice goes element by element)."""
    flat = rows.reshape(rows.size)
    if rows.nbytes % 8 == 0:
        words = flat.view(np.uint64)
        for i in range(words.size):
            words[i] = 0
    else:
        for i in range(flat.size):
            flat[i] = 0


@njit(cache=True)
def run_batches(prog, regs, tiles, ub, acc, hosts, weights, active, scratch, profile):
    """run_sequential on every host image hosts[b] in turn (their outputs written into
    them), each from the loaded state: the rows the program may write are zeroed before
    each batch, registers, weight queue and active tile reset.  The machine must hold only
    what load() and runs of this program left (rows outside the write set are zero).
    Returns the number of batches run."""
    reset = regs.copy()
    ub_spans = _dirty_spans(prog, regs.copy(), MEM_UB, ub.shape[0], profile, ub.shape[1])
    acc_spans = _dirty_spans(prog, regs.copy(), MEM_ACC, acc.shape[0], profile, ub.shape[1])
    _begin(scratch)                     # one run for all batches: the weights stay
    work = plan.build(prog, regs, weights, scratch, acc.shape[0])
    top = work[plan.W_TOP]
    for b in range(hosts.shape[0]):
        for k in range(ub_spans.shape[0]):
            _zero(ub[ub_spans[k, 0]:ub_spans[k, 1]])
        for k in range(acc_spans.shape[0]):     # columns from a row's top on stay zero
            for r in range(acc_spans[k, 0], acc_spans[k, 1]):
                for j in range(top[r]):
                    acc[r, j] = 0
        regs[:] = reset
        tiles[:] = -1
        active[:] = -1
        plan.run_program(prog, regs, tiles, ub, acc, hosts[b], weights, active, scratch,
                         profile, work)
    _end(scratch)
    return hosts.shape[0]


_RESET = reset_registers()


def arguments(machine_args) -> tuple:
    """run_sequential's arguments for a machine's core arguments (Machine._args), from the
    reset state: registers, an empty weight queue, no active tile."""
    prog, ub, acc, host, weights, scratch = (machine_args[i] for i in (0, 11, 12, 13, 14, 15))
    regs = _RESET.copy()
    tiles = np.full(max(_fetched_tiles(prog), 1), -1, dtype=np.int64)
    active = np.full(2, -1, dtype=np.int64)
    return prog, regs, tiles, ub, acc, host, weights, active, scratch


def run(machine_args, profile: int) -> int:
    """The program of a machine's core arguments through the data path (the ahead-of-time
    build when it takes these arguments, else numba's JIT)."""
    from . import aot
    args = (*arguments(machine_args), np.int64(profile))
    entry = aot.runner(args[:-1], "run_sequential") or run_sequential
    try:
        return int(entry(*args))
    finally:
        args[8].options[_OPT_TRUSTED] = 0     # also when the run raised


def batch_arguments(machine_args, hosts: np.ndarray) -> tuple:
    """run_batches' arguments (without the profile): run_sequential's with the stack of
    host images in place of the one host memory."""
    prog, regs, tiles, ub, acc, host, weights, active, scratch = arguments(machine_args)
    return prog, regs, tiles, ub, acc, hosts, weights, active, scratch


# The last machine arguments run_many saw and the entry point they take: checking the
# arguments' layout (aot.runner) cost more than a small model's batches
_ENTRY: list = [(), None]


def forget() -> None:
    """Drop the arguments run_many saw last: a machine let go takes its memories (its host
    images, ub, acc, scratch) with it, instead of this cache keeping them until another
    machine runs (a compile's check: 130 MB of Magika's first segment under the next host
    part).  The next call finds its entry point again."""
    _ENTRY[:] = [(), None]


def run_many(machine_args, hosts: np.ndarray, profile: int) -> int:
    """Every host image of `hosts` ((batches, rows, N) uint8, C-contiguous, writable: what
    Machine.run_batches checks) through the data path (run_batches; ahead-of-time build when
    it takes these arguments)."""
    from . import aot
    args = (*batch_arguments(machine_args, hosts), np.int64(profile))
    seen, entry = _ENTRY
    if len(seen) != len(machine_args) or any(a is not b for a, b in zip(seen, machine_args)):
        # the registers, queue and active tile are made here, the host images checked by
        # the caller: the layout is the machine's arrays'
        entry = aot.runner(args[:-1], "run_batches") or run_batches
        _ENTRY[:] = tuple(machine_args), entry
    try:
        return int(entry(*args))
    finally:
        args[8].options[_OPT_TRUSTED] = 0     # also when the run raised


_FETCHES = OP_STAGE == PORT_WEIGHTS        # by opcode: a Read_Weights


def _fetched_tiles(prog: np.ndarray) -> int:
    return int(prog[_FETCHES[prog[:, COL_OP]], COL_REPEAT].sum())

"""The data path alone: a program's effects in program order, with no pipeline timing.

TPU v1's timing never depends on the data, and the interlocks make every timed run
equivalent to executing the instructions one after another (the reference model's
semantics, which the differential tests hold the emulator to).  So once a program has run to
its halt in timing-only mode (which finds every fault: faults depend on instructions and
addresses alone), each later run with other data needs only the effects: Read_Weights queues
its tiles, a switching MatrixMultiply takes them, CFG sets registers, and every staged
instruction runs through the same kernel the pipelined core calls at retirement
(kernels.execute_instruction).  Machine.run_data is the entry point; it proves the program
first and reports the proven cycle count.
"""
from __future__ import annotations

import numpy as np

from .core import OP_STAGE, PORT_WEIGHTS
from .decoded import (COL_FLAGS, COL_OP, COL_REG, COL_REPEAT, COL_TILE, COL_VALUE,
                      MMC_SWITCH, MMC_WIDE_W, OP_CFG, OP_HLT, OP_MMC, reset_registers)
from .jit import njit
from .kernels import execute_instruction


@njit(cache=True)
def run_sequential(prog, regs, tiles, ub, acc, host, weights, active, scratch, profile):
    """Apply every instruction of `prog` up to its Halt, in program order (the program must
    be one that halts without a fault: nothing is checked here).  Returns the Halt's index."""
    queued = 0              # tiles fetched by Read_Weights so far
    taken = 0               # tiles switched into the array so far
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
            execute_instruction(row, regs, ub, acc, host, weights, tiles[taken:taken + count],
                                active, scratch, profile)
            taken += count
    return prog.shape[0]


def arguments(machine_args) -> tuple:
    """run_sequential's arguments for a machine's core arguments (Machine._args), from the
    reset state: registers, an empty weight queue, no active tile."""
    prog, ub, acc, host, weights, scratch = (machine_args[i] for i in (0, 11, 12, 13, 14, 15))
    regs = reset_registers()
    tiles = np.full(max(_fetched_tiles(prog), 1), -1, dtype=np.int64)
    active = np.full(2, -1, dtype=np.int64)
    return prog, regs, tiles, ub, acc, host, weights, active, scratch


def run(machine_args, profile: int) -> int:
    """The program of a machine's core arguments through the data path (the ahead-of-time
    build when it takes these arguments, else numba's JIT)."""
    from . import aot
    args = (*arguments(machine_args), np.int64(profile))
    entry = aot.runner(args[:-1], "run_sequential") or run_sequential
    return int(entry(*args))


def _fetched_tiles(prog: np.ndarray) -> int:
    weights_ops = np.flatnonzero(OP_STAGE == PORT_WEIGHTS)
    rows = np.isin(prog[:, COL_OP], weights_ops)
    return int(prog[rows, COL_REPEAT].sum())

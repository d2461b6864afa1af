"""Which instruction reads and writes which memory rows: a program's access map, and on a
machine, the history of a row up to the current cycle ("who wrote ub[8] last, who read it").

The front end issues in order and only Configure changes the registers an access depends on
(strides, Activate's UB rows), so every instruction's footprint is fixed by the program
alone: it is computed once, in program order, with the core's own footprint kernel.  Times
come from the machine's per-instruction intervals.  A strided (repeat) access is recorded as
the bounding range of its rows, as the scoreboard and the watchpoints see it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .decoded import COL_OP, COL_REG, COL_VALUE, OP_CFG, reset_registers
from . import kernels
from .kernels import MAX_FOOTPRINT, MEM_ACC, MEM_HOST, MEM_UB
from .pure import python

MEMORY_CODES = {"ub": MEM_UB, "acc": MEM_ACC, "host": MEM_HOST}


@dataclass(frozen=True)
class Access:
    """Instruction `index` reads (write False) or writes rows start..stop-1 of `memory`;
    issued at `issue`, effects visible from `finish` (-1: not yet)."""
    index: int
    memory: str
    start: int
    stop: int
    write: bool
    issue: int = -1
    finish: int = -1


@dataclass(frozen=True)
class UnwrittenRead:
    """Instruction `index` reads rows of `memory` that no earlier instruction writes."""
    index: int
    memory: str
    start: int                  # the first such row
    count: int                  # how many of the rows it reads are never written before it


class AccessMap:
    """The footprints of every instruction of the machine's program (one row per access)."""

    def __init__(self, machine):
        self.machine = machine
        prog = machine.prog                       # decoded rows (the same the core runs)
        profile = 1 if machine.config.profile == "opentpu" else 0
        n = machine.config.array_size
        footprint = python(kernels.footprint)    # the core's own rule, without numba
        regs = reset_registers()
        out = np.zeros((MAX_FOOTPRINT, 4), dtype=np.int64)
        rows = []
        for i in range(len(machine.program.instructions)):
            row = prog[i]
            if row[COL_OP] == OP_CFG:
                regs[row[COL_REG]] = row[COL_VALUE]
                continue
            for k in range(footprint(row, regs, out, profile, n)):
                mem, write, lo, hi = (int(x) for x in out[k])
                if hi > lo:
                    rows.append((i, mem, write, lo, hi))
        table = np.array(rows, dtype=np.int64).reshape(-1, 5)
        self.index, self.mem, self.write, self.lo, self.hi = table.T
        self._names = {code: name for name, code in MEMORY_CODES.items()}

    def _select(self, memory: str, start: int, stop: int, write: bool | None) -> np.ndarray:
        code = MEMORY_CODES[memory]
        hit = (self.mem == code) & (self.lo < stop) & (self.hi > start)
        if write is not None:
            hit &= self.write == (1 if write else 0)
        return np.flatnonzero(hit)

    def touches(self, index: int, memory: str, start: int, stop: int, write: bool | None) -> bool:
        """Whether instruction `index` reads (write False) / writes (True) / either (None)
        any of rows start..stop-1 of `memory`."""
        sel = self._select(memory, start, stop, write)
        return bool(np.any(self.index[sel] == index))

    def history(self, memory: str, start: int, stop: int | None = None, *,
                write: bool) -> list[Access]:
        """Accesses to rows start..stop-1 by instructions issued so far on the machine, in
        order of finish (those still in flight last, with finish -1)."""
        stop = start + 1 if stop is None else stop
        times = self.machine.intervals()
        cycle = self.machine.cycle
        out = []
        for k in self._select(memory, start, stop, write):
            i = int(self.index[k])
            issue, _, finish = (int(x) for x in times[i])
            if issue < 0:
                continue
            out.append(Access(i, memory, int(self.lo[k]), int(self.hi[k]), bool(self.write[k]),
                              issue, finish if finish <= cycle else -1))
        return sorted(out, key=lambda a: (a.finish < 0, a.finish, a.index))

    def last_writer(self, memory: str, row: int) -> Access | None:
        """The instruction whose write of `row` is the one the machine shows now."""
        done = [a for a in self.history(memory, row, write=True) if a.finish >= 0]
        return done[-1] if done else None

    def blocker(self, index: int) -> int | None:
        """The earlier instruction that instruction `index` waited for (a RAW, WAR or WAW on
        its footprint) when it started after it issued: the conflicting one that finished
        last, at or before its start.  None when nothing it touches held it up."""
        times = self.machine.intervals()
        issue, start = int(times[index, 0]), int(times[index, 1])
        if issue < 0 or start <= issue:
            return None
        best, best_finish = None, -1
        for k in np.flatnonzero(self.index == index):
            mem, lo, hi, w = self.mem[k], self.lo[k], self.hi[k], self.write[k]
            hit = (self.mem == mem) & (self.lo < hi) & (self.hi > lo) & (self.index < index)
            if not w:
                hit &= self.write == 1                    # a read waits only for writes
            for j in np.unique(self.index[hit]):
                f = int(times[j, 2])
                if issue < f <= start and f > best_finish:
                    best, best_finish = int(j), f
        return best

    def unwritten_reads(self) -> list[UnwrittenRead]:
        """Reads of UB or accumulator rows that no earlier instruction (in program order,
        which the interlocks make the order of effects) writes since load.  Host rows come
        with the data and count as written."""
        cfg = self.machine.config
        written = {MEM_UB: np.zeros(cfg.ub_rows, dtype=bool),
                   MEM_ACC: np.zeros(cfg.acc_rows, dtype=bool)}
        out = []
        order = np.lexsort((self.write, self.index))       # an instruction's reads first
        for k in order:
            mem = int(self.mem[k])
            if mem not in written:
                continue
            lo, hi = int(self.lo[k]), min(int(self.hi[k]), len(written[mem]))
            if self.write[k]:
                written[mem][lo:hi] = True
                continue
            missing = np.flatnonzero(~written[mem][lo:hi])
            if len(missing):
                out.append(UnwrittenRead(int(self.index[k]), self._names[mem],
                                         lo + int(missing[0]), len(missing)))
        return out

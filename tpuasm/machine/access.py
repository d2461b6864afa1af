"""Which instruction reads and writes which memory rows: a program's access map, and on a
machine, the history of a row up to the current cycle ("who wrote ub[8] last, who read it").

The front end issues in order and only Configure changes the registers an access depends on
(strides, Activate's UB rows), so every instruction's footprint is fixed by the program
alone: it is computed once, in program order, with the core's own footprint kernel (the
bounding range the scoreboard compares) and, for strided accesses, the exact runs of rows
(rowsets.py), so that a row in the gap of a strided access has no writer it never had.
Times come from the machine's per-instruction intervals.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .decoded import COL_OP, COL_REG, COL_VALUE, OP_CFG, reset_registers
from . import kernels
from .kernels import MAX_FOOTPRINT, MEM_ACC, MEM_HOST, MEM_UB
from .pure import python
from .rowsets import exact_runs, strided

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
    """The accesses of every instruction of the machine's program: `index, mem, write, lo,
    hi` hold one row per run of rows an instruction reads or writes exactly (rowsets.py:
    a strided access is several runs); `bounds` the same accesses as the core's footprint,
    one bounding range each, as the scoreboard compares them."""

    def __init__(self, machine):
        self.machine = machine
        prog = machine.prog                       # decoded rows (the same the core runs)
        profile = 1 if machine.config.profile == "opentpu" else 0
        n = machine.config.array_size
        footprint = python(kernels.footprint)    # the core's own rule, without numba
        regs = reset_registers()
        out = np.zeros((MAX_FOOTPRINT, 4), dtype=np.int64)
        bounds, runs = [], []
        for i in range(len(machine.program.instructions)):
            row = prog[i]
            if row[COL_OP] == OP_CFG:
                regs[row[COL_REG]] = row[COL_VALUE]
                continue
            mine = []
            for k in range(footprint(row, regs, out, profile, n)):
                mem, write, lo, hi = (int(x) for x in out[k])
                if hi > lo:
                    mine.append((i, mem, write, lo, hi))
            bounds += mine
            if mine and strided(row, regs):
                for mem, write, exact in exact_runs(row, regs, profile, n):
                    runs += [(i, mem, int(write), int(lo), int(hi)) for lo, hi in exact]
            else:
                runs += mine
        self.bounds = np.array(bounds, dtype=np.int64).reshape(-1, 5).T
        table = np.array(runs, dtype=np.int64).reshape(-1, 5)
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
        order of finish (those still in flight last, with finish -1); rows given as the
        first and last row of those start..stop-1 the instruction touches."""
        stop = start + 1 if stop is None else stop
        times = self.machine.intervals()
        cycle = self.machine.cycle
        found: dict[int, list[int]] = {}
        for k in self._select(memory, start, stop, write):
            i = int(self.index[k])
            lo, hi = max(int(self.lo[k]), start), min(int(self.hi[k]), stop)
            span = found.setdefault(i, [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
        out = []
        for i, (lo, hi) in found.items():
            issue, _, finish = (int(x) for x in times[i])
            if issue < 0:
                continue
            out.append(Access(i, memory, lo, hi, write, issue, finish if finish <= cycle else -1))
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
        b_index, b_mem, b_write, b_lo, b_hi = self.bounds     # as the scoreboard saw them
        for k in np.flatnonzero(b_index == index):
            mem, lo, hi, w = b_mem[k], b_lo[k], b_hi[k], b_write[k]
            hit = (b_mem == mem) & (b_lo < hi) & (b_hi > lo) & (b_index < index)
            if not w:
                hit &= b_write == 1                       # a read waits only for writes
            for j in np.unique(b_index[hit]):
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
        found: dict[tuple[int, int], list[int]] = {}        # (index, memory) -> first, count
        order = np.lexsort((self.write, self.index))       # an instruction's reads first
        for k in order:
            mem = int(self.mem[k])
            if mem not in written:
                continue
            lo, hi = max(int(self.lo[k]), 0), min(int(self.hi[k]), len(written[mem]))
            if self.write[k]:
                written[mem][lo:hi] = True
                continue
            missing = np.flatnonzero(~written[mem][lo:hi])
            if len(missing):
                entry = found.setdefault((int(self.index[k]), mem), [lo + int(missing[0]), 0])
                entry[0] = min(entry[0], lo + int(missing[0]))
                entry[1] += len(missing)
        return [UnwrittenRead(i, self._names[mem], first, count)
                for (i, mem), (first, count) in found.items()]

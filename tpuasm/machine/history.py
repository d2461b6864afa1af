"""Reverse execution: checkpoints plus deterministic replay.

The machine is deterministic and its state at cycle c does not depend on where earlier runs
stopped (core.py), so going back to cycle c = restore the latest checkpoint at or before c
and step forward.

What a checkpoint costs.  The big memories (UB 24 MiB, accumulators 4 MiB, host) change
only when an instruction retires, and only in the rows its write footprint covers (core.py
applies every effect in `_complete`, inside the footprint the scoreboard uses).  So a
checkpoint keeps the small state arrays whole and, of the big memories, only the rows that
instructions retiring since the previous checkpoint may have written (a chain of deltas
over the start, which keeps its nonzero rows): its cost follows what the program wrote, not
the 28 MiB of memory.  Restoring one writes back only the rows that differ
between the machine's present state and the checkpoint (again from the footprints of the
instructions that retired in between), each from the newest delta holding it.

At most `max_snapshots` checkpoints are kept: when full, neighbours are merged pairwise
and the interval doubles, so memory stays bounded while replay costs at most about
`interval` cycles of emulation.
"""
from __future__ import annotations

import numpy as np

from .access import MEMORY_CODES, AccessMap
from .machine import Machine, RunResult, Snapshot

_BIG = ("ub", "acc", "host")


class _Checkpoint:
    """The machine at one cycle: small arrays whole, big memories as the rows written since
    the previous checkpoint (`rows[name]`, sorted) with their values now."""

    def __init__(self, machine: Machine, rows: dict[str, np.ndarray]):
        snap_small = {k: getattr(machine, k).copy() for k in machine._STATE_ARRAYS
                      if k not in _BIG}
        self.small = snap_small
        self.rows = rows
        self.values = {name: getattr(machine, name)[r] for name, r in rows.items()}
        self.fault, self.status, self.at_break = machine.fault, machine.status, machine._at_break

    @property
    def cycle(self) -> int:
        return Snapshot(self.small).cycle

    def absorb(self, earlier: "_Checkpoint") -> None:
        """Take over the rows of the checkpoint before this one (which is being dropped)."""
        for name in _BIG:
            rows = np.concatenate([self.rows[name], earlier.rows[name]])
            values = np.concatenate([self.values[name], earlier.values[name]])
            rows, first = np.unique(rows, return_index=True)    # this checkpoint's values win
            self.rows[name], self.values[name] = rows, values[first]

    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.values.values())


_ALL_RETIRED = object()
_TABLES: dict = {}          # the write tables of the few programs loaded last


def _write_table(machine: Machine):
    """(instruction, memory code, lo, hi) of every write access of the machine's program,
    computed once per program and machine shape: a restart reuses it.  (Instructions are
    frozen: the identities of the list's items tell whether the program changed.)"""
    cfg, program = machine.config, machine.program
    key = (id(program), cfg.array_size, cfg.profile, cfg.ub_rows, cfg.acc_rows)
    ids = tuple(map(id, program.instructions))
    cached = _TABLES.get(key)
    if cached is not None and cached[0] is program and cached[1] == ids:
        return cached[2]
    a = AccessMap(machine)
    w = a.write == 1
    table = (a.index[w], a.mem[w], a.lo[w], a.hi[w])
    _TABLES[key] = (program, ids, table)
    while len(_TABLES) > 4:
        del _TABLES[next(iter(_TABLES))]
    return table


class History:
    """Time travel over a Machine: forward through the History to record, then go back."""

    def __init__(self, machine: Machine, interval: int = 20_000, max_snapshots: int = 32):
        if interval < 1:
            raise ValueError("interval must be >= 1")
        self.machine = machine
        self.interval = int(interval)
        self.max_snapshots = max(2, int(max_snapshots))
        self._program = machine.program
        self._writes = _write_table(machine)   # (index, memory code, lo, hi) of every write
        # the start, its big memories as the rows some instruction of the program may write
        # (no other row ever changes): not the 28 MiB, most of them zero pages never touched
        self.base = _Checkpoint(machine, self._written(_ALL_RETIRED, None, None))
        self._deltas: list[_Checkpoint] = []

    # ------------------------------------------------------------------ footprints
    def _written(self, times, first, last) -> dict[str, np.ndarray]:
        """Rows (sorted, per big memory) that instructions retiring in cycles first..last
        (by `times`, the later state's) may have written: their write footprints.  With
        _ALL_RETIRED, those of every instruction."""
        index, mem, lo, hi = self._writes
        if times is _ALL_RETIRED:
            hit = np.ones(len(index), bool)
        else:
            n = len(self.machine.prog)
            issue, finish = times[:n, 0], times[:n, 2]
            done = (issue >= 0) & (finish >= first) & (finish <= last)
            hit = done[index] if len(index) else np.zeros(0, bool)
        out = {}
        for name in _BIG:
            size = getattr(self.machine, name).shape[0]
            sel = hit & (mem == MEMORY_CODES[name])
            if not sel.any():
                out[name] = np.zeros(0, np.int64)
                continue
            starts, ends = np.clip(lo[sel], 0, size), np.clip(hi[sel], 0, size)
            if int((ends - starts).sum()) < size // 8:         # few rows: list them
                out[name] = np.unique(np.concatenate(
                    [np.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist())]))
                continue
            # union of [lo, hi) ranges: +1 at each start, -1 at each end, covered where > 0
            edges = np.zeros(size + 1, np.int64)
            np.add.at(edges, starts, 1)
            np.add.at(edges, ends, -1)
            out[name] = np.flatnonzero(np.cumsum(edges[:size]) > 0)
        return out

    # ------------------------------------------------------------------ forward
    def run(self, max_cycles=None, breakpoints=(), watch=()) -> RunResult:
        """machine.run, in interval-sized pieces so that checkpoints are spread out."""
        m = self.machine
        while True:
            target = m.cycle + self.interval
            if max_cycles is not None:
                target = min(target, int(max_cycles))
            r = m._advance(target, -1, breakpoints, watch, max_cycles=max_cycles
                           if max_cycles is not None and target >= int(max_cycles) else None)
            self.record()
            if r.status != "paused" or (max_cycles is not None and m.cycle >= int(max_cycles)):
                return r

    def step(self, cycles: int = 1, breakpoints=(), watch=()) -> RunResult:
        r = self.machine.step(cycles, breakpoints, watch)
        self.record()
        return r

    def step_instruction(self) -> RunResult:
        r = self.machine.step_instruction()
        self.record()
        return r

    def record(self) -> None:
        """Take a checkpoint if the machine is `interval` cycles past the last one."""
        m = self.machine
        self._check_program()
        last = self._deltas[-1].cycle if self._deltas else self.base.cycle
        if m.cycle < last + self.interval:
            return
        self._deltas.append(_Checkpoint(m, self._written(m.times, last, m.cycle)))
        if len(self._deltas) > self.max_snapshots:
            merged = []
            for k in range(0, len(self._deltas) - 1, 2):
                later = self._deltas[k + 1]
                later.absorb(self._deltas[k])
                merged.append(later)
            if len(self._deltas) % 2:
                merged.append(self._deltas[-1])
            self._deltas = merged
            self.interval *= 2

    def _check_program(self) -> None:
        if self.machine.program is not self._program:
            raise RuntimeError("the machine was loaded with another program: make a new History")

    # ------------------------------------------------------------------ backward
    def goto(self, cycle: int) -> RunResult:
        """Put the machine in exactly the state it had at `cycle` (<= the latest recorded)."""
        m = self.machine
        self._check_program()
        cycle = max(int(cycle), self.base.cycle)
        self._deltas = [d for d in self._deltas if d.cycle <= max(cycle, m.cycle)]
        k = len(self._deltas)
        while k and self._deltas[k - 1].cycle > cycle:
            k -= 1
        self._restore(k)
        m.fault = None
        m.status = "paused"
        m._at_break = -1
        # even a zero step: the core decides whether this cycle is a halt or a fault
        return m.step(cycle - m.cycle)

    def _restore(self, k: int) -> None:
        """Put the machine in the state of checkpoint k (0: the base, k: self._deltas[k-1])."""
        m = self.machine
        target = self._deltas[k - 1] if k else self.base
        small = target.small
        to = target.cycle
        now = m.cycle
        # the rows that can differ: those written by instructions retiring between the two
        # states, as the later state's times record them
        later_times = m.times if now >= to else small["times"]
        changed = self._written(later_times, min(now, to), max(now, to))
        for name in _BIG:
            array = getattr(m, name)
            pending = np.zeros(array.shape[0], bool)
            pending[changed[name]] = True
            left = len(changed[name])
            for d in [*reversed(self._deltas[:k]), self.base]:   # newest first: its values win
                if not left:
                    break
                rows = d.rows[name]
                if not len(rows):
                    continue
                take = pending[rows]
                if take.any():
                    array[rows[take]] = d.values[name][take]
                    pending[rows[take]] = False
                    left -= int(take.sum())
            if left:                                       # zero since the start
                array[np.flatnonzero(pending)] = 0
        for name, arr in small.items():
            mine = getattr(m, name)
            if mine.shape != arr.shape:
                raise ValueError("checkpoint belongs to another program or machine shape")
            mine[...] = arr
        m.fault, m.status, m._at_break = target.fault, target.status, target.at_break

    def back(self, cycles: int = 1) -> RunResult:
        return self.goto(self.machine.cycle - int(cycles))

    def back_instruction(self) -> RunResult:
        """Back to just before the most recently issued instruction issued."""
        m = self.machine
        issued = m.times[:len(m.prog), 0]
        cand = np.flatnonzero((issued >= 0) & (issued < m.cycle))
        if len(cand) == 0:
            return self.goto(self.base.cycle)
        last = int(cand[issued[cand].argmax()])
        return self.goto(int(issued[last]))

    def reverse_continue(self, breakpoints=(), watch=()) -> RunResult:
        """Back to the latest earlier cycle at which a breakpoint or watchpoint would have
        stopped a forward run; to the start of the history if there is none."""
        m = self.machine
        now = m.cycle
        self.goto(self.base.cycle)
        hits: list[tuple[int, str, int | None]] = []
        while m.cycle < now:
            r = m._advance(now, -1, breakpoints, watch)
            if r.status in ("breakpoint", "watchpoint") and r.cycle < now:
                hits.append((r.cycle, r.status, r.index))
            elif r.status != "paused" or m.cycle >= now:
                break
        if not hits:
            r = self.goto(self.base.cycle)
            return r
        cycle, status, index = hits[-1]
        self.goto(cycle)
        m.status = status
        if status == "breakpoint":
            m._at_break = index
        return RunResult(status, m.cycle, None, index)

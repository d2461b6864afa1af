"""Reverse execution: periodic snapshots plus deterministic replay.

The machine is deterministic and its state at cycle c does not depend on where earlier runs
stopped (core.py), so going back to cycle c = restore the latest snapshot at or before c and
step forward.  Snapshots keep the big memories (UB 24 MiB, accumulators 4 MiB, host) as the
rows that differ from the snapshot taken when the History was created; at most
`max_snapshots` are kept (when full, every other one is dropped and the interval doubles), so
memory stays bounded while replay costs at most about `interval` cycles of emulation.
"""
from __future__ import annotations

import numpy as np

from .machine import Machine, RunResult, Snapshot

_BIG = ("ub", "acc", "host")


class _Delta:
    """A snapshot whose big memories are stored as changed rows against a base."""

    def __init__(self, snap: Snapshot, base: Snapshot):
        self.cycle = snap.cycle
        self.small = {k: v for k, v in snap.arrays.items() if k not in _BIG}
        self.rows = {}
        for name in _BIG:
            now, then = snap.arrays[name], base.arrays[name]
            changed = np.flatnonzero((now != then).reshape(len(now), -1).any(axis=1)) \
                if len(now) else np.zeros(0, np.int64)
            self.rows[name] = (changed, now[changed].copy())
        self.fault, self.status, self.at_break = snap.fault, snap.status, snap.at_break

    def materialize(self, base: Snapshot) -> Snapshot:
        arrays = dict(self.small)
        for name in _BIG:
            full = base.arrays[name].copy()
            rows, values = self.rows[name]
            full[rows] = values
            arrays[name] = full
        return Snapshot(arrays, self.fault, self.status, self.at_break)


class History:
    """Time travel over a Machine: forward through the History to record, then go back."""

    def __init__(self, machine: Machine, interval: int = 20_000, max_snapshots: int = 32):
        if interval < 1:
            raise ValueError("interval must be >= 1")
        self.machine = machine
        self.interval = int(interval)
        self.max_snapshots = max(2, int(max_snapshots))
        self.base = machine.snapshot()
        self._deltas: list[_Delta] = []

    # ------------------------------------------------------------------ forward
    def run(self, max_cycles=None, breakpoints=(), watch=()) -> RunResult:
        """machine.run, in interval-sized pieces so that snapshots are spread out."""
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
        """Take a snapshot if the machine is `interval` cycles past the last one."""
        m = self.machine
        last = self._deltas[-1].cycle if self._deltas else self.base.cycle
        if m.cycle < last + self.interval:
            return
        self._deltas.append(_Delta(m.snapshot(), self.base))
        if len(self._deltas) > self.max_snapshots:
            self._deltas = self._deltas[1::2]
            self.interval *= 2

    # ------------------------------------------------------------------ backward
    def goto(self, cycle: int) -> RunResult:
        """Put the machine in exactly the state it had at `cycle` (<= the latest recorded)."""
        m = self.machine
        cycle = max(int(cycle), self.base.cycle)
        self._deltas = [d for d in self._deltas if d.cycle <= max(cycle, m.cycle)]
        start = self.base
        for d in self._deltas:
            if d.cycle <= cycle:
                start = d
        snap = start if isinstance(start, Snapshot) else start.materialize(self.base)
        m.restore(snap)
        m.fault = None
        m.status = "paused"
        m._at_break = -1
        # even a zero step: the core decides whether this cycle is a halt or a fault
        return m.step(cycle - m.cycle)

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

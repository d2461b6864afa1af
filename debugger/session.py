"""One debugging session: a program on a machine, its breakpoints and watchpoints.

Everything that changes the machine goes through here, for the UI and for batch mode
alike.  The machine is driven only through the public API of `tpuasm.machine`
(spec/machine-api.md); reverse execution is the library's `History`.
"""
from __future__ import annotations

import re
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from tpuasm.disassembler import format_instruction

from .expr import Evaluator, ExprError, Location, symbol_table

CHUNK_CYCLES = 5_000         # a long run is cut into chunks so it can be interrupted
HISTORY_INTERVAL = 5_000     # cycles between the library's checkpoints: each copies the rows
                             # written since the last one; a step back replays at most this many
TIMELINE_DEPTH = 512         # recorded per-cycle pipeline states kept for the timeline
ANYWHERE = "anywhere"        # where a `break if COND` without a location stops: before any issue


class ReloadError(Exception):
    """`reload` could not use the edited file; the message says why (with carets)."""


@dataclass
class Breakpoint:
    number: int
    indices: tuple[int, ...]       # instructions the line (or label, or *index) covers
    where: str
    condition: str | None = None
    ignore: int = 0
    temporary: bool = False
    enabled: bool = True
    hits: int = 0
    cycle: int | None = None       # a cycle breakpoint (`break cycle N`): no instructions

    def describe(self) -> str:
        if self.cycle is not None or self.where == ANYWHERE:
            what = ""
        elif not self.indices:
            what = "  (waits: not in this segment)"
        else:
            what = f"  (instr {', '.join(f'#{i}' for i in self.indices[:8])}" + \
                   (" ...)" if len(self.indices) > 8 else ")")
        parts = [f"{self.number:<3} {'tbreak' if self.temporary else 'break':<6} "
                 f"{'y' if self.enabled else 'n'}  {self.where}{what}"]
        if self.condition:
            parts.append(f"if {self.condition}")
        if self.ignore:
            parts.append(f"ignore next {self.ignore}")
        if self.hits:
            parts.append(f"hit {self.hits}x")
        return "  ".join(parts)


@dataclass
class Watchpoint:
    number: int
    memory: str
    start: int
    stop: int
    text: str
    old: np.ndarray | None = None
    enabled: bool = True
    hits: int = 0
    access: str = "change"      # change (watch), write (watch -w), read (rwatch), access (awatch)
    # a value condition (`watch acc[3][7] < 0`): the rows it reads, and whether it held
    condition: str | None = None
    spans: tuple[tuple[str, int, int], ...] = ()
    truth: bool = False

    def ranges(self) -> tuple[tuple[str, int, int], ...]:
        return self.spans or ((self.memory, self.start, self.stop),)

    def describe(self) -> str:
        kind = {"change": "watch", "write": "watch-w", "read": "rwatch", "access": "awatch"}[self.access]
        if self.condition:
            return (f"{self.number:<3} {kind:<7}{'y' if self.enabled else 'n'}  {self.condition} "
                    f"(now {'true' if self.truth else 'false'})"
                    + (f"  hit {self.hits}x" if self.hits else ""))
        return (f"{self.number:<3} {kind:<7}{'y' if self.enabled else 'n'}  {self.text} "
                f"= {self.memory}[{self.start}:{self.stop}]" + (f"  hit {self.hits}x" if self.hits else ""))


@dataclass
class Stop:
    """Why the machine stopped, in words for the log and as a kind for code.  Several
    breakpoints and watchpoints hit in the same cycle are one stop: `message` has one line
    per hit, in the order they happened, and `numbers` lists them all."""
    kind: str                  # breakpoint watchpoint halted fault paused interrupted tag interrupt error
    message: str
    index: int | None = None
    number: int | None = None  # breakpoint or watchpoint number (the first hit's)
    numbers: tuple[int, ...] = ()
    cycle: int | None = None   # the machine's cycle when it stopped

    @classmethod
    def of_hits(cls, hits: list[tuple[str, str, int | None, int | None]]) -> "Stop | None":
        """One stop for (kind, message, index, number) hits, in order; None for none."""
        if not hits:
            return None
        kind, _, index, number = hits[0]
        return cls(kind, "\n".join(h[1] for h in hits), index, number,
                   tuple(h[3] for h in hits if h[3] is not None))


@dataclass(frozen=True)
class StageSample:
    """What one stage held at the end of one cycle (recorded for the timeline)."""
    index: int | None
    stalled: bool


@dataclass
class RecordedRun:
    """The run as far as the session has seen it, kept when it goes back in time: the
    timeline still shows the whole run (a program runs the same way every time).  It
    answers the few questions the timeline asks a machine."""
    program: object
    cycle: int
    times: np.ndarray
    tiles: np.ndarray
    events: list
    fault: object

    def intervals(self) -> np.ndarray:
        return self.times

    def tile_intervals(self) -> np.ndarray:
        return self.tiles

    def issue_cycle(self, index: int) -> int:
        return int(self.times[index, 0])


class Session:
    def __init__(self, program, host=None, weights=None, overrides: dict | None = None,
                 source_name: str | None = None, reload_from=None):
        self.source_name = source_name
        self.host_arg, self.weights_arg = host, weights
        self.overrides = overrides or {}
        # (path, shape overrides): what `reload` re-reads; None for a program given in memory
        self.reload_from = reload_from
        self._use_program(program)
        self.breakpoints: dict[int, Breakpoint] = {}
        self.watchpoints: dict[int, Watchpoint] = {}
        self._next_number = 1
        self.catch: set[str] = {"fault"}
        self.cancel = threading.Event()      # set from another thread to interrupt a run;
                                             # whoever starts a run clears it first
        self.last_stop: Stop | None = None
        self.displays: dict[int, str] = {}   # `display` expressions, printed after every stop
        self.recorded: RecordedRun | None = None   # the furthest run seen, for the timeline
        self.outdir = None                   # a compiled model's directory (`segment NAME`)
        self.segment: str | None = None      # ... and the segment open now
        self.segment_hosts: dict = {}        # segment -> host image from `--input` (else its file)
        self.host_parts: dict = {}           # host part -> its tensors in the `--input` run
        self.on_progress = None      # progress(cycle, seconds) between chunks of a long run

    def _use_program(self, program) -> None:
        """Load `program` on a machine of its shape (the same machine if the shape did not
        change), at cycle 0 with the session's data."""
        from tpuasm.machine import History, Machine, MachineConfig
        old = getattr(self, "machine", None)
        if old is None or MachineConfig.from_shape(program.shape, **self.overrides) != old.config:
            self.machine = Machine.for_program(program, **self.overrides)
        self.machine.load(program, host=self.host_arg, weights=self.weights_arg)
        self.program = program
        self._symbolic: dict[int, str | None] = {}     # symbolic(): per instruction, on demand
        self.history = History(self.machine, interval=HISTORY_INTERVAL)
        self.symbols = symbol_table(program)
        self.eval = Evaluator(self.machine, self.symbols)
        # Per-cycle pipeline samples: cycle -> {stage: StageSample}.  Only what this
        # session has seen cycle by cycle; longer runs fall back to issue/finish cycles.
        self.samples: dict[int, dict[str, StageSample]] = {}
        self._sample_order: deque[int] = deque()
        self.events_seen = 0
        self._pipeline, self._pipeline_key = [], None
        self._line_index = self._index_lines()
        self._record()

    # -- program geometry -----------------------------------------------------------------
    def _index_lines(self) -> dict[tuple[str, int], list[int]]:
        out: dict[tuple[str, int], list[int]] = {}
        for i, loc in enumerate(self.program.locations):
            if loc is not None:
                out.setdefault((loc.file, loc.line), []).append(i)
        return out

    def main_file(self) -> str | None:
        for loc in self.program.locations:
            if loc is not None:
                return loc.file
        return next(iter(self.program.sources), None)

    def where(self, index: int | None) -> str:
        """`#7 MMC.S 0, 0, 96 (prog.tasm:12)` for instruction `index`."""
        if index is None or not 0 <= index < len(self.program):
            return "-"
        loc = self.program.locations[index]
        text = self.symbolic(index) or format_instruction(self.program.instructions[index])
        node = self.program.node_of(index)
        where = ", ".join(x for x in ((f"{loc.file}:{loc.line}" if loc else ""),
                                      (f"node {node}" if node else "")) if x)
        return f"#{index} `{text}`" + (f" ({where})" if where else "")

    def symbolic(self, index: int) -> str | None:
        """Instruction `index` as its source line writes it (`MMC.SO ub.x, acc.y + B, B`:
        the program's names, not numbers), or None when the line is not that instruction
        (a macro call, a binary without sources)."""
        if index not in self._symbolic:
            self._symbolic[index] = _statement(self.program, index)
        return self._symbolic[index]

    def indices_for_line(self, file: str | None, line: int) -> list[int]:
        if file is None:
            file = self.main_file()
        hits = self._line_index.get((file, line))
        if hits is None:
            # a basename is enough: `break prog.tasm:12` for `programs/x/prog.tasm`
            for (f, ln), idx in self._line_index.items():
                if ln == line and (f.endswith("/" + file) or file.endswith("/" + f)):
                    return idx
        return hits or []

    def pipeline(self) -> list:
        """machine.pipeline(), computed once per machine state: the timeline sample, the
        next instruction, the source view and the pipeline pane all ask for it each step.
        The state at a cycle is the same however the machine got there (a step back
        replays), so the cycle and status identify it."""
        m = self.machine
        key = (m.cycle, m.status, len(m.events))
        if key != self._pipeline_key:
            self._pipeline, self._pipeline_key = m.pipeline(), key
        return self._pipeline

    def next_to_issue(self) -> int | None:
        for st in self.pipeline():
            if st.name == "front":
                return st.index
        return None

    # -- breakpoints and watchpoints -----------------------------------------------------------
    def _number(self) -> int:
        n = self._next_number
        self._next_number += 1
        return n

    def add_breakpoint(self, indices, where, condition=None, temporary=False,
                       cycle: int | None = None) -> Breakpoint:
        """A breakpoint before `indices` issue, or at the start of `cycle` (no indices)."""
        if condition:
            self.eval.check(condition)           # a malformed condition fails now, not mid-run
        bp = Breakpoint(self._number(), tuple(indices), where, condition, temporary=temporary,
                        cycle=cycle)
        self.breakpoints[bp.number] = bp
        return bp

    def _next_cycle_break(self) -> int | None:
        """The earliest cycle after now at which an enabled cycle breakpoint stops."""
        now = self.machine.cycle
        cycles = [bp.cycle for bp in self.breakpoints.values()
                  if bp.enabled and bp.cycle is not None and bp.cycle > now]
        return min(cycles) if cycles else None

    def _check_range(self, loc: Location) -> None:
        limit = self._rows(loc.memory)
        if loc.memory not in ("ub", "acc", "host"):
            raise ExprError("watchpoints cover ub, acc or host rows")
        if not (0 <= loc.row and loc.row + loc.rows <= limit):
            raise ExprError(f"{loc.memory} rows {loc.row}..{loc.row + loc.rows - 1} "
                            f"outside 0..{limit - 1}")

    def add_watchpoint(self, loc: Location, text: str, access: str = "change") -> Watchpoint:
        self._check_range(loc)
        wp = Watchpoint(self._number(), loc.memory, loc.row, loc.row + loc.rows, text,
                        access=access)
        wp.old = self._rows_of(wp).copy()
        self.watchpoints[wp.number] = wp
        return wp

    def add_condition_watch(self, condition: str) -> Watchpoint:
        """`watch acc[3][7] < 0`: stop after a write to the rows the condition reads that
        changes whether it holds."""
        self.eval.check(condition)
        spans = self._condition_spans(condition)
        wp = Watchpoint(self._number(), spans[0][0], spans[0][1], spans[0][2], condition,
                        condition=condition, spans=spans, truth=self.eval.truth(condition))
        self.watchpoints[wp.number] = wp
        return wp

    def _condition_spans(self, condition: str) -> tuple[tuple[str, int, int], ...]:
        """The memory rows an expression reads: each `ub[r]`, `acc[a:b]`... (a memory
        without a subscript: all its rows)."""
        import ast
        tree = self.eval._parse(condition)
        bases = {"ub": "ub", "ubu": "ub", "acc": "acc", "host": "host", "hostu": "host"}
        spans, subscripted = [], set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and node.value.id in bases:
                subscripted.add(id(node.value))
                row, rows = self.eval._row_range(node.slice)
                loc = Location(bases[node.value.id], row, 0, rows)
                self._check_range(loc)
                spans.append((loc.memory, row, row + rows))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in bases and id(node) not in subscripted:
                memory = bases[node.id]
                spans.append((memory, 0, self._rows(memory)))
        spans = [sp for sp in dict.fromkeys(spans) if sp[2] > sp[1]]
        if not spans:
            raise ExprError(f"`{condition}` reads no memory rows: `break if {condition}` "
                            "checks it before every instruction")
        return tuple(spans)

    def inputs(self) -> list:
        """The files this session reads (no output may replace one)."""
        from pathlib import Path
        paths = [self.reload_from[0] if self.reload_from else None, self.host_arg, self.weights_arg]
        return [p for p in paths if isinstance(p, (str, Path))]

    def delete(self, number: int) -> None:
        if self.breakpoints.pop(number, None) is None and self.watchpoints.pop(number, None) is None:
            raise KeyError(number)

    def _rows(self, memory: str) -> int:
        array = getattr(self.machine, memory, None)
        return 0 if array is None else array.shape[0]

    def _rows_of(self, wp: Watchpoint) -> np.ndarray:
        return getattr(self.machine, wp.memory)[wp.start:wp.stop]

    def _armed_indices(self) -> list[int]:
        out = set()
        for bp in self.breakpoints.values():
            if bp.enabled:
                if bp.where == ANYWHERE:      # only the instructions still to issue
                    nxt = self.next_to_issue()
                    out.update(range(nxt, len(self.program)) if nxt is not None else ())
                else:
                    out.update(bp.indices)
        for kind, key in (("tag", "TAG"), ("interrupt", "INT")):
            if kind in self.catch:
                out.update(i for i, ins in enumerate(self.program.instructions) if ins.key == key)
        if "unwritten" in self.catch:
            out.update(self.unwritten_reads())
        return sorted(out)

    def unwritten_reads(self) -> dict:
        """instruction index -> [UnwrittenRead]: reads of rows nothing wrote since load."""
        if getattr(self, "_unwritten_for", None) is not self.program:
            self._unwritten = {}
            for u in self.accesses.unwritten_reads():
                self._unwritten.setdefault(u.index, []).append(u)
            self._unwritten_for = self.program
        return self._unwritten

    def _armed_watches(self):
        from tpuasm.machine import Watch
        out = []
        for w in self.watchpoints.values():
            if w.enabled:
                mode = {"change": "write"}.get(w.access, w.access)
                out += [Watch(memory, a, b, mode) for memory, a, b in w.ranges()]
        return out

    # -- running -------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.machine.status in ("halted", "fault")

    def _finished_stop(self) -> Stop:
        m = self.machine
        if m.status == "fault":
            return Stop("fault", str(m.fault), getattr(m.fault, "index", None))
        return Stop("halted", f"halted at cycle {m.cycle}")

    def step_cycles(self, n: int = 1) -> Stop:
        """Advance n clock cycles, like Ripes' clock button: breakpoints do not stop a step.
        Short steps go one cycle at a time so that the timeline records every cycle."""
        m = self.machine
        if self.finished:
            return self._finish(self._finished_stop())
        if n <= 64:
            for _ in range(n):
                self.history.step(1)
                self._record()
                if self.finished:
                    return self._finish(self._finished_stop())
        else:
            target = m.cycle + n
            while m.cycle < target and not self.finished:
                self.history.step(min(CHUNK_CYCLES, target - m.cycle))
                if self.cancel.is_set():
                    self._record()
                    return self._finish(Stop("interrupted", f"interrupted at cycle {m.cycle}"))
            self._record()
            if self.finished:
                return self._finish(self._finished_stop())
        return self._finish(Stop("paused", f"cycle {m.cycle}"))

    def step_instructions(self, n: int = 1) -> Stop:
        """`next`: n times, issue the next instruction and run until it has finished its
        stage (breakpoints do not stop it).  Instructions issued before it may retire
        meanwhile: the message counts every retirement."""
        m = self.machine
        retired = int(m.counters()["instructions"])
        done = None
        for _ in range(n):
            if self.finished:
                break
            done = self.next_to_issue()
            self.history.step_instruction()
            self._record()
        if self.finished:
            return self._finish(self._finished_stop())
        count = int(m.counters()["instructions"]) - retired
        what = f"{self.where(done)} finished its stage; " if done is not None else ""
        return self._finish(Stop("paused", f"cycle {m.cycle}: {what}{count} instruction(s) "
                                           f"retired; {self.where(self.next_to_issue())} next"))

    def step_issue(self) -> Stop:
        """`issue`: run until the next instruction has issued (the cycle after its issue
        cycle), however long the front end waits for it; breakpoints do not stop it."""
        m = self.machine
        if self.finished:
            return self._finish(self._finished_stop())
        nxt = self.next_to_issue()
        if nxt is None:
            return self._finish(Stop("paused", f"cycle {m.cycle}: nothing left to issue"))
        stop = self.last_stop
        sitting = (m.status == "breakpoint" and stop is not None and stop.index == nxt
                   and stop.cycle == m.cycle)     # the machine would issue it and run on
        while m.issue_cycle(nxt) < 0 and not self.finished and not sitting:
            r = self.history.step(CHUNK_CYCLES, breakpoints=[nxt])
            if r.status == "breakpoint" or m.issue_cycle(nxt) >= 0:
                break
            if self.cancel.is_set():
                self._record()
                return self._finish(Stop("interrupted", f"interrupted at cycle {m.cycle}"))
        if m.issue_cycle(nxt) < 0 and not self.finished:
            self.history.step(1)               # at its issue cycle: one more and it has issued
        self._record()
        if self.finished and m.issue_cycle(nxt) < 0:
            return self._finish(self._finished_stop())
        return self._finish(Stop("paused", f"cycle {m.cycle}: {self.where(nxt)} issued at cycle "
                                           f"{m.issue_cycle(nxt)}; "
                                           f"{self.where(self.next_to_issue())} next"))

    def issued_already(self, indices) -> int | None:
        """The cycle at which the last of `indices` issued if all have (a TPU program has no
        branches: such a line is never reached again), else None."""
        cycles = [self.machine.issue_cycle(i) for i in indices]
        return max(cycles) if cycles and min(cycles) >= 0 else None

    def finish_in_flight(self) -> Stop:
        """`finish`: run until every instruction issued so far has finished its stage
        (breakpoints and watchpoints still stop it)."""
        m = self.machine
        if self.finished:
            return self._finish(self._finished_stop())
        times = m.intervals()
        in_flight = np.flatnonzero(times[:, 2] > m.cycle)
        if not len(in_flight):
            return self._finish(Stop("paused", f"cycle {m.cycle}: nothing in flight"))
        end = int(times[in_flight, 2].max())
        stop = self.run(max_cycles=end - m.cycle)
        if stop.kind == "paused":
            names = ", ".join(f"#{i}" for i in in_flight[:8]) + (" ..." if len(in_flight) > 8 else "")
            stop = self._finish(Stop("paused", f"cycle {m.cycle}: {names} finished; "
                                               f"{self.where(self.next_to_issue())} next"))
        return stop

    def run(self, max_cycles: int | None = None, progress=None) -> Stop:
        """Continue until a breakpoint, watchpoint, caught event, halt, fault, `max_cycles`
        more cycles, or `cancel` is set (from another thread).  `progress(cycle, seconds)`
        is called between chunks."""
        progress = progress or self.on_progress
        if self.finished:
            return self._finish(self._finished_stop())
        start = self.machine.cycle
        started = time.perf_counter()
        while True:
            budget = CHUNK_CYCLES
            if max_cycles is not None:
                left = start + max_cycles - self.machine.cycle
                if left <= 0:
                    self._record()
                    return self._finish(Stop("paused", f"ran {max_cycles} cycles, now cycle "
                                                       f"{self.machine.cycle}"))
                budget = min(budget, left)
            stop = self._bounded(budget)
            if stop is not None:
                self._record()
                return self._finish(stop)
            if self.cancel.is_set():
                self._record()
                return self._finish(Stop("interrupted", f"interrupted at cycle {self.machine.cycle}"))
            if progress is not None:
                progress(self.machine.cycle, time.perf_counter() - started)

    def run_to(self, indices: list[int], where: str, cycle: int | None = None) -> Stop:
        """Run to cursor: a temporary breakpoint on `indices` (or at `cycle`)."""
        # number 0: internal, never listed, never takes a user-visible number
        self.breakpoints[0] = Breakpoint(0, tuple(indices), where, temporary=True, cycle=cycle)
        try:
            return self.run()
        finally:
            self.breakpoints.pop(0, None)

    def _bounded(self, budget: int) -> Stop | None:
        """Run at most `budget` cycles honouring breakpoints, watchpoints and caught events;
        the Stop if the run must stop (a hit that holds, halt, fault), else None.

        The library's bounded step stops at breakpoints and watchpoints and pauses at the
        limit; a hit whose condition, ignore count or unchanged values let it pass simply
        steps on (the machine issues the instruction it stopped in front of)."""
        m = self.machine
        end = m.cycle + budget
        sitting = self._at_breakpoint()
        while m.cycle < end:
            start = m.cycle
            limit = end
            at_cycle = self._next_cycle_break()
            if at_cycle is not None and at_cycle < limit:
                limit = at_cycle                  # a cycle breakpoint: the run ends there
            r = self.history.step(limit - start, breakpoints=self._armed_indices(),
                                  watch=self._armed_watches())
            if r.status == "breakpoint" and r.index == sitting and m.cycle == start:
                # History.goto forgets that the machine sat at a breakpoint: step it out
                while m.issue_cycle(sitting) < 0 and not self.finished:
                    self.history.step(1)
                sitting = None
                continue
            sitting = None
            if r.status in ("halted", "fault"):
                return self._finished_stop()
            hits = []
            if r.status == "breakpoint":
                hits = self._breakpoint_hits(r.index)
            elif r.status == "watchpoint":
                hits = self._watch_hits(r.index)
            if hits and hits[0][0] == "error":
                return Stop.of_hits(hits[:1])
            # a cycle breakpoint at this cycle stops with them (after the completions
            # that stopped a watch: they happened first, at the start of the cycle)
            hits += self._cycle_hits()
            stop = Stop.of_hits(hits)
            if stop is not None:
                return stop
        return self._finished_stop() if self.finished else None

    def _cycle_hits(self) -> list:
        """The cycle breakpoints at the current cycle whose conditions hold."""
        now = self.machine.cycle
        return self._take_hits([bp for bp in self.breakpoints.values()
                                if bp.enabled and bp.cycle == now], None)

    def _take_hits(self, candidates, index: int | None) -> list:
        """(kind, message, index, number) for each breakpoint of `candidates` that stops:
        its condition holds and no ignore count lets it pass (those are counted down)."""
        hits = []
        now = self.machine.cycle
        for bp in sorted(candidates, key=lambda b: b.number):
            if bp.condition:
                try:
                    holds = self.eval.truth(bp.condition)
                except ExprError as e:
                    return [("error", f"breakpoint {bp.number}: condition `{bp.condition}`: {e}",
                             index, bp.number)]
                if not holds:
                    continue
            if bp.ignore > 0:
                bp.ignore -= 1
                continue
            bp.hits += 1
            if bp.temporary:
                del self.breakpoints[bp.number]
            at = self.where(index) if index is not None else f"cycle {now}"
            label = "temporary breakpoint" if bp.temporary else "breakpoint"
            if bp.number == 0:
                hits.append(("breakpoint", f"reached {bp.where}: {at}, cycle {now}"
                             if index is not None else f"reached cycle {now}", index, None))
            elif index is None:
                hits.append(("breakpoint", f"{label} {bp.number} at cycle {now}", None, bp.number))
            else:
                hits.append(("breakpoint", f"{label} {bp.number} at {at}, cycle {now}"
                             + (f" ({bp.where} if {bp.condition})" if bp.where == ANYWHERE else ""),
                             index, bp.number))
        return hits

    def _at_breakpoint(self) -> int | None:
        """The instruction a run starts in front of: like the machine's own rule (and gdb's),
        a run started at a breakpoint issues it instead of stopping there again.  The
        machine knows this itself except after History.goto (a step back), which forgets
        it.  At cycle 0 nothing has been seen yet, so a breakpoint on the first instruction
        still stops."""
        nxt = self.next_to_issue()
        if nxt is None or self.machine.issue_cycle(nxt) >= 0:
            return None
        stop = self.last_stop
        if stop is not None and stop.kind == "watchpoint" and stop.cycle == self.machine.cycle:
            # a watch stopped the run at the start of this cycle, before anything issued in
            # it: a breakpoint on the next issue has not been reported yet
            return None
        if stop is not None and stop.index == nxt and stop.kind != "watchpoint":
            return nxt
        return nxt if self.machine.cycle > 0 else None

    def _breakpoint_hits(self, index: int) -> list:
        """Everything that stops before instruction `index` issues: caught events, then
        every breakpoint on it whose condition holds, in number order."""
        ins = self.program.instructions[index]
        now = self.machine.cycle
        hits = []
        for kind, key, name in (("tag", "TAG", "Debug_Tag"), ("interrupt", "INT", "Interrupt_Host")):
            if kind in self.catch and ins.key == key:
                value = next(iter(ins.operands.values()), 0)
                hits.append((kind, f"caught {name} {value}: {self.where(index)} about to issue "
                                   f"at cycle {now}", index, None))
        if "unwritten" in self.catch and index in self.unwritten_reads():
            rows = "; ".join(f"{u.memory} rows from {u.memory}[{u.start}] ({u.count} row(s))"
                             for u in self.unwritten_reads()[index])
            hits.append(("unwritten", f"caught a read of rows never written since load: "
                                      f"{self.where(index)} reads {rows}; about to issue at "
                                      f"cycle {now}", index, None))
        candidates = [bp for bp in self.breakpoints.values() if bp.enabled and bp.cycle is None
                      and (index in bp.indices or bp.where == ANYWHERE)]
        found = self._take_hits(candidates, index)
        if found and found[0][0] == "error":
            return found
        return hits + found

    @property
    def accesses(self):
        """The program's access map (tpuasm.machine.access), built on first use."""
        from tpuasm.machine.access import AccessMap
        if getattr(self, "_accesses", None) is None or self._accesses.machine is not self.machine \
                or self._accesses_program is not self.program:
            self._accesses, self._accesses_program = AccessMap(self.machine), self.program
        return self._accesses

    def pending_writes(self, memory: str) -> list[tuple[int, int, int, int]]:
        """(index, first row, end row, finish cycle) of the writes to `memory` by instructions
        in flight: their effects land, all at once, when they finish."""
        from tpuasm.machine.access import MEMORY_CODES
        m = self.machine
        if memory not in MEMORY_CODES:
            return []
        times = m.intervals()
        a = self.accesses
        sel = (a.mem == MEMORY_CODES[memory]) & (a.write == 1)
        idx = a.index[sel]
        fin = times[idx, 2]
        live = (times[idx, 0] >= 0) & (fin > m.cycle)
        spans: dict[int, list[int]] = {}          # a strided write is several runs: its span
        for i, lo, hi, f in zip(idx[live], a.lo[sel][live], a.hi[sel][live], fin[live]):
            span = spans.setdefault(int(i), [int(lo), int(hi), int(f)])
            span[0], span[1] = min(span[0], int(lo)), max(span[1], int(hi))
        return [(i, lo, hi, f) for i, (lo, hi, f) in spans.items()]

    def _watch_hits(self, first: int) -> list:
        """Every watchpoint that the instructions completing at this cycle hit, in the
        order they completed (`first`, the one the machine names, first) and by number.
        The machine stops at the cycle of the first watched access but completes every
        instruction that finishes in that cycle, so one stop must report them all."""
        m = self.machine
        times = m.intervals()
        done = [first] + [int(i) for i in np.flatnonzero(times[:, 2] == m.cycle) if int(i) != first]
        order = {index: k for k, index in enumerate(done)}
        found = []
        for wp in sorted(self.watchpoints.values(), key=lambda w: w.number):
            if not wp.enabled:
                continue
            new = self._rows_of(wp)
            write = {"change": True, "write": True, "read": False, "access": None}[wp.access]
            who = next((i for i in done for memory, a, b in wp.ranges()
                        if self.accesses.touches(i, memory, a, b, write)), None)
            if who is None:
                continue
            if wp.condition:
                try:
                    truth = self.eval.truth(wp.condition)
                except ExprError:
                    truth = wp.truth        # checked when set; cannot fail on new values
                if truth == wp.truth:
                    continue
                message = (f"watchpoint {wp.number} `{wp.condition}` became "
                           f"{'true' if truth else 'false'} after a write by {self.where(who)} "
                           f"at cycle {m.cycle}")
                wp.truth = truth
            elif wp.access != "change":
                # watch -w / rwatch / awatch: any access of that kind, whatever the values
                verb = {"write": "written", "read": "read", "access": "accessed"}[wp.access]
                message = (f"watchpoint {wp.number} {wp.text} {verb} by {self.where(who)} "
                           f"at cycle {m.cycle}")
            else:
                if wp.old is not None and np.array_equal(new, wp.old):
                    continue                # written, but with the same values: not a change
                message = (f"watchpoint {wp.number} {wp.text} written by {self.where(who)} at "
                           f"cycle {m.cycle}{_change_detail(wp, new)}")
            wp.old = new.copy()
            wp.hits += 1
            found.append((order[who], wp.number, ("watchpoint", message, who, wp.number)))
        return [hit for _, _, hit in sorted(found)]

    # -- reverse -------------------------------------------------------------------------
    def _remember_run(self) -> None:
        """Before going back: keep the run seen so far if it is the furthest yet."""
        m, far = self.machine, self.recorded
        if far is None or far.program is not self.program or far.cycle < m.cycle:
            self.recorded = RecordedRun(self.program, m.cycle, m.intervals().copy(),
                                        m.tile_intervals().copy(), list(m.events), m.fault)

    def goto_cycle(self, cycle: int) -> Stop:
        """`jump`: exactly the state at `cycle`: back through the History, or forward by
        stepping (a jump passes breakpoints, like a step)."""
        m = self.machine
        if cycle < m.cycle:
            self._remember_run()
            self.history.goto(cycle)
            return self._finish(Stop("paused", f"jumped back to cycle {m.cycle}"), reverse=True)
        if cycle > m.cycle:
            stop = self.step_cycles(cycle - m.cycle)
            if stop.kind != "paused":
                return stop
        return self._finish(Stop("paused", f"at cycle {m.cycle}"))

    def jump_to_access(self, loc: Location, write: bool) -> tuple[Stop, int] | None:
        """Back to the latest write (or read) of `loc`'s rows that completed before the
        current cycle: the machine is put at the cycle it completed, its effects visible
        (so going again walks further back).  (Stop, instruction index), or None if there
        is no such access."""
        m = self.machine
        self._check_range(loc)
        done = [a for a in self.accesses.history(loc.memory, loc.row, loc.row + loc.rows,
                                                 write=write) if 0 <= a.finish < m.cycle]
        if not done:
            return None
        a = done[-1]
        self._remember_run()
        self.history.goto(a.finish)
        verb = "wrote" if write else "read"
        rows = rows_text(loc)
        return self._finish(Stop("paused", f"back to cycle {m.cycle}, where {self.where(a.index)} "
                                           f"{verb} {rows} (issued at cycle {a.issue})",
                                 a.index), reverse=True), a.index

    def reverse_cycles(self, n: int = 1) -> Stop:
        n = min(n, self.machine.cycle)
        if n <= 0:
            return self._finish(Stop("paused", "at cycle 0: nothing to undo"))
        self._remember_run()
        self.history.back(cycles=n)
        return self._finish(Stop("paused", f"back to cycle {self.machine.cycle}"), reverse=True)

    def reverse_instructions(self, n: int = 1) -> Stop:
        self._remember_run()
        for _ in range(n):
            if self.machine.cycle == 0:
                break
            self.history.back_instruction()
        return self._finish(Stop("paused", f"back to cycle {self.machine.cycle}: "
                                           f"{self.where(self.next_to_issue())} next"), reverse=True)

    def reverse_continue(self) -> Stop:
        now = self.machine.cycle
        self._remember_run()
        r = self.history.reverse_continue(self._armed_indices(), self._armed_watches())
        m = self.machine
        # a cycle breakpoint between that hit and now is the previous hit
        cycles = [bp.cycle for bp in self.breakpoints.values()
                  if bp.enabled and bp.cycle is not None and m.cycle < bp.cycle < now]
        if cycles:
            self.history.goto(max(cycles))
            return self._finish(Stop("breakpoint", f"reverse: breakpoint at cycle {m.cycle}"),
                                reverse=True)
        if r.status == "breakpoint":
            msg = f"reverse: breakpoint at {self.where(r.index)}, cycle {m.cycle}"
        elif r.status == "watchpoint":
            msg = "\n".join(self._reverse_watch_lines(r.index)) or \
                f"reverse: watched rows accessed by {self.where(r.index)}, cycle {m.cycle}"
        else:
            msg = f"reverse: reached cycle {m.cycle}"
        return self._finish(Stop(r.status if r.status in ("breakpoint", "watchpoint") else "paused",
                                 msg, r.index), reverse=True)

    def _reverse_watch_lines(self, index: int) -> list[str]:
        """What instruction `index` did to each armed watchpoint: an rwatch was *read*."""
        lines = []
        for wp in sorted(self.watchpoints.values(), key=lambda w: w.number):
            if not wp.enabled:
                continue
            reads = self.accesses.touches(index, wp.memory, wp.start, wp.stop, False)
            writes = self.accesses.touches(index, wp.memory, wp.start, wp.stop, True)
            verb = {"change": "written" if writes else None,
                    "write": "written" if writes else None,
                    "read": "read" if reads else None,
                    "access": ("read and written" if reads and writes else
                               "read" if reads else "written" if writes else None)}[wp.access]
            if verb:
                lines.append(f"reverse: watchpoint {wp.number} {wp.text} {verb} by "
                             f"{self.where(index)}, cycle {self.machine.cycle}")
        return lines

    def reload(self) -> tuple[Stop, list[str]]:
        """Re-read and re-assemble the program's file and start it again at cycle 0,
        keeping breakpoints and watchpoints: a line breakpoint follows its line where the
        text moved; those that no longer fit are deleted and reported.  An assembly error
        changes nothing (raises ReloadError with the rendered diagnostics, carets and all)."""
        from tpuasm.errors import AssemblyError, TpuasmError
        if self.reload_from is None:
            raise ReloadError("this program was not loaded from a file: nothing to reload")
        from tpuasm.program import load_program
        path, shape = self.reload_from
        try:
            program = load_program(path, shape or None)
        except AssemblyError as e:
            raise ReloadError(e.render(color=False)) from None
        except (TpuasmError, OSError) as e:
            raise ReloadError(str(e)) from None
        old = self.program
        try:
            self._use_program(program)
        except (TpuasmError, ValueError, TypeError) as e:
            self._use_program(old)
            raise ReloadError(f"cannot load the new program: {e}") from None
        notes = self._carry_over(old)
        stop = self._finish(Stop("paused", f"reloaded {path}: {len(program)} instructions, "
                                           "restarted at cycle 0"), reverse=True)
        return stop, notes

    def open_segment(self, files) -> tuple[Stop, list[str]]:
        """Another segment of the compiled model (tpuasm.compiler.outdir.SegmentFiles): its
        program and data at cycle 0; breakpoints carried over like `reload` (a `node`
        breakpoint waits, dormant, in a segment without its node)."""
        saved = (self.reload_from, self.host_arg, self.weights_arg, self.source_name)
        shape = self.reload_from[1] if self.reload_from else {}
        self.reload_from, self.source_name = (files.program, shape), str(files.program)
        self.host_arg = self.segment_hosts.get(files.name, files.host)
        self.weights_arg = files.weights
        try:
            stop, notes = self.reload()
        except ReloadError:
            self.reload_from, self.host_arg, self.weights_arg, self.source_name = saved
            self._use_program(self.program)
            raise
        self.segment = files.name
        stop.message = (f"opened {files.name} ({files.program.name}): {len(self.program)} "
                        "instructions, at cycle 0")
        return stop, notes

    def _carry_over(self, old) -> list[str]:
        """Re-place every breakpoint and watchpoint on the new program; the notes say what moved
        and what was deleted."""
        from .relocate import line_map
        notes = []
        maps: dict[str, dict[int, int]] = {}
        for bp in sorted(list(self.breakpoints.values()), key=lambda b: b.number):
            if bp.cycle is not None or bp.where == ANYWHERE:
                continue                      # not tied to the program's text
            where, new_indices, why = bp.where, None, None
            m = re.fullmatch(r"(.+):(\d+)", bp.where)
            if bp.where.startswith("node "):
                runs = self.program.node_runs(bp.where[5:])
                new_indices = [r.start for r in runs] or None
                why = None if runs else "the node is gone"
                if not runs and self.outdir is not None:
                    bp.indices = ()             # its node is in another segment: dormant
                    notes.append(f"breakpoint {bp.number} at {bp.where} waits: the node is "
                                 f"not in this segment")
                    continue
            elif bp.where.startswith("*"):
                i = int(bp.where[1:])
                new_indices = [i] if i < len(self.program) else None
                why = None if new_indices else f"the program has {len(self.program)} instructions"
            elif m:
                file, line = m.group(1), int(m.group(2))
                if file not in maps:
                    maps[file] = line_map(old.sources.get(file, ""), self.program.sources.get(file, ""))
                new_line = maps[file].get(line)
                if file not in self.program.sources:
                    why = f"{file} is not part of this program"
                elif new_line is None:
                    why = f"line {line} was edited or deleted"
                else:
                    new_indices = self.indices_for_line(file, new_line) or None
                    why = None if new_indices else f"line {new_line} holds no instruction now"
                    where = f"{file}:{new_line}"
            else:
                entry = self.symbols.get(bp.where)
                if entry is not None and entry[0] == "label":
                    new_indices = [entry[1]]
                else:
                    why = f"no label {bp.where} now"
            if new_indices is None:
                del self.breakpoints[bp.number]
                notes.append(f"breakpoint {bp.number} at {bp.where} deleted: {why}")
                continue
            if where != bp.where:
                notes.append(f"breakpoint {bp.number} moved from {bp.where} to {where}")
            bp.where, bp.indices = where, tuple(new_indices)
        for wp in sorted(list(self.watchpoints.values()), key=lambda w: w.number):
            if wp.condition:
                try:
                    wp.spans = self._condition_spans(wp.condition)
                    wp.memory, wp.start, wp.stop = wp.spans[0]
                except ExprError as e:
                    del self.watchpoints[wp.number]
                    notes.append(f"watchpoint {wp.number} on {wp.condition} deleted: {e}")
                continue
            try:
                loc = self.eval.location(wp.text)
                self._check_range(loc)
            except ExprError as e:
                del self.watchpoints[wp.number]
                notes.append(f"watchpoint {wp.number} on {wp.text} deleted: {e}")
                continue
            if (loc.memory, loc.row, loc.row + loc.rows) != (wp.memory, wp.start, wp.stop):
                notes.append(f"watchpoint {wp.number} {wp.text} now {loc.memory} rows "
                             f"{loc.row}..{loc.row + loc.rows - 1}")
            wp.memory, wp.start, wp.stop = loc.memory, loc.row, loc.row + loc.rows
        return notes

    def restart(self) -> Stop:
        self._remember_run()
        self.machine.load(self.program, host=self.host_arg, weights=self.weights_arg)
        from tpuasm.machine import History
        self.history = History(self.machine, interval=HISTORY_INTERVAL)
        self.samples.clear()
        self._sample_order.clear()
        self._record()
        return self._finish(Stop("paused", "restarted at cycle 0"), reverse=True)

    # -- bookkeeping -----------------------------------------------------------------------
    def _finish(self, stop: Stop, reverse: bool = False) -> Stop:
        if reverse:
            # forget recorded cycles that are now in the future
            for c in [c for c in self.samples if c > self.machine.cycle]:
                del self.samples[c]
            self._sample_order = deque(c for c in self._sample_order if c in self.samples)
            self._record()
        for wp in self.watchpoints.values():
            wp.old = self._rows_of(wp).copy()
            if wp.condition:
                try:
                    wp.truth = self.eval.truth(wp.condition)
                except ExprError:
                    pass
        stop.cycle = self.machine.cycle
        self.last_stop = stop
        return stop

    def new_events(self) -> list:
        """Events since the last call (interrupts, tags, faults) for the log."""
        events = self.machine.events
        if len(events) < self.events_seen:       # went back in time
            self.events_seen = len(events)
            return []
        out = list(events[self.events_seen:])
        self.events_seen = len(events)
        return out

    def _record(self) -> None:
        c = self.machine.cycle
        sample = {st.name: StageSample(st.index, st.stall is not None) for st in self.pipeline()}
        if c not in self.samples:
            self._sample_order.append(c)
        self.samples[c] = sample
        while len(self._sample_order) > TIMELINE_DEPTH:
            self.samples.pop(self._sample_order.popleft(), None)


def rows_text(loc: Location) -> str:
    """`ub[8]`, or `ub[8]..[11]` for several rows."""
    return f"{loc.memory}[{loc.row}]" + (f"..[{loc.row + loc.rows - 1}]" if loc.rows > 1 else "")


def _watch(wp: Watchpoint):
    from tpuasm.machine import Watch
    return Watch(wp.memory, wp.start, wp.stop, {"change": "write"}.get(wp.access, wp.access))


def _show(memory: str, v) -> str:
    v = int(v)
    if memory in ("ub", "host") and v > 127:
        v -= 256
    return str(v)


def _change_detail(wp: Watchpoint, new: np.ndarray) -> str:
    """`; 32 value(s) changed, first acc[0][0]: -3 -> -41`."""
    if wp.old is None:
        return ""
    diff = np.argwhere(new != wp.old)
    if not len(diff):
        return ""
    r, c = (int(x) for x in diff[0])
    return (f"; {len(diff)} value(s) changed, first {wp.memory}[{wp.start + r}][{c}]: "
            f"{_show(wp.memory, wp.old[r, c])} -> {_show(wp.memory, new[r, c])}")


def _statement(program, index: int) -> str | None:
    """The source statement of instruction `index` if it spells that instruction."""
    if not 0 <= index < len(program):
        return None
    loc = program.locations[index]
    text = program.sources.get(loc.file) if loc is not None else None
    if text is None:
        return None
    lines = text.splitlines()
    if not 0 < loc.line <= len(lines):
        return None
    statement = lines[loc.line - 1].split(";", 1)[0].strip()
    statement = re.sub(r"^[A-Za-z_.$][\w.$]*:\s*", "", statement)     # a label before it
    word = statement.split(None, 1)[0] if statement else ""
    canonical = format_instruction(program.instructions[index]).split(None, 1)[0]
    if word.upper().split(".")[0] != canonical.upper().split(".")[0]:
        return None
    return " ".join(statement.split())

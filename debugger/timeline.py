"""The whole-run timeline, drawn like a waveform viewer: one track per pipeline stage, the
weight path (fetch, FIFO, shift, switch) and the host path, from cycle 0 to now.

Nothing is recorded per cycle: every cell is computed from the machine's per-instruction
intervals (issue, start, finish) and per-tile intervals, with a binary search per cell, so
a 500k-cycle run draws as fast as a short one.  Each cell covers `zoom` cycles (1 up to the
whole run); within a cell the state that held longest wins.  A stage's waiting time (issued,
not started) is coloured by its cause: RAW hazard, weights, host data.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from .strips import StripLines, text_strips

STAGES = ("input", "matrix", "activate", "output")
TRACKS = ("front", *STAGES, "w.fetch", "w.fifo", "w.shift", "host", "marks")
LABEL = 9
COLOURS = {"front": "white", "input": "green", "matrix": "magenta", "activate": "cyan",
           "output": "blue", "w.fetch": "yellow", "w.shift": "yellow", "host": "bright_green"}
CAUSES = {"raw": ("RAW", "red"), "weights": ("weights", "dark_orange"),
          "host": ("host data", "bright_magenta"), "busy": ("stage busy", "grey50")}
_HOST_OPS = ("RHM", "RHMA", "WHM", "WHMA")


@dataclass
class Track:
    """Intervals of one track sorted by start: [start, end) cycles and what each is (an
    instruction index, or a tile number for the weight path)."""
    starts: np.ndarray
    ends: np.ndarray
    ids: np.ndarray
    prefix: str = "#"           # label: prefix + id

    @classmethod
    def of(cls, starts, ends, ids, prefix="#") -> "Track":
        starts, ends, ids = (np.asarray(a, np.int64) for a in (starts, ends, ids))
        keep = ends > starts
        starts, ends, ids = starts[keep], ends[keep], ids[keep]
        order = np.argsort(starts, kind="stable")
        return cls(starts[order], ends[order], ids[order], prefix)


class Waveform:
    """The run's tracks at the machine's current cycle, built with numpy from the machine's
    intervals (no per-instruction Python loop: a 500k-cycle run stays quick)."""

    def __init__(self, session, stage_codes: np.ndarray, host_ops: np.ndarray, mmc: np.ndarray,
                 machine=None):
        s = session
        m = machine or s.machine          # or a session.RecordedRun: the run seen so far
        self.session = session
        self.now = now = m.cycle
        times = m.intervals()
        issue, start, finish = times[:, 0], times[:, 1], times[:, 2]
        issued = issue >= 0
        ids = np.arange(len(times))
        start_c, finish_c = np.minimum(start, now), np.minimum(finish, now)
        self.tracks: dict[str, Track] = {}
        front = issued & (stage_codes < 0)
        self.tracks["front"] = Track.of(
            np.concatenate([issue[front], issue[issued & (stage_codes >= 0)]]),
            np.concatenate([np.maximum(finish_c[front], issue[front] + 1),
                            issue[issued & (stage_codes >= 0)] + 1]),
            np.concatenate([ids[front], ids[issued & (stage_codes >= 0)]]))
        self.waits: dict[str, Track] = {}
        for code, name in enumerate(STAGES):
            sel = issued & (stage_codes == code)
            self.tracks[name] = Track.of(start_c[sel], finish_c[sel], ids[sel])
            self.waits[name] = Track.of(issue[sel], start_c[sel], ids[sel])
        host = issued & host_ops
        self.tracks["host"] = Track.of(start_c[host], finish_c[host], ids[host])
        self.mmc = mmc
        tiles = m.tile_intervals()
        tile, req, fs, fe, ss, se, sw = (tiles[:, k] for k in range(7))

        def clip(a, b):
            ok = (a >= 0) & (a < now)
            return a[ok], np.minimum(np.where(b >= 0, b, now), now)[ok], tile[ok]
        self.tracks["w.fetch"] = Track.of(*clip(fs, fe), prefix="t")
        self.tracks["w.shift"] = Track.of(*clip(ss, se), prefix="t")
        ok = (req >= 0) & (req < now)
        self.fifo_in = np.sort(req[ok])
        self.fifo_out = np.sort(np.minimum(np.where(ss >= 0, ss, now), now)[ok])
        self.switches = sw[(sw >= 0) & (sw < now)].tolist()
        # markers: breakpoints (at the issue of their instructions), tags/interrupts, faults
        self.marks: list[tuple[int, str, str]] = []
        for bp in s.breakpoints.values():
            for i in bp.indices:
                c = m.issue_cycle(i)
                if c >= 0:
                    self.marks.append((c, "●", "bright_red"))
        for e in m.events:
            char = {"tag": "T", "interrupt": "I", "fault": "✖"}.get(e.kind, "?")
            self.marks.append((e.cycle, char, "bold red" if e.kind == "fault" else "cyan"))
        if m.fault is not None:
            self.marks.append((m.fault.cycle, "✖", "bold red"))

    def cause(self, index: int) -> str:
        """Why instruction `index` waited in its stage (cached: it never changes once issued)."""
        cache = self.session.__dict__.setdefault("_wait_causes", {})
        key = (id(self.session.program), index)
        if key not in cache:
            mmc = bool(self.mmc[index])
            cause = "weights" if mmc else "busy"
            blocker = self.session.accesses.blocker(index)
            if blocker is not None and not (mmc and self.mmc[blocker]):
                key_b = self.session.program.instructions[blocker].key
                cause = "host" if key_b in ("RHM", "RHMA") else "raw"
            cache[key] = cause
        return cache[key]

    def cells(self, track: Track, c0: int, zoom: int, width: int) -> list[int]:
        """Per cell, the interval that covers most of it (-1: none)."""
        if not len(track.starts):
            return [-1] * width
        bounds = c0 + zoom * np.arange(width + 1, dtype=np.int64)
        lo, hi = bounds[:-1], bounds[1:]
        # the last interval starting before each cell's end, and the one before it
        k = np.searchsorted(track.starts, hi, side="right") - 1
        best = np.full(width, -1, np.int64)
        cover = np.zeros(width, np.int64)
        for back in range(3):          # intervals are sorted; a cell meets few of them at
            kk = k - back              # fine zoom, and at coarse zoom the latest is shown
            ok = kk >= 0
            kc = np.where(ok, kk, 0)
            overlap = np.minimum(track.ends[kc], hi) - np.maximum(track.starts[kc], lo)
            better = ok & (overlap > 0) & (overlap > cover)
            best = np.where(better, kk, best)
            cover = np.where(better, overlap, cover)
        return best.tolist()

    def fifo_level(self, c0: int, zoom: int, width: int) -> list[int]:
        at = c0 + zoom * np.arange(width, dtype=np.int64) + zoom // 2
        return (np.searchsorted(self.fifo_in, at, side="right")
                - np.searchsorted(self.fifo_out, at, side="right")).tolist()


def _append_runs(text: Text, cells: list[tuple[str, str]]) -> None:
    """Append one-character cells, a span per run of equally styled ones (a span per cell
    made rendering the pane cost more than computing it)."""
    run, run_style = [], None
    for ch, style in cells:
        if style != run_style and run:
            text.append("".join(run), style=run_style)
            run = []
        run_style = style
        run.append(ch)
    if run:
        text.append("".join(run), style=run_style)


class TimelinePane(StripLines, Widget, can_focus=True):
    """The waveform: scroll with left/right, zoom with +/-, `0` the whole run, `.` follow
    the current cycle; a click (or enter, at the cursor) jumps the machine to that cycle."""

    BINDINGS = [
        Binding("left", "scroll(-1)", "Earlier", show=False),
        Binding("right", "scroll(1)", "Later", show=False),
        Binding("plus,equals_sign", "zoom(0.5)", "Zoom in", show=False),
        Binding("minus", "zoom(2)", "Zoom out", show=False),
        Binding("0", "fit", "Whole run", show=False),
        Binding("full_stop", "follow", "Follow", show=False),
        Binding("enter", "jump", "Jump here", show=False),
        Binding("comma", "cursor(-1)", show=False),
        Binding("slash", "cursor(1)", show=False),
    ]
    DEFAULT_CSS = "TimelinePane { height: 1fr; } TimelinePane:focus { background: $boost; }"

    class Jump(Message):
        def __init__(self, cycle: int):
            super().__init__()
            self.cycle = cycle

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self.zoom = 1
        self.c0 = 0
        self.follow = True
        self.cursor: int | None = None        # a cycle picked with , and / (enter jumps there)
        self._wave: Waveform | None = None
        self._wave_key = None
        self._strips: list[Strip] = []
        self.reload()

    def reload(self) -> None:
        """Per-program arrays (a new program after `reload`)."""
        instructions = self.session.program.instructions
        self._stage_codes = np.array([STAGES.index(ins.spec.stage) if ins.spec.stage in STAGES
                                      else -1 for ins in instructions], np.int64)
        self._host_ops = np.array([ins.key in _HOST_OPS for ins in instructions], bool)
        self._mmc = np.array([ins.key == "MMC" for ins in instructions], bool)
        self._wave = None
        self._wave_key = None
        self._furthest = None           # (session.recorded, its Waveform) after a jump back

    def wave(self) -> Waveform:
        """The waveform up to now; after a jump back, the whole run recorded so far with
        `now` where the machine is (a program runs the same way every time: what was seen
        after now is what will happen again)."""
        s = self.session
        key = (id(s.machine), id(s.program), s.machine.cycle, s.machine.status,
               tuple((n, b.enabled, b.indices) for n, b in s.breakpoints.items()))
        if key != self._wave_key:
            wave = Waveform(s, self._stage_codes, self._host_ops, self._mmc)
            run = s.recorded
            if run is not None and run.program is s.program and run.cycle > wave.now:
                if self._furthest is None or self._furthest[0] is not run:
                    self._furthest = (run, Waveform(s, self._stage_codes, self._host_ops,
                                                    self._mmc, machine=run))
                shown = copy.copy(self._furthest[1])
                shown.now = wave.now
                shown.marks = wave.marks + [mark for mark in shown.marks if mark[0] >= wave.now]
                wave = shown
            self._wave = wave
            self._wave_key = key
        return self._wave

    @property
    def columns(self) -> int:
        return max(8, (self.size.width or 80) - LABEL)

    def on_resize(self) -> None:
        self.update_state()

    def update_state(self) -> None:
        if not self.display or not self.size.width:
            return
        wave = self.wave()
        cols = self.columns
        if self.follow:
            self.c0 = max(0, wave.now - (cols - 2) * self.zoom)
        self.show(text_strips(self.app.console, self.render_wave(wave, cols)))

    def render_wave(self, wave: Waveform, cols: int) -> Text:
        c0, zoom, now = self.c0, self.zoom, wave.now
        text = Text(no_wrap=True, overflow="crop")
        span = f"cycles {c0:,}..{c0 + cols * zoom - 1:,}  {zoom:,}/cell"
        text.append("cycle".ljust(LABEL), style="bold")
        ruler = [" "] * cols
        step = max(10, len(f"{c0 + cols * zoom:,}") + 2)
        for x in range(0, cols, step):
            label = f"|{c0 + x * zoom:,}"
            ruler[x:x + len(label)] = label
        text.append("".join(ruler)[:cols] + "\n", style="grey62")
        now_x = (now - c0) // zoom if zoom else -1
        for name in TRACKS:
            text.append(name.ljust(LABEL), style=f"bold {COLOURS.get(name, 'white')}")
            if name == "marks":
                row = [(" ", "")] * cols
                for c, ch, style in wave.marks:
                    x = (c - c0) // zoom
                    if 0 <= x < cols:
                        row[x] = (ch, style)
                for c in wave.switches:
                    x = (c - c0) // zoom
                    if 0 <= x < cols and row[x][0] == " ":
                        row[x] = ("s", "yellow")
                if 0 <= now_x < cols:
                    row[now_x] = ("▼", "bold bright_white")
                _append_runs(text, row)
            elif name == "w.fifo":
                levels = wave.fifo_level(c0, zoom, cols)
                _append_runs(text, [(" " if c0 + x * zoom >= now else
                                     ("·" if n == 0 else str(min(n, 9))),
                                     "grey30" if n == 0 else "yellow")
                                    for x, n in enumerate(levels)])
            else:
                self._draw_track(text, wave, name, c0, zoom, cols, now)
            text.append("\n")
        text.append(f"{span}  ", style="grey50")
        for _, (label, colour) in CAUSES.items():
            text.append(f" {label} ", style=f"bold white on {colour}")
            text.append(" ")
        text.append(" ←/→ scroll  +/- zoom  0 all  . now  click: jump", style="grey50")
        return text

    def _draw_track(self, text, wave, name, c0, zoom, cols, now) -> None:
        track = wave.tracks[name]
        waits = wave.waits.get(name)
        busy = wave.cells(track, c0, zoom, cols)
        wait = wave.cells(waits, c0, zoom, cols) if waits is not None else [-1] * cols
        colour = COLOURS[name]
        x = 0
        while x < cols:
            if c0 + x * zoom >= now:
                text.append(" " * (cols - x))
                return
            k, w = busy[x], wait[x]
            if k < 0 and w < 0:                    # idle: one append for the whole stretch
                run = 1
                while x + run < cols and busy[x + run] < 0 and wait[x + run] < 0 and \
                        c0 + (x + run) * zoom < now:
                    run += 1
                text.append("·" * run, style="grey30")
                x += run
                continue
            run = 1                                # the same interval over several cells
            while x + run < cols and c0 + (x + run) * zoom < now and \
                    (busy[x + run], wait[x + run]) == (k, w):
                run += 1
            if k >= 0:
                label, style = f"{track.prefix}{track.ids[k]}", f"black on {colour}"
                if name == "front":
                    style = "bold white"
            else:
                index = int(waits.ids[w])
                label, style = f"#{index}", f"bold white on {CAUSES[wave.cause(index)][1]}"
            body = (label + " " * run)[:run] if run > len(label) else "▌" * run
            text.append(body, style=style)
            x += run

    # -- navigation ---------------------------------------------------------------------------
    def action_scroll(self, direction: int) -> None:
        self.follow = False
        self.c0 = max(0, self.c0 + direction * max(1, self.columns // 4) * self.zoom)
        self.update_state()

    def action_zoom(self, factor: float) -> None:
        wave = self.wave()
        centre = self.cursor if self.cursor is not None else \
            min(wave.now, self.c0 + self.columns * self.zoom // 2)
        whole = max(1, -(-max(wave.now, 1) // self.columns))
        self.zoom = int(min(max(1, round(self.zoom * factor) if factor > 1 else int(self.zoom * factor)),
                            max(whole, 1)))
        if not self.follow:
            self.c0 = max(0, centre - self.columns * self.zoom // 2)
        self.update_state()

    def action_fit(self) -> None:
        wave = self.wave()
        self.zoom = max(1, -(-max(wave.now, 1) // (self.columns - 1)))
        self.c0 = 0
        self.follow = False
        self.update_state()

    def action_follow(self) -> None:
        self.follow = True
        self.update_state()

    def action_cursor(self, delta: int) -> None:
        wave = self.wave()
        base = self.cursor if self.cursor is not None else wave.now
        self.cursor = min(max(0, base + delta * self.zoom), max(wave.now, 0))
        self.notify(f"cycle {self.cursor:,} (enter jumps there)", timeout=1.5)

    def action_jump(self) -> None:
        if self.cursor is not None:
            self.post_message(self.Jump(self.cursor))

    def cycle_at(self, x: int) -> int | None:
        if x < LABEL:
            return None
        return self.c0 + (x - LABEL) * self.zoom

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        cycle = self.cycle_at(offset.x)
        if cycle is not None:
            self.post_message(self.Jump(cycle))

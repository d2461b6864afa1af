"""Small panes that are redrawn whole after each step: pipeline, timeline, counters, weights."""
from __future__ import annotations

import textwrap

from rich.text import Text
from textual.widgets import Static
from tpuasm.runreport import BREAKDOWN, OVERLAPPING

from .formatting import weights_text


TIMELINE_ROWS = ("front", "input", "matrix", "activate", "output", "weights")
_STAGE_COLOURS = {"front": "white", "input": "green", "matrix": "magenta", "activate": "cyan",
                  "output": "blue", "weights": "yellow"}
# narrow labels and colours for runreport.BREAKDOWN, in its order
_SHORT_BREAKDOWN = (("active", "magenta"), ("w.stall", "red"), ("w.shift", "yellow"),
                    ("non-mxu", "grey62"))
LOOKBACK = 256        # instructions scanned backwards when rebuilding the timeline


def bar(done: int, total: int, width: int = 10) -> str:
    if not total:
        return ""
    full = min(width, round(width * done / total))
    return "█" * full + "░" * (width - full)


class PipelinePane(Static):
    """The four stages, the weight-fetch engine and the front end, from m.pipeline(), laid
    out by hand (a rich Table per step costs more than the step itself), and below them
    the Weight FIFO, shadow and active tiles."""

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self._drawn = None
        self._lines = 0

    def on_resize(self) -> None:
        self._drawn = None
        self.update_state()

    def _show(self, text: Text) -> None:
        """Redraw; a relayout (the scrolling box around the pane) only when the number of
        lines changed: most steps change words, not the height."""
        lines = text.plain.count("\n") + 1
        self.update(text, layout=lines != self._lines)
        self._lines = lines

    def update_state(self) -> None:
        m = self.session.machine
        states = self.session.pipeline()
        weights = weights_text(m)
        key = (tuple(states), weights.plain, self.size.width)
        if key == self._drawn:
            return
        self._drawn = key
        width = self.size.width or 100
        if width < 72:
            self._show(self._compact(states, weights, width))
            return
        w_instr = min(30, max(16, width // 4))
        w_stall = max(16, width - (9 + w_instr + 15 + 6 + 3))
        text = Text(no_wrap=True, overflow="crop")
        text.append(f"{'stage':<9}{'instruction':<{w_instr + 1}}{'progress':<15}{'cyc':>6}  stall\n",
                    style="bold grey70")
        for st in states:
            colour = _STAGE_COLOURS.get(st.name, "white")
            text.append(f"{st.name:<9}", style=f"bold {colour}")
            if st.index is None and not st.text:
                text.append(f"{'idle':<{w_instr + 1 + 15 + 6}}", style="grey50")
            else:
                line = f" :{st.location.line}" if st.location else ""
                label = f"#{st.index} {st.text}" if st.index is not None else st.text
                instr = _fit(f"{label}{line}", w_instr)
                progress = _fit(f"{st.progress}/{st.total} {st.unit}" if st.total else "", 14)
                text.append(f"{instr:<{w_instr}} {progress:<14} {st.cycles_in_stage:>6}")
            if st.stall:
                chunks = textwrap.wrap(st.stall, w_stall) or [""]
                text.append("  " + chunks[0], style="bold red")
                indent = " " * (9 + w_instr + 1 + 14 + 1 + 6 + 2)
                for chunk in chunks[1:]:
                    text.append("\n" + indent + chunk, style="bold red")
            text.append("\n")
        text.append_text(weights)
        self._show(text)


    @staticmethod
    def _compact(states, weights: Text, width: int) -> Text:
        """For narrow terminals: stage and instruction on one line, the stall under it."""
        text = Text(no_wrap=True, overflow="crop")
        for st in states:
            colour = _STAGE_COLOURS.get(st.name, "white")
            text.append(f"{st.name:<9}", style=f"bold {colour}")
            if st.index is None and not st.text:
                text.append("idle", style="grey50")
            else:
                progress = f" {st.progress}/{st.total}" if st.total else ""
                label = f"#{st.index} {st.text}" if st.index is not None else st.text
                text.append(_fit(f"{label}{progress} ({st.cycles_in_stage})", width - 9))
            for chunk in textwrap.wrap(st.stall or "", max(width - 2, 10)):
                text.append("\n  " + chunk, style="bold red")
            text.append("\n")
        text.append_text(weights)
        return text


def _fit(s: str, width: int) -> str:
    return s if len(s) <= width else s[:width - 1] + "…"


class TimelinePane(Static):
    """Stage x recent cycles, like Ripes' pipeline diagram: each cell names the instruction
    in that stage; red cells are stalls.  Occupancy comes from the library's per-instruction
    issue/finish cycles; stall marks from the pipeline states the session recorded while
    stepping, and from the front end waiting to issue."""

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self._stage_of = [ins.spec.stage for ins in session.program.instructions]

    def on_resize(self) -> None:
        self.update_state()             # the number of cycles shown follows the width

    def update_state(self) -> None:
        s = self.session
        m = s.machine
        cell = 4
        columns = max(4, (self.size.width - 9) // cell) if self.size.width else 24
        now = m.cycle
        c0 = max(0, now - columns + 1)
        cycles = range(c0, now + 1)
        grid = {row: [None] * len(cycles) for row in TIMELINE_ROWS}   # (index, stalled)
        stage_of = self._stage_of
        n = len(s.program)
        nxt = s.next_to_issue()
        last = n - 1 if nxt is None else min(nxt, n - 1)
        # instructions issue in order: scan back from the next one until well before c0
        for i in range(last, max(-1, last - LOOKBACK), -1):
            issue = m.issue_cycle(i)
            if issue < 0:
                # not issued yet: the front end holds it from the previous issue onwards
                continue
            finish = m.finish_cycle(i)
            end = now if finish < 0 else finish
            if end < c0 and finish >= 0 and issue < c0 - 4 * columns:
                break
            row = stage_of[i] if stage_of[i] in grid else "front"
            for k, c in enumerate(cycles):
                if issue <= c <= max(end, issue) and (finish < 0 or c <= finish):
                    if grid[row][k] is None:
                        grid[row][k] = (i, False)
        if nxt is not None and m.status not in ("halted", "fault"):
            prev_issue = m.issue_cycle(nxt - 1) if nxt > 0 else -1
            for k, c in enumerate(cycles):
                if c > prev_issue and grid["front"][k] is None:
                    grid["front"][k] = (nxt, c - prev_issue > 1)
        for k, c in enumerate(cycles):
            sample = s.samples.get(c)
            if not sample:
                continue
            for row, st in sample.items():
                if row in grid and st.index is not None:
                    grid[row][k] = (st.index, st.stalled)
        text = Text(no_wrap=True, overflow="crop")
        # cycle numbers every 5 columns, each free to run over its right-hand neighbours
        header = [" "] * (len(cycles) * cell)
        for k, c in reversed(list(enumerate(cycles))):      # the current cycle first
            if c % 5 == 0 or c == now:
                label = str(c)
                pos = k * cell + 1
                if pos + len(label) <= len(header) and \
                        all(ch == " " for ch in header[max(pos - 1, 0):pos + len(label) + 1]):
                    header[pos:pos + len(label)] = label
        text.append("cycle".ljust(9), style="bold")
        text.append("".join(header).rstrip() + "\n", style="grey62")
        for row in TIMELINE_ROWS:
            colour = _STAGE_COLOURS[row]
            text.append(row.ljust(9), style=f"bold {colour}")
            for k in range(len(cycles)):
                entry = grid[row][k]
                if entry is None:
                    text.append(" · ".ljust(cell), style="grey30")
                else:
                    index, stalled = entry
                    label = f"{index:>3}"[-3:]
                    style = "bold white on red" if stalled else f"black on {colour}"
                    text.append(label, style=style)
                    text.append(" ")
            text.append("\n")
        text.append("cells: instruction index; ", style="grey50")
        text.append(" red ", style="bold white on red")
        text.append(" = stalled", style="grey50")
        self.update(text, layout=False)


class CountersPane(Static):
    """Cycle, retired instructions, MXU utilisation and the Table-3 cycle breakdown."""

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session

    def on_resize(self) -> None:
        self.update_state()

    def update_state(self) -> None:
        c = self.session.machine.counters()
        cycles = max(int(c.get("cycles", 0)), 1)
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append("cycle ", style="bold")
        text.append(f"{self.session.machine.cycle:,}")
        text.append("   retired ", style="bold")
        text.append(f"{int(c.get('instructions', 0)):,}/{len(self.session.program)}\n")
        util = float(c.get("mxu_utilization", 0))
        wide = (self.size.width or 40) >= 34          # room for the bars
        text.append("MXU ", style="bold")
        text.append(f"{100 * util:5.1f} % ", style="magenta")
        text.append((bar(int(1000 * util), 1000, 14) if wide else "") + "\n", style="magenta")
        for (_, key), (label, colour) in zip(BREAKDOWN, _SHORT_BREAKDOWN):
            v = int(c.get(key, 0))
            text.append(f"{label:<8}", style=colour)
            text.append(f"{v:>9,} {100 * v / cycles:5.1f}%" + (f" {bar(v, cycles, 8)}" if wide else "")
                        + "\n", style=colour)
        text.append("  ".join(f"{short} {int(c.get(key, 0)):,}"
                              for short, (_, key) in zip(("RAW stall", "input stall"), OVERLAPPING)),
                    style="grey62")
        self.update(text, layout=False)

"""Small panes that are redrawn whole after each step: pipeline, timeline, counters, weights."""
from __future__ import annotations

import textwrap

from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget
from tpuasm.runreport import BREAKDOWN, OVERLAPPING

from .formatting import weights_text
from .strips import StripLines, text_strips


_STAGE_COLOURS = {"front": "white", "input": "green", "matrix": "magenta", "activate": "cyan",
                  "output": "blue", "weights": "yellow"}
# narrow labels and colours for runreport.BREAKDOWN, in its order
_SHORT_BREAKDOWN = (("active", "magenta"), ("w.stall", "red"), ("w.shift", "yellow"),
                    ("non-mxu", "grey62"))


def bar(done: int, total: int, width: int = 10) -> str:
    if not total:
        return ""
    full = min(width, round(width * done / total))
    return "█" * full + "░" * (width - full)


class PipelinePane(StripLines, ScrollView, can_focus=True):
    """The four stages, the weight-fetch engine and the front end, from m.pipeline(), laid
    out by hand (a rich Table per step costs more than the step itself), and below them
    the Weight FIFO, shadow and active tiles."""

    DEFAULT_CSS = "PipelinePane { height: 1fr; scrollbar-size-vertical: 1; scrollbar-size-horizontal: 0; }"

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self._drawn = None
        self._strips: list[Strip] = []

    def on_resize(self) -> None:
        self._drawn = None
        self.virtual_size = Size(0, 0)        # show() grows it back to what the text needs
        self.update_state()

    def _show(self, text: Text) -> None:
        """Line API: rich segments straight to strips (cheaper per step than a Static's
        update); the pane scrolls when the stalls need more lines than it has."""
        self.show(text_strips(self.app.console, text))

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
                label = (f"#{st.index} {self.session.symbolic(st.index) or st.text}"
                         if st.index is not None else st.text)
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


    def _compact(self, states, weights: Text, width: int) -> Text:
        """For narrow terminals: stage and instruction on one line, the stall under it."""
        text = Text(no_wrap=True, overflow="crop")
        for st in states:
            colour = _STAGE_COLOURS.get(st.name, "white")
            text.append(f"{st.name:<9}", style=f"bold {colour}")
            if st.index is None and not st.text:
                text.append("idle", style="grey50")
            else:
                progress = f" {st.progress}/{st.total}" if st.total else ""
                label = (f"#{st.index} {self.session.symbolic(st.index) or st.text}"
                         if st.index is not None else st.text)
                text.append(_fit(f"{label}{progress} ({st.cycles_in_stage})", width - 9))
            for chunk in textwrap.wrap(st.stall or "", max(width - 2, 10)):
                text.append("\n  " + chunk, style="bold red")
            text.append("\n")
        text.append_text(weights)
        return text


def _fit(s: str, width: int) -> str:
    return s if len(s) <= width else s[:width - 1] + "…"


class CountersPane(StripLines, Widget):
    """Cycle, retired instructions, MXU utilisation and the Table-3 cycle breakdown."""

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self._strips: list[Strip] = []

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
        base = self.rich_style                      # the pane's colours under the text's own
        self.show([strip.apply_style(base) for strip in text_strips(self.app.console, text)])


class StatusLine(StripLines, Widget):
    """The line above the panes: program, cycle, status and why the machine stopped, wrapped
    (the app sets its height).  On the Line API: it changes on every step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._strips: list[Strip] = []
        self._text = Text()

    def update(self, text: Text, wrapped) -> None:
        """Show `text`, already wrapped to the width (`wrapped`: its rich Lines)."""
        self._text = text
        base = self.rich_style
        console = self.app.console
        self.show([Strip(list(line.render(console))).apply_style(base) for line in wrapped])

    def render(self) -> Text:
        return self._text                   # what it says, for tests and screen readers

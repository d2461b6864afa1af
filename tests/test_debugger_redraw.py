"""What a step repaints (issue 13: step latency): only the panes, and the lines, whose
inputs changed, and never a relayout of the whole screen while stepping with keys."""
from __future__ import annotations

from textual.geometry import Region
from textual.widget import Widget

from debugger.memory_view import MemoryView
from debugger.source_view import SourceView
from test_debugger_support import SMALL, here, make_session  # noqa: F401
from test_debugger_ui import keys, log_text, open_app, pilot_test


class Spy:
    """Records Widget.refresh calls: (widget, regions, layout)."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = Widget.refresh

        def refresh(widget, *regions, repaint=True, layout=False, recompose=False):
            self.calls.append((widget, regions, layout))
            return original(widget, *regions, repaint=repaint, layout=layout, recompose=recompose)
        monkeypatch.setattr(Widget, "refresh", refresh)

    def of(self, cls):
        return [c for c in self.calls if isinstance(c[0], cls)]


@pilot_test
async def test_stepping_with_keys_never_relays_out_the_screen(here, monkeypatch):
    """Panes take the height their text needs once (status line, pipeline) and keep it
    while keys step the machine: going through the program a second time, no relayout."""
    async with open_app(here, session=make_session(here)) as (app, pilot):
        m = app.session.machine
        while not app.session.finished:              # first pass: heights settle
            await keys(pilot, "n")
        end = m.cycle
        await keys(pilot, *["B"] * 12)
        spy = Spy(monkeypatch)
        await keys(pilot, *["s"] * 6, *["n"] * 6, *["b"] * 3, *["B"] * 2)
        assert 0 < m.cycle < end
        relayouts = [type(w).__name__ for w, _, layout in spy.calls if layout]
        assert relayouts == [], relayouts


@pilot_test
async def test_a_cycle_step_repaints_only_what_changed(here, monkeypatch):
    async with open_app(here, session=make_session(here)) as (app, pilot):
        await keys(pilot, "s")
        ub = app.query_one("#mem-ub", MemoryView)
        before = ub.array().copy()
        spy = Spy(monkeypatch)
        await keys(pilot, "s")                       # cycle 1 -> 2: RHM in flight, UB unchanged
        assert (ub.array() == before).all()
        assert spy.of(MemoryView) == []              # no memory view repainted
        source = spy.of(SourceView)
        # the source repaints single lines (or nothing), not the whole pane
        assert all(regions and all(isinstance(r, Region) and r.height == 1 for r in regions)
                   for _, regions, _ in source), source


@pilot_test
async def test_log_keeps_its_last_line_in_view(here):
    async with open_app(here, session=make_session(here)) as (app, pilot):
        for k in range(60):
            app.log_line(f"line {k}")
        await pilot.pause()
        log = app.query_one("#log")
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y
        assert "line 59" in log_text(app)

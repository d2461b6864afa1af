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


@pilot_test
async def test_memory_caption_repaints_its_border_line_only(here, monkeypatch):
    import html
    from debugger.app import MemoriesPane
    async with open_app(here, session=make_session(here)) as (app, pilot):
        pane = app.query_one("#memories", MemoriesPane)
        spy = Spy(monkeypatch)
        for k in range(3):
            pane.set_subtitle(f"caption {k} here")
            await pilot.pause()
            screen = html.unescape(app.export_screenshot()).replace("\xa0", " ")
            assert f"caption {k} here" in screen and f"caption {k - 1} here" not in screen
        mine = [regions for w, regions, _ in spy.calls if w is pane]
        assert len(mine) == 3 and all(len(r) == 1 and r[0].height == 1 for r in mine)


@pilot_test
async def test_a_write_repaints_the_rows_it_changed(here, monkeypatch):
    """SMALL's first RHM writes input (ub 0..3): stepping to its completion repaints those
    view lines (1..4, under the header), then, on the next step, only them again (their
    highlight goes)."""
    async with open_app(here, session=make_session(here)) as (app, pilot):
        m = app.session.machine
        await keys(pilot, "s")
        ub = app.query_one("#mem-ub", MemoryView)
        app.execute(f"step {int(m.times[0, 2]) - m.cycle - 2}", echo=False)   # near its finish
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        spy = Spy(monkeypatch)
        while not m.retired(0):
            spy.calls.clear()
            await keys(pilot, "s")
        for _ in range(2):
            lines = sorted(r.y for w, regions, _ in spy.calls if w is ub for r in regions)
            assert lines == [1, 2, 3, 4] and not [c for c in spy.calls if c[0] is ub and not c[1]]
            spy.calls.clear()
            await keys(pilot, "s")

"""The screen at the default terminal size, 80 x 24, and as it grows (issue 13, problems 1-4):
command output always reachable, source lines with operands, help within 80 columns,
`goto` showing its row, a fault in the status line without covering any pane.
Snapshots at 80x24, 120x40 and 200x50 (update with `pytest --snapshot-update` after
checking the new pictures by eye)."""
from __future__ import annotations

import pytest

from debugger.app import DebuggerApp, HelpScreen
from debugger.memory_view import MemoryView
from debugger.source_view import SourceView
from test_debugger_support import FAULTY, LINE_MMC1, commands, here, make_session  # noqa: F401
from test_debugger_ui import command, keys, log_text, open_app, pilot_test, settle, status_text

SMALL_TERM = (80, 24)


def visible(app, selector) -> bool:
    w = app.query_one(selector)
    return w.display and w.region.width > 0 and w.region.height > 0


@pilot_test
async def test_80x24_typed_command_output_is_shown(here):
    async with open_app(here, size=SMALL_TERM) as (app, pilot):
        assert app.screen.has_class("narrow")
        assert visible(app, "#memories") and not visible(app, "#log")
        await command(pilot, "x/16d ub.hidden")
        assert visible(app, "#log") and "ub[4][0]:" in log_text(app)
        await keys(pilot, "l")                       # back to the memories
        assert visible(app, "#memories") and not visible(app, "#log")
        await keys(pilot, "l")
        assert visible(app, "#log")


@pilot_test
async def test_80x24_source_shows_operands_and_scrolls_sideways(here):
    async with open_app(here, size=SMALL_TERM) as (app, pilot):
        view = app.query_one(SourceView)
        y = LINE_MMC1 - 1 - int(view.scroll_offset.y)
        assert "MMC.SO input, sums, 4" in view.render_line(y).text
        await keys(pilot, "right")
        assert view.scroll_offset.x == 8 and "input, sums" in view.render_line(y).text
        assert f"{LINE_MMC1}" in view.render_line(y).text       # the gutter stays


@pilot_test
async def test_80x24_goto_shows_the_target_row(here):
    async with open_app(here, size=SMALL_TERM) as (app, pilot):
        await command(pilot, "print 1")                          # the log is up
        await command(pilot, "goto ub[40]")
        view = app.query_one("#mem-ub", MemoryView)
        await settle(pilot)
        top = int(view.scroll_offset.y)
        assert visible(app, "#memories")
        assert top <= 40 < top + view.size.height - 1            # row 0 of the view is the header


@pilot_test
async def test_80x24_help_fits_in_80_columns(here):
    async with open_app(here, size=SMALL_TERM) as (app, pilot):
        await keys(pilot, "f1")
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("VerticalScroll")
        assert box.region.right <= 80 and box.virtual_size.width <= box.size.width


@pilot_test
async def test_80x24_fault_in_the_status_line_no_toast(here):
    async with open_app(here, FAULTY, "faulty.tasm", size=SMALL_TERM) as (app, pilot):
        await keys(pilot, "c")
        assert app.session.machine.status == "fault"
        assert "no weight tile" in status_text(app).replace("\n", " ") or \
            app.session.machine.fault.message.split()[0] in status_text(app)
        assert not app.screen.query("Toast")
        assert visible(app, "#memories") or visible(app, "#log")


@pilot_test
async def test_timeline_toggle(here):
    async with open_app(here, size=SMALL_TERM) as (app, pilot):
        assert not visible(app, "#timeline")
        await keys(pilot, "t")
        assert visible(app, "#timeline") and not visible(app, "#source")
        await keys(pilot, "t")
        assert visible(app, "#source")


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)])
def test_snapshot_mid_run(here, snap_compare, size):
    app = DebuggerApp(make_session(here))
    assert snap_compare(app, terminal_size=size,
                        run_before=commands(f"break {LINE_MMC1}", "continue", "step 3"))

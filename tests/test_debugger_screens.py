"""Readable at every size (issue 23, item 2): 80 x 24, 120 x 40 and 200 x 50.

The source pane keeps the next instruction in view from the first frame; typed output
gets a log that can be read; the log re-wraps to its width; `l` gives the bottom row to
the log; `R` says what it dropped and a failed reload replaces the old status line."""
from __future__ import annotations

import pytest

from debugger.log_pane import LogPane
from debugger.source_view import SourceView
from test_debugger_support import LINE_MMC1, SMALL, here  # noqa: F401
from test_debugger_ui import command, keys, log_text, open_app, pilot_test, settle, status_text

SIZES = [(80, 24), (120, 40), (200, 50)]
# SMALL behind a long header of comments: its first instruction is far down the file
HEADER = 30
LONG_HEADER = "".join(f"; header comment {i}\n" for i in range(HEADER)) + SMALL
FIRST_LINE = 10 + HEADER                 # SMALL's RHM is on line 10


def in_view(view: SourceView, line: int, after: int = 0) -> bool:
    """Whether `line` (1-based) and `after` lines below it are on screen."""
    top, height = int(view.scroll_offset.y), view.size.height
    return top < line and line + after <= top + height


@pytest.mark.parametrize("size", SIZES)
@pilot_test
async def test_the_source_shows_the_next_instruction_from_the_first_frame(here, size):
    async with open_app(here, LONG_HEADER, size=size) as (app, pilot):
        view = app.query_one(SourceView)
        assert view.next_line == FIRST_LINE
        assert in_view(view, FIRST_LINE, after=2), (view.scroll_offset, view.size)
        for _ in range(6):                                  # it follows as the program runs
            await keys(pilot, "n")
            if view.next_line is not None:
                last = len(view.listing.lines)
                assert in_view(view, view.next_line,
                               after=min(2, view.size.height // 3, last - view.next_line))


@pytest.mark.parametrize("size", SIZES)
@pilot_test
async def test_typed_output_gets_a_readable_log(here, size):
    async with open_app(here, size=size) as (app, pilot):
        await command(pilot, "info pipeline")
        log = app.query_one("#log", LogPane)
        assert log.display and log.size.height >= 7 and log.size.width >= min(60, size[0] - 4)
        assert "front" in log_text(app) and "status paused" in log_text(app)


@pilot_test
async def test_the_log_rewraps_to_its_width(here):
    async with open_app(here, size=(80, 24)) as (app, pilot):
        long = "word " * 60                               # 300 characters
        app.log_line(long)                                # written while the log is hidden
        await keys(pilot, "l")
        log = app.query_one("#log", LogPane)
        width = log.scrollable_content_region.width
        wrapped = [strip.text.rstrip() for strip in log.lines if strip.text.startswith("word")]
        assert width > 60 and len(wrapped) <= -(-300 // (width - 5))
        assert all(len(x) <= width for x in wrapped) and max(len(x) for x in wrapped) > width - 6
        await pilot.resize_terminal(200, 50)
        await settle(pilot)
        width = log.scrollable_content_region.width
        wrapped = [strip.text.rstrip() for strip in log.lines if strip.text.startswith("word")]
        assert width > 150 and len(wrapped) == 2, (width, wrapped)


@pytest.mark.parametrize("size", [(120, 40), (200, 50)])
@pilot_test
async def test_l_gives_the_bottom_row_to_the_log(here, size):
    async with open_app(here, size=size) as (app, pilot):
        log = app.query_one("#log", LogPane)
        before = log.size
        await keys(pilot, "l")
        assert not app.query_one("#memories").display or app.query_one("#memories").size.width == 0
        assert not app.query_one("#counters").display
        assert log.size.height >= before.height and log.size.width > before.width
        await keys(pilot, "l")
        assert app.query_one("#memories").size.width > 0


@pilot_test
async def test_reload_by_key_reports_a_dropped_breakpoint_and_a_failure(here):
    async with open_app(here, size=(80, 24)) as (app, pilot):
        await command(pilot, f"break {LINE_MMC1}")
        await keys(pilot, "n")
        source = here / "small.tasm"
        source.write_text(SMALL.replace("    MMC.SO input, sums, 4\n", "    MMC.SO input, sums, 4 ; edited\n"))
        await keys(pilot, "R")
        assert f"breakpoint 1 at small.tasm:{LINE_MMC1} deleted" in log_text(app)
        assert "reloaded" in status_text(app)
        assert app.query_one("#log").display                  # the note is shown, not only logged
        source.write_text(SMALL.replace("MMC.SO input, sums, 4", "MMC.SO input, nosuch, 4"))
        await keys(pilot, "R")
        assert "reload failed" in status_text(app) and "reloaded" not in status_text(app)
        assert "^" in log_text(app)


@pytest.mark.parametrize("size", SIZES)
def test_the_readme_screenshot_at_every_size(tmp_path, size, capsys):
    """docs/debugger.md's picture, made the way the doc says, at the three sizes: the
    breakpoint's line with the next-instruction mark, the pipeline's stall, the memories."""
    from debugger.cli import main
    from tpuasm.regression.runner import generate
    from test_debugger_support import MATMUL_TILED
    generate(MATMUL_TILED.parent / "gen.py", tmp_path)
    (tmp_path / "shot.tdb").write_text("break 26\nwatch acc.y + 128\ncontinue\nstep 40\ngoto ub.x\n")
    out = tmp_path / "shot.svg"
    code = main([str(MATMUL_TILED), "--host", str(tmp_path / "host.npy"), "--weights",
                 str(tmp_path / "weights.npy"), "--batch", str(tmp_path / "shot.tdb"),
                 "--screenshot", str(out), "--size", f"{size[0]}x{size[1]}"])
    assert code == 0, capsys.readouterr()
    svg = out.read_text().replace("&#160;", " ")
    for visible in ("MMC.SO", "●", "▶", "pipeline", "memories", "paused"):
        assert visible in svg, visible
    if size[0] >= 120:
        assert "counters" in svg and "log" in svg


@pilot_test
async def test_the_status_line_shrinks_back_when_the_keys_pause(here):
    import asyncio
    from test_debugger_support import FAULTY
    async with open_app(here, FAULTY, "faulty.tasm", size=(80, 24)) as (app, pilot):
        await keys(pilot, "c")                        # a fault: its message over 2 lines
        status = app.query_one("#status")
        tall = status.size.height
        await keys(pilot, "b")                        # "back to cycle N": one line
        assert status.size.height == tall             # not while stepping
        await asyncio.sleep(1.3)
        await settle(pilot)
        assert tall > 1 and status.size.height == 1

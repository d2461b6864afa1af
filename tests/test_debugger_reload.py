"""Edit, reload, rerun (issue 13, problem 2): `reload` re-assembles the edited file, keeps
breakpoints (moved with their line) and watchpoints, reports what no longer fits, and an
assembly error is shown with its caret while the session goes on."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from debugger.commands import Engine
from debugger.relocate import line_map
from debugger.source_view import SourceView
from test_debugger_support import LINE_MMC1, LINE_MMC2, SMALL, here, make_session, oracle, small_data  # noqa: F401
from test_debugger_ui import command, keys, log_text, open_app, pilot_test, settle


def edit(text: str) -> None:
    path = Path("small.tasm")
    path.write_text(text)
    st = path.stat()                    # a new mtime even within the clock's resolution
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_line_map_follows_moved_lines_and_drops_edited_ones():
    old = "a\nb\nc\nd\n"
    new = "x\na\nb\nC\nd\n"
    assert line_map(old, new) == {1: 2, 2: 3, 4: 5}


def test_reload_moves_breakpoints_with_their_lines_and_keeps_watchpoints(here):
    engine = Engine(make_session(here))
    assert engine.execute(f"break {LINE_MMC1}").ok
    assert engine.execute(f"break {LINE_MMC2} if cycle > 0").ok
    assert engine.execute("watch acc.sums").ok
    engine.execute("run 300")
    # two new lines above both breakpoints, and the second MMC's line rewritten
    lines = SMALL.splitlines()
    lines[LINE_MMC2 - 1] = "    MMC.SO hidden, sums, 4   ; edited"
    lines.insert(8, "; a comment\n.ub spare, 2")
    edit("\n".join(lines) + "\n")
    r = engine.execute("reload")
    assert r.ok, r.text()
    s = engine.session
    assert s.machine.cycle == 0
    text = r.text()
    assert f"breakpoint 1 moved from small.tasm:{LINE_MMC1} to small.tasm:{LINE_MMC1 + 2}" in text
    assert f"breakpoint 2 at small.tasm:{LINE_MMC2} deleted: line {LINE_MMC2} was edited" in text
    assert set(s.breakpoints) == {1} and 3 in s.watchpoints
    # the new `.ub spare` moved `hidden`, not `sums`: the watchpoint still covers acc rows 0..3
    assert (s.watchpoints[3].memory, s.watchpoints[3].start, s.watchpoints[3].stop) == ("acc", 0, 4)
    r = engine.execute("continue")
    assert r.stop.kind == "breakpoint" and r.stop.index == 4       # the same instruction
    while engine.execute("continue").stop.kind != "halted":
        pass
    host, weights = small_data()
    want = oracle(host, weights)
    assert np.array_equal(s.machine.host[4:8].view(np.int8), want["hidden2"])


def test_an_assembly_error_is_shown_with_its_caret_and_the_session_goes_on(here):
    engine = Engine(make_session(here))
    engine.execute(f"break {LINE_MMC1}")
    edit(SMALL.replace("MMC.SO input, sums, 4", "MMC.SO input, nosuch, 4"))
    r = engine.execute("reload")
    assert not r.ok
    text = r.text()
    assert "reload failed" in text and f"small.tasm:{LINE_MMC1}:" in text and "^" in text
    assert len(engine.session.program) == 11 and 1 in engine.session.breakpoints
    assert engine.execute("continue").stop.kind == "breakpoint"


@pilot_test
async def test_reload_key_and_watcher_on_the_screen(here):
    async with open_app(here) as (app, pilot):
        await command(pilot, f"break {LINE_MMC1}")
        edit(SMALL.replace("; a tiny", "; first line\n; a tiny"))
        await keys(pilot, "R")
        view = app.query_one(SourceView)
        assert view.listing.indices_of[LINE_MMC1 + 1] == [4]
        assert view.break_lines == {LINE_MMC1 + 1: True}
        await command(pilot, "reload --watch")
        edit(SMALL.replace("MMC.SO input, sums, 4", "MMC.SO input, nosuch, 4"))
        app._check_source()                     # what the 1 s timer calls
        await settle(pilot)
        assert "reload failed" in log_text(app) and "^" in log_text(app)
        assert app.is_running
        await command(pilot, "reload --nowatch")
        assert app._watcher is None

"""Pilot-driven tests of the debugger screen: every key and the command line.

State is checked through the machine's API against the numpy oracle or a fresh machine.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools

import numpy as np
import pytest

import debugger.session
from debugger.app import DebuggerApp, HelpScreen
from debugger.memory_view import MemoryView
from debugger.source_view import SourceView
from test_debugger_support import (FAULTY, LINE_ACT1, LINE_ACT2, LINE_MMC1, LINE_MMC2, LINE_RHM, LONG, SMALL,
                                   assert_same_state, fresh_state_at, here, machine_state,  # noqa: F401
                                   make_session, oracle, small_data)

SIZE = (160, 48)


def pilot_test(fn):
    """Run an async Pilot test with asyncio (no pytest-asyncio in this project)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


async def settle(pilot):
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


@contextlib.asynccontextmanager
async def open_app(here, source=SMALL, name="small.tasm", session=None, size=SIZE):
    """The debugger screen on `source` (or on `session`), started and settled."""
    app = DebuggerApp(session or make_session(here, source, name))
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        yield app, pilot


async def keys(pilot, *names):
    for name in names:
        await pilot.press(name)
        await settle(pilot)


async def command(pilot, line):
    """`:` then the line (set at once: typing is slow and the Input is tested elsewhere)."""
    await keys(pilot, "colon")
    box = pilot.app.query_one("#command")
    box.value += line
    await keys(pilot, "enter")


def log_text(app) -> str:
    """The log, with lines the pane wrapped joined again."""
    return " ".join(" ".join(strip.text for strip in app.query_one("#log").lines).split())


def status_text(app) -> str:
    return str(app.query_one("#status").render())


def line_text(view, y) -> str:
    return view.render_line(y).text


async def cursor_to(pilot, line):
    view = pilot.app.query_one(SourceView)
    view.focus()
    delta = line - view.cursor_line
    await keys(pilot, *(["down"] * delta if delta > 0 else ["up"] * -delta))
    assert view.cursor_line == line


@pilot_test
async def test_step_keys_move_the_machine(here):
    async with open_app(here) as (app, pilot):
        m = app.session.machine
        assert "cycle 0" in status_text(app)
        await keys(pilot, "s", "s", "s")
        assert m.cycle == 3 and "cycle 3" in status_text(app)
        # the RWs issued at 1 and 2 (their own port); next: the TAG, then the first
        # MatrixMultiply, which finishes after the host read it waits for
        await keys(pilot, "n", "n")
        assert m.retired(0) and m.cycle > 3
        assert np.array_equal(m.ub[0:4].view(np.int8), small_data()[0][0:4])
        after_n = m.cycle
        await keys(pilot, "B")                               # back one instruction
        assert m.cycle < after_n
        await keys(pilot, "b")
        assert_same_state(machine_state(m), fresh_state_at(here, m.cycle))


@pilot_test
async def test_breakpoint_key_and_continue(here):
    async with open_app(here) as (app, pilot):
        await cursor_to(pilot, LINE_MMC1)
        await keys(pilot, "space")
        view = app.query_one(SourceView)
        assert view.break_lines == {LINE_MMC1: True}
        assert "●" in line_text(view, LINE_MMC1 - 1)
        await keys(pilot, "c")
        assert app.session.last_stop.kind == "breakpoint" and app.session.next_to_issue() == 4
        assert "breakpoint 1 at #4" in log_text(app)
        assert view.next_line == LINE_MMC1 and "▶" in line_text(view, LINE_MMC1 - 1)
        await keys(pilot, "space")                           # toggles it off again
        assert not app.session.breakpoints
        await keys(pilot, "f9")
        assert app.session.breakpoints


@pilot_test
async def test_conditional_breakpoint_and_ignore_count_from_the_command_line(here):
    acc1 = oracle(*small_data())["acc1"]
    async with open_app(here) as (app, pilot):
        await command(pilot, f"break {LINE_MMC1} if acc[0][0] != 0")     # false: acc is zero
        # visible at the second Activate: the second multiply issues while the first drains
        await command(pilot, f"break {LINE_ACT2} if acc[0][0] == {acc1[0][0]}")
        await keys(pilot, "c")
        assert app.session.last_stop.number == 2 and app.session.next_to_issue() == 7
        assert app.session.breakpoints[1].hits == 0


@pilot_test
async def test_ignore_count(here, monkeypatch):
    async with open_app(here, LONG, "long.tasm") as (app, pilot):
        await command(pilot, "break 5")
        await command(pilot, "ignore 1 2")
        await keys(pilot, "c")
        assert app.session.last_stop.index == 2              # crossings 0 and 1 ignored
        assert "will ignore the next 2" in log_text(app)


@pilot_test
async def test_watchpoint_hit_highlights_changed_values(here):
    want = oracle(*small_data())
    async with open_app(here) as (app, pilot):
        await command(pilot, "watch hidden")
        await keys(pilot, "c")
        stop = app.session.last_stop
        assert stop.kind == "watchpoint" and stop.index == 5
        assert np.array_equal(app.session.machine.ub[4:8].view(np.int8), want["hidden1"])
        view = app.query_one("#mem-ub", MemoryView)
        strip = view.render_line(1 + 4)                      # header line, then rows 0..
        changed = [cell for seg in strip if seg.style is not None and seg.style.bgcolor
                   and seg.style.bgcolor.name == "bright_yellow" for cell in seg.text.split()]
        nonzero = [f"{int(v) & 0xff:02x}" for v in want["hidden1"][0] if v != 0]
        assert sorted(changed) == sorted(nonzero) and changed
        assert "watchpoint 1 hidden written by #5" in log_text(app)


@pilot_test
async def test_reverse_step_restores_the_state_of_a_fresh_run(here):
    async with open_app(here) as (app, pilot):
        await keys(pilot, "r")                                # asks for N
        await pilot.press(*"730")
        await keys(pilot, "enter")
        m = app.session.machine
        assert m.cycle == 730
        await keys(pilot, *["b"] * 25)
        assert m.cycle == 705
        assert_same_state(machine_state(m), fresh_state_at(here, 705))
        await command(pilot, f"break {LINE_MMC1}")
        await keys(pilot, "c", "c")
        assert m.status == "halted"
        await keys(pilot, "C")                                # reverse-continue
        assert app.session.next_to_issue() == 4 and m.issue_cycle(4) == -1


@pilot_test
async def test_radix_and_unit_switch(here):
    host = small_data()[0]
    async with open_app(here) as (app, pilot):
        await keys(pilot, "n")
        view = app.query_one("#mem-ub", MemoryView)
        view.focus()
        assert line_text(view, 1).split()[1:] == [f"{int(v) & 0xff:02x}" for v in host[0]]
        await keys(pilot, "x")
        assert view.radix == "signed"
        assert line_text(view, 1).split()[1:] == [str(v) for v in host[0]]
        assert "ub  signed int8" in app.query_one("#memories").border_subtitle
        await keys(pilot, "x")
        assert line_text(view, 1).split()[1:] == [str(int(v) & 0xff) for v in host[0]]
        await keys(pilot, "w")
        assert view.unit == "int32"
        assert line_text(view, 1).split()[1:] == [str(int(v) & 0xffffffff)
                                                 for v in host[0].view("<i4")]
        await keys(pilot, "x")
        await command(pilot, "radix signed int8")
        assert (view.radix, view.unit) == ("signed", "int8")


@pilot_test
async def test_go_to_address_and_symbol(here):
    async with open_app(here) as (app, pilot):
        await keys(pilot, "g")
        await pilot.press(*"acc.sums + 2")
        await keys(pilot, "enter")
        tabs = app.query_one("#memories")
        assert tabs.active == "tab-acc"
        assert app.query_one("#mem-acc", MemoryView).target_row == 2
        await command(pilot, "goto hidden")
        assert tabs.active == "tab-ub"
        view = app.query_one("#mem-ub", MemoryView)
        assert view.target_row == 4 and app.focused is view
        await command(pilot, "goto ub[50]")
        assert view.target_row == 50 and view.scroll_offset.y == 48
        assert line_text(view, 3).lstrip().startswith("50:")
        await command(pilot, "goto tile[1]")
        assert tabs.active == "tab-tile" and app.tile_shown == 1
        tile_view = app.query_one("#mem-tile", MemoryView)
        w1 = small_data()[1][1]
        assert line_text(tile_view, 1).split()[1:] == [f"{int(v) & 0xff:02x}" for v in w1[0]]
        await command(pilot, "goto acc[20]")              # a hidden tab scrolls once shown
        acc_view = app.query_one("#mem-acc", MemoryView)
        assert tabs.active == "tab-acc" and acc_view.scroll_offset.y == 18
        await command(pilot, "goto nosuch")
        assert "unknown name" in log_text(app)


@pilot_test
async def test_fault_is_shown_and_the_app_survives(here):
    async with open_app(here, FAULTY, "faulty.tasm") as (app, pilot):
        await keys(pilot, "c")
        assert app.session.machine.status == "fault"
        assert "no weight tile resident" in log_text(app)
        assert "no weight tile resident" in status_text(app)        # the cause in full
        assert not app._notifications                  # no toast over the memory and command panes
        await keys(pilot, "s", "n", "c")                     # nothing moves, nothing breaks
        assert app.is_running and app.session.machine.status == "fault"
        await keys(pilot, "b")
        assert app.session.machine.status == "paused"


@pilot_test
async def test_run_to_cursor(here):
    async with open_app(here) as (app, pilot):
        await cursor_to(pilot, LINE_MMC2)
        await keys(pilot, "u")
        assert app.session.next_to_issue() == 6 and app.session.machine.issue_cycle(6) == -1
        assert not app.session.breakpoints                   # the temporary one is gone
        await cursor_to(pilot, 3)                            # a directive: no instruction
        await keys(pilot, "u")
        assert "no instruction on line 3" in log_text(app)


@pilot_test
async def test_interrupt_a_long_run(here, monkeypatch):
    monkeypatch.setattr(debugger.session, "CHUNK_CYCLES", 100)
    async with open_app(here, LONG, "long.tasm") as (app, pilot):
        await pilot.press("c")
        await pilot.pause(0.05)
        assert app.running and "RUNNING" in status_text(app)   # the screen is live
        await keys(pilot, "p")
        assert not app.running
        assert app.session.last_stop.kind == "interrupted"
        assert app.session.machine.status == "paused"
        assert "interrupted at cycle" in log_text(app)


@pilot_test
async def test_help_lists_every_key(here):
    async with open_app(here) as (app, pilot):
        await keys(pilot, "f1")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.plain_text()
        screen = app.export_screenshot().replace("&#160;", " ")
        assert "Keys" in screen and "reverse-continue" in screen
        for binding in DebuggerApp.BINDINGS:
            for key in binding.key.split(","):
                label = {"colon": ":", "question_mark": "?", "escape": "Escape", "slash": "/",
                         "f9": "F9", "f1": "F1", "tab": "tab"}.get(key, key)
                assert label in text, key
        for binding in SourceView.BINDINGS + MemoryView.BINDINGS:
            assert binding.key.split(",")[0] in text, binding.key
        assert "x/NFU ADDR" in text and "reverse-continue" in text
        await keys(pilot, "escape")
        assert not isinstance(app.screen, HelpScreen)
        await keys(pilot, "h")                  # h opens it too, and closes it
        assert isinstance(app.screen, HelpScreen)
        await keys(pilot, "h")
        assert not isinstance(app.screen, HelpScreen)


@pilot_test
async def test_every_action_is_in_the_command_palette(here):
    async with open_app(here) as (app, pilot):
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for want in ("Step one cycle", "Next instruction", "Continue", "Run N cycles",
                     "Run to cursor", "Interrupt", "Reverse step cycle", "Reverse step instruction",
                     "Reverse continue", "Toggle breakpoint", "Go to address", "Cycle radix",
                     "Toggle int8", "Command line", "Help", "Save screenshot"):
            assert any(t.startswith(want) for t in titles), want
        step = next(c for c in app.get_system_commands(app.screen) if c.title.startswith("Step one cycle"))
        step.callback()
        await settle(pilot)
        assert app.session.machine.cycle == 1


@pilot_test
async def test_command_line_history_and_errors(here):
    async with open_app(here) as (app, pilot):
        await command(pilot, "print 6 * 7")
        await command(pilot, "frobnicate")
        assert "6 * 7 = 42" in log_text(app) and "unknown command 'frobnicate'" in log_text(app)
        await keys(pilot, "colon", "up", "up")
        assert app.query_one("#command").value == "print 6 * 7"
        await keys(pilot, "down")
        assert app.query_one("#command").value == "frobnicate"
        await keys(pilot, "down")
        assert app.query_one("#command").value == ""
        await keys(pilot, "escape")
        assert isinstance(app.focused, SourceView)


@pilot_test
async def test_clicking_the_gutter_toggles_a_breakpoint(here):
    async with open_app(here) as (app, pilot):
        view = app.query_one(SourceView)
        await pilot.click(SourceView, offset=(7, LINE_RHM))   # border row, then lines 1..
        await settle(pilot)
        assert [bp.indices for bp in app.session.breakpoints.values()] == [(0,)]


@pilot_test
async def test_full_size_unified_buffer_view(tmp_path):
    from test_debugger_support import matmul_tiled_session
    session, _ = matmul_tiled_session(tmp_path)
    async with open_app(tmp_path, session=session) as (app, pilot):
        await command(pilot, "goto ub[98303]")
        view = app.query_one("#mem-ub", MemoryView)
        assert view.virtual_size.height == 98_304 + 1 and view.target_row == 98_303
        assert any(line_text(view, y).lstrip().startswith("98303:") for y in range(1, view.size.height))
        await keys(pilot, "x", "s", "n")
        assert view.radix == "signed" and session.machine.cycle > 1
        await command(pilot, "goto ub.x + 1")
        assert view.target_row == 1
        row = next(line_text(view, y) for y in range(1, view.size.height)
                   if line_text(view, y).lstrip().startswith("1:"))
        assert row.split()[1:4] == [str(v) for v in session.machine.ub[1][:3].view(np.int8)]


@pilot_test
async def test_source_pane_follows_the_next_instruction_into_an_included_file(here):
    (here / "layer.tasm").write_text("; the included layer\n    TAG 5\n    WHM in, host.x, 4\n")
    main_source = (".config array_size=8, ub_rows=64, acc_rows=32\n.host x, 4\n.ub in, 4\n"
                   "    RHM host.x, in, 4\n.include \"layer.tasm\"\n    HLT\n")
    async with open_app(here, main_source, "main.tasm") as (app, pilot):
        view = app.query_one(SourceView)
        assert view.listing.name == "main.tasm" and view.next_line == 4
        await command(pilot, "break layer.tasm:2")
        await keys(pilot, "c")
        assert view.listing.name == "layer.tasm" and view.next_line == 2
        assert "layer.tasm" in view.border_title and view.break_lines == {2: True}


# One example of every command, typed on the screen's command line.  A new command must be
# added here, so that none ships without having run in the UI.
EVERY_COMMAND = {
    "step": "step", "next": "next 2", "until": f"until line {LINE_MMC2}", "finish": "finish",
    "continue": "continue", "run": "run 10", "reverse-step": "reverse-step 3", "reverse-next": "reverse-next",
    "reverse-continue": "reverse-continue", "restart": "restart", "break": f"break {LINE_MMC1}",
    "tbreak": f"tbreak {LINE_MMC2}", "condition": "condition 1 cycle >= 0", "ignore": "ignore 1 0",
    "watch": "watch ub[0:2]", "rwatch": "rwatch ub[0:2]", "awatch": "awatch acc[0]",
    "reload": "reload", "jump": "jump 5", "catch": "catch tag", "uncatch": "uncatch tag", "delete": "delete 3",
    "disable": "disable 1", "enable": "enable 1", "print": "print acc[0][0:4]",
    "x": "x/4d ub[0]", "expect": "expect cycle >= 0", "info": "info breakpoints", "list": "list",
    "goto": "goto acc[1]", "radix": "radix unsigned", "echo": "echo hello", "help": "help break",
    "compare": "compare ub[60] zeros.npy", "dump": "dump ub[0:2] d.npy", "display": "display cycle",
    "undisplay": "undisplay", "search": "search MMC", "reverse-search": "?MMC", "segment": "segment",
    "issue": "issue",
}


@pilot_test
async def test_every_command_runs_on_the_command_line(here):
    from debugger.commands import COMMANDS
    assert set(EVERY_COMMAND) == {c.names[0] for c in COMMANDS}
    np.save(here / "zeros.npy", np.zeros((1, 8), np.int8))
    async with open_app(here) as (app, pilot):
        results = []
        original = app.show_result

        def record(result, echo=True):
            results.append(result)
            original(result, echo)
        app.show_result = record
        for name, line in EVERY_COMMAND.items():
            results.clear()
            await command(pilot, line)
            assert results and results[-1].ok, (name, results and results[-1].text())
        assert "internal error" not in log_text(app)
        assert "hello" in log_text(app)


@pilot_test
async def test_source_cursor_keys(here):
    async with open_app(here) as (app, pilot):
        view = app.query_one(SourceView)
        view.focus()
        await settle(pilot)
        last = len(view.listing.lines)
        start = view.cursor_line
        assert 1 < start < last
        await keys(pilot, "j")
        assert view.cursor_line == start + 1
        await keys(pilot, "k", "k")
        assert view.cursor_line == start - 1
        await keys(pilot, "down", "up")
        assert view.cursor_line == start - 1
        await keys(pilot, "pagedown")
        assert view.cursor_line == min(start - 1 + 20, last)
        await keys(pilot, "pageup", "pageup")
        assert view.cursor_line == 1


@pilot_test
async def test_tab_moves_focus_and_q_quits(here):
    async with open_app(here) as (app, pilot):
        assert isinstance(app.focused, SourceView)
        await keys(pilot, "tab")
        assert not isinstance(app.focused, SourceView)
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running


@pilot_test
async def test_memory_view_W_and_U_jump_to_the_writer_and_reader(here):
    """In the UB view, up/down move the marked row; W goes back to where its last write
    completed (the source cursor on the writer's line), W again to the write before; U to
    the last read.  Writers and readers of hidden (ub[4..7]) from SMALL's text."""
    async with open_app(here) as (app, pilot):
        m = app.session.machine
        await command(pilot, "continue")
        await command(pilot, "goto hidden")              # marks ub[4], focuses the UB view
        view = app.query_one("#mem-ub", MemoryView)
        assert app.focused is view and view.selected_row() == 4
        await keys(pilot, "down")
        assert view.selected_row() == 5
        source = app.query_one(SourceView)
        for writer, line in ((7, LINE_ACT2), (5, LINE_ACT1)):
            await keys(pilot, "W")
            assert m.cycle == m.finish_cycle(writer)
            assert source.cursor_line == line and view.selected_row() == 5
        await keys(pilot, "W")                            # nothing earlier: says so, stays
        assert m.cycle == m.finish_cycle(5) and "not written" in log_text(app)
        await command(pilot, "continue")
        view.focus()
        await keys(pilot, "U")
        assert m.cycle == m.finish_cycle(8) and source.cursor_line == LINE_ACT2 + 1
        assert "W (memory)" in HelpScreen(app.KEY_HELP).plain_text()

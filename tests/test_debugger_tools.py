"""What users missed most (issue 23, item 4): compare a range with an expected .npy, dump
a range to .npy, search the source, `display`, a watchpoint on a value condition, `goto`
with a column.  Expected values come from the numpy oracle of test_debugger_support."""
from __future__ import annotations

import numpy as np
import pytest

from debugger.cli import main
from debugger.memory_view import MemoryView
from debugger.source_view import SourceView
from test_debugger_support import (LINE_ACT2, LINE_MMC1, LINE_MMC2, engine, here, oracle, run,  # noqa: F401
                                   small_data, write_program)
from test_debugger_ui import command, keys, log_text, open_app, pilot_test


def test_compare_lists_every_difference_against_the_oracle(engine, here):
    want = oracle(*small_data())
    run(engine, "continue")                                        # to the halt
    np.save(here / "good.npy", want["hidden2"].astype(np.int8))
    r = run(engine, "compare hidden good.npy")
    assert "all 32 values match" in r.text()
    bad = want["hidden2"].astype(np.int8).copy()
    bad[1, 2] = 0 if bad[1, 2] else 1
    bad[3, 7] = -5 if bad[3, 7] != -5 else 5
    np.save(here / "bad.npy", bad)
    r = run(engine, "compare ub.hidden bad.npy", ok=False)
    text = r.text()
    assert "2 of 32 values differ" in text
    for i, c in ((1, 2), (3, 7)):
        got, exp = int(want["hidden2"][i, c]), int(bad[i, c])
        assert f"ub[{4 + i}][{c}] = {got}, expected {exp} ({got - exp:+d})" in text
    assert r.ui == ("mismatches", "ub", [(5, 2), (7, 7)]), r.ui
    # one row from a column on, and int32 accumulators
    np.save(here / "row.npy", want["acc2"][2, 3:].astype(np.int32))
    assert "all 5 values match" in run(engine, "compare acc[2][3] row.npy").text()
    np.save(here / "big.npy", np.zeros((4, 9), np.int8))
    assert "outside" in run(engine, "compare hidden big.npy", ok=False).text()
    np.save(here / "rows.npy", np.zeros((3, 8), np.int8))
    assert "has 3 rows but the range has 4" in run(engine, "compare ub[4:8] rows.npy", ok=False).text()
    assert "no such file" in run(engine, "compare hidden nope.npy", ok=False).text() or \
        "cannot read" in run(engine, "compare hidden nope.npy", ok=False).text()
    run(engine, "compare hidden", ok=False)


def test_dump_writes_the_range_atomically_and_never_onto_an_input(engine, here):
    want = oracle(*small_data())
    run(engine, "continue")
    run(engine, "dump hidden out.npy")
    out = np.load(here / "out.npy", allow_pickle=False)
    assert out.dtype == np.int8 and np.array_equal(out, want["hidden2"])
    run(engine, "dump acc[0:4] acc.npy")
    acc = np.load(here / "acc.npy")
    assert acc.dtype == np.int32 and np.array_equal(acc, want["acc2"])
    before = (here / "host.npy").read_bytes()
    assert "it is the input" in run(engine, "dump hidden host.npy", ok=False).text()
    assert (here / "host.npy").read_bytes() == before
    run(engine, "dump hidden nodir/x.npy", ok=False)
    run(engine, "dump hidden out.txt", ok=False)
    assert not list(here.glob(".*.tmp"))
    # the dump reads back as the expected array of a compare
    assert "all 32 values match" in run(engine, "compare hidden out.npy").text()


def test_display_is_printed_after_every_stop(engine):
    want = oracle(*small_data())
    run(engine, "display acc[0][0:2]")
    run(engine, f"break {LINE_ACT2}")           # after the first MMC's sums landed
    r = run(engine, "continue")
    assert r.text().splitlines()[-1] == f"1: acc[0][0:2] = {np.array(want['acc1'][0, :2])}"
    r = run(engine, "step 3")
    assert "1: acc[0][0:2]" in r.text()
    run(engine, "display nosuch", ok=False)
    run(engine, "undisplay 1")
    assert "acc[0][0:2]" not in run(engine, "step").text()
    run(engine, "undisplay 7", ok=False)


def test_a_watch_on_a_value_condition_stops_when_it_changes(engine):
    want = oracle(*small_data())
    # the first (row, column) whose second-layer sum is negative: set by MMC2 only
    negative = [(r, c) for r in range(4) for c in range(8)
                if want["acc1"][r, c] >= 0 and want["acc2"][r, c] < 0]
    r, c = negative[0]
    run(engine, f"watch acc[{r}][{c}] < 0")
    stop = run(engine, "continue").stop
    assert stop.kind == "watchpoint" and stop.index == 6         # the second MatrixMultiply
    assert engine.session.machine.acc[r, c] == want["acc2"][r, c]
    assert "became true" in stop.message
    assert run(engine, "continue").stop.kind == "halted"
    run(engine, "watch cycle > 3", ok=False)                     # reads no memory


def test_search_in_batch_mode_lists_the_lines(engine):
    r = run(engine, "/mmc.so")
    assert [line.split(":")[1] for line in r.text().splitlines()] == [str(LINE_MMC1), str(LINE_MMC2)]
    run(engine, "search nothing-like-this", ok=False)
    back = run(engine, "?mmc.so")                       # backwards: the last match first
    assert [line.split(":")[1] for line in back.text().splitlines()] == [str(LINE_MMC2), str(LINE_MMC1)]
    assert back.ui == ("search", "mmc.so", -1)
    assert "reverse-search TEXT: what?" in run(engine, "reverse-search", ok=False).text()
    assert "reverse-search" in run(engine, "?").text()     # `?` alone is still help


@pilot_test
async def test_question_mark_searches_backwards_from_the_cursor(here):
    async with open_app(here, size=(80, 24)) as (app, pilot):
        view = app.query_one(SourceView)
        acts = [n for n, line in enumerate(view.listing.plain, 1) if "act" in line.lower()]
        assert len(acts) >= 2 and LINE_ACT2 in acts
        view.cursor_line = len(view.listing.plain)          # the last line: up finds the last ACT
        await keys(pilot, "question_mark")
        box = app.query_one("#command")
        assert box.value == "?"
        box.value = "?ACT"
        await keys(pilot, "enter")
        assert view.cursor_line == acts[-1] and view.border_subtitle.startswith("?ACT")
        await keys(pilot, "n")                              # n goes on up
        assert view.cursor_line == acts[-2] and app.session.machine.cycle == 0
        await keys(pilot, "N")                              # N back down
        assert view.cursor_line == acts[-1]
        await keys(pilot, "escape", "n")                    # n steps again
        assert app.session.machine.cycle > 0


@pilot_test
async def test_search_keys_and_n_back_to_stepping(here):
    async with open_app(here, size=(80, 24)) as (app, pilot):
        view = app.query_one(SourceView)
        await keys(pilot, "slash")
        box = app.query_one("#command")
        box.value = "/ACT"
        await keys(pilot, "enter")
        first = view.cursor_line
        assert "ACT" in view.listing.plain[first - 1]
        await keys(pilot, "n")
        assert view.cursor_line == LINE_ACT2 and app.session.machine.cycle == 0   # no step
        await keys(pilot, "N")
        assert view.cursor_line == first
        await keys(pilot, "escape", "n")                            # n steps again
        assert app.session.machine.cycle > 0


@pilot_test
async def test_goto_honours_the_column_and_compare_marks_cells(here):
    args = write_program(here)
    async with open_app(here, size=(80, 24)) as (app, pilot):
        await command(pilot, "goto ub[30][6]")
        view = app.query_one("#mem-ub", MemoryView)
        assert view.target_row == 30 and view.target_col == 6
        row = view.render_line(30 - int(view.scroll_offset.y) + 1)
        marked = [seg.text for seg in row if seg.style and seg.style.bgcolor
                  and seg.style.bgcolor.name == "yellow" and seg.text.strip() and ":" not in seg.text]
        assert marked == ["00"]
        np.save(here / "zeros.npy", np.zeros((1, 8), np.int8))
        await command(pilot, "compare host[0] zeros.npy")
        host = app.query_one("#mem-host", MemoryView)
        nonzero = {int(c) for c in np.flatnonzero(args.host_array[0])}
        assert set(host.mismatches[0]) == nonzero and app.query_one("#memories").active == "tab-host"


def test_operands_are_shown_with_the_programs_names(engine, here):
    run(engine, f"break {LINE_MMC1}")
    r = run(engine, "continue")
    assert "#4 `MMC.SO input, sums, 4`" in r.text()
    run(engine, "step 5")
    text = run(engine, "info pipeline").text()
    assert "#4 MMC.SO input, sums, 4" in text and "#5 ACT.R sums, hidden, 4" in text
    # a binary without sources: numbers, as the disassembler writes them
    from tpuasm.assembler import assemble_file
    from tpuasm.machine import Machine  # noqa: F401
    assemble_file(here / "small.tasm").stripped().save(here / "bare.tbin")
    (here / "b.tdb").write_text("break *4\ncontinue\n")
    assert main(["bare.tbin", "--host", "host.npy", "--weights", "w.npy", "--batch", "b.tdb"]) == 0


@pilot_test
async def test_the_pipeline_pane_shows_symbolic_operands(here):
    async with open_app(here, size=(120, 40)) as (app, pilot):
        await command(pilot, f"until line {LINE_MMC1}")
        await command(pilot, "step 3")
        pane = app.query_one("#pipeline-box")
        text = "\n".join(strip.text for strip in pane._strips)
        assert "MMC.SO input, sums" in text

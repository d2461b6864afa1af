"""The second generation's command semantics (issue 13) and bad input (issue 14, row 17),
without a screen.

`next`, `finish` and `until` are checked against the machine's own per-instruction
timing (issue/finish cycles, an independent record kept by the core) and against a fresh
machine; messages against the text docs/debugger.md promises.
"""
from __future__ import annotations

import numpy as np
import pytest

from debugger import main
from debugger.commands import X_LIMIT
from test_debugger_support import (engine, run,  # noqa: F401
                                   LINE_ACT1, LINE_MMC1, LINE_RHM, here, make_session,  # noqa: F401
                                   write_program)


# -- problem 8: next ----------------------------------------------------------------------------
def test_next_issues_the_next_instruction_and_stops_when_it_has_finished(engine):
    s = engine.session
    m = s.machine
    for _ in range(5):
        before = s.next_to_issue()
        if before == len(s.program) - 1:        # HLT: `next` halts the machine
            break
        retired_before = sum(m.retired(i) for i in range(len(s.program)))
        r = run(engine, "next")
        # it issued, it has finished, and not one cycle more was run
        assert m.retired(before) and m.finish_cycle(before) == m.cycle
        retired = sum(m.retired(i) for i in range(len(s.program))) - retired_before
        assert f"{retired} instruction(s) retired" in r.text()
        assert f"#{before} " in r.text() and "finished its stage" in r.text()


def test_next_help_says_what_next_does(engine):
    text = run(engine, "help next").text()
    assert "issue the next instruction and run until it has finished its stage" in text


# -- finish ---------------------------------------------------------------------------------------
def test_finish_runs_until_everything_issued_has_finished(engine):
    s = engine.session
    m = s.machine
    run(engine, f"break {LINE_ACT1}")
    run(engine, "continue")
    run(engine, "delete")
    run(engine, "step 2")                     # the ACT has issued, behind the MMC
    times = m.intervals()
    in_flight = np.flatnonzero(times[:, 2] > m.cycle)
    assert len(in_flight) >= 1
    run(engine, "finish")
    assert m.cycle == times[in_flight, 2].max()
    assert all(m.retired(int(i)) for i in in_flight)
    run(engine, "continue")
    assert run(engine, "finish").stop.kind == "halted"


# -- problem 9: conditions validated when set; until after the line issued --------------------------
@pytest.mark.parametrize("cond, why", [("nosuch > 1", "unknown name `nosuch`"),
                                       ("ub.nosuch == 0", "no symbol ub.nosuch"),
                                       ("cycle >", "cannot parse"),
                                       ("__import__('os')", "not allowed")])
def test_a_bad_condition_is_rejected_when_set(engine, cond, why):
    r = run(engine, f"break {LINE_MMC1} if {cond}", ok=False)
    assert why in r.text()
    assert not engine.session.breakpoints
    run(engine, f"break {LINE_MMC1}")
    assert why in run(engine, f"condition 1 {cond}", ok=False).text()
    assert engine.session.breakpoints[1].condition is None


def test_good_conditions_are_accepted(engine):
    for cond in ("acc[3][7] < 0", "cycle > 5 and retired >= 1", "sum(ub.input[0]) != 3",
                 "max(acc.sums) == 0", "act_shift == 0"):
        run(engine, f"break {LINE_MMC1} if {cond}")


def test_until_a_line_that_already_issued_says_so_and_does_not_run(engine):
    m = engine.session.machine
    run(engine, f"until line {LINE_MMC1}")
    run(engine, "step 3")
    cycle = m.cycle
    r = run(engine, f"until line {LINE_RHM}", ok=False)
    assert "already issued" in r.text() and m.cycle == cycle and m.status != "halted"


# -- issue 14 row 17 --------------------------------------------------------------------------------
def test_x_count_is_capped_and_zero_is_refused(engine):
    assert f"count must be 1..{X_LIMIT}, got 999999999" in run(engine, "x/999999999d ub[0]", ok=False).text()
    assert "count must be 1" in run(engine, "x/0d ub[0]", ok=False).text()
    # at the limit it prints up to the end of the memory: 64 rows of 8 at this shape
    assert len(run(engine, f"x/{X_LIMIT}d ub[0]").lines) == 64


def test_ignore_refuses_a_negative_count(engine):
    run(engine, f"break {LINE_MMC1}")
    assert "COUNT must be 0 or more, got -5" in run(engine, "ignore 1 -5", ok=False).text()
    assert engine.session.breakpoints[1].ignore == 0


def test_batch_x_huge_fails_fast(here, capsys):
    args = write_program(here)
    script = here / "x.tdb"
    script.write_text("x/999999999d ub[0]\nx/0d ub[0]\nignore 1 -5\n")
    code = main([str(args.program), "--host", str(args.host), "--weights", str(args.weights),
                 "--batch", str(script)])
    out = capsys.readouterr().out
    assert code == 1 and "x.tdb:1: command failed" in out and "x.tdb:2: command failed" in out
    assert len(out.splitlines()) < 12


@pytest.mark.parametrize("where, why", [("/nonexistent/x.svg", "directory /nonexistent does not exist"),
                                        (".", "is a directory")])
def test_screenshot_to_an_unwritable_place_is_a_usage_error(here, capsys, where, why):
    args = write_program(here)
    code = main([str(args.program), "--host", str(args.host), "--weights", str(args.weights),
                 "--screenshot", where])
    err = capsys.readouterr().err
    assert code == 2 and why in err and "Traceback" not in err

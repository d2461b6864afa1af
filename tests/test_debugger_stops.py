"""No lost stops (issue 23, item 1): every breakpoint and watchpoint hit in one cycle is
reported, in order; cycle breakpoints; conditions on the cycle; reverse read watches.

The cycles are checked against the machine's own per-instruction intervals (issue,
start, finish) of an independent run, never against numbers copied from a run."""
from __future__ import annotations

import numpy as np

from tpuasm.assembler import assemble_file
from tpuasm.machine import Machine
from test_debugger_support import LINE_ACT1, LINE_MMC1, LINE_MMC2, engine, here, run  # noqa: F401

MMC1, MMC2 = 4, 6          # instruction indices of the two MatrixMultiplies of SMALL


def reference_intervals(here) -> np.ndarray:
    """(issue, start, finish) of every instruction, from a fresh machine run to the halt."""
    program = assemble_file(here / "small.tasm")
    m = Machine.for_program(program)
    m.load(program, host=here / "host.npy", weights=here / "w.npy")
    m.run()
    return m.intervals()


def test_two_watchpoints_hit_by_one_instruction_are_both_reported(engine, here):
    times = reference_intervals(here)
    run(engine, "rwatch input")                  # MMC1 reads ub.input ...
    run(engine, "watch sums")                    # ... and writes acc.sums
    r = run(engine, "continue")
    lines = r.text().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("watchpoint 1 input read by #4") and "watchpoint 2 sums written by #4" in lines[1]
    assert engine.session.machine.cycle == times[MMC1, 2]
    assert r.stop.numbers == (1, 2)
    # the next stop is the second MMC's write, not the halt
    r = run(engine, "continue")
    assert r.stop.kind == "watchpoint" and r.stop.index == MMC2
    assert engine.session.machine.cycle == times[MMC2, 2]
    assert run(engine, "continue").stop.kind == "halted"


def test_two_breakpoints_on_one_instruction_are_both_reported(engine):
    run(engine, f"break {LINE_MMC1}")
    run(engine, f"break *{MMC1}")
    run(engine, f"break {LINE_MMC1} if cycle < 0")        # does not hold: not reported
    r = run(engine, "continue")
    assert r.stop.numbers == (1, 2)
    assert [x.split(" at ")[0] for x in r.text().splitlines()] == ["breakpoint 1", "breakpoint 2"]


def test_cycle_breakpoints_stop_exactly_there(engine, here):
    run(engine, "break cycle 700")
    run(engine, "tbreak cycle 300")
    r = run(engine, "continue")
    assert r.stop.kind == "breakpoint" and engine.session.machine.cycle == 300
    assert "temporary breakpoint 2 at cycle 300" in r.text()
    r = run(engine, "continue")
    assert engine.session.machine.cycle == 700 and "breakpoint 1 at cycle 700" in r.text()
    assert run(engine, "continue").stop.kind == "halted"
    r = run(engine, "reverse-continue")
    assert engine.session.machine.cycle == 700 and r.stop.kind == "breakpoint"
    assert "cycle 300" not in run(engine, "info breakpoints").text()        # tbreak is gone
    run(engine, "break cycle 10", ok=False)                                  # not ahead
    run(engine, "break cycle", ok=False)


def test_until_a_number_is_a_cycle_and_until_line_a_line(engine, here):
    """`until N` runs to cycle N (issue 23); `until line N` / `until :N` to line N, stopping
    when its instruction is about to issue (the cycle the reference machine issued it)."""
    times = reference_intervals(here)
    m = engine.session.machine
    r = run(engine, "until 500")
    assert m.cycle == 500 and "reached cycle 500" in r.text()
    r = run(engine, f"until {LINE_MMC1}", ok=False)         # not ahead: says what to type
    assert "not ahead" in r.text() and f"`until line {LINE_MMC1}`" in r.text() and m.cycle == 500
    run(engine, "restart")
    r = run(engine, f"until :{LINE_MMC1}")
    assert engine.session.next_to_issue() == 4 and m.cycle == times[4, 0]
    run(engine, "restart")
    r = run(engine, f"until line {LINE_MMC2}")
    assert engine.session.next_to_issue() == 6 and m.cycle == times[6, 0]
    run(engine, "restart")
    r = run(engine, f"until {LINE_MMC2}")                   # a line number too: a note
    assert m.cycle == LINE_MMC2 and f"`until line {LINE_MMC2}` runs to line" in r.text()
    assert "no instruction on line 2 " in run(engine, "until line 2", ok=False).text() + " "
    run(engine, "until 1_000")
    assert m.cycle == 1000


def test_until_cycle_and_a_condition_on_the_cycle(engine, here):
    times = reference_intervals(here)
    r = run(engine, "until cycle 500")
    assert engine.session.machine.cycle == 500 and "reached cycle 500" in r.text()
    run(engine, "break if cycle >= 5000", ok=True)         # never reached: the run halts first
    assert run(engine, "continue").stop.kind == "halted"
    run(engine, "restart")
    run(engine, "delete")
    run(engine, "break if cycle >= 720")                     # a cycle breakpoint, exact
    run(engine, "continue")
    assert engine.session.machine.cycle == 720
    run(engine, "delete")
    # any other condition: checked before each instruction issues
    run(engine, "break if retired >= 6")
    r = run(engine, "continue")
    nxt = r.stop.index
    retired_before = int((times[:, 2] <= engine.session.machine.cycle).sum())
    assert r.stop.kind == "breakpoint" and retired_before >= 6
    assert times[nxt, 0] == engine.session.machine.cycle      # about to issue now


def test_a_watch_and_a_breakpoint_in_the_same_cycle_are_both_seen(engine, here):
    """The watch stops at the start of the cycle; a breakpoint on an instruction issuing in
    that cycle must stop the next continue (it used to be skipped as "already there")."""
    times = reference_intervals(here)
    from debugger.expr import Location
    from tpuasm.machine.access import MEMORY_CODES
    s = engine.session
    a = s.accesses
    writes = {int(i): ({v: k for k, v in MEMORY_CODES.items()}[int(code)], int(lo), int(hi))
              for i, code, lo, hi, w in zip(a.index, a.mem, a.lo, a.hi, a.write) if w == 1}
    # an instruction issuing exactly when another one's memory write completes
    pairs = [(i, j) for i in writes for j in range(len(times))
             if i != j and times[j, 0] == times[i, 2]]
    assert pairs, times
    writer, issuer = pairs[0]
    memory, lo, hi = writes[writer]
    s.add_watchpoint(Location(memory, lo, 0, hi - lo), f"{memory}[{lo}]", "write")
    run(engine, f"break *{issuer}")
    stops = []
    for _ in range(6):
        r = run(engine, "continue")
        stops.append((r.stop.kind, r.stop.index, s.machine.cycle))
        if r.stop.kind == "halted":
            break
    assert ("watchpoint", writer, times[writer, 2]) in stops
    assert ("breakpoint", issuer, times[issuer, 0]) in stops


def test_reverse_continue_says_read_by_for_a_read_watch(engine):
    run(engine, "rwatch input")
    run(engine, "continue")
    run(engine, "continue")
    r = run(engine, "reverse-continue")
    assert "watchpoint 1 input read by #4" in r.text() and "written" not in r.text()


def test_issue_runs_until_the_next_instruction_has_issued(engine, here):
    times = reference_intervals(here)
    m = engine.session.machine
    seen = []
    while m.status not in ("halted", "fault"):
        nxt = engine.session.next_to_issue()
        if nxt is None:
            break
        run(engine, "issue")
        assert m.issue_cycle(nxt) == times[nxt, 0] and m.cycle == times[nxt, 0] + 1, nxt
        seen.append(nxt)
    assert seen == list(range(len(times)))[:len(seen)] and len(seen) >= len(times) - 1
    # from a breakpoint in front of it, too
    run(engine, "restart")
    run(engine, f"break *{MMC2}")
    run(engine, "continue")
    run(engine, "issue")
    assert m.cycle == times[MMC2, 0] + 1

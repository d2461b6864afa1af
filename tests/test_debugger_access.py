"""Memory access history and the new watchpoints in the debugger (issue 13, problem 7):
`info writes/reads`, `jump`, `watch -w`, `rwatch`, `awatch`, `catch unwritten`.
Expected instructions and cycles come from the machine's own per-instruction times."""
from __future__ import annotations

import numpy as np

from debugger.commands import Engine
from test_debugger_support import SMALL, here, make_session, write_program  # noqa: F401


def engine_on(here, source=SMALL, host=None):
    engine = Engine(make_session(here, source))
    if host is not None:                           # the same program on other data
        np.save("host.npy", host)
        engine.execute("restart")
        engine.session.machine.load(engine.session.program, host=host,
                                    weights=engine.session.weights_arg)
    return engine


def test_info_writes_and_reads_with_symbols(here):
    e = Engine(make_session(here))
    assert "not written by any instruction" in e.execute("info writes hidden + 1").text()
    e.execute("continue")
    m = e.session.machine
    text = e.execute("info writes hidden + 1").text()
    assert "ub[5]: written by 2 instruction(s)" in text
    assert f"#5 `ACT.R" in text and f"#7 `ACT " in text
    assert f"finished cycle {m.finish_cycle(7)}" in text
    text = e.execute("info reads ub.hidden").text()
    assert "#6 `MMC.SO" in text and "#8 `WHM" in text
    assert not e.execute("info writes tile[0]").ok


def test_jump_back_to_the_writer_and_forward_again(here):
    e = Engine(make_session(here))
    e.execute("continue")
    m = e.session.machine
    end, target = m.cycle, m.finish_cycle(5)
    e.execute(f"jump {target}")
    assert m.cycle == target and m.retired(5) and not m.retired(6)
    e.execute(f"jump {end}")
    assert m.cycle == end and m.status == "halted"


def test_watch_w_fires_on_zeros_over_zeros_and_watch_does_not(here):
    zeros = np.zeros((8, 8), dtype=np.int8)
    e = engine_on(here, host=zeros)
    assert e.execute("watch acc.sums").ok
    assert e.execute("continue").stop.kind == "halted"     # no change of value, no stop
    e = engine_on(here, host=zeros)
    assert "any write" in e.execute("watch -w acc.sums").text()
    r = e.execute("continue")
    assert r.stop.kind == "watchpoint" and r.stop.index == 4
    assert e.session.machine.cycle == e.session.machine.finish_cycle(4)


def test_rwatch_and_awatch(here):
    e = Engine(make_session(here))
    e.execute("rwatch hidden")
    stops = []
    while (r := e.execute("continue")).stop.kind == "watchpoint":
        stops.append(r.stop.index)
        assert "read by" in r.text()
    assert stops == [6, 8]
    e = Engine(make_session(here))
    e.execute("awatch hidden")
    stops = []
    while (r := e.execute("continue")).stop.kind == "watchpoint":
        stops.append(r.stop.index)
    assert stops == [5, 6, 7, 8]
    assert "rwatch" in Engine(make_session(here)).execute("help rwatch").text()


def test_catch_unwritten(here):
    bad = SMALL.replace("    MMC.SO input, sums, 4\n", "    MMC.SO hidden, sums, 4\n", 1)
    e = Engine(make_session(here, bad))
    assert "(1 in this program)" in e.execute("catch unwritten").text()
    r = e.execute("continue")
    assert r.stop.kind == "unwritten" and r.stop.index == 4
    assert "ub rows from ub[4] (4 row(s))" in r.text()
    assert e.session.machine.issue_cycle(4) == -1
    assert e.execute("continue").stop.kind == "halted"


def test_jump_writer_and_reader_walk_back_through_the_accesses(here):
    """SMALL writes hidden (ub[4..7]) with #5 ACT.R then #7 ACT; #6 MMC and #8 WHM read
    it (from the program text).  `jump writer` lands where each write completed, newest
    first, with the value that write left; with none left it says so."""
    from test_debugger_support import fresh_state_at, oracle, small_data
    e = Engine(make_session(here))
    e.execute("continue")
    m = e.session.machine
    expected = oracle(*small_data())
    for writer, values in ((7, expected["hidden2"]), (5, expected["hidden1"])):
        r = e.execute("jump writer hidden + 1")
        assert r.ok and r.stop.index == writer and r.ui == ("show-instruction", writer)
        assert m.cycle == m.finish_cycle(writer) and m.retired(writer)
        assert r.goto.memory == "ub" and r.goto.row == 5
        assert np.array_equal(m.ub[5].view(np.int8), values[1])
        assert np.array_equal(m.ub, fresh_state_at(here, m.cycle)["ub"])
    r = e.execute("jump writer hidden + 1")
    assert not r.ok and "not written by any instruction that finished before cycle" in r.text()
    e.execute("continue")
    for reader in (8, 6):
        r = e.execute("jump reader ub.hidden")
        assert r.ok and r.stop.index == reader and m.cycle == m.finish_cycle(reader)
    assert "access history covers" in e.execute("jump writer tile[0]").text()
    assert not e.execute("jump writer").ok

"""tpuasm.machine.access: the access map of a program and the history of a row, and the
machine's read / any-write watches.  Expected footprints are written by hand from
spec/isa.md for the debugger's two-layer program (rows listed below)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tpuasm.assembler import assemble
from tpuasm.machine import Machine, Watch
from tpuasm.machine.access import AccessMap
from test_debugger_support import SMALL, small_data

# (index, memory, rows, write) by reading SMALL: x = host 0..3, y = host 4..7,
# input = ub 0..3, hidden = ub 4..7, sums = acc 0..3
HAND = {
    (0, "host", 0, 4, False), (0, "ub", 0, 4, True),          # RHM host.x, input, 4
    (4, "ub", 0, 4, False), (4, "acc", 0, 4, True),           # MMC.SO input, sums, 4
    (5, "acc", 0, 4, False), (5, "ub", 4, 8, True),           # ACT.R sums, hidden, 4
    (6, "ub", 4, 8, False), (6, "acc", 0, 4, True),           # MMC.SO hidden, sums, 4
    (7, "acc", 0, 4, False), (7, "ub", 4, 8, True),           # ACT sums, hidden, 4
    (8, "ub", 4, 8, False), (8, "host", 4, 8, True),          # WHM hidden, host.y, 4
}


def machine(source=SMALL, host=None):
    program = assemble(source, "small.tasm")
    m = Machine.for_program(program)
    h, w = small_data()
    m.load(program, host=h if host is None else host, weights=w)
    return m


def test_footprints_match_the_hand_written_table():
    amap = AccessMap(machine())
    names = {0: "ub", 1: "acc", 2: "host"}
    got = {(int(i), names[int(mem)], int(lo), int(hi), bool(w))
           for i, mem, w, lo, hi in zip(amap.index, amap.mem, amap.write, amap.lo, amap.hi)}
    assert got == HAND


def test_history_follows_the_machine_and_its_finish_cycles():
    m = machine()
    amap = AccessMap(m)
    assert amap.history("ub", 5, write=True) == [] and amap.last_writer("ub", 5) is None
    m.run()
    writers = amap.history("ub", 5, write=True)
    assert [a.index for a in writers] == [5, 7]
    assert [a.finish for a in writers] == [m.finish_cycle(5), m.finish_cycle(7)]
    assert amap.last_writer("ub", 5).index == 7
    assert [a.index for a in amap.history("ub", 4, 8, write=False)] == [6, 8]
    assert [a.index for a in amap.history("host", 2, write=False)] == [0]
    # mid-run: between the two ACTs only the first has written
    m2 = machine()
    m2.step(m.finish_cycle(5))
    assert AccessMap(m2).last_writer("ub", 5).index == 5


def test_unwritten_reads():
    assert AccessMap(machine()).unwritten_reads() == []
    # the second layer before the first: hidden (ub 4..7) read before anything writes it
    bad = SMALL.replace("    MMC.SO input, sums, 4\n", "    MMC.SO hidden, sums, 4\n", 1)
    found = AccessMap(machine(bad)).unwritten_reads()
    assert [(u.index, u.memory, u.start, u.count) for u in found] == [(4, "ub", 4, 4)]


def test_read_watch_stops_after_the_reader_finishes():
    m = machine()
    r = m.run(watch=[Watch("ub", 4, 5, access="read")])
    assert r.status == "watchpoint" and r.index == 6 and m.cycle == m.finish_cycle(6)
    r = m.run(watch=[Watch("ub", 4, 5, access="read")])
    assert r.status == "watchpoint" and r.index == 8
    assert m.run(watch=[Watch("ub", 4, 5, access="read")]).status == "halted"


def test_any_write_watch_fires_on_the_same_values():
    zeros = np.zeros((8, 8), dtype=np.int8)
    m = machine(host=zeros)
    r = m.run(watch=[Watch("acc", 0, 4)])       # zeros written over zeros: still a write
    assert r.status == "watchpoint" and r.index == 4 and not m.acc.any()
    m = machine()
    r = m.run(watch=[Watch("acc", 0, 4, access="access")])
    assert r.index == 4                         # the first MMC writes acc before any read


def test_bad_watch_access_is_a_value_error():
    import pytest
    with pytest.raises(ValueError, match="watch access"):
        Watch("ub", 0, 1, access="sometimes")

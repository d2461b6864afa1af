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


# ------------------------------------------------------------------ strided accesses, exactly
from _machine_programs import I, cfg, program   # noqa: E402

STRIDED_SHAPE = dict(array_size=8, ub_rows=64, acc_rows=32)


def exact_rows(source_program) -> dict:
    """{(index, memory, write): set of rows} from the access map's runs."""
    m = Machine.for_program(source_program)
    m.load(source_program, host=np.zeros((16, 8), np.int8),
           weights=np.zeros((2, 8, 8), np.int8))
    amap = AccessMap(m)
    names = {0: "ub", 1: "acc", 2: "host"}
    out: dict = {}
    for i, mem, w, lo, hi in zip(amap.index, amap.mem, amap.write, amap.lo, amap.hi):
        out.setdefault((int(i), names[int(mem)], bool(w)), set()).update(range(int(lo), int(hi)))
    return out, amap, m


def test_strided_dma_rows_are_exact():
    """Repeats at rep_ub_stride 10 / rep_host_stride 4, and RHMA's dma_ub_stride 3: rows
    written out by hand from spec/isa.md (base + i * rep_stride + k * step)."""
    prog = program(cfg("rep_ub_stride", 10), cfg("rep_host_stride", 4),
                   I("RHM", host=0, ub=20, length=3, repeat=3),
                   cfg("rep_ub_stride", 0), cfg("rep_host_stride", 0), cfg("dma_ub_stride", 3),
                   I("RHMA", host=1, ub=0, length=4), I("HLT"), **STRIDED_SHAPE)
    rows, amap, m = exact_rows(prog)
    assert rows[(2, "ub", True)] == {20, 21, 22, 30, 31, 32, 40, 41, 42}
    assert rows[(2, "host", False)] == {0, 1, 2, 4, 5, 6, 8, 9, 10}
    assert rows[(6, "ub", True)] == {0, 3, 6, 9}
    assert rows[(6, "host", False)] == {1, 2, 3, 4}
    m.run()
    assert [a.index for a in amap.history("ub", 31, write=True)] == [2]
    for gap in (23, 25, 29, 33):                     # inside the bounding range 20..42
        assert amap.history("ub", gap, write=True) == [], gap
    assert [a.index for a in amap.history("ub", 3, write=True)] == [6]
    assert amap.history("ub", 4, write=True) == []
    a = amap.history("ub", 25, 36, write=True)[0]    # a range: first and last row it touches
    assert (a.index, a.start, a.stop) == (2, 30, 33)


def test_repeated_mmc_and_convolution_taps_read_exact_rows():
    """MMC repeat 3 at rep_ub_stride 5: UB 0-1, 5-6, 10-11.  A 2 x 2 convolution, taps 2 x 2
    (conv_kw 2), stride 1, pitch 4: input vector (y + dy) * 4 + x + dx for y, x, dy, dx in
    {0, 1}: rows 0-2, 4-6, 8-10 from UB 32, never 35 or 39."""
    prog = program(I("RW", tile=0), cfg("rep_ub_stride", 5), cfg("rep_acc_stride", 2),
                   I("MMC", "S", ub=0, acc=0, length=2, repeat=3),
                   cfg("rep_ub_stride", 0), cfg("rep_acc_stride", 0),
                   cfg("conv_pitch", 4), cfg("conv_kw", 2),
                   I("MMC", "C", ub=32, acc=8, height=2, width=2, repeat=4), I("HLT"),
                   **STRIDED_SHAPE)
    rows, amap, m = exact_rows(prog)
    assert rows[(3, "ub", False)] == {0, 1, 5, 6, 10, 11}
    assert rows[(3, "acc", True)] == set(range(0, 6))
    assert rows[(8, "ub", False)] == {32 + v for v in (0, 1, 2, 4, 5, 6, 8, 9, 10)}
    assert rows[(8, "acc", True)] == {8, 9, 10, 11}
    # the scoreboard's bounding ranges are kept as they were
    b_index, b_mem, b_write, b_lo, b_hi = amap.bounds
    k = np.flatnonzero((b_index == 8) & (b_mem == 0))[0]
    assert (b_lo[k], b_hi[k]) == (32, 43)


def test_pitched_activate_and_strided_pooling_rows_are_exact():
    """ACT with act_ub_pitch 4, act_ub_width 2: output vector o at (o // 2) * 4 + o % 2, so
    UB 40, 41, 44, 45.  Max pooling 2 x 2 windows at stride 3 over a 2 x 6 image: windows at
    x 0 and 3 read columns 0, 1, 3, 4 of both rows (accumulator 16 + y * 6 + x)."""
    prog = program(cfg("act_ub_pitch", 4), cfg("act_ub_width", 2),
                   I("ACT", acc=0, ub=40, length=4),
                   cfg("act_ub_pitch", 0), cfg("act_ub_width", 1),
                   cfg("pool_size", 2), cfg("pool_width", 6), cfg("pool_stride", 3),
                   I("ACT", "M", acc=16, ub=50, length=12), I("HLT"), **STRIDED_SHAPE)
    rows, amap, m = exact_rows(prog)
    assert rows[(2, "ub", True)] == {40, 41, 44, 45}
    assert rows[(2, "acc", False)] == {0, 1, 2, 3}
    assert rows[(8, "acc", False)] == {16 + y * 6 + x for y in (0, 1) for x in (0, 1, 3, 4)}
    assert rows[(8, "ub", True)] == {50, 51}
    m.run()
    assert m.status == "halted"
    assert [a.index for a in amap.history("ub", 45, write=True)] == [2]
    assert amap.history("ub", 42, write=True) == [] and amap.history("acc", 18, write=False) == []


def test_repeated_vector_operation_rows_are_exact():
    """VADD.BL repeat=2 at rep_ub_stride 5: a reads 0, 1, 5, 6; B's constant row 20 once;
    L's table (256 / 8 = 32 rows at act_table 32); c writes 10, 11, 15, 16."""
    prog = program(cfg("rep_ub_stride", 5), cfg("act_table", 32),
                   I("VADD", "BL", repeat=2, a=0, b=20, c=10, length=2), I("HLT"),
                   **STRIDED_SHAPE)
    rows, amap, m = exact_rows(prog)
    assert rows[(2, "ub", False)] == {0, 1, 5, 6, 20} | set(range(32, 64))
    assert rows[(2, "ub", True)] == {10, 11, 15, 16}
    m.run()
    assert m.status == "halted"
    assert [a.index for a in amap.history("ub", 16, write=True)] == [2]
    assert amap.history("ub", 12, write=True) == [] and amap.history("ub", 3, write=False) == []


def test_exact_runs_lie_in_the_footprint_and_cover_every_written_row():
    """Random programs (strides, repeats, convolutions, pooling): every exact run lies in
    its access's bounding range, and every row that differs after the run lies in an exact
    write run of a retired instruction (the data path as the oracle)."""
    from test_pipeline_random import case, fresh
    for seed in range(40):
        prog, host, weights = case(seed)
        m = fresh(prog, host, weights)
        amap = AccessMap(m)
        b_index, b_mem, b_write, b_lo, b_hi = amap.bounds
        for i, mem, w, lo, hi in zip(amap.index, amap.mem, amap.write, amap.lo, amap.hi):
            inside = (b_index == i) & (b_mem == mem) & (b_write == w) & (b_lo <= lo) & (b_hi >= hi)
            assert inside.any(), (seed, i, mem, w, lo, hi)
        before = {name: getattr(m, name).copy() for name in ("ub", "acc", "host")}
        m.run()
        for name, code in (("ub", 0), ("acc", 1), ("host", 2)):
            changed = np.flatnonzero((getattr(m, name) != before[name]).reshape(
                len(before[name]), -1).any(axis=1))
            covered = np.zeros(len(before[name]), bool)
            for i, mem, w, lo, hi in zip(amap.index, amap.mem, amap.write, amap.lo, amap.hi):
                if mem == code and w and m.retired(int(i)):
                    covered[max(lo, 0):max(hi, 0)] = True
            assert covered[changed].all(), (seed, name, changed[~covered[changed]])

"""History: stepping back reproduces exactly the state of a fresh run to the same cycle."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.machine import History, Machine, Watch

from _machine_programs import I, cfg, lstm1_600x600, program

PROG = program(I("RW", repeat=2, tile=0), I("RHM", host=0, ub=0, length=30),
               I("MMC", "SO", ub=0, acc=0, length=30), I("ACT", "R", acc=0, ub=100, length=30),
               cfg("act_shift", 2), I("MMC", "SO", ub=100, acc=40, length=30),
               I("ACT", acc=40, ub=200, length=30), I("WHM", ub=200, host=0, length=30),
               I("TAG", tag=9), I("HLT"))


def data():
    rng = np.random.default_rng(5)
    return (rng.integers(-128, 128, (64, 256)).astype(np.int8),
            rng.integers(-128, 128, (4, 256, 256)).astype(np.int8))


def fresh(cycle, program=None):
    """A machine loaded with `program` (PROG by default) and run to `cycle`."""
    h, w = data()
    m = Machine()
    m.load(program or PROG, host=h, weights=w)
    if cycle:
        m.step(cycle)
    return m


def same_state(a: Machine, b: Machine):
    assert a.cycle == b.cycle
    for name in ("ub", "acc", "host", "times", "tl", "sg", "cregs"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.counters() == b.counters()
    assert a.pipeline() == b.pipeline()
    assert a.fifo() == b.fifo() and a.shadow() == b.shadow() and a.active() == b.active()
    assert a.registers() == b.registers() and a.events == b.events


def test_back_matches_fresh_run():
    h, w = data()
    m = Machine()
    m.load(PROG, host=h, weights=w)
    hist = History(m, interval=500, max_snapshots=4)
    r = hist.run()
    assert r.status == "halted"
    end = m.cycle
    for target in (end - 1, end - 700, 2000, 1500, 1, 0):
        hist.goto(target)
        same_state(m, fresh(target))
    hist.goto(end - 1)
    hist.back(1)
    same_state(m, fresh(end - 2))
    # forward again from the past reaches the same end
    assert m.run().status == "halted" and m.cycle == end
    same_state(m, _finished())


def _finished():
    m = fresh(0)
    m.run()
    return m


def test_back_instruction_and_reverse_continue():
    h, w = data()
    m = Machine()
    m.load(PROG, host=h, weights=w)
    hist = History(m, interval=300)
    hist.run()
    hlt_issue, act_finish, mmc_issue = int(m.times[9, 0]), int(m.times[3, 2]), int(m.times[5, 0])
    r = hist.back_instruction()
    assert m.cycle == hlt_issue                     # just before HLT issued
    assert not m.retired(9)
    hist.run()
    r = hist.reverse_continue(breakpoints=[5])
    assert r.status == "breakpoint" and r.index == 5 and m.cycle == mmc_issue
    same_state(m, fresh(m.cycle))
    hist.run()
    r = hist.reverse_continue(watch=[Watch("ub", 100, 101)])
    assert r.status == "watchpoint" and r.index == 3 and m.cycle == act_finish


def test_history_memory_is_bounded():
    m = Machine()
    w = np.random.default_rng(0).integers(-128, 128, (9, 256, 256)).astype(np.int8)
    m.load(lstm1_600x600(), weights=w)
    hist = History(m, interval=100, max_snapshots=8)
    hist.run()
    assert len(hist._deltas) <= 8
    hist.goto(5000)
    m2 = Machine()
    m2.load(lstm1_600x600(), weights=w)
    m2.step(5000)
    same_state(m, m2)


# MMCs that stream while earlier ones drain (spec/timing.md 6): three into the same
# accumulator rows, then an ACT that waits for the last; the drain ring is in play from
# the second MMC's issue to the third's completion.
OVERLAP = program(I("RW", repeat=2, tile=0), I("RHM", host=0, ub=0, length=30),
                  I("MMC", "SO", ub=0, acc=0, length=10), I("MMC", ub=10, acc=0, length=10),
                  I("MMC", "S", ub=20, acc=0, length=10), I("ACT", acc=0, ub=100, length=10),
                  I("HLT"))


def test_history_exact_across_overlapping_drains():
    h, w = data()
    m = Machine()
    m.load(OVERLAP, host=h, weights=w)
    hist = History(m, interval=250, max_snapshots=6)
    assert hist.run().status == "halted"
    end = m.cycle
    # MMC 2 issues when MMC 1's last vector is in, MMC 3 when MMC 2's is: both while
    # MMC 1 still drains
    last_in1, last_in2 = int(m.times[3, 0]), int(m.times[4, 0])
    assert last_in2 - last_in1 == 10 and int(m.times[2, 2]) > last_in2
    for target in (last_in2 + 1, last_in1 + 5, last_in2 + 300, int(m.times[2, 2]),
                   int(m.times[3, 2]) - 1, end - 1, 1700):
        hist.goto(target)
        same_state(m, fresh(target, OVERLAP))
    # forward from inside the drain reaches the same end
    hist.goto(last_in2 + 1)
    assert m.run().status == "halted" and m.cycle == end
    finished = fresh(0, OVERLAP)
    finished.run()
    same_state(m, finished)


def test_snapshot_and_step_instruction_across_a_drain():
    m = fresh(0, OVERLAP)
    m.run(breakpoints=[4])                         # MMC 3 about to issue: MMCs 1, 2 drain
    snap = m.snapshot()
    before = (m.cycle, m.counters(), m.pipeline(), m.acc.copy())
    assert m.pipeline()[1].index == 2 and "1 more MMC draining" in m.pipeline()[1].stall
    m.run()
    m.restore(snap)
    assert (m.cycle, m.counters(), m.pipeline()) == before[:3]
    assert np.array_equal(m.acc, before[3])
    # step_instruction runs MMC 3 to its completion, past MMC 1's and MMC 2's
    r = m.step_instruction()
    assert r.status == "paused" and m.cycle == m.finish_cycle(4) == int(m.times[4, 2])
    assert m.retired(2) and m.retired(3) and m.finish_cycle(2) < m.finish_cycle(3) < m.cycle
    m.run()
    done = fresh(0, OVERLAP)
    done.run()
    same_state(m, done)


def test_history_interval_must_be_positive():
    for interval in (0, -5):
        with pytest.raises(ValueError, match="interval must be >= 1"):
            History(fresh(0), interval=interval)



# ------------------------------------------------------------------ checkpoints as row deltas
def all_state(m: Machine) -> dict:
    """Every array the machine's state lives in, the Python-side fields, and the views."""
    out = {name: getattr(m, name).copy() for name in Machine._STATE_ARRAYS}
    out["python"] = (m.status, m.fault, m._at_break)
    return out


def assert_same_state(a: Machine, b: Machine):
    sa, sb = all_state(a), all_state(b)
    for name in Machine._STATE_ARRAYS:
        assert np.array_equal(sa[name], sb[name]), f"{name} differs at cycle {a.cycle}"
    assert sa["python"] == sb["python"]
    assert a.pipeline() == b.pipeline() and a.counters() == b.counters()


def test_checkpoint_keeps_only_written_rows():
    """The UB rows a checkpoint stores are the rows the program wrote (RHM 0..29, ACT
    100..129 and 200..229), not the 98,304 of the Unified Buffer."""
    m = fresh(0)
    hist = History(m, interval=50, max_snapshots=1000)
    assert hist.run().status == "halted"
    stored = set()
    for d in hist._deltas:
        stored |= set(d.rows["ub"].tolist())
        assert d.values["ub"].shape == (len(d.rows["ub"]), 256)
    assert stored == set(range(30)) | set(range(100, 130)) | set(range(200, 230))
    assert set().union(*(d.rows["host"].tolist() for d in hist._deltas)) <= set(range(30))


@pytest.mark.parametrize("seed", range(12))
def test_reverse_after_long_runs_equals_fresh_runs(seed):
    """Random programs (strides, repeats, convolutions, pooling, faults) on a small machine:
    checkpoints every few cycles, merged many times over; going back to any cycle, in any
    order, and forward again, gives exactly the state of a fresh run to that cycle: every
    memory, every state array, status and fault."""
    from test_pipeline_random import case, fresh as fresh_small

    prog, host, weights = case(seed)
    end_m = fresh_small(prog, host, weights)
    end_m.run()
    end = end_m.cycle
    m = fresh_small(prog, host, weights)
    hist = History(m, interval=max(1, end // 50), max_snapshots=5)
    hist.run()
    assert m.cycle == end and len(hist._deltas) <= 5

    def check(target):
        ref = fresh_small(prog, host, weights)
        ref.step(target)
        assert_same_state(m, ref)

    g = np.random.default_rng(seed)
    for target in [*g.integers(0, end + 1, 6), end, 0]:
        hist.goto(int(target))
        check(int(target))
    # forward in small steps from the past (recording on the way), then back again
    hist.goto(end // 3)
    while m.cycle < end and m.status not in ("halted", "fault"):
        hist.step(int(g.integers(1, max(2, end // 20))))
    for target in g.integers(0, end + 1, 4):
        hist.back(m.cycle - int(target))
        check(int(target))

"""The wavefront geometry of spec/timing.md 6.1 (tpuasm/machine/wavefront.py) against
hand-computed cells, and its agreement with the timing model's cycle claims."""
import numpy as np

from tpuasm.machine import Machine
from tpuasm.machine.wavefront import Stream, array_view, partial_sum, streams

from _machine_programs import I, program


def test_cells_by_hand():
    s = Stream(start=10, vectors=3, n=4)
    assert s.cells(9).max() == -1                      # nothing before the start
    assert s.cells(10)[0, 0] == 0 and (s.cells(10) >= 0).sum() == 1
    # cycle 12: vector 0 on the anti-diagonal k + n = 2, vector 1 on k + n = 1, 2 at (0, 0)
    want = np.array([[2, 1, 0, -1],
                     [1, 0, -1, -1],
                     [0, -1, -1, -1],
                     [-1, -1, -1, -1]])
    assert np.array_equal(s.cells(12), want)
    assert s.vector_at(12, 1, 1) == 0 and s.vector_at(12, 3, 3) is None
    assert s.enter_cycle(2, 3, 3) == 10 + 2 + 6
    # the last vector (2) leaves cell (3, 3) after cycle 18; its column-3 sum is added
    # into the accumulators in cycle 20, visible from 21 = last_in + 2N
    assert s.vector_at(18, 3, 3) == 2 and s.vector_at(19, 3, 3) is None
    assert s.accumulate_cycle(2, 3) == 20 and s.last_in == 13 and s.done == 21
    assert s.cells(21).max() == -1


def test_half_speed_vectors_stay_two_cycles_in_a_cell():
    s = Stream(start=0, vectors=2, n=2, rate=2)
    assert [s.vector_at(c, 1, 0) for c in range(7)] == [None, 0, 0, 1, 1, None, None]
    assert s.last_in == 4 and s.done == 8 and s.accumulate_cycle(1, 1) == 7


def test_partial_sum_moves_down():
    x = np.array([1, 2, 3])
    w = np.arange(9).reshape(3, 3)
    assert [partial_sum(x, w, k, 1) for k in range(3)] == [1, 1 + 8, 1 + 8 + 21]


def test_streams_match_the_machines_timeline():
    n = 16
    prog = program(I("RW", repeat=2, tile=0), I("MMC", "SO", ub=0, acc=0, length=5),
                   I("MMC", "S", ub=5, acc=0, length=3, repeat=1), I("MMC", ub=0, acc=8, length=4, repeat=2),
                   I("HLT"), array_size=n)
    g = np.random.default_rng(0)
    m = Machine.for_program(prog)
    m.load(prog, weights=g.integers(-128, 128, (2, n, n)).astype(np.int8))
    assert m.run().status == "halted"
    a, = streams(m, 1)
    b, = streams(m, 2)
    c0, c1 = streams(m, 3)
    # each stream starts where the timing model starts the MMC (or its tile switch) and
    # its last result is in the accumulators exactly at the MMC's finish
    assert a.start == m.times[1, 1] and a.done == m.finish_cycle(1)
    assert b.start == int(m.tl[6, 1]) and b.start >= a.last_in and b.done == m.finish_cycle(2)
    assert c0.start == b.last_in and c1.start == c0.last_in and c1.done == m.finish_cycle(3)
    assert streams(m, 0) == [] and streams(m, 4) == []
    # while stream b fills, the tail of a is still in the far cells
    view = array_view(m, b.start + 2)
    assert view.instruction[0, 0] == 2 and view.vector[0, 0] == 2
    far = a.cells(b.start + 2)
    assert np.array_equal(view.vector[far >= 0], far[far >= 0])
    assert (view.instruction[far >= 0] == 1).all()
    # no cell ever holds two vectors: the streams of consecutive MMCs are disjoint
    for cyc in range(a.start, c1.done + 1):
        occupied = sum((s.cells(cyc) >= 0).astype(int) for s in (a, b, c0, c1))
        assert occupied.max() <= 1

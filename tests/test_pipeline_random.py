"""Random programs on a small machine: the pipeline never raises, its counters always add
up, it agrees with the reference model (memories, fault kind and index), and its state at a
cycle does not depend on how the run was cut into steps (the basis of History)."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.binary import MachineShape, Program
from tpuasm.machine import History, Machine, Watch
from tpuasm.machine.reference import run_reference

from _machine_programs import I, cfg

N, UB, ACC, HOST, TILES = 16, 64, 32, 32, 6


def random_instruction(g):
    k = g.integers(0, 100)
    if k < 14:
        return I(str(g.choice(["RHM", "RHMA"])), host=int(g.integers(0, HOST)), ub=int(g.integers(0, UB)),
                 length=int(g.integers(1, 9)), repeat=int(g.integers(1, 3)))
    if k < 22:
        return I(str(g.choice(["WHM", "WHMA"])), ub=int(g.integers(0, UB)), host=int(g.integers(0, HOST)),
                 length=int(g.integers(1, 9)))
    if k < 40:
        return I("RW", tile=int(g.integers(0, TILES)), repeat=int(g.integers(1, 3)))
    if k < 62:
        flags = "".join(c for c, p in zip("SOUWHD", (0.7, 0.5, 0.2, 0.2, 0.15, 0.1))
                        if g.random() < p)
        if g.random() < 0.2:                    # a convolution window, a tap per iteration
            return I("MMC", flags + "C", repeat=int(g.integers(1, 5)),
                     ub=int(g.integers(0, UB)), acc=int(g.integers(0, ACC)),
                     height=int(g.integers(1, 4)), width=int(g.integers(1, 4)))
        return I("MMC", flags, repeat=int(g.integers(1, 3)), ub=int(g.integers(0, UB)),
                 acc=int(g.integers(0, ACC)), length=int(g.integers(1, 9)))
    if k < 72:
        return I("ACT", str(g.choice(["", "R", "Q", "T", "M", "RA"])), acc=int(g.integers(0, ACC)),
                 ub=int(g.integers(0, UB)), length=int(g.integers(1, 9)))
    if k < 78:                                  # any overlap: a hand-made binary may have one
        return I(str(g.choice(["VADD", "VMUL"])), str(g.choice(["", "U", "B", "L", "UB", "XZ", "BYZ", "XL"])),
                 repeat=int(g.integers(1, 3)), a=int(g.integers(0, UB)),
                 b=int(g.integers(0, UB)), c=int(g.integers(0, UB)),
                 length=int(g.integers(1, 9)))
    if k < 88:
        name = str(g.choice(["rep_ub_stride", "rep_acc_stride", "rep_host_stride",
                             "act_shift", "act_out", "conv_kw", "conv_stride", "pool_size",
                             "dma_ub_stride", "dma_host_stride", "vec_shift", "vec_mult_a",
                             "vec_zero_b"]))
        if name in ("act_shift", "act_out", "vec_shift", "vec_zero_b"):
            value = int(g.integers(0, 4))
        elif name in ("conv_kw", "conv_stride", "pool_size"):
            value = int(g.integers(1, 4))
        else:
            value = int(g.integers(-2, 6))
        return cfg(name, value)
    return [I("SYNC"), I("NOP", repeat=3), I("TAG", tag=7), I("WSYNC")][int(g.integers(0, 4))]


def case(seed):
    g = np.random.default_rng(seed)
    shape = MachineShape(array_size=N, ub_rows=UB, acc_rows=ACC, fifo_depth=1 + seed % 4)
    prog = Program([random_instruction(g) for _ in range(int(g.integers(3, 25)))] + [I("HLT")],
                   shape)
    host = g.integers(-128, 128, (HOST, N)).astype(np.int8)
    weights = g.integers(-128, 128, (TILES, N, N)).astype(np.int8)
    return prog, host, weights


def fresh(prog, host, weights):
    m = Machine.for_program(prog)
    m.load(prog, host=host, weights=weights)
    return m


def table3_ok(c):
    """Rows 1, 4, 5, 6 partition the cycles; rows 7 and 8 lie within the matrix stage's
    waits (issue to start: weight stall, shift, hazard), and between them cover its hazard
    wait (the part of busy_matrix that is none of rows 1, 4, 5)."""
    waits = c["busy_matrix"] - c["array_active_cycles"]
    hazard = waits - c["weight_stall_cycles"] - c["weight_shift_cycles"]
    return c["array_active_cycles"] + c["weight_stall_cycles"] + c["weight_shift_cycles"] + \
        c["non_matrix_cycles"] == c["cycles"] and hazard <= c["non_matrix_cycles"] and \
        c["raw_stall_cycles"] <= waits and c["input_stall_cycles"] <= waits and \
        hazard <= c["raw_stall_cycles"] + c["input_stall_cycles"]


@pytest.mark.parametrize("seed", range(100))
def test_random_program(seed):
    prog, host, weights = case(seed)
    m = fresh(prog, host, weights)
    r = m.run()
    assert r.status in ("halted", "fault")
    assert table3_ok(m.counters())
    ref = run_reference(prog, host, weights)
    assert (r.fault.kind if r.fault else None) == ref.fault_kind
    assert (r.fault.index if r.fault else None) == ref.fault_index
    assert np.array_equal(m.ub, ref.ub) and np.array_equal(m.acc, ref.acc)
    assert np.array_equal(m.host, ref.host)

    # the same run cut into random steps ends in the same state, counters add up throughout
    g = np.random.default_rng(seed + 1000)
    s = fresh(prog, host, weights)
    while s.status not in ("halted", "fault"):
        s.step(int(g.integers(1, max(2, m.cycle // 5))))
        assert table3_ok(s.counters())
    assert s.cycle == m.cycle and s.counters() == m.counters()
    assert np.array_equal(s.ub, m.ub) and np.array_equal(s.acc, m.acc)

    # history: any earlier cycle equals a fresh run stepped to it
    h_m = fresh(prog, host, weights)
    hist = History(h_m, interval=max(1, m.cycle // 3))
    hist.run()
    for target in g.integers(0, m.cycle + 1, 3):
        hist.goto(int(target))
        ref_m = fresh(prog, host, weights)
        ref_m.step(int(target))
        assert h_m.cycle == ref_m.cycle
        assert np.array_equal(h_m.ub, ref_m.ub) and np.array_equal(h_m.acc, ref_m.acc)
        assert h_m.counters() == ref_m.counters() and h_m.pipeline() == ref_m.pipeline()
        assert h_m.fifo() == ref_m.fifo() and h_m.shadow() == ref_m.shadow()


@pytest.mark.parametrize("seed", range(10))
def test_random_watchpoints_match_finish_cycles(seed):
    prog, host, weights = case(seed)
    m = fresh(prog, host, weights)
    hits = []
    while True:
        r = m.run(watch=[Watch("ub", 0, UB), Watch("acc", 0, ACC), Watch("host", 0, HOST)])
        if r.status != "watchpoint":
            break
        hits.append((r.index, r.cycle))
        assert m.finish_cycle(r.index) == r.cycle
    writers = [i for i, ins in enumerate(prog.instructions)
               if ins.key in ("RHM", "RHMA", "WHM", "WHMA", "MMC", "ACT", "VADD", "VMUL")
               and m.retired(i)]
    # one stop per cycle: writers finishing in the same cycle report the first of them
    assert {m.finish_cycle(i) for i in writers} == {c for _, c in hits}
    assert {i for i, _ in hits} <= set(writers)

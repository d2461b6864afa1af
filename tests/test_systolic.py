"""The register-level systolic model (tpuasm/machine/systolic.py) against the emulator on
random MatrixMultiply programs: bit-identical accumulators, the per-cycle wavefront of
wavefront.py (the debugger's array view), and the timing model's finish cycles.

Hypothesis draws >= 1,000 programs per run (RW, MMC with every flag S C O U W H D,
repeats, strides and convolution taps, CFG of the registers MMC reads) on arrays of
2 x 2 to 16 x 16 with FIFOs of 1 to 4 tiles."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tpuasm.binary import MachineShape, Program
from tpuasm.machine import Machine
from tpuasm.machine.systolic import SystolicError, replay
from tpuasm.machine.wavefront import streams

from _machine_programs import I, cfg

UB, ACC, TILES = 48, 24, 5


@st.composite
def mmc_programs(draw):
    n = draw(st.sampled_from([2, 3, 4, 8, 16]))
    depth = draw(st.integers(1, 4))
    body = []
    pending = active = 0                 # tiles fetched not switched in; active width
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["rw", "rw", "mmc", "mmc", "mmc", "cfg"]))
        if kind == "rw":
            reps = draw(st.integers(1, 2))
            if pending + reps > depth + 1:
                continue
            body.append(I("RW", tile=draw(st.integers(0, TILES - reps)), repeat=reps))
            pending += reps
        elif kind == "cfg":
            name = draw(st.sampled_from(["rep_ub_stride", "rep_acc_stride", "conv_kw",
                                         "conv_stride", "conv_pitch"]))
            lo, hi = {"rep_ub_stride": (0, 4), "rep_acc_stride": (0, 4), "conv_kw": (1, 3),
                      "conv_stride": (1, 2), "conv_pitch": (0, 5)}[name]
            body.append(cfg(name, draw(st.integers(lo, hi))))
        else:
            flags = "".join(c for c in "SOUWHD" if draw(st.booleans()))
            per = 2 if "D" in flags else 1
            reps = draw(st.integers(1, 3))
            if "S" not in flags and active != per:
                flags += "S"                    # nothing (or the other width) resident
            if "S" in flags:
                reps = min(reps, (depth + 1) // per)
                need = reps * per
                if pending < need:              # fetch what the switches need first
                    add = need - pending
                    body.append(I("RW", tile=draw(st.integers(0, TILES - add)), repeat=add))
                    pending += add
                pending -= need
                active = per
            if draw(st.integers(0, 4)) == 0:
                body.append(I("MMC", flags + "C", repeat=reps, ub=draw(st.integers(0, 8)),
                              acc=draw(st.integers(0, 8)), height=draw(st.integers(1, 3)),
                              width=draw(st.integers(1, 3))))
            else:
                body.append(I("MMC", flags, repeat=reps, ub=draw(st.integers(0, 16)),
                              acc=draw(st.integers(0, 10)), length=draw(st.integers(1, 5))))
    shape = MachineShape(array_size=n, ub_rows=UB, acc_rows=ACC, fifo_depth=depth)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return Program(body + [I("HLT")], shape), seed


def check(prog, seed):
    n = prog.shape.array_size
    g = np.random.default_rng(seed)
    weights = g.integers(-128, 128, (TILES, n, n)).astype(np.int8)
    ub0 = g.integers(0, 256, (UB, n)).astype(np.uint8)
    acc0 = g.integers(-2 ** 31, 2 ** 31, (ACC, n)).astype(np.int32)
    m = Machine.for_program(prog)
    m.load(prog, weights=weights)
    m.ub[:] = ub0
    m.acc[:] = acc0
    m.run()                              # halted, or a fault (an address out of range)
    r = replay(m, ub0, acc0)
    # 1. the array computes what the emulator's kernels computed, bit for bit
    assert np.array_equal(r.acc, m.acc)
    # 2. the timing model's claim: each MMC's last sum is added in the cycle before its finish
    mmcs = {s[0] for s in r.streams}
    for i in mmcs:
        assert r.accumulated[i] + 1 == m.finish_cycle(i), i
    # 3. every cell in every cycle holds the vector wavefront.py says it holds
    if r.streams:
        c0 = min(s[2].start for s in r.streams)
        c1 = max(s[2].done for s in r.streams)
        for c in range(c0, c1 + 1):
            want = np.full((n, n), -1, np.int64)
            for _mmc, _it, s, g0 in r.streams:
                v = s.cells(c)
                want[v >= 0] = g0 + v[v >= 0]
            got = r.cells.get(c, np.full((n, n), -1))
            assert np.array_equal(got, want), c
        assert set(r.cells) <= set(range(c0, c1 + 1))
    # and the streams are the ones wavefront.streams reports for each MMC
    for i in mmcs:
        assert [s[2] for s in r.streams if s[0] == i] == streams(m, i)
    return len(r.streams)


@settings(max_examples=1000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mmc_programs())
def test_register_level_array_matches_the_emulator(case):
    check(*case)


def test_a_hand_made_sixteen_bit_convolution_and_a_switch_mid_drain():
    # D and H together (four passes per vector), a switch while the previous stream drains
    n = 4
    prog = Program([I("RW", repeat=4, tile=0), cfg("conv_kw", 2), cfg("rep_ub_stride", 3),
                    I("MMC", "SOHD", ub=0, acc=0, length=3),
                    I("MMC", "SDCW", repeat=1, ub=2, acc=4, height=2, width=2),
                    I("MMC", "HDU", ub=6, acc=8, length=2, repeat=2), I("HLT")],
                   MachineShape(array_size=n, ub_rows=UB, acc_rows=ACC, fifo_depth=4))
    assert check(prog, 5) == 4


def test_refuses_a_large_array():
    m = Machine()                                        # 256 x 256
    with pytest.raises(SystolicError, match=r"at most 16 x 16 cells .* 256 x 256"):
        replay(m, m.ub, m.acc)

"""Pipeline timing against hand-computed cycle counts (formulas: spec/timing.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tpuasm.machine import Machine, MachineConfig

from _machine_programs import I, cfg, program

FETCH = 1350            # ceil(65536 / (34e9 / 700e6))
SHIFT = 256
DRAIN = 512             # 2N
ACT_LAT = 16


def host_cycles(rows):
    return 700 + math.ceil(rows * 256 / (10 * 2 ** 30 / 700e6))


def _host():
    return np.random.default_rng(1).integers(-128, 128, (256, 256)).astype(np.int8)


def _weights():
    return np.random.default_rng(2).integers(-128, 128, (8, 256, 256)).astype(np.int8)


def run(prog, **cfg_over):
    m = Machine(MachineConfig(**cfg_over))
    m.load(prog, host=_host(), weights=_weights())
    r = m.run()
    assert r.status == "halted", r
    return m


def times(m, i):
    return tuple(int(x) for x in m.times[i])


def breakdown_ok(c):
    return (c["array_active_cycles"] + c["weight_stall_cycles"] + c["weight_shift_cycles"]
            + c["non_matrix_cycles"]) == c["cycles"]


def test_constants():
    cfg_ = MachineConfig()
    assert cfg_.fetch_cycles == FETCH
    assert cfg_.shift == SHIFT and cfg_.mmc_latency == DRAIN
    assert host_cycles(4) == 767


def test_single_rhm():
    m = run(program(I("RHM", host=0, ub=0, length=4), I("HLT")))
    d = host_cycles(4)
    assert times(m, 0) == (0, 0, d)
    assert m.cycle == d + 1                      # HLT issues when the RHM is done, +1
    c = m.counters()
    assert c["busy_input"] == d and c["non_matrix_cycles"] == d + 1 and breakdown_ok(c)
    assert np.array_equal(m.ub[:4], m.host[:4])


def test_rw_then_mmc_fetch_and_shift_visible():
    m = run(program(I("RW", tile=0), I("MMC", "S", ub=0, acc=0, length=10), I("HLT")))
    assert times(m, 0) == (0, 0, 1)
    assert times(m, 1) == (1, FETCH + SHIFT, FETCH + SHIFT + 10 + DRAIN)
    assert m.cycle == FETCH + SHIFT + 10 + DRAIN + 1
    c = m.counters()
    assert c["weight_stall_cycles"] == FETCH - 1         # cycles 1..1349
    assert c["weight_shift_cycles"] == SHIFT
    assert c["array_active_cycles"] == 10
    assert c["useful_macs"] == 10 * 256 * 256
    assert breakdown_ok(c)


def test_second_shift_hidden_behind_long_multiply():
    m = run(program(I("RW", repeat=2, tile=0), I("MMC", "S", ub=0, acc=0, length=2000),
                    I("MMC", "S", ub=0, acc=0, length=10), I("HLT")))
    first_begin = FETCH + SHIFT
    fin1 = first_begin + 2000 + DRAIN
    assert times(m, 1) == (1, first_begin, fin1)
    # tile 1 arrived at 2*FETCH and shifted by 2*FETCH + SHIFT < fin1: no stall at all
    assert times(m, 2) == (fin1, fin1, fin1 + 10 + DRAIN)
    c = m.counters()
    assert c["weight_stall_cycles"] == FETCH - 1 and c["weight_shift_cycles"] == SHIFT
    assert c["array_active_cycles"] == 2010 and breakdown_ok(c)


def test_fifo_full_rw_waits_in_input_stage():
    m = run(program(I("RW", repeat=5, tile=0), I("RHM", host=0, ub=0, length=1), I("HLT")))
    # tiles 0-3 handed at cycles 0-3; tile 4 waits until tile 0 starts shifting (1350)
    assert times(m, 0) == (0, 0, FETCH + 1)
    assert times(m, 1)[0] == FETCH + 1                 # the RHM waited for the input stage
    assert int(m.tl[3, 4]) == 5 * FETCH               # tile 4 arrives after 5 fetches
    assert m.cycle == 5 * FETCH + 1                    # HLT waits for the last fetch


def test_raw_between_act_and_next_mmc():
    m = run(program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=10),
                    I("ACT", acc=0, ub=100, length=10),
                    I("MMC", "O", ub=100, acc=20, length=10), I("HLT")))
    fin1 = FETCH + SHIFT + 10 + DRAIN
    act_fin = fin1 + ACT_LAT + 10
    assert times(m, 2) == (2, fin1, act_fin)             # ACT waits on the accumulators
    assert times(m, 3) == (fin1, act_fin, act_fin + 10 + DRAIN)   # MMC waits on the UB rows
    c = m.counters()
    assert c["raw_stall_cycles"] == act_fin - fin1 and c["input_stall_cycles"] == 0
    assert breakdown_ok(c)
    # the values follow the sequential semantics
    x = m.ub[:10].view(np.int8).astype(np.int64)
    w = m.weights[0].view(np.int8).astype(np.int64)
    y = np.clip(x @ w, -128, 127)
    assert np.array_equal(m.ub[100:110].view(np.int8), y)
    assert np.array_equal(m.acc[20:30], y @ w)


def test_war_rhm_waits_for_mmc_reading_the_rows():
    m = run(program(I("RW", tile=0), I("MMC", "S", ub=0, acc=0, length=10),
                    I("RHM", host=0, ub=0, length=10), I("HLT")))
    fin1 = FETCH + SHIFT + 10 + DRAIN
    assert times(m, 2) == (2, fin1, fin1 + host_cycles(10))
    assert not m.acc[:10].any()                        # the MMC read the old (zero) rows
    assert np.array_equal(m.ub[:10], m.host[:10])


def test_input_stall_counted_for_rhm_producer():
    m = run(program(I("RW", tile=0), I("RHM", host=0, ub=0, length=200),
                    I("MMC", "S", ub=0, acc=0, length=200), I("HLT")))
    rhm_fin = 1 + host_cycles(200)                      # the RHM issues after the RW's cycle
    assert times(m, 1) == (1, 1, rhm_fin)
    assert times(m, 2)[1] == rhm_fin
    c = m.counters()
    assert c["input_stall_cycles"] == rhm_fin - (FETCH + SHIFT) == c["raw_stall_cycles"]


def test_sync_drains_and_tag_issues_after():
    m = run(program(I("RHM", host=0, ub=0, length=4), I("SYNC"), I("TAG", tag=5), I("HLT")))
    d = host_cycles(4)
    assert times(m, 1) == (d, d, d + 1)
    assert [(e.cycle, e.kind, e.value) for e in m.events] == [(d + 1, "tag", 5)]
    assert m.cycle == d + 3


def test_wsync_waits_for_weights_sync_does_not():
    m = run(program(I("RW", tile=0), I("SYNC"), I("WSYNC"), I("HLT")))
    assert times(m, 1) == (1, 1, 2)                    # RW finished at 1: SYNC goes at once
    assert times(m, 2) == (FETCH, FETCH, FETCH + 1)
    assert m.cycle == FETCH + 2


def test_hlt_waits_for_fetches_and_nop_repeat():
    m = run(program(I("NOP", repeat=7), I("RW", tile=0), I("HLT")))
    assert times(m, 0) == (0, 0, 7) and times(m, 1) == (7, 7, 8)
    assert m.cycle == 7 + FETCH + 1


def test_stage_busy_front_end_stalls_in_order():
    # two ACTs share the activate stage; the CFG behind the second must wait for its issue
    m = run(program(I("ACT", acc=0, ub=0, length=100), I("ACT", acc=200, ub=200, length=10),
                    cfg("act_shift", 1), I("HLT")))
    a1 = ACT_LAT + 100
    assert times(m, 1) == (a1, a1, a1 + ACT_LAT + 10)
    assert times(m, 2)[0] == a1 + 1


def test_sixteen_bit_rates():
    m = run(program(I("RW", repeat=2, tile=0), I("MMC", "SHD", ub=0, acc=0, length=10),
                    I("HLT")))
    begin = 2 * FETCH + SHIFT                          # the high tile shifts after arriving
    assert times(m, 1) == (1, begin, begin + 40 + DRAIN)
    assert m.counters()["array_active_cycles"] == 40


def test_counters_exact_while_stepping():
    prog = program(I("RW", repeat=2, tile=0), I("RHM", host=0, ub=0, length=30),
                   I("MMC", "S", ub=0, acc=0, length=30), I("ACT", acc=0, ub=100, length=30),
                   I("MMC", "S", ub=100, acc=40, length=30), I("WHM", ub=100, host=0, length=30),
                   I("HLT"))
    m = Machine()
    m.load(prog, host=_host(), weights=_weights())
    last = None
    while True:
        r = m.step(97)
        c = m.counters()
        assert breakdown_ok(c)
        if last is not None:
            for k in ("array_active_cycles", "weight_stall_cycles", "weight_shift_cycles",
                      "non_matrix_cycles", "raw_stall_cycles", "busy_matrix"):
                assert c[k] >= last[k]
            assert c["cycles"] - last["cycles"] in (97, 0) or r.status == "halted"
        last = c
        if r.status != "paused":
            break
    assert r.status == "halted"
    full = run(prog).counters()
    assert last == full


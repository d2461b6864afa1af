"""Pipeline timing against hand-computed cycle counts (formulas: spec/timing.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tpuasm.machine import Machine, MachineConfig, Watch
from tpuasm.machine.reference import run_reference

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
    first_begin = FETCH + SHIFT                  # 1606
    last_in1 = first_begin + 2000                # 3606: the matrix stage is free again
    fin1 = last_in1 + DRAIN                      # 4118
    assert times(m, 1) == (1, first_begin, fin1)
    # tile 1 arrived at 2*FETCH = 2700 and shifted by 2956 < 3606: no stall at all; the
    # second MMC streams right behind the first one's last vector, during its drain
    assert times(m, 2) == (last_in1, last_in1, last_in1 + 10 + DRAIN)     # (3606, 3606, 4128)
    assert m.cycle == last_in1 + 10 + DRAIN + 1
    c = m.counters()
    assert c["weight_stall_cycles"] == FETCH - 1 and c["weight_shift_cycles"] == SHIFT
    assert c["array_active_cycles"] == 2010 and breakdown_ok(c)
    # busy matrix: issue to last vector in, 1..3606 then 3606..3616
    assert c["busy_matrix"] == (last_in1 - 1) + 10


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
    last_in1 = FETCH + SHIFT + 10                        # 1616
    fin1 = last_in1 + DRAIN                              # 2128
    act_fin = fin1 + ACT_LAT + 10                        # 2154
    assert times(m, 2) == (2, fin1, act_fin)             # ACT waits on the accumulators
    # the second MMC enters the matrix stage when the first one's last vector is in, and
    # waits there for the UB rows the ACT writes
    assert times(m, 3) == (last_in1, act_fin, act_fin + 10 + DRAIN)
    c = m.counters()
    assert c["raw_stall_cycles"] == act_fin - last_in1 and c["input_stall_cycles"] == 0
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



# ------------------------------------------------------------------ MMCs pipelined through
# the array: the matrix stage is free once the last vector is in; the drain (2N) overlaps
# the next MMC and completion (effects) still comes 2N after the last vector (timing.md 6)

def stages(m):
    return {s.name: s for s in m.pipeline()}


def test_back_to_back_mmcs_on_a_resident_tile_take_b1_plus_b2_plus_drain():
    B1, B2 = 100, 50
    prog = program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=B1),
                   I("MMC", "O", ub=100, acc=100, length=B2), I("HLT"))
    m = run(prog)
    first_in = FETCH + SHIFT                     # 1606: tile 0 fetched (1350) and shifted
    last_in1 = first_in + B1                     # 1706
    assert times(m, 1) == (1, first_in, last_in1 + DRAIN)                 # (1, 1606, 2218)
    # no S, no hazard: the second MMC issues when the first one's last vector is in
    assert times(m, 2) == (last_in1, last_in1, last_in1 + B2 + DRAIN)     # (1706, 1706, 2268)
    # matrix time from the first vector in to the last result out: B1 + B2 + 2N = 662,
    # not B1 + 2N + B2 + 2N = 1174
    assert m.finish_cycle(2) - first_in == B1 + B2 + DRAIN
    assert m.cycle == first_in + B1 + B2 + DRAIN + 1                      # 2269
    c = m.counters()
    assert c["array_active_cycles"] == B1 + B2
    assert c["weight_stall_cycles"] == FETCH - 1 and c["weight_shift_cycles"] == SHIFT
    # cycle 0, the drain after the last vector (1756..2267) and HLT's cycle
    assert c["non_matrix_cycles"] == 1 + DRAIN + 1 and breakdown_ok(c)
    assert c["busy_matrix"] == (last_in1 - 1) + B2                        # 1..1706, 1706..1756
    assert c["useful_macs"] == (B1 + B2) * 256 * 256


def test_overlapping_drain_counts_each_cycle_once():
    prog = program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=100),
                   I("MMC", "O", ub=100, acc=100, length=50), I("HLT"))
    m = Machine()
    m.load(prog, host=_host(), weights=_weights())
    parts = ("array_active_cycles", "weight_stall_cycles", "weight_shift_cycles",
             "non_matrix_cycles")
    before = m.counters()
    active_cycles = []
    while m.step(1).status == "paused":
        now = m.counters()
        grew = [k for k in parts if now[k] != before[k]]
        assert len(grew) == 1 and now[grew[0]] == before[grew[0]] + 1, (m.cycle, grew)
        if grew[0] == "array_active_cycles":
            active_cycles.append(m.cycle - 1)
        before = now
    # a vector enters in cycles 1606..1755: the first MMC's, then the second's, no gap
    assert active_cycles == list(range(FETCH + SHIFT, FETCH + SHIFT + 150))
    assert m.counters() == run(prog).counters()


def test_pipeline_shows_the_streaming_mmc_then_the_oldest_draining():
    prog = program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=100),
                   I("MMC", "O", ub=100, acc=100, length=50), I("HLT"))
    m = Machine()
    m.load(prog, host=_host(), weights=_weights())
    m.step(1710)                                 # MMC 2 streams 1706..1755
    mat = stages(m)["matrix"]
    assert (mat.index, mat.progress, mat.total, mat.unit, mat.stall) == (2, 4, 50, "rows", None)
    m.step(90)                                   # 1800: both drain; MMC 1 finishes at 2218
    mat = stages(m)["matrix"]
    assert (mat.index, mat.progress, mat.total, mat.unit) == (1, 1800 - 1706, DRAIN, "cycles")
    assert mat.stall == ("draining the array into the accumulators (418 cycles left; "
                         "1 more MMC draining behind it)")
    assert stages(m)["front"].stall == "draining the pipeline"      # HLT waits for both
    assert m.finish_cycle(1) == -1 and m.finish_cycle(2) == -1
    m.step(430)                                  # 2230: MMC 1 retired, MMC 2 drains to 2268
    mat = stages(m)["matrix"]
    assert (mat.index, mat.progress, mat.total) == (2, 2230 - 1756, DRAIN)
    assert mat.stall == "draining the array into the accumulators (38 cycles left)"
    assert m.finish_cycle(1) == 2218 and m.finish_cycle(2) == -1
    m.step(38)
    assert stages(m)["matrix"].index is None and m.finish_cycle(2) == 2268


def test_act_reading_a_draining_mmc_waits_for_that_mmc():
    prog = program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=10),
                   I("MMC", "O", ub=10, acc=20, length=10),
                   I("ACT", acc=0, ub=100, length=10), I("HLT"))
    m = run(prog)
    last_in1 = FETCH + SHIFT + 10                # 1616
    fin1 = last_in1 + DRAIN                      # 2128
    assert times(m, 2) == (last_in1, last_in1, last_in1 + 10 + DRAIN)    # (1616, 1616, 2138)
    # the ACT issues behind MMC 2 and waits for MMC 1's completion (it reads acc 0..9),
    # not for MMC 2's (acc 20..29)
    assert times(m, 3) == (last_in1 + 1, fin1, fin1 + ACT_LAT + 10)      # (1617, 2128, 2154)
    assert m.cycle == fin1 + ACT_LAT + 10 + 1
    # while it waits, the blocker is a draining MMC: the stall text still finds it
    w = Machine()
    w.load(prog, host=_host(), weights=_weights())
    w.step(1700)
    assert stages(w)["activate"].stall.startswith("RAW: accumulator rows 0-9 written by MMC (#1")


def test_act_reading_a_draining_mmc_is_a_hazard_in_strict_mode():
    prog = program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=10),
                   I("MMC", "O", ub=10, acc=20, length=10),
                   I("ACT", acc=0, ub=100, length=10), I("HLT"))
    m = Machine(MachineConfig(hazards="error"))
    m.load(prog, host=_host(), weights=_weights())
    r = m.run()
    assert r.status == "fault" and r.fault.kind == "hazard" and r.fault.index == 3
    assert "RAW hazard on accumulator rows 0..9 with instruction 1" in r.fault.message
    # every earlier instruction completes: MMC 2 last, at 1616 + 10 + 512 = 2138
    assert r.cycle == FETCH + SHIFT + 20 + DRAIN and m.retired(1) and m.retired(2)


def _same_accumulators(sync=()):
    """Three MMCs into accumulator rows 0..19: overwrite (tile 0), accumulate (tile 0),
    accumulate after a switch to tile 1; then an ACT of the sum.  `sync`: what to put
    between the RHM and the MMCs and between the MMCs and the ACT."""
    return program(I("RW", repeat=2, tile=0), I("RHM", host=0, ub=0, length=60), *sync,
                   I("MMC", "SO", ub=0, acc=0, length=20), I("MMC", ub=20, acc=0, length=20),
                   I("MMC", "S", ub=40, acc=0, length=20), *sync,
                   I("ACT", "R", acc=0, ub=200, length=20), I("HLT"))


def test_mmc_after_mmc_into_the_same_accumulators_does_not_stall():
    prog = _same_accumulators()
    m = run(prog)
    rhm_fin = 2 + host_cycles(60)                # the RHM issues at 2, behind the RW: 1704
    # MMC 1 waits for its UB rows (tile 0 was ready at 1606)
    assert times(m, 2) == (3, rhm_fin, rhm_fin + 20 + DRAIN)             # (3, 1704, 2236)
    # MMC 2 adds into the rows MMC 1 is still draining into: no wait (the array delivers
    # the partial sums in order), it streams right behind MMC 1's last vector
    last_in1 = rhm_fin + 20                      # 1724
    assert times(m, 3) == (last_in1, last_in1, last_in1 + 20 + DRAIN)    # (1724, 1724, 2256)
    # MMC 3 switches to tile 1: fetched 1350..2700, shifted 2700..2956
    tile1 = 2 * FETCH + SHIFT
    assert times(m, 4) == (last_in1 + 20, tile1, tile1 + 20 + DRAIN)     # (1744, 2956, 3488)
    # the ACT reads the sum: it waits for the last of the three
    assert times(m, 5) == (last_in1 + 21, tile1 + 20 + DRAIN, tile1 + 20 + DRAIN + ACT_LAT + 20)
    ref = run_reference(prog, _host(), _weights())
    assert np.array_equal(m.acc, ref.acc) and np.array_equal(m.ub, ref.ub)
    x = m.host[:60].view(np.int8).astype(np.int64)
    w = _weights().astype(np.int64)
    assert np.array_equal(m.acc[:20], x[:20] @ w[0] + x[20:40] @ w[0] + x[40:60] @ w[1])


def test_same_accumulator_writes_retire_in_issue_order():
    m = Machine()
    m.load(_same_accumulators(), host=_host(), weights=_weights())
    stops = []
    while (r := m.run(watch=[Watch("acc", 0, 1)])).status == "watchpoint":
        stops.append((r.index, r.cycle))
    assert r.status == "halted"
    assert stops == [(2, 2236), (3, 2256), (4, 3488)]      # the finish cycles above


def test_mmc_after_mmc_is_no_hazard_in_strict_mode():
    # the real dependencies (RHM -> MMC, MMC -> ACT) need their SYNCs; MMC -> MMC does not
    m = Machine(MachineConfig(hazards="error"))
    m.load(_same_accumulators([I("SYNC")]), host=_host(), weights=_weights())
    assert m.run().status == "halted"
    # the SYNC issues when the RHM is done (1704) and takes a cycle: MMC 1 issues and
    # streams at 1705, MMC 2 right behind it at 1725, while MMC 1 drains
    assert times(m, 3) == (1705, 1705, 1725 + DRAIN)
    assert times(m, 4) == (1725, 1725, 1745 + DRAIN)
    assert np.array_equal(m.acc, run_reference(_same_accumulators(), _host(), _weights()).acc)


def test_drain_ring_holds_every_draining_mmc():
    # N = 16 with a 3-cycle drain: one-vector MMCs issue every cycle, so while MMC k
    # issues, MMCs k-3, k-2 and k-1 are all still draining (the ring's full size, 3)
    n, lat = 16, 3
    mmcs = [I("MMC", "SO", ub=0, acc=0, length=1)] + \
        [I("MMC", ub=k, acc=k % 3, length=1) for k in range(1, 10)]
    prog = program(I("RHM", host=0, ub=0, length=10), I("RW", tile=0), *mmcs,
                   I("ACT", acc=0, ub=32, length=3), I("HLT"), array_size=n)
    g = np.random.default_rng(11)
    host = g.integers(-128, 128, (16, n)).astype(np.int8)
    weights = g.integers(-128, 128, (1, n, n)).astype(np.int8)
    m = Machine.for_program(prog, mmc_latency_cycles=lat)
    m.load(prog, host=host, weights=weights)
    assert m.sg.shape[0] - 5 == lat              # ROW_DRAIN = 5: rows 0..3 stages, 4 front
    # RHM 0..711 (700 + ceil(10 * 16 / 15.34)); the RW waits for the input stage: 711,
    # fetch 711..717, shift 717..733; MMC k (index k + 2) streams at 733 + k
    m.step(740)                                  # MMCs 4, 5, 6 drain (MMC 7 issues at 740)
    mat = stages(m)["matrix"]
    assert mat.index == 6 and (mat.progress, mat.total) == (740 - 738, lat)
    assert mat.stall.endswith("(1 cycle left; 2 more MMCs draining behind it)")
    assert m.run().status == "halted"
    assert times(m, 2) == (712, 733, 733 + 1 + lat)      # issued behind the RW, waits for tile 0
    for k in range(1, 10):
        assert times(m, k + 2) == (733 + k, 733 + k, 733 + k + 1 + lat)
    assert times(m, 12) == (743, 746, 746 + ACT_LAT + 3)
    ref = run_reference(prog, host, weights)
    assert np.array_equal(m.acc, ref.acc) and np.array_equal(m.ub, ref.ub)

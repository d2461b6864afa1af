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


def _fifo_full_program():
    # RW of 5 tiles (FIFO 4 + shadow), an RHM, a switch to tile 0, then RW of tile 5
    return program(I("RW", repeat=5, tile=0), I("RHM", host=0, ub=0, length=1),
                   I("MMC", "S", ub=0, acc=0, length=1), I("RW", tile=5), I("HLT"))


def test_fifo_full_rw_waits_in_the_weight_port_not_the_input_stage():
    m = run(_fifo_full_program())
    # tiles 0-3 handed at cycles 0-3; tile 4 waits until tile 0 starts shifting (1350)
    assert times(m, 0) == (0, 0, FETCH + 1)
    # the RHM does not wait for it: Read_Weights has its own port (spec/timing.md 5)
    assert times(m, 1) == (1, 1, 1 + host_cycles(1))
    # the MMC issues behind the RHM; tile 0 shifts 1350..1606
    assert times(m, 2) == (2, FETCH + SHIFT, FETCH + SHIFT + 1 + DRAIN)
    # the second RW waits for the port (the first one's last hand-off + 1), then for FIFO
    # room: tile 5 may go once tile 1 begins shifting, at max(arrival 2700, switch 1606)
    assert times(m, 3) == (FETCH + 1, 2 * FETCH, 2 * FETCH + 1)
    assert int(m.tl[3, 4]) == 5 * FETCH                # tile 4 arrives after 5 fetches
    assert m.cycle == 6 * FETCH + 1                    # HLT waits for the last fetch


def test_pipeline_shows_the_rw_in_the_weight_port():
    m = Machine()
    m.load(_fifo_full_program(), host=_host(), weights=_weights())
    m.step(100)
    st = stages(m)
    w = st["weights"]
    assert (w.index, w.progress, w.total, w.unit) == (0, 4, 5, "tiles")
    assert w.stall.startswith("Weight FIFO full (4 tiles): tile 4 waits")
    assert st["input"].index == 1 and st["input"].stall is None
    assert st["front"].index == 3 and st["front"].stall == "waiting for the weight port"
    m.step(FETCH + 2 - 100)             # the first RW handed its last tile over at 1350
    assert stages(m)["weights"].index == 3     # the second one holds the port, waiting
    m.step(2 * FETCH - m.cycle + 1)
    assert stages(m)["weights"].index is None
    assert stages(m)["weights"].text.startswith("fetch tile")


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
    # counted from the MMC's issue (cycle 2), under its weight stall too; its only producer
    # is the host read, so no RAW stall (spec/timing.md 8)
    assert c["input_stall_cycles"] == rhm_fin - 2 and c["raw_stall_cycles"] == 0
    assert c["weight_stall_cycles"] == FETCH - 2 and c["weight_shift_cycles"] == SHIFT
    assert c["busy_matrix"] == rhm_fin + 200 - 2           # issue to last vector in


def test_raw_and_input_stalls_overlap_when_both_producers_are_pending():
    # MMC 4 reads UB rows 100-209: rows 100-109 written by the ACT (on the chip), rows
    # 200-209 by the RHM (from the host); the two finish at different times
    m = run(program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=10),
                    I("ACT", acc=0, ub=100, length=10),
                    I("RHM", host=0, ub=200, length=200),
                    I("MMC", "O", ub=100, acc=20, length=110), I("HLT")))
    last_in1 = FETCH + SHIFT + 10                        # 1616: MMC 4 issues then
    act_fin = last_in1 + DRAIN + ACT_LAT + 10            # 2154
    rhm_fin = 3 + host_cycles(200)                       # 4041
    assert times(m, 2)[2] == act_fin and times(m, 3) == (3, 3, rhm_fin)
    assert times(m, 4) == (last_in1, rhm_fin, rhm_fin + 110 + DRAIN)
    c = m.counters()
    assert c["raw_stall_cycles"] == act_fin - last_in1 == 538          # [1616, 2154)
    assert c["input_stall_cycles"] == rhm_fin - last_in1 == 2425       # [1616, 4041)
    # the 538 cycles both are pending count in both rows: together they exceed the wait
    wait = rhm_fin - last_in1
    assert c["raw_stall_cycles"] + c["input_stall_cycles"] == wait + 538
    assert c["array_active_cycles"] == 120
    assert c["weight_stall_cycles"] == FETCH - 1 and c["weight_shift_cycles"] == SHIFT
    assert c["non_matrix_cycles"] == c["cycles"] - 120 - (FETCH - 1) - SHIFT
    assert c["busy_matrix"] == (last_in1 - 1) + wait + 110
    assert breakdown_ok(c)


def test_raw_stall_under_the_weight_fetch_is_counted_weight_stall_unchanged():
    # weight-bound: MMC 4 waits for tile 1 (fetched after tile 0, 1350-2700) and for the
    # ACT's rows (finished at 2154, long before its tile is ready): a RAW stall the fetch hides
    m = run(program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=10),
                    I("ACT", acc=0, ub=100, length=10), I("RW", tile=1),
                    I("MMC", "SO", ub=100, acc=20, length=10), I("HLT")))
    last_in1 = FETCH + SHIFT + 10                        # 1616: MMC 4 issues then
    act_fin = last_in1 + DRAIN + ACT_LAT + 10            # 2154
    tile1_ready = 2 * FETCH + SHIFT                      # 2956
    assert times(m, 4) == (last_in1, tile1_ready, tile1_ready + 10 + DRAIN)
    c = m.counters()
    assert c["raw_stall_cycles"] == act_fin - last_in1 == 538
    assert c["input_stall_cycles"] == 0
    # rows 1, 4, 5 as before: the wait is all weight stall and shift
    assert c["weight_stall_cycles"] == (FETCH - 1) + (2 * FETCH - last_in1)
    assert c["weight_shift_cycles"] == 2 * SHIFT and c["array_active_cycles"] == 20
    assert c["non_matrix_cycles"] == c["cycles"] - 20 - c["weight_stall_cycles"] - 2 * SHIFT
    assert c["raw_stall_cycles"] > 0 and breakdown_ok(c)


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
    # the RHM issues at 1, while the RW hands its second tile over (its own port): 1703
    rhm_fin = 1 + host_cycles(60)
    # MMC 1 waits for its UB rows (tile 0 was ready at 1606)
    assert times(m, 2) == (2, rhm_fin, rhm_fin + 20 + DRAIN)             # (2, 1703, 2235)
    # MMC 2 adds into the rows MMC 1 is still draining into: no wait (the array delivers
    # the partial sums in order), it streams right behind MMC 1's last vector
    last_in1 = rhm_fin + 20                      # 1723
    assert times(m, 3) == (last_in1, last_in1, last_in1 + 20 + DRAIN)    # (1723, 1723, 2255)
    # MMC 3 switches to tile 1: fetched 1350..2700, shifted 2700..2956
    tile1 = 2 * FETCH + SHIFT
    assert times(m, 4) == (last_in1 + 20, tile1, tile1 + 20 + DRAIN)     # (1743, 2956, 3488)
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
    assert stops == [(2, 2235), (3, 2255), (4, 3488)]      # the finish cycles above


def test_mmc_after_mmc_is_no_hazard_in_strict_mode():
    # the real dependencies (RHM -> MMC, MMC -> ACT) need their SYNCs; MMC -> MMC does not
    m = Machine(MachineConfig(hazards="error"))
    m.load(_same_accumulators([I("SYNC")]), host=_host(), weights=_weights())
    assert m.run().status == "halted"
    # the SYNC issues when the RHM is done (1703) and takes a cycle: MMC 1 issues and
    # streams at 1704, MMC 2 right behind it at 1724, while MMC 1 drains
    assert times(m, 3) == (1704, 1704, 1724 + DRAIN)
    assert times(m, 4) == (1724, 1724, 1744 + DRAIN)
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
    # RHM 0..711 (700 + ceil(10 * 16 / 15.34)); the RW issues at 1 (its own port): fetch
    # 1..7, shift 7..23; the MMCs wait for the RHM's rows: MMC k (index k + 2) streams at 711 + k
    m.step(718)                                  # MMCs 4, 5, 6 drain (MMC 7 issues at 718)
    mat = stages(m)["matrix"]
    assert mat.index == 6 and (mat.progress, mat.total) == (718 - 716, lat)
    assert mat.stall.endswith("(1 cycle left; 2 more MMCs draining behind it)")
    assert m.run().status == "halted"
    assert times(m, 2) == (2, 711, 711 + 1 + lat)        # issued behind the RW, waits for the RHM
    for k in range(1, 10):
        assert times(m, k + 2) == (711 + k, 711 + k, 711 + k + 1 + lat)
    assert times(m, 12) == (721, 724, 724 + ACT_LAT + 3)
    ref = run_reference(prog, host, weights)
    assert np.array_equal(m.acc, ref.acc) and np.array_equal(m.ub, ref.ub)


# ------------------------------------------------------------------ Read_Weights decoupled
# from host DMA (spec/timing.md 5): a long RHM no longer holds back the weight stream

def _host_then_weights(first):
    """`first` (an RHM of 288 rows of the *next* batch into UB rows 2000.., or a NOP in its
    place), then 9 RW/MMC pairs streaming tiles 0..8 over this batch's three 96-row chunks
    (UB rows 0..287) into three output blocks (the LSTM1 shape), then one Activate of the
    288 sums.  (MMCs that read the RHM's own rows would wait for it in the matrix stage and,
    the front end being in order, hold back the RWs behind them: such a program issues its
    RWs first, as programs/lstm1_600x600 does.)"""
    body = [first]
    for j in range(3):
        for k in range(3):
            body += [I("RW", tile=3 * j + k),
                     I("MMC", "SO" if k == 0 else "S", ub=96 * k, acc=96 * j, length=96)]
    return program(*body, I("ACT", "R", acc=0, ub=1000, length=288), I("HLT"))


def _lstm_weights():
    return np.random.default_rng(3).integers(-128, 128, (9, 256, 256)).astype(np.int8)


def test_host_read_overlaps_the_weight_stream():
    g = np.random.default_rng(4)
    host = g.integers(-128, 128, (288, 256)).astype(np.int8)
    batch = g.integers(0, 256, (288, 256)).astype(np.uint8)    # this batch, already in UB
    prog = _host_then_weights(I("RHM", host=0, ub=2000, length=288))
    m = Machine()
    m.load(prog, host=host, weights=_lstm_weights())
    m.ub[:288] = batch
    assert m.run().status == "halted"
    host_time = host_cycles(288)                 # 5,507: the RHM, issued at 0
    weight_time = 9 * FETCH                      # 12,150: the fetch engine, from cycle 1 on
    assert host_time < weight_time
    # the first RW issues at cycle 1, behind the RHM's issue cycle, and its fetch starts at
    # once; the fetch engine never idles (each RW is handed over long before the previous
    # fetch ends).  Tail: the last tile's shift, its 96 rows, the drain, the Activate, HLT
    tail = SHIFT + 96 + DRAIN + ACT_LAT + 288 + 1
    assert m.cycle == max(host_time, 1 + weight_time) + tail            # 13,320
    assert m.cycle < host_time + weight_time     # not the sum (18,826 when RW waited behind the RHM)
    assert times(m, 1) == (1, 1, 2)              # RW 0 did not wait for the RHM
    assert int(m.tl[2, 0]) == 1                  # tile 0's fetch starts at 1 (T_FS)
    c = m.counters()
    assert c["busy_weights"] == weight_time and c["busy_input"] == host_time
    # the host time is hidden entirely: the same program with a NOP for the RHM (and its
    # rows preloaded) takes exactly as long
    n = Machine()
    n.load(_host_then_weights(I("NOP")), weights=_lstm_weights())
    n.ub[:288] = batch
    assert n.run().status == "halted" and n.cycle == m.cycle
    assert np.array_equal(n.acc, m.acc) and np.array_equal(m.ub[2000:2288], host.view(np.uint8))
    x = batch.view(np.int8).astype(np.int64)
    w = _lstm_weights().astype(np.int64)
    for j in range(3):
        want = sum(x[96 * k:96 * k + 96] @ w[3 * j + k] for k in range(3))
        assert np.array_equal(m.acc[96 * j:96 * j + 96], want)


def test_sync_waits_for_the_rw_hand_off_and_wsync_for_its_fetch():
    # RW of 5 tiles: the fifth hand-off waits for tile 0 to begin shifting (1350)
    m = run(program(I("RW", repeat=5, tile=0), I("SYNC"), I("WSYNC"), I("HLT")))
    assert times(m, 0) == (0, 0, FETCH + 1)
    assert times(m, 1) == (FETCH + 1, FETCH + 1, FETCH + 2)     # SYNC: every RW handed over
    assert times(m, 2)[0] == 5 * FETCH                           # WSYNC: the last fetch


def test_rw_deadlock_rule_still_applies_in_its_own_port():
    m = Machine()
    m.load(program(I("RHM", host=0, ub=0, length=4), I("RW", repeat=6, tile=0), I("HLT")),
           host=_host(), weights=_weights())
    r = m.run()
    assert r.status == "fault" and r.fault.kind == "deadlock" and r.fault.index == 1
    assert r.cycle == host_cycles(4)             # every earlier instruction completes first

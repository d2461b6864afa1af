"""Machine API: faults and their messages, step/breakpoint/watchpoint semantics, views,
snapshot/restore, data files."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle

import numpy as np
import pytest

from tpuasm.encoding import Instruction
from tpuasm.errors import DataFileError, TpuasmError
from tpuasm.machine import Machine, MachineConfig, MachineFault, Watch
from tpuasm.machine.trace import trace_events

from _machine_programs import I, cfg, program

D4 = 700 + math.ceil(4 * 256 / (10 * 2 ** 30 / 700e6))      # a 4-row RHM: 767 cycles


def host():
    return np.random.default_rng(3).integers(-128, 128, (128, 256)).astype(np.int8)


def weights(n=4):
    return np.random.default_rng(4).integers(-128, 128, (n, 256, 256)).astype(np.int8)


def load(prog, **cfg_over):
    m = Machine(MachineConfig(**cfg_over))
    m.load(prog, host=host(), weights=weights())
    return m


# ------------------------------------------------------------------ faults

def fault_of(prog, **cfg_over):
    m = load(prog, **cfg_over)
    r = m.run()
    assert r.status == "fault" and isinstance(r.fault, MachineFault), r
    assert m.fault == r.fault
    return m, r.fault


def test_address_fault_message_and_earlier_instructions_complete():
    m, f = fault_of(program(I("RHM", host=0, ub=0, length=4),
                            I("RHM", host=0, ub=98400, length=1), I("HLT")))
    assert f.kind == "address" and f.index == 1
    assert "UB address 98400 out of range 0..98303" in f.message
    assert f.cycle == D4                      # the first RHM completed first
    assert np.array_equal(m.ub[:4], m.host[:4])
    assert f.text == "RHM 0, 98400, 1"
    assert str(f).startswith(f"fault at cycle {D4} in instruction 1 `RHM 0, 98400, 1`: UB address")
    assert m.events[-1].kind == "fault"


def test_host_and_tile_address_faults():
    _, f = fault_of(program(I("RHM", host=126, ub=0, length=4), I("HLT")))
    assert f.kind == "address" and "host address 128 out of range 0..127" in f.message
    _, f = fault_of(program(I("RW", repeat=2, tile=3), I("HLT")))
    assert f.kind == "address" and "weight tile 4 out of range 0..3" in f.message


def test_no_tile_deadlock_and_width_faults():
    _, f = fault_of(program(I("MMC", ub=0, acc=0, length=1), I("HLT")))
    assert f.kind == "no_tile"
    _, f = fault_of(program(I("MMC", "S", ub=0, acc=0, length=1), I("HLT")))
    assert f.kind == "deadlock" and "empty Weight FIFO" in f.message
    _, f = fault_of(program(I("RW", repeat=4, tile=0), I("RW", repeat=2, tile=0), I("HLT")))
    assert f.kind == "deadlock" and f.index == 1 and "6 tiles" in f.message
    _, f = fault_of(program(I("RW", repeat=2, tile=0), I("MMC", "SD", ub=0, acc=0, length=1),
                            I("MMC", ub=0, acc=0, length=1), I("HLT")))
    assert f.kind == "weight_width" and f.index == 2


def test_config_shape_invalid_faults():
    m, f = fault_of(program(cfg("act_shift", 100), I("HLT")))
    assert f.kind == "config" and "act_shift = 100 out of range 0..62" in f.message
    _, f = fault_of(program(cfg("pool_size", 3), I("ACT", "M", acc=0, ub=0, length=10), I("HLT")))
    assert f.kind == "shape"
    bad = Instruction("ACT", 0x08 | 0x10, 1, {"acc": 0, "ub": 0, "length": 1})   # R and Q
    _, f = fault_of(program(bad, I("HLT")))
    assert f.kind == "invalid_instruction" and f.index == 0


def test_max_cycles_fault():
    m = load(program(I("RHM", host=0, ub=0, length=4), I("HLT")))
    r = m.run(max_cycles=100)
    assert r.status == "fault" and r.fault.kind == "max_cycles" and r.cycle == 100
    assert m.run().status == "fault"          # sticky until the next load


def test_strict_hazard_mode():
    prog = program(I("RHM", host=0, ub=0, length=4), I("WHM", ub=0, host=8, length=4), I("HLT"))
    assert load(prog).run().status == "halted"
    _, f = fault_of(prog, hazards="error")
    assert f.kind == "hazard" and f.index == 1 and "RAW" in f.message and "UB rows 0..3" in f.message
    synced = program(I("RHM", host=0, ub=0, length=4), I("SYNC"),
                     I("WHM", ub=0, host=8, length=4), I("HLT"))
    assert load(synced, hazards="error").run().status == "halted"


def test_fault_never_raises_for_empty_images():
    m = Machine()
    m.load(program(I("RHM", host=0, ub=0, length=1), I("HLT")))
    r = m.run()
    assert r.fault.kind == "address" and "empty" in r.fault.message


# ------------------------------------------------------------------ stepping

PROG3 = program(I("RHM", host=0, ub=0, length=4), I("RHM", host=4, ub=4, length=4),
                I("WHM", ub=0, host=64, length=8), I("HLT"))


def test_step_exact_cycles_and_views():
    m = load(PROG3)
    r = m.step()
    assert r.status == "paused" and m.cycle == 1
    pipe = {s.name: s for s in m.pipeline()}
    assert [s.name for s in m.pipeline()] == ["input", "matrix", "activate", "output", "weights", "front"]
    assert pipe["input"].index == 0 and pipe["input"].cycles_in_stage == 1
    assert pipe["front"].index == 1 and pipe["front"].stall == "waiting for the input stage"
    m.step(D4 - 2)
    assert m.cycle == D4 - 1 and not m.ub[:4].any()
    m.step()
    assert m.cycle == D4 and m.retired(0) and m.finish_cycle(0) == D4
    assert np.array_equal(m.ub[:4], m.host[:4])
    assert m.issue_cycle(1) == -1             # issues during cycle D4
    m.step()
    assert m.issue_cycle(1) == D4


def test_step_instruction():
    m = load(PROG3)
    r = m.step_instruction()
    assert r.status == "paused" and m.cycle == D4 and m.retired(0)
    r = m.step_instruction()
    assert m.cycle == 2 * D4 and m.retired(1)


def test_breakpoint_stops_before_issue_and_resumes():
    m = load(PROG3)
    r = m.run(breakpoints=[1])
    assert r.status == "breakpoint" and r.index == 1 and r.cycle == D4
    assert m.retired(0) and m.issue_cycle(1) == -1
    r = m.run(breakpoints=[1])                # a run started at a breakpoint issues it
    assert r.status == "halted"


def test_watchpoint_stops_after_the_writing_instruction():
    m = load(PROG3)
    r = m.run(watch=[Watch("ub", 5, 6)])
    assert r.status == "watchpoint" and r.index == 1 and r.cycle == 2 * D4
    assert np.array_equal(m.ub[4:8], m.host[4:8])
    r = m.run(watch=[Watch("host", 64, 72)])
    assert r.status == "watchpoint" and r.index == 2
    assert m.run().status == "halted"


def test_registers_fifo_shadow_active_views():
    m = load(program(cfg("act_shift", 3), I("RW", repeat=2, tile=1),
                     I("MMC", "S", ub=0, acc=0, length=10), I("HLT")))
    m.step(10)
    assert m.registers()["act_shift"] == 3
    fifo = m.fifo()
    assert [(e.tile, e.state) for e in fifo] == [(1, "fetching"), (2, "fetching")]
    assert fifo[0].total == 65536 and 0 < fifo[0].done < 65536
    assert m.shadow() is None and m.active() is None
    m.step(1351 + 100 - 10)                   # fetch 1..1351, then shifting
    s = m.shadow()
    assert s.tile == 1 and s.state == "shifting" and s.done == 100
    assert "weight shift" in {p.name: p for p in m.pipeline()}["matrix"].stall
    m.step(300)
    assert m.active().tiles == (1,) and not m.active().wide
    assert np.array_equal(m.tile_values(1), m.weights[1].view(np.int8))


def test_snapshot_restore_exact():
    m = load(PROG3)
    m.step(D4 + 5)
    snap = m.snapshot()
    before = (m.counters(), m.ub.copy(), m.pipeline())
    m.run()
    m.restore(snap)
    assert m.cycle == D4 + 5
    assert (m.counters(), m.pipeline()) == (before[0], before[2])
    assert np.array_equal(m.ub, before[1])
    m.run()
    assert m.status == "halted" and np.array_equal(m.host[64:72], m.host[:8])


def test_trace_and_stats(tmp_path):
    m = Machine(trace=True)
    m.load(PROG3, host=host())
    m.run()
    path = tmp_path / "t.json"
    m.write_trace(path)
    data = json.loads(path.read_text())
    names = [e.get("name") for e in data["traceEvents"] if e["ph"] == "X"]
    assert "RHM 0, 0, 4" in names
    stats = m.stats_json()
    json.dumps(stats)
    assert stats["counters"]["cycles"] == m.cycle and stats["status"] == "halted"


def test_trace_matrix_slices_end_at_the_last_vector_and_drains_are_async():
    m = Machine(trace=True)
    m.load(program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=100),
                   I("MMC", "O", ub=100, acc=100, length=50), I("HLT")), weights=weights())
    m.run()
    us = 1e6 / m.config.clock_hz
    ev = trace_events(m)
    mmc = [(round(e["ts"] / us), round((e["ts"] + e["dur"]) / us)) for e in ev
           if e["ph"] == "X" and e["name"].startswith("MMC")]
    # 1350 fetch + 256 shift; MMC 1 streams 1606..1706, MMC 2 issues at 1706 (timing.md 6)
    assert mmc == [(1, 1706), (1706, 1756)]
    drains = sorted((e["id"], e["ph"], round(e["ts"] / us)) for e in ev if e.get("cat") == "drain")
    assert drains == [(1, "b", 1706), (1, "e", 2218), (2, "b", 1756), (2, "e", 2268)]


# ------------------------------------------------------------------ data files

def test_data_file_errors(tmp_path):
    m = Machine()
    p = tmp_path / "h.npy"
    np.save(p, np.zeros((4, 128), np.int8))
    with pytest.raises(DataFileError, match=r"h.npy: shape \(4, 128\) found, expected \(rows, 256\)"):
        m.load(PROG3, host=p)
    np.save(p, np.zeros((4, 256), np.float32))
    with pytest.raises(DataFileError, match="dtype float32"):
        m.load(PROG3, host=p)
    np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataFileError, match="pickled"):
        m.load(PROG3, host=p)
    with pytest.raises(DataFileError, match="missing.npy: cannot read host memory file: No such file"):
        m.load(PROG3, host=tmp_path / "missing.npy")
    w = tmp_path / "w.npy"
    np.save(w, np.zeros((2, 256, 128), np.uint8))
    with pytest.raises(DataFileError, match=r"expected \(tiles, 256, 256\)"):
        m.load(PROG3, weights=w)
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(DataFileError, match="junk.npy"):
        m.load(PROG3, host=tmp_path / "junk.npy")


def test_data_paths_that_are_not_npy_arrays(tmp_path, monkeypatch):
    m = Machine()
    with pytest.raises(DataFileError, match="host memory: expected a numpy array or the path "
                                            "of a .npy file, got list"):
        m.load(PROG3, host=[[0] * 256])
    with pytest.raises(DataFileError, match="weight: expected a numpy array .* got tuple"):
        m.load(PROG3, weights=(1, 2))
    with pytest.raises(DataFileError, match="is a directory"):
        m.load(PROG3, host=tmp_path)
    with pytest.raises(DataFileError, match="cannot read weight file: No such file"):
        m.load(PROG3, weights=str(tmp_path / "missing.npy"))
    z = tmp_path / "h.npz"
    np.savez(z, host=np.zeros((4, 256), np.int8))
    with pytest.raises(DataFileError, match=r"h.npz: host memory file is a .npz archive"):
        m.load(PROG3, host=z)


def test_unreadable_data_file(tmp_path, monkeypatch):
    p = tmp_path / "h.npy"
    np.save(p, np.zeros((4, 256), np.int8))

    real_open = os.open

    def denied(path, *args, **kwargs):   # chmod 0 does not stop root, so fake the refusal
        if str(path) == str(p):
            raise PermissionError(13, "Permission denied", str(p))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(DataFileError, match="h.npy: cannot read host memory file: "
                                            "Permission denied"):
        Machine().load(PROG3, host=p)


def test_weights_are_memory_mapped_read_only(tmp_path):
    w = tmp_path / "w.npy"
    np.save(w, weights(3))
    m = Machine()
    m.load(program(I("RW", tile=2), I("MMC", "S", ub=0, acc=0, length=1), I("HLT")), weights=w)
    assert not m.weights.flags.writeable
    assert isinstance(m.weights.base, np.memmap) or m.weights.base is not None
    assert m.run().status == "halted"


def test_stall_texts():
    m = Machine()
    m.load(program(I("RW", tile=0), I("RHM", host=0, ub=0, length=100),
                   I("MMC", "S", ub=0, acc=0, length=100), I("RW", repeat=5, tile=0),
                   I("HLT")), host=host(), weights=weights(8))
    m.step(100)
    pipe = {s.name: s for s in m.pipeline()}
    assert pipe["matrix"].stall.startswith("waiting for weight tile 0 (fetching, 100/1350 cycles)")
    # the RW of 5 tiles issued at 3 into the weight port: tiles 1-4 handed over, the fifth
    # waits for tile 1 to begin shifting (after its arrival at 2700)
    assert pipe["weights"].index == 3 and "Weight FIFO full" in pipe["weights"].stall
    assert pipe["input"].index == 1 and pipe["input"].stall is None
    m.step(1700)                               # tile 0 ready, the RHM still running
    pipe = {s.name: s for s in m.pipeline()}
    assert pipe["matrix"].stall.startswith("RAW: UB rows 0-99 written by RHM (#1")
    m.step(1000)                               # 2800: the RW handed its last tile at 2700;
    # the engine fetches its second tile (weight tile 1) 2700..4050
    pipe = {s.name: s for s in m.pipeline()}
    assert pipe["weights"].index is None and pipe["weights"].text == "fetch tile 1"
    assert m.run().status == "halted"


def test_small_array_shape_from_program():
    prog = program(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=3), I("HLT"),
                   array_size=16)
    m = Machine.for_program(prog)
    assert m.config.array_size == 16 and m.config.fetch_cycles == 6
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (1, 16, 16)).astype(np.int8)
    m.load(prog, weights=w)
    m.ub[:3] = rng.integers(0, 256, (3, 16)).astype(np.uint8)
    assert m.run().status == "halted"
    assert m.cycle == 6 + 16 + 3 + 32 + 1       # fetch, shift, 3 rows, 2N drain, HLT
    x = m.ub[:3].view(np.int8).astype(np.int64)
    assert np.array_equal(m.acc[:3], x @ w[0].astype(np.int64))


def test_bounded_step_with_breakpoints():
    m = load(PROG3)
    r = m.step(100, breakpoints=[1])
    assert r.status == "paused" and m.cycle == 100
    r = m.step(10_000, breakpoints=[1])
    assert r.status == "breakpoint" and r.index == 1 and m.cycle == D4
    r = m.step(10, breakpoints=[1])            # started at the breakpoint: issues it
    assert r.status == "paused" and m.issue_cycle(1) == D4
    r = m.step(10_000, watch=[Watch("host", 64, 65)])
    assert r.status == "watchpoint" and r.index == 2


def test_hand_made_garbage_faults_instead_of_raising():
    bad = [Instruction("RW", 0, -5, {"tile": 0}),              # repeat out of range
           Instruction("RHM", 0, 1, {"host": 0, "ub": 0, "bogus": 1})]
    for ins in bad:
        m = load(program(I("RW", tile=0), ins, I("HLT")))
        r = m.run()
        assert r.status == "fault" and r.fault.kind == "invalid_instruction" and r.index == 1


def test_opentpu_timing_constants():
    c = MachineConfig.opentpu(16)
    assert (c.fetch_cycles, c.shift, c.mmc_latency, c.act_latency) == (4, 3, 32, 1)
    assert [c.host_cycles(r) for r in (1, 10, 255)] == [1, 10, 255]
    assert MachineConfig.opentpu(8, act_latency_cycles=5).act_latency == 5
    assert MachineConfig(array_size=16).host_cycles(10) == 700 + math.ceil(10 * 16 / (10 * 2 ** 30 / 700e6))
    m = Machine(c)
    rows = 10
    m.load(program(I("RHM", host=0, ub=0, length=rows), I("RW", tile=0),
                   I("MMC", "SO", ub=0, acc=0, length=rows), I("HLT"), array_size=16),
           host=np.zeros((rows, 16), np.int8), weights=np.zeros((1, 16, 16), np.int8))
    assert m.run().status == "halted"
    # RHM 0..10; the RW issues at 1 (its own port, not the input stage): fetch 1..5, shift
    # 5..8; the MMC issues at 2 and waits for the RHM's rows; 10 rows + 2N drain
    assert tuple(int(t) for t in m.times[1]) == (1, 1, 2)
    assert tuple(int(t) for t in m.times[2]) == (2, 10, 10 + rows + 32)


def test_explicit_timing_constant_wins_over_opentpu_timing():
    c = MachineConfig(timing="opentpu", host_latency_cycles=700, act_latency_cycles=16)
    assert (c.host_latency, c.act_latency) == (700, 16)
    assert c.shift == 3                                  # the constants not given: OpenTPU's
    assert MachineConfig.opentpu(8, weight_bytes_per_cycle=1.0).fetch_cycles == 64


def test_replace_timing_rederives_the_constants_not_given():
    tpu, opentpu = MachineConfig(array_size=8), MachineConfig.opentpu(8)
    back = dataclasses.replace(opentpu, timing="tpu")
    for name in ("weight_bandwidth", "host_bandwidth", "host_latency", "act_latency"):
        assert getattr(back, name) == getattr(tpu, name), name
    assert (back.shift, back.fetch_cycles, back.mmc_latency) == (tpu.shift, tpu.fetch_cycles,
                                                                 tpu.mmc_latency)
    assert opentpu.replace(timing="tpu") == back
    there = dataclasses.replace(tpu, timing="opentpu")
    assert (there.shift, there.fetch_cycles, there.host_latency) == (3, 1, 0)
    # an explicit setting survives the switch
    kept = dataclasses.replace(MachineConfig.opentpu(8, host_latency_cycles=5), timing="tpu")
    assert kept.host_latency == 5 and kept.act_latency == 16


# ------------------------------------------------------------------ user errors and messages

@pytest.mark.parametrize("kwargs, text", [
    ({"hazards": "warn"}, "hazards must be 'interlock' or 'error', not 'warn'"),
    ({"timing": "gpu"}, "timing must be 'tpu' or 'opentpu', not 'gpu'"),
    ({"clock_hz": 0}, "clock_hz must be positive"),
    ({"weight_bytes_per_cycle": -1.0}, "weight_bytes_per_cycle must be positive"),
    ({"host_bytes_per_cycle": 0.0}, "host_bytes_per_cycle must be positive"),
    ({"host_latency_cycles": -1}, "host_latency_cycles must be a non-negative integer"),
    ({"shift_cycles": -2}, "shift_cycles must be a non-negative integer"),
    ({"mmc_latency_cycles": 1.5}, "mmc_latency_cycles must be a non-negative integer"),
    ({"act_latency_cycles": -3}, "act_latency_cycles must be a non-negative integer"),
    ({"timing": "opentpu", "host_latency_cycles": -1},
     "host_latency_cycles must be a non-negative integer"),
])
def test_config_value_errors(kwargs, text):
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        MachineConfig(**kwargs)


def test_watch_step_and_restore_value_errors():
    with pytest.raises(ValueError, match="watch memory must be one of ub, acc, host, not 'dram'"):
        Watch("dram", 0, 1)
    with pytest.raises(ValueError, match=r"empty watch range 5\.\.4"):
        Watch("ub", 5, 5)
    with pytest.raises(ValueError, match="empty watch range"):
        Watch("acc", 3, 1)
    m = load(PROG3)
    with pytest.raises(ValueError, match="cycles must be >= 0"):
        m.step(-1)
    assert m.cycle == 0
    snap = m.snapshot()
    other = Machine(MachineConfig(array_size=8))
    other.load(program(I("HLT"), array_size=8))
    with pytest.raises(ValueError, match="snapshot belongs to another program or machine shape"):
        other.restore(snap)


def test_fault_messages_weight_width_hazards_tile_and_shape():
    _, f = fault_of(program(I("RW", repeat=2, tile=0), I("MMC", "SD", ub=0, acc=0, length=1),
                            I("MMC", ub=0, acc=0, length=1), I("HLT")))
    assert f.message == ("weight width mismatch: the active weights are 16-bit, the "
                         "instruction does not have D")
    _, f = fault_of(program(I("RW", tile=0), I("MMC", "S", ub=0, acc=0, length=1),
                            I("MMC", "D", ub=0, acc=0, length=1), I("HLT")))
    assert f.kind == "weight_width" and f.index == 2
    assert f.message == "weight width mismatch: the active weights are 8-bit, the instruction has D"
    strict = " and no SYNC, WSYNC or INT between them (strict mode, --hazards=error)"
    _, f = fault_of(program(I("WHM", ub=0, host=8, length=4), I("RHM", host=0, ub=0, length=4),
                            I("HLT")), hazards="error")
    assert f.kind == "hazard" and f.index == 1
    assert f.message == "WAR hazard on UB rows 0..3 with instruction 0" + strict + " (`WHM 0, 8, 4`)"
    _, f = fault_of(program(I("RHM", host=0, ub=0, length=4), I("ACT", acc=0, ub=2, length=4),
                            I("HLT")), hazards="error")
    assert f.kind == "hazard" and f.index == 1
    assert f.message == "WAW hazard on UB rows 2..3 with instruction 0" + strict + " (`RHM 0, 0, 4`)"
    m = Machine()
    m.load(program(I("RW", tile=0), I("HLT")))            # no weight image
    f = m.run().fault
    assert (f.kind, f.index) == ("address", 0)
    assert f.message == "weight tile 0 out of range (no weight image loaded)"
    _, f = fault_of(program(cfg("pool_size", 3), I("ACT", "M", acc=0, ub=0, length=10), I("HLT")))
    assert f.kind == "shape" and f.index == 1
    assert f.message == "pooling shape does not divide: length 10, pool_size 3, pool_width 0"


def test_write_trace_to_a_missing_directory(tmp_path):
    m = load(PROG3)
    m.run()
    path = tmp_path / "no" / "such" / "t.json"
    with pytest.raises(TpuasmError, match=r"no/such/t.json: cannot write the trace: "
                                          r"No such file or directory"):
        m.write_trace(path)
    assert not path.parent.exists()


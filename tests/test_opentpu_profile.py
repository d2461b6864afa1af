"""The opentpu machine profile on the emulator: Activate's semantics against the numpy
model of OpenTPU, OpenTPU's documented latencies under timing="opentpu", and the same
output with and without NOPs.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from tpuasm.assembler import assemble, assemble_file
from tpuasm.lint import strip_nops
from tpuasm.machine import Machine, MachineConfig
from tpuasm.machine.reference import run_reference

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "programs" / "opentpu"
sys.path.insert(0, str(PROGRAMS))
import opentpu_model as model  # noqa: E402


def run(source: str, n: int, host, weights, **config):
    program = assemble(source, "t.a", config={"profile": "opentpu", "array_size": n})
    m = Machine(MachineConfig.opentpu(n, **config))
    m.load(program, host=host, weights=weights)
    result = m.run()
    assert result.status == "halted", result
    return m, program


# ---------------------------------------------------------------- Activate
@pytest.mark.parametrize("n", [8, 16])
def test_activate_functions_match_the_model(n):
    g = np.random.default_rng(n)
    rows = 24
    # big inputs and weights: accumulators far outside int8, both signs; small ones: the
    # sigmoid's steps
    x = np.concatenate([model.random_int8(g, (rows - 8, n)), model.random_int8(g, (8, n), -2, 2)])
    w = np.concatenate([model.random_int8(g, (1, n, n)), model.random_int8(g, (1, n, n), -3, 3)])
    host = np.zeros((4 * rows, n), np.int8)
    host[:rows] = x
    src = f"""
        RHM 0, 0, {rows}
        RW 0
        RW 1
        MMC.SO 0, 0, {rows}
        MMC.S 0, 0, {rows}          # adds the second tile's products
        ACT 0, {rows}, {rows}
        ACT.R 0, {2 * rows}, {rows}
        ACT.Q 0, {3 * rows}, {rows}
        WHM {rows}, {rows}, {3 * rows}
        HLT
    """
    m, _ = run(src, n, host, w)
    acc = model.mmc(x, w[0]) + model.mmc(x, w[1])
    out = m.host.view(np.int8)
    assert np.array_equal(out[rows:2 * rows], model.act(acc, "none"))
    assert np.array_equal(out[2 * rows:3 * rows], model.act(acc, "relu"))
    assert np.array_equal(out[3 * rows:], model.act(acc, "sigmoid"))
    assert np.array_equal(m.acc[:rows], model.wrap_int32(acc))
    assert (np.abs(acc) > 127).any() and ((acc >= -6) & (acc <= 37)).any()


def test_mmc_without_switch_reuses_the_active_tile():
    # OpenTPU's hardware (spec/opentpu.md section 5, row 1): only S switches tiles.
    g = np.random.default_rng(3)
    x = model.random_int8(g, (8, 8))
    w = model.random_int8(g, (2, 8, 8))
    host = np.zeros((16, 8), np.int8)
    host[:8] = x
    src = "RHM 0, 0, 8\nRW 0\nRW 1\nMMC.SO 0, 0, 8\nMMC 0, 0, 8\nACT 0, 8, 8\nWHM 8, 8, 8\nHLT\n"
    m, _ = run(src, 8, host, w)
    assert np.array_equal(m.host.view(np.int8)[8:], model.act(2 * model.mmc(x, w[0]), "none"))


def test_registers_do_not_requantize_under_the_profile():
    x = np.zeros((2, 8), np.int8)
    x[:, 0] = [100, -100]
    w = np.zeros((1, 8, 8), np.int8)
    w[0, 0, :] = [3, 1, 2, -3, 0, 0, 0, 0]
    src = ("CFG act_shift, 4\nCFG act_out, 1\nRHM 0, 0, 2\nRW 0\nMMC.SO 0, 0, 2\n"
           "ACT 0, 2, 2\nWHM 2, 2, 2\nHLT\n")
    host = np.zeros((4, 8), np.int8)
    host[:2] = x
    m, _ = run(src, 8, host, w)
    acc = model.mmc(x, w[0])                     # 300, 100, 200, -300, ...
    assert np.array_equal(m.host.view(np.int8)[2:], model.act(acc, "none"))


# ---------------------------------------------------------------- timing
def test_timing_constants():
    c = MachineConfig.opentpu(16)
    assert (c.timing, c.profile, c.array_size) == ("opentpu", "opentpu", 16)
    assert [c.host_cycles(m) for m in (1, 10, 255)] == [1, 10, 255]       # M cycles
    assert c.fetch_cycles == 16 * 16 // 64 and c.shift == 3                 # N*N/64 + 3
    assert c.mmc_latency == 32 and c.act_latency == 1               # L+2N, L+1
    assert MachineConfig.opentpu(8).fetch_cycles == 1
    assert MachineConfig.opentpu(8, act_latency_cycles=5).act_latency == 5
    assert MachineConfig(array_size=16).host_cycles(10) > 700              # TPU v1 timing
    with pytest.raises(ValueError):
        MachineConfig.opentpu(32)


@pytest.mark.parametrize("n, rows", [(8, 8), (16, 10), (16, 200)])
def test_documented_latencies(n, rows):
    zeros = np.zeros((rows, n), np.int8)
    w = np.zeros((1, n, n), np.int8)
    # each instruction depends on the one before, so each starts when its input is ready
    src = (f"RHM 0, 0, {rows}\nRW 0\nMMC.SO 0, 0, {rows}\nACT 0, 0, {rows}\n"
           f"WHM 0, 0, {rows}\nHLT\n")
    m, p = run(src, n, zeros, w)
    rhm, rw, mmc, act, whm = range(5)
    assert m.finish_cycle(rhm) - m.issue_cycle(rhm) == rows                     # M
    ready = m.issue_cycle(rw) + n * n // 64 + 3                                 # RW + FIFO
    assert m.finish_cycle(mmc) - max(ready, m.finish_cycle(rhm)) == rows + 2 * n  # L + 2N
    assert m.finish_cycle(act) - m.finish_cycle(mmc) == rows + 1                # L + 1
    assert m.finish_cycle(whm) - m.finish_cycle(act) == rows                    # M


# ---------------------------------------------------------------- the programs
def _generate(name: str, out: Path):
    spec = importlib.util.spec_from_file_location(f"gen_{name}", PROGRAMS / name / "gen.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.generate(out)
    return np.load(out / "host.npy"), np.load(out / "weights.npy"), np.load(out / "y.npy")


@pytest.mark.parametrize("name, n, start", [("matmul8", 8, 8), ("relu3_16", 16, 0),
                                            ("sigmoid8", 8, 16)])
def test_programs_without_nops_give_the_same_output(tmp_path, name, n, start):
    host, weights, y = _generate(name, tmp_path)
    padded = assemble_file(PROGRAMS / name / f"{name}.a",
                           config={"profile": "opentpu", "array_size": n})
    lean = strip_nops(padded)
    results = []
    for program in (padded, lean):
        m = Machine(MachineConfig.opentpu(n))
        m.load(program, host=host, weights=weights)
        assert m.run().status == "halted"
        results.append((m.host.copy(), m.counters()["cycles"]))
        assert np.array_equal(m.host.view(np.int8)[start:start + len(y)], y)
    assert np.array_equal(results[0][0], results[1][0])
    assert results[1][1] <= results[0][1]
    # the reference model agrees on the padded program
    ref = run_reference(padded, host, weights)
    assert ref.fault_kind is None and np.array_equal(ref.host, results[0][0])


@pytest.mark.parametrize("name, n", [("matmul8", 8), ("relu3_16", 16), ("sigmoid8", 8)])
def test_padded_programs_take_opentpus_cycles(tmp_path, name, n):
    # OpenTPU issues instruction i at cycle i and stops after HLT: len(program) cycles.
    # tpuasm matches that for a correctly padded program: its RW has its own port to the
    # weight-fetch engine, so it does not wait for the RHM before it (spec/opentpu.md 6).
    host, weights, _ = _generate(name, tmp_path)
    program = assemble_file(PROGRAMS / name / f"{name}.a",
                            config={"profile": "opentpu", "array_size": n})
    m = Machine(MachineConfig.opentpu(n))
    m.load(program, host=host, weights=weights)
    assert m.run().status == "halted"
    assert m.counters()["cycles"] == len(program)


# ---------------------------------------------------------------- sim.py's operand exchange
def sim_py_operands(key: str, ub_addr: int, addr: int) -> tuple[int, int]:
    """(source, destination) as OpenTPU's sim.py passes them: (addr, ub_addr) for every
    instruction (TPU_FACTS.md).  For RHM and ACT that is right; WHM and MMC read the UB, so
    for them it exchanges source and destination (spec/opentpu.md section 5, row 9)."""
    return addr, ub_addr


def test_whm_and_mmc_follow_the_assembler_not_sim_pys_exchange():
    # `WHM 0, 4, 2` is UB rows 0-1 -> host rows 4-5 (the assembler: ub_addr = 0 is the
    # source, addr = 4 the destination); sim.py copies UB rows 4-5 -> host rows 0-1.
    # `MMC.SO 0, 3, 1` multiplies UB row 0 into accumulator row 3; sim.py would read UB
    # row 3 and write accumulator row 0.
    n = 8
    g = np.random.default_rng(12)
    h = model.random_int8(g, (6, n))
    w = model.random_int8(g, (1, n, n))
    src = "RHM 0, 0, 2\nRW 0\nMMC.SO 0, 3, 1\nWHM 0, 4, 2\nHLT\n"
    m, program = run(src, n, h.copy(), w)
    host = m.host.view(np.int8)
    # tpuasm, by hand: UB rows 0-1 hold host rows 0-1 (RHM), WHM copies them to 4-5
    assert np.array_equal(host[4:6], h[0:2]) and np.array_equal(host[0:4], h[0:4])
    assert np.array_equal(m.acc[3], h[0].astype(np.int64) @ w[0].astype(np.int64))
    assert not m.acc[0].any()
    # what sim.py's exchange gives instead: WHM reads UB rows 4-5 (never written: zeros)
    # into host rows 0-1, and the MMC reads UB row 3 (zeros) into accumulator row 0
    whm = program.instructions[3]
    src_row, dst_row = sim_py_operands("WHM", whm["ub"], whm["host"])
    assert (src_row, dst_row) == (4, 0)
    sim_host = h.copy()
    ub = np.zeros((8, n), np.int8)
    ub[0:2] = h[0:2]
    sim_host[dst_row:dst_row + 2] = ub[src_row:src_row + 2]
    assert not np.array_equal(sim_host, host)          # the two disagree on this program
    mmc = program.instructions[2]
    assert sim_py_operands("MMC", mmc["ub"], mmc["acc"]) == (3, 0)

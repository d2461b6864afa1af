"""Timing-only runs (Machine(timing_only=True), `tpuasm run --timing-only`) give exactly the
cycles, counters, per-instruction times, events, faults and pipeline views of full runs:
on random programs and on every program of the library (programs/*/test.toml)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tpuasm.assembler import assemble_file
from tpuasm.cli import main
from tpuasm.machine import Machine
from tpuasm.regression.manifest import discover, load_manifest
from tpuasm.regression.runner import SHAPE_KEYS, Result, _data_images, generate

from test_pipeline_random import case

ROOT = Path(__file__).resolve().parents[1]


def same_timing(full, fast):
    assert fast.cycle == full.cycle and fast.status == full.status
    assert fast.counters() == full.counters()
    assert np.array_equal(fast.times, full.times) and np.array_equal(fast.tl, full.tl)
    assert fast.events == full.events
    assert str(fast.fault) == str(full.fault)
    assert fast.pipeline() == full.pipeline()


def pair(prog, host, weights, **overrides):
    full = Machine.for_program(prog, **overrides)
    fast = Machine.for_program(prog, timing_only=True, **overrides)
    for m in (full, fast):
        m.load(prog, host=host, weights=weights)
    return full, fast


@pytest.mark.parametrize("seed", range(60))
def test_random_programs(seed):
    prog, host, weights = case(seed)
    full, fast = pair(prog, host, weights)
    # the same stops along the way: cut both runs at the same random cycles
    g = np.random.default_rng(seed)
    while full.status not in ("halted", "fault"):
        k = int(g.integers(1, 400))
        assert full.step(k) == fast.step(k)
        same_timing(full, fast)
    assert fast.run() == full.run()
    same_timing(full, fast)
    # and no data moved
    assert not fast.ub.any() and not fast.acc.any()


def _library():
    out = []
    for path in discover([ROOT / "programs"]):
        m = load_manifest(path)
        out.append(pytest.param(path, id=m.name,
                                marks=[pytest.mark.slow] if "slow" in m.tags else []))
    return out


@pytest.mark.parametrize("path", _library())
def test_program_library(path, tmp_path):
    m = load_manifest(path)
    if m.assembly_error is not None:
        pytest.skip("an assembly-error manifest: nothing runs")
    shape = {k: v for k, v in m.machine.items() if k in SHAPE_KEYS}
    overrides = {k: v for k, v in m.machine.items() if k not in SHAPE_KEYS}
    program = assemble_file(m.program, config=shape or None)
    if m.generator is not None:
        generate(m.generator, tmp_path)
    host, weights = _data_images(m, program, tmp_path, Result(m.name, str(path)))
    full, fast = pair(program, host, weights, **overrides)
    assert fast.run(max_cycles=m.max_cycles) == full.run(max_cycles=m.max_cycles)
    same_timing(full, fast)


def test_cli_timing_only(tmp_path, capsys):
    src = tmp_path / "p.tasm"
    src.write_text(".config array_size=8\n.host x, 4\n.ub in, 4\n.acc s, 4\n.tile w, 1\n"
                   "RHM host.x, in, 4\nRW tile.w\nMMC.SO in, s, 4\nACT s, in, 4\n"
                   "WHM in, host.x, 4\nHLT\n")
    np.save(tmp_path / "h.npy", np.ones((4, 8), np.int8))
    np.save(tmp_path / "w.npy", np.ones((1, 8, 8), np.int8))
    common = [str(src), "--host", str(tmp_path / "h.npy"), "--weights", str(tmp_path / "w.npy")]
    assert main(["run", *common, "--stats", str(tmp_path / "a.json")]) == 0
    assert main(["run", *common, "--timing-only", "--stats", str(tmp_path / "b.json")]) == 0
    import json
    a = json.loads((tmp_path / "a.json").read_text())
    b = json.loads((tmp_path / "b.json").read_text())
    assert a == b and a["cycles"] > 0
    capsys.readouterr()


def test_cli_timing_only_with_out_is_a_usage_error(tmp_path, capsys):
    code = main(["run", str(tmp_path / "never_read.tasm"), "--timing-only",
                 "--out", str(tmp_path / "o.npy")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--timing-only computes no memory contents" in err and "--out" in err
    assert not (tmp_path / "o.npy").exists()


def test_reloading_reuses_the_decoded_table_but_sees_a_changed_program():
    # Machine.load caches the decoded table on the Program (sweeps reload one program many
    # times); replacing an instruction must invalidate it, and invalid instructions stay
    # flagged on every load
    from tpuasm.binary import Program
    from tpuasm.encoding import Instruction
    prog = Program([Instruction("NOP"), Instruction("HLT")])
    m = Machine()
    m.load(prog)
    assert m.run().status == "halted" and m.cycle > 0
    prog.instructions[0] = Instruction("MMC", 0, 1, {"ub": 0, "acc": 0, "length": 0})
    for _ in range(2):                   # a length of 0 is not encodable: it faults
        m.load(prog)
        assert m.run().status == "fault"
        assert "invalid" in str(m.fault).lower() or "length" in str(m.fault).lower()
    prog.instructions[0] = Instruction("NOP")
    m.load(prog)
    assert m.run().status == "halted"

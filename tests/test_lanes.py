"""Batches as lanes (machine/lanes.py: each instruction once over several batches) against
fresh full pipelined runs of each batch: random programs (TPU and OpenTPU profiles, more
batches than lanes so that the last group is partial), compiled models with host parts
between their segments through CompiledModel.run, the padded-tile paths of a compiled CNN,
and the rule that chooses lanes (worth_it)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).parent))
from program_strategies import programs  # noqa: E402

import float_models  # noqa: E402
from tpuasm.compiler.pipeline import compile_model  # noqa: E402
from tpuasm.compiler.runtime.steps import HostStep, TpuStep  # noqa: E402
from tpuasm.machine import Machine  # noqa: E402
from tpuasm.machine import lanes  # noqa: E402

MAX_CYCLES = 2_000_000


def _lanes_check(case, batches=5, width=2):
    """`batches` host images (the case's and random ones) through run_batches with `width`
    lanes against a fresh load and full pipelined run of each: the same host memory.
    Returns whether the lanes path served (the int8 kernel at this array size)."""
    weights = case.weights if len(case.weights) else None
    rng = np.random.default_rng(len(case.host))
    images = [np.asarray(case.host).view(np.uint8)] + [
        rng.integers(0, 256, case.host.shape).astype(np.uint8) for _ in range(batches - 1)]
    wanted = []
    for image in images:
        full = Machine.for_program(case.program)
        full.load(case.program, host=image, weights=weights)
        result = full.run(max_cycles=MAX_CYCLES)
        assert result.status == "halted"
        wanted.append(np.asarray(full.host).view(np.uint8))
    laned = Machine.for_program(case.program)
    laned.load(case.program, host=case.host, weights=weights)
    laned.run_data()                # a run before: the lanes must not see its state
    for attempt in range(2):        # twice: the kept lane memories start clean again
        hosts = np.stack(images)
        got = laned.run_batches(hosts, lanes=width)
        assert got.status == "halted" and got.cycle == result.cycle
        for b, want in enumerate(wanted):
            np.testing.assert_array_equal(hosts[b], want, err_msg=f"batch {b}, run {attempt}")
    return laned._lane_memory(width, batches) is not None


@pytest.mark.parametrize("profile", ["tpu", "opentpu"])
def test_lanes_equal_fresh_full_runs_on_random_programs(profile):
    served = []

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(fault_share=0.0, profile=profile))
    def check(case):
        full = Machine.for_program(case.program)
        full.load(case.program, host=case.host,
                  weights=case.weights if len(case.weights) else None)
        if full.run(max_cycles=MAX_CYCLES).status == "halted":
            served.append(_lanes_check(case))

    check()
    assert served.count(True) >= 8            # the lanes path itself, not the fallback


MODELS = {
    # a host part between two segments: the softmax runs in onnxruntime
    "mlp-softmax-mlp": ([("gemm", 12), ("softmax",), ("gemm", 5)], (7,)),
    "conv-softmax-gemm": ([("conv", 4, 3, 1, 1), ("softmax",), ("flatten",), ("gemm", 5)],
                          (2, 6, 6)),
    "cnn": ([("conv", 4, 3, 1, 1), ("relu",), ("maxpool", 2, 2, 0), ("flatten",),
             ("gemm", 5)], (2, 6, 6)),
    "cnn-avgpool": ([("conv", 6, 3, 2, 1), ("clip", 0, 6), ("avgpool", 2, 2, 0, 1),
                     ("conv", 3, 1, 1, 0), ("gap",), ("flatten",), ("gemm", 4)], (3, 8, 8)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_models_as_lanes_equal_the_pipeline_batch_by_batch(tmp_path, monkeypatch,
                                                                   name):
    """CompiledModel.run with lanes forced on (worth_it's threshold 0) equals the timed
    pipeline batch by batch on 23 rows at batch 4: six batches, the last one partial."""
    layers, shape = MODELS[name]
    path = float_models.save(float_models.build(layers, shape), tmp_path / "m.onnx")
    calib = np.random.default_rng(0).normal(0, 1, (24,) + shape).astype(np.float32)
    model = compile_model(path, batch=4, calibration=calib, config={"array_size": 16})
    x = np.random.default_rng(1).normal(0, 1, (23,) + shape).astype(np.float32)
    timed = model.run(x, engine="pipeline")
    monkeypatch.setattr(lanes, "WORTH_MACS", 0)
    calls = []
    original = Machine.run_batches

    def spy(machine, hosts, lanes=1):
        calls.append((len(hosts), lanes, machine._lane_memory(lanes, len(hosts)) is not None))
        return original(machine, hosts, lanes)
    monkeypatch.setattr(Machine, "run_batches", spy)
    got = model.run(x)
    segments = sum(isinstance(s, TpuStep) for s in model.steps)
    assert len(calls) == segments
    assert all(n == 6 and width == 6 and served for n, width, served in calls)
    if "softmax" in name:
        assert segments == 2 and isinstance(model.steps[2], HostStep)
    for key, want in timed.items():
        np.testing.assert_array_equal(got[key], want)


def test_padded_tiles_as_lanes_equal_batch_by_batch():
    """The digits CNN (its 8 x 16 tiles run on their boxes: BOX_DIRECT and BOX_COMPACT)
    and MLP, 3 batches as lanes against run_batches batch by batch on random inputs."""
    root = Path(__file__).resolve().parents[1] / "programs" / "digits"
    calib = np.load(root / "calibration.npy")
    seen = 0
    for name in ("mlp", "cnn"):
        model = compile_model(root / f"{name}.onnx", batch=8, calibration=calib)
        model.run(calib[:8])
        for step in (s for s in model.steps if isinstance(s, TpuStep)):
            rng = np.random.default_rng(5)
            inputs = {t.name: rng.integers(t.quant.qmin, t.quant.qmax + 1, (24,) + t.shape)
                      .astype(np.int8 if t.quant.signed else np.uint8)
                      for t in step.segment.inputs}
            hosts = step.program.host_images(inputs, 3)
            machine = step._machine
            want, got = hosts.copy(), hosts.copy()
            assert machine.run_batches(want).status == "halted"
            assert machine.run_batches(got, lanes=3).status == "halted"
            np.testing.assert_array_equal(got, want)
            seen += 1
    assert seen >= 2


def test_worth_it_takes_big_matrix_multiplies_only():
    from tpuasm import assemble
    big = assemble("RW 0\nMMC.SOU 0, 0, 200\nHLT\n")
    small = assemble("RW 0\nMMC.SOU 0, 0, 16\nHLT\n")
    none = assemble("HLT\n")
    for program, n, want in ((big, 256, True), (small, 256, False), (big, 64, False),
                             (none, 256, False)):
        machine = Machine.for_program(program)
        machine.load(program)
        assert lanes.worth_it(machine.prog, n) is want


WIDE = """
.config array_size=16
.host x, 40
.host out, 64
.ub   x, 40
.ub   y, 64
.acc  sums, 64
.tile w, 4
        RW      tile.w
        RW      tile.w + 1, repeat=2
        RW      tile.w + 3
        RHM     host.x, ub.x, 40
        MMC.S{f1}O  ub.x, acc.sums, {n1}
        MMC.S{f2}   ub.x + 2, acc.sums, {n2}
        CFG     act_out, 2
        ACT     acc.sums, ub.y, 32
        WHM     ub.y, host.out, 64
        HLT
"""


@pytest.mark.parametrize("f1,f2", [("H", "D"), ("HD", "U"), ("D", "HD"), ("W", "UH")])
def test_sixteen_bit_matrix_multiplies_as_lanes_equal_fresh_full_runs(f1, f2):
    """16-bit inputs (H), weights (D) and both on the int8 kernel (N = 16) as lanes, an
    overwriting then an accumulating MatrixMultiply, the sums written out as int16."""
    from tpuasm import assemble
    from tpuasm.machine import native
    if native.level() == native.LEVEL_NONE:
        pytest.skip("no int8 kernel here")
    n1 = 20 if "H" in f1 else 40
    n2 = 19 if "H" in f2 else 38
    program = assemble(WIDE.format(f1=f1, f2=f2, n1=min(n1, 32), n2=min(n2, 32)))
    rng = np.random.default_rng(7)
    weights = rng.integers(0, 256, (4, 16, 16)).astype(np.uint8)
    images = [rng.integers(0, 256, (104, 16)).astype(np.uint8) for _ in range(4)]
    wanted = []
    for image in images:
        full = Machine.for_program(program)
        full.load(program, host=image, weights=weights)
        assert full.run(max_cycles=MAX_CYCLES).status == "halted"
        wanted.append(np.asarray(full.host).view(np.uint8).copy())
    laned = Machine.for_program(program)
    laned.load(program, host=images[0], weights=weights)
    assert laned._scratch.options[2] != 0
    hosts = np.stack(images)
    assert laned.run_batches(hosts, lanes=3).status == "halted"
    for b, want in enumerate(wanted):
        np.testing.assert_array_equal(hosts[b], want, err_msg=f"batch {b}")


READ_BEFORE_OVERWRITE = """
.config array_size=16
.host x, 8
.host out, 16
.ub   a, 8
.ub   b, 16
.acc  s, 8
.acc  t, 8
.tile w, 1
        RW      tile.w
        MMC.S   ub.a, acc.t, 8          ; reads UB a and accumulates into t: both unwritten
        ACT     acc.t, ub.b, 8
        RHM     host.x, ub.a, 8         ; then a is overwritten whole ...
        MMC.O   ub.a, acc.t, 8          ; ... and so is t
        MMC.O   ub.a, acc.s, 8          ; s: overwritten at its first access
        ACT     acc.s, ub.b + 8, 8
        WHM     ub.b, host.out, 16
        HLT
"""


@pytest.mark.parametrize("width", [1, 2])
def test_rows_read_before_their_overwrite_are_zero_in_every_batch(width):
    """A row read before the RHM or MMC.O that overwrites it whole must still be zeroed
    between batches (dataonly._dirty_spans): against fresh full runs, batch by batch and
    as lanes."""
    from tpuasm import assemble
    program = assemble(READ_BEFORE_OVERWRITE)
    rng = np.random.default_rng(11)
    weights = rng.integers(0, 256, (1, 16, 16)).astype(np.uint8)
    images = [rng.integers(0, 256, (24, 16)).astype(np.uint8) for _ in range(3)]
    wanted = []
    for image in images:
        full = Machine.for_program(program)
        full.load(program, host=image, weights=weights)
        assert full.run(max_cycles=MAX_CYCLES).status == "halted"
        wanted.append(np.asarray(full.host).view(np.uint8).copy())
    assert not wanted[0][8:16].any() and wanted[0][16:].any()   # zeros read, then data
    machine = Machine.for_program(program)
    machine.load(program, host=images[0], weights=weights)
    hosts = np.stack(images)
    assert machine.run_batches(hosts, lanes=width).status == "halted"
    for b, want in enumerate(wanted):
        np.testing.assert_array_equal(hosts[b], want, err_msg=f"batch {b}")

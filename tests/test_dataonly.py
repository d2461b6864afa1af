"""The data path alone (Machine.run_data, machine/dataonly.py) against full pipelined runs:
random programs (valid, faulting, OpenTPU's profile) leave the same memories, registers'
effects and cycle count; a faulting program reports the pipelined run's fault; compiled
models give the same outputs on the data path as on the timed pipeline."""
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
from tpuasm.machine import Machine  # noqa: E402

MAX_CYCLES = 2_000_000


def _both(case):
    weights = case.weights if len(case.weights) else None
    full = Machine.for_program(case.program)
    full.load(case.program, host=case.host, weights=weights)
    want = full.run(max_cycles=MAX_CYCLES)
    data = Machine.for_program(case.program)
    data.load(case.program, host=case.host, weights=weights)
    got = data.run_data()
    return full, want, data, got


def _check(case):
    full, want, data, got = _both(case)
    assert got.status == want.status
    if want.status != "halted":
        assert (got.fault.kind, got.fault.index) == (want.fault.kind, want.fault.index)
        return want.status
    assert got.cycle == want.cycle
    for name in ("ub", "acc", "host"):
        np.testing.assert_array_equal(getattr(data, name), getattr(full, name), err_msg=name)
    return want.status


@pytest.mark.parametrize("profile, fault_share", [("tpu", 0.0), ("tpu", 0.5),
                                                  ("opentpu", 0.0)])
def test_data_path_equals_the_pipeline_on_random_programs(profile, fault_share):
    statuses = []

    @settings(max_examples=70, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(fault_share=fault_share, profile=profile))
    def check(case):
        statuses.append(_check(case))

    check()
    assert statuses.count("halted") >= 25
    if fault_share:
        assert statuses.count("fault") >= 10


def test_later_runs_skip_the_proof_and_keep_its_cycles():
    case = next(iter(_examples()))
    full, want, data, got = _both(case)
    data.load(case.program, host=np.zeros_like(case.host), weights=case.weights)
    again = data.run_data()
    assert again.cycle == want.cycle and data._proven[0] is case.program


def _examples():
    found = []

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(fault_share=0.0))
    def collect(case):
        full = Machine.for_program(case.program)
        full.load(case.program, host=case.host, weights=case.weights if len(case.weights)
                  else None)
        if full.run(max_cycles=MAX_CYCLES).status == "halted" and len(case.weights):
            found.append(case)

    collect()
    return found


@pytest.mark.parametrize("layers, shape", [
    ([("gemm", 20), ("relu",), ("gemm", 6)], (9,)),
    ([("conv", 4, 3, 1, 1), ("relu",), ("maxpool", 2, 2, 0), ("flatten",), ("gemm", 5)],
     (2, 6, 6)),
])
def test_compiled_models_give_the_same_outputs_on_both_paths(tmp_path, layers, shape):
    path = float_models.save(float_models.build(layers, shape), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    calib = rng.normal(0, 1, (24,) + shape).astype(np.float32)
    model = compile_model(path, batch=4, calibration=calib, config={"array_size": 16})
    x = rng.normal(0, 1, (11,) + shape).astype(np.float32)
    data, timed = model.run(x), model.run(x, engine="pipeline")
    for name in timed:
        np.testing.assert_array_equal(data[name], timed[name])


def test_infer_engine_pipeline_from_the_cli_equals_the_data_path(tmp_path):
    from tpuasm.compiler.cli import infer_main
    path = float_models.save(float_models.build([("gemm", 8), ("relu",), ("gemm", 3)], (5,)),
                             tmp_path / "m.onnx")
    x = np.random.default_rng(3).normal(0, 1, (13, 5)).astype(np.float32)
    compile_model(path, batch=4, calibration=x, config={"array_size": 16}).save(tmp_path / "o")
    np.save(tmp_path / "x.npy", x)
    outs = {}
    for engine in ("emulator", "pipeline"):
        y = tmp_path / f"y_{engine}.npy"
        assert infer_main([str(tmp_path / "o"), str(tmp_path / "x.npy"), "-o", str(y), "-q",
                           "--engine", engine]) == 0
        outs[engine] = np.load(y)
    np.testing.assert_array_equal(outs["emulator"], outs["pipeline"])

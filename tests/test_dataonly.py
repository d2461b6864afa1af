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
    # Hypothesis's mix of examples moves with what ran before it in the process (24 halted
    # of 70 after test_lanes.py's random programs, 25 alone): the bar says "many", no more
    assert statuses.count("halted") >= 20
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


def _batch_check(case):
    """Machine.run_batches on three host images (the case's and two random ones) against a
    fresh load and a full pipelined run of each: the same host memory after each batch, and
    the last batch's UB and accumulators."""
    weights = case.weights if len(case.weights) else None
    rng = np.random.default_rng(len(case.host))
    images = [case.host] + [rng.integers(0, 256, case.host.shape).astype(np.uint8)
                            for _ in range(2)]
    wanted = []
    for image in images:
        full = Machine.for_program(case.program)
        full.load(case.program, host=image, weights=weights)
        result = full.run(max_cycles=MAX_CYCLES)
        if result.status != "halted":
            return result.status
        wanted.append(full)
    batched = Machine.for_program(case.program)
    batched.load(case.program, host=case.host, weights=weights)
    batched.run_data()               # a run before the batches: they must not see its state
    hosts = np.stack([np.asarray(i).view(np.uint8) for i in images])
    got = batched.run_batches(hosts)
    assert got.status == "halted" and got.cycle == result.cycle
    for b, full in enumerate(wanted):
        np.testing.assert_array_equal(hosts[b], full.host, err_msg=f"host of batch {b}")
    np.testing.assert_array_equal(batched.ub, wanted[-1].ub)
    np.testing.assert_array_equal(batched.acc, wanted[-1].acc)
    return "halted"


@pytest.mark.parametrize("profile", ["tpu", "opentpu"])
def test_batches_in_one_call_equal_fresh_full_runs_on_random_programs(profile):
    statuses = []

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(fault_share=0.0, profile=profile))
    def check(case):
        statuses.append(_batch_check(case))

    check()
    assert statuses.count("halted") >= 15


def test_run_batches_refuses_images_of_another_shape_and_reports_a_fault():
    case = next(iter(_examples()))
    machine = Machine.for_program(case.program)
    machine.load(case.program, host=case.host, weights=case.weights)
    with pytest.raises(ValueError, match="hosts must be"):
        machine.run_batches(np.zeros((2, len(case.host) + 1, case.host.shape[1]), np.uint8))
    from tpuasm import assemble
    shape = case.program.shape
    bad = assemble("RHM 0, 0, 4\nHLT\n", config={"array_size": shape.array_size,
                                                  "ub_rows": shape.ub_rows,
                                                  "acc_rows": shape.acc_rows})
    machine.load(bad, host=np.zeros((2, case.host.shape[1]), np.uint8))   # 4 rows read
    result = machine.run_batches(np.zeros((3, 2, case.host.shape[1]), np.uint8))
    assert result.status == "fault" and result.fault.index == 0


CACHED = """
.config array_size=32, ub_rows=64, acc_rows=64
    RHM 0, 0, 8
    RW 0, repeat=3
    MMC.SO 0, 0, 8
    MMC.SU 0, 0, 8
    MMC.SO 0, 8, 8
    MMC.O 0, 16, 8
    ACT.R 0, 24, 16
    WHM 24, 8, 16
    HLT
"""


def test_batches_reuse_packed_tiles_and_never_serve_stale_ones():
    """Three tiles switched in and out every batch (the packed-tile cache of run_batches,
    on the int8 kernel at N = 32, where full tiles are too big for the box paths): each
    batch equals a fresh full run, and a second weight image loaded into the same machine
    is packed anew, not served from the cache."""
    from tpuasm import assemble
    program = assemble(CACHED)
    rng = np.random.default_rng(4)
    hosts = rng.integers(0, 256, (4, 24, 32)).astype(np.uint8)
    machine = Machine.for_program(program)
    for weights in (rng.integers(-128, 128, (3, 32, 32)).astype(np.int8),
                    rng.integers(-128, 128, (3, 32, 32)).astype(np.int8)):
        wanted = []
        for host in hosts:
            full = Machine.for_program(program)
            full.load(program, host=host, weights=weights)
            assert full.run().status == "halted"
            wanted.append(full.host.copy())
        machine.load(program, host=hosts[0], weights=weights)
        for _ in range(2):                       # the second call runs on cached packings
            got = hosts.copy()
            assert machine.run_batches(got).status == "halted"
            np.testing.assert_array_equal(got, np.stack(wanted))
        if machine._scratch.options[2]:          # the int8 kernel serves this CPU
            assert machine._scratch.cache8.shape[0] == 3
            assert sorted(machine._scratch.cache_key8[:, 0]) == [0, 1, 2]


# ----------------------------------------------------------------------------- padded tiles
# The data path runs a tile whose non-zero bytes fit a small box on the box alone
# (kernels.py, padded tiles); the pipelined core always multiplies the whole tile, so it is
# the oracle here (and the reference model is the pipelined core's, test_differential.py).


@pytest.mark.parametrize("profile", ["tpu", "opentpu"])
def test_data_path_equals_the_pipeline_on_random_programs_with_padded_tiles(profile):
    statuses = []

    @settings(max_examples=50, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(fault_share=0.0, profile=profile, padded=True))
    def check(case):
        statuses.append(_check(case))
        statuses.append(_batch_check(case))

    check()
    assert statuses.count("halted") >= 40


def test_find_box_is_the_bounding_box_of_the_non_zero_bytes():
    from tpuasm.machine.kernels import _find_box
    rng = np.random.default_rng(7)
    for _ in range(40):
        n = int(rng.choice([8, 16, 32]))
        tile = np.zeros((n, n), np.uint8)
        for _ in range(int(rng.integers(0, 4))):
            tile[rng.integers(0, n), rng.integers(0, n)] = rng.integers(1, 256)
        box = np.zeros(4, np.int64)
        _find_box(tile, box)
        rows, cols = np.nonzero(tile)
        want = (0, 0, 0, 0) if len(rows) == 0 else \
            (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1)
        assert tuple(box) == want


BOXES = """
.config array_size=64, ub_rows=128, acc_rows=96
    RHM 0, 0, 40
    RW 4
    RW 0, repeat=3
    MMC.SO{u} 0, 0, 40
    {plain}O 1, 40, 40
    MMC.SO{u} 0, 0, 40
    MMC.SO{u} 1, 40, 40
    ACT 40, 50, 40
    WHM 50, 0, 40
    RW 3, repeat=3
    MMC.S{u} 0, 0, 40
    MMC.SO{u} 2, 40, 40
    {plain} 3, 0, 40
    MMC.S{u} 0, 40, 40
    MMC.SO{u} 1, 0, 40
    ACT.R 0, 50, 40
    WHM 50, 40, 40
    ACT 40, 0, 40
    WHM 0, 80, 40
    HLT
"""


@pytest.mark.parametrize("flags", ["", "U", "W", "UW"])
def test_padded_tiles_on_every_box_path_equal_full_runs(flags):
    """At N = 64 (the int8 kernel's size when the CPU has one) tiles with boxes empty, 1 x 1,
    at the limit of the direct loops, past it (the int8 kernel on a 32-wide corner tile),
    offset and full, switched in turn, overwriting rows a full tile wrote and accumulating:
    run_batches and run_data equal fresh pipelined runs on every image."""
    from tpuasm import assemble
    from tpuasm.machine import kernels as K
    program = assemble(BOXES.format(u=flags, plain=f"MMC.{flags}" if flags else "MMC")
                       .replace("MMCO", "MMC.O"))
    n = 64
    assert K.box_path(16, 16, n, True) == K.BOX_DIRECT
    assert K.box_path(18, 16, n, True) == K.BOX_COMPACT
    assert K.box_path(30, 20, n, True) == K.BOX_COMPACT
    assert K.box_path(64, 1, n, True) == K.box_path(64, 64, n, True) == K.BOX_FULL
    rng = np.random.default_rng(11)
    weights = np.zeros((6, n, n), np.int8)
    full = rng.integers(-128, 128, (6, n, n)).astype(np.int8)
    weights[1, 5, 9] = full[1, 5, 9] | 1                          # 1 x 1
    weights[2, 3:19, 20:36] = full[2, 3:19, 20:36]                # 16 x 16: direct
    weights[2, 3, 20] = weights[2, 18, 35] = 77                   # (corners keep the box)
    weights[3, 20:38, 40:56] = full[3, 20:38, 40:56]              # 18 x 16: a corner tile
    weights[3, 20, 40] = weights[3, 37, 55] = -5
    weights[4, :40] = full[4, :40]     # 40 x 64: the full tile's kernel, rows past 48 skipped
    weights[5, 34:64, 44:64] = full[5, 34:64, 44:64]              # 30 x 20 at the edge
    weights[5, 34, 44] = weights[5, 63, 63] = 3
    hosts = rng.integers(0, 256, (3, 120, n)).astype(np.uint8)
    wanted = []
    for host in hosts:
        pipelined = Machine.for_program(program)
        pipelined.load(program, host=host, weights=weights)
        assert pipelined.run().status == "halted"
        wanted.append(pipelined.host.copy())
    machine = Machine.for_program(program)
    machine.load(program, host=hosts[0], weights=weights)
    got = hosts.copy()
    assert machine.run_batches(got).status == "halted"
    np.testing.assert_array_equal(got, np.stack(wanted))
    machine.load(program, host=hosts[1], weights=weights)
    assert machine.run_data().status == "halted"
    np.testing.assert_array_equal(machine.host, wanted[1])
    # another image in the same machine: boxes are found again, not served stale
    weights[1] = full[1]
    machine.load(program, host=hosts[2], weights=weights)
    again = hosts[2:].copy()
    assert machine.run_batches(again).status == "halted"
    pipelined = Machine.for_program(program)
    pipelined.load(program, host=hosts[2], weights=weights)
    assert pipelined.run().status == "halted"
    np.testing.assert_array_equal(again[0], pipelined.host)

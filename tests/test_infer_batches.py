"""CompiledModel.run's grouped data path (several batches per Machine.run_batches call, host
parts in one onnxruntime call where their rows are independent) against the timed pipeline
run batch by batch: the same outputs, byte for byte, on compiled models of every layer kind
the back end places on the TPU, split into several groups and into one."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import float_models  # noqa: E402
from tpuasm.compiler.pipeline import compile_model  # noqa: E402
from tpuasm.compiler.runtime import steps as steps_module  # noqa: E402
from tpuasm.compiler.runtime.steps import HostStep  # noqa: E402

MODELS = {
    "mlp": ([("gemm", 20), ("relu",), ("gemm", 6)], (9,)),
    "mlp-softmax": ([("gemm", 12), ("sigmoid",), ("gemm", 5), ("softmax",)], (7,)),
    "cnn": ([("conv", 4, 3, 1, 1), ("relu",), ("maxpool", 2, 2, 0), ("flatten",),
             ("gemm", 5)], (2, 6, 6)),
    "cnn-avgpool": ([("conv", 6, 3, 2, 1), ("clip", 0, 6), ("avgpool", 2, 2, 0, 1),
                     ("conv", 3, 1, 1, 0), ("gap",), ("flatten",), ("gemm", 4)], (3, 8, 8)),
    "reshape-tanh": ([("reshape", [12]), ("matmul", 8), ("tanh",), ("gemm", 3)], (3, 4)),
}


def _compiled(tmp_path, name):
    layers, shape = MODELS[name]
    path = float_models.save(float_models.build(layers, shape), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    calib = rng.normal(0, 1, (24,) + shape).astype(np.float32)
    return compile_model(path, batch=4, calibration=calib, config={"array_size": 16}), shape


@pytest.mark.parametrize("name", sorted(MODELS))
def test_grouped_runs_equal_the_pipeline_batch_by_batch(tmp_path, monkeypatch, name):
    model, shape = _compiled(tmp_path, name)
    x = np.random.default_rng(1).normal(0, 1, (23,) + shape).astype(np.float32)
    timed = model.run(x, engine="pipeline")
    assert steps_module.group_size(model.steps, model.batch, model.inputs, model.outputs,
                                   len(x), "emulator") == 6       # all 6 batches at once
    whole = model.run(x)
    monkeypatch.setattr(steps_module, "GROUP_BYTES", 1)           # one batch per call
    single = model.run(x)
    monkeypatch.setattr(steps_module, "GROUP_BYTES",
                        2 * sum(s.program.host_rows * 16 for s in model.steps
                                if not isinstance(s, HostStep)))  # groups of 2 batches
    pairs = model.run(x)
    for name_ in timed:
        assert whole[name_].shape[0] == len(x)
        for got in (whole, single, pairs):
            np.testing.assert_array_equal(got[name_], timed[name_])


def test_host_parts_take_all_batches_in_one_call_when_row_wise(tmp_path):
    model, shape = _compiled(tmp_path, "mlp-softmax")
    x = np.random.default_rng(2).normal(0, 1, (16,) + shape).astype(np.float32)
    hosts = [s for s in model.steps if isinstance(s, HostStep)]
    calls = []
    for h in hosts:
        original = h.runner.run

        def counted(feeds, original=original):
            calls.append(1)
            return original(feeds)
        h.runner.run = counted
    model.run(x)                      # (the first answer is checked batch by batch)
    calls.clear()
    y = model.run(x)
    # the input's QuantizeLinear and the head (DequantizeLinear, Softmax) are row-wise
    assert all(h.runner._rows and h.runner._rows_checked for h in hosts) and len(hosts) == 2
    assert calls == []
    for name, want in model.run(x, engine="pipeline").items():
        np.testing.assert_array_equal(y[name], want)


def test_a_host_part_that_mixes_rows_stays_batch_by_batch(tmp_path):
    """ArgMax over the batch axis is not row-wise: never given all batches at once."""
    from tpuasm.compiler.runtime.host import _row_wise
    import onnx.helper as oh
    assert not _row_wise(oh.make_node("ArgMax", ["a"], ["b"]))          # axis 0 by default
    assert _row_wise(oh.make_node("ArgMax", ["a"], ["b"], axis=1))
    assert not _row_wise(oh.make_node("Softmax", ["a"], ["b"], axis=0))
    assert not _row_wise(oh.make_node("MatMul", ["a", "w"], ["b"]))


def test_a_part_whose_free_batch_session_fails_falls_back_to_batch_by_batch():
    """QuantizeLinear per axis 0 (a scale per row of the fixed batch) passes the operator
    check but cannot take 8 rows: the first grouped call answers batch by batch, and so do
    the later ones."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from tpuasm.compiler.runtime.host import HostRunner
    scale = numpy_helper.from_array(np.array([0.5, 0.25, 1.0, 2.0], np.float32), "s")
    zero = numpy_helper.from_array(np.zeros(4, np.int8), "z")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0)], "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [4, 3])], [scale, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    runner = HostRunner(model.SerializeToString(), ["x"], ["y"], "host0")
    x = np.random.default_rng(0).normal(0, 3, (8, 3)).astype(np.float32)
    want = np.concatenate([runner.run({"x": x[:4]})["y"], runner.run({"x": x[4:]})["y"]])
    assert runner.batch_major(4)
    for _ in range(2):
        np.testing.assert_array_equal(runner.run_rows({"x": x}, 2, 4)["y"], want)
    assert runner._rows is False
    assert onnx.load_from_string(runner.model_bytes).graph.input[0].type.tensor_type \
        .shape.dim[0].dim_value == 4                       # the part itself is untouched


def test_progress_is_reported_once_per_group(tmp_path, monkeypatch):
    model, shape = _compiled(tmp_path, "mlp")
    x = np.random.default_rng(3).normal(0, 1, (23,) + shape).astype(np.float32)
    monkeypatch.setattr(steps_module, "GROUP_BATCHES", 4)
    seen = []
    y = model.run(x, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(0, 23), (16, 23), (23, 23)]
    for name, want in model.run(x, engine="pipeline").items():
        np.testing.assert_array_equal(y[name], want)


def _reshape_part(shape):
    from onnx import TensorProto, helper, numpy_helper
    from tpuasm.compiler.runtime.host import HostRunner
    target = numpy_helper.from_array(np.array(shape, np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"]),
         helper.make_node("Relu", ["y"], ["z"])], "r",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                       [4, 6] if shape[0] != 2 else [2, 12])], [target])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return HostRunner(model.SerializeToString(), ["x"], ["z"], "host0")


@pytest.mark.parametrize("shape, one_call", [((4, 6), True), ((-1, 6), True),
                                             ((2, 12), False)])
def test_a_reshape_led_by_the_batch_takes_all_batches_in_one_call(shape, one_call):
    """A Reshape to (batch, ...) or (-1, ...) keeps rows apart (the free copy's shape
    starts with 0: the input's rows); one to (2, 12) from a batch of 4 mixes them."""
    runner = _reshape_part(shape)
    x = np.random.default_rng(5).normal(0, 1, (12, 2, 3)).astype(np.float32)
    want = np.concatenate([runner.run({"x": x[b * 4:(b + 1) * 4]})["z"] for b in range(3)])
    if shape[0] == 2:                  # not batch-major: the runtime never groups it
        assert not runner.batch_major(4)
        return
    for _ in range(2):
        np.testing.assert_array_equal(runner.run_rows({"x": x}, 3, 4)["z"], want)
    assert bool(runner._rows) is one_call and runner._rows_checked

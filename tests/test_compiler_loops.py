"""A Loop of a trip count known when compiling, unrolled (front/loops.py): the form tf2onnx
gives a Keras GRU (a step counter and the time carried, the weights carried too, every step's
state a scan output, the condition `counter < M and time < T` computed in the body).
Oracles: onnxruntime on the float model (the Loop as written) and on the compiled model's
own QDQ model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.loops import MAX_TRIPS, unroll_constant_loops
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.ort import session

STEPS, FEATURES, HIDDEN = 6, 8, 12


def _body(data_dependent: bool) -> onnx.GraphProto:
    """counter, cond, time, h, W, R -> cond', time + 1, h', W, R, scan h'."""
    f = lambda name, shape: helper.make_tensor_value_info(name, T.FLOAT, shape)  # noqa: E731
    i = lambda name: helper.make_tensor_value_info(name, T.INT64, [])  # noqa: E731
    inputs = [i("counter"), helper.make_tensor_value_info("cond_in", T.BOOL, []), i("time"),
              f("h", ["N", HIDDEN]), f("W", [FEATURES, HIDDEN]), f("R", [HIDDEN, HIDDEN])]
    one = numpy_helper.from_array(np.asarray(1, np.int64), "one")
    limit = numpy_helper.from_array(np.asarray(STEPS, np.int64), "limit")
    threshold = numpy_helper.from_array(np.asarray(1e9, np.float32), "threshold")
    nodes = [
        helper.make_node("Gather", ["xs", "time"], ["x_t"], axis=0),      # outer: (T, N, F)
        helper.make_node("MatMul", ["x_t", "W"], ["xw"]),
        helper.make_node("MatMul", ["h", "R"], ["hr"]),
        helper.make_node("Add", ["xw", "hr"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_next"]),
        helper.make_node("Add", ["time", "one"], ["time_next"]),
        helper.make_node("Less", ["counter", "limit"], ["more"]),
        helper.make_node("Less", ["time_next", "limit"], ["in_time"]),
    ]
    if data_dependent:          # a while loop on the data: not known when compiling
        nodes += [helper.make_node("ReduceSum", ["h_next"], ["total"], keepdims=0),
                  helper.make_node("Less", ["total", "threshold"], ["small"]),
                  helper.make_node("And", ["more", "small"], ["cond_out"])]
    else:
        nodes.append(helper.make_node("And", ["more", "in_time"], ["cond_out"]))
    outputs = [helper.make_tensor_value_info("cond_out", T.BOOL, []), i("time_next"),
               f("h_next", ["N", HIDDEN]), f("W", [FEATURES, HIDDEN]),
               f("R", [HIDDEN, HIDDEN]), f("h_next_scan", ["N", HIDDEN])]
    nodes.append(helper.make_node("Identity", ["h_next"], ["h_next_scan"]))
    return helper.make_graph(nodes, "body", inputs, outputs, [one, limit, threshold])


def _loop_rnn(rng, data_dependent=False, trips=STEPS) -> onnx.ModelProto:
    """x (N, T, F) -> Transpose -> Loop (the RNN) -> the last state -> MatMul -> y (N, 4)."""
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("W0", rng.normal(0, 0.4, (FEATURES, HIDDEN))), ("R0", rng.normal(0, 0.3, (HIDDEN,
                                                                                   HIDDEN))),
        ("head", rng.normal(0, 0.4, (HIDDEN, 4)))]]
    inits += [numpy_helper.from_array(np.asarray(trips, np.int64), "M"),
              numpy_helper.from_array(np.asarray(True), "go"),
              numpy_helper.from_array(np.asarray(0, np.int64), "t0"),
              numpy_helper.from_array(np.asarray([-1], np.int64), "last")]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xs"], name="time_major", perm=[1, 0, 2]),
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Slice", ["shape", "t0_1", "one_1"], ["n"], name="batch_of"),
        helper.make_node("Concat", ["n", "hidden"], ["h_shape"], name="h_shape", axis=0),
        helper.make_node("ConstantOfShape", ["h_shape"], ["h0"], name="zeros",
                         value=numpy_helper.from_array(np.zeros(1, np.float32))),
        helper.make_node("Loop", ["M", "go", "t0", "h0", "W0", "R0"],
                         ["t_end", "h_end", "W_end", "R_end", "hs"], name="while_loop",
                         body=_body(data_dependent)),
        helper.make_node("Gather", ["hs", "last"], ["h_last3"], name="last_step", axis=0),
        helper.make_node("Squeeze", ["h_last3", "t0_1"], ["h_last"], name="squeeze"),
        helper.make_node("MatMul", ["h_last", "head"], ["y"], name="classifier"),
    ]
    inits += [numpy_helper.from_array(np.asarray([0], np.int64), "t0_1"),
              numpy_helper.from_array(np.asarray([1], np.int64), "one_1"),
              numpy_helper.from_array(np.asarray([HIDDEN], np.int64), "hidden")]
    model = helper.make_model(helper.make_graph(
        nodes, "loop_rnn", [helper.make_tensor_value_info("x", T.FLOAT, ["N", STEPS, FEATURES])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _compile(tmp_path, model, x, **options):
    path = tmp_path / "loop.onnx"
    onnx.save(model, str(path))
    return tpu_compile(str(path), calibration=x, batch=16, **options)


def test_a_loop_of_known_trips_is_unrolled_onto_the_tpu(tmp_path):
    rng = np.random.default_rng(0)
    model = _loop_rnn(rng)
    x = rng.normal(0, 1, (48, STEPS, FEATURES)).astype(np.float32)
    # 8 bits, identical to onnxruntime (the check would make the recurrence int16, which
    # onnxruntime computes in float32: tests/test_compiler_widecell.py)
    compiled = _compile(tmp_path, model, x, calibration_method="minmax")
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["while_loop"].where == "TPU" and rows["classifier"].where == "TPU"
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    (want,) = session(model).run(None, {"x": x})
    got = compiled.run(x)["y"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    qdq = session(onnx.load(str(compiled.reference_model)))
    same = np.concatenate([qdq.run(None, {"x": x[i:i + 16]})[0] for i in range(0, 48, 16)])
    np.testing.assert_array_equal(got, same)


def test_unrolling_keeps_the_loop_s_function():
    """The unrolled graph against onnxruntime on the Loop, float, every output."""
    rng = np.random.default_rng(1)
    model = _loop_rnn(rng)
    del model.graph.node[1:5]                 # h0 given whole: no shape to fold first
    h0 = numpy_helper.from_array(np.zeros((3, HIDDEN), np.float32), "h0")
    model.graph.initializer.append(h0)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    x = rng.normal(0, 1, (3, STEPS, FEATURES)).astype(np.float32)
    (want,) = session(model).run(None, {"x": x})
    unrolled = onnx.ModelProto()
    unrolled.CopyFrom(model)
    constants = {t.name: numpy_helper.to_array(t) for t in unrolled.graph.initializer}
    assert unroll_constant_loops(unrolled, constants.get, Provenance.of(unrolled)) == 1
    ops = [n.op_type for n in unrolled.graph.node]
    assert "Loop" not in ops and ops.count("MatMul") == 2 * STEPS + 1
    onnx.checker.check_model(unrolled)
    (got,) = session(unrolled).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("why", ["data", "trips"])
def test_a_loop_that_cannot_be_unrolled_stays_on_the_host(tmp_path, why):
    """A condition on the data (a while loop until the state is small) or a trip count
    beyond MAX_TRIPS: the Loop stays as written, on the host, and the model compiles."""
    rng = np.random.default_rng(2)
    model = _loop_rnn(rng, data_dependent=why == "data",
                      trips=STEPS if why == "data" else MAX_TRIPS + 1)
    x = rng.normal(0, 1, (32, STEPS, FEATURES)).astype(np.float32)
    compiled = _compile(tmp_path, model, x)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["while_loop"].where == "host"
    (want,) = session(model).run(None, {"x": x})
    got = compiled.run(x)["y"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()

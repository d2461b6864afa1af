"""What other exporters write, taken as shipped (found compiling PaddleOCR's models, which
paddle2onnx exports): weights as Constant nodes, opset 11-12 with per-channel weights, a
weight channel trained to ~1e-35, dimensions of -1, a batch that reaches the output only
through Shape -> Cast -> Concat -> Reshape.  Each model is built here with onnx.helper;
onnxruntime on the float model and on the same QDQ model are the oracles."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.ort import session


def _const(name: str, array: np.ndarray):
    return helper.make_node("Constant", [], [name], name=name + "_const",
                            value=numpy_helper.from_array(array, name + "_value"))


def _paddle_like(rng, opset: int, tiny_channel: bool = False) -> onnx.ModelProto:
    """Conv (weights from Constant nodes) -> Relu -> Reshape to (N, -1) through a shape
    computed from the input -> Gemm; the output's batch dimension written as -1."""
    w = rng.normal(0, 0.3, (6, 3, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 6).astype(np.float32)
    if tiny_channel:                  # a channel training switched off
        w[2], b[2] = 1e-35, 1e-36
    fc = rng.normal(0, 0.1, (6 * 4 * 4, 5)).astype(np.float32)
    nodes = [
        _const("w", w), _const("b", b), _const("fc", fc),
        _const("start", np.array([0], np.int64)), _const("end", np.array([1], np.int64)),
        _const("rest", np.array([-1], np.int64)),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Cast", ["s"], ["s64"], name="cast", to=T.INT64),
        helper.make_node("Slice", ["s64", "start", "end"], ["n"], name="batch_of"),
        helper.make_node("Concat", ["n", "rest"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["r", "target"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc"], ["y"], name="fc_gemm"),
    ]
    x = helper.make_tensor_value_info("x", T.FLOAT, [-1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", T.FLOAT, [-1, 5])
    model = helper.make_model(helper.make_graph(nodes, "paddle_like", [x], [y]),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _compile(tmp_path, model, calib, **options):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return tpu_compile(str(path), calibration=calib, config={"array_size": 16}, **options)


def _check(compiled, model, x):
    got = compiled.run(x)["y"]
    (want,) = session(model).run(None, {"x": x})
    assert got.shape == want.shape == (len(x), 5)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    # the QDQ model has the batch folded into its constants: fed a whole padded batch
    padded = np.concatenate([x, np.zeros((compiled.batch - len(x),) + x.shape[1:], x.dtype)])
    (same_qdq,) = session(onnx.load(str(compiled.reference_model))).run(None, {"x": padded})
    np.testing.assert_array_equal(got, same_qdq[:len(x)])


def test_constant_node_weights_at_opset_11_go_to_the_tpu(tmp_path):
    rng = np.random.default_rng(0)
    model = _paddle_like(rng, opset=11)
    calib = rng.normal(0, 1, (24, 3, 8, 8)).astype(np.float32)
    compiled = _compile(tmp_path, model, calib, batch=8)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["conv"].where == rows["fc_gemm"].where == "TPU"
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    assert "initializer" in rows["w_const"].reason
    # per-channel weights were kept: the QDQ model was lifted to opset 13 to hold them
    qdq = onnx.load(str(compiled.reference_model))
    assert any(a.name == "axis" for n in qdq.graph.node if n.op_type == "DequantizeLinear"
               for a in n.attribute)
    _check(compiled, model, calib[:8])


def test_fewer_rows_than_the_batch_come_back_as_many(tmp_path):
    """The output's batch dimension is -1 and reaches it only through a computed Reshape
    target: 5 rows in, 5 rows out (the padded batch cut off)."""
    rng = np.random.default_rng(1)
    model = _paddle_like(rng, opset=13)
    calib = rng.normal(0, 1, (5, 3, 8, 8)).astype(np.float32)
    compiled = _compile(tmp_path, model, calib, batch=8)
    _check(compiled, model, calib)


def test_a_weight_channel_of_zeros_compiles_as_zeros(tmp_path):
    """onnxruntime gives the 1e-35 channel a scale near 1e-37 and its bias a subnormal one,
    which no requantization multiplier expresses: the QDQ model holds it as the zeros it
    computes (scale 1), and the TPU matches onnxruntime on that model exactly."""
    rng = np.random.default_rng(2)
    model = _paddle_like(rng, opset=13, tiny_channel=True)
    calib = rng.normal(0, 1, (16, 3, 8, 8)).astype(np.float32)
    compiled = _compile(tmp_path, model, calib, batch=8)
    qdq = onnx.load(str(compiled.reference_model))
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    conv = next(n for n in qdq.graph.node if n.op_type == "Conv")
    producer = {o: n for n in qdq.graph.node for o in n.output}
    w_dq = producer[conv.input[1]]
    assert inits[w_dq.input[1]][2] == 1.0 and not inits[w_dq.input[0]][2].any()
    b_dq = producer[conv.input[2]]
    assert inits[b_dq.input[1]].min() > np.finfo(np.float32).tiny
    _check(compiled, model, calib[:8])


def _affine_model(rng, scale, shift, op="Conv"):
    """Conv (or Gemm) -> Mul by `scale` -> Add `shift` -> Relu: PaddleOCR's learnable affine
    block after every Conv."""
    if op == "Conv":
        w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
        x = helper.make_tensor_value_info("x", T.FLOAT, ["N", 3, 6, 6])
        first = helper.make_node("Conv", ["x", "w"], ["c"], name="layer", pads=[1, 1, 1, 1])
    else:
        w = rng.normal(0, 0.3, (12, 4)).astype(np.float32)
        x = helper.make_tensor_value_info("x", T.FLOAT, ["N", 12])
        first = helper.make_node("Gemm", ["x", "w"], ["c"], name="layer")
    nodes = [first,
             helper.make_node("Mul", ["scale", "c"], ["m"], name="affine_scale"),
             helper.make_node("Add", ["m", "shift"], ["a"], name="affine_shift"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale, "scale"),
             numpy_helper.from_array(shift, "shift")]
    y = helper.make_tensor_value_info("y", T.FLOAT, ["N", 4, 6, 6] if op == "Conv" else ["N", 4])
    return helper.make_model(helper.make_graph(nodes, "affine", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 13)])


def test_a_constant_affine_after_a_conv_is_folded_into_it(tmp_path):
    rng = np.random.default_rng(3)
    model = _affine_model(rng, np.array([1.7], np.float32), np.array([-0.2], np.float32))
    calib = rng.normal(0, 1, (16, 3, 6, 6)).astype(np.float32)
    compiled = _compile(tmp_path, model, calib, batch=8)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["affine_scale"].reason == rows["affine_shift"].reason == \
        "folded into Conv 'layer'"
    x = calib[:8]
    got = compiled.run(x)["y"]
    (want,) = session(model).run(None, {"x": x})
    assert np.abs(got - want).max() < 0.03 * np.abs(want).max()
    (same_qdq,) = session(onnx.load(str(compiled.reference_model))).run(None, {"x": x})
    np.testing.assert_array_equal(got, same_qdq)


def test_affine_folding_keeps_the_function_and_refuses_other_broadcasts():
    from tpuasm.compiler.front.prepare import fold_constant_affines
    from tpuasm.compiler.front.provenance import Provenance
    rng = np.random.default_rng(4)
    cases = [   # op, scale, shift, x, folded
        ("Conv", rng.normal(1, 0.3, (1, 4, 1, 1)), rng.normal(0, 1, (4, 1, 1)), (2, 3, 6, 6), 2),
        ("Gemm", rng.normal(1, 0.3, (1, 4)), rng.normal(0, 1, (4,)), (5, 12), 2),
        # a (4,) constant broadcasts along the Conv's width, not its channels: stays
        ("Conv", np.full(6, 2.0), rng.normal(0, 1, (1,)), (2, 3, 6, 6), 0),
    ]
    for op, scale, shift, shape, folded in cases:
        model = _affine_model(rng, scale.astype(np.float32), shift.astype(np.float32), op)
        x = rng.normal(0, 1, shape).astype(np.float32)
        (want,) = session(model).run(None, {"x": x})
        assert fold_constant_affines(model, Provenance.of(model)) == folded
        (got,) = session(model).run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_model_the_converter_cannot_lift_says_to_use_per_tensor(tmp_path, monkeypatch):
    """Per-channel weights need opset 13; when onnx's converter cannot lift the model, one
    clear error names the way out (and --per-tensor, which needs no lift, compiles it)."""
    import tpuasm.compiler.front.reader as reader
    from tpuasm.compiler.errors import CompileError
    rng = np.random.default_rng(6)
    model = _paddle_like(rng, opset=11)
    calib = rng.normal(0, 1, (8, 3, 8, 8)).astype(np.float32)

    def refuses(model, opset):
        raise RuntimeError("no adapter for Reshape")
    monkeypatch.setattr(reader, "converted_to", refuses)
    try:
        _compile(tmp_path, model, calib, batch=8)
    except CompileError as e:
        assert "per-channel weights need opset 13" in str(e) and "--per-tensor" in str(e)
        assert "no adapter for Reshape" in str(e)
    else:
        raise AssertionError("compiled without the opset it needs")
    compiled = _compile(tmp_path, model, calib, batch=8, per_channel=False)
    _check(compiled, model, calib)


def _sequence_first(rng, declared: list) -> onnx.ModelProto:
    """x (1, 4), the batch fixed at 1 by its exporter -> Gemm (1, 6) -> Reshape (1, 3, 2) ->
    Transpose: a sequence-first output (3, 1, 2) that the model declares as `declared`
    (ddddocr's PyTorch export declares (1, seqlen) for its (T, 1, classes) output)."""
    w = rng.normal(0, 0.5, (4, 6)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], name="gemm"),
             helper.make_node("Reshape", ["g", "shape"], ["r"], name="reshape"),
             helper.make_node("Transpose", ["r"], ["y"], name="time_first", perm=[1, 0, 2])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, declared)],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([-1, 3, 2], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_the_float_reference_joins_a_sequence_first_output_on_its_batch_axis():
    """The check's onnxruntime run of a model whose batch is fixed at 1 goes row by row; a
    (T, 1, classes) output is joined along axis 1, not cut to its first time step."""
    from tpuasm.compiler.runtime.validate import run_float
    model = _sequence_first(np.random.default_rng(20), [3, 1, 2])
    x = np.random.default_rng(21).normal(0, 1, (5, 4)).astype(np.float32)
    rows = [session(model).run(None, {"x": x[i:i + 1]})[0] for i in range(5)]
    want = np.concatenate(rows, axis=1)
    for axes in (None, {"y": 1}):
        got = run_float(model, {"x": x}, ["y"], out_axes=axes)["y"]
        assert got.shape == (3, 5, 2)
        np.testing.assert_array_equal(got, want)


def test_a_declared_output_shape_the_graph_does_not_compute_is_replaced(tmp_path):
    """onnxruntime only warns when a model declares an output shape its graph does not
    compute; the compile takes the computed one instead of refusing the model."""
    model = _sequence_first(np.random.default_rng(22), [1, "seqlen"])
    x = np.random.default_rng(23).normal(0, 1, (8, 4)).astype(np.float32)
    compiled = _compile(tmp_path, model, x, batch_axes={"x": 0})
    row = {r.node: r for r in compiled.report.rows}["gemm"]
    assert row.where == "TPU", row.reason
    got = compiled.run(x[:1])["y"]
    want = session(model).run(None, {"x": x[:1]})[0]
    assert got.shape == want.shape == (3, 1, 2)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_a_batch_fixed_at_one_beside_a_dynamic_dimension_is_read_from_the_data(tmp_path):
    """(1, 3, W): the exporter fixed the batch at 1 and left the width dynamic; rows of
    calibration data (8, 3, 5) only fit a batch on axis 0 with W = 5, as a user means it."""
    rng = np.random.default_rng(24)
    w = rng.normal(0, 0.5, (4, 3, 1)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, "width"])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, "width"])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.normal(0, 1, (8, 3, 5)).astype(np.float32)
    compiled = _compile(tmp_path, model, x)
    assert [i.batch_axis for i in compiled.inputs] == [0]
    got = compiled.run(x)["y"]
    want = np.concatenate([session(model).run(None, {"x": x[i:i + 1]})[0] for i in range(8)])
    assert got.shape == want.shape == (8, 4, 5)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_an_lstm_s_initial_state_from_its_weights_compiles_to_a_loadable_outdir(tmp_path):
    """ddddocr's bidirectional LSTM starts from an initial state made from constants (zeros
    of ConstantOfShape): the first step's state Gemm multiplies constants.  It runs on the
    host (a TPU program would read an input nothing writes, and the OUTDIR would be
    refused); the input Gemms stay on the TPU and the answers are kept."""
    rng = np.random.default_rng(25)
    hidden, inputs, steps = 5, 4, 3
    w = rng.normal(0, 0.5, (1, 4 * hidden, inputs)).astype(np.float32)
    r = rng.normal(0, 0.5, (1, 4 * hidden, hidden)).astype(np.float32)
    nodes = [helper.make_node("ConstantOfShape", ["state_shape"], ["h0"], name="zeros",
                              value=numpy_helper.from_array(np.array([0.25], np.float32))),
             helper.make_node("LSTM", ["x", "w", "r", "", "", "h0", "h0"], ["y"], name="lstm",
                              hidden_size=hidden)]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(r, "r"),
             numpy_helper.from_array(np.array([1, 1, hidden], np.int64), "state_shape")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, [steps, 1, inputs])],
                              [helper.make_tensor_value_info("y", T.FLOAT,
                                                             [steps, 1, 1, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.normal(0, 1, (steps, 1, inputs)).astype(np.float32)
    compiled = _compile(tmp_path, model, x)
    compiled.save(tmp_path / "out")                     # its manifest is a valid one
    reasons = " ".join(r.reason for r in compiled.report.rows)
    assert compiled.report.tpu_macs > 0
    got = compiled.run(x)["y"]
    want = session(model).run(None, {"x": x})[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max(), reasons


def test_an_output_given_the_wrong_batch_axis_is_joined_on_the_axis_its_rows_are_on(tmp_path):
    """An output whose shape inference lost (ddddocr's dynamically quantized LSTM, a contrib
    operator) gets batch axis 0 by convention; its (T, 1, classes) values show the rows on
    axis 1, and the runs are joined there, not cut to their first time steps."""
    from dataclasses import replace
    model = _sequence_first(np.random.default_rng(26), [3, 1, 2])
    x = np.random.default_rng(27).normal(0, 1, (8, 4)).astype(np.float32)
    compiled = _compile(tmp_path, model, x, batch_axes={"x": 0})
    assert compiled.outputs[0].batch_axis == 1
    compiled.outputs[0] = replace(compiled.outputs[0], batch_axis=0)     # as if lost
    got = compiled.run(x[:5])["y"]
    want = np.concatenate([session(model).run(None, {"x": x[i:i + 1]})[0] for i in range(5)],
                          axis=1)
    assert got.shape == want.shape == (3, 5, 2)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_a_matrix_op_after_a_contrib_operator_is_quantized_and_on_the_tpu(tmp_path):
    """onnx does not know a contrib operator's output type, and onnxruntime's quantizer
    leaves a node whose input has no type in float: the MatMul after ddddocr's contrib
    DynamicQuantizeLSTM stayed on the host.  The type is learned by running the operator
    alone, and the MatMul runs on the TPU."""
    rng = np.random.default_rng(28)
    nodes = [helper.make_node("QuickGelu", ["x"], ["g"], name="contrib",
                              domain="com.microsoft", alpha=1.702),
             helper.make_node("MatMul", ["g", "w"], ["y"], name="matmul")]
    w = rng.normal(0, 0.3, (8, 3)).astype(np.float32)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["N", 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    x = rng.normal(0, 1, (16, 8)).astype(np.float32)
    compiled = _compile(tmp_path, model, x, batch=16)
    row = {r.node: r for r in compiled.report.rows}["matmul"]
    assert row.where == "TPU", row.reason
    want = session(model).run(None, {"x": x})[0]
    got = compiled.run(x)["y"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def _caffe2_residual(rng) -> onnx.ModelProto:
    """A ResNet block as Caffe2 exported it (onnx's bundled 'light' ResNet-50): IR 3 with
    every initializer also listed as a graph input, and the residual connection a Sum."""
    w1 = rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (4, 4, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Sum", ["c2", "x"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["y"], name="relu2"),
    ]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 6])] + \
        [helper.make_tensor_value_info(t.name, T.FLOAT, list(t.dims)) for t in inits]
    y = helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])
    model = helper.make_model(helper.make_graph(nodes, "caffe2", inputs, [y], inits),
                              opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    return model


def test_a_residual_written_as_sum_runs_on_the_tpu_as_an_add(tmp_path):
    rng = np.random.default_rng(11)
    model = _caffe2_residual(rng)
    calib = rng.normal(0, 1, (16, 4, 6, 6)).astype(np.float32)
    compiled = _compile(tmp_path, model, calib)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["residual"].op_type == "Sum" and rows["residual"].where == "TPU"
    assert len(compiled.report.segments) == 1       # no host round trip for the residual
    x = calib[:1]
    got = compiled.run(x)["y"]
    (want,) = session(model).run(None, {"x": x})
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    (same_qdq,) = session(onnx.load(str(compiled.reference_model))).run(None, {"x": x})
    np.testing.assert_array_equal(got, same_qdq)


def test_a_sum_of_three_and_of_one_keep_their_values():
    from tpuasm.compiler.front.prepare import sums_as_additions
    from tpuasm.compiler.front.provenance import Provenance
    shape = [2, 3]
    nodes = [helper.make_node("Sum", ["a", "b", "c"], ["abc"], name="three"),
             helper.make_node("Sum", ["abc"], ["y"], name="one")]
    model = helper.make_model(helper.make_graph(
        nodes, "sums", [helper.make_tensor_value_info(n, T.FLOAT, shape) for n in "abc"],
        [helper.make_tensor_value_info("y", T.FLOAT, shape)]),
        opset_imports=[helper.make_opsetid("", 13)])
    feeds = {n: np.random.default_rng(i).normal(size=shape).astype(np.float32)
             for i, n in enumerate("abc")}
    (want,) = session(model).run(None, feeds)
    assert sums_as_additions(model, Provenance.of(model)) == 2
    assert [n.op_type for n in model.graph.node] == ["Add", "Add", "Identity"]
    onnx.checker.check_model(model)
    (got,) = session(model).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_batch_norm_no_conv_takes_runs_on_the_tpu_as_a_per_channel_affine(tmp_path):
    """DenseNet / pre-activation ResNet form: Conv -> MaxPool -> BatchNormalization -> Relu
    -> Conv; the BN has no Conv right before it to fold into."""
    rng = np.random.default_rng(12)
    c = 4
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w1", rng.normal(0, 0.3, (c, 3, 3, 3))), ("w2", rng.normal(0, 0.3, (c, c, 1, 1))),
        ("gamma", rng.uniform(0.5, 2, c)), ("beta", rng.normal(0, 0.5, c)),
        ("mean", rng.normal(0, 0.5, c)), ("var", rng.uniform(0.5, 2, c))]]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c1"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("BatchNormalization", ["p", "gamma", "beta", "mean", "var"], ["n"],
                         name="norm"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2"),
    ]
    model = helper.make_model(helper.make_graph(
        nodes, "preact", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, c, 4, 4])], inits),
        opset_imports=[helper.make_opsetid("", 13)])
    calib = rng.normal(0, 1, (16, 3, 8, 8)).astype(np.float32)
    compiled = _compile(tmp_path, model, calib)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["norm"].where == "TPU" and "1 Mul, 1 Add" in rows["norm"].reason
    assert len(compiled.report.segments) == 1
    x = calib[:1]
    got = compiled.run(x)["y"]
    (want,) = session(model).run(None, {"x": x})
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    (same_qdq,) = session(onnx.load(str(compiled.reference_model))).run(None, {"x": x})
    np.testing.assert_array_equal(got, same_qdq)


def _bert_mask(rng) -> onnx.ModelProto:
    """How transformers' PyTorch export builds an attention mask: the token mask gathered
    back through flat indices Range(batch) * length + Range(length) (onnx's data
    propagation adds those two Unsqueezed ranges as if they were shape vectors and rejects
    the graph once the batch is fixed), then Where(mask, 0, -inf) added to the scores
    before a Softmax (a tensor no 8-bit scale holds, read by host nodes only; onnxruntime's
    calibrator covers it because a residual Add elsewhere is quantized)."""
    i64 = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w1", rng.normal(0, 0.5, (8, 8))), ("b1", rng.normal(0, 0.1, 8)),
        ("w2", rng.normal(0, 0.5, (8, 5))), ("w3", rng.normal(0, 0.5, (8, 5))),
        ("zero_f", np.zeros(1)),
        ("minus_inf", np.full(1, -np.inf))]]
    inits += [i64("zero", 0), i64("one", 1), i64("ax0", [0]), i64("ax1", [1]),
              i64("flat", [-1])]
    nodes = [
        helper.make_node("Shape", ["mask"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="batch_of"),
        helper.make_node("Gather", ["s", "one"], ["t"], name="length_of"),
        helper.make_node("Range", ["zero", "n", "one"], ["rn"], name="rows"),
        helper.make_node("Unsqueeze", ["rn", "ax1"], ["un"], name="rows_col"),
        helper.make_node("Range", ["zero", "t", "one"], ["rt"], name="cols"),
        helper.make_node("Unsqueeze", ["rt", "ax0"], ["ut"], name="cols_row"),
        helper.make_node("Mul", ["un", "t"], ["start"], name="row_start"),
        helper.make_node("Add", ["start", "ut"], ["idx"], name="flat_index"),
        helper.make_node("Reshape", ["mask", "flat"], ["mflat"], name="mask_flat"),
        helper.make_node("Gather", ["mflat", "idx"], ["m"], name="mask_again"),
        helper.make_node("Cast", ["m"], ["keep"], name="as_bool", to=T.BOOL),
        helper.make_node("Where", ["keep", "zero_f", "minus_inf"], ["bias"], name="where"),
        helper.make_node("Gemm", ["x", "w1", "b1"], ["scores"], name="scores"),
        helper.make_node("Add", ["scores", "bias"], ["masked"], name="masked"),
        helper.make_node("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
        helper.make_node("Gemm", ["p", "w2"], ["o"], name="out"),
        helper.make_node("Gemm", ["x", "w3"], ["k"], name="skip"),
        helper.make_node("Add", ["o", "k"], ["y"], name="residual"),
    ]
    model = helper.make_model(helper.make_graph(
        nodes, "bert_mask", [helper.make_tensor_value_info("x", T.FLOAT, ["N", 8]),
                             helper.make_tensor_value_info("mask", T.INT64, ["N", 8])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 5])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_an_attention_mask_of_minus_infinity_and_range_indices_compile(tmp_path):
    """Both forms refused MiniLM (sentence-transformers, PyTorch's exporter) before: 'shape
    inference failed: Invalid rank for Add broadcasting', then 'its values overflow
    float32' for the host's -inf mask.  Both Gemms run on the TPU, the mask on the host."""
    rng = np.random.default_rng(13)
    model = _bert_mask(rng)
    n = 48
    mask = (rng.random((n, 8)) < 0.8).astype(np.int64)
    mask[:, 0] = 1                       # a sentence has at least one token
    data = {"x": rng.normal(0, 1, (n, 8)).astype(np.float32), "mask": mask}
    compiled = _compile(tmp_path, model, data, batch=16)
    where = {r.node: r.where for r in compiled.report.rows}
    assert where["scores"] == where["out"] == where["residual"] == "TPU"
    assert where["where"] == where["masked"] == where["softmax"] == "host"
    got = compiled.run(data)["y"]
    (want,) = session(model).run(None, data)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_a_host_output_read_inside_its_part_keeps_its_float_value(tmp_path):
    """PyTorch's TransformerEncoderLayer: the LayerNorm after a residual Add (which
    onnxruntime fuses into SkipLayerNormalization) is transposed and quantized for the next
    attention's matrix work, inside one host part, and read again in float by the residual
    Add after it, in another part.  onnxruntime's QDQ propagation moved the QuantizeLinear
    back over the Transpose and handed the next part the quantized value: 10 % of the
    encoder's outputs one step off onnxruntime on the whole QDQ model."""
    rng = np.random.default_rng(14)
    d = 16
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w", rng.normal(0, 0.4, (d, d))), ("w0", rng.normal(0, 0.4, (d, d))),
        ("gamma", rng.uniform(0.5, 1.5, d)),
        ("beta", rng.normal(0, 0.2, d)), ("out", rng.normal(0, 0.3, (d, 3)))]]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n0"], name="norm0",
                         axis=-1),
        helper.make_node("MatMul", ["n0", "w0"], ["f"], name="ffn"),
        helper.make_node("Add", ["n0", "f"], ["a"], name="skip"),
        helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["n1"], name="norm1",
                         axis=-1),
        helper.make_node("Transpose", ["n1"], ["t"], name="to_seq", perm=[1, 0, 2]),
        helper.make_node("MatMul", ["t", "w"], ["m"], name="mix"),
        helper.make_node("Transpose", ["m"], ["back"], name="to_batch", perm=[1, 0, 2]),
        helper.make_node("Add", ["n1", "back"], ["res"], name="residual"),
        helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["n2"], name="norm2",
                         axis=-1),
        helper.make_node("ReduceMean", ["n2"], ["pooled"], name="pool", axes=[1],
                         keepdims=0),
        helper.make_node("MatMul", ["pooled", "out"], ["y"], name="head"),
    ]
    model = helper.make_model(helper.make_graph(
        nodes, "encoder_like", [helper.make_tensor_value_info("x", T.FLOAT, ["N", 6, d])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(0, 1, (32, 6, d)).astype(np.float32)
    # 8-bit tensors throughout (the search would make some int16, which onnxruntime
    # computes in float32: no longer a bit-exact oracle)
    compiled = _compile(tmp_path, model, x, batch=16, calibration_method="minmax")
    where = {r.node: r.where for r in compiled.report.rows}
    assert where["ffn"] == where["mix"] == where["head"] == "TPU"
    assert where["norm1"] == where["skip"] == "host"
    got = compiled.run(x)["y"]
    qdq = session(onnx.load(str(compiled.reference_model)))
    same_qdq = np.concatenate([qdq.run(None, {"x": x[i:i + 16]})[0] for i in (0, 16)])
    np.testing.assert_array_equal(got, same_qdq)

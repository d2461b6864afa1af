"""Dynamically quantized models (onnxruntime's quantize_dynamic; the older onnx.quantize
tool's form, as ddddocr ships it): given calibration data, each DynamicQuantizeLinear ->
ConvInteger/MatMulInteger -> Cast -> Mul chain is read back as the float Conv/MatMul it
approximates (front/dynamicquant.py) and quantized statically, its matrix work on the TPU.
Oracles: onnxruntime on the float model the dynamic one was made from, and on the
dynamic model itself."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.dynamicquant import dequantize_dynamic
from tpuasm.compiler.ort import session


def _float_model(rng) -> onnx.ModelProto:
    """x (N, 2, 6, 6) -> Conv 3x3 (4 channels, bias) -> Relu -> Flatten -> MatMul -> Add."""
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (4, 2, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b"),
             numpy_helper.from_array(rng.normal(0, 0.2, (64, 5)).astype(np.float32), "fc"),
             numpy_helper.from_array(rng.normal(0, 0.1, 5).astype(np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "fc"], ["m"], name="fc"),
             helper.make_node("Add", ["m", "fc_b"], ["y"], name="fc_bias")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 2, 6, 6])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _dynamic(tmp_path, model, op_types=("Conv", "MatMul")) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(model, str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                     op_types_to_quantize=list(op_types),
                     extra_options={"DefaultTensorType": T.FLOAT})
    return onnx.load(str(dst))


def _old_tool_conv(rng) -> onnx.ModelProto:
    """One Conv as the older onnx.quantize tool writes it: the bias quantized at run time
    (Floor(b / (x_scale * w_scale))) and added to the int32 accumulators."""
    w = rng.normal(0, 0.4, (3, 2, 3, 3)).astype(np.float32)
    w_scale = np.float32(np.abs(w).max() / 127)
    w_q = np.round(w / w_scale).astype(np.int8)
    b = rng.normal(0, 0.1, 3).astype(np.float32)
    inits = [numpy_helper.from_array(w_q, "w_q"),
             numpy_helper.from_array(np.array(w_scale, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
             numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([1, 3, 1, 1], np.int64), "b_shape")]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"], name="dql"),
        helper.make_node("Mul", ["x_scale", "w_scale"], ["b_scale"], name="b_scale"),
        helper.make_node("Div", ["b", "b_scale"], ["b_div"], name="b_div"),
        helper.make_node("Floor", ["b_div"], ["b_floor"], name="b_floor"),
        helper.make_node("Cast", ["b_floor"], ["b_q"], name="b_cast", to=T.INT32),
        helper.make_node("ConvInteger", ["x_q", "w_q", "x_zp", "w_zp"], ["acc"],
                         name="conv_quant", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["b_q", "b_shape"], ["b_r"], name="b_reshape"),
        helper.make_node("Add", ["acc", "b_r"], ["acc_b"], name="bias_add"),
        helper.make_node("Cast", ["acc_b"], ["acc_f"], name="acc_cast", to=T.FLOAT),
        helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"], name="scales_mul"),
        helper.make_node("Mul", ["acc_f", "scale"], ["y"], name="rescale")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 2, 5, 5])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3, 5, 5])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _compile(tmp_path, model, calib, **options):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return tpu_compile(str(path), calibration=calib, config={"array_size": 16}, **options)


def test_quantize_dynamic_s_model_is_read_back_as_the_float_one(tmp_path):
    rng = np.random.default_rng(0)
    model = _float_model(rng)
    dynamic = _dynamic(tmp_path, model)
    assert "DynamicQuantizeLinear" in {n.op_type for n in dynamic.graph.node}
    assert dequantize_dynamic(dynamic) == 2
    ops = [n.op_type for n in dynamic.graph.node]
    assert "DynamicQuantizeLinear" not in ops and "ConvInteger" not in ops
    x = rng.normal(0, 1, (4, 2, 6, 6)).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    got = session(dynamic).run(None, {"x": x})[0]
    # the weights' own 8-bit rounding, no more
    assert np.abs(got - want).max() < 0.02 * np.abs(want).max()


def test_a_dynamically_quantized_model_compiles_with_its_matrix_work_on_the_tpu(tmp_path):
    rng = np.random.default_rng(1)
    model = _float_model(rng)
    dynamic = _dynamic(tmp_path, model)
    calib = rng.normal(0, 1, (16, 2, 6, 6)).astype(np.float32)
    compiled = _compile(tmp_path, dynamic, calib, batch=8)
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    assert "dynamically quantized" in compiled.report.source
    x = calib[:8]                   # within the calibrated ranges
    got = compiled.run(x)["y"]
    want = session(dynamic).run(None, {"x": x})[0]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    qdq = onnx.load(str(compiled.reference_model))
    same = session(qdq).run(None, {"x": x})[0]
    assert np.mean(got == same) >= 0.999


def test_the_older_tool_s_run_time_bias_is_read_back_from_its_float_initializer(tmp_path):
    rng = np.random.default_rng(2)
    model = _old_tool_conv(rng)
    x = rng.normal(0, 1, (16, 2, 5, 5)).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    compiled = _compile(tmp_path, model, x)
    row = {r.node: r for r in compiled.report.rows}["conv_quant"]
    assert row.where == "TPU" and row.op_type == "Conv", row.reason
    got = compiled.run(x)["y"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_without_calibration_it_runs_on_the_host_and_says_how_to_map_it(tmp_path):
    rng = np.random.default_rng(3)
    dynamic = _dynamic(tmp_path, _float_model(rng))
    path = tmp_path / "m.onnx"
    onnx.save(dynamic, str(path))
    compiled = tpu_compile(str(path), batch=4, config={"array_size": 16})
    rows = [r for r in compiled.report.rows if r.op_type in ("ConvInteger", "MatMulInteger")]
    assert rows and all(r.where == "host" and "--calibrate" in r.reason for r in rows)


def test_a_chain_that_cannot_be_read_back_is_a_clear_error(tmp_path):
    """A ConvInteger whose weights are an input (not constants) cannot become a float Conv."""
    rng = np.random.default_rng(4)
    model = _old_tool_conv(rng)
    w_q = next(t for t in model.graph.initializer if t.name == "w_q")
    model.graph.input.append(helper.make_tensor_value_info("w_q", T.INT8, list(w_q.dims)))
    model.graph.initializer.remove(w_q)
    with pytest.raises(CompileError, match="dynamically quantized.*ConvInteger"):
        _compile(tmp_path, model, {"x": rng.normal(0, 1, (8, 2, 5, 5)).astype(np.float32),
                                   "w_q": np.zeros((8, 3, 2, 3, 3), np.int8)})


# --- DynamicQuantizeLSTM (com.microsoft): read back as the float ONNX LSTM --------------

def _dynamic_lstm(tmp_path, per_channel: bool):
    """The corpus's LSTM classifier (tests/real_models.py) and onnxruntime's quantize_dynamic
    of its LSTM: a com.microsoft DynamicQuantizeLSTM with int8 weights."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from real_models import lstm_classifier
    m = lstm_classifier()
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(m.model, str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                     op_types_to_quantize=["LSTM"])
    dynamic = onnx.load(str(dst))
    assert [n.op_type for n in dynamic.graph.node if n.domain == "com.microsoft"] == \
        ["DynamicQuantizeLSTM"]
    return m, dynamic


def _inits(model) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("per_channel", [False, True])
def test_onnxruntime_s_dynamic_lstm_is_read_back_within_its_weights_rounding(tmp_path,
                                                                             per_channel):
    m, dynamic = _dynamic_lstm(tmp_path, per_channel)
    node = next(n for n in dynamic.graph.node if n.op_type == "DynamicQuantizeLSTM")
    scales = _inits(dynamic)
    w_step, r_step = scales[node.input[8]], scales[node.input[10]]
    assert w_step.size == (4 * 32 if per_channel else 1)
    assert dequantize_dynamic(dynamic) == 1
    lstm = next(n for n in dynamic.graph.node if n.op_type == "LSTM")
    assert lstm.domain == "" and lstm.name == node.name
    want = {n.input[k]: _inits(m.model)[n.input[k]] for n in m.model.graph.node
            if n.op_type == "LSTM" for k in (1, 2)}
    got = _inits(dynamic)
    for (w, want_w), step in zip(want.items(), (w_step, r_step)):
        read = got[lstm.input[list(want).index(w) + 1]]
        assert read.shape == want_w.shape                 # (1, 4H, K): the LSTM's layout
        per_row = np.asarray(step, np.float32).reshape(1, -1, 1)   # one per gate column
        assert np.all(np.abs(read - want_w) <= per_row / 2 + 1e-7)
    feeds = m.evaluation
    for a, b in zip(session(m.model).run(None, feeds), session(dynamic).run(None, feeds)):
        assert np.abs(a - b).max() < 0.05 * np.abs(a).max()     # 8-bit weights, 10 steps


def _hand_made_dynamic_lstm(rng, steps=4, batch=3, inputs=5, hidden=6):
    """A bidirectional DynamicQuantizeLSTM written by hand, uint8 weights: W with a scale per
    direction and gate column (the contrib op's per-channel form; its kernel wants one zero
    point value throughout, given per column), R with a scale and a zero point per
    direction (its per-tensor form)."""
    dirs, cols = 2, 4 * hidden
    w_q = rng.integers(0, 256, (dirs, inputs, cols)).astype(np.uint8)
    r_q = rng.integers(0, 256, (dirs, hidden, cols)).astype(np.uint8)
    w_zp = np.full((dirs, cols), 126, np.uint8)
    r_zp = np.array([131, 118], np.uint8)
    w_scale = rng.uniform(0.002, 0.006, (dirs, cols)).astype(np.float32)
    r_scale = np.array([0.003, 0.005], np.float32)
    b = rng.normal(0, 0.1, (dirs, 2 * cols)).astype(np.float32)
    arrays = {"w_q": w_q, "r_q": r_q, "w_zp": w_zp, "r_zp": r_zp, "w_scale": w_scale,
              "r_scale": r_scale, "b": b}
    node = helper.make_node("DynamicQuantizeLSTM",
                            ["x", "w_q", "r_q", "b", "", "", "", "", "w_scale", "w_zp",
                             "r_scale", "r_zp"], ["y", "y_h"], name="dqlstm",
                            domain="com.microsoft", hidden_size=hidden,
                            direction="bidirectional")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [steps, batch, inputs])],
        [helper.make_tensor_value_info("y", T.FLOAT, [steps, dirs, batch, hidden]),
         helper.make_tensor_value_info("y_h", T.FLOAT, [dirs, batch, hidden])],
        [numpy_helper.from_array(v, k) for k, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model, arrays


def test_a_hand_made_per_channel_dynamic_lstm_is_read_back_exactly():
    rng = np.random.default_rng(7)
    model, a = _hand_made_dynamic_lstm(rng)
    x = rng.normal(0, 1, (4, 3, 5)).astype(np.float32)
    theirs = session(model).run(None, {"x": x})      # onnxruntime's own contrib kernel
    assert dequantize_dynamic(model) == 1
    got = _inits(model)
    lstm = model.graph.node[0]
    assert lstm.op_type == "LSTM" and list(lstm.output) == ["y", "y_h"]
    for name, q, zp, scale in ((lstm.input[1], "w_q", "w_zp", "w_scale"),
                               (lstm.input[2], "r_q", "r_zp", "r_scale")):
        # by hand: (q - zp) * scale per direction and column, then (dirs, 4H, K)
        want = np.stack([((a[q][d].astype(np.float32) - a[zp][d]) * a[scale][d]).T
                         for d in range(2)])        # (hidden or inputs, 4H) per direction
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-7)
    ours = session(model).run(None, {"x": x})
    for o, t in zip(ours, theirs):    # the contrib kernel also rounds x and h to 8 bits
        assert np.abs(o - t).max() < 0.05 * np.abs(t).max()


def test_a_dynamically_quantized_lstm_compiles_with_its_gate_gemms_on_the_tpu(tmp_path):
    m, dynamic = _dynamic_lstm(tmp_path, per_channel=True)
    path = tmp_path / "dynamic.onnx"
    # min-max at 8 bits, identical to onnxruntime (the check would make its cell int16,
    # which onnxruntime computes in float32: tests/test_compiler_widecell)
    compiled = tpu_compile(str(path), calibration=m.calibration, batch=m.batch,
                           calibration_method="minmax")
    rows = {r.node: r for r in compiled.report.rows}
    node = next(n for n in dynamic.graph.node if n.op_type == "DynamicQuantizeLSTM")
    assert rows[node.name].where == "TPU", rows[node.name].reason
    steps, features, hidden = 10, 8, 32
    assert rows[node.name].macs == steps * m.batch * 4 * hidden * (features + hidden)
    gemms = [r for r in compiled.report.compiled_nodes if r.op_type == "Gemm"
             and r.macs and "lstm" in r.node.lower()]
    assert gemms and all(r.where == "TPU" for r in gemms)
    assert compiled.report.tpu_macs == compiled.report.macs
    assert "LSTMs dequantized to float first" in compiled.report.source
    feeds = {k: v[:, :m.batch] for k, v in m.evaluation.items()}    # sequence first
    got = compiled.run(feeds)["logits"]
    qdq = session(onnx.load(str(compiled.reference_model))).run(["logits"], feeds)[0]
    assert np.mean(got == qdq) >= 0.999          # the same QDQ model: identical
    want = session(m.model).run(["logits"], feeds)[0]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.97     # the float LSTM's answers


def test_a_dynamic_lstm_s_macs_are_counted_where_they_run(tmp_path):
    """Without calibration the DynamicQuantizeLSTM's products over its state go to the TPU,
    quantized from their bounds (front/qdqrecurrent.py), and those over its input X, which
    the model quantizes at run time, stay on the host; the report counts every gate product
    (steps x rows x 4H x (I + H)), so that the TPU's share is of the network's work."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from real_models import lstm_classifier
    m = lstm_classifier()
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(m.model, str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["LSTM", "MatMul", "Gemm"])
    report = tpu_compile(str(dst), batch=m.batch).report
    rows = {r.op_type: r for r in report.rows if r.macs}
    assert rows["DynamicQuantizeLSTM"].where == "TPU"
    assert rows["DynamicQuantizeLSTM"].macs == 10 * m.batch * 4 * 32 * (8 + 32)
    assert report.macs == sum(r.macs for r in rows.values())
    assert report.tpu_macs == 10 * m.batch * 4 * 32 * 32          # R h, every step


def _embedding_model(rng, positions: bool = True) -> onnx.ModelProto:
    """ids (N, 6) int64 -> Gather(embedding table) [+ positions] -> MatMul -> ReduceMean
    over the tokens."""
    inits = [numpy_helper.from_array(rng.normal(0, 1, (40, 8)).astype(np.float32), "table")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed")]
    rows = "e"
    if positions:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.2, (6, 8)).astype(np.float32),
                                             "pos"))
        nodes.append(helper.make_node("Add", ["e", "pos"], ["p"], name="positions"))
        rows = "p"
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (8, 4)).astype(np.float32), "w"))
    nodes += [helper.make_node("MatMul", [rows, "w"], ["m"], name="proj"),
              helper.make_node("ReduceMean", ["m"], ["y"], name="pool", axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("ids", T.INT64, ["N", 6])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _gather_dynamic(tmp_path, model):
    """quantize_dynamic's form of `model` with its Gather and MatMul quantized (a path)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(model, str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["Gather", "MatMul"])
    return dst


def test_a_dynamically_quantized_embedding_table_is_read_back_and_compiles(tmp_path):
    """quantize_dynamic writes the table int8 with one scale, Gather -> DequantizeLinear
    (an embedding of a transformer it has quantized): it becomes the float table."""
    rng = np.random.default_rng(5)
    dst = _gather_dynamic(tmp_path, _embedding_model(rng))
    dynamic = onnx.load(str(dst))
    assert "DequantizeLinear" in {n.op_type for n in dynamic.graph.node}
    ids = rng.integers(0, 40, (16, 6)).astype(np.int64)
    want = session(dynamic).run(None, {"ids": ids})[0]
    read_back = onnx.load(str(dst))
    assert dequantize_dynamic(read_back) == 2
    ops = {n.op_type for n in read_back.graph.node}
    assert not ops & {"DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger"}
    # the table's own rounding is kept: its gathered rows are the dynamic model's exactly
    table = next(numpy_helper.to_array(t) for t in read_back.graph.initializer
                 if t.name.endswith("_dequantized") and t.dims[0] == 40)
    q = next(numpy_helper.to_array(t) for t in dynamic.graph.initializer
             if t.name == "table_quantized")
    scale = next(numpy_helper.to_array(t) for t in dynamic.graph.initializer
                 if t.name == "table_scale")
    zero = next(numpy_helper.to_array(t) for t in dynamic.graph.initializer
                if t.name == "table_zero_point")
    assert np.array_equal(table, (q.astype(np.float32) - np.float32(zero)) * scale)
    compiled = _compile(tmp_path, dynamic, {"ids": ids}, batch=8)
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    got = compiled.run({"ids": ids})["y"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_a_matmul_reading_a_quantized_table_directly_is_read_back(tmp_path):
    """quantize_dynamic on Gather -> MatMul writes Gather(W_q) -> MatMulInteger with the
    table's zero point and Mul(table scale, weight scale): no DynamicQuantizeLinear.  The
    rows stay in the table's integer steps and the weights take the whole scale."""
    rng = np.random.default_rng(6)
    dst = _gather_dynamic(tmp_path, _embedding_model(rng, positions=False))
    dynamic = onnx.load(str(dst))
    ops = [n.op_type for n in dynamic.graph.node]
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" not in ops
    ids = rng.integers(0, 40, (16, 6)).astype(np.int64)
    want = session(dynamic).run(None, {"ids": ids})[0]
    read_back = onnx.load(str(dst))
    assert dequantize_dynamic(read_back) == 1
    assert not {n.op_type for n in read_back.graph.node} & {"MatMulInteger", "Cast"}
    # the same arithmetic as the dynamic model, in float: equal to float32 rounding
    np.testing.assert_allclose(session(read_back).run(None, {"ids": ids})[0], want,
                               rtol=1e-5, atol=1e-5)
    compiled = _compile(tmp_path, dynamic, {"ids": ids}, batch=8)
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    got = compiled.run({"ids": ids})["y"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_onnxruntime_s_fused_dynamic_forms_are_read_back_with_calibration(tmp_path):
    """A quantize_dynamic model as an onnxruntime session saves it optimized (its
    optimized_model_filepath): the chains fused into com.microsoft DynamicQuantizeMatMul
    and MatMulIntegerToFloat.  Given data it was refused ("some of its chains
    (DynamicQuantizeLinear) could not be read back"); now each is the float MatMul (and
    bias Add) it computes, and the corpus's encoder block has all its weight matrices on
    the TPU.  Without data they run on the host, their reason naming --calibrate."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import real_models
    m = real_models.transformer_encoder()
    onnx.save(m.model, str(tmp_path / "float.onnx"))
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "dynamic.onnx"),
                     weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "fused.onnx")
    ort.InferenceSession(str(tmp_path / "dynamic.onnx"), options,
                         providers=["CPUExecutionProvider"])
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    kinds = {n.op_type for n in fused.graph.node}
    assert {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"} <= kinds
    shipped = tpu_compile(str(tmp_path / "fused.onnx"), batch=m.batch)
    rows = [r for r in shipped.report.rows if r.op_type in ("DynamicQuantizeMatMul",
                                                            "MatMulIntegerToFloat")]
    assert rows and all(r.where == "host" and "--calibrate" in r.reason for r in rows)
    compiled = tpu_compile(str(tmp_path / "fused.onnx"), calibration=m.calibration)
    where = {r.node: r.where for r in compiled.report.rows}
    assert all(where[r.node] == "TPU" for r in rows)         # read back under its name
    got = compiled.run(m.evaluation)[m.output]
    want = session(m.model).run([m.output], m.evaluation)[0]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.99


def _bert_layer(rng, vocab=50, steps=8, width=16, heads=4) -> onnx.ModelProto:
    """onnxruntime's transformer optimizer's form of a BERT's front: EmbedLayerNormalization
    of int32 token ids (its mask index out), an Attention over it, a mean, a head."""
    def weight(shape, name, s=0.3):
        return numpy_helper.from_array(rng.normal(0, s, shape).astype(np.float32), name)
    inits = [weight((vocab, width), "words"), weight((steps, width), "positions"),
             weight((2, width), "segments"), weight(width, "gamma", 0.1),
             weight(width, "beta", 0.1), weight((width, 3 * width), "qkv"),
             weight(3 * width, "qkv_b", 0.1), weight((width, 3), "head")]
    nodes = [helper.make_node("EmbedLayerNormalization",
                              ["ids", "segment", "words", "positions", "segments", "gamma",
                               "beta", "mask"], ["e", "mask_index"], domain="com.microsoft",
                              name="embed", epsilon=1e-12),
             helper.make_node("Attention", ["e", "qkv", "qkv_b", "mask_index"], ["a"],
                              domain="com.microsoft", name="attention", num_heads=heads),
             helper.make_node("ReduceMean", ["a"], ["m"], axes=[1], keepdims=0, name="pool"),
             helper.make_node("MatMul", ["m", "head"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "bert", [
        helper.make_tensor_value_info(n, T.INT32, ["N", steps])
        for n in ("ids", "segment", "mask")],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def test_the_int8_bert_recipe_s_qattention_is_read_back_and_compiles(tmp_path):
    """onnxruntime's int8 BERT recipe (its transformer optimizer, then quantize_dynamic)
    writes QAttention and QEmbedLayerNormalization: given calibration data such a model was
    refused ("some of its chains (DynamicQuantizeLinear) could not be read back").  Read
    back, each weight is its float one within half a step of its quantization, the
    projection runs on the TPU, and the report counts the attention's MACs."""
    rng = np.random.default_rng(21)
    model = _bert_layer(rng)
    dynamic = _dynamic(tmp_path, model, ("MatMul", "Attention", "EmbedLayerNormalization"))
    ops = {n.op_type for n in dynamic.graph.node}
    assert {"QAttention", "QEmbedLayerNormalization"} <= ops
    read = onnx.ModelProto()
    read.CopyFrom(dynamic)
    assert dequantize_dynamic(read) >= 2
    assert {"Attention", "EmbedLayerNormalization"} <= {n.op_type for n in read.graph.node}
    assert not {"QAttention", "QEmbedLayerNormalization", "DynamicQuantizeLinear"} & \
        {n.op_type for n in read.graph.node}
    floats = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values = {t.name: numpy_helper.to_array(t) for t in read.graph.initializer}
    attention = next(n for n in read.graph.node if n.op_type == "Attention")
    embed = next(n for n in read.graph.node if n.op_type == "EmbedLayerNormalization")
    for original, name in (("qkv", attention.input[1]), ("words", embed.input[2]),
                           ("positions", embed.input[3]), ("gamma", embed.input[5])):
        step = 2 * np.abs(floats[original]).max() / 254     # int8's, symmetric or not
        assert np.abs(values[name] - floats[original]).max() <= 0.5 * step * 1.01, original
    onnx.save(dynamic, str(tmp_path / "dynamic.onnx"))
    rows = 64
    feeds = {"ids": rng.integers(0, 50, (rows, 8)).astype(np.int32),
             "segment": rng.integers(0, 2, (rows, 8)).astype(np.int32),
             "mask": np.ones((rows, 8), np.int32)}
    feeds["mask"][::3, 6:] = 0
    compiled = tpu_compile(str(tmp_path / "dynamic.onnx"), batch=16, calibration=feeds)
    row = next(r for r in compiled.report.rows if r.node == "attention_quant")
    assert row.where == "TPU" and row.macs == 16 * 8 * 16 * 48 + 16 * 8 * 8 * 32
    assert compiled.report.tpu_macs >= 16 * 8 * 16 * 48
    got = compiled.run(feeds)["y"]
    want = session(model).run(["y"], feeds)[0]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.95

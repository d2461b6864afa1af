"""A quantized model's float LSTM / GRU / RNN on the TPU without calibration data
(front/qdqrecurrent.py): onnxruntime's quantize_static leaves them float, and compiled as
shipped their gate Gemms are quantized from the bounds of their ranges.  Oracles:
onnxruntime on OUTDIR's model.qdq.onnx (the model as compiled: bit-identical), on the
shipped QDQ model and on the float model it was made from (the answers kept), hand-worked
bounds, and the report's rows."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import real_models
from tpuasm.compiler.cli import compile_main
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.front.bounds import BoundsQuantizer, Grid
from tpuasm.compiler.front.qdqrecurrent import quantize_float_recurrent
from tpuasm.compiler.ort import session
from tpuasm.compiler.runtime.model import load

quantization = pytest.importorskip("onnxruntime.quantization")


def _quantize_static(tmp_path, model: onnx.ModelProto, calibration: dict, axis: int):
    """onnxruntime's quantize_static (QDQ, per channel), a row at a time along `axis`."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat

    class Rows(CalibrationDataReader):
        def __init__(self):
            rows = next(iter(calibration.values())).shape[axis]
            self.rows = iter([{k: np.take(v, [i], axis=axis) for k, v in calibration.items()}
                              for i in range(rows)])

        def get_next(self):
            return next(self.rows, None)

    src, dst = tmp_path / "float.onnx", tmp_path / "shipped.qdq.onnx"
    onnx.save(model, str(src))
    quantization.quantize_static(str(src), str(dst), Rows(), quant_format=QuantFormat.QDQ,
                                 per_channel=True)
    return dst


def _compiled(tmp_path, capsys, qdq, *extra):
    out = tmp_path / "out"
    assert compile_main([str(qdq), "-o", str(out), *map(str, extra)]) == 0
    text, err = capsys.readouterr()
    assert "Traceback" not in text + err
    return out, json.loads((out / "report.json").read_text())


def _assert_as_compiled(got, outdir, feeds: dict, output: str) -> None:
    """The compiled model against onnxruntime on OUTDIR's model.qdq.onnx (the model as
    compiled).  onnxruntime computes the int16 QDQ nodes in float32, the TPU in integers, so
    a gate sum on a rounding tie may land one int16 step away: no output more than one of
    its own 8-bit steps apart, and 99 % identical (all of them, on the suite's versions)."""
    qdq = onnx.load(str(outdir / "model.qdq.onnx"))
    want = session(qdq.SerializeToString()).run([output], feeds)[0]
    dq = next(n for n in qdq.graph.node if n.output[0] == output)
    step = float(numpy_helper.to_array(next(t for t in qdq.graph.initializer
                                            if t.name == dq.input[1])))
    assert np.abs(got - want).max() <= step * 1.001
    assert np.mean(got == want) >= 0.99


def _snr(want, got) -> float:
    want, got = want.astype(np.float64), got.astype(np.float64)
    return 10 * np.log10(np.sum(want ** 2) / np.sum((want - got) ** 2))


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_a_recurrent_classifier_s_qdq_model_puts_its_state_products_on_the_tpu(
        tmp_path, capsys, kind):
    """The classifiers' X is a float model input (quantize_static quantizes nothing before
    the recurrent node), so the products over X stay float; those over the state, 80 % of
    the MACs, go to the TPU, where 0.3 % did."""
    case = getattr(real_models, f"{kind}_classifier")()
    qdq = _quantize_static(tmp_path, case.model, case.calibration, axis=1)
    assert kind.upper() in {n.op_type for n in onnx.load(str(qdq)).graph.node}
    out, report = _compiled(tmp_path, capsys, qdq,
                            *[f"--batch-axis={n}=1" for n in case.calibration])
    row = next(r for r in report["rows"] if r["op_type"] == kind.upper())
    assert row["where"] == "TPU" and "--calibrate quantizes it" in row["reason"]
    assert report["tpu_macs"] >= 0.75 * report["macs"]
    model = load(out)
    got = model.run(case.evaluation, engine="reference")["logits"]
    _assert_as_compiled(got, out, case.evaluation, "logits")
    shipped = session(qdq.read_bytes()).run(None, case.evaluation)[0]
    floats = session(case.model.SerializeToString()).run(None, case.evaluation)[0]
    # the bounds' 16 bits cost nothing the shipped model's own 8-bit layers do not
    assert _snr(floats, got) >= _snr(floats, shipped) - 0.5
    assert np.mean(got.argmax(1) == floats.argmax(1)) >= \
        np.mean(shipped.argmax(1) == floats.argmax(1)) - 0.01


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_declared_input_range_puts_the_products_over_x_on_the_tpu_too(
        tmp_path, capsys, kind):
    """--input-range X=LO,HI: the user's word for the float input's range, where the model
    quantizes nothing before the recurrent node; every product is then on the TPU (80 %
    without it), X int16 and its weights int8, which cost about 1 dB of the float products
    the shipped model keeps (LSTM: 41.1 dB against float where it has 42.1)."""
    case = getattr(real_models, f"{kind}_classifier")()
    qdq = _quantize_static(tmp_path, case.model, case.calibration, axis=1)
    name, rows = "x", case.calibration["x"]
    lo, hi = float(rows.min()), float(rows.max())
    out, report = _compiled(tmp_path, capsys, qdq,
                            *[f"--batch-axis={n}=1" for n in case.calibration],
                            f"--input-range={name}={lo},{hi}")
    assert report["tpu_macs"] == report["macs"] > 0
    assert f"{name} [{lo:g}, {hi:g}]" in report["source"]
    got = load(out).run(case.evaluation, engine="reference")["logits"]
    _assert_as_compiled(got, out, case.evaluation, "logits")
    shipped = session(qdq.read_bytes()).run(None, case.evaluation)[0]
    floats = session(case.model.SerializeToString()).run(None, case.evaluation)[0]
    assert _snr(floats, got) >= _snr(floats, shipped) - 1.5
    assert np.mean(got.argmax(1) == floats.argmax(1)) >= \
        np.mean(shipped.argmax(1) == floats.argmax(1)) - 0.01


@pytest.mark.parametrize("form", ["constant_of_shape", "sliced", "expanded"])
def test_a_zero_initial_state_of_a_shape_adds_no_products(tmp_path, capsys, form):
    """PyTorch writes a GRU's missing h0 as ConstantOfShape(zeros) of the batch's shape
    (a stacked one's, a Slice of one for each layer), tf2onnx a Keras layer's as a zero
    Expanded to it; unrolled before the batch is fixed, its step-0 products were counted
    and left to the host as constants (the PyTorch GRU's QDQ model: 6.6 % of its MACs, the
    Keras LSTM's 5.5 %).  They are dropped, as the float path drops them: MACs are
    T x (X products) + (T - 1) x (state products)."""
    sliced = form == "sliced"
    steps, features, hidden = 5, 6, 8
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (1, 3 * hidden, features))
                                     .astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.3, (1, 3 * hidden, hidden))
                                     .astype(np.float32), "R"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "first"),
             numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array([hidden], np.int64), "width"),
             numpy_helper.from_array(np.array(1, np.int64), "batch_axis"),
             numpy_helper.from_array(rng.normal(0, 0.5, (hidden, 3)).astype(np.float32),
                                     "head"),
             numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    zeros = helper.make_node("ConstantOfShape", ["h0_shape"], ["zeros" if sliced else "h0"],
                             name="h0", value=numpy_helper.from_array(np.zeros(1, np.float32)))
    if form == "expanded":
        zeros = helper.make_node("Expand", ["zero", "h0_shape"], ["h0"], name="h0")
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "batch_axis"], ["n"], name="n", axis=0),
             helper.make_node("Unsqueeze", ["n", "first"], ["n1"], name="n1"),
             helper.make_node("Concat", ["two" if sliced else "one", "n1", "width"],
                              ["h0_shape"], name="h0_shape", axis=0),
             zeros,
             *([helper.make_node("Slice", ["zeros", "first", "one", "first"], ["h0"],
                                 name="layer0")] if sliced else []),
             helper.make_node("GRU", ["x", "W", "R", "", "", "h0"], ["Y", "Y_h"], name="gru",
                              hidden_size=hidden),
             helper.make_node("Squeeze", ["Y_h", "first"], ["h"], name="last"),
             helper.make_node("MatMul", ["h", "head"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", T.FLOAT, [steps, "N", features])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.normal(0, 1, (steps, 64, features)).astype(np.float32)
    qdq = _quantize_static(tmp_path, model, {"x": x}, axis=1)
    out, report = _compiled(tmp_path, capsys, qdq, "--batch-axis=x=1", "--batch=16")
    gru = next(r for r in report["rows"] if r["node"] == "gru")
    # step 0's reset gate multiplies the zero state only: its X product is not needed
    assert gru["macs"] == 16 * ((steps * features + (steps - 1) * hidden) * 3 * hidden
                                - features * hidden)
    assert report["macs"] == gru["macs"] + 16 * hidden * 3
    assert not any("weights alone" in r["reason"] for r in report["rows"])
    got = load(out).run({"x": x}, engine="reference")["y"]
    _assert_as_compiled(got, out, {"x": x}, "y")


@pytest.mark.parametrize("given, says", [
    ("x=1", "expected two numbers LO,HI"),
    ("x=2,1", "LO (2) must be below HI (1)"),
    ("x=nan,1", "must be finite"),
    ("nothing=0,1", "--input-range names no input of the model: nothing"),
])
def test_a_bad_input_range_is_one_clear_error(tmp_path, capsys, given, says):
    case = real_models.lstm_classifier()
    qdq = _quantize_static(tmp_path, case.model, case.calibration, axis=1)
    assert compile_main([str(qdq), "-o", str(tmp_path / "out"),
                         *[f"--batch-axis={n}=1" for n in case.calibration],
                         f"--input-range={given}"]) != 0
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_input_range_for_an_integer_input_is_one_clear_error(tmp_path, capsys):
    """Token ids are no range to quantize by: the error names the input and its type."""
    from onnxruntime.quantization import QuantFormat, quantize_static
    case = real_models.token_embedding()
    onnx.save(case.model, str(tmp_path / "float.onnx"))
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"),
                    real_models.calibration_reader(case.calibration),
                    quant_format=QuantFormat.QDQ, per_channel=True)
    assert compile_main([str(tmp_path / "qdq.onnx"), "-o", str(tmp_path / "out"),
                         "--input-range=input_ids=0,39"]) != 0
    err = capsys.readouterr().err
    assert "--input-range input_ids: the input is int32, not float" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_an_input_range_for_a_float_model_says_where_its_ranges_come_from(tmp_path, capsys):
    case = real_models.lstm_classifier()
    onnx.save(case.model, str(tmp_path / "float.onnx"))
    np.savez(tmp_path / "cal.npz", **case.calibration)
    assert compile_main([str(tmp_path / "float.onnx"), "-o", str(tmp_path / "out"),
                         "--calibrate", str(tmp_path / "cal.npz"),
                         *[f"--batch-axis={n}=1" for n in case.calibration],
                         "--input-range=x=-1,1"]) != 0
    assert "ranges come from its calibration data" in capsys.readouterr().err


def _front_end_lstm(rng, direction: str) -> onnx.ModelProto:
    """x (N, 6, 8) -> MatMul (8 -> 12) -> Relu -> time first -> LSTM (10) -> last -> MatMul."""
    dirs = 2 if direction == "bidirectional" else 1
    hidden = 10
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (8, 12)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.4, (dirs, 4 * hidden, 12))
                                     .astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.3, (dirs, 4 * hidden, hidden))
                                     .astype(np.float32), "R"),
             numpy_helper.from_array(rng.normal(0, 0.1, (dirs, 8 * hidden))
                                     .astype(np.float32), "B"),
             numpy_helper.from_array(np.array([-1, dirs * hidden], np.int64), "flat"),
             numpy_helper.from_array(rng.normal(0, 0.5, (dirs * hidden, 4))
                                     .astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="fc1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["time_first"], name="time_first",
                              perm=[1, 0, 2]),
             helper.make_node("LSTM", ["time_first", "W", "R", "B"], ["Y", "Y_h"],
                              name="lstm", hidden_size=hidden, direction=direction),
             helper.make_node("Transpose", ["Y_h"], ["batch_first"], name="batch_first",
                              perm=[1, 0, 2]),
             helper.make_node("Reshape", ["batch_first", "flat"], ["h"], name="last"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", T.FLOAT, ["N", 6, 8])], [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_an_lstm_after_quantized_layers_has_every_gate_product_on_the_tpu(tmp_path, capsys,
                                                                         direction):
    rng = np.random.default_rng(11)
    model = _front_end_lstm(rng, direction)
    x = rng.normal(0, 1, (96, 6, 8)).astype(np.float32)
    qdq = _quantize_static(tmp_path, model, {"x": x[:64]}, axis=0)
    out, report = _compiled(tmp_path, capsys, qdq, "--batch", "16")
    row = next(r for r in report["rows"] if r["op_type"] == "LSTM")
    gemms = (6 * 8 - 4) * (2 if direction == "bidirectional" else 1)   # no R h0: none
    assert row["where"] == "TPU" and f"{gemms} of {gemms} Gemm on the TPU" in row["reason"]
    assert report["tpu_macs"] == report["macs"]
    assert "quantized by the compiler from bounds" in report["source"]
    new = {"x": x[64:]}
    got = load(out).run(new, engine="reference")["y"]
    _assert_as_compiled(got, out, new, "y")
    shipped = session(qdq.read_bytes()).run(None, new)[0]
    floats = session(model.SerializeToString()).run(None, new)[0]
    assert _snr(floats, got) >= _snr(floats, shipped) - 0.5
    assert _snr(shipped, got) > 35               # int16 states and sums against float ones


def test_a_stacked_lstm_s_second_layer_reads_the_first_one_s_bounded_states(tmp_path,
                                                                            capsys):
    """x, a float model input, -> LSTM -> Squeeze -> LSTM -> MatMul (quantized): the first
    layer's products over x stay float (no range without data), the second layer's X is the
    first one's states, in [-1, 1] through the Squeeze, so all its products go on the TPU."""
    rng = np.random.default_rng(13)

    def weights(name, *shape, scale=0.4):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)
    inits = [weights("W1", 1, 40, 8), weights("R1", 1, 40, 10), weights("W2", 1, 32, 10),
             weights("R2", 1, 32, 8), weights("w", 8, 4, scale=0.5),
             numpy_helper.from_array(np.array([1], np.int64), "dirs"),
             numpy_helper.from_array(np.array([0], np.int64), "first")]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="time_first", perm=[1, 0, 2]),
             helper.make_node("LSTM", ["xt", "W1", "R1"], ["Y1"], name="lstm1",
                              hidden_size=10),
             helper.make_node("Squeeze", ["Y1", "dirs"], ["y1"], name="squeeze"),
             helper.make_node("LSTM", ["y1", "W2", "R2"], ["", "h2"], name="lstm2",
                              hidden_size=8),
             helper.make_node("Squeeze", ["h2", "first"], ["h"], name="last"),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info(
        "x", T.FLOAT, ["N", 6, 8])], [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.normal(0, 1, (96, 6, 8)).astype(np.float32)
    qdq = _quantize_static(tmp_path, model, {"x": x[:64]}, axis=0)
    out, report = _compiled(tmp_path, capsys, qdq, "--batch", "16")
    rows = {r["node"]: r for r in report["rows"]}
    assert "20 of 44 Gemm on the TPU" in rows["lstm1"]["reason"]      # its R h products
    assert "--calibrate quantizes it" in rows["lstm1"]["reason"]
    assert "44 of 44 Gemm on the TPU" in rows["lstm2"]["reason"]
    new = {"x": x[64:]}
    got = load(out).run(new, engine="reference")["y"]
    _assert_as_compiled(got, out, new, "y")
    shipped = session(qdq.read_bytes()).run(None, new)[0]
    floats = session(model.SerializeToString()).run(None, new)[0]
    assert _snr(floats, got) >= _snr(floats, shipped) - 0.5


def test_a_gate_sum_is_quantized_over_its_bound():
    """h in [-1, 1] (step 1 / 32767), int16 weights per column where the accumulators hold
    any h's sums (32768 x sum |w_q| + |b_q| within int32: the PyTorch LSTM's QDQ model
    40.6 -> 42.1 dB against float, top-1 99.32 -> 99.41 %, its shipped model's); the sum's
    int16 step is the largest |sum| any h in range gives (sum over K of |w|, plus |b|) /
    32767."""
    rng = np.random.default_rng(2)
    model = _front_end_lstm(rng, "forward")
    quantized = onnx.load_from_string(model.SerializeToString())
    # X as a model input of no quantization: only the products over h are quantized
    assert quantize_float_recurrent(quantized, Provenance.of(quantized)) == 1
    inits = {t.name: numpy_helper.to_array(t) for t in quantized.graph.initializer}
    nodes = {n.name: n for n in quantized.graph.node}
    gemm = nodes["lstm/t1/d0/i_h"]
    dq_a = next(n for n in quantized.graph.node if n.output[0] == gemm.input[0])
    assert dq_a.domain == "com.microsoft"
    assert np.isclose(inits[dq_a.input[1]], 1 / 32767)
    dq_w = next(n for n in quantized.graph.node if n.output[0] == gemm.input[1])
    w_q = inits[dq_w.input[0]]
    w = w_q.astype(np.float64) * inits[dq_w.input[1]]
    assert w_q.dtype == np.int16
    r = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "R"))
    assert np.allclose(w, r[0, :10].T, atol=inits[dq_w.input[1]].max() / 2 * 1.001)
    dq_b = next(n for n in quantized.graph.node if n.output[0] == gemm.input[2])
    b_q = inits[dq_b.input[0]].astype(np.int64)
    assert (32768 * np.abs(w_q.astype(np.int64)).sum(0) + np.abs(b_q)).max() <= 2 ** 31 - 1
    bias = b_q * inits[dq_b.input[1]]
    q = next(n for n in quantized.graph.node if n.input and n.input[0] == gemm.output[0])
    bound = (np.abs(w).sum(0) + np.abs(bias)).max()
    assert np.isclose(inits[q.input[1]], bound / 32767, rtol=1e-5)
    assert not any(n.name == "lstm/t1/d0/i_x" and n.input[0].endswith(":dq")
                   for n in quantized.graph.node)        # X: float


def test_int16_states_that_would_fill_the_accumulator_are_int8():
    """A sum of K products of 32767 x 127 passes int32 from K = 517 on."""
    quantizer = BoundsQuantizer.__new__(BoundsQuantizer)
    narrow = np.full((600, 4), 127, np.int8)
    assert quantizer._symmetric_grid((-1.0, 1.0), narrow).dtype == np.int8
    assert quantizer._symmetric_grid((-1.0, 1.0), narrow[:500]).dtype == np.int16
    assert Grid(1 / 127, np.zeros((), np.int8), np.int8).bounds == (-128 / 127, 1.0)


def test_int16_weights_over_an_8_bit_input_never_wrap_the_accumulator():
    """_wide_scale's steps: the finest (max |w| / 32767) where K is small; widened where
    K products of 255 x |w_q| (twice: a zero point's correction) and the bias would pass
    int32, which the worst input then reaches no further than; int8 where widening leaves
    less than 12 dB of the noise gain."""
    from tpuasm.compiler.front.bounds import _ACCUMULATOR, _wide_scale
    rng = np.random.default_rng(3)
    small = rng.normal(0, 0.3, (16, 5))
    steps = _wide_scale(small, np.zeros(5), 0.02)
    np.testing.assert_allclose(steps, np.abs(small).max(0) / 32767, rtol=1e-6)
    for k in (1000, 3000):
        w, bias, a_scale = rng.normal(0, 0.3, (k, 6)), rng.normal(0, 2, 6), 0.01
        steps = _wide_scale(w, bias, a_scale)
        assert steps is not None
        w_q = np.clip(np.rint(w / steps), -32767, 32767).astype(np.int64)
        b_q = np.rint(bias / (a_scale * steps)).astype(np.int64)
        worst = 2 * 255 * np.abs(w_q).sum(0) + np.abs(b_q)
        assert worst.max() <= _ACCUMULATOR
        assert np.any(steps > np.abs(w).max(0) / 32767 * 1.01)       # widened
    # 100,000 products: the steps needed are within 12 dB of int8's
    assert _wide_scale(rng.normal(0, 0.3, (100000, 3)), np.zeros(3), 0.01) is None


def test_an_rnn_over_relu_stays_float_and_says_why():
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (1, 5, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.4, (1, 5, 5)).astype(np.float32), "R")]
    graph = helper.make_graph(
        [helper.make_node("RNN", ["x", "W", "R"], ["Y"], name="rnn", hidden_size=5,
                          activations=["Relu"])], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [4, "N", 3])],
        [helper.make_tensor_value_info("Y", T.FLOAT, [4, 1, "N", 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    reasons = {}
    assert quantize_float_recurrent(model, Provenance.of(model), reasons) == 0
    assert "Relu" in reasons["rnn"] and "--calibrate" in reasons["rnn"]
    assert [n.op_type for n in model.graph.node] == ["RNN"]


def test_a_quantize_dynamic_lstm_has_its_state_products_on_the_tpu(tmp_path, capsys):
    """quantize_dynamic writes the LSTM as a contrib DynamicQuantizeLSTM, whose activations
    are quantized at run time: read as the float LSTM of its int8 weights, it is unrolled
    and quantized from bounds like one quantize_static leaves float (0 % of the MACs on the
    TPU before)."""
    case = real_models.lstm_classifier()
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(case.model, str(src))
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    assert "DynamicQuantizeLSTM" in {n.op_type for n in onnx.load(str(dst)).graph.node}
    out, report = _compiled(tmp_path, capsys, dst,
                            *[f"--batch-axis={n}=1" for n in case.calibration])
    row = next(r for r in report["rows"] if r["op_type"] == "DynamicQuantizeLSTM")
    assert row["where"] == "TPU" and report["tpu_macs"] >= 0.75 * report["macs"]
    got = load(out).run(case.evaluation, engine="reference")["logits"]
    shipped = session(dst.read_bytes()).run(None, case.evaluation)[0]
    floats = session(case.model.SerializeToString()).run(None, case.evaluation)[0]
    assert _snr(floats, got) >= _snr(floats, shipped) - 0.5
    assert np.mean(got.argmax(1) == floats.argmax(1)) >= \
        np.mean(shipped.argmax(1) == floats.argmax(1)) - 0.01


def test_a_dynamic_lstm_that_cannot_be_unrolled_stays_as_shipped(tmp_path):
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (1, 16, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.4, (1, 16, 4)).astype(np.float32), "R")]
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "W", "R"], ["Y"], name="lstm", hidden_size=4)], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["T", "N", 3])],
        [helper.make_tensor_value_info("Y", T.FLOAT, ["T", 1, "N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    src, dst = tmp_path / "float.onnx", tmp_path / "dynamic.onnx"
    onnx.save(model, str(src))
    quantization.quantize_dynamic(str(src), str(dst), weight_type=quantization.QuantType.QInt8)
    shipped = onnx.load(str(dst))
    reasons = {}
    assert quantize_float_recurrent(shipped, Provenance.of(shipped), reasons) == 0
    (why,) = reasons.values()                      # (onnxruntime renames it lstm_quant)
    assert "sequence length is not static" in why
    assert [n.op_type for n in shipped.graph.node] == ["DynamicQuantizeLSTM"]
    assert {t.name for t in shipped.graph.initializer} == \
        {t.name for t in onnx.load(str(dst)).graph.initializer}


def _loop_gru(rng, steps=5, features=6, hidden=8) -> onnx.ModelProto:
    """x (N, T, F) -> time first -> a Loop over T of a GRU cell written out (as jax.lax.scan
    and Keras export one: MatMuls, Sigmoid, Tanh, h = (1 - z) * n + z * h) -> the last state
    -> MatMul head."""
    def init(name, *shape, s=0.4):
        return numpy_helper.from_array(rng.normal(0, s, shape).astype(np.float32), name)

    body_nodes = [
        helper.make_node("Gather", ["time_first", "i"], ["x_t"], axis=0),
        helper.make_node("MatMul", ["x_t", "Wz"], ["xz"]),
        helper.make_node("MatMul", ["h_in", "Rz"], ["hz"]),
        helper.make_node("Add", ["xz", "hz"], ["az"]),
        helper.make_node("Sigmoid", ["az"], ["z"]),
        helper.make_node("MatMul", ["x_t", "Wn"], ["xn"]),
        helper.make_node("MatMul", ["h_in", "Rn"], ["hn"]),
        helper.make_node("Add", ["xn", "hn"], ["an"]),
        helper.make_node("Tanh", ["an"], ["n"]),
        helper.make_node("Sub", ["one", "z"], ["keep"]),
        helper.make_node("Mul", ["keep", "n"], ["new"]),
        helper.make_node("Mul", ["z", "h_in"], ["old"]),
        helper.make_node("Add", ["new", "old"], ["h_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = helper.make_graph(
        body_nodes, "cell",
        [helper.make_tensor_value_info("i", T.INT64, []),
         helper.make_tensor_value_info("cond_in", T.BOOL, []),
         helper.make_tensor_value_info("h_in", T.FLOAT, ["N", hidden])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []),
         helper.make_tensor_value_info("h_out", T.FLOAT, ["N", hidden])],
        [init("Wz", features, hidden), init("Rz", hidden, hidden),
         init("Wn", features, hidden), init("Rn", hidden, hidden),
         numpy_helper.from_array(np.ones((1,), np.float32), "one")])
    nodes = [helper.make_node("Transpose", ["x"], ["time_first"], perm=[1, 0, 2]),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero_index"], ["rows"], axis=0),
             helper.make_node("Concat", ["rows", "width"], ["state_shape"], axis=0),
             helper.make_node("Expand", ["zero", "state_shape"], ["h0"]),
             helper.make_node("Loop", ["trips", "true", "h0"], ["h_last"], name="scan",
                              body=body),
             helper.make_node("MatMul", ["h_last", "head"], ["y"], name="head")]
    inits = [numpy_helper.from_array(np.array(steps, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "true"),
             numpy_helper.from_array(np.array([0], np.int64), "zero_index"),
             numpy_helper.from_array(np.array([hidden], np.int64), "width"),
             numpy_helper.from_array(np.zeros((1, 1), np.float32), "zero"),
             init("head", hidden, 3, s=0.8)]
    graph = helper.make_graph(nodes, "loop_gru", [helper.make_tensor_value_info(
        "x", T.FLOAT, ["N", steps, features])], [helper.make_tensor_value_info(
            "y", T.FLOAT, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_loop_s_gru_cell_has_its_state_products_on_the_tpu(tmp_path, capsys):
    """quantize_static does not enter a Loop's body; compiled as shipped, the folding unrolls
    it and the MatMuls over its state are quantized from bounds: the state stays in [-1, 1]
    because h = (1 - z) * n + z * h is a convex mix (interval arithmetic alone would widen
    it by its own range every step)."""
    rng = np.random.default_rng(8)
    model = _loop_gru(rng)
    x = rng.normal(0, 1, (96, 5, 6)).astype(np.float32)
    qdq = _quantize_static(tmp_path, model, {"x": x[:64]}, axis=0)
    assert "Loop" in {n.op_type for n in onnx.load(str(qdq)).graph.node}
    out, report = _compiled(tmp_path, capsys, qdq, "--batch", "16")
    loop = next(r for r in report["rows"] if r["op_type"] == "Loop")
    # the products over the state of steps 1..4 (step 0's, over zeros, fold away); those
    # over x, a float model input, stay on the host
    assert loop["where"] == "TPU" and "8 of 18 MatMul on the TPU" in loop["reason"]
    assert "no range known without data" in loop["reason"]       # those over x
    assert "Loop, Scan or If bodies) quantized by the compiler" in report["source"]
    # every state read at the step of [-1, 1] (without the mix rule: 2, 3, 4 ... times it)
    compiled = onnx.load(str(out / "model.qdq.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in compiled.graph.initializer}
    steps = [float(inits[n.input[1]]) for n in compiled.graph.node
             if n.op_type == "QuantizeLinear" and n.output[0].endswith("/a:q")]
    assert len(steps) == 4 and max(steps) == pytest.approx(1 / 32767, rel=1e-6)
    new = {"x": x[64:80]}
    got = load(out).run(new, engine="reference")["y"]
    shipped = session(qdq.read_bytes()).run(None, new)[0]
    floats = session(model.SerializeToString()).run(None, new)[0]
    assert _snr(floats, got) >= _snr(floats, shipped) - 0.5
    assert _snr(shipped, got) > 35

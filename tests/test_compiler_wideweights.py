"""16-bit weights from float models (front/wideweights.py, --weight-bits, --wide-weight): the
weights of chosen matrix nodes quantized to int16 per output channel by onnxruntime's own
quantizer, compiled as MatrixMultiply's weight pairs (D flag).  Oracles: onnxruntime on the
same QDQ model (the compiled model computes what it defines: >= 99.9 % identical, none more
than one step off), the float model (int16 weights keep what int8 weights lose), and the
int32 accumulators' own limit (the guard's figures)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from test_compiler_wide import _init, _same_as_qdq, _save
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.cli import compile_main, infer_main
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.ort import session


def _weight_types(qdq) -> dict[str, int]:
    """Float weight name -> the element type onnxruntime quantized it to."""
    return {t.name.removesuffix("_quantized"): t.data_type for t in qdq.graph.initializer
            if t.name.endswith("_quantized")}


def _snr(want, got) -> float:
    return float(10 * np.log10((want ** 2).sum() / max(((want - got) ** 2).sum(), 1e-30)))


def _outlier_mlp(tmp_path, seed=0):
    """MatMul -> Add -> MatMul -> Add over (N, 4, 24) (rank 3: each bias Add fused into its
    MatMul as an int32 bias): in every output channel one weight 40 times the others, so
    int8's step (the outlier / 127) rounds the rest to a few levels; int16's keeps them."""
    rng = np.random.default_rng(seed)

    def weight(k, n):
        w = rng.normal(0, 1 / np.sqrt(k), (k, n))
        w[rng.integers(0, k, n), np.arange(n)] *= 40
        return w
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["m0"], name="mm0"),
             helper.make_node("Add", ["m0", "b0"], ["h0"], name="bias0"),
             helper.make_node("MatMul", ["h0", "w1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["y"], name="bias1")]
    inits = [_init("w0", weight(24, 32)), _init("b0", rng.normal(0, .1, 32)),
             _init("w1", weight(32, 6)), _init("b1", rng.normal(0, .1, 6))]
    path, model = _save(tmp_path, nodes, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 4, 24])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 4, 6])], inits, "outliers")
    return path, model, rng.normal(0, 1, (96, 4, 24)).astype(np.float32)


def _convnet(tmp_path, seed=2):
    """Conv 3x3 (padded) -> Relu -> depthwise Conv 3x3 (groups = 8, stride 2) -> Relu ->
    1x1 Conv -> Flatten -> Gemm."""
    rng = np.random.default_rng(seed)
    inits = [_init("w1", rng.normal(0, .3, (8, 3, 3, 3))), _init("b1", rng.normal(0, .1, 8)),
             _init("wd", rng.normal(0, .3, (8, 1, 3, 3))), _init("bd", rng.normal(0, .1, 8)),
             _init("wp", rng.normal(0, .3, (6, 8, 1, 1))),
             _init("wf", rng.normal(0, .2, (6 * 4 * 4, 5))), _init("bf", rng.normal(0, .1, 5))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "wd", "bd"], ["cd"], name="depthwise",
                              pads=[1, 1, 1, 1], strides=[2, 2], group=8),
             helper.make_node("Relu", ["cd"], ["rd"], name="relud"),
             helper.make_node("Conv", ["rd", "wp"], ["cp"], name="pointwise"),
             helper.make_node("Flatten", ["cp"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc")]
    path, model = _save(tmp_path, nodes, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 5])], inits, "convnet")
    return path, model, rng.normal(0, 1, (48, 3, 8, 8)).astype(np.float32)


def _program_source(compiled) -> str:
    return "\n".join(step.program.source for step in compiled.steps
                     if getattr(step, "program", None) is not None)


def test_int16_weights_are_onnxruntimes_qdq_model_and_keep_what_int8_weights_lose(tmp_path):
    """With int16 activations, the int8 weights are what is left of the error: int16 ones
    are closer to float by far, and the chip computes exactly the QDQ model's values."""
    path, model, x = _outlier_mlp(tmp_path)
    (want,) = session(model).run(None, {"x": x})
    snr = {}
    for bits in (8, 16):
        compiled = tpu_compile(path, batch=16, calibration=x, calibration_method="minmax",
                               activation_bits=16, weight_bits=bits, validate=False)
        # an int16 output of int16 x int16 products: onnxruntime's float32 sums round
        # near-ties of the output's step apart from the chip's exact ones (docs/compiler.md,
        # 16-bit activations): still never more than one step
        got, qdq = _same_as_qdq(compiled, {"x": x}, identical=0.995)
        snr[bits] = _snr(want, got)
        wide = TensorProto.INT16 if bits == 16 else TensorProto.INT8
        assert {_weight_types(qdq)[w] for w in ("w0", "w1")} == {wide}
        assert all(r.where == "TPU" for r in compiled.report.rows if r.op_type == "MatMul")
    assert snr[16] > snr[8] + 15, snr
    assert compiled.report.wide_weights == ["mm0", "mm1"]
    assert "MMC" in _program_source(compiled) and "HD" in _program_source(compiled)
    assert "int16 weights wherever the TPU takes them" in compiled.report.source


def test_convs_depthwise_and_gemm_with_int16_weights_on_8_bit_activations(tmp_path):
    path, model, x = _convnet(tmp_path)
    compiled = tpu_compile(path, batch=8, calibration=x, calibration_method="minmax",
                           weight_bits=16, validate=False)
    got, qdq = _same_as_qdq(compiled, {"x": x})
    types = _weight_types(qdq)
    assert {types[w] for w in ("w1", "wd", "wp", "wf")} == {TensorProto.INT16}
    assert set(compiled.report.wide_weights) == {"conv1", "depthwise", "pointwise", "fc"}
    text = compiled.report.text()
    assert "16-bit weights (int16" in text and "int16 weights (D flag, half rate)" in text
    assert "MMC.CSOD" in _program_source(compiled) or "MMC.CSOUD" in _program_source(compiled)


def test_wide_weight_names_nodes_and_the_rest_keep_int8(tmp_path):
    path, model, x = _convnet(tmp_path)
    compiled = tpu_compile(path, batch=8, calibration=x, calibration_method="minmax",
                           wide_weights="depthwise,fc", validate=False)
    _, qdq = _same_as_qdq(compiled, {"x": x})
    types = _weight_types(qdq)
    assert types["wd"] == types["wf"] == TensorProto.INT16
    assert types["w1"] == types["wp"] == TensorProto.INT8
    assert compiled.report.wide_weights == ["depthwise", "fc"]
    assert "int16 weights asked for: depthwise, fc" in compiled.report.source


def test_an_lstm_named_gives_its_unrolled_gate_gemms_int16_weights(tmp_path):
    """--wide-weight with the user's LSTM node: every Gemm unrolled from it (per step and
    gate, input and recurrent side) gets int16 weights, the steps' copies of one weight
    alike; the head keeps int8."""
    import real_models
    m = real_models.lstm_classifier()
    path = tmp_path / "lstm.onnx"
    onnx.save(m.model, str(path))
    compiled = tpu_compile(path, batch=50, calibration=m.calibration,
                           batch_axes=m.batch_axis, calibration_method="minmax",
                           wide_weights=["/lstm/LSTM"], activation_bits=16, validate=False)
    qdq = onnx.load(str(compiled.reference_model))
    gemms = [r for r in compiled.report.compiled_nodes if r.op_type == "Gemm"]
    wide = set(compiled.report.wide_weights)
    assert len(wide) == len(gemms) - 1 and "/fc/Gemm" not in wide, (wide, len(gemms))
    assert all(r.where == "TPU" for r in gemms)
    inits = {t.name: t for t in qdq.graph.initializer}
    producer = {o: n for n in qdq.graph.node for o in n.output}
    distinct = set()
    for node in qdq.graph.node:
        if node.op_type == "Gemm":
            dq = producer[node.input[1]]
            kind = inits[dq.input[0]].data_type
            assert kind == (TensorProto.INT8 if node.name == "/fc/Gemm" else TensorProto.INT16)
            if node.name != "/fc/Gemm":
                distinct.add((numpy_helper.to_array(inits[dq.input[0]]).tobytes(),
                              numpy_helper.to_array(inits[dq.input[1]]).tobytes()))
    # each step's copy of a gate's weights is quantized alike (one decision over every
    # step's sums): 4 gates x (input, recurrent side) distinct int16 weights
    assert len(distinct) == 8, len(distinct)
    names = [o.name for o in m.reference.graph.output]
    (want,) = session(qdq).run(names, m.evaluation)
    got = compiled.run(m.evaluation)[m.output]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.99
    # the cell runs on the chip in int16, whose Gemms sum exactly where onnxruntime rounds
    # in float32: a near-tie that moves a Tanh / Sigmoid table's 8-bit index moves its
    # output a table step, which the later steps carry (one row of 300 here, 1.3 steps of
    # the logits' range in 8 bits); the others within a step of the int16 logits
    step = float(numpy_helper.to_array(inits["logits_scale"]))
    assert np.mean(np.rint(np.abs(got - want) / step) <= 1) >= 0.99
    noise = np.sum((got - want).astype(np.float64) ** 2)
    assert 10 * np.log10(np.sum(want.astype(np.float64) ** 2) / max(noise, 1e-30)) >= 40


def test_cli_compiles_int16_weights_to_an_outdir_that_infer_runs_as_onnxruntime_does(
        tmp_path, capsys):
    path, model, x = _convnet(tmp_path)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    code = compile_main([str(path), "-o", str(out), "--batch", "8", "--calibrate",
                         str(tmp_path / "x.npy"), "--calibration-method", "minmax",
                         "--weight-bits", "16", "--no-validate"])
    text, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in text + err, err
    assert "16-bit weights (int16" in text
    report = json.loads((out / "report.json").read_text())
    assert set(report["wide_weights"]) == {"conv1", "depthwise", "pointwise", "fc"}
    code = infer_main([str(out), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npz"),
                       "--engine", "emulator", "-q"])
    assert code == 0, capsys.readouterr().err
    with np.load(tmp_path / "y.npz") as data:
        got = data["y"]
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    (want,) = session(qdq).run(["y"], {"x": x})
    step = float(numpy_helper.to_array(
        {t.name: t for t in qdq.graph.initializer}["y_scale"]))
    assert np.mean(got == want) >= 0.999 and np.rint(np.abs(got - want) / step).max() <= 1


def test_int16_weights_double_the_array_time(tmp_path):
    """The paper's half rate: each layer's array-active cycles double with int16 weights,
    and the report's segment cycles grow with them."""
    path, model, x = _convnet(tmp_path)
    segments = {}
    for bits in (8, 16):
        compiled = tpu_compile(path, batch=8, calibration=x, calibration_method="minmax",
                               weight_bits=bits, validate=False)
        (segments[bits],) = compiled.report.segments
    assert segments[16].array_active_cycles == 2 * segments[8].array_active_cycles
    assert segments[16].cycles > segments[8].cycles


@pytest.mark.parametrize("kwargs, words", [
    ({"weight_bits": 12}, "weight bits 12: expected 8 or 16"),
    ({"weight_bits": "wide"}, "weight bits 'wide'"),
    ({"wide_weights": ["nonesuch"]}, "--wide-weight nonesuch: no node of that name"),
    ({"wide_weights": ["relu1"]}, "--wide-weight relu1: cannot have 16-bit weights: it is a "
                                  "Relu, not a Conv, Gemm or MatMul"),
    ({"wide_weights": ["fc"], "keep_float": "fc"}, "--wide-weight fc: cannot have 16-bit "
                                                   "weights: it is not quantized"),
])
def test_bad_wide_weight_options_are_one_clear_error(tmp_path, kwargs, words):
    path, _, x = _convnet(tmp_path)
    with pytest.raises(CompileError, match=words):
        tpu_compile(path, batch=4, calibration=x[:8], validate=False, **kwargs)


def test_cli_refuses_a_bad_weight_bits_value_and_an_unknown_node(tmp_path, capsys):
    path, _, x = _convnet(tmp_path)
    np.save(tmp_path / "x.npy", x[:16])
    for extra, words in ((["--weight-bits", "4"], "weight bits '4'"),
                         (["--wide-weight", "conv1,nonesuch"], "--wide-weight nonesuch")):
        code = compile_main([str(path), "-o", str(tmp_path / "out"), "--batch", "8",
                             "--calibrate", str(tmp_path / "x.npy"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and words in err and "Traceback" not in err, err
        assert not (tmp_path / "out").exists()


def _averaging(tmp_path, k):
    """A Gemm averaging k positive inputs with positive weights: every product adds, so the
    int32 accumulators fill fastest (`k` inputs)."""
    rng = np.random.default_rng(5)
    w = rng.uniform(0.5, 1.0, (k, 4)).astype(np.float32)
    path, model = _save(tmp_path, [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                        [_init("w", w)], f"avg{k}")
    return path, model, w, rng.uniform(0, 1, (32, k)).astype(np.float32)


def test_weights_whose_accumulators_would_wrap_get_a_coarser_int16_step(tmp_path):
    """512 positive products of 8-bit inputs at the finest int16 weight steps would not fit
    int32 with the guard's headroom on the calibration's sums; the sum no input can exceed
    (512 x w x the input's largest value) is less, so each channel's step is the one that
    holds it, and the compiled model computes the QDQ model's values (no sum wrapped)."""
    path, model, w, x = _averaging(tmp_path, 512)
    compiled = tpu_compile(path, batch=8, calibration=x, calibration_method="minmax",
                           weight_bits=16, validate=False)
    qdq = onnx.load(str(compiled.reference_model))
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    assert inits["w_quantized"].dtype == np.int16
    finest = np.abs(w).max(axis=0) / 32767
    factor = inits["w_scale"] / finest
    worst = np.abs(w).astype(np.float64).sum(axis=0) * float(x.max())
    fits = worst / (float(inits["x_scale"]) * (2 ** 31 - 1)) / finest
    assert np.allclose(factor, fits, rtol=1e-3) and np.all(factor > 1), (factor, fits)
    # the guard's own bound, from the QDQ model's scales: the largest possible sum fits
    x_scale, x_zero = float(inits["x_scale"]), int(inits["x_zero_point"])
    worst = (np.abs(inits["w_quantized"].astype(np.int64)) * max(x_zero, 255 - x_zero)).sum(0)
    assert worst.max() < 2 ** 31, worst
    source = compiled.report.source
    assert "int16 weights at steps coarser than the finest" in source, source
    # the rounding's gain over int8 is the finest steps' 48 dB less the coarsening's
    gain = float(source.split("48 dB at the finest): fc ")[1].split()[0])
    assert gain == pytest.approx(20 * np.log10(32767 / 127 / factor.max()), abs=1.0)
    _same_as_qdq(compiled, {"x": x}, identical=0.99)
    assert compiled.report.wide_weights == ["fc"] and x_scale > 0


def test_weights_that_no_useful_int16_step_fits_keep_int8_with_the_figure(tmp_path):
    """32,768 positive products: the int16 steps that hold the sums are so coarse that their
    rounding is less than 12 dB below int8's, so the weights stay int8 (with the figure)
    and the Gemm still maps."""
    path, model, w, x = _averaging(tmp_path, 32768)
    compiled = tpu_compile(path, batch=4, calibration=x, calibration_method="minmax",
                           weight_bits=16, validate=False)
    qdq = onnx.load(str(compiled.reference_model))
    assert _weight_types(qdq)["w"] == TensorProto.INT8
    source = compiled.report.source
    assert "weights kept 8-bit although asked for 16: fc: int16 weights, the accumulators " \
           "of 'fc' would reach" in source, source
    figure = float(source.split("would reach ")[1].split()[0])
    coarser = float(source.split("(up to ")[1].split("x")[0])
    gain = float(source.split("leave their rounding only ")[1].split()[0])
    # the steps that fit hold the largest sum any input gives (32,768 x w x the largest
    # input: less than 16x the calibration's); 258x finer steps (int8 / int16) over that
    # coarsening is the gain in dB
    x_step = float(numpy_helper.to_array(
        {t.name: t for t in qdq.graph.initializer}["x_scale"]))
    worst = np.abs(w).astype(np.float64).sum(axis=0) * float(x.max())
    finest = np.abs(w).max(axis=0) / 32767
    assert coarser == pytest.approx((worst / (x_step * (2 ** 31 - 1)) / finest).max(),
                                    rel=0.02)
    assert figure > 2 ** 31 and gain < 12
    assert gain == pytest.approx(20 * np.log10(32767 / 127 / coarser), abs=0.2)
    assert compiled.report.wide_weights == []
    assert all(r.where == "TPU" for r in compiled.report.rows if r.op_type == "Gemm")
    _same_as_qdq(compiled, {"x": x}, identical=0.99)


def test_auto_calibration_gives_the_weights_16_bits_when_int16_activations_fall_short(
        tmp_path):
    """Below --min-snr with every activation int16, the check ranks the weights by what
    each costs in 8 bits and makes them int16 (the costliest first): the regression output
    reaches the bar, every MatMul still on the TPU, nothing kept in float."""
    path, model, x = _outlier_mlp(tmp_path)
    (want,) = session(model).run(None, {"x": x})
    compiled = tpu_compile(path, batch=16, calibration=x, min_snr=60)
    source = compiled.report.source
    assert "made int16 by the check" in source and "kept in float" not in source
    assert "int16 weights chosen by the check: 2 of 2 weights" in source, source
    assert compiled.report.validation.outputs[0].snr_db >= 60
    got, _ = _same_as_qdq(compiled, {"x": x}, identical=0.995)     # an int16 output, above
    assert _snr(want, got) >= 60
    assert set(compiled.report.wide_weights) == {"mm0", "mm1"}
    assert all(r.where == "TPU" for r in compiled.report.rows if r.op_type == "MatMul")


def test_a_vanishing_weight_channel_does_not_keep_the_others_8_bit(tmp_path):
    """Paddle's exports have channels trained to ~1e-35 (scales.py makes them zeros at scale
    1): such a channel's step is no reason to keep the others' weights int8."""
    rng = np.random.default_rng(8)
    w = rng.normal(0, 0.3, (24, 6)).astype(np.float32)
    w[:, 2] = 1e-35            # a zero at 8 bits and at 16
    w[:, 4] = 1e-27            # a zero at 16 bits (a step of 3e-32), not quite at 8 (8e-30)
    path, model = _save(tmp_path, [helper.make_node("Gemm", ["x", "w", "b"], ["y"],
                                                    name="fc")],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 24])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
                        [_init("w", w), _init("b", rng.normal(0, 1, 6))], "vanishing")
    x = rng.normal(0, 1, (64, 24)).astype(np.float32)
    compiled = tpu_compile(path, batch=8, calibration=x, calibration_method="minmax",
                           weight_bits=16, activation_bits=16, validate=False)
    qdq = onnx.load(str(compiled.reference_model))
    assert _weight_types(qdq)["w"] == TensorProto.INT16, compiled.report.source
    assert "kept 8-bit" not in compiled.report.source
    assert compiled.report.wide_weights == ["fc"]
    got, _ = _same_as_qdq(compiled, {"x": x}, identical=0.995)     # an int16 output
    (want,) = session(model).run(None, {"x": x})
    assert _snr(want, got) > 60

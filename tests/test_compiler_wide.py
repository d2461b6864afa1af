"""16-bit activations from float models (front/widen.py, --activation-bits, --wide-tensor):
the tensors between TPU matrix operators quantized to int16 by onnxruntime's own quantizer,
compiled with MatrixMultiply's H flag and Activate's int16 output.  Oracles: onnxruntime on
the same QDQ model (the compiled model must compute what it defines: >= 99.9 % identical,
none more than one int16 step off) and on the float model (16-bit keeps answers 8-bit
loses)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.cli import compile_main
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.quantize import QuantOptions, tpu_nodes
from tpuasm.compiler.front.widen import eligible
from tpuasm.compiler.ort import session


def _save(tmp_path, nodes, inputs, outputs, inits, name):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    return path, m


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def _mlp(tmp_path, seed=0):
    """Gemm -> Relu -> Gemm -> Relu -> Gemm: logits whose 8-bit ranges an input with rare
    large rows (x 40) stretches, so that 8-bit steps swamp the common rows."""
    rng = np.random.default_rng(seed)
    dims = [16, 32, 32, 10]
    inits, nodes, prev = [], [], "x"
    for i, (k, n) in enumerate(zip(dims[:-1], dims[1:])):
        inits += [_init(f"w{i}", rng.normal(0, 1 / np.sqrt(k), (k, n))),
                  _init(f"b{i}", rng.normal(0, 0.1, n))]
        last = i == len(dims) - 2
        out = "y" if last else f"g{i}"
        nodes.append(helper.make_node("Gemm", [prev, f"w{i}", f"b{i}"], [out], name=f"fc{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"h{i}"], name=f"relu{i}"))
            prev = f"h{i}"
    x = rng.normal(0, 1, (256, 16)).astype(np.float32)
    x[::32] *= 40
    path, model = _save(tmp_path, nodes, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 10])], inits, "mlp")
    return path, model, x


def _cnn(tmp_path, seed=1):
    """Conv (padded) -> Relu -> Conv (stride 2) -> Sigmoid -> Flatten -> Gemm: the Sigmoid's
    input and output stay 8-bit (a lookup table), the rest can be int16."""
    rng = np.random.default_rng(seed)
    inits = [_init("w1", rng.normal(0, 0.3, (8, 3, 3, 3))), _init("b1", rng.normal(0, 0.1, 8)),
             _init("w2", rng.normal(0, 0.2, (6, 8, 3, 3))), _init("b2", rng.normal(0, 0.1, 6)),
             _init("w3", rng.normal(0, 0.2, (6 * 3 * 3, 5)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1",
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2",
                              pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Sigmoid", ["c2"], ["s2"], name="sig"),
             helper.make_node("Flatten", ["s2"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w3"], ["y"], name="fc")]
    x = rng.normal(0, 1, (64, 3, 6, 6)).astype(np.float32)
    x[::16] *= 30
    path, model = _save(tmp_path, nodes, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 6, 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 5])], inits, "cnn")
    return path, model, x


def _types(qdq) -> dict[str, int]:
    """Tensor -> the element type its QuantizeLinear writes (its zero point's type; the
    quantizer names the zero point after the float model's tensor)."""
    inits = {t.name: t for t in qdq.graph.initializer}
    return {n.input[2].removesuffix("_zero_point"): inits[n.input[2]].data_type
            for n in qdq.graph.node
            if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits}


def _same_as_qdq(compiled, feeds, out="y", identical=0.999):
    """The emulator against onnxruntime on the compiled model's own QDQ model."""
    qdq = onnx.load(str(compiled.reference_model))
    got = compiled.run(feeds, engine="emulator")[out]
    (want,) = session(qdq).run([out], feeds)
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    step = float(inits[f"{out}_scale"])
    assert np.mean(got == want) >= identical
    # in steps (the dequantized float32 values carry their own rounding at large values)
    assert np.rint(np.abs(got - want) / step).max() <= 1
    return got, qdq


def test_int16_mlp_is_onnxruntimes_qdq_model_and_keeps_what_8_bit_loses(tmp_path):
    path, model, x = _mlp(tmp_path)
    (want,) = session(model).run(None, {"x": x})
    top = {}
    for bits in (8, 16):
        compiled = tpu_compile(path, batch=32, calibration=x, calibration_method="minmax",
                               activation_bits=bits)
        got, qdq = _same_as_qdq(compiled, {"x": x})
        top[bits] = float(np.mean(got.argmax(1) == want.argmax(1)))
        types = _types(qdq)
        wide = TensorProto.INT16 if bits == 16 else TensorProto.UINT8
        assert {types[t] for t in ("x", "h0", "h1", "y")} == {wide}
        assert all(r.where == "TPU" for r in compiled.report.compiled_nodes
                   if r.node.startswith("fc"))
    assert top[8] < 0.8 and top[16] >= 0.99, top
    assert "int16 activations" in compiled.report.source


def test_int16_cnn_gives_its_sigmoid_an_8_bit_index_and_runs_every_op_on_the_tpu(tmp_path):
    path, model, x = _cnn(tmp_path)
    compiled = tpu_compile(path, batch=16, calibration=x, calibration_method="minmax",
                           activation_bits=16, validate=False)
    # one int16 near-tie among the 320 outputs (the chip's exact requantization against
    # onnxruntime's float32 one): 99.7 % identical, none more than a step apart
    got, qdq = _same_as_qdq(compiled, {"x": x}, identical=0.99)
    types = _types(qdq)
    assert types["x"] == types["r1"] == types["c2"] == TensorProto.INT16
    # the table reads c2 converted to 8 bits (onnxruntime's convert), and writes 8 bits
    assert types["c2_zero_point_convert"] == TensorProto.UINT8
    assert types["s2"] != TensorProto.INT16
    for node in ("conv1", "conv2", "sig", "fc"):
        row = next(r for r in compiled.report.compiled_nodes if r.node == node)
        assert row.where == "TPU", row
    source = "\n".join(step.program.source for step in compiled.steps
                       if getattr(step, "program", None) is not None)
    assert "MMC.CSOH" in source and "CFG act_out, 2" in source
    assert "VADD.UBLX" in source           # the requantization to the index, then the table


def test_eligible_names_why_a_tensor_stays_8_bit(tmp_path):
    path, model, _ = _cnn(tmp_path)
    model = onnx.shape_inference.infer_shapes(model)
    chosen = set(tpu_nodes(model, QuantOptions()))
    groups, refusals = eligible(model, chosen)
    assert set(groups) == {"x", "r1", "c2", "y"}
    assert "Sigmoid 'sig'" in refusals["s2"] and "writes 8-bit only" in refusals["s2"]


def test_wide_tensor_option_makes_only_the_named_tensor_int16(tmp_path):
    path, model, x = _mlp(tmp_path)
    compiled = tpu_compile(path, batch=32, calibration=x, calibration_method="minmax",
                           wide_tensors=["h0"], validate=False)
    types = _types(onnx.load(str(compiled.reference_model)))
    assert types["h0"] == TensorProto.INT16
    assert types["x"] == types["h1"] == types["y"] == TensorProto.UINT8
    _same_as_qdq(compiled, {"x": x})
    assert "int16 activations asked for: h0" in compiled.report.source


@pytest.mark.parametrize("kwargs, words", [
    ({"activation_bits": 12}, "activation bits 12: expected 8 or 16"),
    ({"activation_bits": "wide"}, "activation bits 'wide'"),
    ({"wide_tensors": ["nonesuch"]}, "--wide-tensor nonesuch: .*no tensor of that name"),
    ({"wide_tensors": ["s2"]}, "--wide-tensor s2: cannot be 16-bit: made by Sigmoid"),
])
def test_bad_wide_options_are_one_clear_error(tmp_path, kwargs, words):
    path, _, x = _cnn(tmp_path)
    with pytest.raises(CompileError, match=words):
        tpu_compile(path, batch=4, calibration=x[:8], validate=False, **kwargs)


def test_cli_refuses_a_bad_activation_bits_value(tmp_path, capsys):
    path, _, x = _mlp(tmp_path)
    np.save(tmp_path / "x.npy", x[:32])
    code = compile_main([str(path), "-o", str(tmp_path / "out"), "--batch", "8",
                         "--calibrate", str(tmp_path / "x.npy"), "--activation-bits", "4"])
    err = capsys.readouterr().err
    assert code != 0 and "activation bits '4'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_auto_calibration_makes_the_noisiest_tensors_int16_before_floating_anything(tmp_path):
    """Min-max, percentile and entropy all lose answers in 8 bits; the check then makes
    activation tensors int16 (every matrix op stays on the TPU, nothing kept in float)."""
    path, model, x = _mlp(tmp_path)
    (want,) = session(model).run(None, {"x": x})
    compiled = tpu_compile(path, batch=32, calibration=x)
    source = compiled.report.source
    assert "made int16 by the check" in source and "kept in float" not in source
    assert compiled.report.validation.outputs[0].agreement >= 0.99
    assert compiled.report.wide_tensors and all(
        r.where == "TPU" for r in compiled.report.compiled_nodes if r.node.startswith("fc"))
    got, _ = _same_as_qdq(compiled, {"x": x})
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.99
    assert "16-bit activations" in compiled.report.text()
    assert compiled.report.to_json()["wide_tensors"] == compiled.report.wide_tensors


def _averaging(tmp_path):
    """A Gemm over 512 positive inputs with positive weights (an average): int16 inputs
    would take its accumulators to ~1.6e9, within 4x of int32's limit."""
    rng = np.random.default_rng(5)
    w = rng.uniform(0.5, 1.0, (512, 4)).astype(np.float32)
    path, model = _save(tmp_path, [helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 512])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
                        [_init("w", w)], "avg")
    return path, model, rng.uniform(0, 1, (64, 512)).astype(np.float32)


def test_a_tensor_whose_accumulators_could_wrap_stays_8_bit_and_the_report_says_why(tmp_path):
    path, model, x = _averaging(tmp_path)
    compiled = tpu_compile(path, batch=16, calibration=x, calibration_method="minmax",
                           activation_bits=16, validate=False)
    types = _types(onnx.load(str(compiled.reference_model)))
    assert types["x"] == TensorProto.UINT8 and types["y"] == TensorProto.INT16
    assert "kept 8-bit although asked for 16: x: int16, the accumulators of 'fc'" in \
        compiled.report.source
    # an int16 result of 512 positive float32 products: onnxruntime's float Gemm rounds
    # the sum (~3e-5 relative, 1 step at 32,000) where the chip's integer sum is exact
    _same_as_qdq(compiled, {"x": x}, identical=0.98)


def test_int16_inputs_take_the_array_twice_as_long(tmp_path):
    """The paper's half speed: every layer of the MLP reads an int16 input, so the array's
    active cycles (the timed run at compile time) double."""
    path, model, x = _mlp(tmp_path)
    active = {}
    for bits in (8, 16):
        compiled = tpu_compile(path, batch=32, calibration=x, calibration_method="minmax",
                               activation_bits=bits, validate=False)
        (segment,) = compiled.report.segments
        active[bits] = segment.array_active_cycles
    assert active[16] == 2 * active[8]


def _sigmoid_between(tmp_path):
    """Gemm -> Sigmoid -> Gemm over inputs with rare large rows: the Sigmoid's lookup table
    reads an 8-bit input whose step the rare rows stretch past its curve."""
    rng = np.random.default_rng(3)
    inits = [_init("w0", rng.normal(0, 1 / 4, (16, 32))), _init("b0", rng.normal(0, .1, 32)),
             _init("w1", rng.normal(0, 1, (32, 10)))]
    nodes = [helper.make_node("Gemm", ["x", "w0", "b0"], ["g"], name="fc0"),
             helper.make_node("Sigmoid", ["g"], ["s"], name="sig"),
             helper.make_node("Gemm", ["s", "w1"], ["y"], name="fc1")]
    path, model = _save(tmp_path, nodes, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 10])], inits, "sig")
    x = rng.normal(0, 1, (256, 16)).astype(np.float32)
    x[::16] *= 60
    return path, model, x


def test_auto_gives_a_sigmoid_between_matrix_ops_an_int16_input_and_keeps_it_on_the_tpu(
        tmp_path):
    """The lookup's 8-bit input is the loss (rare large rows stretch its step past the
    curve): the check makes the tensors int16, and the Sigmoid's table reads its input
    through an 8-bit index over where the sigmoid still changes (front/widen.py
    index_range), so all three nodes stay on the TPU."""
    path, model, x = _sigmoid_between(tmp_path)
    compiled = tpu_compile(path, batch=32, calibration=x)
    where = {r.node: r.where for r in compiled.report.rows}
    assert where == {"fc0": "TPU", "sig": "TPU", "fc1": "TPU"}
    assert "min-max: 83.59 % top-1 agreement" in compiled.report.source
    assert compiled.report.validation.outputs[0].agreement >= 0.98
    types = _types(onnx.load(str(compiled.reference_model)))
    assert {types[t] for t in ("x", "g", "y")} == {TensorProto.INT16}
    assert types["g_zero_point_convert"] == types["s"] == TensorProto.UINT8
    _same_as_qdq(compiled, {"x": x}, identical=0.99)


def test_cli_compiles_int16_to_an_outdir_that_infer_runs_as_onnxruntime_does(tmp_path, capsys):
    """`tpuasm compile --activation-bits 16` then `tpuasm infer` on the emulator: the OUTDIR
    keeps each tensor's width, the report names the int16 tensors."""
    import json
    from tpuasm.compiler.cli import infer_main
    path, model, x = _cnn(tmp_path)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    code = compile_main([str(path), "-o", str(out), "--batch", "16", "--calibrate",
                         str(tmp_path / "x.npy"), "--calibration-method", "minmax",
                         "--activation-bits", "16", "--no-validate"])
    text, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in text + err, err
    assert "16-bit activations (int16" in text and "int16 input (H flag, half rate)" in text
    report = json.loads((out / "report.json").read_text())
    assert set(report["wide_tensors"]) >= {"x_QuantizeLinear_Output"}
    code = infer_main([str(out), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npz"),
                       "--engine", "emulator", "-q"])
    assert code == 0, capsys.readouterr().err
    with np.load(tmp_path / "y.npz") as data:
        got = data["y"]
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    (want,) = session(qdq).run(["y"], {"x": x})
    assert np.mean(got == want) >= 0.99           # int16 near-ties (the Sigmoid's index)
    step = float(numpy_helper.to_array(next(t for t in qdq.graph.initializer
                                            if t.name == "y_scale")))
    assert np.rint(np.abs(got - want) / step).max() <= 1


def test_int16_tensors_the_machine_cannot_hold_are_quantized_8_bit_again(tmp_path):
    """On a Unified Buffer of 128 rows the convolutions fit with 8-bit images, not with
    int16 ones (two rows a pixel): the back end refuses them, and the compile quantizes
    their tensors 8-bit again, so every matrix node stays on the TPU."""
    path, model, x = _cnn(tmp_path)
    config = {"ub_rows": 128, "array_size": 8}
    compiled = tpu_compile(path, batch=1, calibration=x, calibration_method="minmax",
                           activation_bits=16, validate=False, config=config)
    assert {r.node: r.where for r in compiled.report.rows if r.op_type in ("Conv", "Gemm")} \
        == {"conv1": "TPU", "conv2": "TPU", "fc": "TPU"}
    assert "kept 8-bit for the back end (int16 would not fit the machine): x, r1" in \
        compiled.report.source
    types = _types(onnx.load(str(compiled.reference_model)))
    assert types["x"] != TensorProto.INT16 and types["r1"] != TensorProto.INT16
    assert types["y"] == TensorProto.INT16
    _same_as_qdq(compiled, {"x": x})


def test_the_host_step_keeps_a_bias_add_pytorch_writes_bias_first(tmp_path):
    """PyTorch writes a rank-3 Linear as MatMul then Add(bias, product): the check's step
    that moves the 8-bit-only nodes to the host must keep that Add on the TPU (the
    MatMul's int32 bias), else the MatMul's output is left unquantized and the MatMul goes
    to the host with it (a BERT encoder lost every MAC that way)."""
    from tpuasm.compiler.runtime.calibsearch import _eight_bit_nodes
    rng = np.random.default_rng(0)
    inits = [_init("w", rng.normal(0, 0.3, (8, 8))), _init("b", rng.normal(0, 0.1, 8))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"], name="mm"),
             helper.make_node("Add", ["b", "p"], ["q"], name="bias"),
             helper.make_node("Sigmoid", ["q"], ["y"], name="sig")]
    _, model = _save(tmp_path, nodes, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 4, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 4, 8])], inits, "linear3")
    assert _eight_bit_nodes(model, ["mm", "bias", "sig"]) == ["sig"]


def test_the_search_counts_its_rows_along_the_batch_axis():
    """A sequence-first LSTM's check rows are its sequences (axis 1), not its time steps:
    the report said 'on 12 rows' for 128 sequences of 12 steps."""
    from tpuasm.compiler.runtime.calibsearch import _rows
    check = {"x": np.zeros((12, 128, 16)), "h0": np.zeros((1, 128, 32))}
    assert _rows(check, {"x": 1, "h0": 1}) == 128
    assert _rows({"x": np.zeros((5, 3))}, None) == 5
    assert _rows({"s": np.zeros(3), "x": np.zeros((7, 2))}, {"s": None, "x": 0}) == 7


def test_a_requantization_across_a_host_layout_node_is_found():
    """MatMul -> Q/DQ (int16) -> Squeeze -> Q/DQ (uint8) -> MatMul: the second MatMul's
    input is requantized on the way, which the TPU operator cannot read
    (widen.requantized_inputs, the search's guard); with one set of parameters it is not."""
    from onnx import TensorProto, helper, numpy_helper
    from tpuasm.compiler.front.widen import requantized_inputs

    def model(second_scale, zero_type):
        zero = np.zeros((), np.int16 if zero_type == TensorProto.INT16 else np.uint8)
        inits = [numpy_helper.from_array(np.ones((4, 4), np.float32), "w1"),
                 numpy_helper.from_array(np.ones((4, 4), np.float32), "w2"),
                 numpy_helper.from_array(np.array([0], np.int64), "axis"),
                 numpy_helper.from_array(np.array(0.1, np.float32), "s1"),
                 numpy_helper.from_array(np.zeros((), np.int16), "z1"),
                 numpy_helper.from_array(np.array(second_scale, np.float32), "s2"),
                 numpy_helper.from_array(zero, "z2")]
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="fc1"),
                 helper.make_node("QuantizeLinear", ["a", "s1", "z1"], ["a_q"]),
                 helper.make_node("DequantizeLinear", ["a_q", "s1", "z1"], ["a_dq"]),
                 helper.make_node("Squeeze", ["a_dq", "axis"], ["h"], name="last"),
                 helper.make_node("QuantizeLinear", ["h", "s2", "z2"], ["h_q"]),
                 helper.make_node("DequantizeLinear", ["h_q", "s2", "z2"], ["h_dq"]),
                 helper.make_node("MatMul", ["h_dq", "w2"], ["y"], name="fc2")]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])

    assert requantized_inputs(model(0.05, TensorProto.UINT8), {"fc1", "fc2"}) == ["fc2"]
    assert requantized_inputs(model(0.1, TensorProto.INT16), {"fc1", "fc2"}) == []

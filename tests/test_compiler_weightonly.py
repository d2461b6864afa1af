"""Models quantized by onnxruntime's own tools in the forms beyond 8 bits: MatMulNBits
(weight-only, blocks of 2/4/8-bit codes; front/weightonly.py), 4-bit QDQ weights and uint16
activations (front/widths.py), block-wise DequantizeLinear, and 16-bit models whose sums
could wrap the TPU's int32 accumulators (front/accumroom.py).  Oracles: onnxruntime's
MatMulNBits kernel, onnxruntime on the shipped model and on OUTDIR's, exact bounds."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper, version_converter

import real_models
from float_models import build
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.accumroom import fit_accumulators, fits
from tpuasm.compiler.front.qdqfloat import read_back
from tpuasm.compiler.front.weightonly import nbits_weight
from tpuasm.compiler.ort import session

ROWS = 256
_OUT = "y"                          # the MLP's output


def _mlp(opset: int) -> onnx.ModelProto:
    model = build([("matmul", 48), ("relu",), ("matmul", 32), ("relu",), ("gemm", 8)], [64],
                  seed=3)
    model = version_converter.convert_version(model, opset)
    model.ir_version = 10 if opset >= 21 else 8
    return model


def _rows(seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (ROWS, 64)).astype(np.float32)


def _static(tmp_path, model, activations: str, weights: str, name: str, rows=None,
            **options):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    x = _rows(1) if rows is None else rows
    src, dst = tmp_path / f"{name}.float.onnx", tmp_path / f"{name}.onnx"
    onnx.save(model, str(src))
    quantize_static(str(src), str(dst), real_models.calibration_reader({"x": x}, 64),
                    quant_format=QuantFormat.QDQ,
                    per_channel=options.pop("per_channel", True),
                    activation_type=getattr(QuantType, activations),
                    weight_type=getattr(QuantType, weights), **options)
    return dst


def _nbits(tmp_path, model, name: str, symmetric: bool, qdq: bool = False):
    pytest.importorskip("onnx_ir")            # onnxruntime's quantizer needs it
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits
    config = nbits.DefaultWeightOnlyQuantConfig(
        block_size=16, is_symmetric=symmetric, op_types_to_quantize=("MatMul",),
        quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator)
    quantizer = nbits.MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    path = tmp_path / f"{name}.onnx"
    quantizer.model.save_model_to_file(str(path), False)
    return path


def _step(qdq_path, output: str) -> float:
    qdq = onnx.load(str(qdq_path))
    dq = next(n for n in qdq.graph.node if n.op_type == "DequantizeLinear"
              and n.output[0] == output)
    scale = next(t for t in qdq.graph.initializer if t.name == dq.input[1])
    return float(numpy_helper.to_array(scale))


def _snr(got, want) -> float:
    return float(10 * np.log10((want ** 2).sum() / ((got - want) ** 2).sum()))


def _shipped(path, x):
    return session(onnx.load(str(path))).run(None, {"x": x})[0]


# --- MatMulNBits: its weights, as onnxruntime's kernel multiplies by them -----------------

def _nbits_node(rng, k, n, bits, block, zeros, groups, bias):
    blocks, blob = -(-k // block), block * bits // 8
    packed = rng.integers(0, 256, (n, blocks, blob), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)
    zp = {None: None,
          "packed": rng.integers(0, 256, n * -(-blocks * bits // 8), dtype=np.uint8),
          "float": rng.uniform(0, (1 << bits) - 1, n * blocks).astype(np.float32)}[zeros]
    g_idx = rng.integers(0, blocks, k).astype(np.int32) if groups else None
    b = rng.normal(size=n).astype(np.float32) if bias else None
    names = ["A", "B", "scales", "zp" if zp is not None else "",
             "g_idx" if g_idx is not None else "", "bias" if b is not None else ""]
    while not names[-1]:
        names.pop()
    inits = [numpy_helper.from_array(v, name) for v, name in
             ((packed, "B"), (scales, "scales"), (zp, "zp"), (g_idx, "g_idx"), (b, "bias"))
             if v is not None]
    node = helper.make_node("MatMulNBits", names, ["Y"], domain="com.microsoft", K=k, N=n,
                            bits=bits, block_size=block)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("A", T.FLOAT,
                                                                              [k, k])],
                              [helper.make_tensor_value_info("Y", T.FLOAT, [k, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    return model, (packed, scales, zp, g_idx, k, n, bits, block), b


@pytest.mark.parametrize("k, n, bits, block, zeros, groups, bias", [
    (64, 8, 4, 32, None, False, False),          # symmetric: zero point 8
    (64, 8, 4, 32, "packed", False, False),
    (70, 8, 4, 32, "packed", False, True),       # K not a multiple of the block
    (64, 8, 4, 16, "float", True, False),        # act-order g_idx, float zero points
    (64, 8, 8, 32, "packed", False, False),
    (64, 8, 2, 32, "packed", False, False)])
def test_matmul_nbits_weights_are_the_values_onnxruntime_multiplies_by(
        k, n, bits, block, zeros, groups, bias):
    model, args, b = _nbits_node(np.random.default_rng(k + bits), k, n, bits, block, zeros,
                                 groups, bias)
    identity = np.eye(k, dtype=np.float32)       # A = I: onnxruntime's product is W itself
    want = session(model).run(None, {"A": identity})[0] - (0 if b is None else b)
    got = nbits_weight(*args)
    assert got.shape == (k, n)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_g_idx_beside_packed_zero_points_is_not_read_back():
    """onnxruntime's CPU kernel reads such zero points as 2^(bits-1), the operator's
    definition applies them: the two disagree, so neither is taken."""
    _, args, _ = _nbits_node(np.random.default_rng(0), 64, 8, 4, 32, "packed", True, False)
    assert "g_idx" in nbits_weight(*args)


def test_a_node_left_as_it_is_runs_on_the_host_with_its_reason_given_data(tmp_path):
    model, _, _ = _nbits_node(np.random.default_rng(0), 64, 8, 4, 32, "packed", True, False)
    path = tmp_path / "g_idx.onnx"
    onnx.save(model, str(path))
    a = np.random.default_rng(1).normal(size=(64, 64)).astype(np.float32)
    compiled = tpu_compile(str(path), calibration=a)
    row = next(r for r in compiled.report.rows if r.op_type == "MatMulNBits")
    assert row.where == "host"
    np.testing.assert_allclose(compiled.run(a)["Y"], session(model).run(None, {"A": a})[0],
                               rtol=1e-5, atol=1e-5)


def test_a_matmul_nbits_whose_weights_do_not_fit_its_attributes_is_one_clear_error(
        tmp_path, capsys):
    from tpuasm.compiler.cli import compile_main
    model, _, _ = _nbits_node(np.random.default_rng(0), 64, 8, 4, 32, None, False, False)
    b = next(t for t in model.graph.initializer if t.name == "B")
    b.CopyFrom(numpy_helper.from_array(np.zeros((8, 2, 15), np.uint8), "B"))   # blob 15
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    assert compile_main([str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "node MatMulNBits_0: MatMulNBits B of 240 uint8 values where N x blocks x " \
           "blob is 256" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_matmul_nbits_model_given_data_has_its_matrix_work_on_the_tpu(tmp_path, symmetric):
    path = _nbits(tmp_path, _mlp(17), "nbits", symmetric)
    x = _rows(2)
    compiled = tpu_compile(str(path), calibration=_rows(1))
    nodes = [n.name for n in onnx.load(str(path)).graph.node if n.op_type == "MatMulNBits"]
    rows = {r.node: r for r in compiled.report.rows}
    assert len(nodes) == 2 and all(rows[n].where == "TPU" for n in nodes)
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    assert "2 MatMulNBits read back" in compiled.report.source
    got, want = compiled.run(x)[onnx.load(str(path)).graph.output[0].name], _shipped(path, x)
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.97
    assert _snr(got, want) > 30


def test_without_data_a_matmul_nbits_model_runs_on_the_host_and_says_how_to_map_it(tmp_path):
    path = _nbits(tmp_path, _mlp(17), "nbits", True)
    compiled = tpu_compile(str(path), batch=16)
    rows = [r for r in compiled.report.rows if r.op_type == "MatMulNBits"]
    assert rows and all(r.where == "host" and "--calibrate" in r.reason for r in rows)
    x = _rows(2)[:16]
    output = onnx.load(str(path)).graph.output[0].name
    np.testing.assert_allclose(compiled.run(x)[output], _shipped(path, x), rtol=1e-5,
                               atol=1e-5)


def test_block_wise_weight_only_qdq_given_data_is_read_back_onto_the_tpu(tmp_path):
    path = _nbits(tmp_path, _mlp(21), "blocks", False, qdq=True)
    assert any(a.name == "block_size" for n in onnx.load(str(path)).graph.node
               for a in n.attribute)
    x = _rows(2)
    compiled = tpu_compile(str(path), calibration=_rows(1))
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    got, want = compiled.run(x)[_OUT], _shipped(path, x)
    assert _snr(got, want) > 30


# --- 4-bit and 16-bit QDQ tensors, as shipped ----------------------------------------------

@pytest.mark.parametrize("opset, weights, per_channel", [
    (17, "QInt4", True), (21, "QInt4", True), (21, "QUInt4", True), (17, "QUInt8", True),
    (17, "QUInt8", False)])        # U8U8: W_q - z spans 255 either side: int16 weights
def test_4_bit_and_unsigned_weights_compile_as_shipped_identical_to_onnxruntime(
        tmp_path, opset, weights, per_channel):
    path = _static(tmp_path, _mlp(opset), "QUInt8", weights, "int4", per_channel=per_channel)
    x = _rows(2)
    compiled = tpu_compile(str(path))
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    np.testing.assert_array_equal(compiled.run(x)[_OUT], _shipped(path, x))


@pytest.mark.parametrize("activations", ["QUInt16", "QInt16"])
def test_16_bit_activations_compile_as_shipped_within_one_step_of_onnxruntime(tmp_path,
                                                                              activations):
    """uint16 ones as int16 of a zero point 32,768 lower: the same values (widths.py)."""
    path = _static(tmp_path, _mlp(21), activations, "QInt8", "a16")
    x = _rows(2)
    compiled = tpu_compile(str(path))
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    steps = np.abs(compiled.run(x)[_OUT] - _shipped(path, x)) / _step(path, _OUT)
    assert steps.max() <= 1.01 and (steps < 0.01).mean() >= 0.99


def _cnn(opset: int) -> onnx.ModelProto:
    model = build([("conv", 8, 3, 1, 1), ("relu",), ("conv", 8, 3, 2, 1), ("relu",),
                   ("flatten",), ("gemm", 8)], [4, 4, 4], seed=5)
    model = version_converter.convert_version(model, opset)
    model.ir_version = 10
    return model


@pytest.mark.parametrize("types, net", [(("QInt16", "QInt16"), "mlp"),
                                        (("QUInt16", "QUInt16"), "mlp"),
                                        (("QInt16", "QInt16"), "cnn")])
def test_16_bit_weights_over_16_bit_inputs_never_wrap_the_accumulators(tmp_path, types, net):
    """Before accumroom.py: 6 % of this MLP's outputs 58,751 output steps off (the sums
    wrapped int32).  Now its weights are re-rounded where the sums could outgrow int32,
    OUTDIR's model says so, and the answers keep the shipped model's accuracy."""
    make = {"mlp": _mlp, "cnn": _cnn}[net]
    images = np.random.default_rng(2).normal(0, 1, (2, ROWS, 4, 4, 4)).astype(np.float32)
    path = _static(tmp_path, make(21), *types, "w16",
                   rows=None if net == "mlp" else images[0])
    x = _rows(2) if net == "mlp" else images[1]
    compiled = tpu_compile(str(path))
    assert "accumroom" in compiled.report.source
    got = compiled.run(x)[_OUT]
    oracle = session(onnx.load(str(compiled.reference_model))).run(None, {"x": x})[0]
    assert (np.abs(got - oracle) / _step(path, _OUT)).max() <= 1.01
    float_model = session(make(21)).run(None, {"x": x})[0]
    assert _snr(got, float_model) > _snr(_shipped(path, x), float_model) - 0.5


def test_the_fitted_weights_are_the_coarsest_that_fit_int32(tmp_path):
    """The exact bound: max |x - z| x sum |w - z_w| + |b| per output column, within int32
    after the rewrite for every column, and beyond it one step finer (the least factor)."""
    path = _static(tmp_path, _mlp(21), "QInt16", "QInt16", "w16")
    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    shipped = {}                      # node -> (reach, centred W with columns last, bias)
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            x_dq, w_dq = producer[node.input[0]], producer[node.input[1]]
            z = int(values[x_dq.input[2]])
            reach = max(z + 32768, 32767 - z)
            w = values[w_dq.input[0]].astype(np.int64)
            w = w.T if node.op_type == "Gemm" else w          # (K, N): transB=1
            w = w - values[w_dq.input[2]].astype(np.int64).reshape(1, -1)
            bias = values[producer[node.input[2]].input[0]].astype(np.int64) \
                if node.op_type == "Gemm" else np.zeros(w.shape[1], np.int64)
            shipped[node.name] = (reach, w, bias, values[w_dq.input[1]])
    assert fit_accumulators(model) == 3
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    for name, (reach, w, bias, scale) in shipped.items():
        node = next(n for n in model.graph.node if n.name == name)
        factors = np.rint(values[producer[node.input[1]].input[1]] / scale).astype(int)
        for n, f in enumerate(factors):
            assert fits(w[:, n], bias[n], reach, f)
            assert f == 1 or not fits(w[:, n], bias[n], reach, f - 1)
        fitted = values[producer[node.input[1]].input[0]].astype(np.int64)
        fitted = fitted.T if node.op_type == "Gemm" else fitted
        np.testing.assert_array_equal(fitted, np.rint(w / factors))


@pytest.mark.parametrize("types, named", [(("QUInt4", "QInt8"), "uint4"),
                                          (("QFLOAT8E4M3FN", "QFLOAT8E4M3FN"), "float8")])
def test_4_bit_and_float8_activations_stay_on_the_host_as_shipped_and_read_back_with_data(
        tmp_path, types, named):
    """Neither is a grid the TPU's requantization writes; given data, the model is read
    back as float (before: a traceback, numpy's iinfo knows neither)."""
    from onnxruntime.quantization import CalibrationMethod
    path = _static(tmp_path, _mlp(21), *types, "narrow",
                   calibrate_method=CalibrationMethod.Distribution
                   if named == "float8" else CalibrationMethod.MinMax)
    shipped = tpu_compile(str(path), batch=16)
    matrix = [r for r in shipped.report.rows if r.op_type in ("MatMul", "Gemm")]
    assert matrix and all(r.where == "host" and named in r.reason and "--calibrate" in r.reason
                          for r in matrix)
    calibrated = tpu_compile(str(path), calibration=_rows(1))
    assert calibrated.report.tpu_macs == calibrated.report.macs > 0
    x = _rows(2)
    model = onnx.load(str(path))              # its weights as they are, its activations float
    assert read_back(model)[1] is None
    want = session(model).run(None, {"x": x})[0]
    assert (calibrated.run(x)[_OUT].argmax(1) == want.argmax(1)).mean() >= 0.95

"""Half-precision models (front/halfprecision.py): float16 weights and tensors, as fp16
exports ship them, whether their inputs and outputs are float16 too or float32 around Casts
(onnxconverter's keep_io_types).  onnxruntime's quantizer could not quantize them (its
float32 scales beside float16 tensors fail onnx's type check); read as float32 inside, they
compile with their matrix work on the TPU and keep their interface.  Oracle: onnxruntime
on the shipped float16 model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import real_models
from float_models import build
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.ort import session

_LAYERS = [("conv", 8, 3, 1, 1), ("relu",), ("flatten",), ("gemm", 32), ("relu",),
           ("gemm", 8)]


def _half(io_half: bool) -> onnx.ModelProto:
    model = build(_LAYERS, [3, 8, 8], seed=3)
    g = model.graph
    for t in g.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16),
                                           t.name))
    if io_half:
        for v in [*g.input, *g.output]:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    else:                              # float32 at the edges, Casts to and from float16
        first, last = g.input[0].name, g.output[0].name
        for node in g.node:
            node.input[:] = ["x_half" if i == first else i for i in node.input]
            node.output[:] = ["y_half" if o == last else o for o in node.output]
        g.node.insert(0, helper.make_node("Cast", [first], ["x_half"], name="to_half",
                                          to=TensorProto.FLOAT16))
        g.node.append(helper.make_node("Cast", ["y_half"], [last], name="to_float",
                                       to=TensorProto.FLOAT))
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("io_half", [True, False])
def test_a_float16_model_compiles_onto_the_tpu_and_keeps_its_interface(tmp_path, io_half):
    model = _half(io_half)
    path = tmp_path / "half.onnx"
    onnx.save(model, str(path))
    dtype = np.float16 if io_half else np.float32
    rows = np.random.default_rng(1).normal(size=(384, 3, 8, 8)).astype(dtype)
    compiled = tpu_compile(str(path), calibration=rows[:128])
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    assert "half-precision" in compiled.report.source
    got = compiled.run(rows[128:])["y"]
    want = session(model).run(None, {"x": rows[128:]})[0]
    assert got.dtype == want.dtype == dtype
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.95
    snr = 10 * np.log10((want.astype(np.float64) ** 2).sum()
                        / ((got.astype(np.float64) - want) ** 2).sum())
    assert snr > 25


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_onnxconverter_s_float16_transformer_compiles_onto_the_tpu(tmp_path, keep_io_types):
    """The float16 conversion users run (onnxconverter-common, as transformers.js's and
    Optimum's fp16 exports are made) of the corpus's encoder block: refused before ("shape
    inference failed ... has inconsistent type tensor(float)")."""
    float16 = pytest.importorskip("onnxconverter_common.float16")
    m = real_models.transformer_encoder()
    half = float16.convert_float_to_float16(m.model, keep_io_types=keep_io_types)
    path = tmp_path / "encoder_fp16.onnx"
    onnx.save(half, str(path))
    dtype = np.float32 if keep_io_types else np.float16
    calibration = {k: v.astype(dtype) for k, v in m.calibration.items()}
    evaluation = {k: v.astype(dtype) for k, v in m.evaluation.items()}
    compiled = tpu_compile(str(path), calibration=calibration)
    assert compiled.report.tpu_macs >= 0.9 * compiled.report.macs   # all but attention
    got = compiled.run(evaluation)[m.output]
    want = session(half).run([m.output], evaluation)[0]
    assert got.dtype == want.dtype == dtype
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.99

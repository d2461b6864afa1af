"""QDQ models as an onnxruntime session saves them optimized (optimized_model_filepath at the
extended level, as optimizing pipelines ship them): the QDQ groups fused into QLinearConv,
QLinearMatMul, QGemm, QLinearSoftmax (com.microsoft) between byte tensors.  Compiled as
shipped, against onnxruntime on that same model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import real_models
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.ort import session


def _optimized(tmp_path, m: real_models.RealModel) -> onnx.ModelProto:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, quantize_static
    onnx.save(m.model, str(tmp_path / "float.onnx"))
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"),
                    real_models.calibration_reader(m.calibration),
                    quant_format=QuantFormat.QDQ, per_channel=True)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "qdq.onnx"), options,
                         providers=["CPUExecutionProvider"])
    return onnx.load(str(tmp_path / "optimized.onnx"))


@pytest.mark.parametrize("name", ["transformer_encoder", "mobilenet_v2_block"])
def test_an_optimized_qdq_model_compiles_as_shipped(tmp_path, name):
    """The encoder's output projection reads the merged heads through a Transpose and a
    Reshape of bytes: before, "its input's rows are rearranged by a layout node" kept it
    on the host (88.0 % of the MACs on the TPU); now the host makes that layout and the
    TPU reads it, as for a QDQ model's MatMul (96.0 %: the rest are the attention
    products of two activations)."""
    m = real_models.BUILDERS[name]()
    model = _optimized(tmp_path, m)
    assert {n.op_type for n in model.graph.node} & {"QLinearMatMul", "QLinearConv"}
    onnx.save(model, str(tmp_path / "shipped.onnx"))
    compiled = tpu_compile(str(tmp_path / "shipped.onnx"), batch=m.batch)
    assert compiled.report.tpu_macs >= 0.95 * compiled.report.macs
    got = compiled.run(m.evaluation)[m.output]
    want = session(model).run([m.output], m.evaluation)[0]
    step = real_models.output_steps(model).get(m.output) or float(np.ptp(want)) / 255
    assert np.mean(np.abs(got - want) < 1e-6) >= 0.995        # a near-tie's LSB at most
    assert np.abs(got - want).max() <= 1.01 * step

"""A network whose activations have all but vanished (a random-init MobileViT or
EfficientNet exported by torch.onnx, its BatchNorms' running statistics never updated:
activation ranges near 1e-33): onnxruntime's quantizer gives a zero bias the scale input
scale x weight scale, which underflows float32, and the reader refused it.  The zero bias
keeps its value with the scale 1 (front/scales.py); onnxruntime on the float model is the
oracle.  Built with onnx.helper."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.ort import session

TINY = 1e-33          # the inputs' size: input scale x weight scale (~1e-5) is subnormal


def _conv_classifier(rng) -> onnx.ModelProto:
    """Conv (weights ~1e-3, a zero bias) -> Relu -> GlobalAveragePool -> Flatten -> Gemm."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "head"], ["y"], name="gemm", transB=1)]
    inits = [numpy_helper.from_array(rng.normal(0, 1e-3, (8, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             numpy_helper.from_array(rng.normal(0, 0.3, (3, 8)).astype(np.float32), "head")]
    graph = helper.make_graph(nodes, "vanishing",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 4, 6, 6])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_zero_bias_whose_scale_underflows_compiles_and_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(0)
    model = _conv_classifier(rng)
    path = tmp_path / "vanishing.onnx"
    onnx.save(model, str(path))
    calib = (rng.normal(0, 1, (32, 4, 6, 6)) * TINY).astype(np.float32)
    compiled = tpu_compile(str(path), calibration=calib, batch=8, config={"array_size": 16})
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["conv"].where == rows["gemm"].where == "TPU"
    qdq = onnx.load(str(compiled.reference_model))
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    biases = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear"
              and inits.get(n.input[0], np.zeros(1, np.int8)).dtype == np.int32]
    assert biases and all(inits[n.input[1]].min() >= np.finfo(np.float32).tiny for n in biases)
    x = (rng.normal(0, 1, (8, 4, 6, 6)) * TINY).astype(np.float32)
    (want,) = session(model).run(None, {"x": x})
    got = compiled.run(x)["y"].astype(np.float64)
    want = want.astype(np.float64)
    assert np.abs(want).max() > 0
    error = np.abs(got - want)              # int8's error, at the outputs' own size
    assert error.mean() < 0.03 * np.abs(want).max() and error.max() < 0.1 * np.abs(want).max()

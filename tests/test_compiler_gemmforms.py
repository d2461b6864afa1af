"""Gemms with alpha or beta not 1 rewritten as plain ones (front/gemmforms.py): the same
function as the float model (onnxruntime is the oracle), the Gemm on the TPU, and a KMeans
as skl2onnx writes it (Gemm(X, centres^T, Z, alpha=-2)) with its matrix work on the TPU."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.gemmforms import rewrite_scaled_gemms
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.ort import session


def _model(rng, alpha, beta, c_kind, trans_b):
    """x (N, 6) -> Gemm(x, W, C; alpha, beta) (N, 5): C a constant (5,), computed from x
    ((N, 1): its sum of squares), or absent."""
    w = rng.normal(0, 0.5, (5, 6) if trans_b else (6, 5)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    nodes, inputs = [], ["x", "w"]
    if c_kind == "constant":
        inits.append(numpy_helper.from_array(rng.normal(0, 1, 5).astype(np.float32), "c"))
        inputs.append("c")
    elif c_kind == "computed":
        nodes.append(helper.make_node("ReduceSumSquare", ["x"], ["c"], name="squares",
                                      axes=[1], keepdims=1))
        inputs.append("c")
    nodes.append(helper.make_node("Gemm", inputs, ["y"], name="gemm", alpha=alpha, beta=beta,
                                  transB=trans_b))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                          ["N", 6])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 5])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


CASES = [(-2.0, 1.0, "computed", 1), (0.5, 3.0, "computed", 0), (0.5, 2.0, "constant", 1),
         (1.0, -1.5, "constant", 0), (-1.0, 1.0, "none", 1)]


@pytest.mark.parametrize("alpha, beta, c_kind, trans_b", CASES)
def test_a_scaled_gemm_keeps_its_answers_as_a_plain_one(alpha, beta, c_kind, trans_b):
    rng = np.random.default_rng(0)
    model = _model(rng, alpha, beta, c_kind, trans_b)
    x = rng.normal(0, 1, (7, 6)).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    assert rewrite_scaled_gemms(model, Provenance.of(model)) == 1
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert gemm.name == "gemm"
    assert {a.name for a in gemm.attribute} <= {"transB"}         # alpha = beta = 1
    np.testing.assert_allclose(session(model).run(None, {"x": x})[0], want, rtol=1e-5,
                               atol=1e-5)


def test_a_gemm_whose_weight_is_computed_stays_as_it_is():
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="t"),
             helper.make_node("Gemm", ["x", "xt"], ["y"], name="gemm", alpha=2.0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [3, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert rewrite_scaled_gemms(model, Provenance.of(model)) == 0


def test_a_kmeans_as_skl2onnx_writes_it_has_its_gemm_on_the_tpu(tmp_path):
    """KMeans' distances |x|^2 - 2 x.c + |c|^2: skl2onnx's Gemm(X, C^T, Z, alpha=-2) stayed
    on the host ('alpha or beta is not 1'); its clusters are onnxruntime's on new rows."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn.cluster import KMeans
    from sklearn.datasets import load_digits
    x = load_digits().data.astype(np.float32)
    kmeans = KMeans(10, n_init=3, random_state=0).fit(x[:1000])
    path = tmp_path / "kmeans.onnx"
    exported = skl2onnx.to_onnx(kmeans, x[:1])
    assert any(n.op_type == "Gemm" and any(a.name == "alpha" and a.f == -2.0
                                           for a in n.attribute) for n in exported.graph.node)
    onnx.save(exported, str(path))
    compiled = tpu_compile(str(path), batch=16, calibration=x[1000:1128])
    gemm = next(r for r in compiled.report.rows if r.op_type == "Gemm")
    assert gemm.where == "TPU"
    new = x[1128:1640]
    want = session(exported).run(["label"], {"X": new})[0]
    assert np.mean(compiled.run(new)["label"] == want) >= 0.99

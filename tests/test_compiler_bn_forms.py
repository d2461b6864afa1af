"""BatchNormalizations that sit next to a matrix node but not right after it, as
transformers' LeViT exports them (torch.onnx, TorchScript and dynamo alike): a Linear +
BatchNorm1d as MatMul (B, T, C) -> Flatten/Reshape (B*T, C) -> BatchNormalization ->
Reshape (B, T, C), and its classifier's BatchNorm1d -> Linear as BatchNormalization ->
Gemm.  Each is folded into the matrix node's weights (front/prepare.py), so that it runs on
the TPU with it; onnxruntime on the float model is the oracle."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.prepare import fold_batch_norms
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.ort import session

TOKENS, K, C, CLASSES = 4, 8, 12, 3


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def _bn(rng, name, x, y, c):
    inits = [_init(f"{name}_g", rng.uniform(0.5, 2, c)), _init(f"{name}_b", rng.normal(0, 1, c)),
             _init(f"{name}_m", rng.normal(0, 1, c)), _init(f"{name}_v", rng.uniform(0.1, 3, c))]
    node = helper.make_node("BatchNormalization", [x] + [i.name for i in inits], [y], name=name,
                            epsilon=1e-5)
    return node, inits


def _levit_like(rng, merge: str) -> onnx.ModelProto:
    """MatMul -> `merge` (Flatten or Reshape to (B*T, C)) -> BN -> Reshape back -> HardSwish
    -> mean over the tokens -> BN -> Gemm (transB, as torch's Linear)."""
    bn1, inits1 = _bn(rng, "bn_rows", "merged", "merged_bn", C)
    bn2, inits2 = _bn(rng, "bn_head", "pooled", "pooled_bn", C)
    inits = [_init("w", rng.normal(0, 0.4, (K, C))),
             _init("head_w", rng.normal(0, 0.4, (CLASSES, C))),
             _init("head_b", rng.normal(0, 0.1, CLASSES)),
             numpy_helper.from_array(np.array([-1, C], np.int64), "rows_shape"),
             numpy_helper.from_array(np.array([-1, TOKENS, C], np.int64), "tokens_shape"),
             *inits1, *inits2]
    if merge == "Flatten":
        merging = helper.make_node("Flatten", ["h"], ["merged"], name="merge", axis=2)
    else:
        merging = helper.make_node("Reshape", ["h", "rows_shape"], ["merged"], name="merge")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="linear"), merging, bn1,
             helper.make_node("Reshape", ["merged_bn", "tokens_shape"], ["back"], name="back"),
             helper.make_node("HardSwish", ["back"], ["act"], name="act"),
             helper.make_node("ReduceMean", ["act"], ["pooled"], name="pool", axes=[1],
                              keepdims=0),
             bn2, helper.make_node("Gemm", ["pooled_bn", "head_w", "head_b"], ["y"], name="head",
                                   transB=1)]
    graph = helper.make_graph(nodes, "levit_like",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", TOKENS, K])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", CLASSES])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _copy(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def test_both_batch_norms_fold_keeping_onnxruntimes_answers():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (5, TOKENS, K)).astype(np.float32)
    for merge in ("Flatten", "Reshape"):
        model = _levit_like(rng, merge)
        (want,) = session(model).run(None, {"x": x})
        folded, prov = _copy(model), Provenance.of(model)
        assert fold_batch_norms(folded, prov) == 2
        assert "BatchNormalization" not in [n.op_type for n in folded.graph.node]
        assert prov.folded == {"bn_rows": "folded into MatMul 'linear'",
                               "bn_head": "folded into Gemm 'head'"}
        (got,) = session(folded).run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_merge_that_moves_the_channel_axis_is_left_alone():
    """A Reshape to (B*T*C/2, 2) does not keep the MatMul's columns as the BN's channels."""
    rng = np.random.default_rng(1)
    bn, inits = _bn(rng, "bn", "merged", "y", 2)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="linear"),
         helper.make_node("Reshape", ["h", "shape"], ["merged"], name="merge"), bn],
        "moved", [helper.make_tensor_value_info("x", T.FLOAT, [3, TOKENS, K])],
        [helper.make_tensor_value_info("y", T.FLOAT, [3 * TOKENS * C // 2, 2])],
        [_init("w", rng.normal(0, 0.4, (K, C))),
         numpy_helper.from_array(np.array([-1, 2], np.int64), "shape"), *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert fold_batch_norms(model, Provenance.of(model)) == 0


def test_levit_like_blocks_compile_with_every_matrix_node_and_batch_norm_on_the_tpu(tmp_path):
    rng = np.random.default_rng(2)
    model = _levit_like(rng, "Flatten")
    path = tmp_path / "levit_like.onnx"
    onnx.save(model, str(path))
    calib = rng.normal(0, 1, (64, TOKENS, K)).astype(np.float32)
    compiled = tpu_compile(str(path), calibration=calib, batch=16, config={"array_size": 16})
    rows = {r.node: r for r in compiled.report.rows}
    for node in ("linear", "bn_rows", "bn_head", "head"):
        assert rows[node].where == "TPU", (node, rows[node].reason)
    x = rng.normal(0, 1, (16, TOKENS, K)).astype(np.float32)
    (want,) = session(model).run(None, {"x": x})
    got = compiled.run(x)["y"]
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9

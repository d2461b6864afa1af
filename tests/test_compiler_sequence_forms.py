"""torch.onnx's tensor.nonzero(as_tuple=True) (transformers' Longformer, its global-attention
indices): NonZero -> Transpose -> SplitToSequence(split=1 as a scalar, keepdims=0) ->
SequenceAt.  onnxruntime drops the split axis; onnx's shape inference, following the spec
(keepdims is ignored when a split is given), keeps it, and a Shape of the rank one too many
folded into a constant made the model onnxruntime refuses (front/fold.py).  Built with
onnx.helper; onnxruntime on the float model is the oracle."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.fold import splits_as_onnxruntime_runs_them
from tpuasm.compiler.ort import session

K, N_OUT = 6, 4


def _const(name, array):
    return helper.make_node("Constant", [], [name], name=f"{name}_node",
                            value=numpy_helper.from_array(np.asarray(array), f"{name}_value"))


def _nonzero_model(rng) -> onnx.ModelProto:
    """y = x @ W + (how many of x's entries are positive) / 100, the count computed through
    the indices of the positive entries, reshaped to (-1,) by a target made from the rank
    of the first index tensor (Shape of Shape, as Longformer's exported graph does)."""
    nodes = [
        _const("one", np.array(1, np.int64)), _const("minus_one", np.array(-1, np.int64)),
        _const("zero", np.array(0, np.int64)), _const("x_zero", np.array(0, np.float32)),
        _const("hundredth", np.array(0.01, np.float32)),
        helper.make_node("Greater", ["x", "x_zero"], ["positive"], name="positive"),
        helper.make_node("NonZero", ["positive"], ["where"], name="nonzero"),
        helper.make_node("Transpose", ["where"], ["pairs"], name="pairs", perm=[1, 0]),
        helper.make_node("SplitToSequence", ["pairs", "one"], ["columns"], name="split",
                         axis=1, keepdims=0),
        helper.make_node("SequenceAt", ["columns", "zero"], ["rows"], name="rows"),
        helper.make_node("Shape", ["rows"], ["rows_shape"], name="rows_shape"),
        helper.make_node("Shape", ["rows_shape"], ["rank"], name="rank"),
        helper.make_node("ConstantOfShape", ["rank"], ["ones"], name="ones",
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("Mul", ["ones", "minus_one"], ["target"], name="target"),
        helper.make_node("Reshape", ["rows", "target"], ["flat"], name="flat"),
        helper.make_node("Shape", ["flat"], ["count"], name="count"),
        helper.make_node("Cast", ["count"], ["count_f"], name="count_f", to=T.FLOAT),
        helper.make_node("Mul", ["count_f", "hundredth"], ["shift"], name="shift"),
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        helper.make_node("Add", ["h", "shift"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "nonzero_as_tuple", [helper.make_tensor_value_info("x", T.FLOAT, ["N", K])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", N_OUT])],
        [numpy_helper.from_array(rng.normal(0, 0.5, (K, N_OUT)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_the_rewrite_keeps_onnxruntimes_answers():
    rng = np.random.default_rng(0)
    model = _nonzero_model(rng)
    x = rng.normal(0, 1, (5, K)).astype(np.float32)
    (want,) = session(model).run(None, {"x": x})
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert splits_as_onnxruntime_runs_them(rewritten) == 1
    assert [len(n.input) for n in rewritten.graph.node if n.op_type == "SplitToSequence"] == [1]
    (got,) = session(rewritten).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_a_split_of_two_or_with_keepdims_stays():
    rng = np.random.default_rng(1)
    for attribute, split in (("keepdims", 1), (None, 2)):
        model = _nonzero_model(rng)
        node = next(n for n in model.graph.node if n.op_type == "SplitToSequence")
        if attribute:
            node.attribute[1].i = 1                     # keepdims=1: the axis kept
        else:
            constant = next(n for n in model.graph.node if n.output[0] == "one")
            constant.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(split, np.int64)))
        assert splits_as_onnxruntime_runs_them(model) == 0


def test_nonzero_as_tuple_compiles_and_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(2)
    model = _nonzero_model(rng)
    path = tmp_path / "nonzero.onnx"
    onnx.save(model, str(path))
    calib = rng.normal(0, 1, (32, K)).astype(np.float32)
    compiled = tpu_compile(str(path), calibration=calib, batch=8, config={"array_size": 16})
    assert {r.node: r for r in compiled.report.rows}["matmul"].where == "TPU"
    x = rng.normal(0, 1, (8, K)).astype(np.float32)
    (want,) = session(model).run(None, {"x": x})
    got = compiled.run(x)["y"]
    assert got.shape == want.shape
    # the count of positive entries (the shift) exact; the MatMul within int8's error
    error = np.abs(got - want)
    assert error.mean() < 0.01 * np.abs(want).max() and error.max() < 0.1 * np.abs(want).max()

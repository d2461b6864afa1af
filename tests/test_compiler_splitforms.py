"""A Split or Slices of a matrix node's output channels as one matrix node per part
(front/splitforms.py): the rewritten float model computes what the model did (onnxruntime is
the oracle), a GLU's Sigmoid and Mul then run on the TPU, and what the rewrite must leave
alone stays."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.front.splitforms import split_matrix_outputs
from tpuasm.compiler.ort import session


def _model(nodes, inits, x_shape, outputs, opset=18):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, x_shape)],
        [helper.make_tensor_value_info(o, T.FLOAT, [None] * rank) for o, rank in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _run(model, x):
    return session(model).run(None, {"x": x})


def _glu(rng, opset=18, sizes=None):
    """A Conformer's GLU over (N, C, T): pointwise Conv to 2C, a * sigmoid(b), a Conv."""
    c = 6
    inits = {"w1": rng.normal(0, 0.5, (2 * c, c, 1)).astype(np.float32),
             "b1": rng.normal(0, 0.2, 2 * c).astype(np.float32),
             "w2": rng.normal(0, 0.5, (4, c, 3)).astype(np.float32)}
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
    split_inputs = ["h", "sizes"] if sizes is not None else ["h"]
    split_attrs = {"num_outputs": 2} if sizes is None and opset >= 18 else {}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name="pw"),
             helper.make_node("Split", split_inputs, ["a", "b"], name="split", axis=1,
                              **split_attrs),
             helper.make_node("Sigmoid", ["b"], ["s"], name="sig"),
             helper.make_node("Mul", ["a", "s"], ["g"], name="gate"),
             helper.make_node("Conv", ["g", "w2"], ["y"], name="out", pads=[1, 1])]
    return _model(nodes, inits, ["N", c, 10], {"y": 3}, opset)


@pytest.mark.parametrize("opset, sizes", [(18, None), (13, [6, 6]), (13, None)])
def test_a_glu_split_becomes_two_convs_computing_the_same(opset, sizes):
    rng = np.random.default_rng(1)
    model = _glu(rng, opset, sizes)
    x = rng.normal(0, 1, (3, 6, 10)).astype(np.float32)
    want = _run(model, x)
    prov = Provenance.of(model)
    assert split_matrix_outputs(model, prov) == 1
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert "Split" not in ops and ops.count("Conv") == 3
    assert prov.folded["split"].startswith("folded into Conv")
    assert {prov.source(n.name) for n in model.graph.node if n.op_type == "Conv"} == {"pw", "out"}
    np.testing.assert_allclose(_run(model, x)[0], want[0], rtol=1e-5, atol=1e-5)


def test_a_glu_runs_on_the_tpu_in_one_segment(tmp_path):
    # before: the Split ran on the host, and with it the GLU's Sigmoid and Mul in float,
    # between two segments
    rng = np.random.default_rng(2)
    model = _glu(rng)
    onnx.save(model, str(tmp_path / "glu.onnx"))
    calib, x = (rng.normal(0, 1, (n, 6, 10)).astype(np.float32) for n in (96, 200))
    compiled = tpu_compile(tmp_path / "glu.onnx", batch=16, calibration=calib,
                           validate=False)
    where = {r.node: r.where for r in compiled.report.rows}
    assert where["sig"] == where["gate"] == where["split"] == "TPU", where
    assert len(compiled.report.segments) == 1
    got = compiled.run(x)["y"]
    (qdq,) = session(onnx.load(str(compiled.reference_model))).run(None, {"x": x})
    assert np.mean(got == qdq) >= 0.999
    (want,) = _run(_glu(np.random.default_rng(2)), x)
    assert 10 * np.log10(np.sum(want ** 2) / np.sum((got - want) ** 2)) > 25


def test_slices_through_a_relu_and_a_gemm_split_by_sizes():
    # a channel split as TorchScript writes torch.chunk: Slices of a Conv's Relu; a Gemm
    # (transB) whose columns a Split cuts unevenly, its bias one row
    rng = np.random.default_rng(3)
    inits = {"w": rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32),
             "b": rng.normal(0, 0.2, 8).astype(np.float32),
             "s0": np.array([0]), "e0": np.array([3]), "s1": np.array([3]),
             "e1": np.array([2 ** 62]), "ax": np.array([1]),
             "fw": rng.normal(0, 0.5, (7, 5 * 8 * 8)).astype(np.float32),
             "fb": rng.normal(0, 0.2, (1, 7)).astype(np.float32),
             "sizes": np.array([2, 5])}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Slice", ["r", "s0", "e0", "ax"], ["p"], name="cut0"),
             helper.make_node("Slice", ["r", "s1", "e1", "ax"], ["q"], name="cut1"),
             helper.make_node("GlobalAveragePool", ["p"], ["m"], name="gap"),
             helper.make_node("Flatten", ["q"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["z"], name="fc", transB=1),
             helper.make_node("Split", ["z", "sizes"], ["u", "v"], name="heads", axis=-1),
             helper.make_node("Tanh", ["u"], ["tu"], name="tanh"),
             helper.make_node("Sigmoid", ["v"], ["sv"], name="sig")]
    model = _model(nodes, inits, ["N", 3, 8, 8], {"m": 4, "tu": 2, "sv": 2}, opset=13)
    x = rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)
    want = _run(model, x)
    prov = Provenance.of(model)
    assert split_matrix_outputs(model, prov) == 2
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 2 and ops.count("Relu") == 2 and ops.count("Gemm") == 2
    assert "Slice" not in ops and "Split" not in ops
    assert {prov.source(n.name) for n in model.graph.node if n.op_type == "Relu"} == {"relu"}
    assert "relu" not in prov.folded and set(prov.folded) == {"cut0", "cut1", "heads"}
    for got, w in zip(_run(model, x), want):
        assert got.shape == w.shape
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def test_a_gated_matmul_over_a_sequence_splits_along_its_last_axis():
    # a gated feed-forward as transformers write it: x (N, T, K) @ W (K, 2H), chunk(2, -1),
    # a * sigmoid(b) (torch.chunk at opset 18: Split with num_outputs)
    rng = np.random.default_rng(5)
    inits = {"w": rng.normal(0, 0.5, (8, 10)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="up"),
             helper.make_node("Split", ["h"], ["a", "b"], name="chunk", axis=-1, num_outputs=2),
             helper.make_node("Sigmoid", ["b"], ["s"], name="sig"),
             helper.make_node("Mul", ["a", "s"], ["y"], name="gate")]
    model = _model(nodes, inits, ["N", 7, 8], {"y": 3})
    x = rng.normal(0, 1, (2, 7, 8)).astype(np.float32)
    want = _run(model, x)
    assert split_matrix_outputs(model, Provenance.of(model)) == 1
    assert [n.op_type for n in model.graph.node].count("MatMul") == 2
    np.testing.assert_allclose(_run(model, x)[0], want[0], rtol=1e-5, atol=1e-5)


def _left_alone(case):
    rng = np.random.default_rng(4)
    w = rng.normal(0, 0.5, (4, 2 if case == "grouped" else 4, 1)).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["h"], name="pw",
                            **({"group": 2} if case == "grouped" else {}))
    axis = 2 if case == "time axis" else 1
    nodes = [conv, helper.make_node("Split", ["h"], ["a", "b"], name="split", axis=axis,
                                    num_outputs=2),
             helper.make_node("Relu", ["b"], ["rb"], name="relu_b")]
    outputs = {"rb": 3}
    if case == "a model output":
        outputs["a"] = 3
    elif case == "a part for the Concat":
        nodes.append(helper.make_node("Concat", ["a", "rb"], ["c"], name="cat", axis=1))
        outputs = {"c": 3}
    elif case == "a product of activations":     # attention's packed Q/K projection
        nodes += [helper.make_node("Transpose", ["a"], ["at"], name="t", perm=[0, 2, 1]),
                  helper.make_node("MatMul", ["at", "b"], ["c"], name="scores")]
        outputs = {"c": 3}
    else:
        nodes.append(helper.make_node("Relu", ["a"], ["ra"], name="relu_a"))
        outputs["ra"] = 3
    if case == "another reader":
        nodes.append(helper.make_node("Relu", ["h"], ["r"], name="relu"))
        outputs["r"] = 3
    return _model(nodes, {"w": w}, ["N", 4, 6], outputs)


@pytest.mark.parametrize("case", ["time axis", "another reader", "grouped", "a model output",
                                  "a part for the Concat", "a product of activations", "none"])
def test_what_is_not_a_cut_of_the_channels_or_goes_to_the_host_is_left_alone(case):
    model = _left_alone(case)
    before = model.SerializeToString()
    assert split_matrix_outputs(model, Provenance.of(model)) == (case == "none")
    if case != "none":
        assert model.SerializeToString() == before

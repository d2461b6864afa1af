"""The class scores a label or a ZipMap is made from, judged by the check in their place
(runtime/probes.py): found in the graph, given by the float, QDQ and compiled models alike,
held to the bars with the agreement expected on new rows, and never one of the outputs the
user gets back (infer, the Python API, OUTDIR's QDQ model)."""
from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as compile_api
from tpuasm.compiler.cli import compile_main, infer_main
from tpuasm.compiler.ort import session
from tpuasm.compiler.runtime.probes import score_probes, with_probes, without_probes

skl2onnx = pytest.importorskip("skl2onnx")


def _digits():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return x.astype(np.float32), y


def _scaled_mlp(x, y) -> onnx.ModelProto:
    """scikit-learn's StandardScaler + MLPClassifier as skl2onnx exports it by default:
    Softmax -> ArgMax -> ArrayFeatureExtractor (class names) -> Reshape -> Cast -> label,
    and Softmax -> ZipMap -> a sequence of {class: probability} maps."""
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # not converged: the accuracy is not at stake
        clf = make_pipeline(StandardScaler(), MLPClassifier((32,), max_iter=100,
                                                            random_state=0)).fit(x, y)
    return skl2onnx.to_onnx(clf, x[:1])


def _gather_labels(scores_output: bool) -> onnx.ModelProto:
    """Gemm -> ArgMax(axis 1) -> Gather(a constant table of class ids): the label."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w")
    table = numpy_helper.from_array(np.array([3, 1, 4, 9], np.int64), "table")
    nodes = [helper.make_node("Gemm", ["x", "w"], ["logits"]),
             helper.make_node("ArgMax", ["logits"], ["pick"], axis=1, keepdims=0),
             helper.make_node("Gather", ["table", "pick"], ["label"])]
    outputs = [helper.make_tensor_value_info("label", T.INT64, ["N"])]
    if scores_output:
        outputs.append(helper.make_tensor_value_info("logits", T.FLOAT, ["N", 4]))
    graph = helper.make_graph(nodes, "labels", [helper.make_tensor_value_info(
        "x", T.FLOAT, ["N", 8])], outputs, [w, table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_scores_behind_a_label_and_a_zipmap_are_found():
    x, y = _digits()
    mlp = _scaled_mlp(x[:300], y[:300])
    assert score_probes(mlp) == {"out_activations_result": ["output_label",
                                                            "output_probability"]}
    from sklearn.linear_model import LogisticRegression
    logistic = skl2onnx.to_onnx(LogisticRegression(max_iter=200).fit(x[:300], y[:300]),
                                x[:1])
    zipmap = next(n for n in logistic.graph.node if n.op_type == "ZipMap")
    assert score_probes(logistic) == {zipmap.input[0]: ["output_probability"]}
    assert score_probes(_gather_labels(False)) == {"logits": ["label"]}
    # scores that are an output already are judged as one
    assert score_probes(_gather_labels(True)) == {}


def test_probes_are_outputs_for_a_while_and_typed():
    model = _gather_labels(False)
    added = with_probes(model, score_probes(model))
    assert added == {"logits": ["label"]}
    out = model.graph.output[-1]
    assert out.name == "logits" and out.type.tensor_type.elem_type == T.FLOAT
    x = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32)
    label, logits = session(model.SerializeToString()).run(None, {"x": x})
    assert np.array_equal(label, np.array([3, 1, 4, 9])[logits.argmax(1)])
    assert without_probes(model, added) and [o.name for o in model.graph.output] == ["label"]
    assert not without_probes(model, added)


def test_a_skl2onnx_classifier_is_judged_by_its_scores_and_keeps_its_outputs(tmp_path,
                                                                             capsys):
    x, y = _digits()
    path = tmp_path / "mlp.onnx"
    onnx.save(_scaled_mlp(x[:900], y[:900]), str(path))
    calib, rows = tmp_path / "calib.npy", x[900:1100]
    np.save(calib, rows)
    out = tmp_path / "out"
    assert compile_main([str(path), "--calibrate", str(calib), "-o", str(out),
                         "--calibration-method", "minmax"]) == 0
    text, err = capsys.readouterr()
    assert "Traceback" not in text + err
    checks = {o["output"]: o for o in json.loads(
        (out / "report.json").read_text())["validation"]["outputs"]}
    assert checks["output_label"]["kind"] == "exact"
    scores = checks["out_activations_result"]
    assert scores["kind"] == "top-1" and scores["class_axis"] == 1
    assert 0.9 <= scores["expected_agreement"] <= 1.0 and scores["expected_stderr"] > 0
    assert "output_label" in scores["why"] and "expected on new rows" in text
    # the user's outputs only: infer, the Python API and OUTDIR's QDQ model
    y_path = tmp_path / "y.npz"
    assert infer_main([str(out), str(calib), "-o", str(y_path), "-q"]) == 0
    capsys.readouterr()
    with np.load(y_path) as got:
        assert "out_activations_result" not in got.files
        labels = got["output_label"]
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    assert [o.name for o in qdq.graph.output] == ["output_label", "output_probability"]
    qlabel = session(qdq.SerializeToString()).run(["output_label"], {"X": rows})[0]
    assert np.array_equal(labels, qlabel)
    float_label = session(path.read_bytes()).run(["output_label"], {"X": rows})[0]
    assert np.mean(labels == float_label) >= 0.97


def test_the_search_goes_on_when_the_scores_expect_flips_the_labels_do_not_show(tmp_path):
    """Every label of the check rows identical used to end the search at once (exact
    agreement, 100 %); the scores' figure expected on new rows is below a bar of 99.99 %,
    so the other methods are tried."""
    x, y = _digits()
    path = tmp_path / "mlp.onnx"
    onnx.save(_scaled_mlp(x[:900], y[:900]), str(path))
    calib = x[900:1100]
    first = compile_api(str(path), calibration=calib, calibration_method="minmax",
                        validate=False)
    float_label = session(path.read_bytes()).run(["output_label"], {"X": calib})[0]
    agreeing = calib[first.run(calib, engine="reference")["output_label"] == float_label]
    model = compile_api(str(path), calibration=calib, validate=agreeing[:96],
                        min_agreement=0.9999)
    label = next(o for o in model.report.validation.outputs if o.name == "output_label")
    assert label.agreement == 1.0
    assert "calibration method chosen by the check" in model.report.source
    assert "min-max: 100.00 % top-1 agreement (" in model.report.source   # the estimate
    assert "out_activations_result" not in model.run(calib[:4], engine="reference")

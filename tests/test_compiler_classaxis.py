"""Which axis of an output holds classes (runtime/classaxis.py), and the check against the
float model that uses it: per-step top-1 agreement for sequences of classes (a CTC
recogniser's (T, N, classes)), SNR only where no class axis is known (a detector's
(N, 4 + classes, anchors): top-1 over its last axis would be over anchors), the 2-D
classifier's top-1 as before; `auto`'s search acting on a sequence's per-step top-1.
Oracles: arg-max agreement counted by hand (numpy) on outputs of onnxruntime and of the
compiled model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.cli import compile_main
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.ort import session
from tpuasm.compiler.runtime.classaxis import class_axes, judged_axis, parse_class_axes
from tpuasm.compiler.runtime.validate import compare

STEPS, ROWS, FEATURES, CLASSES = 7, 5, 6, 9


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v, np.float32)
                                                       if np.asarray(v).dtype.kind == "f"
                                                       else np.asarray(v), k)
                               for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _f(name, dims):
    return helper.make_tensor_value_info(name, T.FLOAT, dims)


def _rng_weights(seed=0):
    rng = np.random.default_rng(seed)
    return {"w": rng.normal(0, 0.5, (FEATURES, CLASSES)), "b": rng.normal(0, 0.1, CLASSES)}


def time_first_softmax(opset=17, axis=2) -> onnx.ModelProto:
    """A recogniser's head: x (T, N, F) -> MatMul -> Add -> Softmax over the classes ->
    y (T, N, classes)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
             helper.make_node("Add", ["m", "b"], ["logits"], name="fc_bias"),
             helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=axis)]
    return _model(nodes, [_f("x", [STEPS, "N", FEATURES])], [_f("y", [STEPS, "N", CLASSES])],
                  _rng_weights(), opset)


def detector(anchors=40, classes=10) -> onnx.ModelProto:
    """YOLOv8's output form: (N, 4 + classes, anchors), boxes and Sigmoid class scores of
    1x1 Convs concatenated on axis 1."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "wb"], ["boxes"], name="box_conv"),
             helper.make_node("Conv", ["x", "wc"], ["c"], name="cls_conv"),
             helper.make_node("Sigmoid", ["c"], ["scores"], name="cls_sigmoid"),
             helper.make_node("Concat", ["boxes", "scores"], ["y"], name="concat", axis=1)]
    return _model(nodes, [_f("x", ["N", 8, anchors])], [_f("y", ["N", 4 + classes, anchors])],
                  {"wb": rng.normal(0, 3, (4, 8, 1)), "wc": rng.normal(0, 1, (classes, 8, 1))})


def gemm_then_reshape() -> onnx.ModelProto:
    """ddddocr's tail: (T * N, F) -> Gemm(transB) -> Reshape to (T, N, classes), no Softmax."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g"], name="Gemm_97", transB=1),
             helper.make_node("Reshape", ["g", "shape"], ["y"], name="reshape")]
    return _model(nodes, [_f("x", [STEPS * 1, FEATURES])], [_f("y", [STEPS, 1, CLASSES])],
                  {"w": rng.normal(0, 0.5, (CLASSES, FEATURES)), "b": np.zeros(CLASSES),
                   "shape": np.array([STEPS, -1, CLASSES], np.int64)})


def classifier() -> onnx.ModelProto:
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc")]
    return _model(nodes, [_f("x", ["N", FEATURES])], [_f("y", ["N", CLASSES])], _rng_weights())


# --- the rule, from the graph --------------------------------------------------------------

def test_a_time_first_softmax_output_has_its_classes_on_the_softmax_axis():
    rule = class_axes(time_first_softmax())["y"]
    assert rule.axis == -1 and rule.classes == CLASSES and not rule.snr_too
    axis, why, snr_too = judged_axis(rule, (STEPS, ROWS, CLASSES))
    assert axis == 2 and "Softmax 'softmax'" in why and not snr_too


def test_a_detector_s_boxes_and_scores_are_judged_by_snr_only():
    rule = class_axes(detector())["y"]
    assert rule.axis is None and "Concat 'concat'" in rule.why
    assert judged_axis(rule, (2, 14, 40))[0] is None


def test_a_classifier_keeps_its_top_1_over_the_columns():
    for rule in (class_axes(classifier())["y"], None):     # with or without the graph
        axis, why, snr_too = judged_axis(rule, (ROWS, CLASSES))
        assert axis == 1 and not snr_too and "classifier" in why
    assert judged_axis(None, (ROWS, 1))[0] is None          # one column: SNR


def test_a_gemm_head_reshaped_to_steps_is_judged_per_step_and_by_its_snr():
    rule = class_axes(gemm_then_reshape())["y"]
    assert (rule.axis, rule.classes, rule.snr_too) == (-1, CLASSES, True)
    assert "Gemm 'Gemm_97'" in rule.why and f"{CLASSES} columns" in rule.why
    assert judged_axis(rule, (STEPS, 1, CLASSES))[:1] == (2,)
    # the Reshape is trusted only where the data shows the head's columns whole
    axis, why, _ = judged_axis(rule, (STEPS, CLASSES, 1))
    assert axis is None and f"not {CLASSES}" in why


@pytest.mark.parametrize("perm, axis", [((1, 0, 2), 2), ((0, 2, 1), 1), ((2, 0, 1), 0)])
def test_the_class_axis_follows_a_transpose(perm, axis):
    nodes = [helper.make_node("Softmax", ["x"], ["p"], name="softmax", axis=-1),
             helper.make_node("Transpose", ["p"], ["y"], name="t", perm=list(perm))]
    model = _model(nodes, [_f("x", ["N", STEPS, CLASSES])], [_f("y", None)], {})
    shape = tuple(np.empty((ROWS, STEPS, CLASSES)).transpose(perm).shape)
    assert judged_axis(class_axes(model)["y"], shape)[0] == axis


@pytest.mark.parametrize("op, axes, shape, axis", [
    ("Unsqueeze", [3], (ROWS, STEPS, CLASSES, 1), 2),
    ("Unsqueeze", [0], (1, ROWS, STEPS, CLASSES), 3),
    ("Squeeze", [1], (ROWS, CLASSES), 1)])
def test_the_class_axis_follows_squeeze_and_unsqueeze(op, axes, shape, axis):
    dims = ["N", 1, CLASSES] if op == "Squeeze" else ["N", STEPS, CLASSES]
    nodes = [helper.make_node("Softmax", ["x"], ["p"], name="softmax", axis=2),
             helper.make_node(op, ["p", "axes"], ["y"], name="reshape")]
    model = _model(nodes, [_f("x", dims)], [_f("y", None)], {"axes": np.array(axes, np.int64)})
    rule = class_axes(model)["y"]
    assert judged_axis(rule, shape)[0] == axis


def test_an_argmax_of_the_graph_names_the_class_axis():
    """Scores made by no softmax and no head (a Mul of two inputs), read by an ArgMax."""
    nodes = [helper.make_node("Mul", ["x", "gate"], ["scores"], name="mul"),
             helper.make_node("ArgMax", ["scores"], ["labels"], name="pick", axis=2,
                              keepdims=0)]
    model = _model(nodes, [_f("x", ["N", STEPS, CLASSES]), _f("gate", ["N", STEPS, CLASSES])],
                   [_f("scores", ["N", STEPS, CLASSES]),
                    helper.make_tensor_value_info("labels", T.INT64, ["N", STEPS])], {})
    rule = class_axes(model)["scores"]
    assert rule.axis == -1 and "ArgMax 'pick'" in rule.why


def test_a_softmax_exported_as_exp_over_its_sum_names_its_axis():
    nodes = [helper.make_node("Exp", ["x"], ["e"], name="exp"),
             helper.make_node("ReduceSum", ["e", "axes"], ["s"], name="sum", keepdims=1),
             helper.make_node("Div", ["e", "s"], ["y"], name="div")]
    model = _model(nodes, [_f("x", ["N", STEPS, CLASSES])], [_f("y", ["N", STEPS, CLASSES])],
                   {"axes": np.array([2], np.int64)})
    assert judged_axis(class_axes(model)["y"], (ROWS, STEPS, CLASSES))[0] == 2


def test_an_opset_11_softmax_over_several_axes_is_not_a_class_axis():
    """Before opset 13, Softmax(axis=1) of a rank-3 tensor normalises over axes 1 and 2."""
    rule = class_axes(time_first_softmax(opset=11, axis=1))["y"]
    assert rule.axis is None and "all axes from 1 on" in rule.why
    assert class_axes(time_first_softmax(opset=11, axis=2))["y"].axis == -1


def test_the_user_s_class_axis_comes_first():
    model = detector()
    assert parse_class_axes(["y=none"]) == {"y": None}
    rule = class_axes(model, parse_class_axes(["y=1"]))["y"]
    assert judged_axis(rule, (2, 14, 40))[:1] == (1,)
    rule = class_axes(time_first_softmax(), {"y": None})["y"]
    assert judged_axis(rule, (STEPS, ROWS, CLASSES))[0] is None
    assert judged_axis(class_axes(model, {"y": 3})["y"], (2, 14, 40))[0] is None
    with pytest.raises(CompileError, match="names no output of the model: z"):
        class_axes(model, {"z": 1})
    for bad in (["y"], ["y=one"], ["y=99"]):
        with pytest.raises(CompileError, match="--class-axis"):
            parse_class_axes(bad)


# --- the figures ---------------------------------------------------------------------------

def _flipped(ref: np.ndarray, axis: int, positions: int, seed: int) -> np.ndarray:
    """`ref` with its arg-max along `axis` moved at `positions` distinct positions."""
    got = np.moveaxis(ref.copy(), axis, -1)
    flat = got.reshape(-1, got.shape[-1])
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(flat), positions, replace=False):
        best = flat[i].argmax()
        flat[i, (best + 1) % flat.shape[1]] = flat[i, best] + 1.0
    return np.moveaxis(flat.reshape(got.shape), -1, axis)


def test_per_step_top_1_counts_each_step_of_each_row():
    rng = np.random.default_rng(3)
    ref = rng.random((STEPS, ROWS, CLASSES)).astype(np.float32)
    got = _flipped(ref, 2, 4, 0)
    check, = compare({"y": ref}, {"y": got}, ["y"], class_axes(time_first_softmax()))
    assert check.kind == "per-step top-1" and check.class_axis == 2
    assert check.agreement == pytest.approx(1 - 4 / (STEPS * ROWS))
    assert "per-step top-1 agreement" in check.text() and "Softmax 'softmax'" in check.text()
    # without the graph's rule: SNR only, as before
    assert compare({"y": ref}, {"y": got}, ["y"])[0].kind == "snr"


def test_a_detector_output_is_not_judged_over_its_anchors():
    rng = np.random.default_rng(4)
    ref = rng.random((2, 14, 40)).astype(np.float32)
    got = _flipped(ref, 2, 20, 1)           # the anchors' arg-max moved: no class changed
    check, = compare({"y": ref}, {"y": got}, ["y"], class_axes(detector()))
    assert check.kind == "snr" and check.agreement is None and check.snr_bar
    assert "SNR only" in check.text()


def test_a_two_column_classifier_keeps_its_top_1():
    rng = np.random.default_rng(5)
    ref = rng.random((40, CLASSES)).astype(np.float32)
    got = _flipped(ref, 1, 3, 2)
    for classes in (class_axes(classifier()), None):
        check, = compare({"y": ref}, {"y": got}, ["y"], classes)
        assert check.kind == "top-1" and check.agreement == pytest.approx(37 / 40)
        assert not check.snr_bar


# --- through the compiler ------------------------------------------------------------------

def _batch_first_softmax(tmp_path):
    """x (N, T, F) -> MatMul -> Add -> Softmax(-1) -> y (N, T, classes)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),
             helper.make_node("Add", ["m", "b"], ["logits"], name="fc_bias"),
             helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1)]
    model = _model(nodes, [_f("x", ["N", STEPS, FEATURES])], [_f("y", ["N", STEPS, CLASSES])],
                   _rng_weights(6))
    path = tmp_path / "seq.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(7).normal(0, 1, (48, STEPS, FEATURES)).astype(np.float32)
    return path, model, x


def test_the_report_gives_a_sequence_s_per_step_top_1_and_says_why(tmp_path):
    path, model, x = _batch_first_softmax(tmp_path)
    compiled = tpu_compile(str(path), calibration=x, batch=16, config={"array_size": 16})
    check, = compiled.report.validation.outputs
    want = session(model).run(["y"], {"x": x})[0]
    got = compiled.run(x)["y"]
    assert check.kind == "per-step top-1" and check.class_axis == 2
    assert check.agreement == pytest.approx(np.mean(want.argmax(2) == got.argmax(2)))
    text = compiled.report.text()
    assert "y: per-step top-1 agreement" in text and "made by Softmax 'softmax'" in text
    assert compiled.report.to_json()["validation"]["outputs"][0]["class_axis"] == 2


def test_the_cli_takes_class_axis_and_refuses_a_bad_one(tmp_path, capsys):
    path, _, x = _batch_first_softmax(tmp_path)
    np.save(tmp_path / "calib.npy", x)
    args = [str(path), "--batch", "16", "--calibrate", str(tmp_path / "calib.npy"), "-q"]
    assert compile_main(args + ["-o", str(tmp_path / "a"), "--class-axis", "y=none"]) == 0
    from tpuasm.compiler import load
    check, = load(tmp_path / "a").report.validation.outputs
    assert check.kind == "snr" and "--class-axis none" in check.why
    capsys.readouterr()
    for bad, words in (("y=two", "AXIS must be an integer or 'none'"),
                       ("z=1", "names no output of the model: z")):
        assert compile_main(args + ["-o", str(tmp_path / "b"), "--class-axis", bad]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
        assert not (tmp_path / "b").exists()


def _near_tied_steps(tmp_path):
    """A sequence head whose classes are nearly tied: every column of W is one shared
    column plus a small difference, so the outputs are large (a high SNR) while their
    arg-max rests on the small part (8-bit rounding moves it at many steps)."""
    rng = np.random.default_rng(0)
    shared = rng.normal(0, 1, (FEATURES, 1))
    w = shared @ np.ones((1, CLASSES)) + 0.03 * rng.normal(0, 1, (FEATURES, CLASSES))
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="head")],
                   [_f("x", ["N", 12, FEATURES])], [_f("y", ["N", 12, CLASSES])], {"w": w})
    path = tmp_path / "tied.onnx"
    onnx.save(model, str(path))
    return path, rng.normal(0, 1, (64, 12, FEATURES)).astype(np.float32)


def test_auto_searches_when_a_sequence_s_steps_disagree_though_its_snr_passes(tmp_path):
    path, x = _near_tied_steps(tmp_path)
    snr_only = tpu_compile(str(path), calibration=x, batch=16, class_axes={"y": None})
    check, = snr_only.report.validation.outputs
    assert check.kind == "snr" and check.snr_db >= 20 and not snr_only.report.validation.warnings
    assert "chosen by the check" not in snr_only.report.source      # SNR alone: no search
    judged = tpu_compile(str(path), calibration=x, batch=16)
    source = judged.report.source
    assert "chosen by the check against the float model" in source
    first = source.split("(min-max: ")[1].split(";")[0]
    assert "per-step top-1 agreement" in first
    assert float(first.split(" %")[0]) < 99 and float(first.split("SNR ")[1].split(" dB")[0]) >= 20
    check, = judged.report.validation.outputs
    assert check.kind == "per-step top-1" and check.snr_too

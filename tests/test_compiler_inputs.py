"""Models as other people's tools export them (issue 20, item 1): operator domains other than
ONNX's own (scikit-learn's ai.onnx.ml, com.microsoft contrib ops) run on the host, a ZipMap's
sequence of maps comes out, integer inputs keep their type, inputs need not be batch-first
(sequence-first data, recurrent state passed whole), shapes computed at run time are folded
to constants before matching, and a lowering that fails leaves its node on the host.

Each model is compiled and run through the CLI's entry points (`tpuasm compile`, `tpuasm
infer`) and compared with onnxruntime on the float model (accuracy) and on OUTDIR's own QDQ
model (the same quantization: identical within 1 LSB)."""
from __future__ import annotations

import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_models import run_ort
from tpuasm.compiler import load
from tpuasm.compiler.front.batch import input_axes, parse_batch_axes, tensor_axes
from tpuasm.compiler.cli import compile_main, infer_main
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.fold import fold_constants
from tpuasm.compiler.pipeline import compile_model
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.front.reader import load_graph, read_model


def save(tmp_path, nodes, inputs, outputs, inits, name, domains=(), opset=17) -> str:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset)] + [
        helper.make_opsetid(*(d if isinstance(d, tuple) else (d, 1))) for d in domains]
    m = helper.make_model(graph, opset_imports=opsets)
    m.ir_version = 8
    onnx.checker.check_model(m)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    return str(path)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def cli(capsys, tmp_path, model, calib, *extra, engine="reference"):
    """compile + infer through the CLI: (OUTDIR, {output: array}, compile stdout, stderr)."""
    out = tmp_path / "out"
    code = compile_main([model, "-o", str(out), "--calibrate", str(calib), *map(str, extra)])
    text, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in text + err, err
    y = tmp_path / "y.npz"
    code = infer_main([str(out), str(calib), "-o", str(y), "--engine", engine, "-q"])
    _, err2 = capsys.readouterr()
    assert code == 0 and "Traceback" not in err2, err2
    with np.load(y) as data:
        return out, {k: data[k] for k in data.files}, text, err + err2


def feeds_of(calib) -> dict:
    if str(calib).endswith(".npz"):
        with np.load(calib) as data:
            return {k: data[k] for k in data.files}
    return np.load(calib)


def output_lsb(qdq_path, name: str) -> float:
    qdq = onnx.load(str(qdq_path))
    inits = {t.name: t for t in qdq.graph.initializer}
    for node in qdq.graph.node:
        if node.output[0] == name and node.op_type == "DequantizeLinear":
            return float(numpy_helper.to_array(inits[node.input[1]]))
    return 0.0


def assert_within_lsb(ours, theirs, lsb):
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    diff = np.abs(ours.astype(np.float64) - theirs)
    steps = np.rint(diff / lsb) if lsb else diff
    # an output spanning more than 256 steps is int16 (the calibration check made it so:
    # front/widen.py): onnxruntime's float32 sums round near-ties apart more often there
    # (docs/compiler.md, 16-bit activations), still never by more than one step
    wide = bool(lsb) and float(np.abs(np.asarray(theirs, np.float64)).max(initial=0)) > 256 * lsb
    need = 0.995 if wide else 0.999
    assert steps.max() <= 1 and np.mean(steps == 0) >= need, (steps.max(), np.mean(steps == 0))


def rows_of(report_text, node):
    """The report's rows of `node` (the node's whole name ends its row), each with the
    reason printed below it."""
    lines = report_text.splitlines()
    return [line + "  " + (lines[i + 1].strip() if i + 1 < len(lines) else "")
            for i, line in enumerate(lines)
            if line.split() and line.split()[-1] == node and
            line.split()[0] in ("TPU", "host", "unused")]


# --- scikit-learn's default exports (ai.onnx.ml, ZipMap) ---------------------------------

def _sklearn_export(model, x):
    skl2onnx = pytest.importorskip("skl2onnx")
    return skl2onnx.to_onnx(model, x[:1].astype(np.float32))


def test_skl2onnx_mlp_classifier_default_export(tmp_path, capsys):
    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPClassifier
    x, labels = load_digits(return_X_y=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # not converged: the accuracy is not at stake
        clf = MLPClassifier(hidden_layer_sizes=(24,), max_iter=60, random_state=0)
        clf.fit(x[:600], labels[:600])
    path = tmp_path / "mlp.onnx"
    onnx.save(_sklearn_export(clf, x), str(path))
    domains = {n.domain for n in onnx.load(str(path)).graph.node}
    assert "ai.onnx.ml" in domains               # ArrayFeatureExtractor, ZipMap
    calib = tmp_path / "x.npy"
    np.save(calib, x[600:900].astype(np.float32))
    out, y, text, err = cli(capsys, tmp_path, str(path), calib, "--batch", "16")
    assert rows_of(text, "ZipMap")[0].split()[0] == "host"
    assert "TPU" in rows_of(text, "MatMul")[0]        # the layers still map
    # the sequence of maps comes out as a (rows, classes) table with its keys
    assert y["output_probability"].shape == (300, 10)
    assert list(y["output_probability.keys"]) == list(range(10))
    assert "sequence of maps" in err
    label, prob = run_ort(onnx.load(str(path)), {"X": x[600:900].astype(np.float32)})
    assert np.mean(y["output_label"] == label) >= 0.97         # float-level accuracy
    qlabel, qprob = run_ort(onnx.load(str(out / "model.qdq.onnx")),
                            {"X": x[600:900].astype(np.float32)})
    assert np.array_equal(y["output_label"], qlabel)
    table = np.array([[p[k] for k in range(10)] for p in qprob], np.float32)
    assert np.abs(y["output_probability"] - table).max() <= 1 / 255
    # the Python API returns what onnxruntime returns: a list of {class: probability}
    result = load(out).run(x[600:603].astype(np.float32), engine="reference")
    assert isinstance(result["output_probability"], list)
    assert sorted(result["output_probability"][0]) == list(range(10))


def test_skl2onnx_logistic_regression_opset9_maps_its_gemm(tmp_path, capsys):
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    x, labels = load_iris(return_X_y=True)
    clf = LogisticRegression(max_iter=300).fit(x, labels)
    path = tmp_path / "logreg.onnx"
    exported = _sklearn_export(clf, x)
    assert {o.version for o in exported.opset_import if o.domain == ""} == {9}
    onnx.save(exported, str(path))
    calib = tmp_path / "x.npy"
    np.save(calib, x.astype(np.float32))
    _, y, text, _ = cli(capsys, tmp_path, str(path), calib, "--batch", "8")
    # LinearClassifier becomes a Gemm (prepare.py): its matrix work on the TPU
    assert rows_of(text, "LinearClassifier")[0].split()[0] == "TPU"
    label, prob = run_ort(exported, {"X": x.astype(np.float32)})
    assert np.mean(y["output_label"] == label) >= 0.98
    table = np.array([[p[k] for k in range(3)] for p in prob], np.float32)
    np.testing.assert_allclose(y["output_probability"], table, atol=0.05)


def _pipeline_case(tmp_path, capsys, estimator):
    """A scikit-learn pipeline as skl2onnx exports it by default, compiled from the CLI on
    digits; (report text, the compiled outputs on the held-out rows, onnxruntime's)."""
    from sklearn.datasets import load_digits
    x, labels = load_digits(return_X_y=True)
    x = x.astype(np.float32)
    target = labels if hasattr(estimator, "predict_proba") or hasattr(
        estimator, "decision_function") else x.sum(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # not converged: the accuracy is not at stake
        estimator.fit(x[:800], target[:800])
    path = tmp_path / "pipeline.onnx"
    exported = _sklearn_export(estimator, x)
    onnx.save(exported, str(path))
    calib = tmp_path / "x.npy"
    np.save(calib, x[:800])             # the training rows: the ranges the held-out ones need
    _, y, text, _ = cli(capsys, tmp_path, str(path), calib, "--batch", "16")
    held = x[800:1100]
    want = run_ort(exported, {"X": held})
    got = load(tmp_path / "out").run(held, engine="reference")
    return text, got, want, exported


@pytest.mark.parametrize("scaler", ["StandardScaler", "MinMaxScaler", "Normalizer"])
def test_skl2onnx_pipelines_with_a_scaler_put_the_model_on_the_tpu(tmp_path, capsys, scaler):
    """skl2onnx writes a StandardScaler as ai.onnx.ml's Scaler, whose output shape onnx does
    not infer (every MatMul after it had no shape: 0 % of the MACs on the TPU, 'not
    counted'), a MinMaxScaler as Cast, Mul, Add (whose types the LinearClassifier rewrite
    did not know: it stayed on the host), a Normalizer as ai.onnx.ml's Normalizer."""
    import sklearn.preprocessing as pre
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    model = (MLPClassifier(hidden_layer_sizes=(32,), max_iter=80, random_state=0)
             if scaler == "StandardScaler" else LogisticRegression(max_iter=300))
    text, got, want, _ = _pipeline_case(tmp_path, capsys,
                                        make_pipeline(getattr(pre, scaler)(), model))
    assert "MACs per batch" in text and "on the TPU: 0 " not in text and "(100.0 %)" in text
    assert "not counted" not in text
    assert np.mean(got["output_label"] == want[0]) >= 0.97


def test_a_pca_after_a_standard_scaler_leaves_its_linear_classifier_on_the_tpu(tmp_path,
                                                                                capsys):
    """Scaler -> Sub -> MatMul (a PCA) -> LinearClassifier: onnx infers no type after the
    Scaler, so the rewrites before quantization saw an input of no type and left the
    LinearClassifier on the host ('its input is not float32')."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    text, got, want, _ = _pipeline_case(tmp_path, capsys, make_pipeline(
        StandardScaler(), PCA(16), LogisticRegression(max_iter=500)))
    assert rows_of(text, "LinearClassifier")[0].split()[0] == "TPU"
    assert rows_of(text, "MatMul")[0].split()[0] == "TPU"
    assert np.mean(got["output_label"] == want[0]) >= 0.97


def test_an_mlp_regressor_after_a_standard_scaler_fuses_its_bias_adds(tmp_path, capsys):
    """StandardScaler + MLPRegressor: Scaler -> Cast -> MatMul -> Add(bias) -> Relu ...  The
    MatMul + bias fusion needs the MatMul input's rank, which onnx did not infer after the
    Scaler: each bias Add stayed on the host between two TPU segments (a host round trip
    and one more 8-bit rounding per layer)."""
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    text, got, want, _ = _pipeline_case(tmp_path, capsys, make_pipeline(
        StandardScaler(), MLPRegressor(hidden_layer_sizes=(32, 16), max_iter=200,
                                       random_state=0)))
    adds = [r for r in text.splitlines() if r.split()[-1:] and
            r.split()[-1].startswith("Add") and r.split()[0] in ("TPU", "host")]
    assert len(adds) == 3 and all(r.split()[0] == "TPU" for r in adds)
    assert "folded into Gemm" in text and "(in 1 segment)" in text
    (y,) = want
    error = got["variable"].reshape(y.shape).astype(np.float64) - y
    # (30 dB here: three 8-bit layers over a target of 100 to 450)
    assert 10 * np.log10(np.sum(y.astype(np.float64) ** 2) / np.sum(error ** 2)) > 25


def test_skl2onnx_ridge_with_two_onnx_imports_compiles(tmp_path, capsys):
    """skl2onnx imports the ONNX domain twice for a model of scikit-learn operators alone;
    onnxruntime's quantizer refused it ('Failed to find proper ai.onnx domain')."""
    from sklearn.linear_model import Ridge
    text, got, want, exported = _pipeline_case(tmp_path, capsys, Ridge())
    assert [o.domain for o in exported.opset_import].count("") == 2      # still so
    assert rows_of(text, "LinearRegressor")[0].split()[0] == "TPU"
    (y,) = want
    error = got["variable"].astype(np.float64) - y
    assert 10 * np.log10(np.sum(y.astype(np.float64) ** 2) / np.sum(error ** 2)) > 40


def test_the_check_scores_a_classifier_whose_probabilities_are_a_zipmap(tmp_path, capsys):
    """The float check's search compared every output and stopped at ZipMap's sequence of
    maps: a skl2onnx classifier below the bar was never searched."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
    from tpuasm.compiler.runtime.calibsearch import score
    from sklearn.datasets import load_digits
    x, labels = load_digits(return_X_y=True)
    x = x.astype(np.float32)
    model = LinearDiscriminantAnalysis().fit(x[:800], labels[:800])
    exported = _sklearn_export(model, x)
    rows = {"X": x[800:1100]}
    result = score(exported, exported, rows, True)      # the float model against itself
    assert result is not None and result.agreement == 1.0


def test_an_operator_onnxruntime_does_not_know_is_refused_by_name(tmp_path, capsys):
    path = save(tmp_path, [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example",
                                            name="mystery")],
                [vi("x", T.FLOAT, ["N", 4])], [vi("y", T.FLOAT, ["N", 4])], [], "odd",
                domains=["com.example"])
    code = compile_main([path, "-o", str(tmp_path / "out"), "--calibrate", "x.npy"])
    err = capsys.readouterr().err
    assert code == 2 and "mystery" in err and "com.example" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# --- integer inputs ----------------------------------------------------------------------

def token_model(tmp_path, rng):
    emb = rng.normal(0, 1, (50, 16)).astype(np.float32)
    w = rng.normal(0, 0.4, (10, 16)).astype(np.float32)
    b = rng.normal(0, 0.1, 10).astype(np.float32)
    return save(tmp_path, [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
        helper.make_node("ReduceMean", ["e"], ["m"], axes=[1], keepdims=0, name="pool"),
        helper.make_node("Gemm", ["m", "w", "b"], ["y"], transB=1, name="classifier")],
        [vi("ids", T.INT32, ["N", 8])], [vi("y", T.FLOAT, ["N", 10])],
        [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(b, "b")], "tokens", opset=17)


def test_int32_token_ids_stay_int32(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = token_model(tmp_path, rng)
    ids = rng.integers(0, 50, (40, 8)).astype(np.int32)
    calib = tmp_path / "ids.npy"
    np.save(calib, ids)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "16")
    assert "TPU" in rows_of(text, "classifier")[0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"] == [{"name": "ids", "shape": [8], "dtype": "int32",
                                   "batch_axis": 0}]
    (theirs,) = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"ids": ids})
    assert_within_lsb(y["y"], theirs, output_lsb(out / "model.qdq.onnx", "y"))
    (float_y,) = run_ort(onnx.load(path), {"ids": ids})
    assert np.mean(np.argmax(y["y"], 1) == np.argmax(float_y, 1)) >= 0.95
    # whole-number floats are taken as ids; a fraction is an error naming the input
    model = load(out)
    same = model.run(ids.astype(np.float64), engine="reference")["y"]
    assert np.array_equal(same, y["y"])
    with pytest.raises(CompileError, match="'ids'.*int32"):
        model.run(ids + 0.5, engine="reference")


# --- batch axes --------------------------------------------------------------------------

def seq_first_model(tmp_path, rng):
    """x (S=5, N, F=6) sequence-first, h (1, 1, 4) a recurrent state of fixed shape:
    y = Tanh(x Wx + h Wh) per step (S, N, 4), h_out = Relu(h Wh) (1, 1, 4)."""
    wx = rng.normal(0, 0.4, (6, 4)).astype(np.float32)
    wh = rng.normal(0, 0.4, (4, 4)).astype(np.float32)
    return save(tmp_path, [
        helper.make_node("MatMul", ["x", "wx"], ["xw"], name="input_proj"),
        helper.make_node("MatMul", ["h", "wh"], ["hw"], name="state_proj"),
        helper.make_node("Add", ["xw", "hw"], ["pre"], name="gate_add"),
        helper.make_node("Tanh", ["pre"], ["y"], name="gate_tanh"),
        helper.make_node("Relu", ["hw"], ["h_out"], name="state_out")],
        [vi("x", T.FLOAT, [5, "N", 6]), vi("h", T.FLOAT, [1, 1, 4])],
        [vi("y", T.FLOAT, [5, "N", 4]), vi("h_out", T.FLOAT, [1, 1, 4])],
        [numpy_helper.from_array(wx, "wx"), numpy_helper.from_array(wh, "wh")], "seqfirst")


def test_a_sequence_first_tensor_runs_on_the_tpu_over_its_steps(tmp_path):
    # a quantized Tanh of a sequence-first tensor (its batch on axis 1): its program's rows
    # are the 5 steps (the leading dimension, Segment.rows), each a (batch, 6) row of the
    # batch's samples
    q = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128),
                                                                              "z")]
    path = save(tmp_path, [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
        helper.make_node("Tanh", ["xd"], ["t"], name="seq_tanh"),
        helper.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"], name="qt"),
        helper.make_node("DequantizeLinear", ["tq", "s", "z"], ["y"], name="dqt")],
        [vi("x", T.FLOAT, [5, "N", 6])], [vi("y", T.FLOAT, [5, "N", 6])], q, "seqtanh")
    compiled = compile_model(path, batch=4, config=["array_size=16"])
    (row,) = [r for r in compiled.report.rows if r.node == "seq_tanh"]
    assert row.where == "TPU", row.reason
    (segment,) = compiled.report.segments
    assert (segment.rows, segment.own_rows) == (5, True)
    x = np.random.default_rng(2).normal(0, 1, (5, 9, 6)).astype(np.float32)
    (want,) = run_ort(onnx.load(path), {"x": x})
    for engine in ("emulator", "reference"):
        np.testing.assert_array_equal(compiled.run(x, engine=engine)["y"], want)


def test_batch_axes_are_inferred_per_tensor(tmp_path):
    path = seq_first_model(tmp_path, np.random.default_rng(0))
    model = read_model(path)
    axes = input_axes(model, None, path)
    assert axes == {"x": 1, "h": None}
    every = tensor_axes(model, axes)
    assert every["xw"] == 1 and every["pre"] == 1 and every["y"] == 1
    assert every["hw"] is None and every["h_out"] is None
    graph, batch = load_graph(path, 4, read_model(path))
    assert batch == 4 and graph.shapes["x"] == (5, 4, 6) and graph.shapes["h"] == (1, 1, 4)
    assert graph.batch_axis["y"] == 1 and graph.batch_axis["h"] is None


def test_sequence_first_input_and_state_passed_whole(tmp_path, capsys):
    rng = np.random.default_rng(1)
    path = seq_first_model(tmp_path, rng)
    x = rng.normal(0, 1, (5, 30, 6)).astype(np.float32)     # 30 rows along axis 1
    h = rng.normal(0, 1, (1, 1, 4)).astype(np.float32)      # once, whole
    calib = tmp_path / "data.npz"
    np.savez(calib, x=x, h=h)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "8")
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(v["name"], v["shape"], v["batch_axis"]) for v in manifest["inputs"]] == \
        [("x", [5, 6], 1), ("h", [1, 1, 4], None)]
    assert [(v["name"], v["batch_axis"]) for v in manifest["outputs"]] == \
        [("y", 1), ("h_out", None)]
    # a tensor whose batch is not on axis 0 is kept off the TPU (the quantizer already
    # leaves this Tanh of a host value float; test_batch_axis_keeps_a_tensor_off_the_tpu
    # checks the matcher's own rule)
    row = rows_of(text, "gate_tanh")[0]
    assert row.split()[0] == "host"
    theirs = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"x": x, "h": h})
    assert y["y"].shape == (5, 30, 4) and y["h_out"].shape == (1, 1, 4)
    for name, want in zip(("y", "h_out"), theirs):
        assert_within_lsb(y[name], want, output_lsb(out / "model.qdq.onnx", name))
    float_y, _ = run_ort(onnx.load(path), {"x": x, "h": h})
    assert np.abs(y["y"] - float_y).max() < 0.05


def test_batch_axis_option_on_a_fixed_shape_model(tmp_path, capsys):
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.5, (6, 3)).astype(np.float32)
    path = save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["xw"], name="fc"),
                           helper.make_node("Add", ["xw", "bias"], ["y"], name="add_bias")],
                [vi("x", T.FLOAT, [2, 6]), vi("bias", T.FLOAT, [1, 3])],
                [vi("y", T.FLOAT, [2, 3])], [numpy_helper.from_array(w, "w")], "fixed")
    model = read_model(path)
    assert input_axes(model, None, path) == {"x": 0, "bias": 0}   # the model's own batch
    assert input_axes(model, parse_batch_axes(["bias=none"]), path) == \
        {"x": 0, "bias": None}
    x = rng.normal(0, 1, (7, 6)).astype(np.float32)
    bias = rng.normal(0, 1, (1, 3)).astype(np.float32)
    calib = tmp_path / "data.npz"
    np.savez(calib, x=x, bias=bias)
    out, y, _, _ = cli(capsys, tmp_path, path, calib, "--batch-axis", "bias=none")
    assert y["y"].shape == (7, 3)
    assert json.loads((out / "manifest.json").read_text())["batch"] == 2
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    want = np.concatenate([run_ort(qdq, {"x": np.concatenate([x[i:i + 2], np.zeros(
        (max(0, i + 2 - 7), 6), np.float32)]), "bias": bias})[0][:min(2, 7 - i)]
        for i in range(0, 7, 2)])
    assert_within_lsb(y["y"], want, output_lsb(out / "model.qdq.onnx", "y"))


@pytest.mark.parametrize("argv,message", [
    (["--batch-axis", "nope=0"], "names no input"),
    (["--batch-axis", "x=3"], "has 2 dimensions"),
    (["--batch-axis", "x=first"], "integer or 'none'"),
    (["--batch-axis", "x"], "NAME=AXIS")])
def test_bad_batch_axis_options(tmp_path, capsys, argv, message):
    path = save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])],
                [vi("x", T.FLOAT, ["N", 4])], [vi("y", T.FLOAT, ["N", 4])], [], "relu")
    np.save(tmp_path / "c.npy", np.zeros((3, 4), np.float32))
    code = compile_main([path, "-o", str(tmp_path / "out"), "--calibrate",
                         str(tmp_path / "c.npy"), "--batch", "2", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_outdir_without_batch_axes_is_refused_until_compiled_again(tmp_path):
    path = save(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="r")],
                [vi("x", T.FLOAT, ["N", 4])], [vi("y", T.FLOAT, ["N", 4])], [], "relu")
    x = np.random.default_rng(3).normal(0, 1, (5, 4)).astype(np.float32)
    compile_model(path, batch=2, calibration=x).save(tmp_path / "out")
    manifest_path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for v in manifest["inputs"] + manifest["outputs"]:
        del v["batch_axis"]                         # as OUTDIRs written before
    del manifest["files"], manifest["digest"]       # (which had no digests either)
    manifest_path.write_text(json.dumps(manifest))
    # nothing vouches for an OUTDIR without digests (spec/limits.md "Compiled models")
    with pytest.raises(CompileError, match=r"compiled by an older tpuasm: .*`tpuasm compile "):
        load(tmp_path / "out")
    compile_model(path, batch=2, calibration=x).save(tmp_path / "out")     # as it says
    model = load(tmp_path / "out")
    assert [i.batch_axis for i in model.inputs + model.outputs] == [0, 0]
    (want,) = run_ort(onnx.load(str(tmp_path / "out" / "model.qdq.onnx")), {"x": x})
    assert np.array_equal(model.run(x, engine="reference")["y"], want)


# --- constant folding --------------------------------------------------------------------

def shape_pad_model(tmp_path, rng):
    """Pad whose pads come from Shape -> Gather -> Div -> Concat, then a Conv."""
    w = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    return save(tmp_path, [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i2"], ["h"], axis=0, name="take_h"),
        helper.make_node("Div", ["h", "eight"], ["p"], name="div"),
        helper.make_node("Concat", ["z2", "p", "p", "z2", "p", "p"], ["pads"], axis=0,
                         name="concat_pads"),
        helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad"),
        helper.make_node("Conv", ["xp", "w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["y"], name="relu")],
        [vi("x", T.FLOAT, ["N", 3, 8, 8])], [vi("y", T.FLOAT, ["N", 4, 8, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([2], np.int64), "i2"),
         numpy_helper.from_array(np.int64(8), "eight"),
         numpy_helper.from_array(np.zeros(2, np.int64), "z2")], "shapepad")


def test_shapes_computed_at_run_time_are_folded(tmp_path, capsys):
    rng = np.random.default_rng(4)
    path = shape_pad_model(tmp_path, rng)
    x = rng.normal(0, 1, (12, 3, 8, 8)).astype(np.float32)
    calib = tmp_path / "x.npy"
    np.save(calib, x)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "4",
                          "--config", "array_size=16", engine="emulator")
    assert "TPU" in rows_of(text, "conv")[0] and "Conv 3x10x10" in rows_of(text, "conv")[0]
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    assert not {"Shape", "Gather", "Div", "Concat"} & {n.op_type for n in qdq.graph.node}
    (want,) = run_ort(qdq, {"x": x[:4]})
    assert_within_lsb(y["y"][:4], want, output_lsb(out / "model.qdq.onnx", "y"))
    (float_y,) = run_ort(onnx.load(path), {"x": x})
    assert np.abs(y["y"] - float_y).max() < 0.1
    # the provenance names every removed node
    compiled = compile_model(path, batch=4, calibration=x)
    assert set(compiled.provenance.folded) == {"shape", "take_h", "div", "concat_pads"}
    assert all(why.startswith("constant-folded") for why in compiled.provenance.folded.values())


def test_folding_a_quantized_model_and_the_size_cap(tmp_path):
    rng = np.random.default_rng(5)
    big = numpy_helper.from_array(np.array([1024, 2048], np.int64), "big_shape")
    path = save(tmp_path, [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Cast", ["s"], ["sf"], to=T.FLOAT, name="cast"),
        helper.make_node("ConstantOfShape", ["big_shape"], ["huge"], name="huge",
                         value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("ReduceSum", ["huge"], ["total"], keepdims=0, name="total"),
        helper.make_node("Mul", ["x", "total"], ["xt"], name="scale"),
        helper.make_node("Unsqueeze", ["sf", "zero"], ["su"], name="unsq"),
        helper.make_node("ReduceMax", ["su"], ["m"], keepdims=0, name="maxdim"),
        helper.make_node("Add", ["xt", "m"], ["y"], name="add")],
        [vi("x", T.FLOAT, ["N", 3])], [vi("y", T.FLOAT, ["N", 3])],
        [big, numpy_helper.from_array(np.array([0], np.int64), "zero")], "cap")
    model = read_model(path)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    prov = Provenance.of(model)
    assert fold_constants(model, path, prov) == 4           # shape, cast, unsq, maxdim
    left = [n.name for n in model.graph.node]
    assert left == ["huge", "total", "scale", "add"]         # 2 M elements: never built
    x = rng.normal(0, 1, (2, 3)).astype(np.float32)
    (want,) = run_ort(onnx.load(path), {"x": x})
    (got,) = run_ort(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)


# --- contrib operators -------------------------------------------------------------------

def contrib_model(tmp_path, rng):
    w1 = rng.normal(0, 0.3, (12, 16)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (5, 16)).astype(np.float32)
    return save(tmp_path, [
        helper.make_node("FusedMatMul", ["x", "w1"], ["h"], domain="com.microsoft",
                         alpha=1.0, name="fused"),
        helper.make_node("Gelu", ["h"], ["g"], domain="com.microsoft", name="gelu"),
        helper.make_node("Gemm", ["g", "w2"], ["y"], transB=1, name="fc")],
        [vi("x", T.FLOAT, ["N", 12])], [vi("y", T.FLOAT, ["N", 5])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")], "contrib",
        domains=["com.microsoft"])


def test_contrib_ops_run_on_the_host_with_their_types_known(tmp_path, capsys):
    rng = np.random.default_rng(6)
    path = contrib_model(tmp_path, rng)
    graph, _ = load_graph(path, 3)
    assert graph.dtypes["h"] == np.float32 and graph.shapes["h"] == (3, 16)
    assert graph.dtypes["g"] == np.float32 and graph.shapes["g"] == (3, 16)
    x = rng.normal(0, 1, (20, 12)).astype(np.float32)
    calib = tmp_path / "x.npy"
    np.save(calib, x)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "8")
    # a FusedMatMul of a weight is read back as its MatMul (front/ortfusions.py)
    assert rows_of(text, "fused")[0].split()[0] == "TPU"
    (want,) = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"x": x})
    assert_within_lsb(y["y"], want, output_lsb(out / "model.qdq.onnx", "y"))
    (float_y,) = run_ort(onnx.load(path), {"x": x})
    assert np.abs(y["y"] - float_y).max() < 0.1


# --- a lowering that fails ---------------------------------------------------------------

def test_a_node_the_lowering_mishandles_stays_on_the_host(tmp_path, monkeypatch):
    from tpuasm.compiler.front import match as lower_module
    rng = np.random.default_rng(7)
    w = rng.normal(0, 0.4, (8, 6)).astype(np.float32)
    path = save(tmp_path, [helper.make_node("Gemm", ["x", "w"], ["h"], name="first"),
                           helper.make_node("Relu", ["h"], ["r"], name="act"),
                           helper.make_node("Gemm", ["r", "w2"], ["y"], name="second")],
                [vi("x", T.FLOAT, ["N", 8])], [vi("y", T.FLOAT, ["N", 4])],
                [numpy_helper.from_array(w, "w"),
                 numpy_helper.from_array(rng.normal(0, 0.4, (6, 4)).astype(np.float32),
                                         "w2")], "two")
    original = lower_module.Lowerer.lower_gemm

    def broken(self, node):
        if node.name == "second":
            raise IndexError("tuple index out of range")     # a bug, not a NotMapped
        return original(self, node)

    monkeypatch.setattr(lower_module.Lowerer, "lower_gemm", broken)
    x = rng.normal(0, 1, (10, 8)).astype(np.float32)
    compiled = compile_model(path, batch=4, calibration=x, codegen=False)
    where = {r.node: (r.where, r.note) for r in compiled.report.rows}
    assert where["first"][0] == "TPU"
    assert where["second"][0] == "host" and "IndexError" in where["second"][1]
    (want,) = run_ort(onnx.load(str(compiled.reference_model)), {"x": x})
    assert_within_lsb(compiled.run(x, engine="reference")["y"], want,
                      output_lsb(compiled.reference_model, "y"))


def test_a_segment_the_back_end_mishandles_goes_back_to_the_host(tmp_path, monkeypatch,
                                                                  capsys):
    from tpuasm.compiler import codegen
    rng = np.random.default_rng(8)
    path = save(tmp_path, [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Tanh", ["c"], ["t"], name="squash"),
        helper.make_node("Conv", ["t", "w2"], ["y"], name="conv2")],
        [vi("x", T.FLOAT, ["N", 2, 5, 5])], [vi("y", T.FLOAT, ["N", 3, 3, 3])],
        [numpy_helper.from_array(rng.normal(0, 0.4, (3, 2, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(0, 0.4, (3, 3, 3, 3)).astype(np.float32), "w2")],
        "convtanh")
    original = codegen.generate

    def broken(segment, batch, **kw):
        if any(op.name == "squash" for op in segment.operators):
            raise ValueError("cannot reshape array of size 8192 into shape (64,8,1,1)")
        return original(segment, batch, **kw)

    monkeypatch.setattr(codegen, "generate", broken)
    x = rng.normal(0, 1, (6, 2, 5, 5)).astype(np.float32)
    calib = tmp_path / "x.npy"
    np.save(calib, x)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "3",
                          "--config", "array_size=16", engine="emulator")
    squash = rows_of(text, "squash")[0]
    assert "host" in squash and "ValueError: cannot reshape" in squash
    # only the operator that fails alone leaves the TPU
    assert "TPU" in rows_of(text, "conv")[0] and "TPU" in rows_of(text, "conv2")[0]
    (want,) = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"x": x[:3]})
    assert_within_lsb(y["y"][:3], want, output_lsb(out / "model.qdq.onnx", "y"))


def test_batch_axis_through_an_operator_onnx_does_not_know(tmp_path):
    # onnx loses the batch symbol at the contrib node; two fixed batch sizes find it again
    path = save(tmp_path, [
        helper.make_node("FusedMatMul", ["x", "w"], ["h"], domain="com.microsoft",
                         name="fused"),
        helper.make_node("Relu", ["h"], ["y"], name="relu")],
        [vi("x", T.FLOAT, [5, "N", 6])], [vi("y", T.FLOAT, [5, "N", 4])],
        [numpy_helper.from_array(np.ones((6, 4), np.float32), "w")], "lost",
        domains=["com.microsoft"])
    model = read_model(path)
    axes = input_axes(model, None, path)
    assert "y" not in tensor_axes(model, axes)
    found = tensor_axes(model, axes, path)
    assert found["h"] == 1 and found["y"] == 1 and found["w"] is None


def test_rank1_scalar_and_boolean_inputs(tmp_path, capsys):
    rng = np.random.default_rng(9)
    path = save(tmp_path, [
        helper.make_node("Unsqueeze", ["a", "one"], ["a2"], name="unsq"),
        helper.make_node("Mul", ["x", "a2"], ["xa"], name="mul"),
        helper.make_node("Add", ["xa", "s"], ["xs"], name="add"),
        helper.make_node("Where", ["mask", "xs", "zero"], ["xm"], name="where"),
        helper.make_node("Gemm", ["xm", "w"], ["y"], transB=1, name="fc")],
        [vi("x", T.FLOAT, ["N", 8]), vi("a", T.FLOAT, ["N"]), vi("s", T.FLOAT, []),
         vi("mask", T.BOOL, ["N", 8])], [vi("y", T.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.float32(0), "zero"),
         numpy_helper.from_array(rng.normal(0, 0.4, (3, 8)).astype(np.float32), "w")], "mixed")
    feeds = {"x": rng.normal(0, 1, (10, 8)).astype(np.float32),
             "a": rng.normal(0, 1, 10).astype(np.float32),
             "s": np.array(0.5, np.float32), "mask": rng.random((10, 8)) > 0.3}
    calib = tmp_path / "data.npz"
    np.savez(calib, **feeds)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "4")
    assert "TPU" in rows_of(text, "fc")[0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(v["name"], v["shape"], v["dtype"], v["batch_axis"])
            for v in manifest["inputs"]] == [("x", [8], "float32", 0), ("a", [], "float32", 0),
                                             ("s", [], "float32", None),
                                             ("mask", [8], "bool", 0)]
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    want = np.concatenate([run_ort(qdq, {k: (v if k == "s" else np.resize(v[i:i + 4], (
        4,) + v.shape[1:])) for k, v in feeds.items()})[0][:min(4, 10 - i)]
        for i in range(0, 10, 4)])
    assert_within_lsb(y["y"], want, output_lsb(out / "model.qdq.onnx", "y"))


def test_lstm_with_sequence_first_input_and_state(tmp_path, capsys):
    rng = np.random.default_rng(10)
    s, f, h = 4, 5, 6
    path = save(tmp_path, [
        helper.make_node("LSTM", ["x", "W", "R", "", "", "h0", "c0"], ["Y", "Yh", "Yc"],
                         hidden_size=h, name="lstm"),
        helper.make_node("Squeeze", ["Yh", "zero"], ["hn"], name="last"),
        helper.make_node("Gemm", ["hn", "wo"], ["y"], transB=1, name="classifier")],
        [vi("x", T.FLOAT, [s, "N", f]), vi("h0", T.FLOAT, [1, "N", h]),
         vi("c0", T.FLOAT, [1, "N", h])],
        [vi("y", T.FLOAT, ["N", 3]), vi("Yh", T.FLOAT, [1, "N", h])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (1, 4 * h, f)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.normal(0, 0.3, (1, 4 * h, h)).astype(np.float32), "R"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(rng.normal(0, 0.4, (3, h)).astype(np.float32), "wo")], "lstm")
    feeds = {"x": rng.normal(0, 1, (s, 10, f)).astype(np.float32),
             "h0": rng.normal(0, 1, (1, 10, h)).astype(np.float32),
             "c0": rng.normal(0, 1, (1, 10, h)).astype(np.float32)}
    calib = tmp_path / "data.npz"
    np.savez(calib, **feeds)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "4")
    assert "TPU" in rows_of(text, "classifier")[0]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [v["batch_axis"] for v in manifest["inputs"] + manifest["outputs"]] == [1, 1, 1, 0, 1]
    theirs = run_ort(onnx.load(str(out / "model.qdq.onnx")), feeds)
    for name, want in zip(("y", "Yh"), theirs):
        assert_within_lsb(y[name], want, output_lsb(out / "model.qdq.onnx", name))


def test_int32_bytes_feeding_a_one_hot(tmp_path):
    rng = np.random.default_rng(11)
    path = save(tmp_path, [
        helper.make_node("OneHot", ["b", "depth", "values"], ["oh"], axis=-1, name="onehot"),
        helper.make_node("Reshape", ["oh", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "w"], ["h"], transB=1, name="dense"),
        helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
        helper.make_node("Gemm", ["t", "w2"], ["y"], transB=1, name="logits")],
        [vi("b", T.INT32, ["N", 16])], [vi("y", T.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.array(8, np.int32), "depth"),
         numpy_helper.from_array(np.array([0, 1], np.float32), "values"),
         numpy_helper.from_array(np.array([-1, 128], np.int64), "flat_shape"),
         numpy_helper.from_array(rng.normal(0, 0.2, (32, 128)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(0, 0.2, (4, 32)).astype(np.float32), "w2")],
        "onehot")
    b = rng.integers(0, 8, (50, 16)).astype(np.int32)
    compiled = compile_model(path, batch=8, calibration=b, codegen=False)
    assert {r.node: r.where for r in compiled.report.rows}["dense"] == "TPU"
    y = compiled.run(b, engine="reference")["y"]
    (want,) = run_ort(onnx.load(str(compiled.reference_model)), {"b": b})
    assert_within_lsb(y, want, output_lsb(compiled.reference_model, "y"))
    (float_y,) = run_ort(onnx.load(path), {"b": b})
    assert np.mean(np.argmax(y, 1) == np.argmax(float_y, 1)) >= 0.95


def test_a_model_without_a_batch_runs_once_and_writes_its_sequence(tmp_path, capsys):
    rng = np.random.default_rng(12)
    path = save(tmp_path, [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sigmoid", ["x"], ["g"], name="gate"),
        helper.make_node("SequenceConstruct", ["r", "g"], ["parts"], name="pack")],
        [vi("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_sequence_value_info("parts", T.FLOAT, [2, 3])], [], "packed")
    x = rng.normal(0, 1, (2, 3)).astype(np.float32)
    calib = tmp_path / "x.npy"
    np.save(calib, x)
    out, y, _, _ = cli(capsys, tmp_path, path, calib, "--batch-axis", "x=none")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["batch"] == 1 and manifest["inputs"][0]["batch_axis"] is None
    assert manifest["outputs"][0]["dtype"] == "seq(tensor(float))"
    parts = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"x": x})[0]
    assert y["parts"].shape == (2, 2, 3)
    np.testing.assert_array_equal(y["parts"], np.stack(parts))


def test_an_if_whose_branches_read_outer_tensors(tmp_path):
    # the branches read 'h' from outside (an implicit input: partition and the host parts
    # must see it); onnxruntime's quantizer orders the If by its explicit inputs only, and
    # declares the branches' outputs at the compiled batch
    rng = np.random.default_rng(13)
    then_g = helper.make_graph([helper.make_node("Relu", ["h"], ["o1"])], "then", [],
                               [vi("o1", T.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Mul", ["h", "k"], ["o2"])], "else", [],
                               [vi("o2", T.FLOAT, None)])
    path = save(tmp_path, [
        helper.make_node("Gemm", ["x", "w"], ["h"], transB=1, name="fc"),
        helper.make_node("Greater", ["k", "zero"], ["cond"], name="gt"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g,
                         name="branch")],
        [vi("x", T.FLOAT, ["N", 4])], [vi("y", T.FLOAT, ["N", 3])],
        [numpy_helper.from_array(rng.normal(0, 0.5, (3, 4)).astype(np.float32), "w"),
         numpy_helper.from_array(np.float32(0), "zero"),
         numpy_helper.from_array(np.float32(2), "k")], "iff")
    x = rng.normal(0, 1, (12, 4)).astype(np.float32)
    compiled = compile_model(path, batch=4, calibration=x, codegen=False)
    assert compiled.outputs[0].batch_axis == 0
    y = compiled.run(x, engine="reference")["y"]
    qdq = onnx.load(str(compiled.reference_model))
    want = np.concatenate([run_ort(qdq, {"x": x[i:i + 4]})[0] for i in range(0, 12, 4)])
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    (float_y,) = run_ort(onnx.load(path), {"x": x})
    assert np.abs(y - float_y).max() < 0.05


def test_a_qoperator_contrib_node_does_not_hide_the_types_after_it(tmp_path):
    # QLinearAdd (com.microsoft): onnx cannot type its output, onnxruntime can, so the
    # QLinearConv after it still maps to the TPU (and the QLinearAdd itself, as a VADD)
    from onnx_models import const, model, qparams_inputs, value_info
    rng = np.random.default_rng(14)

    def conv(name, x, y, xq, yq):
        w = rng.integers(-127, 128, (4, 4, 3, 3)).astype(np.int8)
        inits = [const(f"{name}_w", w), const(f"{name}_ws", np.float32(0.004)),
                 const(f"{name}_wz", np.int8(0))]
        node = helper.make_node("QLinearConv", [x, f"{xq}_scale", f"{xq}_zp", f"{name}_w",
                                                f"{name}_ws", f"{name}_wz", f"{yq}_scale",
                                                f"{yq}_zp"], [y], name=name,
                                kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        return node, inits

    c1, i1 = conv("conv1", "xq", "a", "x", "a")
    c2, i2 = conv("conv2", "r", "b", "r", "b")
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q"),
             c1,
             helper.make_node("QLinearAdd", ["a", "a_scale", "a_zp", "xq", "x_scale", "x_zp",
                                             "r_scale", "r_zp"], ["r"], domain="com.microsoft",
                              name="residual"),
             c2,
             helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zp"], ["y"], name="dq")]
    inits = [*qparams_inputs("x", 0.02, 128, False), *qparams_inputs("a", 0.05, 120, False),
             *qparams_inputs("r", 0.06, 110, False), *qparams_inputs("b", 0.1, 128, False),
             *i1, *i2]
    m = model(nodes, [value_info("x", np.float32, ("N", 4, 6, 6))],
              [value_info("y", np.float32, ("N", 4, 6, 6))], inits, ms_domain=True)
    path = tmp_path / "qres.onnx"
    onnx.save(m, str(path))
    compiled = compile_model(path, batch=2, codegen=False)
    where = {r.node: r.where for r in compiled.report.rows}
    assert where["residual"] == "TPU" and where["conv1"] == "TPU" and where["conv2"] == "TPU"
    x = rng.normal(0, 1, (5, 4, 6, 6)).astype(np.float32)
    (want,) = run_ort(m, {"x": x})
    assert_within_lsb(compiled.run(x, engine="reference")["y"], want, 0.1)


def test_a_weight_quantized_in_the_graph_folds_and_maps(tmp_path):
    # some exporters store the float weight and quantize it in the graph:
    # QuantizeLinear(W) -> DequantizeLinear -> MatMul; folded, the weight is int8
    from onnx_models import const, model, qparams_inputs, value_info
    rng = np.random.default_rng(15)
    w = rng.normal(0, 0.3, (8, 5)).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xf"], name="dqx"),
             helper.make_node("QuantizeLinear", ["w", "w_scale", "w_zp"], ["wq"], name="qw"),
             helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["wf"], name="dqw"),
             helper.make_node("MatMul", ["xf", "wf"], ["h"], name="fc"),
             helper.make_node("QuantizeLinear", ["h", "y_scale", "y_zp"], ["hq"], name="qy"),
             helper.make_node("DequantizeLinear", ["hq", "y_scale", "y_zp"], ["y"], name="dqy")]
    inits = [*qparams_inputs("x", 0.02, 128, False), *qparams_inputs("w", 0.005, 0, True),
             *qparams_inputs("y", 0.05, 128, False), const("w", w)]
    m = model(nodes, [value_info("x", np.float32, ("N", 8))],
              [value_info("y", np.float32, ("N", 5))], inits)
    path = tmp_path / "qw.onnx"
    onnx.save(m, str(path))
    compiled = compile_model(path, batch=4, codegen=False)
    assert {r.node: r.where for r in compiled.report.rows}["fc"] == "TPU"
    assert "qw" in compiled.provenance.folded
    x = rng.normal(0, 1, (9, 8)).astype(np.float32)
    (want,) = run_ort(m, {"x": x})
    assert_within_lsb(compiled.run(x, engine="reference")["y"], want, 0.05)


def test_a_flatten_computed_from_the_shape_maps(tmp_path):
    # PyTorch's x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    rng = np.random.default_rng(16)
    path = save(tmp_path, [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0, name="batch_size"),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="as_list"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0, name="target"),
        helper.make_node("Reshape", ["r", "target"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1, name="fc")],
        [vi("x", T.FLOAT, ["N", 2, 4, 4])], [vi("y", T.FLOAT, ["N", 5])],
        [numpy_helper.from_array(rng.normal(0, 0.4, (3, 2, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(0, 0.2, (5, 48)).astype(np.float32), "w2"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array([0], np.int64), "axes0"),
         numpy_helper.from_array(np.array([-1], np.int64), "minus1")], "view")
    x = rng.normal(0, 1, (10, 2, 4, 4)).astype(np.float32)
    compiled = compile_model(path, batch=5, calibration=x, codegen=False)
    where = {r.node: r.where for r in compiled.report.rows}
    assert where["conv"] == "TPU" and where["fc"] == "TPU"
    assert {"shape", "batch_size", "as_list", "target"} <= set(compiled.provenance.folded)
    y = compiled.run(x, engine="reference")["y"]
    qdq = onnx.load(str(compiled.reference_model))
    want = np.concatenate([run_ort(qdq, {"x": x[i:i + 5]})[0] for i in (0, 5)])
    assert_within_lsb(y, want, output_lsb(compiled.reference_model, "y"))


def test_a_fixed_batch_baked_into_a_reshape_still_maps(tmp_path):
    # exported with batch 1: Reshape(x, [1, -1]) hides the batch from shape inference; a
    # model with a fixed batch keeps the batch-first convention
    rng = np.random.default_rng(17)
    path = save(tmp_path, [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "target"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w2"], ["y"], transB=1, name="fc")],
        [vi("x", T.FLOAT, [1, 2, 4, 4])], [vi("y", T.FLOAT, [1, 5])],
        [numpy_helper.from_array(rng.normal(0, 0.4, (3, 2, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(0, 0.2, (5, 48)).astype(np.float32), "w2"),
         numpy_helper.from_array(np.array([1, -1], np.int64), "target")], "baked")
    x = rng.normal(0, 1, (6, 2, 4, 4)).astype(np.float32)
    compiled = compile_model(path, calibration=x, codegen=False)
    assert compiled.batch == 1
    where = {r.node: r.where for r in compiled.report.rows}
    assert where["conv"] == "TPU" and where["fc"] == "TPU"
    y = compiled.run(x, engine="reference")["y"]
    qdq = onnx.load(str(compiled.reference_model))
    want = np.concatenate([run_ort(qdq, {"x": x[i:i + 1]})[0] for i in range(6)])
    assert_within_lsb(y, want, output_lsb(compiled.reference_model, "y"))


def test_data_in_the_wrong_layout_names_the_input_and_the_shapes(tmp_path, capsys):
    rng = np.random.default_rng(18)
    path = seq_first_model(tmp_path, rng)
    calib = tmp_path / "rows_first.npz"
    np.savez(calib, x=np.zeros((30, 5, 6), np.float32), h=np.zeros((1, 1, 4), np.float32))
    code = compile_main([path, "-o", str(tmp_path / "out"), "--calibrate", str(calib),
                         "--batch", "8"])
    err = capsys.readouterr().err
    assert code == 2 and "rows_first.npz" in err and "'x'" in err
    assert "(30, 5, 6)" in err and "expected (5, rows, 6)" in err
    assert not (tmp_path / "out").exists()
    good = tmp_path / "good.npz"
    np.savez(good, x=rng.normal(0, 1, (5, 12, 6)).astype(np.float32),
             h=np.zeros((1, 1, 4), np.float32))
    assert compile_main([path, "-o", str(tmp_path / "out"), "--calibrate", str(good),
                         "--batch", "8", "-q"]) == 0
    capsys.readouterr()
    np.savez(tmp_path / "x.npz", x=np.zeros((5, 3, 6), np.float32),
             h=np.zeros((2, 1, 4), np.float32))          # a whole input of the wrong shape
    code = infer_main([str(tmp_path / "out"), str(tmp_path / "x.npz"), "-o",
                       str(tmp_path / "y.npz")])
    err = capsys.readouterr().err
    assert code == 2 and "'h'" in err and "expected (1, 1, 4)" in err


def test_a_mismatched_shape_names_each_dynamic_dimension():
    # a past state (2, batch, heads, past, head): its past length is not the rows
    from tpuasm.compiler.front.samples import check_samples
    signature = {"past": [2, "batch", 4, "past_len", 8], "x": [None, 3]}
    data = {"past": np.zeros((2, 6, 4, 5), np.float32), "x": np.zeros((6, 3), np.float32)}
    with pytest.raises(CompileError, match=r"'past' has shape \(2, 6, 4, 5\), expected "
                                           r"\(2, rows, 4, past_len, 8\)"):
        check_samples(data, signature, "calib.npz", axes={"past": 1, "x": 0})
    data = {"past": np.zeros((2, 6, 4, 5, 8), np.float32), "x": np.zeros((6, 4), np.float32)}
    with pytest.raises(CompileError, match=r"'x' has shape \(6, 4\), expected \(rows, 3\)"):
        check_samples(data, signature, "calib.npz", axes={"past": 1, "x": 0})
    with pytest.raises(CompileError, match=r"expected \(any, 3\)"):
        check_samples(data, signature, "calib.npz", axes={"past": 1, "x": None})


def test_a_string_input_feeding_an_ai_onnx_ml_encoder(tmp_path, capsys):
    rng = np.random.default_rng(19)
    words = ["cat", "dog", "emu", "yak"]
    path = save(tmp_path, [
        helper.make_node("LabelEncoder", ["s"], ["ids"], domain="ai.onnx.ml", name="encode",
                         keys_strings=words, values_int64s=[0, 1, 2, 3], default_int64=0),
        helper.make_node("OneHot", ["ids", "depth", "values"], ["oh"], axis=-1, name="onehot"),
        helper.make_node("Reshape", ["oh", "flat_shape"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w"], ["y"], transB=1, name="fc")],
        [vi("s", T.STRING, ["N", 3])], [vi("y", T.FLOAT, ["N", 2])],
        [numpy_helper.from_array(np.array(4, np.int64), "depth"),
         numpy_helper.from_array(np.array([0, 1], np.float32), "values"),
         numpy_helper.from_array(np.array([-1, 12], np.int64), "flat_shape"),
         numpy_helper.from_array(rng.normal(0, 0.5, (2, 12)).astype(np.float32), "w")],
        "words", domains=[("ai.onnx.ml", 2)])
    s = np.array(rng.choice(words, (20, 3)))
    calib = tmp_path / "s.npy"
    np.save(calib, s)
    out, y, text, _ = cli(capsys, tmp_path, path, calib, "--batch", "8")
    assert "TPU" in rows_of(text, "fc")[0] and "host" in rows_of(text, "encode")[0]
    (want,) = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"s": s})
    assert_within_lsb(y["y"], want, output_lsb(out / "model.qdq.onnx", "y"))
    with pytest.raises(CompileError, match="expected strings"):
        load(out).run(np.zeros((2, 3), np.float32), engine="reference")


def test_a_fixed_shape_model_that_splits_its_first_axis_runs_whole(tmp_path, capsys):
    """PyTorch's `chunk` on a (3,) tensor: outputs of 2 and 1 rows cannot be batches of a
    batch of 3, so the input is passed whole (one sample), not cut into rows."""
    path = save(tmp_path, [helper.make_node("Split", ["x"], ["a", "b"], axis=0, name="chunk",
                                            split=[2, 1])],
                [vi("x", T.FLOAT, [3])], [vi("a", T.FLOAT, [2]), vi("b", T.FLOAT, [1])], [],
                "chunk", opset=11)
    assert input_axes(read_model(path), None, path) == {"x": None}
    x = np.array([0.5, -1.0, 2.0], np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    assert compile_main([path, "-o", str(out), "--calibrate", str(tmp_path / "x.npy"),
                         "-q"]) == 0, capsys.readouterr().err
    assert infer_main([str(out), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npz"),
                       "-q"]) == 0, capsys.readouterr().err
    y = np.load(tmp_path / "y.npz")
    np.testing.assert_array_equal(y["a"], x[:2])
    np.testing.assert_array_equal(y["b"], x[2:])


def test_an_ir_version_3_export_with_weights_among_its_inputs(tmp_path, capsys):
    """PyTorch 0.3 wrote IR version 3: every initializer is also a graph input, which the
    checker demands there and refuses in the graphs the compiler adds constants to."""
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.4, (4, 6)).astype(np.float32)
    b = rng.normal(0, 0.1, 4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "torch03",
        [vi("x", T.FLOAT, [5, 6]), vi("w", T.FLOAT, [4, 6]), vi("b", T.FLOAT, [4])],
        [vi("y", T.FLOAT, [5, 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    m.ir_version = 3
    path = tmp_path / "torch03.onnx"
    onnx.save(m, str(path))
    x = rng.normal(0, 1, (40, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    assert compile_main([str(path), "-o", str(out), "--calibrate", str(tmp_path / "x.npy"),
                         "-q"]) == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["tpu_macs"] == report["macs"] == 5 * 6 * 4      # a batch of 5, all on the TPU
    assert infer_main([str(out), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                       "-q"]) == 0
    y = np.load(tmp_path / "y.npy")
    want = x @ w.T + b
    assert np.abs(y - want).max() < 0.05 * np.abs(want).max()


def test_a_weight_computed_at_load_time_is_folded_or_named(tmp_path, monkeypatch):
    """onnx's 'light' zoo models make their weights with ConstantOfShape: such a weight is
    folded (beyond the cap of other constants) and maps; beyond the weights' own cap it stays
    a run-time value, and the report says that, not 'two activations'."""
    from tpuasm.compiler.front import fold
    k, n = 1024, fold.MAX_ELEMENTS // 1024 + 1          # more than other constants may be
    fill = helper.make_tensor("v", T.FLOAT, [1], [0.001])
    path = save(tmp_path, [
        helper.make_node("ConstantOfShape", ["wshape"], ["w"], value=fill, name="make_w"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        [vi("x", T.FLOAT, ["N", k])], [vi("y", T.FLOAT, ["N", n])],
        [numpy_helper.from_array(np.array([k, n], np.int64), "wshape")], "light")
    calib = np.random.default_rng(0).normal(0, 1, (4, k)).astype(np.float32)

    def fc_row():
        model = compile_model(path, batch=2, calibration=calib, config={"array_size": 16},
                              validate=False)
        return next(r for r in model.report.rows if r.node == "fc")
    assert fc_row().where == "TPU"
    # beyond the cap of weights computed by other operators, a weight of one value
    # repeated (ConstantOfShape) still folds, up to its own, memory-bound cap
    monkeypatch.setattr(fold, "MAX_WEIGHT_ELEMENTS", fold.MAX_ELEMENTS)
    assert fold.generated_weight_limit() > k * n
    assert fc_row().where == "TPU"
    monkeypatch.setattr(fold, "MAX_GENERATED_WEIGHT_ELEMENTS", fold.MAX_ELEMENTS)
    row = fc_row()
    assert row.where == "host" and "computed from constants at run time" in row.reason


def test_a_generated_weight_folds_only_while_memory_allows(monkeypatch):
    """The cap of a ConstantOfShape weight: half the machine's memory over the float32
    copies a compile holds, between the other weights' cap and 1 GiB of float32."""
    import os

    from tpuasm.compiler.front import fold
    pages = {"SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    pages["SC_PHYS_PAGES"] = (64 << 30) // 4096                  # 64 GiB: the 1 GiB cap
    assert fold.generated_weight_limit() == fold.MAX_GENERATED_WEIGHT_ELEMENTS
    pages["SC_PHYS_PAGES"] = (8 << 30) // 4096                   # 8 GiB
    assert fold.generated_weight_limit() == \
        (8 << 30) // 2 // (4 * fold.GENERATED_WEIGHT_COPIES)
    pages["SC_PHYS_PAGES"] = (512 << 20) // 4096                 # 512 MiB: the weights' cap
    assert fold.generated_weight_limit() == fold.MAX_WEIGHT_ELEMENTS

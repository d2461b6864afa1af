"""Quantizing float models so that they keep the float model's answers: only the nodes the TPU
takes are quantized, the host parts stay float; the options (per-tensor weights, symmetric
activations, calibration methods, nodes kept in float); the fused-bias form of a rank-3 MatMul;
the check against the float model (validate.py).  Oracles: onnxruntime on the float model and
on the QDQ model the compiler writes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.cli import compile_main
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.ort import session
from tpuasm.compiler.front.quantize import QuantOptions, quantize, tpu_nodes
from tpuasm.compiler.runtime.classaxis import class_axes
from tpuasm.compiler.runtime.validate import compare


def _init(name, array, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(array, dtype), name)


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _save(tmp_path, nodes, inputs, outputs, inits, name="m", opset=17):
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    return path, m


def _float(model, feeds):
    return session(model).run(None, feeds)


def _dense(rng, prefix, k, n, scale=None):
    scale = 1 / np.sqrt(k) if scale is None else scale
    return [_init(f"{prefix}_w", rng.normal(0, scale, (k, n))),
            _init(f"{prefix}_b", rng.normal(0, 0.1, n))]


def _matmul_add(prefix, x, out):
    return [helper.make_node("MatMul", [x, f"{prefix}_w"], [f"{prefix}_mm"], name=f"{prefix}_mm"),
            helper.make_node("Add", [f"{prefix}_mm", f"{prefix}_b"], [out], name=f"{prefix}_add")]


def _row(report, name):
    return next(r for r in report.compiled_nodes if r.node == name)


# --- a small CNN: Conv + BatchNormalization + Relu ------------------------------------------

def _cnn(tmp_path):
    rng = np.random.default_rng(0)
    c = 6
    inits = [_init("cw", rng.normal(0, 0.4, (c, 2, 3, 3))), _init("cb", rng.normal(0, 0.1, c)),
             _init("g", rng.uniform(0.5, 1.5, c)), _init("be", rng.normal(0, 0.2, c)),
             _init("mu", rng.normal(0, 0.3, c)), _init("var", rng.uniform(0.5, 2, c)),
             _init("fw", rng.normal(0, 0.5, (4, c))), _init("fb", rng.normal(0, 0.1, 4))]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "be", "mu", "var"], ["n"],
                              name="bn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    return _save(tmp_path, nodes, [_f("x", ["N", 2, 6, 6])], [_f("y", ["N", 4])], inits, "cnn")


def test_cnn_with_batch_norm_folds_it_and_keeps_the_float_answers(tmp_path):
    path, model = _cnn(tmp_path)
    x = np.random.default_rng(1).normal(0, 1, (64, 2, 6, 6)).astype(np.float32)
    compiled = tpu_compile(path, batch=8, calibration=x)
    names = [r.node for r in compiled.report.compiled_nodes]
    assert "bn" not in names                                     # folded before quantizing
    assert compiled.provenance.folded == {"bn": "folded into Conv 'conv'"}
    for node in ("conv", "gap", "fc"):
        assert _row(compiled.report, node).where == "TPU", _row(compiled.report, node)
    (want,) = _float(model, {"x": x})
    got = compiled.run(x, engine="reference")["y"]
    assert np.mean(np.argmax(got, 1) == np.argmax(want, 1)) >= 0.95
    v = compiled.report.validation
    assert v.rows == 64 and v.outputs[0].kind == "top-1"
    assert v.outputs[0].agreement == pytest.approx(np.mean(np.argmax(got, 1) ==
                                                           np.argmax(want, 1)))
    assert v.outputs[0].snr_db > 20 and v.warnings == []
    assert "Against the float model" in compiled.report.text()
    assert compiled.report.to_json()["validation"]["outputs"][0]["output"] == "y"


def test_a_model_with_external_weights_is_prepared_too(tmp_path):
    path, model = _cnn(tmp_path)
    external = tmp_path / "ext" / "cnn.onnx"
    external.parent.mkdir()
    onnx.save(model, str(external), save_as_external_data=True, all_tensors_to_one_file=True,
              location="cnn.weights", size_threshold=0)
    x = np.random.default_rng(1).normal(0, 1, (32, 2, 6, 6)).astype(np.float32)
    compiled = tpu_compile(external, batch=8, calibration=x)
    assert compiled.provenance.folded == {"bn": "folded into Conv 'conv'"}
    assert compiled.report.validation.outputs[0].agreement >= 0.95


# --- an MLP of MatMul + Add: one TPU segment ----------------------------------------------

def test_mlp_bias_adds_fold_into_gemms_in_one_segment(tmp_path):
    rng = np.random.default_rng(2)
    inits = _dense(rng, "l1", 12, 16) + _dense(rng, "l2", 16, 16) + _dense(rng, "l3", 16, 5)
    nodes = [*_matmul_add("l1", "x", "a1"), helper.make_node("Relu", ["a1"], ["r1"], name="r1"),
             *_matmul_add("l2", "r1", "a2"), helper.make_node("Relu", ["a2"], ["r2"], name="r2"),
             *_matmul_add("l3", "r2", "y")]
    path, model = _save(tmp_path, nodes, [_f("x", ["N", 12])], [_f("y", ["N", 5])], inits, "mlp")
    x = rng.normal(0, 1, (100, 12)).astype(np.float32)
    compiled = tpu_compile(path, batch=10, calibration=x)
    kinds = [s["kind"] for s in compiled.report.steps]
    assert kinds.count("tpu") == 1, compiled.report.text()
    tpu = {r.node: r.op_type for r in compiled.report.compiled_nodes if r.where == "TPU"}
    assert {"l1_mm", "l2_mm", "l3_mm"} <= set(tpu) and tpu["l1_mm"] == "Gemm"
    (want,) = _float(model, {"x": x})
    got = compiled.run(x, engine="reference")["y"]
    assert np.mean(np.argmax(got, 1) == np.argmax(want, 1)) >= 0.95
    assert compiled.report.validation.outputs[0].agreement >= 0.95


# --- a rank-3 MatMul + Add: the fused-bias QDQ pattern -------------------------------------

def _rank3(tmp_path):
    rng = np.random.default_rng(3)
    inits = _dense(rng, "p", 6, 5)
    path, model = _save(tmp_path, _matmul_add("p", "x", "y"), [_f("x", ["N", 7, 6])],
                        [_f("y", ["N", 7, 5])], inits, "r3")
    return path, model, rng.normal(0, 1, (40, 7, 6)).astype(np.float32)


def test_rank_3_matmul_add_gets_the_int32_bias_pattern_onnxruntime_runs(tmp_path):
    path, model, x = _rank3(tmp_path)
    out = tmp_path / "r3.qdq.onnx"
    from tpuasm.compiler.front.prepare import prepare
    prepared = prepare(onnx.load(str(path)))
    nodes = quantize(prepared.model, {"x": x}, {"x": ["N", 7, 6]}, out)
    assert set(nodes) == {"p_mm", "p_add"}
    qdq = onnx.load(str(out))
    g = qdq.graph
    producer = {o: n for n in g.node for o in n.output}
    consumers = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    mm = next(n for n in g.node if n.op_type == "MatMul")
    x_dq, w_dq = producer[mm.input[0]], producer[mm.input[1]]
    assert x_dq.op_type == w_dq.op_type == "DequantizeLinear"
    assert inits[w_dq.input[0]].dtype == np.int8 and inits[w_dq.input[1]].size == 5
    (add,) = consumers[mm.output[0]]
    assert add.op_type == "Add"
    b_dq = producer[next(i for i in add.input if i != mm.output[0])]
    assert b_dq.op_type == "DequantizeLinear"
    b_q = inits[b_dq.input[0]]
    assert b_q.dtype == np.int32 and not np.any(inits[b_dq.input[2]])
    expect = np.float32(inits[x_dq.input[1]]) * inits[w_dq.input[1]]
    np.testing.assert_allclose(inits[b_dq.input[1]], expect, rtol=1e-6)
    b = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "p_b"))
    np.testing.assert_allclose(b_q * expect, b, atol=np.max(expect))
    (q,) = consumers[add.output[0]]
    assert q.op_type == "QuantizeLinear"
    # onnxruntime runs it, and it keeps the float answers
    (want,) = _float(model, {"x": x})
    (got,) = _float(qdq, {"x": x})
    snr = 10 * np.log10(np.sum(want ** 2) / np.sum((want - got) ** 2))
    assert snr > 30, snr


# --- recurrent classifiers ----------------------------------------------------------------

def _rnn_classifier(tmp_path, kind, seed, state=False):
    """x (N, S, I) -> Transpose -> LSTM/GRU (sequence-first) -> Y_h -> Gemm -> 3 classes;
    with `state`, batch-first initial states (N, 1, H) transposed to the node's (1, N, H)."""
    rng = np.random.default_rng(seed)
    s, i, h = 5, 4, 8
    g = 4 if kind == "LSTM" else 3
    inits = [_init("W", rng.normal(0, 0.5, (1, g * h, i))),
             _init("R", rng.normal(0, 0.4, (1, g * h, h))),
             _init("B", rng.normal(0, 0.2, (1, 2 * g * h))),
             _init("fw", rng.normal(0, 1, (h, 3))), _init("fb", rng.normal(0, 0.1, 3)),
             numpy_helper.from_array(np.array([0], np.int64), "ax0")]
    outs = ["", "yh"] + ([""] if kind == "LSTM" else [])
    ins = ["xt", "W", "R", "B"]
    inputs = [_f("x", ["N", s, i])]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], name="seq_first", perm=[1, 0, 2])]
    if state:
        states = ["h0", "c0"] if kind == "LSTM" else ["h0"]
        ins += ["", *[f"{n}_t" for n in states]]
        for n in states:
            inputs.append(_f(n, ["N", 1, h]))
            nodes.append(helper.make_node("Transpose", [n], [f"{n}_t"], name=f"{n}_first",
                                          perm=[1, 0, 2]))
    nodes += [helper.make_node(kind, ins, outs, name="rnn", hidden_size=h),
              helper.make_node("Squeeze", ["yh", "ax0"], ["hl"], name="last"),
              helper.make_node("MatMul", ["hl", "fw"], ["m"], name="fc"),
              helper.make_node("Add", ["m", "fb"], ["y"], name="fc_bias")]
    path, model = _save(tmp_path, nodes, inputs, [_f("y", ["N", 3])], inits, kind.lower())
    feeds = {"x": rng.normal(0, 1, (96, s, i)).astype(np.float32)}
    for v in inputs[1:]:
        feeds[v.name] = rng.normal(0, 0.5, (96, 1, h)).astype(np.float32)
    return path, model, feeds if state else feeds["x"]


@pytest.mark.parametrize("kind, state", [("LSTM", False), ("GRU", False), ("LSTM", True),
                                         ("GRU", True)])
def test_recurrent_classifier_puts_its_gate_gemms_on_the_tpu(tmp_path, kind, state):
    path, model, x = _rnn_classifier(tmp_path, kind, seed=5 if kind == "LSTM" else 6,
                                     state=state)
    compiled = tpu_compile(path, batch=16, calibration=x)
    tpu_gemms = [r for r in compiled.report.compiled_nodes if r.op_type == "Gemm" and r.where == "TPU"]
    # 5 steps: the input products (one per gate: LSTM 4, GRU 3), the recurrent ones (as
    # many) after step 0 (and at step 0 too when there is an initial state)
    steps_with_h = 5 if state else 4
    per_x, per_h = (4, 4) if kind == "LSTM" else (3, 3)
    assert len(tpu_gemms) == 5 * per_x + per_h * steps_with_h + 1, compiled.report.text()
    assert all(compiled.provenance.source(r.node) in ("rnn", "fc") for r in tpu_gemms)
    (rnn,) = [r for r in compiled.report.rows if r.node == "rnn"]      # the user's node
    assert rnn.where == "TPU" and "on the TPU" in rnn.reason
    feeds = x if state else {"x": x}
    (want,) = _float(model, feeds)
    got = compiled.run(feeds, engine="reference")["y"]
    agree = np.mean(np.argmax(got, 1) == np.argmax(want, 1))
    assert agree >= 0.95
    assert compiled.report.validation.outputs[0].agreement == pytest.approx(agree)


def test_keeping_a_recurrent_node_float_keeps_everything_unrolled_from_it(tmp_path):
    path, model, x = _rnn_classifier(tmp_path, "GRU", seed=6)
    compiled = tpu_compile(path, batch=16, calibration=x, keep_float="rnn", validate=False)
    from_rnn = [r for r in compiled.report.compiled_nodes if compiled.provenance.source(r.node) == "rnn"]
    assert len(from_rnn) > 50 and not [r for r in from_rnn if r.where == "TPU"]
    gemm = next(r for r in from_rnn if r.op_type == "Gemm")
    assert gemm.where == "host" and gemm.note == "kept in float (--keep-float)"
    assert _row(compiled.report, "fc").where == "TPU"
    by_type = tpu_compile(path, batch=16, calibration=x, keep_float=["GRU"], validate=False)
    assert [r.node for r in by_type.report.compiled_nodes if r.where == "TPU" and r.op_type == "Gemm"] \
        == ["fc"]


def test_recurrent_node_left_alone_says_why(tmp_path):
    path, model, x = _rnn_classifier(tmp_path, "LSTM", seed=7)
    m = onnx.load(str(path))
    m.graph.node[1].attribute.append(helper.make_attribute("clip", 2.0))
    onnx.save(m, str(path))
    compiled = tpu_compile(path, batch=16, calibration=x, validate=False)
    row = _row(compiled.report, "rnn")
    assert row.where == "host" and row.note == "LSTM not unrolled: cell clipping (clip)"
    assert compiled.report.validation is None


# --- a classifier with a host part: OneHot, a decomposed LayerNorm ------------------------

def _token_classifier(tmp_path):
    """Token ids (float) -> OneHot -> MatMul embedding (N, L, E) -> LayerNorm in primitives ->
    Reshape -> Dense + Tanh -> Dense -> 5 classes: the shape of the JAX export of issue 20."""
    rng = np.random.default_rng(8)
    v, length, e, hid = 12, 6, 8, 24
    inits = [_init("emb", rng.normal(0, 1, (v, e))),
             _init("depth", v),
             _init("onoff", [0, 1]), _init("eps", 1e-5), _init("two", 2.0),
             _init("gamma", rng.uniform(0.5, 1.5, e)), _init("beta", rng.normal(0, 0.1, e)),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array([0, length * e], np.int64), "flat"),
             *_dense(rng, "d1", length * e, hid), *_dense(rng, "d2", hid, 5, scale=1.0)]
    nodes = [helper.make_node("OneHot", ["ids", "depth", "onoff"], ["oh"], name="onehot"),
             helper.make_node("MatMul", ["oh", "emb"], ["te"], name="embed"),
             helper.make_node("ReduceMean", ["te", "axes"], ["mu"], name="ln_mean"),
             helper.make_node("Sub", ["te", "mu"], ["xc"], name="ln_sub"),
             helper.make_node("Pow", ["xc", "two"], ["sq"], name="ln_pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["var"], name="ln_var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="ln_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="ln_sqrt"),
             helper.make_node("Div", ["xc", "sd"], ["nx"], name="ln_div"),
             helper.make_node("Mul", ["nx", "gamma"], ["gx"], name="ln_gamma"),
             helper.make_node("Add", ["gx", "beta"], ["ln"], name="ln_beta"),
             helper.make_node("Reshape", ["ln", "flat"], ["fl"], name="flatten"),
             *_matmul_add("d1", "fl", "h1"),
             helper.make_node("Tanh", ["h1"], ["t1"], name="tanh"),
             *_matmul_add("d2", "t1", "y")]
    # sequences of 5 classes (class k favours tokens 2k, 2k+1); the last layer is fitted to
    # them by least squares on the float features, so the classifier's margins are those of
    # a trained model rather than of random weights
    labels = rng.integers(0, 5, 256)
    ids = rng.integers(0, v, (256, length))
    favoured = rng.random((256, length)) < 0.6
    ids[favoured] = (2 * labels[:, None] + rng.integers(0, 2, (256, length)))[favoured]
    ids = ids.astype(np.float32)
    probe = helper.make_graph(nodes[:-2], "probe", [_f("ids", ["N", length])],
                              [_f("t1", ["N", hid])], inits)
    probe = helper.make_model(probe, opset_imports=[helper.make_opsetid("", 18)])
    (feats,) = _float(probe, {"ids": ids})
    a = np.hstack([feats, np.ones((len(feats), 1), np.float32)])
    coef = np.linalg.lstsq(a, 4.0 * np.eye(5)[labels], rcond=None)[0]
    inits = [i for i in inits if i.name not in ("d2_w", "d2_b")]
    inits += [_init("d2_w", coef[:-1]), _init("d2_b", coef[-1])]
    path, model = _save(tmp_path, nodes, [_f("ids", ["N", length])], [_f("y", ["N", 5])],
                        inits, "tokens", opset=18)
    return path, model, ids


def test_host_parts_stay_float_and_the_classifier_keeps_its_answers(tmp_path):
    path, model, ids = _token_classifier(tmp_path)
    from tpuasm.compiler.front.prepare import prepare
    chosen = set(tpu_nodes(prepare(onnx.load(str(path))).model, QuantOptions()))
    assert {"embed", "d1_mm", "d2_mm", "tanh"} <= chosen
    assert not chosen & {"onehot", "ln_mean", "ln_sub", "ln_pow", "ln_div", "ln_gamma",
                         "ln_beta", "ln_eps", "ln_sqrt", "ln_var"}
    compiled = tpu_compile(path, batch=32, calibration=ids)
    (want,) = _float(model, {"ids": ids})
    got = compiled.run(ids, engine="reference")["y"]
    agree = np.mean(np.argmax(got, 1) == np.argmax(want, 1))
    assert agree >= 0.99, agree
    assert compiled.report.validation.outputs[0].agreement >= 0.99
    for node in ("d1_mm", "d2_mm", "tanh"):
        assert _row(compiled.report, node).where == "TPU"
    # the LayerNorm's values are never quantized: no QuantizeLinear reads what it computes
    qdq = onnx.load(str(compiled.reference_model))
    ln_outputs = {o for n in qdq.graph.node if n.name.startswith("ln_") for o in n.output}
    assert len(ln_outputs) == 9
    assert not [n.name for n in qdq.graph.node
                if n.op_type == "QuantizeLinear" and n.input[0] in ln_outputs]


def _token_rows(rows: int, seed: int) -> np.ndarray:
    """New rows of _token_classifier's task (its own rows are drawn the same way)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, rows)
    ids = rng.integers(0, 12, (rows, 6))
    favoured = rng.random((rows, 6)) < 0.6
    ids[favoured] = (2 * labels[:, None] + rng.integers(0, 2, (rows, 6)))[favoured]
    return ids.astype(np.float32)


def test_the_search_does_not_stop_within_the_estimate_s_noise_of_the_bar(tmp_path):
    """The token classifier's min-max model: 99.22 % of its 128 check rows, 99.13 % expected
    on new rows, but that estimate is 0.48 points uncertain, and on 8,192 new rows it gives
    98.5 %.  `auto` holds the bar one standard error below the estimate, so it goes on:
    int16 weights; the Tanh it floated on the way is put back on the TPU once the bars are
    met without it.  The oracle: onnxruntime's float model on new rows."""
    path, model, ids = _token_classifier(tmp_path)
    compiled = tpu_compile(path, batch=32, calibration=ids)
    report = compiled.report
    assert report.wide_weights and "back on the TPU" in report.source and "tanh" in report.source
    assert {r.node: r.where for r in report.rows}["tanh"] == "TPU"
    (check,) = report.validation.outputs
    assert check.expected - check.expected_stderr >= 0.99
    new = _token_rows(8192, 123)
    (want,) = _float(model, {"ids": new})
    got = compiled.run(new)["y"]
    assert np.mean(np.argmax(got, 1) == np.argmax(want, 1)) >= 0.99
    fixed = tpu_compile(path, batch=32, calibration=ids, calibration_method="minmax")
    got = fixed.run(new)["y"]
    assert np.mean(np.argmax(got, 1) == np.argmax(want, 1)) < 0.99


def test_tpu_nodes_never_take_activation_products_gathers_or_softmax(tmp_path):
    rng = np.random.default_rng(9)
    inits = [_init("w", rng.normal(0, 1, (4, 4))), _init("tab", rng.normal(0, 1, (10, 4))),
             numpy_helper.from_array(np.array([1, 2], np.int64), "idx")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm_const"),
             helper.make_node("MatMul", ["a", "x2"], ["b"], name="mm_act"),
             helper.make_node("Gather", ["tab", "idx"], ["gt"], name="gather"),
             helper.make_node("Add", ["a", "a"], ["c"], name="add_act"),
             helper.make_node("Mul", ["c", "a"], ["d"], name="mul_act"),
             helper.make_node("Softmax", ["a"], ["s"], name="softmax"),
             helper.make_node("Sigmoid", ["a"], ["sg"], name="sig_after_tpu"),
             helper.make_node("Sigmoid", ["d"], ["sh"], name="sig_after_host"),
             helper.make_node("Relu", ["a"], ["r"], name="relu_after_tpu")]
    _, model = _save(tmp_path, nodes, [_f("x", [2, 4]), _f("x2", [4, 3])],
                     [_f("b", [2, 3]), _f("gt", [2, 4])] +
                     [_f(t, [2, 4]) for t in ("s", "sg", "sh", "r")], inits, "sel")
    # an Add/Mul of two activations the TPU makes is a VADD/VMUL now: taken, and what
    # reads it too; the MatMul of two activations, the Gather and the Softmax stay float
    assert tpu_nodes(model, QuantOptions()) == ["mm_const", "add_act", "mul_act",
                                                "sig_after_tpu", "sig_after_host",
                                                "relu_after_tpu"]
    assert tpu_nodes(model, QuantOptions(keep_float=("Sigmoid", "Mul"))) == [
        "mm_const", "add_act", "relu_after_tpu"]
    assert tpu_nodes(model, QuantOptions(keep_float="mm_const")) == []
    with pytest.raises(CompileError, match="--keep-float nope: no node or operator type"):
        tpu_nodes(model, QuantOptions(keep_float="nope"))


def test_tpu_nodes_take_an_add_of_two_tpu_values_but_not_a_constant_per_sample(tmp_path):
    rng = np.random.default_rng(10)
    inits = [_init("w", rng.normal(0, 1, (4, 4))), _init("c", rng.normal(0, 1, (2, 4))),
             _init("w1", rng.normal(0, 1, (4, 1)))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("MatMul", ["x", "w1"], ["n"], name="mm_narrow"),
             helper.make_node("Add", ["a", "x"], ["r"], name="skip"),         # + model input
             # (2,4) * (2,1): one channel spread over the others (the array, then VMUL)
             helper.make_node("Mul", ["a", "n"], ["m"], name="broadcast"),
             # a constant of the batch's shape: not one row for every sample
             helper.make_node("Add", ["a", "c"], ["k"], name="constant")]
    _, model = _save(tmp_path, nodes, [_f("x", [2, 4])],
                     [_f("r", [2, 4]), _f("m", [2, 4]), _f("k", [2, 4])], inits, "skip")
    assert tpu_nodes(model, QuantOptions()) == ["mm", "mm_narrow", "skip", "broadcast"]


# --- options -------------------------------------------------------------------------------

def _qdq_of(compiled):
    qdq = onnx.load(str(compiled.reference_model))
    return qdq, {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}


def test_per_tensor_and_symmetric_activation_options_reach_the_qdq_model(tmp_path):
    path, model = _cnn(tmp_path)
    x = np.random.default_rng(10).normal(0, 1, (32, 2, 6, 6)).astype(np.float32)
    compiled = tpu_compile(path, batch=8, calibration=x, per_channel=False,
                           symmetric_activations=True)
    qdq, inits = _qdq_of(compiled)
    for n in qdq.graph.node:
        if n.op_type == "DequantizeLinear":
            q, scale = inits.get(n.input[0]), inits[n.input[1]]
            if q is not None and q.dtype == np.int8 and q.ndim == 4:     # the conv weight
                assert scale.size == 1
        if n.op_type == "QuantizeLinear":
            zp = inits[n.input[2]]
            assert zp.dtype == np.int8 and zp == 0
    assert "per tensor" in compiled.report.source and "zero point 0" in compiled.report.source
    assert _row(compiled.report, "conv").where == "TPU"
    assert compiled.report.validation.outputs[0].agreement >= 0.9


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_calibration_methods_give_other_ranges_and_keep_the_answers(tmp_path, method):
    path, model = _cnn(tmp_path)
    x = np.random.default_rng(11).normal(0, 1, (32, 2, 6, 6)).astype(np.float32)
    x[::8, 0, 2, 2] = 25.0             # rare outliers: a range chosen by min-max is wide
    base = tpu_compile(path, batch=8, calibration=x, validate=False)
    other = tpu_compile(path, batch=8, calibration=x, calibration_method=method,
                        percentile=99.0)
    scales = [{k: v for k, v in _qdq_of(m)[1].items() if k.endswith("scale") and v.size == 1}
              for m in (base, other)]
    assert scales[0].keys() == scales[1].keys()
    assert any(not np.isclose(scales[0][k], scales[1][k]) for k in scales[0])
    assert ("entropy" if method == "entropy" else "99th percentile") in other.report.source
    # the check reports what the compiled model really gives (entropy on 32 rows clips the
    # logits hard: that is what the check is there to tell the user)
    (want,) = _float(model, {"x": x})
    got = other.run(x, engine="reference")["y"]
    agree = np.mean(np.argmax(got, 1) == np.argmax(want, 1))
    assert other.report.validation.outputs[0].agreement == pytest.approx(agree)
    assert bool(other.report.validation.warnings) == (agree < 0.99)


@pytest.mark.parametrize("kwargs, words", [
    ({"calibration_method": "median"}, "calibration method 'median'"),
    ({"calibration_method": "percentile", "percentile": 120}, "percentile 120"),
    ({"keep_float": "Nonesuch"}, "--keep-float Nonesuch"),
    ({"min_agreement": 1.5}, "min agreement 1.5"),
    ({"min_snr": "loud"}, "min SNR 'loud'"),
    ({"validate": np.zeros((3, 5), np.float32)}, "the validation data: .* has shape \\(3, 5\\)"),
])
def test_bad_options_are_one_clear_error(tmp_path, kwargs, words):
    path, _ = _cnn(tmp_path)
    x = np.zeros((4, 2, 6, 6), np.float32)
    with pytest.raises(CompileError, match=words):
        tpu_compile(path, batch=4, calibration=x, **kwargs)


def test_validation_on_other_data_and_its_figures(tmp_path):
    path, model = _cnn(tmp_path)
    rng = np.random.default_rng(12)
    x = rng.normal(0, 1, (32, 2, 6, 6)).astype(np.float32)
    other = rng.normal(0, 1, (20, 2, 6, 6)).astype(np.float32)
    np.save(tmp_path / "val.npy", other)
    compiled = tpu_compile(path, batch=8, calibration=x, validate=str(tmp_path / "val.npy"))
    v = compiled.report.validation
    assert v.rows == 20 and v.data.endswith("val.npy")
    (want,) = _float(model, {"x": other})
    got = compiled.run(other, engine="reference")["y"]
    (check,) = compare({"y": want}, {"y": got}, ["y"], class_axes(model))
    assert v.outputs[0].to_json() == check.to_json()
    noise = np.sum((want.astype(np.float64) - got) ** 2)
    assert check.snr_db == pytest.approx(10 * np.log10(np.sum(want.astype(np.float64) ** 2)
                                                       / noise))


def test_the_default_check_runs_an_even_spread_of_the_calibration_rows(tmp_path):
    """More calibration rows than CALIBRATION_CHECK_ROWS: the check runs that many, spread
    evenly (first and last included), and its figures are those of exactly these rows;
    data the user gives runs whole."""
    from tpuasm.compiler.runtime.validate import CALIBRATION_CHECK_ROWS, spread_rows
    path, model = _cnn(tmp_path)
    rows = CALIBRATION_CHECK_ROWS + 72
    x = np.random.default_rng(13).normal(0, 1, (rows, 2, 6, 6)).astype(np.float32)
    compiled = tpu_compile(path, batch=40, calibration=x)
    v = compiled.report.validation
    assert (v.rows, v.of_rows) == (CALIBRATION_CHECK_ROWS, rows)
    assert f"{CALIBRATION_CHECK_ROWS} of the {rows} rows (evenly spaced)" in v.text()
    keep = spread_rows(rows, CALIBRATION_CHECK_ROWS)
    assert keep[0] == 0 and keep[-1] == rows - 1 and len(set(keep)) == CALIBRATION_CHECK_ROWS
    assert np.all(np.diff(keep) >= 1) and np.ptp(np.diff(keep)) <= 1     # evenly spaced
    (want,) = _float(model, {"x": x[keep]})
    (check,) = compare({"y": want}, {"y": compiled.run(x[keep])["y"]}, ["y"],
                       class_axes(model))
    assert v.outputs[0].to_json() == check.to_json()
    assert compiled.report.to_json()["validation"]["of_rows"] == rows
    whole = tpu_compile(path, batch=40, calibration=x, validate=x)
    assert (whole.report.validation.rows, whole.report.validation.of_rows) == (rows, rows)
    assert spread_rows(5, CALIBRATION_CHECK_ROWS).tolist() == [0, 1, 2, 3, 4]


def test_compare_handles_labels_identical_outputs_and_regressions():
    labels = {"l": np.array([1, 2, 3, 4]), "r": np.ones((4, 1), np.float32)}
    (lab, reg) = compare(labels, {"l": np.array([1, 2, 0, 4]), "r": np.ones((4, 1))},
                         ["l", "r"])
    assert lab.kind == "exact" and lab.agreement == 0.75
    assert reg.kind == "snr" and reg.to_json()["identical"] and "identical" in reg.text()


def test_cli_flags_and_a_warning_on_stderr_below_the_bar(tmp_path, capsys):
    path, _ = _cnn(tmp_path)
    np.save(tmp_path / "calib.npy",
            np.random.default_rng(13).normal(0, 1, (16, 2, 6, 6)).astype(np.float32))
    code = compile_main([str(path), "-o", str(tmp_path / "out"), "--batch", "8",
                         "--calibrate", str(tmp_path / "calib.npy"), "--per-tensor",
                         "--calibration-method", "percentile", "--percentile", "99.9",
                         "--keep-float", "GlobalAveragePool", "-q"])
    captured = capsys.readouterr()
    assert code == 0 and "warning" not in captured.err, captured.err
    from tpuasm.compiler import load
    loaded = load(tmp_path / "out")
    assert loaded.report.validation.outputs[0].agreement >= 0.9
    assert "99.9th percentile" in loaded.report.source and "per tensor" in loaded.report.source
    assert _row(loaded.report, "gap").where == "host"
    assert _row(loaded.report, "gap").note == "kept in float (--keep-float)"
    assert "Against the float model" in (tmp_path / "out" / "report.txt").read_text()
    code = compile_main([str(path), "-o", str(tmp_path / "out2"), "--batch", "8",
                         "--calibrate", str(tmp_path / "calib.npy"), "--percentile", "99"])
    assert code == 2
    assert "--percentile applies with --calibration-method percentile" in capsys.readouterr().err


def test_cli_warns_on_stderr_when_an_output_drifts_past_the_bar(tmp_path, capsys):
    path, _, x = _rank3(tmp_path)
    np.save(tmp_path / "calib.npy", x)
    args = [str(path), "--batch", "8", "--calibrate", str(tmp_path / "calib.npy"), "-q"]
    assert compile_main(args + ["-o", str(tmp_path / "a")]) == 0
    assert capsys.readouterr().err == ""
    assert compile_main(args + ["-o", str(tmp_path / "b"), "--min-snr", "300"]) == 0
    err = capsys.readouterr().err
    assert "warning: output 'y': SNR against the float model is" in err
    assert "below 300 dB (--min-snr)" in err


# --- the same QDQ model on the emulator and in onnxruntime ---------------------------------

@pytest.mark.parametrize("which", ["cnn-symmetric", "gru-state"])
def test_emulator_gives_onnxruntimes_answers_on_the_qdq_model(tmp_path, which):
    if which == "cnn-symmetric":
        path, _ = _cnn(tmp_path)
        feeds = {"x": np.random.default_rng(14).normal(0, 1, (24, 2, 6, 6)).astype(np.float32)}
        compiled = tpu_compile(path, batch=8, calibration=feeds["x"], per_channel=False,
                               symmetric_activations=True, validate=False)
    else:
        path, _, feeds = _rnn_classifier(tmp_path, "GRU", seed=15, state=True)
        feeds = {k: v[:32] for k, v in feeds.items()}
        compiled = tpu_compile(path, batch=16, calibration=feeds, validate=False)
    assert compiled.has_programs
    got = compiled.run(feeds, engine="emulator")["y"]
    (want,) = session(onnx.load(str(compiled.reference_model))).run(None, feeds)
    y_scale = next(numpy_helper.to_array(t) for t in onnx.load(
        str(compiled.reference_model)).graph.initializer if t.name == "y_scale")
    assert np.mean(got == want) >= 0.999
    assert np.abs(got - want).max() <= float(y_scale) * 1.0001


def test_calibration_chunks_shrink_with_the_activations_per_row():
    from tpuasm.compiler.front.quantize import (CALIBRATION_BYTES, MAX_CALIBRATION_ROWS,
                                          calibration_rows)

    def model_with(rows_shape):
        graph = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
            "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *rows_shape])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", *rows_shape])])
        return onnx.shape_inference.infer_shapes(helper.make_model(graph))

    assert calibration_rows(model_with((16,))) == MAX_CALIBRATION_ROWS
    big = model_with((1024, 512))                  # 2 MiB of float32 per row in 'h'
    assert calibration_rows(big) == CALIBRATION_BYTES // (4 * 1024 * 512)
    assert calibration_rows(model_with((4096, 4096))) == 1


# --- an AveragePool's output scale ---------------------------------------------------------

def _conv_pool(tmp_path, kernel, tail=None):
    """Conv -> Relu -> AveragePool (stride 2) [-> a 1x1 Conv | -> Flatten -> Gemm]."""
    rng = np.random.default_rng(21)
    side = (8 - kernel) // 2 + 1
    inits = [_init("cw", rng.normal(0, 0.4, (4, 2, 3, 3))), _init("cb", rng.normal(0, 0.1, 4)),
             _init("tw", rng.normal(0, 0.4, (5, 4, 1, 1))), _init("tb", rng.normal(0, 0.1, 5)),
             _init("fw", rng.normal(0, 0.3, (4 * side * side, 3))),
             _init("fb", rng.normal(0, 0.1, 3))]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("AveragePool", ["r"], ["p"], name="pool", kernel_shape=[kernel] * 2,
                              strides=[2, 2])]
    if tail == "conv":
        nodes.append(helper.make_node("Conv", ["p", "tw", "tb"], ["y"], name="tail"))
        out = [_f("y", ["N", 5, side, side])]
    elif tail == "flatten-gemm":
        nodes += [helper.make_node("Flatten", ["p"], ["f"], name="flat"),
                  helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="tail")]
        out = [_f("y", ["N", 3])]
    else:
        nodes.append(helper.make_node("Identity", ["p"], ["y"], name="out"))
        out = [_f("y", ["N", 4, side, side])]
    return _save(tmp_path, nodes, [_f("x", ["N", 2, 8, 8])], out, inits, "pool")


def _pool_scales(qdq):
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    pool = next(n for n in qdq.graph.node if n.op_type == "AveragePool")
    dq = next(n for n in qdq.graph.node if pool.input[0] in n.output)
    q = next(n for n in qdq.graph.node if pool.output[0] in n.input)
    return float(inits[dq.input[1]]), float(inits[q.input[1]])


@pytest.mark.parametrize("symmetric, tail", [(False, None), (True, None), (False, "conv"),
                                             (False, "flatten-gemm")])
def test_a_2x2_average_pool_gets_its_own_scale_and_onnxruntimes_answers(tmp_path, symmetric,
                                                                        tail):
    # quantize_static gives AveragePool's output its input's scale: a quarter of the 2x2
    # windows' exact means then land on a half step, where onnxruntime's float32 average
    # and the TPU's exact sum (half to even) may round apart; with the output's own range
    # they do not.  The Flatten after it takes the new scale too, and the Conv or Gemm
    # reading it an int32 bias at that scale: no requantization on the way
    path, _ = _conv_pool(tmp_path, 2, tail)
    rng = np.random.default_rng(22)
    calib, x = (rng.normal(0, 1, (n, 2, 8, 8)).astype(np.float32) for n in (64, 256))
    compiled = tpu_compile(path, batch=16, calibration=calib, validate=False,
                           symmetric_activations=symmetric)
    for row in compiled.report.compiled_nodes:
        assert row.where == "TPU" or row.op_type in ("QuantizeLinear", "DequantizeLinear",
                                                     "Identity"), row
        assert "requantized" not in row.reason, row
    qdq = onnx.load(str(compiled.reference_model))
    got = compiled.run(x, engine="emulator")["y"]
    (want,) = session(qdq).run(None, {"x": x})
    assert np.array_equal(got, want), np.mean(got == want)
    x_scale, y_scale = _pool_scales(qdq)
    assert y_scale < x_scale                      # a mean's range: no coarser a step


def test_an_odd_average_pool_window_keeps_its_input_scale(tmp_path):
    # 3x3 windows, no padding: a mean of 9 values never lands on a half step
    path, _ = _conv_pool(tmp_path, 3)
    calib = np.random.default_rng(23).normal(0, 1, (64, 2, 8, 8)).astype(np.float32)
    compiled = tpu_compile(path, batch=16, calibration=calib, validate=False)
    x_scale, y_scale = _pool_scales(onnx.load(str(compiled.reference_model)))
    assert x_scale == y_scale

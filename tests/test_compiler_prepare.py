"""The float rewrites before quantization (tpuasm/compiler/front/prepare.py), each checked against
onnxruntime running the original float model."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_models import run_ort
from tpuasm.compiler.ort import session
from tpuasm.compiler.front.prepare import (fold_batch_norms, fuse_matmul_bias, prepare,
                                     unroll_recurrent)
from tpuasm.compiler.front.provenance import Provenance


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _run(model, feeds):
    return session(model).run(None, feeds)


def _copy(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


# --- BatchNormalization -----------------------------------------------------------------

def _bn_inits(rng, prefix, c):
    return [_init(f"{prefix}_g", rng.uniform(0.5, 2, c)), _init(f"{prefix}_b", rng.normal(0, 1, c)),
            _init(f"{prefix}_m", rng.normal(0, 1, c)), _init(f"{prefix}_v", rng.uniform(0.1, 3, c))]


def _bn(prefix, x, y):
    return helper.make_node("BatchNormalization", [x, f"{prefix}_g", f"{prefix}_b",
                                                   f"{prefix}_m", f"{prefix}_v"], [y],
                            name=prefix, epsilon=1e-3)


def test_batch_norm_folds_into_conv_gemm_and_matmul_keeping_the_answers():
    rng = np.random.default_rng(0)
    inits = [_init("cw", rng.normal(0, 0.3, (6, 3, 3, 3))), _init("cb", rng.normal(0, 1, 6)),
             _init("gw", rng.normal(0, 0.1, (5, 6 * 4 * 4))),
             _init("mw", rng.normal(0, 0.3, (5, 4))),
             *_bn_inits(rng, "bn1", 6), *_bn_inits(rng, "bn2", 5), *_bn_inits(rng, "bn3", 4)]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             _bn("bn1", "c", "c_bn"),
             helper.make_node("Relu", ["c_bn"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "gw"], ["g"], name="gemm", transB=1, alpha=0.5),
             _bn("bn2", "g", "g_bn"),
             helper.make_node("MatMul", ["g_bn", "mw"], ["m"], name="matmul"),
             _bn("bn3", "m", "y")]
    model = _model(nodes, [_f("x", [2, 3, 4, 4])], [_f("y", [2, 4])], inits)
    x = rng.normal(0, 1, (2, 3, 4, 4)).astype(np.float32)
    (want,) = _run(model, {"x": x})
    prov = Provenance.of(model)
    folded = _copy(model)
    assert fold_batch_norms(folded, prov) == 3
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Relu", "Flatten", "Gemm", "Gemm"]
    (got,) = _run(folded, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert prov.folded == {"bn1": "folded into Conv 'conv'", "bn2": "folded into Gemm 'gemm'",
                           "bn3": "folded into Gemm 'matmul'"}


def test_batch_norm_folds_into_a_gemm_with_a_broadcast_bias_and_beta():
    rng = np.random.default_rng(5)
    inits = [_init("w", rng.normal(0, 0.3, (6, 4))), _init("c", rng.normal(0, 1, (1, 4))),
             *_bn_inits(rng, "bn", 4)]
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["g"], name="gemm", beta=0.7),
             _bn("bn", "g", "y")]
    model = _model(nodes, [_f("x", [3, 6])], [_f("y", [3, 4])], inits)
    x = rng.normal(0, 1, (3, 6)).astype(np.float32)
    (want,) = _run(model, {"x": x})
    folded = _copy(model)
    assert fold_batch_norms(folded, Provenance.of(folded)) == 1
    (got,) = _run(folded, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_batch_norm_whose_producer_has_other_readers_stays():
    rng = np.random.default_rng(1)
    inits = [_init("cw", rng.normal(0, 0.3, (4, 2, 1, 1))), *_bn_inits(rng, "bn", 4)]
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv"), _bn("bn", "c", "b"),
             helper.make_node("Add", ["b", "c"], ["y"], name="add")]
    model = _model(nodes, [_f("x", [1, 2, 3, 3])], [_f("y", [1, 4, 3, 3])], inits)
    assert fold_batch_norms(model, Provenance.of(model)) == 0
    assert "BatchNormalization" in [n.op_type for n in model.graph.node]


# --- MatMul + Add -------------------------------------------------------------------------

def test_matmul_bias_add_becomes_gemm_on_rank_2_and_stays_on_rank_3():
    rng = np.random.default_rng(2)
    inits = [_init("w1", rng.normal(0, 0.3, (8, 6))), _init("b1", rng.normal(0, 1, 6)),
             _init("w2", rng.normal(0, 0.3, (6, 5))), _init("b2", rng.normal(0, 1, (1, 5))),
             _init("w3", rng.normal(0, 0.3, (4, 3))), _init("b3", rng.normal(0, 1, 3))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["a1"], name="add1"),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
             helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="mm2"),
             helper.make_node("Add", ["b2", "m2"], ["y"], name="add2"),
             helper.make_node("MatMul", ["s", "w3"], ["m3"], name="mm3"),
             helper.make_node("Add", ["m3", "b3"], ["z"], name="add3")]
    model = _model(nodes, [_f("x", [3, 8]), _f("s", [3, 7, 4])], [_f("y", [3, 5]),
                                                                  _f("z", [3, 7, 3])], inits)
    feeds = {"x": rng.normal(0, 1, (3, 8)).astype(np.float32),
             "s": rng.normal(0, 1, (3, 7, 4)).astype(np.float32)}
    want = _run(model, feeds)
    prov = Provenance.of(model)
    fused = _copy(model)
    assert fuse_matmul_bias(fused, prov) == 2
    assert [n.op_type for n in fused.graph.node] == ["Gemm", "Relu", "Gemm", "MatMul", "Add"]
    for got, ref in zip(_run(fused, feeds), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert prov.source("mm1") == "mm1" and prov.folded["add2"] == "folded into Gemm 'mm2'"


# --- LSTM / GRU / RNN -------------------------------------------------------------------

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# per step and direction: an input and a recurrent Gemm per gate (each gate a whole tensor);
# the first step of each direction without a state has no recurrent one
GEMMS = {kind: (2 * g, g) for kind, g in GATES.items()}


def _recurrent(kind, seq, batch, inp, hidden, direction, layout, state, seed, lbr=0,
               seq_lens=False, activations=None):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[kind]
    inits = [_init("W", rng.normal(0, 0.5, (dirs, g * hidden, inp))),
             _init("R", rng.normal(0, 0.5, (dirs, g * hidden, hidden))),
             _init("B", rng.normal(0, 0.5, (dirs, 2 * g * hidden)))]
    x_shape = [batch, seq, inp] if layout else [seq, batch, inp]
    s_shape = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    ins = ["X", "W", "R", "B", "", "", ""][:7 if kind == "LSTM" else 6]
    graph_inputs = [_f("X", x_shape)]
    if seq_lens:
        inits.append(numpy_helper.from_array(np.full(batch, seq, np.int32), "lens"))
        ins[4] = "lens"
    if state:
        ins[5] = "h0"
        graph_inputs.append(_f("h0", s_shape))
        if kind == "LSTM":
            ins[6] = "c0"
            graph_inputs.append(_f("c0", s_shape))
    while ins and ins[-1] == "":
        ins.pop()
    outs = ["Y", "Y_h", "Y_c"] if kind == "LSTM" else ["Y", "Y_h"]
    attrs = dict(hidden_size=hidden, direction=direction)
    if layout:
        attrs["layout"] = 1
    if kind == "GRU":
        attrs["linear_before_reset"] = lbr
    if activations:
        attrs["activations"] = activations
    node = helper.make_node(kind, ins, outs, name="rnn", **attrs)
    y_shape = [batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden]
    outputs = [_f("Y", y_shape), _f("Y_h", s_shape)] + ([_f("Y_c", s_shape)]
                                                         if kind == "LSTM" else [])
    model = _model([node], graph_inputs, outputs, inits)
    feeds = {"X": rng.normal(0, 1, x_shape).astype(np.float32)}
    if state:
        feeds["h0"] = rng.normal(0, 1, s_shape).astype(np.float32)
        if kind == "LSTM":
            feeds["c0"] = rng.normal(0, 1, s_shape).astype(np.float32)
    return model, feeds


def _reference(model, feeds, kind, seq, batch, inp, hidden, direction, layout, state, lbr,
               activations=None):
    """onnxruntime's answer; it has no batch-first (layout=1) kernel, so for those the same
    node with layout 0 runs on transposed inputs and its outputs are transposed back."""
    if not layout:
        return _run(model, feeds)
    twin, _ = _recurrent(kind, seq, batch, inp, hidden, direction, 0, state, seed=0, lbr=lbr,
                         activations=activations)
    del twin.graph.initializer[:]
    twin.graph.initializer.extend(model.graph.initializer)
    del twin.graph.node[0].input[:]
    twin.graph.node[0].input.extend(model.graph.node[0].input)
    swapped = {k: np.ascontiguousarray(v.transpose(1, 0, 2)) for k, v in feeds.items()}
    outs = _run(twin, swapped)
    return [outs[0].transpose(2, 0, 1, 3)] + [o.transpose(1, 0, 2) for o in outs[1:]]


CASES = [("LSTM", 5, 3, 4, 6, "forward", 0, False, 0),
         ("LSTM", 4, 2, 3, 5, "reverse", 1, True, 0),
         ("LSTM", 3, 2, 4, 3, "bidirectional", 0, True, 0),
         ("LSTM", 6, 1, 2, 4, "bidirectional", 1, False, 0),
         ("GRU", 5, 3, 4, 6, "forward", 0, True, 0),
         ("GRU", 4, 2, 3, 5, "reverse", 1, False, 0),
         ("GRU", 3, 2, 4, 3, "bidirectional", 0, False, 1),
         ("GRU", 4, 3, 5, 4, "bidirectional", 1, True, 1),
         # an RNN's one activation: the default, PyTorch's nonlinearity="relu" (written
         # per direction), and a sigmoid
         ("RNN", 5, 3, 4, 6, "forward", 0, True, 0),
         ("RNN", 4, 2, 3, 5, "bidirectional", 1, False, 0, ["Relu", "Relu"]),
         ("RNN", 3, 2, 4, 3, "reverse", 0, False, 0, ["Sigmoid"])]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_unrolled_recurrent_nodes_match_onnxruntime(case):
    kind, seq, batch, inp, hidden, direction, layout, state, lbr, *acts = case
    acts = acts[0] if acts else None
    model, feeds = _recurrent(kind, seq, batch, inp, hidden, direction, layout, state,
                              seed=seq * 7 + hidden, lbr=lbr, seq_lens=(seq % 2 == 0),
                              activations=acts)
    want = _reference(model, feeds, kind, seq, batch, inp, hidden, direction, layout, state,
                      lbr, acts)
    prov = Provenance.of(model)
    unrolled = _copy(model)
    reasons = {}
    assert unroll_recurrent(unrolled, prov, reasons) == 1, reasons
    ops = [n.op_type for n in unrolled.graph.node]
    assert kind not in ops
    dirs = 2 if direction == "bidirectional" else 1
    gemms_per_step, recurrent = GEMMS[kind]
    expected = dirs * (seq * gemms_per_step - (0 if state else recurrent))
    assert ops.count("Gemm") == expected
    # every step reads its direction's gate matrices, not a copy each: one per Gemm of a step
    weights = {n.input[1] for n in unrolled.graph.node if n.op_type == "Gemm"}
    assert len(weights) == dirs * (gemms_per_step if seq > 1 or state else
                                   gemms_per_step - recurrent)
    onnx.checker.check_model(unrolled)
    got = _run(unrolled, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)
    assert all(prov.source(n.name) == "rnn" for n in unrolled.graph.node)


@pytest.mark.parametrize("kind", list(GATES))
def test_a_constant_zero_initial_state_is_unrolled_as_no_state(kind):
    """PyTorch's exporter writes a call without h0 (and c0) as a constant of zeros: no
    recurrent product on the first step, as with no state at all (before, its constant
    R h0 ran on the host, and the report put a GRU's share of MACs on the TPU at 93 %)."""
    model, feeds = _recurrent(kind, 3, 2, 4, 5, "bidirectional", 0, False, seed=5)
    node = model.graph.node[0]
    zeros = np.zeros((2, 2, 5), np.float32)
    model.graph.initializer.append(numpy_helper.from_array(zeros, "zeros"))
    while len(node.input) < (7 if kind == "LSTM" else 6):
        node.input.append("")
    node.input[5] = "zeros"
    if kind == "LSTM":
        node.input[6] = "zeros"
    want = _run(model, feeds)
    unrolled = _copy(model)
    unroll_recurrent(unrolled, Provenance.of(unrolled))
    gemms_per_step, recurrent = GEMMS[kind]
    assert [n.op_type for n in unrolled.graph.node].count("Gemm") == \
        2 * (3 * gemms_per_step - recurrent)
    for g, w in zip(_run(unrolled, feeds), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)


def test_gemm_inputs_of_the_unrolled_lstm_are_batch_first():
    model, feeds = _recurrent("LSTM", 3, 2, 4, 5, "forward", 0, True, seed=3)
    unroll_recurrent(model, Provenance.of(model))
    shapes = {}
    inferred = onnx.shape_inference.infer_shapes(model)
    for v in inferred.graph.value_info:
        shapes[v.name] = [d.dim_value for d in v.type.tensor_type.shape.dim]
    shapes.update({v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
                   for v in model.graph.input})
    for n in model.graph.node:
        if n.op_type == "Gemm":
            assert shapes[n.input[0]][0] == 2 and len(shapes[n.input[0]]) == 2


def test_recurrent_nodes_that_cannot_be_unrolled_stay_with_a_reason():
    model, _ = _recurrent("LSTM", 3, 2, 4, 5, "forward", 0, False, seed=4)
    node = model.graph.node[0]
    node.attribute.append(helper.make_attribute("clip", 3.0))
    prepared = prepare(model)
    assert [n.op_type for n in prepared.model.graph.node] == ["LSTM"]
    assert prepared.reasons == {"rnn": "LSTM not unrolled: cell clipping (clip)"}
    model, _ = _recurrent("GRU", 3, 2, 4, 5, "forward", 0, False, seed=4)
    node = model.graph.node[0]
    node.attribute.append(helper.make_attribute("activations", ["Relu", "Tanh"]))
    reasons = {}
    unroll_recurrent(model, Provenance.of(model), reasons)
    assert "only the defaults" in reasons["rnn"]
    model, _ = _recurrent("RNN", 3, 2, 4, 5, "bidirectional", 0, False, seed=4,
                          activations=["Tanh", "Relu"])
    reasons = {}
    unroll_recurrent(model, Provenance.of(model), reasons)
    assert reasons["rnn"] == ("RNN not unrolled: activations ['tanh', 'relu'] (an RNN is "
                              "unrolled with one of tanh, relu, sigmoid in every direction)")


# --- scikit-learn's linear models (ai.onnx.ml) -------------------------------------------

def _zipmap_rows(value):
    return np.array([[row[k] for k in sorted(row)] for row in value])


@pytest.mark.parametrize("dataset, kind", [("digits", "logistic"), ("iris", "logistic"),
                                           ("digits", "linear")])
def test_linear_models_become_a_gemm_with_the_same_answers(dataset, kind):
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn import datasets
    from sklearn.linear_model import LogisticRegression, Ridge

    from tpuasm.compiler.front.prepare import prepare
    data = getattr(datasets, f"load_{dataset}")()
    x = data.data.astype(np.float32)
    # (Ridge: LinearRegression's lstsq fails in some scipy/LAPACK builds on digits)
    est = LogisticRegression(max_iter=300) if kind == "logistic" else Ridge(alpha=1.0)
    onx = skl2onnx.to_onnx(est.fit(x, data.target), x[:1])
    want = run_ort(onx, {"X": x})
    original = onx.graph.node[0].name
    prepared = prepare(onx)                          # (in place)
    assert not any(n.domain == "ai.onnx.ml" and n.op_type.startswith("Linear")
                   for n in prepared.model.graph.node)
    gemm = next(n for n in prepared.model.graph.node if n.op_type == "Gemm")
    assert prepared.provenance.source(gemm.name) == original
    got = run_ort(prepared.model, {"X": x})
    for a, b in zip(want, got):
        if isinstance(a, list):                      # ZipMap's {class: probability} rows
            np.testing.assert_allclose(_zipmap_rows(b), _zipmap_rows(a), atol=1e-6)
        elif a.dtype.kind in "iu":
            np.testing.assert_array_equal(b, a)
        else:
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_a_one_row_binary_linear_classifier_stays_with_its_reason():
    from tpuasm.compiler.front.prepare import prepare
    node = helper.make_node("LinearClassifier", ["X"], ["label", "scores"], name="lin",
                            domain="ai.onnx.ml", classlabels_ints=[0, 1],
                            coefficients=[0.5, -1.0, 2.0], intercepts=[0.1])
    graph = helper.make_graph(
        [node], "binary", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    prepared = prepare(model)
    assert [n.op_type for n in prepared.model.graph.node] == ["LinearClassifier"]
    assert "binary classifier (one coefficient row)" in prepared.reasons["lin"]


# --- Div by a constant ------------------------------------------------------------------

def test_a_division_by_a_constant_becomes_a_product_on_vmul_and_others_stay(tmp_path):
    """x * relu6(x + 3) / 6 (a HardSwish written out) and a per-channel Div: Mul by the
    reciprocal, the answers kept; a Div by an activation, by a constant holding a zero, or
    of a constant stays a Div."""
    from tpuasm.compiler import compile as tpu_compile
    from tpuasm.compiler.front.prepare import divisions_as_products
    rng = np.random.default_rng(5)
    inits = [_init("w", rng.normal(0, 0.5, (8, 4, 3, 3))), _init("three", 3.0),
             _init("six", 6.0), _init("zero", 0.0), _init("per_c", rng.uniform(1, 4, (1, 8, 1, 1))),
             _init("with_zero", [1.0, 0.0]), _init("k", [[2.0]])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "three"], ["c3"], name="add3"),
             helper.make_node("Clip", ["c3", "zero", "six"], ["r6"], name="relu6"),
             helper.make_node("Mul", ["c", "r6"], ["p"], name="mul"),
             helper.make_node("Div", ["p", "six"], ["hs"], name="div6"),
             helper.make_node("Div", ["hs", "per_c"], ["y"], name="div_c"),
             helper.make_node("Div", ["y", "hs"], ["q"], name="div_act"),
             helper.make_node("Div", ["k", "x2"], ["kq"], name="div_of_const"),
             helper.make_node("Div", ["x2", "with_zero"], ["z"], name="div_zero")]
    model = _model(nodes, [_f("x", [4, 4, 6, 6]), _f("x2", [4, 2])],
                   [_f("y", [4, 8, 6, 6]), _f("q", [4, 8, 6, 6]), _f("kq", [4, 2]),
                    _f("z", [4, 2])], inits)
    x = rng.normal(0, 1, (4, 4, 6, 6)).astype(np.float32)
    x2 = rng.uniform(0.5, 2, (4, 2)).astype(np.float32)
    want = _run(model, {"x": x, "x2": x2})
    rewritten = _copy(model)
    assert divisions_as_products(rewritten, Provenance.of(rewritten)) == 2
    ops = {n.name: n.op_type for n in rewritten.graph.node}
    assert (ops["div6"], ops["div_c"]) == ("Mul", "Mul")
    assert (ops["div_act"], ops["div_of_const"], ops["div_zero"]) == ("Div",) * 3
    for got, ref in zip(_run(rewritten, {"x": x, "x2": x2}), want):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    # compiled: the two products run on VMUL, the compiled model equals its QDQ model
    single = _model(nodes[:6], [_f("x", [4, 4, 6, 6])], [_f("y", [4, 8, 6, 6])], inits[:5])
    path = tmp_path / "hardswish.onnx"
    onnx.save(single, str(path))
    compiled = tpu_compile(path, batch=4, calibration=x, validate=False)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["div6"].where == "TPU" and rows["div_c"].where == "TPU", (
        rows["div6"].reason, rows["div_c"].reason)
    got = compiled.run(x)["y"]
    (ref,) = _run(onnx.load(str(compiled.reference_model)), {"x": x})
    np.testing.assert_array_equal(got, ref)


# --- a spatial mean before a matrix node ------------------------------------------------

def _mean_head(rng, opset, keepdims, reader):
    """Conv -> Relu -> ReduceMean over (2, 3) -> a Gemm (keepdims 0) or a 1x1 Conv (an
    SE squeeze, keepdims 1); beside it a LayerNorm-like x - mean(x) that must stay."""
    inits = [_init("w", rng.normal(0, 0.5, (6, 3, 3, 3))), _init("b", rng.normal(0, 0.1, 6)),
             _init("fw", rng.normal(0, 0.5, (6, 4))), _init("fb", rng.normal(0, 0.1, 4)),
             _init("sw", rng.normal(0, 0.5, (4, 6, 1, 1)))]
    axes = {}
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([2, -1], np.int64), "axes"))
        mean_inputs = ["r", "axes"]
    else:
        axes = {"axes": [2, -1]}
        mean_inputs = ["r"]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ReduceMean", mean_inputs, ["m"], name="mean",
                              keepdims=keepdims, **axes),
             helper.make_node("ReduceMean", mean_inputs, ["mu"], name="stat", keepdims=1,
                              **axes),
             helper.make_node("Sub", ["r", "mu"], ["d"], name="centre")]
    if reader == "gemm":
        nodes.append(helper.make_node("Gemm", ["m", "fw", "fb"], ["y"], name="fc"))
        out = _f("y", [None, 4])
    else:
        nodes.append(helper.make_node("Conv", ["m", "sw"], ["y"], name="squeeze"))
        out = _f("y", [None, 4, 1, 1])
    return _model(nodes, [_f("x", ["N", 3, 8, 8])], [out, _f("d", [None, 6, 8, 8])], inits,
                  opset)


@pytest.mark.parametrize("opset, keepdims, reader", [(13, 0, "gemm"), (18, 0, "gemm"),
                                                     (18, 1, "conv")])
def test_a_spatial_mean_before_a_classifier_becomes_a_global_average_pool(opset, keepdims,
                                                                          reader):
    from tpuasm.compiler.front.prepare import means_as_global_pools
    rng = np.random.default_rng(6)
    model = _mean_head(rng, opset, keepdims, reader)
    x = rng.normal(0, 1, (3, 3, 8, 8)).astype(np.float32)
    want = _run(model, {"x": x})
    rewritten = _copy(model)
    prov = Provenance.of(rewritten)
    assert means_as_global_pools(rewritten, prov) == 1
    onnx.checker.check_model(rewritten)
    ops = {n.name: n.op_type for n in rewritten.graph.node}
    assert ops["mean"] == "GlobalAveragePool" and ops["stat"] == "ReduceMean"
    assert list(ops.values()).count("Flatten") == (1 - keepdims)
    for got, ref in zip(_run(rewritten, {"x": x}), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_a_pooled_head_written_as_a_mean_runs_in_one_segment(tmp_path):
    # x.mean((2, 3)) -> Linear, as PyTorch writes a CNN's head: the mean ran on the host
    # between the Conv's segment and the classifier's
    from tpuasm.compiler import compile as tpu_compile
    rng = np.random.default_rng(7)
    model = _mean_head(rng, 18, 0, "gemm")
    del model.graph.output[1]
    keep = {"conv", "relu", "mean", "fc"}
    nodes = [n for n in model.graph.node if n.name in keep]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = tmp_path / "head.onnx"
    onnx.save(model, str(path))
    x = rng.normal(0, 1, (64, 3, 8, 8)).astype(np.float32)
    compiled = tpu_compile(path, batch=16, calibration=x[:48], validate=False)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["mean"].where == "TPU", rows["mean"].reason
    assert len(compiled.report.segments) == 1
    got = compiled.run(x[48:])["y"]
    (ref,) = _run(onnx.load(str(compiled.reference_model)), {"x": x[48:]})
    np.testing.assert_array_equal(got, ref)

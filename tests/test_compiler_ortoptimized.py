"""Models as an onnxruntime session saves them optimized (optimized_model_filepath, as
optimizing pipelines ship them).  QDQ models at the extended level: the QDQ groups fused
into QLinearConv, QLinearMatMul, QGemm, QLinearSoftmax (com.microsoft) between byte
tensors; at the all level (the session's default) channels-last QLinearConv between
Transposes.  Float models at the extended level: FusedConv, FusedGemm, FusedMatMul,
BiasGelu (front/ortfusions.py).  Compiled as shipped, against onnxruntime on that same
model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import real_models
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.ort import session


def _saved_optimized(tmp_path, model: onnx.ModelProto, level: str = "EXTENDED",
                     name: str = "model") -> onnx.ModelProto:
    """`model` as an onnxruntime session at `level` saves it."""
    import onnxruntime as ort
    onnx.save(model, str(tmp_path / f"{name}.onnx"))
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, f"ORT_ENABLE_{level}")
    options.optimized_model_filepath = str(tmp_path / f"{name}.optimized.onnx")
    ort.InferenceSession(str(tmp_path / f"{name}.onnx"), options,
                         providers=["CPUExecutionProvider"])
    return onnx.load(str(tmp_path / f"{name}.optimized.onnx"))


def _optimized(tmp_path, m: real_models.RealModel, level: str = "EXTENDED") -> onnx.ModelProto:
    from onnxruntime.quantization import QuantFormat, quantize_static
    onnx.save(m.model, str(tmp_path / "float.onnx"))
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"),
                    real_models.calibration_reader(m.calibration),
                    quant_format=QuantFormat.QDQ, per_channel=True)
    return _saved_optimized(tmp_path, onnx.load(str(tmp_path / "qdq.onnx")), level, "qdq")


@pytest.mark.parametrize("name", ["transformer_encoder", "mobilenet_v2_block"])
def test_an_optimized_qdq_model_compiles_as_shipped(tmp_path, name):
    """The encoder's output projection reads the merged heads through a Transpose and a
    Reshape of bytes: before, "its input's rows are rearranged by a layout node" kept it
    on the host (88.0 % of the MACs on the TPU); now the host makes that layout and the
    TPU reads it, as for a QDQ model's MatMul (96.0 %: the rest are the attention
    products of two activations)."""
    m = real_models.BUILDERS[name]()
    model = _optimized(tmp_path, m)
    assert {n.op_type for n in model.graph.node} & {"QLinearMatMul", "QLinearConv"}
    _compiles_as_shipped(tmp_path, m, model, 0.95)


def _compiles_as_shipped(tmp_path, m: real_models.RealModel, model: onnx.ModelProto,
                         tpu_share: float) -> None:
    """`model` compiled as shipped: at least `tpu_share` of its MACs on the TPU, its
    outputs onnxruntime's on it (a near-tie's LSB at most)."""
    onnx.save(model, str(tmp_path / "shipped.onnx"))
    compiled = tpu_compile(str(tmp_path / "shipped.onnx"), batch=m.batch)
    assert compiled.report.tpu_macs >= tpu_share * compiled.report.macs
    got = compiled.run(m.evaluation)[m.output]
    want = session(model).run([m.output], m.evaluation)[0]
    step = real_models.output_steps(model).get(m.output) or float(np.ptp(want)) / 255
    assert np.mean(np.abs(got - want) < 1e-6) >= 0.995
    assert np.abs(got - want).max() <= 1.01 * step


@pytest.mark.parametrize("name", ["mobilenet_v2_block", "resnet_basic_block", "conv1d_audio"])
def test_a_qdq_model_saved_channels_last_compiles_as_shipped(tmp_path, name):
    """At the all level (a session's default) onnxruntime's NhwcTransformer writes
    com.microsoft QLinearConv with channels_last = 1 between Transposes: before, 26.8 %
    (MobileNetV2 block), 48.9 % (ResNet block) and 0.1 % (1-D audio net) of the MACs ran on
    the TPU; now each is its channels-first QLinearConv and the Transposes that undo each
    other are gone: all of them, with onnxruntime's answers on the shipped model."""
    m = real_models.BUILDERS[name]()
    model = _optimized(tmp_path, m, "ALL")
    assert any(n.op_type == "QLinearConv" and n.domain == "com.microsoft" and
               any(a.name == "channels_last" and a.i for a in n.attribute)
               for n in model.graph.node)
    _compiles_as_shipped(tmp_path, m, model, 0.99)


@pytest.mark.parametrize("name", ["mobilenet_v2_block", "resnet_basic_block", "conv1d_audio",
                                  "sklearn_mlp", "byte_classifier", "transformer_encoder"])
def test_a_float_model_saved_at_the_extended_level_compiles(tmp_path, name):
    """FusedConv (a Conv, its ReLU / ReLU6 and a residual Add), FusedGemm, FusedMatMul and
    BiasGelu read back as the nodes they compute: before, the MobileNetV2 and ResNet
    blocks had 26.8 % and 48.9 % of their MACs on the TPU, the audio net 0.1 %, and the
    skl2onnx MLP was refused (onnxruntime's quantizer failed on the Gemm's (1, N)
    intercept).  Now every constant-weight matrix node maps and the compiled model keeps
    the float model's answers."""
    m = real_models.BUILDERS[name]()
    model = _saved_optimized(tmp_path, m.model)
    fused = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert fused & {"FusedConv", "FusedGemm", "FusedMatMul", "BiasGelu"}
    onnx.save(model, str(tmp_path / "shipped.onnx"))
    compiled = tpu_compile(str(tmp_path / "shipped.onnx"), batch=m.batch,
                           calibration=m.calibration)
    rows = {r.node: r for r in compiled.report.rows}
    for node in model.graph.node:
        if node.op_type in ("FusedConv", "FusedGemm"):
            assert rows[node.name].where == "TPU", rows[node.name]
            assert rows[node.name].op_type == node.op_type      # the user's node, named
    floor = 0.95 if name == "transformer_encoder" else 0.99     # attention's products
    assert compiled.report.tpu_macs >= floor * compiled.report.macs
    got = compiled.run(m.evaluation)[m.output]
    want = session(m.model).run([m.output], m.evaluation)[0]
    if m.kind == "label":
        assert np.mean(got.reshape(-1) == want.reshape(-1)) >= 0.98
    else:
        assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.98


def _fused_model(node: onnx.NodeProto, inputs: dict[str, tuple], weights: dict) -> onnx.ModelProto:
    from onnx import helper, numpy_helper
    graph = helper.make_graph(
        [node], "fused",
        [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _read_back_agrees(model: onnx.ModelProto, feeds: dict) -> onnx.ModelProto:
    """The read-back model (standard ONNX only) computes what onnxruntime's contrib kernel
    computes on the fused one."""
    import copy
    from tpuasm.compiler.front.ortfusions import unfuse_float_operators
    from tpuasm.compiler.front.provenance import Provenance
    standard = copy.deepcopy(model)
    reasons: dict = {}
    assert unfuse_float_operators(standard, Provenance.of(standard), reasons) == 1, reasons
    assert all(n.domain in ("", "com.microsoft") and n.op_type not in
               ("FusedConv", "FusedGemm", "FusedMatMul", "BiasGelu", "Attention")
               for n in standard.graph.node)
    out = model.graph.output[0].name
    want = session(model).run([out], feeds)[0]
    got = session(standard).run([out], feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return standard


_CONV_FORMS = [("", []), ("Relu", []), ("Tanh", []), ("Sigmoid", []), ("LeakyRelu", [0.2]),
               ("HardSigmoid", [0.3, 0.4]), ("Clip", [0.0, 6.0]), ("HardSwish", [])]


@pytest.mark.parametrize("kind,params", _CONV_FORMS)
@pytest.mark.parametrize("residual", [False, True])
def test_fused_conv_reads_back_as_conv_add_and_activation(kind, params, residual):
    from onnx import helper
    rng = np.random.default_rng(0)
    attrs = {"activation": kind, "activation_params": params} if kind else {}
    if not params:
        attrs.pop("activation_params", None)
    inputs = ["x", "w", "b"] + (["z"] if residual else [])
    node = helper.make_node("FusedConv", inputs, ["y"], domain="com.microsoft", name="fc",
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], **attrs)
    shapes = {"x": (2, 3, 6, 6), **({"z": (2, 4, 6, 6)} if residual else {})}
    model = _fused_model(node, shapes, {"w": rng.normal(size=(4, 3, 3, 3)) * 2,
                                        "b": rng.normal(size=4)})
    feeds = {k: rng.normal(size=v).astype(np.float32) * 3 for k, v in shapes.items()}
    standard = _read_back_agrees(model, feeds)
    assert standard.graph.node[0].name == "fc"          # the report's row keeps the name


_GEMM_FORMS = [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.1}), ("Tanh", {}),
               ("Sigmoid", {}), ("Elu", {"activation_alpha": 0.7}),
               ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.45}),
               ("Selu", {"activation_alpha": 1.5, "activation_gamma": 1.1}),
               ("Softplus", {}), ("Softsign", {})]


@pytest.mark.parametrize("kind,params", _GEMM_FORMS)
def test_fused_gemm_reads_back_as_gemm_and_activation(kind, params):
    from onnx import helper
    rng = np.random.default_rng(1)
    node = helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain="com.microsoft",
                            name="fg", activation=kind, transB=1, alpha=0.5, beta=2.0, **params)
    model = _fused_model(node, {"a": (5, 8)}, {"w": rng.normal(size=(6, 8)),
                                               "c": rng.normal(size=(1, 6))})
    _read_back_agrees(model, {"a": rng.normal(size=(5, 8)).astype(np.float32) * 2})


@pytest.mark.parametrize("trans_a,trans_b,alpha,constant_b",
                         [(0, 1, 1.0, True), (1, 0, 0.125, True), (1, 1, 2.0, False),
                          (0, 0, 0.5, False)])
def test_fused_matmul_reads_back_as_transposes_matmul_and_scale(trans_a, trans_b, alpha,
                                                                 constant_b):
    from onnx import helper
    rng = np.random.default_rng(2)
    a_shape = (2, 3, 7, 5) if trans_a else (2, 3, 5, 7)
    b_shape = (4, 7) if trans_b else (7, 4)
    if not constant_b:
        b_shape = (2, 3, *b_shape)
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft",
                            name="fm", transA=trans_a, transB=trans_b, alpha=alpha)
    b = rng.normal(size=b_shape)
    model = _fused_model(node, {"a": a_shape, **({} if constant_b else {"b": b_shape})},
                         {"b": b} if constant_b else {})
    feeds = {"a": rng.normal(size=a_shape).astype(np.float32),
             **({} if constant_b else {"b": b.astype(np.float32)})}
    _read_back_agrees(model, feeds)


@pytest.mark.parametrize("op", ["BiasGelu", "FastGelu"])
def test_bias_gelu_reads_back_as_add_and_gelu(op):
    from onnx import helper
    rng = np.random.default_rng(3)
    node = helper.make_node(op, ["a", "bias"], ["y"], domain="com.microsoft", name="bg")
    model = _fused_model(node, {"a": (4, 16)}, {"bias": rng.normal(size=16)})
    _read_back_agrees(model, {"a": rng.normal(size=(4, 16)).astype(np.float32) * 3})


def test_a_form_not_known_keeps_its_node_and_says_why():
    from onnx import helper
    from tpuasm.compiler.front.ortfusions import unfuse_float_operators
    from tpuasm.compiler.front.provenance import Provenance
    node = helper.make_node("FusedGemm", ["a", "w"], ["y"], domain="com.microsoft",
                            name="fg", activation="ScaledTanh")
    model = _fused_model(node, {"a": (5, 8)}, {"w": np.ones((8, 6))})
    reasons: dict = {}
    assert unfuse_float_operators(model, Provenance.of(model), reasons) == 0
    assert model.graph.node[0].op_type == "FusedGemm"
    assert "ScaledTanh is not a standard operator" in reasons["fg"]


def test_inverse_transposes_are_dropped_and_a_graph_output_kept():
    from onnx import helper
    from tpuasm.compiler.front.ortfusions import drop_inverse_transposes
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 3, 1, 2]),
             helper.make_node("Relu", ["t2"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t3"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["t3"], ["y"], perm=[0, 3, 1, 2]),
             helper.make_node("Transpose", ["r"], ["t4"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["t4"], ["z"], perm=[0, 3, 1, 2])]   # not inverse
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, (1, 2, 3, 4))], [helper.make_tensor_value_info(
            n, onnx.TensorProto.FLOAT, None) for n in ("y", "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(4).normal(size=(1, 2, 3, 4)).astype(np.float32)
    want = session(model).run(None, {"x": x})
    assert drop_inverse_transposes(model) == 2
    assert [n.op_type for n in model.graph.node] == ["Relu", "Identity", "Transpose",
                                                     "Transpose"]
    assert model.graph.node[0].input[0] == "x"
    for g, w in zip(session(model).run(None, {"x": x}), want):
        np.testing.assert_array_equal(g, w)


def _conv_chain(channels: list[int], depthwise_last: bool, residual: bool) -> onnx.ModelProto:
    """Convs over (1, channels[0], 8, 8), each with a ReLU, the last depthwise where asked,
    a residual Add of the first Conv's output where asked: onnxruntime's all level blocks
    them (its ReorderInput pads channels not a multiple of the block)."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(5)
    nodes, weights, x = [], [], "x"
    for i, out in enumerate(channels[1:]):
        group = channels[i] if depthwise_last and i == len(channels) - 2 else 1
        out = channels[i] if group > 1 else out
        w = rng.normal(size=(out, channels[i] // group, 3, 3)).astype(np.float32) / 3
        b = rng.normal(size=out).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], group=group,
                                   kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    if residual:
        nodes.append(helper.make_node("Add", [x, "r0"], ["sum"]))
        x = "sum"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, (1, channels[0], 8, 8))], [helper.make_tensor_value_info(
            x, onnx.TensorProto.FLOAT, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("channels,depthwise,residual",
                         [([3, 20, 24], False, False), ([3, 16, 24, 24], True, False),
                          ([20, 20, 20], False, True), ([3, 32, 32], False, True)])
def test_a_blocked_nchwc_model_reads_back_as_the_float_model(tmp_path, channels, depthwise,
                                                              residual):
    """MLAS's NCHWc form (onnxruntime's all level, a session's default): the filters
    stored in blocks of the machine's channel block (OIHWBo over an NCHW input or a
    depthwise filter, OIHWBiBo over a blocked one), channels padded to the block.  Read
    back, the standard model computes the float model's values, with its channels (20 and
    24 were 32: the MACs counted and the TPU's work were a third more)."""
    import copy
    from tpuasm.compiler.front.nchwc import machine_block, unblock_nchwc
    from tpuasm.compiler.front.provenance import Provenance
    if machine_block() is None:
        pytest.skip("onnxruntime writes no NCHWc form on this machine")
    model = _conv_chain(channels, depthwise, residual)
    saved = _saved_optimized(tmp_path, model, "ALL")
    assert any(n.domain == "com.microsoft.nchwc" and n.op_type == "Conv"
               for n in saved.graph.node)
    standard = copy.deepcopy(saved)
    reasons: dict = {}
    assert unblock_nchwc(standard, Provenance.of(standard), reasons) > 0, reasons
    assert not any(n.domain == "com.microsoft.nchwc" for n in standard.graph.node)
    x = np.random.default_rng(6).normal(size=(1, channels[0], 8, 8)).astype(np.float32)
    out = model.graph.output[0].name
    want = session(model).run([out], {"x": x})[0]
    got = session(standard).run([out], {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the channels the blocks padded are gone: each filter is the float model's own shape
    inits = {t.name: tuple(t.dims) for t in standard.graph.initializer}
    own = [tuple(t.dims) for t in model.graph.initializer if t.name.startswith("w")]
    assert [inits[n.input[1]] for n in standard.graph.node if n.op_type == "Conv"] == own


@pytest.mark.parametrize("name", ["mobilenet_v2_block", "resnet_basic_block"])
def test_a_float_model_saved_at_the_all_level_compiles(tmp_path, name):
    """A session's default level saved the float blocks in the NCHWc layout: before, 0.1 %
    and 0.8 % of their MACs on the TPU (every blocked node on the host); now all of them,
    with the float model's answers."""
    from tpuasm.compiler.front.nchwc import machine_block
    if machine_block() is None:
        pytest.skip("onnxruntime writes no NCHWc form on this machine")
    m = real_models.BUILDERS[name]()
    model = _saved_optimized(tmp_path, m.model, "ALL")
    onnx.save(model, str(tmp_path / "shipped.onnx"))
    compiled = tpu_compile(str(tmp_path / "shipped.onnx"), batch=m.batch,
                           calibration=m.calibration)
    assert compiled.report.tpu_macs >= 0.99 * compiled.report.macs
    got = compiled.run(m.evaluation)[m.output]
    want = session(m.model).run([m.output], m.evaluation)[0]
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.98


def test_a_blocked_model_is_read_back_whole_or_not_at_all(tmp_path):
    """A blocked node that cannot be read back keeps every blocked node (a blocked Conv
    between read-back ones would read NCHW tensors as blocks), each with the reason."""
    import copy
    from onnx import helper
    from tpuasm.compiler.front.nchwc import machine_block, unblock_nchwc
    from tpuasm.compiler.front.provenance import Provenance
    if machine_block() is None:
        pytest.skip("onnxruntime writes no NCHWc form on this machine")
    saved = _saved_optimized(tmp_path, _conv_chain([3, 16, 16, 16], False, False), "ALL")
    blocked = [n for n in saved.graph.node if n.domain == "com.microsoft.nchwc"]
    conv = next(n for n in blocked[1:] if n.op_type == "Conv")
    for a in conv.attribute:
        if a.name == "activation":
            a.s = b"ScaledTanh"
            break
    else:
        conv.attribute.append(helper.make_attribute("activation", "ScaledTanh"))
    model = copy.deepcopy(saved)
    reasons: dict = {}
    assert unblock_nchwc(model, Provenance.of(model), reasons) == 0
    assert [n.op_type for n in model.graph.node] == [n.op_type for n in saved.graph.node]
    assert set(reasons) == {n.name for n in blocked}
    assert "ScaledTanh is not a standard operator" in reasons[conv.name]
    assert all("ScaledTanh" in why for why in reasons.values())


@pytest.mark.parametrize("op", ["FastGelu", "BiasGelu", "QuickGelu"])
def test_a_contrib_gelu_between_matmuls_is_a_lookup_on_the_tpu(tmp_path, op):
    """A GELU as onnxruntime's and Optimum's fusions write it (FastGelu and BiasGelu with
    their bias input, QuickGelu's x * sigmoid(1.702 x)) between two MatMuls: before, the
    FastGelu and QuickGelu ran on the host; now the bias goes into the MatMul and each is one
    lookup table on the TPU, with onnxruntime's answers on the compiled QDQ model."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(7)
    w1 = rng.normal(size=(16, 32)).astype(np.float32) / 4
    w2 = rng.normal(size=(32, 5)).astype(np.float32) / 4
    bias = rng.normal(size=32).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node(op, ["h"] + (["b"] if op != "QuickGelu" else []), ["g"],
                              domain="com.microsoft", name="act"),
             helper.make_node("MatMul", ["g", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(
        nodes, "gelu", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 5])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(bias, "b"),
         numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(tmp_path / "gelu.onnx"))
    x = rng.normal(size=(256, 16)).astype(np.float32)
    compiled = tpu_compile(str(tmp_path / "gelu.onnx"), batch=64, calibration={"x": x},
                           validate=False)   # 8 bits throughout, not the check's search
    assert {r.node: r.where for r in compiled.report.rows} == \
        {"mm1": "TPU", "act": "TPU", "mm2": "TPU"}
    got = compiled.run({"x": x})["y"]
    qdq = onnx.load(str(compiled.reference_model))
    want = session(qdq).run(["y"], {"x": x})[0]
    step = real_models.output_steps(qdq)["y"]
    assert np.abs(got - want).max() <= 1.01 * step            # the QDQ model's, to its LSB
    assert np.mean(np.abs(got - want) < 1e-6) >= 0.99
    floats = session(model).run(["y"], {"x": x})[0]
    assert np.abs(got - floats).max() <= 4 * step         # three 8-bit roundings from float


def test_padded_channels_stay_where_a_filter_weighs_them(tmp_path):
    """A padded channel some filter weighs (not padding, then) keeps the model padded: the
    stripping is exact or not done."""
    import copy
    from onnx import numpy_helper
    from tpuasm.compiler.front.nchwc import machine_block, unblock_nchwc
    from tpuasm.compiler.front.provenance import Provenance
    block = machine_block()
    if block is None:
        pytest.skip("onnxruntime writes no NCHWc form on this machine")
    saved = _saved_optimized(tmp_path, _conv_chain([3, 20, 24], False, False), "ALL")
    second = [n for n in saved.graph.node if n.op_type == "Conv"][1]
    init = next(t for t in saved.graph.initializer if t.name == second.input[1])
    w = numpy_helper.to_array(init).copy()
    o, i, kh, kw = w.shape
    blocks = w.reshape(o // block, i // block, kh, kw, block, block)   # OIHWBiBo
    blocks[0, 20 // block, 0, 0, 20 % block, 0] = 1.0                  # input channel 20
    init.CopyFrom(numpy_helper.from_array(blocks.reshape(w.shape), init.name))
    standard = copy.deepcopy(saved)
    assert unblock_nchwc(standard, Provenance.of(standard), {}) > 0
    inits = {t.name: tuple(t.dims) for t in standard.graph.initializer}
    shapes = [inits[n.input[1]] for n in standard.graph.node if n.op_type == "Conv"]
    assert [s[0] % block for s in shapes] == [0, 0]                     # still padded
    x = np.random.default_rng(8).normal(size=(1, 3, 8, 8)).astype(np.float32)
    out = saved.graph.output[0].name
    np.testing.assert_allclose(session(standard).run([out], {"x": x})[0],
                               session(saved).run([out], {"x": x})[0], rtol=1e-4, atol=1e-4)


def _pooled_cnn() -> tuple[onnx.ModelProto, dict]:
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(9)
    w1 = rng.normal(size=(16, 3, 3, 3)).astype(np.float32) / 3
    w2 = rng.normal(size=(8, 16, 3, 3)).astype(np.float32) / 6
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("AveragePool", ["r2"], ["p2"], kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p2"], ["y"])]
    graph = helper.make_graph(
        nodes, "pooled", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                        ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.normal(size=(64, 3, 16, 16)).astype(np.float32)}


def test_channels_last_pools_read_back_as_the_extended_level_s(tmp_path):
    """NhwcMaxPool and the channels-last QLinearAveragePool / QLinearGlobalAveragePool of
    the all level: on the TPU, and the compiled model's answers exactly those of the same
    model saved at the extended level (channels-first), to 1 step of onnxruntime's."""
    from onnxruntime.quantization import QuantFormat, quantize_static
    model, calibration = _pooled_cnn()
    onnx.save(model, str(tmp_path / "float.onnx"))
    quantize_static(str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx"),
                    real_models.calibration_reader(calibration), quant_format=QuantFormat.QDQ)
    qdq = onnx.load(str(tmp_path / "qdq.onnx"))
    x = {"x": np.random.default_rng(10).normal(size=(32, 3, 16, 16)).astype(np.float32)}
    answers = {}
    for level in ("EXTENDED", "ALL"):
        saved = _saved_optimized(tmp_path, qdq, level, f"qdq_{level}")
        ops = {(n.domain, n.op_type) for n in saved.graph.node}
        if level == "ALL":
            assert ("com.microsoft", "NhwcMaxPool") in ops
        onnx.save(saved, str(tmp_path / f"{level}.onnx"))
        compiled = tpu_compile(str(tmp_path / f"{level}.onnx"), batch=16)
        assert compiled.report.tpu_macs == compiled.report.macs
        assert all(r.where in ("TPU", "unused") for r in compiled.report.rows
                   if r.op_type not in ("QuantizeLinear", "DequantizeLinear"))
        answers[level] = compiled.run(x)["y"]
        want = session(saved).run(["y"], x)[0]
        step = real_models.output_steps(saved)["y"]
        assert np.abs(answers[level] - want).max() <= 1.01 * step
    np.testing.assert_array_equal(answers["ALL"], answers["EXTENDED"])


def test_a_blocked_model_of_another_machine_runs_on_the_host_and_says_why(tmp_path,
                                                                          monkeypatch):
    """Filters in blocks of another machine's channel block (a file saved elsewhere): the
    blocked nodes stay as they are, on the host, each with the reason in the report."""
    from tpuasm.compiler.front import nchwc
    if nchwc.machine_block() is None:
        pytest.skip("onnxruntime writes no NCHWc form on this machine")
    model = _conv_chain([3, 16, 16], False, False)
    saved = _saved_optimized(tmp_path, model, "ALL")
    onnx.save(saved, str(tmp_path / "saved.onnx"))
    monkeypatch.setattr(nchwc, "machine_block", lambda: 64)
    x = np.random.default_rng(11).normal(size=(32, 3, 8, 8)).astype(np.float32)
    compiled = tpu_compile(str(tmp_path / "saved.onnx"), batch=8, calibration={"x": x})
    blocked = {n.name for n in saved.graph.node if n.domain == "com.microsoft.nchwc"}
    rows = [r for r in compiled.report.rows if r.node in blocked]
    assert rows and all(r.where == "host" for r in rows)
    assert all("not blocks of this machine's 64 channels" in r.reason for r in rows), rows


@pytest.mark.parametrize("mask", [None, "end", "keys"])
@pytest.mark.parametrize("scale", [None, 0.2])
def test_attention_reads_back_as_its_products_and_softmax(mask, scale):
    """onnxruntime's transformer optimizer fuses a BERT layer's self-attention into
    com.microsoft Attention, its Q/K/V weights inside (a BERT of eager attention: both
    layers' projections on the host, and not counted in the report's MACs).  Read back:
    the same values as onnxruntime's kernel, with each mask form it reads."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(12)
    batch, steps, width, heads = 3, 5, 16, 4
    inputs = ["x", "w", "b"] + (["mask"] if mask else [])
    attrs = {"num_heads": heads, **({"scale": scale} if scale else {})}
    node = helper.make_node("Attention", inputs, ["y"], domain="com.microsoft", name="att",
                            **attrs)
    model = _fused_model(node, {"x": (batch, steps, width)},
                         {"w": rng.normal(size=(width, 3 * width)) / 3,
                          "b": rng.normal(size=3 * width) / 3})
    feeds = {"x": rng.normal(size=(batch, steps, width)).astype(np.float32)}
    if mask:
        shape = (batch,) if mask == "end" else (batch, steps)
        model.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.INT32,
                                                               shape))
        feeds["mask"] = (np.array([5, 3, 1], np.int32) if mask == "end" else
                         (rng.random((batch, steps)) > 0.3).astype(np.int32))
        if mask == "keys":
            feeds["mask"][:, 0] = 1             # a row with every key masked: not a case
    _read_back_agrees(model, feeds)


_PAST = 5           # the past state's steps in the GPT-2 forms below


@pytest.mark.parametrize("mask", [None, "end", "end-start", "keys", "query-keys"])
@pytest.mark.parametrize("past", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_a_gpt2_attention_reads_back_with_its_past_and_causal_mask(causal, past, mask):
    """onnxruntime's GPT-2 fusion: Attention with unidirectional = 1, a past state
    (2, B, N, P, head) and its present output; every mask form onnxruntime's kernel reads
    (end positions, end then start positions, 0/1 per key or per query and key over the
    past keys too).  The read-back's output and present are onnxruntime's."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(14)
    batch, steps, width, heads = 3, 4, 16, 4
    keys = steps + (_PAST if past else 0)
    inputs = ["x", "w", "b", "mask" if mask else "", "past" if past else ""]
    outputs = ["y", "present"] if past else ["y"]
    node = helper.make_node("Attention", inputs, outputs, domain="com.microsoft",
                            name="att", num_heads=heads, unidirectional=int(causal))
    model = _fused_model(node, {"x": (batch, steps, width)},
                         {"w": rng.normal(size=(width, 3 * width)) / 3,
                          "b": rng.normal(size=3 * width) / 3})
    feeds = {"x": rng.normal(size=(batch, steps, width)).astype(np.float32)}
    if past:
        shape = (2, batch, heads, _PAST, width // heads)
        model.graph.input.append(helper.make_tensor_value_info("past", TensorProto.FLOAT,
                                                               shape))
        model.graph.output.append(helper.make_tensor_value_info("present",
                                                                TensorProto.FLOAT, None))
        feeds["past"] = rng.normal(size=shape).astype(np.float32)
    if mask:
        # a start past a query's own position would hide its every key (onnxruntime's
        # row then differs: not a case), so starts of 0 under a causal mask with no past
        start = 0 if causal and not past else 1
        values = {"end": np.array([keys, keys - 2, 2]),
                  "end-start": np.array([keys, keys - 1, 3, 0, start, start]),
                  "keys": rng.random((batch, keys)) > 0.3,
                  "query-keys": rng.random((batch, steps, keys)) > 0.3}[mask]
        values = values.astype(np.int32)
        if values.ndim > 1:
            values[..., 0] = 1                  # a row with every key masked: not a case
        model.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.INT32,
                                                               values.shape))
        feeds["mask"] = values
    standard = _read_back_agrees(model, feeds)
    if past:
        want = session(model).run(["present"], feeds)[0]
        np.testing.assert_allclose(session(standard).run(["present"], feeds)[0], want,
                                   rtol=1e-6, atol=1e-6)


def test_an_attention_bias_is_added_to_the_scores():
    from onnx import helper
    rng = np.random.default_rng(15)
    node = helper.make_node("Attention", ["x", "w", "b", "", "", "bias"], ["y"],
                            domain="com.microsoft", name="att", num_heads=2)
    model = _fused_model(node, {"x": (2, 3, 8), "bias": (1, 2, 3, 3)},
                         {"w": rng.normal(size=(8, 24)) / 3, "b": np.zeros(24)})
    _read_back_agrees(model, {"x": rng.normal(size=(2, 3, 8)).astype(np.float32),
                              "bias": rng.normal(size=(1, 2, 3, 3)).astype(np.float32)})


@pytest.mark.parametrize("attrs,outputs,past,width,says", [
    ({"do_rotary": 1}, ["y", "present"], (2, 1, 2, 3, 4), 24, "rotary form"),
    ({"past_present_share_buffer": 1}, ["y", "present"], (2, 1, 2, 3, 4), 24, "shared"),
    ({}, ["y"], (2, 1, 2, 3, 4), 24, "a past state without its present"),
    ({}, ["y", "present"], (2, 1, 3, 4), 24, "is not (2, B, heads, P, head)"),
    ({"qkv_hidden_sizes": [8, 8, 16]}, ["y", "present"], (2, 1, 2, 3, 4), 32,
     "keys and values of different sizes [8, 16]")])
def test_an_attention_in_a_form_not_read_back_stays_and_says_why(attrs, outputs, past,
                                                                 width, says):
    from onnx import helper
    from tpuasm.compiler.front.ortfusions import unfuse_float_operators
    from tpuasm.compiler.front.provenance import Provenance
    node = helper.make_node("Attention", ["x", "w", "b", "", "past"], outputs,
                            domain="com.microsoft", name="att", num_heads=2, **attrs)
    model = _fused_model(node, {"x": (1, 4, 8), "past": past},
                         {"w": np.ones((8, width)), "b": np.zeros(width)})
    reasons: dict = {}
    assert unfuse_float_operators(model, Provenance.of(model), reasons) == 0
    assert says in reasons["att"]


def _gpt2_step(tmp_path, rows: int):
    """A two-layer GPT-2 decoding step as onnxruntime's gpt2 optimizer fused it (older
    transformers exports): the new token's embedding, per layer a LayerNormalization,
    Attention (unidirectional, past_i in, present_i out, a 0/1 mask over past and new
    keys), a residual Add, a FastGelu MLP; a tied head over the vocabulary (so that the
    untrained net's next token has the margins of a trained one's: mostly its input's).  Returns the
    model's path and data (rows of a past of `_PAST` steps)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(16)
    vocab, width, heads, layers = 50, 32, 4, 2
    small = 0.5 / np.sqrt(width)    # layers that refine the residual stream, as trained ones do
    nodes, inits = [], {}

    def weight(name, shape, spread=None):
        inits[name] = (rng.normal(size=shape) * (spread or 1 / np.sqrt(shape[0]))) \
            .astype(np.float32)
        return name

    nodes.append(helper.make_node("Gather", [weight("wte", (vocab, width), 1.0), "input_ids"],
                                  ["h0"], name="/transformer/wte/Gather"))
    h = "h0"
    for i in range(layers):
        scope = f"/transformer/h.{i}"
        for j, ln in enumerate(("ln_1", "ln_2")):
            inits[f"{ln}.{i}.g"] = np.ones(width, np.float32)
            inits[f"{ln}.{i}.b"] = np.zeros(width, np.float32)
        nodes += [
            helper.make_node("LayerNormalization", [h, f"ln_1.{i}.g", f"ln_1.{i}.b"],
                             [f"a{i}"], name=f"{scope}/ln_1", axis=-1),
            helper.make_node("Attention", [f"a{i}", weight(f"qkv.{i}", (width, 3 * width)),
                                           weight(f"qkv_b.{i}", (3 * width,), 0.1),
                                           "attention_mask", f"past_{i}"],
                             [f"att{i}", f"present_{i}"], domain="com.microsoft",
                             name=f"Attention_{i}", num_heads=heads, unidirectional=1),
            helper.make_node("MatMul", [f"att{i}", weight(f"proj.{i}", (width, width), small)],
                             [f"p{i}"], name=f"{scope}/attn/c_proj/MatMul"),
            helper.make_node("Add", [f"p{i}", h], [f"r{i}"], name=f"{scope}/Add"),
            helper.make_node("LayerNormalization", [f"r{i}", f"ln_2.{i}.g", f"ln_2.{i}.b"],
                             [f"m{i}"], name=f"{scope}/ln_2", axis=-1),
            helper.make_node("MatMul", [f"m{i}", weight(f"fc.{i}", (width, 4 * width))],
                             [f"f{i}"], name=f"{scope}/mlp/c_fc/MatMul"),
            helper.make_node("FastGelu", [f"f{i}", weight(f"fc_b.{i}", (4 * width,), 0.1)],
                             [f"g{i}"], domain="com.microsoft", name=f"FastGelu_{i}"),
            helper.make_node("MatMul", [f"g{i}", weight(f"out.{i}", (4 * width, width),
                                                         small / 2)],
                             [f"o{i}"], name=f"{scope}/mlp/c_proj/MatMul"),
            helper.make_node("Add", [f"o{i}", f"r{i}"], [f"h{i + 1}"], name=f"{scope}/Add_1")]
        h = f"h{i + 1}"
    inits["wte_t"] = inits["wte"].T.copy()
    nodes.append(helper.make_node("MatMul", [h, "wte_t"], ["logits"], name="/lm_head/MatMul"))
    head = width // heads
    past = [helper.make_tensor_value_info(f"past_{i}", TensorProto.FLOAT,
                                          [2, "batch", heads, "past", head])
            for i in range(layers)]
    graph = helper.make_graph(
        nodes, "gpt2_step",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 1]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT32,
                                       ["batch", "total"]), *past],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, vocab]),
         *(helper.make_tensor_value_info(f"present_{i}", TensorProto.FLOAT,
                                         [2, "batch", heads, "total", head])
           for i in range(layers))],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "gpt2_step.onnx"
    onnx.save(model, str(path))
    mask = np.ones((rows, _PAST + 1), np.int32)
    mask[::3, :2] = 0                                  # left-padded rows
    data = {"input_ids": rng.integers(0, vocab, (rows, 1)), "attention_mask": mask,
            **{f"past_{i}": rng.normal(size=(2, rows, heads, _PAST, head)).astype(np.float32)
               for i in range(layers)}}
    return path, data


def test_a_gpt2_decoding_step_puts_its_projections_on_the_tpu(tmp_path):
    """The fused GPT-2 step with its past states compiled end to end: every projection
    (the Attention rows, c_proj, c_fc, the head) on the TPU; the MACs are the network's
    own over the past and new keys; the next token as the float model's, the present
    states within the quantization's noise."""
    path, data = _gpt2_step(tmp_path, 192)
    calibration = {k: v[:, :64] if k.startswith("past") else v[:64] for k, v in data.items()}
    evaluation = {k: v[:, 64:] if k.startswith("past") else v[64:] for k, v in data.items()}
    compiled = tpu_compile(str(path), batch=16, calibration=calibration)
    rows = {r.node: r for r in compiled.report.rows}
    weighted = ["Attention_0", "Attention_1", "/lm_head/MatMul",
                *(f"/transformer/h.{i}/{p}/MatMul" for i in range(2)
                  for p in ("attn/c_proj", "mlp/c_fc", "mlp/c_proj"))]
    assert all(rows[n].where == "TPU" for n in weighted), \
        {n: (rows[n].where, rows[n].reason) for n in weighted}
    batch, width, heads, keys = 16, 32, 4, _PAST + 1
    assert rows["Attention_0"].macs == batch * width * 3 * width + batch * keys * 2 * width
    got = compiled.run(evaluation)
    model = onnx.load(str(path))
    want = dict(zip(["logits", "present_0", "present_1"],
                    session(model).run(["logits", "present_0", "present_1"], evaluation)))
    assert np.mean(got["logits"].argmax(-1) == want["logits"].argmax(-1)) >= 0.99
    for name in ("present_0", "present_1"):
        noise = np.mean((got[name] - want[name]) ** 2) / np.mean(want[name] ** 2)
        assert 10 * np.log10(1 / noise) > 30, name


def test_an_attention_s_projection_runs_on_the_tpu_and_its_macs_count(tmp_path):
    """A fused Attention between the input and a classifier head: its Q/K/V projection on
    the TPU; the report's MACs are the network's own, the products of two activations
    (Q K^T, then by V) among them, on the host."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(13)
    steps, width, heads, rows = 6, 16, 4, 8
    nodes = [helper.make_node("Attention", ["x", "w", "b"], ["a"], domain="com.microsoft",
                              name="att", num_heads=heads),
             helper.make_node("ReduceMean", ["a"], ["m"], axes=[1], keepdims=0, name="pool"),
             helper.make_node("Gemm", ["m", "head"], ["y"], name="fc")]
    graph = helper.make_graph(
        nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                           ["N", steps, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array((rng.normal(size=(width, 3 * width)) / 3).astype(np.float32),
                                 "w"),
         numpy_helper.from_array((rng.normal(size=3 * width) / 3).astype(np.float32), "b"),
         numpy_helper.from_array(rng.normal(size=(width, 3)).astype(np.float32), "head")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(tmp_path / "att.onnx"))
    x = rng.normal(size=(64, steps, width)).astype(np.float32)
    compiled = tpu_compile(str(tmp_path / "att.onnx"), batch=rows, calibration={"x": x})
    att = next(r for r in compiled.report.rows if r.node == "att")
    projection = rows * steps * width * 3 * width
    products = rows * steps * steps * 2 * width
    assert att.macs == projection + products
    assert compiled.report.macs == att.macs + rows * width * 3
    assert compiled.report.tpu_macs == projection + rows * width * 3
    got = compiled.run({"x": x})["y"]
    want = session(model).run(["y"], {"x": x})[0]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.97


_MALFORMED = {
    "a Clip without its bounds": (
        ("FusedConv", {"activation": "Clip", "kernel_shape": [3, 3]}, "com.microsoft"),
        {"x": ["N", 2, 6, 6]}, {"w": (3, 2, 3, 3)}, ["N", 3, 4, 4],
        "its Clip has 0 of its 2 parameters"),
    "heads that do not split the weights": (
        ("Attention", {"num_heads": 5}, "com.microsoft"), {"x": ["N", 4, 16]},
        {"w": (16, 48), "b": (48,)}, ["N", 4, 16], "do not split its weights into 5 heads"),
    "weights computed at run time": (
        ("Attention", {"num_heads": 4}, "com.microsoft"), {"x": ["N", 4, 16], "w": [16, 48]},
        {}, ["N", 4, 16], "its weights are not a constant"),
    "a transposed vector": (
        ("FusedMatMul", {"transB": 1}, "com.microsoft"), {"x": ["N", 8]}, {"w": (8,)}, ["N"],
        "is not known to be a matrix"),
    "a blocked filter of another machine's block": (
        ("Conv", {"kernel_shape": [3, 3]}, "com.microsoft.nchwc"), {"x": ["N", 3, 8, 8]},
        {"w": (5, 3, 3, 3)}, ["N", 5, 6, 6], "not blocks of this machine's"),
}


@pytest.mark.parametrize("case", list(_MALFORMED))
def test_a_fused_form_that_cannot_be_read_back_runs_on_the_host_and_says_why(tmp_path, case):
    """Bad or unusual fused nodes: the compile goes on, the node on the host with its
    reason in the report; no traceback."""
    from onnx import TensorProto, helper, numpy_helper
    from tpuasm.compiler.front.nchwc import machine_block
    (op, attrs, domain), inputs, weights, out_shape, says = _MALFORMED[case]
    if domain.endswith("nchwc") and machine_block() is None:
        pytest.skip("onnxruntime writes no NCHWc form on this machine")
    rng = np.random.default_rng(14)
    node = helper.make_node(op, [*inputs, *weights], ["y"], domain=domain, name="fused",
                            **attrs)
    graph = helper.make_graph(
        [node], "malformed",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(rng.normal(size=v).astype(np.float32), k)
         for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(domain, 1)])
    onnx.save(model, str(tmp_path / "fused.onnx"))
    data = {k: rng.normal(size=[16 if d == "N" else d for d in v]).astype(np.float32)
            for k, v in inputs.items()}
    compiled = tpu_compile(str(tmp_path / "fused.onnx"), batch=8, calibration=data,
                           validate=False)
    (row,) = [r for r in compiled.report.rows if r.node == "fused"]
    assert row.where == "host" and says in row.reason, row

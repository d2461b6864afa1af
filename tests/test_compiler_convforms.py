"""Dilated Convs and ConvTransposes rewritten as plain Convs (front/convforms.py): the same
function as the float model (onnxruntime is the oracle), every MAC on the TPU, and the
report's MACs the network's own, not the zeros the rewrite adds."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_models import quantized_by_onnxruntime
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.convforms import rewrite_convolutions
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.ort import session


def _model(op, x_shape, w, b=None, opset=13, **attrs):
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    inits = [numpy_helper.from_array(w, "w")] + (
        [numpy_helper.from_array(b, "b")] if b is not None else [])
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"], name="conv", **attrs)],
                              "g", [helper.make_tensor_value_info("x", T.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", T.FLOAT, [None] * len(x_shape))],
                              inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _run(model, x):
    return session(model).run(None, {"x": x})[0]


CASES = [
    ("Conv", (2, 3, 11), (4, 3, 3), dict(dilations=[2])),
    ("Conv", (2, 4, 9, 10), (6, 2, 3, 2), dict(dilations=[2, 3], group=2, pads=[1, 2, 0, 1])),
    ("Conv", (1, 3, 12, 12), (5, 3, 3, 3), dict(dilations=[2, 2], strides=[2, 1])),
    ("Conv", (2, 3, 5, 6, 7), (4, 3, 3, 2, 3), dict()),
    ("Conv", (1, 4, 9, 6, 5), (6, 2, 2, 3, 3), dict(group=2, strides=[2, 1, 2],
                                                    pads=[1, 1, 0, 2, 1, 1], dilations=[3, 1, 2])),
    ("Conv", (2, 4, 11, 9), (6, 4, 3, 3), dict(strides=[2, 1], pads=[1, 1, 1, 1])),
    ("Conv", (1, 4, 11, 9), (6, 2, 3, 2), dict(strides=[2, 4], pads=[1, 0, 0, 1], group=2)),
    ("Conv", (2, 3, 12, 10), (4, 3, 3, 3), dict(strides=[3, 2], dilations=[2, 1])),
    ("Conv", (1, 3, 11, 9), (4, 3, 3, 3), dict(strides=[1, 2], auto_pad="VALID")),
    ("ConvTranspose", (2, 3, 7), (3, 4, 3), dict(strides=[2])),
    ("ConvTranspose", (1, 4, 5, 6), (4, 3, 3, 3), dict(strides=[2, 3], pads=[1, 0, 1, 1],
                                                       output_padding=[1, 2])),
    ("ConvTranspose", (2, 4, 5, 5), (4, 1, 3, 3), dict(group=2, dilations=[2, 1])),
    ("ConvTranspose", (1, 2, 4, 4), (2, 3, 2, 2), dict(strides=[2, 2])),
    ("ConvTranspose", (1, 6, 4, 3), (6, 2, 3, 3), dict(group=3, strides=[1, 2], pads=[1, 1, 1, 1])),
]


@pytest.mark.parametrize("op,x_shape,w_shape,attrs", CASES)
@pytest.mark.parametrize("opset", [10, 13])
def test_the_rewrite_computes_what_the_node_did(op, x_shape, w_shape, attrs, opset):
    rng = np.random.default_rng(len(x_shape) * 7 + len(attrs))
    w = rng.normal(0, 1, w_shape).astype(np.float32)
    out_channels = w_shape[0] if op == "Conv" else w_shape[1] * attrs.get("group", 1)
    b = rng.normal(0, 1, out_channels).astype(np.float32)
    x = rng.normal(0, 1, x_shape).astype(np.float32)
    model = _model(op, list(x_shape), w, b, opset=opset, **attrs)
    want = _run(model, x)
    prov = Provenance.of(model)
    assert rewrite_convolutions(model, prov) == 1
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    ops = [n.op_type for n in model.graph.node]
    assert "ConvTranspose" not in ops
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    if op == "Conv" and len(x_shape) < 5:         # the kernel spread: no dilation left
        assert all(a.name != "dilations" or set(a.ints) <= {1} for a in conv.attribute)
    got = _run(model, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if len(x_shape) == 5:          # one 2-D Conv per output depth, no extra products
        assert ops.count("Conv") == want.shape[2]
        assert bool(prov.own_work) == ("dilations" in attrs)   # spread kernels only
        return
    num, den = prov.own_work["conv"]
    assert 0 < num < den           # the rewritten node does more products than its own


def test_forms_not_covered_stay_with_their_reason():
    rng = np.random.default_rng(1)
    w = rng.normal(0, 1, (2, 3, 3, 3)).astype(np.float32)
    model = _model("ConvTranspose", [1, 2, 4, 4], w, strides=[2, 2], output_shape=[9, 9])
    reasons = {}
    assert rewrite_convolutions(model, Provenance.of(model), reasons) == 0
    assert "output_shape" in reasons["conv"]
    model = _model("ConvTranspose", [1, 2, 4, 4, 4],
                   rng.normal(0, 1, (2, 3, 2, 2, 2)).astype(np.float32))
    assert rewrite_convolutions(model, Provenance.of(model), reasons) == 0
    assert "3-D" in reasons["conv"]
    # a dilated Conv whose weight is a graph input (not a constant): left as it is
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", dilations=[2, 2])], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 6, 6]),
         helper.make_tensor_value_info("w", T.FLOAT, [3, 2, 2, 2])],
        [helper.make_tensor_value_info("y", T.FLOAT, [1, 3, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert rewrite_convolutions(model, Provenance.of(model), reasons) == 0
    assert "not a constant" in reasons["conv"]
    # strides that differ by axis with SAME padding: its pads depend on the strides
    model = _model("Conv", [1, 3, 8, 8], w, strides=[2, 1], auto_pad="SAME_UPPER")
    assert rewrite_convolutions(model, Provenance.of(model), reasons) == 0
    assert "auto_pad SAME" in reasons["conv"]


@pytest.mark.parametrize("op,x_shape,w_shape,attrs,own", [
    ("Conv", (8, 3, 10, 10), (4, 3, 3, 3), dict(dilations=[2, 2]), 8 * 4 * 6 * 6 * 27),
    ("ConvTranspose", (8, 4, 5, 5), (4, 3, 3, 3), dict(strides=[2, 2]), 8 * 4 * 25 * 27),
    # strides that differ by axis (OCR models): the Conv at stride 1, every other row kept
    ("Conv", (8, 3, 10, 10), (4, 3, 3, 3), dict(strides=[2, 1], pads=[1, 1, 1, 1]),
     8 * 4 * 5 * 10 * 27),
])
def test_compiled_on_the_tpu_with_the_network_s_own_macs(tmp_path, op, x_shape, w_shape,
                                                           attrs, own):
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.3, w_shape).astype(np.float32)
    out_channels = w_shape[0] if op == "Conv" else w_shape[1]
    model = _model(op, ["N", *x_shape[1:]], w,
                   rng.normal(0, 0.1, out_channels).astype(np.float32), **attrs)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    calib = rng.normal(0, 1, (32, *x_shape[1:])).astype(np.float32)
    compiled = tpu_compile(str(path), batch=x_shape[0], calibration=calib,
                           config={"array_size": 16})
    assert compiled.report.macs == compiled.report.tpu_macs == own
    x = calib[:8]
    got = compiled.run(x)["y"]
    want = _run(onnx.load(str(path)), x)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 0.05 * scale


def test_a_layer_the_unified_buffer_cannot_hold_is_banded_onto_the_tpu(tmp_path):
    """VGG's first layers at 224 x 224 need more Unified Buffer rows than the chip has: the
    layer is cut into bands of rows (front/banding.py; tests/test_compiler_banding.py), the
    whole model compiles onto the TPU, and the answers are kept."""
    rng = np.random.default_rng(4)
    w1 = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (6, 8, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["a"], name="big", pads=[1, 1, 1, 1],
                          strides=[4, 4]),
         helper.make_node("Relu", ["a"], ["r"], name="relu"),
         helper.make_node("Conv", ["r", "w2"], ["y"], name="small", pads=[1, 1, 1, 1])],
        "g", [helper.make_tensor_value_info("x", T.FLOAT, ["N", 4, 32, 32])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 6, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    calib = rng.normal(0, 1, (16, 4, 32, 32)).astype(np.float32)
    compiled = tpu_compile(str(path), batch=4, calibration=calib,
                           config={"array_size": 16, "ub_rows": 1024})
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["big"].where == "TPU" and rows["small"].where == "TPU"
    assert compiled.report.tpu_macs == compiled.report.macs
    want = _run(model, calib[:4])
    assert np.abs(compiled.run(calib[:4])["y"] - want).max() < 0.05 * np.abs(want).max()


# --- the same forms in a model onnxruntime quantized (compiled as it is) -------------------

def _output_step(model) -> float:
    """The scale of the DequantizeLinear that writes the model's output."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    return float(inits[dq.input[1]])


QUANTIZED_CASES = [
    ("Conv", (8, 3, 20), (4, 3, 3), dict(dilations=[2]), "QDQ"),
    ("Conv", (8, 4, 9, 10), (6, 2, 3, 2), dict(dilations=[2, 3], group=2, pads=[1, 2, 0, 1]),
     "QDQ"),
    ("Conv", (8, 3, 12, 12), (5, 3, 3, 3), dict(dilations=[2, 2], strides=[2, 2],
                                                pads=[2, 2, 2, 2]), "QDQ"),
    ("Conv", (8, 4, 16), (4, 4, 3), dict(dilations=[4], pads=[8, 0]), "QOperator"),
    ("ConvTranspose", (8, 3, 7), (3, 4, 3), dict(strides=[2]), "QDQ"),
    ("ConvTranspose", (8, 4, 5, 6), (4, 3, 3, 3), dict(strides=[2, 3], pads=[1, 0, 1, 1],
                                                       output_padding=[1, 2]), "QDQ"),
    # per tensor: onnxruntime's quantizer fails on a grouped ConvTranspose's per-channel
    # bias (its scales along the kernel's axis 1 are O / group, the bias's O)
    ("ConvTranspose", (8, 6, 4, 3), (6, 2, 3, 3), dict(group=3, strides=[1, 2],
                                                       pads=[1, 1, 1, 1]), "QDQ per tensor"),
    ("ConvTranspose", (8, 4, 4, 4), (4, 8, 2, 2), dict(strides=[2, 2]), "QDQ"),
]


@pytest.mark.parametrize("op,x_shape,w_shape,attrs,quant_format", QUANTIZED_CASES)
def test_a_quantized_model_s_dilated_and_transposed_convs_run_on_the_tpu(
        tmp_path, op, x_shape, w_shape, attrs, quant_format):
    """A dilated Conv (QDQ and QLinearConv) takes its integer kernel spread with zeros, a QDQ
    ConvTranspose becomes a Conv over its input upsampled with zeros and quantized again at
    its own scale: on the TPU with the model's own quantization, its outputs those of
    onnxruntime on the same model (before, both ran on the host: "dilation is not 1",
    "ConvTranspose has no TPU mapping")."""
    rng = np.random.default_rng(len(attrs) * 5 + len(x_shape))
    w = rng.normal(0, 0.3, w_shape).astype(np.float32)
    out_channels = w_shape[0] if op == "Conv" else w_shape[1] * attrs.get("group", 1)
    model = _model(op, ["N", *x_shape[1:]], w,
                   rng.normal(0, 0.1, out_channels).astype(np.float32), **attrs)
    calib = rng.normal(0, 1, (32, *x_shape[1:])).astype(np.float32)
    path = quantized_by_onnxruntime(tmp_path, model, calib, quant_format.split()[0],
                                    per_channel="per tensor" not in quant_format)
    compiled = tpu_compile(str(path), batch=x_shape[0], config={"array_size": 16})
    rows = {r.node: r for r in compiled.report.rows}
    conv = "conv_quant" if quant_format == "QOperator" else "conv"
    assert rows[conv].where == "TPU", rows[conv].note
    assert compiled.report.macs == compiled.report.tpu_macs
    quantized = onnx.load(str(path))
    x = rng.normal(0, 1, (16, *x_shape[1:])).astype(np.float32)
    got = np.concatenate([compiled.run(x[i:i + 8])["y"] for i in (0, 8)])
    want = _run(quantized, x)
    steps = np.abs(got - want) / _output_step(quantized)
    assert steps.max() <= 1 + 1e-3 and np.mean(steps < 1e-3) >= 0.999, \
        (steps.max(), np.mean(steps < 1e-3))


def test_a_qoperator_model_s_float_conv_transpose_stays_with_its_reason(tmp_path):
    """onnxruntime's QOperator form has no quantized ConvTranspose: one whose output is the
    model's, quantized by nothing, stays float, and the report says how to put it on the
    TPU."""
    rng = np.random.default_rng(2)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
               for name, shape in (("w1", (4, 4, 3, 3)), ("w2", (4, 8, 2, 2)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["h", "w2"], ["y"], name="up", strides=[2, 2])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                         ["N", 4, 4, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = quantized_by_onnxruntime(tmp_path, model, rng.normal(0, 1, (16, 4, 4, 4)).astype(
        np.float32), "QOperator", per_channel=True)
    compiled = tpu_compile(str(path), batch=8, config={"array_size": 16})
    row = next(r for r in compiled.report.rows if r.op_type == "ConvTranspose")
    assert row.where == "host"
    assert "its QDQ form, or the model with --calibrate" in row.note


def test_a_qoperator_model_s_float_conv_transpose_between_quantized_tensors_goes_on_the_tpu(
        tmp_path):
    """Between a quantized input and a QuantizeLinear (after its Relu) the float kernel is
    quantized here as quantize_static quantizes a Conv's (int8 per output channel, the bias
    int32): the U-Net's decoder on the TPU (74.6 % of its MACs before), its outputs within
    two steps of onnxruntime's float ConvTranspose between the same quantized tensors and
    as close to the float model's."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)
               for name, shape in (("w1", (4, 4, 3, 3)), ("w2", (4, 6, 2, 2)),
                                   ("b2", (6,)), ("w3", (3, 6, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["h", "w2", "b2"], ["u"], name="up",
                              strides=[2, 2]),
             helper.make_node("Relu", ["u"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w3"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                         ["N", 4, 4, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    calib = rng.normal(0, 1, (32, 4, 4, 4)).astype(np.float32)
    path = quantized_by_onnxruntime(tmp_path, model, calib, "QOperator", per_channel=True)
    quantized = onnx.load(str(path))
    assert any(n.op_type == "ConvTranspose" for n in quantized.graph.node)     # left float
    compiled = tpu_compile(str(path), batch=8, config={"array_size": 16})
    row = next(r for r in compiled.report.rows if r.op_type == "ConvTranspose")
    assert row.where == "TPU", row.note
    assert compiled.report.macs == compiled.report.tpu_macs
    x = rng.normal(0, 1, (16, 4, 4, 4)).astype(np.float32)
    got = np.concatenate([compiled.run(x[i:i + 8])["y"] for i in (0, 8)])
    want = _run(quantized, x)
    steps = np.abs(got - want) / _output_step(quantized)
    # the kernel's own rounding, which onnxruntime does not have, moves outputs a step or two
    assert steps.max() <= 2 + 1e-3 and np.mean(steps < 1e-3) >= 0.8, \
        (steps.max(), np.mean(steps < 1e-3))
    exact = _run(model, x)

    def snr(y):
        return 10 * np.log10(np.sum(exact ** 2) / np.sum((y - exact) ** 2))
    assert snr(got) >= snr(want) - 1.0, (snr(got), snr(want))

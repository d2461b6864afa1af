"""reference.py (the IR's numpy semantics) against onnxruntime's quantized kernels.

Each IR operator is built twice from the same random integers and quantization parameters:
as an IR operator evaluated by tpuasm.compiler.reference, and as a one-node ONNX model
(QOperator or QDQ form) run by onnxruntime.  Agreement is the issue's bar: at least 99.9 %
of output elements identical and none more than 1 LSB apart.  This is what makes the IR's
docstring semantics onnxruntime's semantics.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnx_models import agreement, assert_agrees, const, model, qparams_inputs, run_ort, \
    value_info
from tpuasm.compiler import reference
from tpuasm.compiler.ir import Activation, Conv, Dense, Lookup, Pool, QParams, Segment, Tensor

SEEDS = range(6)


def _dtype(q: QParams):
    return np.int8 if q.signed else np.uint8


def random_input_q(rng, signed: bool) -> QParams:
    zp = int(rng.integers(-30, 30)) if signed else int(rng.integers(90, 170))
    return QParams(float(rng.uniform(0.004, 0.05)), zp, signed)


def output_q_for(real: np.ndarray, rng, signed: bool) -> QParams:
    """Output quantization spanning (most of) the real values, as calibration would; a
    random fraction of them saturates."""
    lo, hi = float(min(real.min(), 0)), float(max(real.max(), 0))
    scale = (hi - lo) / 255 * float(rng.uniform(0.6, 1.1)) or 1.0
    zp = int(np.clip(np.rint(-lo / scale) + (-128 if signed else 0), -128 if signed else 0,
                     127 if signed else 255))
    return QParams(scale, zp, signed)


def random_ints(rng, shape, q: QParams) -> np.ndarray:
    return rng.integers(q.qmin, q.qmax + 1, size=shape).astype(_dtype(q))


def random_weights(rng, shape) -> np.ndarray:
    return rng.integers(-127, 128, size=shape).astype(np.int8)


def centred_real(x, q: QParams):
    return (x.astype(np.float64) - q.zero_point) * q.scale


# --- Dense ------------------------------------------------------------------------------

def make_dense(rng, batch, k, n, signed_x, signed_y, bias: bool, activation=Activation()):
    xq = random_input_q(rng, signed_x)
    x = random_ints(rng, (batch, k), xq)
    w = random_weights(rng, (k, n))
    w_scale = rng.uniform(0.002, 0.02, size=n).astype(np.float32)
    b = rng.integers(-5000, 5000, size=n).astype(np.int32) if bias else None
    real = centred_real(x, xq) @ (w * w_scale.astype(np.float64))
    if b is not None:
        real += b * xq.scale * w_scale
    yq = output_q_for(real, rng, signed_y)
    op = Dense("fc", Tensor("x", (k,), xq), Tensor("y", (n,), yq), w, w_scale, b,
               activation)
    return op, x


def qlinear_matmul_model(op: Dense, batch):
    xq, yq = op.input.quant, op.output.quant
    inits = [*qparams_inputs("x", xq.scale, xq.zero_point, xq.signed),
             const("w", op.weight), const("w_scale", op.weight_scale),
             const("w_zp", np.zeros(op.weight.shape[1], np.int8)),
             *qparams_inputs("y", yq.scale, yq.zero_point, yq.signed)]
    node = helper.make_node("QLinearMatMul", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp",
                                              "y_scale", "y_zp"], ["y"])
    return model([node], [value_info("x", _dtype(xq), (batch, op.weight.shape[0]))],
                 [value_info("y", _dtype(yq), (batch, op.weight.shape[1]))], inits)


def qdq_gemm_model(op: Dense, batch):
    """DQ(x), DQ(w per column), DQ(int32 bias) -> Gemm -> [Relu|Clip] -> Q: what
    quantize_static writes for a Gemm; onnxruntime fuses it into an integer kernel."""
    xq, yq = op.input.quant, op.output.quant
    k, n = op.weight.shape
    inits = [*qparams_inputs("x", xq.scale, xq.zero_point, xq.signed),
             const("w", op.weight.T), const("w_scale", op.weight_scale),
             const("w_zp", np.zeros(n, np.int8)),
             *qparams_inputs("y", yq.scale, yq.zero_point, yq.signed)]
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_scale", "x_zp"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zp"], ["wf"], axis=0)]
    gemm_inputs = ["xf", "wf"]
    if op.bias is not None:
        inits += [const("b", op.bias), const("b_scale", op.weight_scale * np.float32(xq.scale)),
                  const("b_zp", np.zeros(n, np.int32))]
        nodes.append(helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zp"], ["bf"],
                                      axis=0))
        gemm_inputs.append("bf")
    nodes.append(helper.make_node("Gemm", gemm_inputs, ["yf"], transB=1))
    last = "yf"
    if op.activation.kind == "relu":
        nodes.append(helper.make_node("Relu", ["yf"], ["yr"]))
        last = "yr"
    elif op.activation.kind == "clip":
        inits += [const("lo", np.float32(op.activation.lo)),
                  const("hi", np.float32(op.activation.hi))]
        nodes.append(helper.make_node("Clip", ["yf", "lo", "hi"], ["yr"]))
        last = "yr"
    nodes.append(helper.make_node("QuantizeLinear", [last, "y_scale", "y_zp"], ["y"]))
    return model(nodes, [value_info("x", _dtype(xq), (batch, k))],
                 [value_info("y", _dtype(yq), (batch, n))], inits)


@pytest.mark.parametrize("seed", SEEDS)
def test_dense_matches_qlinear_matmul(seed):
    rng = np.random.default_rng(seed)
    batch, k, n = (int(v) for v in rng.integers(1, 300, size=3))
    # onnxruntime's QLinear kernels take input and output of one integer type
    op, x = make_dense(rng, batch, k, n, bool(seed % 2), bool(seed % 2), bias=False)
    (theirs,) = run_ort(qlinear_matmul_model(op, batch), {"x": x})
    assert_agrees(reference.evaluate(op, x), theirs)


@pytest.mark.parametrize("activation", [Activation(), Activation("relu"),
                                        Activation("clip", 0.0, 6.0),
                                        Activation("clip", -1.5, 2.0)])
@pytest.mark.parametrize("seed", SEEDS[:3])
def test_dense_with_bias_matches_qdq_gemm(seed, activation):
    rng = np.random.default_rng(100 + seed)
    batch, k, n = (int(v) for v in rng.integers(1, 200, size=3))
    op, x = make_dense(rng, batch, k, n, bool(seed % 2), False, bias=True,
                       activation=activation)
    (theirs,) = run_ort(qdq_gemm_model(op, batch), {"x": x})
    assert_agrees(reference.evaluate(op, x), theirs)


# --- Conv -------------------------------------------------------------------------------

def make_conv(rng, batch, signed_x=False, signed_y=False, activation=Activation()):
    c, o = (int(v) for v in rng.integers(1, 12, size=2))
    kh, kw = (int(v) for v in rng.integers(1, 5, size=2))
    sh, sw = (int(v) for v in rng.integers(1, 3, size=2))
    pads = tuple(int(rng.integers(0, min(kh, kw))) for _ in range(4))
    h, w_ = (int(v) for v in rng.integers(max(kh, kw), 14, size=2))
    xq = random_input_q(rng, signed_x)
    x = random_ints(rng, (batch, c, h, w_), xq)
    w = random_weights(rng, (o, c, kh, kw))
    w_scale = rng.uniform(0.002, 0.02, size=o).astype(np.float32)
    b = rng.integers(-3000, 3000, size=o).astype(np.int32)
    probe = Conv("probe", Tensor("x", (c, h, w_), xq), Tensor("y", (), QParams(1.0, 0, True)),
                 w, np.ones(o, np.float32), b, (sh, sw), pads)
    acc = _conv_acc(probe, x)
    yq = output_q_for(acc * xq.scale * w_scale[None, :, None, None], rng, signed_y)
    op = Conv("conv", Tensor("x", (c, h, w_), xq), Tensor("y", acc.shape[1:], yq), w,
              w_scale, b, (sh, sw), pads, activation)
    return op, x


def _conv_acc(op: Conv, x):
    """The exact integer accumulators of a convolution, by direct summation (an oracle
    independent of reference.conv's tap loop)."""
    top, left, bottom, right = op.pads
    xp = np.pad(x.astype(np.int64) - op.input.quant.zero_point,
                ((0, 0), (0, 0), (top, bottom), (left, right)))
    o, c, kh, kw = op.weight.shape
    sh, sw = op.strides
    ho = (xp.shape[2] - kh) // sh + 1
    wo = (xp.shape[3] - kw) // sw + 1
    acc = np.zeros((len(x), o, ho, wo), np.int64)
    for r in range(ho):
        for s in range(wo):
            window = xp[:, :, r * sh:r * sh + kh, s * sw:s * sw + kw]
            acc[:, :, r, s] = np.einsum("bcij,ocij->bo", window, op.weight.astype(np.int64))
    return acc + op.bias[None, :, None, None]


def qlinear_conv_model(op: Conv, batch):
    xq, yq = op.input.quant, op.output.quant
    o = op.weight.shape[0]
    top, left, bottom, right = op.pads
    inits = [*qparams_inputs("x", xq.scale, xq.zero_point, xq.signed),
             const("w", op.weight), const("w_scale", op.weight_scale),
             const("w_zp", np.zeros(o, np.int8)),
             *qparams_inputs("y", yq.scale, yq.zero_point, yq.signed), const("b", op.bias)]
    node = helper.make_node(
        "QLinearConv", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "y_scale", "y_zp", "b"],
        ["y"], kernel_shape=list(op.weight.shape[2:]), strides=list(op.strides),
        pads=[top, left, bottom, right])
    return model([node], [value_info("x", _dtype(xq), (batch, *op.input.shape))],
                 [value_info("y", _dtype(yq), (batch, *op.output.shape))], inits)


def qdq_conv_model(op: Conv, batch):
    xq, yq = op.input.quant, op.output.quant
    o = op.weight.shape[0]
    top, left, bottom, right = op.pads
    inits = [*qparams_inputs("x", xq.scale, xq.zero_point, xq.signed),
             const("w", op.weight), const("w_scale", op.weight_scale),
             const("w_zp", np.zeros(o, np.int8)),
             const("b", op.bias), const("b_scale", op.weight_scale * np.float32(xq.scale)),
             const("b_zp", np.zeros(o, np.int32)),
             *qparams_inputs("y", yq.scale, yq.zero_point, yq.signed)]
    nodes = [helper.make_node("DequantizeLinear", ["x", "x_scale", "x_zp"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zp"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "b_scale", "b_zp"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["yf"],
                              kernel_shape=list(op.weight.shape[2:]), strides=list(op.strides),
                              pads=[top, left, bottom, right])]
    last = "yf"
    if op.activation.kind == "relu":
        nodes.append(helper.make_node("Relu", ["yf"], ["yr"]))
        last = "yr"
    nodes.append(helper.make_node("QuantizeLinear", [last, "y_scale", "y_zp"], ["y"]))
    return model(nodes, [value_info("x", _dtype(xq), (batch, *op.input.shape))],
                 [value_info("y", _dtype(yq), (batch, *op.output.shape))], inits)


@pytest.mark.parametrize("seed", SEEDS)
def test_conv_matches_qlinear_conv(seed):
    rng = np.random.default_rng(200 + seed)
    batch = int(rng.integers(1, 6))
    op, x = make_conv(rng, batch, signed_x=bool(seed % 2), signed_y=bool(seed % 2))
    (theirs,) = run_ort(qlinear_conv_model(op, batch), {"x": x})
    ours = reference.evaluate(op, x)
    assert_agrees(ours, theirs)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_conv_relu_matches_qdq_conv(seed):
    rng = np.random.default_rng(300 + seed)
    op, x = make_conv(rng, 3, activation=Activation("relu"), signed_x=bool(seed % 2))
    (theirs,) = run_ort(qdq_conv_model(op, 3), {"x": x})
    assert_agrees(reference.evaluate(op, x), theirs)


def test_conv_accumulators_are_exact():
    """Requantizing with scale 1 exposes the accumulators: they equal direct summation."""
    rng = np.random.default_rng(7)
    op, x = make_conv(rng, 2)
    acc = _conv_acc(op, x)
    wide = QParams(1.0, 0, True)
    small = Conv("c", op.input, Tensor("y", op.output.shape, wide), op.weight,
                 np.ones_like(op.weight_scale) / np.float32(op.input.quant.scale), op.bias,
                 op.strides, op.pads)
    np.testing.assert_array_equal(reference.evaluate(small, x), np.clip(acc, -128, 127))


# --- Pool -------------------------------------------------------------------------------

def make_pool(rng, batch, kind, signed, count_include_pad=False, global_=False):
    c = int(rng.integers(1, 10))
    h, w = (int(v) for v in rng.integers(3, 15, size=2))
    if global_:
        kernel, strides, pads = (h, w), (1, 1), (0, 0, 0, 0)
    else:
        kernel = tuple(int(v) for v in rng.integers(1, 4, size=2))
        strides = tuple(int(v) for v in rng.integers(1, 4, size=2))
        pads = tuple(int(rng.integers(0, min(kernel))) for _ in range(4))
    xq = random_input_q(rng, signed)
    x = random_ints(rng, (batch, c, h, w), xq)
    ho = (h + pads[0] + pads[2] - kernel[0]) // strides[0] + 1
    wo = (w + pads[1] + pads[3] - kernel[1]) // strides[1] + 1
    yq = xq if kind == "max" else QParams(xq.scale * float(rng.uniform(0.5, 1.5)),
                                          xq.zero_point + int(rng.integers(-5, 5)), signed)
    op = Pool("pool", Tensor("x", (c, h, w), xq), Tensor("y", (c, ho, wo), yq), kind, kernel,
              strides, pads, count_include_pad)
    return op, x


def pool_attrs(op: Pool):
    top, left, bottom, right = op.pads
    return dict(kernel_shape=list(op.kernel), strides=list(op.strides),
                pads=[top, left, bottom, right])


@pytest.mark.parametrize("seed", SEEDS)
def test_max_pool_matches_onnxruntime(seed):
    rng = np.random.default_rng(400 + seed)
    op, x = make_pool(rng, 3, "max", bool(seed % 2))
    q = op.input.quant
    m = model([helper.make_node("MaxPool", ["x"], ["y"], **pool_attrs(op))],
              [value_info("x", _dtype(q), x.shape)],
              [value_info("y", _dtype(q), (3, *op.output.shape))], [])
    (theirs,) = run_ort(m, {"x": x})
    np.testing.assert_array_equal(reference.evaluate(op, x), theirs)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_average_pool_matches_qlinear_average_pool(seed, count_include_pad):
    rng = np.random.default_rng(500 + seed)
    op, x = make_pool(rng, 3, "avg", bool(seed % 2), count_include_pad)
    xq, yq = op.input.quant, op.output.quant
    node = helper.make_node("QLinearAveragePool", ["x", "x_scale", "x_zp", "y_scale", "y_zp"],
                            ["y"], domain="com.microsoft",
                            count_include_pad=int(count_include_pad), **pool_attrs(op))
    m = model([node], [value_info("x", _dtype(xq), x.shape)],
              [value_info("y", _dtype(yq), (3, *op.output.shape))],
              [*qparams_inputs("x", xq.scale, xq.zero_point, xq.signed),
               *qparams_inputs("y", yq.scale, yq.zero_point, yq.signed)], ms_domain=True)
    (theirs,) = run_ort(m, {"x": x})
    assert_agrees(reference.evaluate(op, x), theirs)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_global_average_pool_matches_onnxruntime(seed):
    rng = np.random.default_rng(600 + seed)
    op, x = make_pool(rng, 4, "avg", bool(seed % 2), global_=True)
    xq, yq = op.input.quant, op.output.quant
    node = helper.make_node("QLinearGlobalAveragePool",
                            ["x", "x_scale", "x_zp", "y_scale", "y_zp"], ["y"],
                            domain="com.microsoft", channels_last=0)
    m = model([node], [value_info("x", _dtype(xq), x.shape)],
              [value_info("y", _dtype(yq), (4, op.input.shape[0], 1, 1))],
              [*qparams_inputs("x", xq.scale, xq.zero_point, xq.signed),
               *qparams_inputs("y", yq.scale, yq.zero_point, yq.signed)], ms_domain=True)
    (theirs,) = run_ort(m, {"x": x})
    assert_agrees(reference.evaluate(op, x), theirs)


# --- Lookup -----------------------------------------------------------------------------

@pytest.mark.parametrize("function", ["Sigmoid", "Tanh"])
@pytest.mark.parametrize("signed", [False, True])
def test_lookup_matches_qdq_activation(function, signed):
    """The table is onnxruntime's own answer for each of the 256 inputs (what the front
    end does); evaluating it on random data must agree with onnxruntime on that data."""
    rng = np.random.default_rng(len(function) + signed)
    xq = random_input_q(rng, signed)
    yq = QParams(1 / 256 if function == "Sigmoid" else 1 / 128,
                 (-128 if signed else 0) if function == "Sigmoid" else (0 if signed else 128),
                 signed)
    def qdq(shape):
        nodes = [helper.make_node("DequantizeLinear", ["x", "x_scale", "x_zp"], ["xf"]),
                 helper.make_node(function, ["xf"], ["yf"]),
                 helper.make_node("QuantizeLinear", ["yf", "y_scale", "y_zp"], ["y"])]
        return model(nodes, [value_info("x", _dtype(xq), shape)],
                     [value_info("y", _dtype(yq), shape)],
                     [*qparams_inputs("x", xq.scale, xq.zero_point, signed),
                      *qparams_inputs("y", yq.scale, yq.zero_point, signed)])
    every = np.arange(256).astype(np.uint8).view(_dtype(xq))
    (answers,) = run_ort(qdq((256,)), {"x": every})
    table = np.empty(256, _dtype(yq))
    table[every.astype(np.int64) % 256] = answers
    op = Lookup("act", Tensor("x", (5, 7), xq), Tensor("y", (5, 7), yq), table,
                function.lower())
    x = random_ints(rng, (9, 5, 7), xq)
    (theirs,) = run_ort(qdq(x.shape), {"x": x})
    np.testing.assert_array_equal(reference.evaluate(op, x), theirs)
    # and the table is the function: monotone and within one LSB of the exact value
    f = (lambda v: 1 / (1 + np.exp(-v))) if function == "Sigmoid" else np.tanh
    exact = np.clip(np.rint(f(centred_real(every, xq)) / yq.scale) + yq.zero_point,
                    yq.qmin, yq.qmax)
    assert np.abs(answers.astype(np.int64) - exact).max() <= 1


# --- Segments ---------------------------------------------------------------------------

def test_run_segment_chains_operators_and_returns_outputs():
    rng = np.random.default_rng(11)
    first, x = make_dense(rng, 20, 30, 17, False, False, bias=True,
                          activation=Activation("relu"))
    hidden = reference.evaluate(first, x)
    second, _ = make_dense(rng, 20, 17, 5, False, True, bias=True)
    second.input = first.output
    second.output = Tensor("z", second.output.shape, second.output.quant)
    seg = Segment("s0", [first, second], [first.input], [first.output, second.output])
    out = reference.run_segment(seg, {"x": x})
    assert set(out) == {"y", "z"}
    np.testing.assert_array_equal(out["y"], hidden)
    np.testing.assert_array_equal(out["z"], reference.evaluate(second, hidden))


def test_bad_input_shape_names_the_operator():
    rng = np.random.default_rng(12)
    op, x = make_dense(rng, 4, 8, 3, False, False, bias=False)
    with pytest.raises(ValueError, match="fc: input of shape"):
        reference.evaluate(op, x[:, :5])


def test_agreement_measure():
    assert agreement(np.array([1, 2, 3]), np.array([1, 3, 3])) == (2 / 3, 1)

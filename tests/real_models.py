"""A corpus of real architectures, written the way exporters write them (issue 20, item 5).

Each builder returns a `RealModel`: a FLOAT ONNX model (or, for the QOperator case, the
quantized model together with the float one it came from) and its data set: calibration and
evaluation inputs in the model's own layout (the arrays one would feed onnxruntime; a
sequence-first input keeps its batch on axis 1).

The models are "trained": the feature extractors have He-scaled random weights, every
BatchNormalization holds the running mean and variance of its input over the training rows,
and the classifier heads are fitted by ridge least squares on the features of a training
split (an extreme-learning-machine fit), so that their predictions mean something (the
accuracy against the data's own labels is printed by benchmarks/real_models.py) and top-1
agreement between the float and a quantized model is a real measure.

The graphs use exporter idioms: PyTorch's `/scope/Op` node names and `Op_output_0` tensors,
Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains for `x.view(x.size(0), -1)` and
head splits, MatMul + Add biases (TF/JAX Dense), Gemm(transB=1) (torch Linear), Clip with
initializer bounds (ReLU6), Pad whose pads are computed by Constant/Concat nodes, Gelu as
0.5 * x * (1 + Erf(x / sqrt 2)), LayerNorm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div.

Deterministic (fixed seeds); each builds in well under a second."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
TRAIN, CALIBRATE, EVALUATE = 600, 200, 300
BATCH = 100


@dataclass
class RealModel:
    name: str
    model: onnx.ModelProto            # what the user compiles (float, or QOperator)
    calibration: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    labels: np.ndarray                # the data's true classes for the evaluation rows
    output: str                       # the output compared with the float model
    kind: str = "logits"              # "logits" (top-1 = argmax of the last axis) | "label"
    batch: int = BATCH                # `tpuasm compile --batch`
    batch_axis: dict[str, int] = field(default_factory=dict)   # inputs not batch-first
    float_model: onnx.ModelProto | None = None   # the float model a quantized one came from

    @property
    def quantized(self) -> bool:
        return self.float_model is not None

    @property
    def reference(self) -> onnx.ModelProto:
        """The float model: what the compiled model's answers are compared with."""
        return self.float_model if self.float_model is not None else self.model

    def top1(self, outputs: np.ndarray) -> np.ndarray:
        out = np.asarray(outputs)
        return out.reshape(len(out), -1).astype(np.int64)[:, 0] if self.kind == "label" \
            else out.argmax(axis=-1)


# --- an exporter-style graph builder ------------------------------------------------------

class Net:
    """Nodes named like torch.onnx's (`/blocks.0/conv/Conv`, outputs `..._output_0`)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    def init(self, name: str, value, dtype=np.float32) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type: str, inputs, scope: str, outputs: int = 1, domain: str = "",
           **attrs):
        base = f"{scope}/{op_type}"
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        outs = [f"{name}_output_{k}" for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name,
                                           domain=domain or None, **attrs))
        return outs[0] if outputs == 1 else outs

    def constant(self, value, scope: str, dtype=np.int64) -> str:
        return self.op("Constant", [], scope,
                       value=numpy_helper.from_array(np.asarray(value, dtype), "value"))

    # layers -----------------------------------------------------------------------------
    def conv(self, x: str, scope: str, cin: int, cout: int, kernel, stride=1, pad=0,
             groups: int = 1, bias: bool = True, dims: int = 2) -> str:
        kernel = (kernel,) * dims
        fan_in = cin // groups * int(np.prod(kernel))
        w = self.rng.normal(0, np.sqrt(2 / fan_in), (cout, cin // groups, *kernel))
        inputs = [x, self.init(f"{scope}.weight", w)]
        if bias:
            inputs.append(self.init(f"{scope}.bias", self.rng.normal(0, 0.05, cout)))
        d = len(kernel)
        return self.op("Conv", inputs, f"/{scope}", kernel_shape=list(kernel),
                       strides=[stride] * d, pads=[pad] * (2 * d), group=groups,
                       dilations=[1] * d)

    def batchnorm(self, x: str, scope: str, stats: np.ndarray) -> str:
        """BatchNormalization holding `stats`' per-channel mean and variance (axis 1)."""
        c = stats.shape[1]
        axes = tuple(i for i in range(stats.ndim) if i != 1)
        gamma = self.rng.uniform(0.6, 1.4, c)
        beta = self.rng.normal(0.1, 0.2, c)
        return self.op("BatchNormalization",
                       [x, self.init(f"{scope}.weight", gamma), self.init(f"{scope}.bias", beta),
                        self.init(f"{scope}.running_mean", stats.mean(axis=axes)),
                        self.init(f"{scope}.running_var", stats.var(axis=axes) + 1e-3)],
                       f"/{scope}", epsilon=1e-5, momentum=0.9)

    def relu6(self, x: str, scope: str) -> str:
        lo = self.init(f"{scope}.min", np.float32(0))
        hi = self.init(f"{scope}.max", np.float32(6))
        return self.op("Clip", [x, lo, hi], f"/{scope}")

    def flatten_view(self, x: str, scope: str) -> str:
        """`x.view(x.size(0), -1)` as torch.onnx exports it."""
        shape = self.op("Shape", [x], f"/{scope}")
        n = self.op("Gather", [shape, self.constant(0, f"/{scope}")], f"/{scope}", axis=0)
        n = self.op("Unsqueeze", [n, self.constant([0], f"/{scope}")], f"/{scope}")
        target = self.op("Concat", [n, self.constant([-1], f"/{scope}")], f"/{scope}", axis=0)
        return self.op("Reshape", [x, target], f"/{scope}")

    def linear(self, x: str, scope: str, w: np.ndarray, b: np.ndarray, style="gemm") -> str:
        """torch Linear (Gemm transB=1) or a TF/JAX Dense (MatMul + Add)."""
        if style == "gemm":
            return self.op("Gemm", [x, self.init(f"{scope}.weight", w.T),
                                    self.init(f"{scope}.bias", b)], f"/{scope}",
                           alpha=1.0, beta=1.0, transB=1)
        y = self.op("MatMul", [x, self.init(f"{scope}.kernel", w)], f"/{scope}")
        return self.op("Add", [y, self.init(f"{scope}.bias_add", b)], f"/{scope}")

    def dense_random(self, x: str, scope: str, k: int, n: int, style="matmul") -> str:
        w = self.rng.normal(0, np.sqrt(1 / k), (k, n))
        return self.linear(x, scope, w, self.rng.normal(0, 0.05, n), style)

    def layernorm(self, x: str, scope: str, width: int) -> str:
        """LayerNorm over the last axis, decomposed as torch.onnx (opset < 17) writes it."""
        s = f"/{scope}"
        mean = self.op("ReduceMean", [x], s, axes=[-1], keepdims=1)
        centred = self.op("Sub", [x, mean], s)
        sq = self.op("Pow", [centred, self.constant(np.float32(2), s, np.float32)], s)
        var = self.op("ReduceMean", [sq], s, axes=[-1], keepdims=1)
        var = self.op("Add", [var, self.constant(np.float32(1e-5), s, np.float32)], s)
        y = self.op("Div", [centred, self.op("Sqrt", [var], s)], s)
        y = self.op("Mul", [y, self.init(f"{scope}.weight",
                                         self.rng.uniform(0.8, 1.2, width))], s)
        return self.op("Add", [y, self.init(f"{scope}.bias",
                                            self.rng.normal(0, 0.05, width))], s)

    def layernorm_flax(self, x: str, scope: str, width: int) -> str:
        """flax.linen.LayerNorm as jax2onnx writes it: var = max(0, E[x^2] - E[x]^2),
        (x - mean) * rsqrt(var + eps) * scale + bias."""
        s = f"/{scope}"
        mean = self.op("ReduceMean", [x], s, axes=[-1], keepdims=1)
        mean2 = self.op("ReduceMean", [self.op("Mul", [x, x], s)], s, axes=[-1], keepdims=1)
        var = self.op("Sub", [mean2, self.op("Mul", [mean, mean], s)], s)
        var = self.op("Max", [var, self.constant(np.float32(0), s, np.float32)], s)
        var = self.op("Add", [var, self.constant(np.float32(1e-6), s, np.float32)], s)
        inv = self.op("Reciprocal", [self.op("Sqrt", [var], s)], s)
        inv = self.op("Mul", [inv, self.init(f"{scope}.scale",
                                             self.rng.uniform(0.8, 1.2, width))], s)
        y = self.op("Mul", [self.op("Sub", [x, mean], s), inv], s)
        return self.op("Add", [y, self.init(f"{scope}.bias", self.rng.normal(0, 0.05, width))],
                       s)

    def gelu(self, x: str, scope: str) -> str:
        s = f"/{scope}"
        y = self.op("Div", [x, self.constant(np.float32(np.sqrt(2)), s, np.float32)], s)
        y = self.op("Erf", [y], s)
        y = self.op("Add", [y, self.constant(np.float32(1), s, np.float32)], s)
        y = self.op("Mul", [x, y], s)
        return self.op("Mul", [y, self.constant(np.float32(0.5), s, np.float32)], s)

    # models -----------------------------------------------------------------------------
    def model(self, inputs, outputs, name: str, check: bool = True) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="pytorch", producer_version="2.1.0")
        m.ir_version = 8
        if check:
            onnx.checker.check_model(m)
        return m

    def run(self, inputs, tensor: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The value of `tensor` for `feeds` (the graph so far, on onnxruntime)."""
        out = helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None)
        m = self.model(inputs, [out], "partial", check=False)
        return run(m, feeds)[0]


def run(m: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    # float32 arithmetic in MatMulNBits (the fused DequantizeLinear -> MatMul of an int16
    # model), not its default int8 re-quantization of the activations: the QDQ model's own
    # meaning
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    session = ort.InferenceSession(m.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def fit_head(features: np.ndarray, labels: np.ndarray, classes: int, ridge: float = 0.1):
    """Ridge least squares to one-hot targets: (K, classes) weights and a bias."""
    f = features.reshape(len(features), -1).astype(np.float64)
    mu, sd = f.mean(axis=0), f.std(axis=0)
    sd = sd + 0.1 * sd.mean() + 1e-6     # near-constant features get no outsized weights
    z = np.hstack([(f - mu) / sd, np.ones((len(f), 1))])
    target = np.eye(classes)[labels] * 4.0 - 2.0
    gram = z.T @ z + ridge * len(f) * np.eye(z.shape[1])
    coef = np.linalg.solve(gram, z.T @ target)
    w = coef[:-1] / sd[:, None]
    b = coef[-1] - mu @ w
    return w.astype(np.float32), b.astype(np.float32)


def _split(x, y, batch_axis=0):
    """train / calibrate / evaluate rows (along batch_axis)."""
    a, b, c = TRAIN, TRAIN + CALIBRATE, TRAIN + CALIBRATE + EVALUATE
    take = lambda lo, hi: np.take(x, np.arange(lo, hi), axis=batch_axis)  # noqa: E731
    return (take(0, a), y[:a]), (take(a, b), y[a:b]), (take(b, c), y[b:c])


def _input(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _output(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


# --- data sets -------------------------------------------------------------------------------

def textures(seed: int, rows: int, channels=3, size=12, classes=6):
    """Oriented gratings (3 orientations x 2 frequencies) in colour, with noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, rows)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    x = np.empty((rows, channels, size, size))
    for i, c in enumerate(y):
        angle = (c % 3) * np.pi / 3 + rng.normal(0, 0.1)
        freq = (0.5 if c < 3 else 1.1) * rng.uniform(0.9, 1.1)
        wave = np.sin(freq * (np.cos(angle) * xx + np.sin(angle) * yy) + rng.uniform(0, 6.3))
        tint = rng.uniform(0.5, 1.5, channels)
        x[i] = tint[:, None, None] * wave + rng.normal(0, 0.2, (channels, size, size))
    return x.astype(np.float32), y


def digits():
    """sklearn's bundled 8x8 digits, scaled to [-1, 1], shuffled deterministically."""
    from sklearn.datasets import load_digits
    d = load_digits()
    order = np.random.default_rng(7).permutation(len(d.target))
    x = (d.images[order] / 8.0 - 1.0).astype(np.float32)[:, None]
    return x, d.target[order]


def tones(seed: int, rows: int, length=256, classes=6):
    """1-D signals: a tone of one of `classes` frequencies, random phase, harmonics, noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, rows)
    t = np.arange(length)
    freqs = np.geomspace(0.04, 0.6, classes)
    x = np.empty((rows, 1, length))
    for i, c in enumerate(y):
        f = freqs[c] * rng.uniform(0.95, 1.05)
        x[i, 0] = (rng.uniform(0.5, 1.5) * np.sin(f * t + rng.uniform(0, 6.3))
                   + 0.3 * np.sin(2 * f * t) + rng.normal(0, 0.4, length))
    return x.astype(np.float32), y


def sequences(seed: int, rows: int, steps=10, features=8, classes=5):
    """(steps, rows, features), sequence first: a class centre plus a drift plus noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1, (classes, features))
    y = rng.integers(0, classes, rows)
    drift = np.linspace(-1, 1, steps)[:, None, None] * rng.normal(0, 0.3, (1, rows, features))
    x = centres[y][None] + drift + rng.normal(0, 0.6, (steps, rows, features))
    return x.astype(np.float32), y


# --- the models --------------------------------------------------------------------------------

def mobilenet_v2_block() -> RealModel:
    """Stem Conv-BN-ReLU6, one MobileNetV2 inverted residual (1x1 expand, 3x3 depthwise,
    1x1 project, residual Add), a 1x1 Conv-BN-ReLU6, GlobalAveragePool, flatten, Linear."""
    x_all, y_all = textures(1, TRAIN + CALIBRATE + EVALUATE)
    train, cal, ev = _split(x_all, y_all)
    net = Net(11)
    inputs = [_input("input", TensorProto.FLOAT, ["batch", 3, 12, 12])]
    feed = {"input": train[0]}

    def conv_bn(x, scope, cin, cout, k, stride=1, pad=0, groups=1):
        y = net.conv(x, f"{scope}.0", cin, cout, k, stride, pad, groups, bias=False)
        return net.batchnorm(y, f"{scope}.1", net.run(inputs, y, feed))

    h = net.relu6(conv_bn("input", "features.0", 3, 16, 3, 1, 1), "features.0.2")
    r = net.relu6(conv_bn(h, "features.1.conv.0", 16, 64, 1), "features.1.conv.0.2")
    r = net.relu6(conv_bn(r, "features.1.conv.1", 64, 64, 3, 1, 1, groups=64),
                  "features.1.conv.1.2")
    r = conv_bn(r, "features.1.conv.2", 64, 16, 1)
    h = net.op("Add", [h, r], "/features.1")
    h = net.relu6(conv_bn(h, "features.2", 16, 48, 1), "features.2.2")
    h = net.op("GlobalAveragePool", [h], "/pool")
    h = net.flatten_view(h, "flatten")
    w, b = fit_head(net.run(inputs, h, feed), train[1], 6)
    logits = net.linear(h, "classifier", w, b)
    net.nodes[-1].output[0] = "logits"
    m = net.model(inputs, [_output("logits", ["batch", 6])], "mobilenet_v2_block")
    return RealModel("mobilenet_v2_block", m, {"input": cal[0]}, {"input": ev[0]}, ev[1],
                     "logits")


def resnet_basic_block() -> RealModel:
    """Stem Conv-BN-Relu, a ResNet basic block (Conv-BN-Relu-Conv-BN + identity, Relu),
    MaxPool, Flatten, Linear; on sklearn's digits."""
    x_all, y_all = digits()
    train, cal, ev = _split(x_all, y_all)
    net = Net(12)
    inputs = [_input("input", TensorProto.FLOAT, ["batch", 1, 8, 8])]
    feed = {"input": train[0]}

    def conv_bn(x, scope, cin, cout):
        y = net.conv(x, f"{scope[0]}", cin, cout, 3, 1, 1, bias=False)
        return net.batchnorm(y, scope[1], net.run(inputs, y, feed))

    h = net.op("Relu", [conv_bn("input", ("conv1", "bn1"), 1, 16)], "/relu")
    r = net.op("Relu", [conv_bn(h, ("layer1.0.conv1", "layer1.0.bn1"), 16, 16)],
               "/layer1/layer1.0/relu")
    r = conv_bn(r, ("layer1.0.conv2", "layer1.0.bn2"), 16, 16)
    h = net.op("Relu", [net.op("Add", [r, h], "/layer1/layer1.0")], "/layer1/layer1.0/relu_1")
    h = net.op("MaxPool", [h], "/maxpool", kernel_shape=[2, 2], strides=[2, 2],
               pads=[0, 0, 0, 0], ceil_mode=0)
    h = net.op("Flatten", [h], "/flatten", axis=1)
    w, b = fit_head(net.run(inputs, h, feed), train[1], 10)
    net.linear(h, "fc", w, b)
    net.nodes[-1].output[0] = "logits"
    m = net.model(inputs, [_output("logits", ["batch", 10])], "resnet_basic_block")
    return RealModel("resnet_basic_block", m, {"input": cal[0]}, {"input": ev[0]}, ev[1],
                     "logits")


def conv1d_audio() -> RealModel:
    """Three Conv1d + Relu layers, causal Pad with computed pads, mean over time
    (ReduceMean), a Dense head as MatMul + Add."""
    x_all, y_all = tones(2, TRAIN + CALIBRATE + EVALUATE)
    train, cal, ev = _split(x_all, y_all)
    net = Net(13)
    inputs = [_input("waveform", TensorProto.FLOAT, ["batch", 1, 256])]
    feed = {"waveform": train[0]}
    # pads computed by the graph, as F.pad(x, (k - 1, 0)) exports: Constant -> Concat
    s = "/frontend/pad"
    left = net.op("Sub", [net.constant([32], s), net.constant([1], s)], s)
    pads = net.op("Concat", [net.constant([0, 0], s), left, net.constant([0, 0, 0], s)], s,
                  axis=0)
    h = net.op("Pad", ["waveform", pads], s, mode="constant")
    # a learned-STFT front end: cosine and sine kernels (Hann window) over 32 samples
    t = np.arange(32)
    freqs = np.geomspace(0.03, 1.2, 12)
    window = np.hanning(32)
    bank = np.concatenate([np.cos(np.outer(freqs, t)), np.sin(np.outer(freqs, t))]) * window
    h = net.op("Conv", [h, net.init("frontend.stft.weight", bank[:, None, :] / 4)], "/frontend",
               kernel_shape=[32], strides=[8], pads=[0, 0], group=1, dilations=[1])
    h = net.op("Relu", [h], "/frontend")
    h = net.op("Relu", [net.conv(h, "body.0", 24, 32, 5, stride=2, pad=2, dims=1)], "/body.0")
    h = net.op("Relu", [net.conv(h, "body.1", 32, 32, 3, stride=1, pad=1, dims=1)], "/body.1")
    h = net.op("ReduceMean", [h], "/pool", axes=[2], keepdims=0)
    w, b = fit_head(net.run(inputs, h, feed), train[1], 6)
    net.linear(h, "head", w, b, style="matmul")
    net.nodes[-1].output[0] = "logits"
    m = net.model(inputs, [_output("logits", ["batch", 6])], "conv1d_audio")
    return RealModel("conv1d_audio", m, {"waveform": cal[0]}, {"waveform": ev[0]}, ev[1],
                     "logits")


def _recurrent(kind: str) -> RealModel:
    steps, features, hidden, classes = 10, 8, 32, 5
    x_all, y_all = sequences(3 if kind == "LSTM" else 4, TRAIN + CALIBRATE + EVALUATE,
                             steps, features, classes)
    rows = len(y_all)
    state_rng = np.random.default_rng(5)
    h0_all = np.tanh(state_rng.normal(0, 0.3, (1, rows, hidden))).astype(np.float32)
    c0_all = state_rng.normal(0, 0.3, (1, rows, hidden)).astype(np.float32)
    train, cal, ev = _split(x_all, y_all, batch_axis=1)
    states = {"h0": _split(h0_all, y_all, 1), "c0": _split(c0_all, y_all, 1)}
    net = Net({"LSTM": 14, "GRU": 15, "RNN": 16}[kind])
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    scale = 1 / np.sqrt(hidden)
    w = net.init(f"{kind.lower()}.weight_ih",
                 net.rng.normal(0, 1.5 / np.sqrt(features), (1, gates * hidden, features)))
    r = net.init(f"{kind.lower()}.weight_hh",
                 net.rng.uniform(-scale, scale, (1, gates * hidden, hidden)))
    b = net.init(f"{kind.lower()}.bias", net.rng.normal(0, 0.1, (1, 2 * gates * hidden)))
    inputs = [_input("x", TensorProto.FLOAT, [steps, "batch", features]),
              _input("h0", TensorProto.FLOAT, [1, "batch", hidden])]
    args = ["x", w, r, b, "", "h0"]
    if kind == "LSTM":
        inputs.append(_input("c0", TensorProto.FLOAT, [1, "batch", hidden]))
        args.append("c0")
    scope = f"/{kind.lower()}"
    attrs = {"linear_before_reset": 1} if kind == "GRU" else {}
    outs = net.op(kind, args, scope, outputs=3 if kind == "LSTM" else 2, hidden_size=hidden,
                  direction="forward", **attrs)
    y = net.op("Squeeze", [outs[0], net.constant([1], scope)], scope)     # (S, N, H)
    if kind == "LSTM":   # out[-1]
        last = net.op("Gather", [y, net.constant(-1, scope)], scope, axis=0)
        style = "gemm"
    else:                # h_n[0] (an RNN's Y unused: PyTorch writes it all the same)
        last = net.op("Squeeze", [outs[1], net.constant([0], scope)], scope)
        style = "matmul"
    names = ["x", "h0", "c0"][:len(inputs)]
    parts = {"x": (train, cal, ev), **states}
    feed = {n: parts[n][0][0] for n in names}
    wh, bh = fit_head(net.run(inputs, last, feed), train[1], classes)
    net.linear(last, "fc", wh, bh, style=style)
    net.nodes[-1].output[0] = "logits"
    m = net.model(inputs, [_output("logits", ["batch", classes])], f"{kind.lower()}_classifier")
    return RealModel(f"{kind.lower()}_classifier", m, {n: parts[n][1][0] for n in names},
                     {n: parts[n][2][0] for n in names}, ev[1], "logits",
                     batch_axis={n: 1 for n in names})


def lstm_classifier() -> RealModel:
    """LSTM over a sequence-first (S, N, F) input, initial_h / initial_c as graph inputs,
    the last step's output into a Linear."""
    return _recurrent("LSTM")


def gru_classifier() -> RealModel:
    """GRU (linear_before_reset=1, as torch exports it), initial_h a graph input, h_n into a
    Dense head (MatMul + Add)."""
    return _recurrent("GRU")


def rnn_classifier() -> RealModel:
    """An Elman RNN (tanh, as PyTorch's nn.RNN exports it), initial_h a graph input, h_n
    into a Dense head."""
    return _recurrent("RNN")


def transformer_encoder() -> RealModel:
    """One post-norm encoder block on (N, 8, 32): two heads split by Shape/Gather/Concat/
    Reshape chains, Softmax attention, residual Adds, decomposed LayerNorms, a Gelu(Erf)
    MLP, mean over tokens, a Linear classifier."""
    tokens, width, heads, classes = 8, 32, 2, 4
    rng = np.random.default_rng(6)
    vocab = rng.normal(0, 1, (40, width))
    y_all = rng.integers(0, classes, TRAIN + CALIBRATE + EVALUATE)
    ids = np.where(rng.random((len(y_all), tokens)) < 0.75,
                   y_all[:, None] * 10 + rng.integers(0, 10, (len(y_all), tokens)),
                   rng.integers(0, 40, (len(y_all), tokens)))
    x_all = (vocab[ids] + rng.normal(0, 0.3, (len(y_all), tokens, width))).astype(np.float32)
    train, cal, ev = _split(x_all, y_all)
    net = Net(16)
    inputs = [_input("embeddings", TensorProto.FLOAT, ["batch", tokens, width])]
    s = "/encoder/layer.0/attention"
    x = "embeddings"
    shape = net.op("Shape", [x], s)
    n = net.op("Unsqueeze", [net.op("Gather", [shape, net.constant(0, s)], s, axis=0),
                             net.constant([0], s)], s)
    t = net.op("Unsqueeze", [net.op("Gather", [shape, net.constant(1, s)], s, axis=0),
                             net.constant([0], s)], s)
    split = net.op("Concat", [n, t, net.constant([heads, width // heads], s)], s, axis=0)
    merged = net.op("Concat", [n, t, net.constant([width], s)], s, axis=0)

    def head_view(v, perm):
        return net.op("Transpose", [net.op("Reshape", [v, split], s)], s, perm=perm)

    q = net.dense_random(x, "encoder.layer.0.attention.query", width, width)
    k = net.dense_random(x, "encoder.layer.0.attention.key", width, width)
    v = net.dense_random(x, "encoder.layer.0.attention.value", width, width)
    scores = net.op("MatMul", [head_view(q, [0, 2, 1, 3]), head_view(k, [0, 2, 3, 1])], s)
    scores = net.op("Div", [scores, net.constant(np.float32(np.sqrt(width // heads)), s,
                                                  np.float32)], s)
    probs = net.op("Softmax", [scores], s, axis=-1)
    ctx = net.op("MatMul", [probs, head_view(v, [0, 2, 1, 3])], s)
    ctx = net.op("Reshape", [net.op("Transpose", [ctx], s, perm=[0, 2, 1, 3]), merged], s)
    att = net.dense_random(ctx, "encoder.layer.0.attention.output.dense", width, width)
    h = net.layernorm(net.op("Add", [att, x], "/encoder/layer.0/attention/output"),
                      "encoder.layer.0.attention.output.LayerNorm", width)
    m = net.dense_random(h, "encoder.layer.0.intermediate.dense", width, 4 * width)
    m = net.gelu(m, "encoder.layer.0.intermediate.intermediate_act_fn")
    m = net.dense_random(m, "encoder.layer.0.output.dense", 4 * width, width)
    h = net.layernorm(net.op("Add", [m, h], "/encoder/layer.0/output"),
                      "encoder.layer.0.output.LayerNorm", width)
    pooled = net.op("ReduceMean", [h], "/pooler", axes=[1], keepdims=0)
    feed = {"embeddings": train[0]}
    w, b = fit_head(net.run(inputs, pooled, feed), train[1], classes)
    net.linear(pooled, "classifier", w, b)
    net.nodes[-1].output[0] = "logits"
    model = net.model(inputs, [_output("logits", ["batch", classes])], "transformer_encoder")
    return RealModel("transformer_encoder", model, {"embeddings": cal[0]},
                     {"embeddings": ev[0]}, ev[1], "logits")


def token_embedding() -> RealModel:
    """int32 token ids (N, 16) -> Gather from an embedding table -> mean over tokens ->
    Linear -> Relu -> Linear."""
    tokens, vocab, width, classes = 16, 60, 16, 5
    rng = np.random.default_rng(8)
    y_all = rng.integers(0, classes, TRAIN + CALIBRATE + EVALUATE)
    ids = np.where(rng.random((len(y_all), tokens)) < 0.75,
                   y_all[:, None] * 12 + rng.integers(0, 12, (len(y_all), tokens)),
                   rng.integers(0, vocab, (len(y_all), tokens))).astype(np.int32)
    train, cal, ev = _split(ids, y_all)
    net = Net(17)
    inputs = [_input("input_ids", TensorProto.INT32, ["batch", tokens])]
    table = net.init("embeddings.word_embeddings.weight", net.rng.normal(0, 1, (vocab, width)))
    h = net.op("Gather", [table, "input_ids"], "/embeddings/word_embeddings", axis=0)
    h = net.op("ReduceMean", [h], "/pooler", axes=[1], keepdims=0)
    h = net.op("Relu", [net.dense_random(h, "pre_classifier", width, 64, style="gemm")],
               "/pre_classifier")
    w, b = fit_head(net.run(inputs, h, {"input_ids": train[0]}), train[1], classes)
    net.linear(h, "classifier", w, b)
    net.nodes[-1].output[0] = "logits"
    m = net.model(inputs, [_output("logits", ["batch", classes])], "token_embedding")
    return RealModel("token_embedding", m, {"input_ids": cal[0]}, {"input_ids": ev[0]}, ev[1],
                     "logits")


def byte_classifier() -> RealModel:
    """A file-type classifier as jax2onnx/tf2onnx write it (the issue's first case, scaled
    down): int32 nibbles (N, 64), jax.nn.one_hot as Unsqueeze/Equal-with-iota/Cast,
    a decomposed LayerNorm, NWC <-> NCW Transposes around a Conv over the sequence, Tanh on
    the rank-3 activation, mean over the sequence, Dense (MatMul + Add) + Tanh, Dense."""
    length, depth, classes = 64, 16, 4
    rng = np.random.default_rng(9)
    y_all = rng.integers(0, classes, TRAIN + CALIBRATE + EVALUATE)
    # each "file type" has its own nibble distribution and a run-length habit
    profiles = rng.dirichlet(np.full(depth, 0.4), classes)
    ids = np.empty((len(y_all), length), np.int32)
    for i, c in enumerate(y_all):
        ids[i] = rng.choice(depth, length, p=profiles[c])
        if c % 2:                                    # runs: repeat the previous nibble
            repeat = rng.random(length) < 0.5
            for j in range(1, length):
                if repeat[j]:
                    ids[i, j] = ids[i, j - 1]
    train, cal, ev = _split(ids, y_all)
    net = Net(19)
    inputs = [_input("bytes", TensorProto.INT32, ["batch", length])]
    s = "/jax2onnx/one_hot"
    expanded = net.op("Unsqueeze", ["bytes", net.constant([-1], s)], s)
    iota = net.constant(np.arange(depth), s, np.int32)
    h = net.op("Cast", [net.op("Equal", [expanded, iota], s)], s, to=TensorProto.FLOAT)
    h = net.layernorm_flax(h, "jax2onnx.LayerNorm_0", depth)            # (N, L, 16)
    h = net.op("Transpose", [h], "/jax2onnx/Conv_0", perm=[0, 2, 1])     # NWC -> NCW
    h = net.conv(h, "jax2onnx.Conv_0", depth, 32, 5, 1, 2, dims=1)
    h = net.op("Transpose", [h], "/jax2onnx/Conv_0", perm=[0, 2, 1])     # NCW -> NWC
    h = net.op("Tanh", [h], "/jax2onnx")                                 # rank 3
    h = net.op("ReduceMean", [h], "/jax2onnx", axes=[1], keepdims=0)
    h = net.op("Tanh", [net.dense_random(h, "jax2onnx.Dense_0", 32, 32)], "/jax2onnx")
    w, b = fit_head(net.run(inputs, h, {"bytes": train[0]}), train[1], classes)
    net.linear(h, "jax2onnx.Dense_1", w, b, style="matmul")
    net.nodes[-1].output[0] = "logits"
    m = net.model(inputs, [_output("logits", ["batch", classes])], "byte_classifier")
    return RealModel("byte_classifier", m, {"bytes": cal[0]}, {"bytes": ev[0]}, ev[1],
                     "logits")


def _digits_flat():
    x, y = digits()
    return x.reshape(len(x), 64), y


def _skl2onnx(estimator, name: str) -> RealModel:
    import warnings
    from skl2onnx import to_onnx
    from sklearn.exceptions import ConvergenceWarning
    x_all, y_all = _digits_flat()
    train, cal, ev = _split(x_all, y_all)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        estimator.fit(train[0], train[1])
    m = to_onnx(estimator, train[0][:1], target_opset={"": OPSET, "ai.onnx.ml": 3})
    (inp,) = [i.name for i in m.graph.input]
    return RealModel(name, m, {inp: cal[0]}, {inp: ev[0]}, ev[1], "output_label", "label")


def sklearn_mlp() -> RealModel:
    """skl2onnx's default export of an MLPClassifier (MatMul/Add/Relu, Softmax, ai.onnx.ml
    ArrayFeatureExtractor, Cast, ZipMap) trained on sklearn's digits."""
    from sklearn.neural_network import MLPClassifier
    return _skl2onnx(MLPClassifier(hidden_layer_sizes=(64,), max_iter=60, random_state=0),
                     "sklearn_mlp")


def sklearn_logistic() -> RealModel:
    """skl2onnx's default export of a LogisticRegression (ai.onnx.ml LinearClassifier,
    Normalizer, ZipMap) trained on sklearn's digits."""
    from sklearn.linear_model import LogisticRegression
    return _skl2onnx(LogisticRegression(max_iter=40), "sklearn_logistic")


def calibration_reader(rows: dict[str, np.ndarray], batch: int = 32):
    """onnxruntime's CalibrationDataReader over `rows` ({input: array}, batch-first), in
    batches of `batch` rows."""
    from onnxruntime.quantization import CalibrationDataReader
    count = len(next(iter(rows.values())))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{k: v[i:i + batch] for k, v in rows.items()}
                                 for i in range(0, count, batch)])

        def get_next(self):
            return next(self.batches, None)
    return Reader()


def qoperator_cnn() -> RealModel:
    """A small CNN with a residual Add, quantized by onnxruntime's quantize_static in the
    QOperator format (QLinearConv, com.microsoft QLinearAdd, QGemm); the float model is the
    reference."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    x_all, y_all = digits()
    train, cal, ev = _split(x_all, y_all)
    net = Net(18)
    inputs = [_input("input", TensorProto.FLOAT, ["batch", 1, 8, 8])]
    h = net.op("Relu", [net.conv("input", "conv1", 1, 16, 3, 1, 1)], "/relu1")
    r = net.op("Relu", [net.conv(h, "block.conv", 16, 16, 3, 1, 1)], "/block/relu")
    h = net.op("Add", [h, r], "/block")
    h = net.op("MaxPool", [h], "/pool", kernel_shape=[2, 2], strides=[2, 2])
    h = net.op("Relu", [net.conv(h, "conv2", 16, 16, 3, 1, 1)], "/relu2")
    h = net.op("Flatten", [h], "/flatten", axis=1)
    w, b = fit_head(net.run(inputs, h, {"input": train[0]}), train[1], 10)
    net.linear(h, "fc", w, b)
    net.nodes[-1].output[0] = "logits"
    float_model = net.model(inputs, [_output("logits", ["batch", 10])], "qoperator_cnn")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.chunks = iter(np.array_split(cal[0], 2))

        def get_next(self):
            chunk = next(self.chunks, None)
            return None if chunk is None else {"input": chunk}

    import logging
    logging.getLogger().setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "float.onnx", Path(d) / "q.onnx"
        onnx.save(float_model, str(src))     # a path: quantize_static rewrites a ModelProto
        quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QOperator,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
        quantized = onnx.load(str(out))
    return RealModel("qoperator_cnn", quantized, {"input": cal[0]}, {"input": ev[0]}, ev[1],
                     "logits", float_model=float_model)


BUILDERS = {f.__name__: f for f in (mobilenet_v2_block, resnet_basic_block, conv1d_audio,
                                     lstm_classifier, gru_classifier, rnn_classifier,
                                     transformer_encoder, sklearn_mlp, sklearn_logistic,
                                     qoperator_cnn, token_embedding, byte_classifier)}

# op types whose constant-weight nodes must run on the TPU (the "done means")
MATRIX_OPS = {"Conv", "MatMul", "Gemm", "BatchNormalization", "LSTM", "GRU", "RNN",
              "QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger"}
# ai.onnx.ml's linear models: their weights are attributes, always constant
ATTRIBUTE_WEIGHT_OPS = {"LinearClassifier", "LinearRegressor"}


def constant_weight_nodes(m: onnx.ModelProto) -> list[tuple[str, str]]:
    """(name, op_type) of the matrix nodes whose weight input is an initializer (or a
    Constant): the nodes the issue's acceptance wants on the TPU.  ai.onnx.ml's
    LinearClassifier/LinearRegressor count too (a LogisticRegression's whole matrix work,
    beyond the issue's list of op types, but within its goal)."""
    consts = {t.name for t in m.graph.initializer}
    consts |= {o for n in m.graph.node if n.op_type == "Constant" for o in n.output}
    weight_index = {"QLinearConv": 3, "QLinearMatMul": 3, "QGemm": 3, "ConvInteger": 1,
                    "MatMulInteger": 1}
    found = []
    for n in m.graph.node:
        if n.op_type in ATTRIBUTE_WEIGHT_OPS:
            found.append((n.name, n.op_type))
        if n.op_type not in MATRIX_OPS:
            continue
        i = weight_index.get(n.op_type, 1)
        if len(n.input) > i and n.input[i] in consts:
            found.append((n.name, n.op_type))
    return found


def save_data(path, arrays: dict[str, np.ndarray]) -> str:
    np.savez(path, **arrays)
    return str(path)


# --- through the CLI, and the oracles (shared by tests/test_real_models.py and
# benchmarks/real_models.py) ------------------------------------------------------------------

@dataclass
class Outcome:
    """One model compiled with `tpuasm compile` and run with `tpuasm infer`."""
    model: RealModel
    outdir: Path
    compile: subprocess.CompletedProcess
    compile_seconds: float
    infer: subprocess.CompletedProcess | None = None
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def failure(self) -> str | None:
        """None when both commands exited 0 without a traceback and infer wrote the compared
        output with one row per evaluation row, else what went wrong."""
        for what in (self.compile, self.infer):
            if what is None:
                return "tpuasm infer did not run"
            if what.returncode != 0 or "Traceback" in what.stderr:
                last = (what.stderr.strip().splitlines() or ["(no stderr)"])[-1]
                return f"`tpuasm {what.args[3]}` exit {what.returncode}: {last}"
        got = self.outputs.get(self.model.output)
        if got is None:
            return f"tpuasm infer wrote no '{self.model.output}' (wrote {sorted(self.outputs)})"
        if len(got) != len(self.model.labels):
            return (f"tpuasm infer returned {len(got)} rows of '{self.model.output}' for "
                    f"{len(self.model.labels)} input rows")
        return None

    def report(self) -> dict:
        return json.loads((self.outdir / "report.json").read_text())


def tpuasm(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpuasm", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def compile_and_infer(m: RealModel, work: Path, *extra: str) -> Outcome:
    """`tpuasm compile MODEL -o OUT --batch B [--calibrate CAL.npz] [EXTRA...]`, then `tpuasm
    infer OUT X.npz -o Y.npz` on the evaluation rows, in subprocesses."""
    work = Path(work)
    path = work / f"{m.name}.onnx"
    onnx.save(m.model, str(path))
    out = work / "out"
    args = ["compile", path, "-o", out, "--batch", m.batch, "-q"]
    if not m.quantized:      # QDQ / QOperator models are taken with their own scales
        args += ["--calibrate", save_data(work / "cal.npz", m.calibration)]
    args += list(extra)
    start = time.perf_counter()
    done = tpuasm(*args)
    outcome = Outcome(m, out, done, time.perf_counter() - start)
    if done.returncode != 0:
        return outcome
    x = save_data(work / "x.npz", m.evaluation)
    outcome.infer = tpuasm("infer", out, x, "-o", work / "y.npz", "-q")
    if outcome.infer.returncode == 0:
        with np.load(work / "y.npz", allow_pickle=False) as y:
            outcome.outputs = {k: y[k] for k in y.files}
    return outcome


def nodes_on_tpu(outcome: Outcome) -> tuple[list[tuple[str, str]], dict[str, tuple]]:
    """(the matrix nodes with constant weights, {those not on the TPU: (where, note)})."""
    where = {row["node"]: (row["where"], row.get("note", ""))
             for row in outcome.report()["rows"]}
    wanted = constant_weight_nodes(outcome.model.model)
    missing = {n: where.get(n, ("no row", "")) for n, _ in wanted
               if where.get(n, ("",))[0] != "TPU"}
    return wanted, missing


def top1_agreement(outcome: Outcome) -> float:
    """Share of evaluation rows whose top-1 class equals the float model's (onnxruntime)."""
    m = outcome.model
    names = [o.name for o in m.reference.graph.output]
    want = m.top1(run(m.reference, m.evaluation)[names.index(m.output)])
    return float(np.mean(m.top1(outcome.outputs[m.output]) == want))


def output_steps(qdq: onnx.ModelProto) -> dict[str, float]:
    """Each graph output's quantization step: the scale of the DequantizeLinear making it."""
    scales = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    outputs = {o.name for o in qdq.graph.output}
    return {n.output[0]: float(np.max(scales[n.input[1]])) for n in qdq.graph.node
            if n.op_type == "DequantizeLinear" and n.output[0] in outputs
            and n.input[1] in scales}


def run_in_batches(m: onnx.ModelProto, feeds: dict[str, np.ndarray],
                   batch_axis: dict[str, int], batch: int) -> list:
    """onnxruntime on `feeds`; a model whose batch dimension is fixed (a compiler may write
    its QDQ model at the compiled batch) runs in chunks of `batch` rows, the last one padded
    by repeating rows, and its outputs (batch-first) are joined."""
    fixed = False
    for v in m.graph.input:
        if v.name in feeds:
            dims = v.type.tensor_type.shape.dim
            axis = batch_axis.get(v.name, 0)
            fixed |= len(dims) > axis and dims[axis].HasField("dim_value")
    if not fixed:
        return run(m, feeds)
    name = next(iter(feeds))
    rows = feeds[name].shape[batch_axis.get(name, 0)]
    parts = []
    for start in range(0, rows, batch):
        index = np.arange(start, start + batch) % rows
        parts.append(run(m, {k: np.take(v, index, axis=batch_axis.get(k, 0))
                             for k, v in feeds.items()}))
    keep = rows - len(parts) * batch + batch
    joined = []
    for i, first in enumerate(parts[0]):
        if not isinstance(first, np.ndarray):            # ZipMap's list of dicts
            joined.append([x for j, p in enumerate(parts)
                           for x in (p[i] if j < len(parts) - 1 else p[i][:keep])])
        else:
            chunks = [p[i] for p in parts[:-1]] + [parts[-1][i][:keep]]
            joined.append(np.concatenate(chunks))
    return joined


def qdq_agreement(outcome: Outcome) -> dict[str, tuple[float, float | None]]:
    """Per tensor output: (share identical to onnxruntime on OUTDIR/model.qdq.onnx, worst
    difference in output steps; None for integer outputs such as class labels).  A float
    output not made by a DequantizeLinear (host ops after the last quantized tensor) is
    measured in one 8-bit step of its range."""
    m = outcome.model
    qdq = onnx.load(str(outcome.outdir / "model.qdq.onnx"))
    want = dict(zip([o.name for o in qdq.graph.output],
                    run_in_batches(qdq, m.evaluation, m.batch_axis, m.batch)))
    steps = output_steps(qdq)
    result = {}
    for name, theirs in want.items():
        if not isinstance(theirs, np.ndarray):      # ZipMap's list of dicts: not a tensor
            continue
        ours = outcome.outputs.get(name)
        if ours is None or ours.shape != theirs.shape:
            result[name] = (0.0, float("inf"))
            continue
        diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
        if theirs.dtype.kind in "iub":
            result[name] = (float(np.mean(diff == 0)), None)
        else:
            step = steps.get(name) or float(np.ptp(theirs)) / 255 or 1.0
            result[name] = (float(np.mean(diff <= 1e-6 * step)),
                            float(diff.max(initial=0)) / step)
    return result


def macs(m: onnx.ModelProto, batch_axis: dict[str, int], feeds: dict[str, np.ndarray]
         ) -> dict[str, int]:
    """Multiply-accumulates per sample of every matrix node of a float model, from the shapes
    onnxruntime computes for one row of `feeds` (exact where shape inference is not)."""
    one = {k: np.take(v, [0], axis=batch_axis.get(k, 0)) for k, v in feeds.items()}
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type.tensor_type.elem_type for v in
             [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    known = {o.name for o in probe.graph.output}
    wanted = set()
    for n in m.graph.node:
        if n.op_type in ("Conv", "MatMul", "Gemm", "LSTM", "GRU", "RNN"):
            wanted |= {n.input[0], n.output[0]}
    for name in sorted(wanted - known - set(one)):
        if types.get(name):
            probe.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
    names = [o.name for o in probe.graph.output]
    values = dict(zip(names, run(probe, one)))
    values.update(one)
    inits = {t.name: t for t in m.graph.initializer}
    shape = lambda t: tuple(values[t].shape) if t in values else tuple(inits[t].dims)  # noqa
    count = {}
    for n in m.graph.node:
        if n.op_type == "Conv":
            w = shape(n.input[1])
            count[n.name] = int(np.prod(shape(n.output[0])) * np.prod(w[1:]))
        elif n.op_type in ("MatMul", "Gemm"):
            a = shape(n.input[0])
            trans = any(x.name == "transA" and x.i for x in n.attribute)
            k = a[-2] if trans else a[-1]
            count[n.name] = int(np.prod(shape(n.output[0])) * k)
        elif n.op_type in ("LSTM", "GRU", "RNN"):
            s, b, f = shape(n.input[0])
            w = shape(n.input[1])
            hidden = shape(n.input[2])[2]
            count[n.name] = int(s * b * w[1] * (f + hidden))
        elif n.op_type == "LinearClassifier":
            coefficients = next(x for x in n.attribute if x.name == "coefficients")
            count[n.name] = len(coefficients.floats)
    return count

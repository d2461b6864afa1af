"""A byte classifier in the shape of Google's Magika (a JAX export), built with onnx.helper
and numpy: int32 bytes one-hot encoded by Equal, Dense + GELU written out in primitives (x^3,
Tanh, ...), a LayerNorm in primitives (E[x^2] - E[x]^2), a Conv over the sequence with its
bias Add and GELU after it, GlobalMaxPool, a second LayerNorm, Dense and Softmax; the head
fitted by ridge regression on the float features of synthetic "files", so that its margins
are a trained model's.

SMALL is the look-alike tests/test_compiler_gelu_accuracy.py checks for accuracy; MAGIKA has
standard_v3_3's sizes (2048 bytes, Dense 257 -> 64, 512 positions of 256 features, a Conv
of 512 filters of 5 over them, 214 classes: 781,376 float32 weights, 3.1 MB, 366.7 M MACs a
sample) and, as jax2tf writes it, its one-hot's shape computed from the input's
(Shape -> Slice -> Concat -> Expand), which a compile folds into constants of its batch:
benchmarks/bench_compile.py measures its compile cost.  Its untrained front (random Dense
and Conv weights) loses more to 8-bit activations than Magika's trained one: min-max keeps
about 90 % of its top-1 answers (Magika: 99.2 %), so a default compile of it runs the whole
calibration search."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PAD = 256                          # Magika pads short files with 256 (one-hot's 257th value)
RIDGE, TARGET = 0.1, 48.0          # the head's ridge penalty and logit target


@dataclass(frozen=True)
class Dims:
    length: int            # bytes a row
    dense: int             # Dense_0's width
    group: int             # positions joined into one feature row by the Reshape
    conv: int              # the Conv's filters
    kernel: int            # its taps over the sequence
    classes: int
    computed_shape: bool   # the one-hot's batch computed from the input's shape (jax2tf)
    kinds: int = 0         # kinds of file the synthetic data holds (0: every class)

    @property
    def positions(self) -> int:
        return self.length // self.group


SMALL = Dims(64, 16, 4, 64, 3, 5, False)
# 214 classes, files of 16 kinds: 400 training files of 214 kinds fit a head whose margins
# are a third of a trained model's (median 3.3, 5th percentile 0.18 on other files)
MAGIKA = Dims(2048, 64, 4, 512, 5, 214, True, kinds=16)


def _c(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


class _Net:
    def __init__(self):
        self.nodes, self.inits = [], []

    def op(self, op_type, inputs, name, **attrs):
        out = f"{name}:0"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def const(self, name, value, dtype=np.float32):
        self.inits.append(_c(name, value, dtype))
        return name

    def gelu(self, x, scope):
        """JAX's tanh GELU as jax2tf writes it: 0.5 x (1 + tanh(c (x + 0.044715 x^3)))."""
        a = self.op("Mul", ["k_0.044715", x], f"{scope}/Mul")
        b = self.op("Mul", [x, a], f"{scope}/Mul_1")
        cube = self.op("Mul", [x, b], f"{scope}/Mul_2")
        s = self.op("Add", [x, cube], f"{scope}/AddV2")
        u = self.op("Mul", ["k_sqrt_2_over_pi", s], f"{scope}/Mul_3")
        t = self.op("Tanh", [u], f"{scope}/Tanh")
        one = self.op("Add", ["k_one", t], f"{scope}/AddV2_1")
        half = self.op("Mul", ["k_half", one], f"{scope}/Mul_4")
        return self.op("Mul", [x, half], f"{scope}/Mul_5")

    def layer_norm(self, x, scope, axis, gamma, beta, count):
        """Flax's LayerNorm in primitives: var = E[x^2] - E[x]^2 (the exported form)."""
        axes = self.const(f"{scope}/axes", [axis], np.int64)
        inv = self.const(f"{scope}/inv_n", 1.0 / count)
        mean = self.op("Mul", [self.op("ReduceSum", [x, axes], f"{scope}/Sum"), inv],
                       f"{scope}/truediv")
        sq = self.op("Mul", [x, x], f"{scope}/Square")
        msq = self.op("Mul", [self.op("ReduceSum", [sq, axes], f"{scope}/Sum_1"), inv],
                      f"{scope}/truediv_1")
        var = self.op("Sub", [msq, self.op("Mul", [mean, mean], f"{scope}/Square_1")],
                      f"{scope}/Sub")
        var = self.op("Max", ["k_zero", var], f"{scope}/Maximum")
        sd = self.op("Sqrt", [self.op("Add", [var, "k_eps"], f"{scope}/AddV2")],
                     f"{scope}/Rsqrt")
        scale = self.op("Mul", [self.op("Reciprocal", [sd], f"{scope}/Rsqrt_r"),
                                self.const(f"{scope}/gamma", gamma)], f"{scope}/Mul")
        centred = self.op("Sub", [x, mean], f"{scope}/Sub_1")
        return self.op("Add", [self.op("Mul", [centred, scale], f"{scope}/Mul_1"),
                               self.const(f"{scope}/beta", beta)], f"{scope}/AddV2_1")

    def one_hot_rows(self, bytes_, dims: Dims):
        """bytes (N, L) -> (N, L, 1): a Reshape, and with dims.computed_shape jax2tf's
        BroadcastTo of it to a shape made from the input's batch."""
        x = self.op("Reshape", [bytes_, self.const("oh_shape", [-1, dims.length, 1],
                                                   np.int64)], "one_hot/Reshape")
        if not dims.computed_shape:
            return x
        shape = self.op("Shape", [bytes_], "Shape")
        batch = self.op("Slice", [shape, self.const("s0", [0], np.int64),
                                  self.const("s1", [1], np.int64)], "strided_slice")
        target = self.op("Concat", [batch, self.const("oh_rest", [dims.length, 1], np.int64)],
                         "one_hot/BroadcastTo/shape", axis=0)
        return self.op("Expand", [x, target], "one_hot/BroadcastTo")


def files(rng, rows: int, dims: Dims = SMALL):
    """(bytes, labels): rows as Magika reads files, the first dims.length bytes padded with
    256; each class a byte distribution of its own, many files short (mostly padding)."""
    kinds = dims.kinds or dims.classes
    labels = rng.integers(0, kinds, rows)
    tables = np.random.default_rng(7).dirichlet(np.full(256, 0.05), kinds)          # fixed
    x = np.full((rows, dims.length), PAD, np.int32)
    for i, k in enumerate(labels):
        n = int(rng.choice([rng.integers(4, 16), rng.integers(16, dims.length + 1)]))
        x[i, :n] = rng.choice(256, n, p=tables[k])
    return x, labels


def _features(net, bytes_, dims: Dims):
    """The network up to the second LayerNorm (its output: the classifier's features)."""
    rng = np.random.default_rng(20)
    net.const("k_0.044715", 0.044715)
    net.const("k_sqrt_2_over_pi", 0.7978846)
    net.const("k_one", 1.0)
    net.const("k_half", 0.5)
    net.const("k_zero", 0.0)
    net.const("k_eps", 1e-6)
    x = net.one_hot_rows(bytes_, dims)
    eq = net.op("Equal", [x, net.const("oh_values", np.arange(257).reshape(1, 1, 257),
                                       np.int32)], "one_hot/Equal")
    oh = net.op("Cast", [eq], "one_hot/Cast", to=TensorProto.FLOAT)
    h = net.op("MatMul", [oh, net.const("dense0_w", rng.normal(0, 1.0, (257, dims.dense)))],
               "Dense_0/einsum")
    h = net.op("Add", [h, net.const("dense0_b", rng.normal(0, 0.3, (1, 1, dims.dense)))],
               "Dense_0/AddV2")
    h = net.gelu(h, "ApplyActivation_0")
    width = dims.group * dims.dense
    h = net.op("Reshape", [h, net.const("group_shape", [-1, dims.positions, width],
                                        np.int64)], "Reshape")
    h = net.layer_norm(h, "LayerNorm_0", 2, rng.uniform(0.5, 1.5, (1, 1, width)),
                       rng.normal(0, 0.1, (1, 1, width)), width)
    h = net.op("Transpose", [h], "Conv_0/nwc_to_ncw", perm=[0, 2, 1])
    h = net.op("Unsqueeze", [h, net.const("ax3", [3], np.int64)], "Conv_0/Unsqueeze")
    w = rng.normal(0, 1 / np.sqrt(width * dims.kernel), (dims.conv, width, dims.kernel, 1))
    h = net.op("Conv", [h, net.const("conv_w", w)], "Conv_0/Conv2D")
    h = net.op("Squeeze", [h, "ax3"], "Conv_0/Squeeze")
    h = net.op("Add", [h, net.const("conv_b", rng.normal(0, 0.3, (1, dims.conv, 1)))],
               "Conv_0/AddV2")
    h = net.gelu(h, "ApplyActivation_1")
    h = net.op("GlobalMaxPool", [h], "Max")
    h = net.op("Squeeze", [h, net.const("ax2", [2], np.int64)], "Max_Squeeze")
    return net.layer_norm(h, "LayerNorm_1", 1, rng.uniform(0.5, 1.5, (1, dims.conv)),
                          rng.normal(0, 0.1, (1, dims.conv)), dims.conv)


def model(dims: Dims, head_w=None, head_b=None) -> onnx.ModelProto:
    """The float model; without a head its output is the features."""
    bytes_input = helper.make_tensor_value_info("bytes", TensorProto.INT32,
                                                ["N", dims.length])
    net = _Net()
    feats = _features(net, "bytes", dims)
    if head_w is None:
        outputs = [helper.make_tensor_value_info(feats, TensorProto.FLOAT, None)]
    else:
        logits = net.op("MatMul", [feats, net.const("dense1_w", head_w)], "Dense_1/MatMul")
        logits = net.op("Add", [logits, net.const("dense1_b", head_b)], "Dense_1/AddV2")
        net.nodes.append(helper.make_node("Softmax", [logits], ["target_label"],
                                          name="softmax", axis=-1))
        outputs = [helper.make_tensor_value_info("target_label", TensorProto.FLOAT,
                                                 ["N", dims.classes])]
    g = helper.make_graph(net.nodes, "magika_like", [bytes_input], outputs, net.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    return m


def trained(dims: Dims = SMALL, train_rows: int = 400, seed: int = 3):
    """(the float model, its rng after the training files): the head fitted by ridge
    regression on the float features of `train_rows` files, its targets scaled so that the
    margins between the two largest logits are a trained model's (Magika's on real files:
    median 9, 5th percentile 0.9; SMALL's about 8.6 and 0.7)."""
    import onnxruntime as ort
    rng = np.random.default_rng(seed)
    train, labels = files(rng, train_rows, dims)
    features = ort.InferenceSession(model(dims).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
    feats = np.concatenate([features.run(None, {"bytes": train[i:i + 64]})[0]
                            for i in range(0, len(train), 64)])
    a = np.hstack([feats, np.ones((len(feats), 1), np.float32)])
    # ridge least squares (the LayerNorm's features sum to a constant: plain least squares
    # would meet a singular system)
    coef = np.linalg.solve(a.T @ a + RIDGE * np.eye(a.shape[1]),
                           a.T @ (TARGET * np.eye(dims.classes)[labels]))
    m = model(dims, coef[:-1].astype(np.float32), coef[-1:].astype(np.float32))
    onnx.checker.check_model(m)
    return m, rng

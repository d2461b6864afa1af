"""scikit-learn's bundled digits (8x8 images, offline) and two small networks trained in numpy
alone: an MLP and a CNN, exported as ONNX with onnx.helper.

The split is fixed (seeded permutation, 75 % train / 25 % test), so the committed models,
the calibration set and the evaluation always see the same samples."""
from __future__ import annotations

import numpy as np

SEED = 0


def load_split():
    """(x_train, y_train, x_test, y_test): images (n, 1, 8, 8) float32 in [0, 1]."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SEED).permutation(len(x))
    cut = int(len(x) * 0.75)
    train, test = order[:cut], order[cut:]
    return x[train], y[train], x[test], y[test]


# --- numpy layers (forward and backward) ---------------------------------------------------

def im2col(x, k, pad):
    """(B, C, H, W) -> (B*H*W, C*k*k) for a stride-1 'same' convolution."""
    b, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.empty((b, c, k, k, h, w), x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, i, j] = xp[:, :, i:i + h, j:j + w]
    return cols.transpose(0, 4, 5, 1, 2, 3).reshape(b * h * w, c * k * k)


def col2im(cols, shape, k, pad):
    b, c, h, w = shape
    cols = cols.reshape(b, h, w, c, k, k).transpose(0, 3, 4, 5, 1, 2)
    xp = np.zeros((b, c, h + 2 * pad, w + 2 * pad), cols.dtype)
    for i in range(k):
        for j in range(k):
            xp[:, :, i:i + h, j:j + w] += cols[:, :, i, j]
    return xp[:, :, pad:pad + h, pad:pad + w]


def conv_forward(x, w, b):
    o, c, k, _ = w.shape
    cols = im2col(x, k, k // 2)
    out = cols @ w.reshape(o, -1).T + b
    bsz, _, h, wd = x.shape
    return out.reshape(bsz, h, wd, o).transpose(0, 3, 1, 2), cols


def conv_backward(dout, x, w, cols):
    o, c, k, _ = w.shape
    d = dout.transpose(0, 2, 3, 1).reshape(-1, o)
    dw = (d.T @ cols).reshape(w.shape)
    db = d.sum(axis=0)
    dx = col2im(d @ w.reshape(o, -1), x.shape, k, k // 2)
    return dx, dw, db


def maxpool_forward(x):
    b, c, h, w = x.shape
    r = x.reshape(b, c, h // 2, 2, w // 2, 2)
    out = r.max(axis=(3, 5))
    mask = r == out[:, :, :, None, :, None]
    return out, mask


def maxpool_backward(dout, mask):
    d = mask * dout[:, :, :, None, :, None]
    d = d / np.maximum(mask.sum(axis=(3, 5), keepdims=True), 1)
    b, c, h2, _, w2, _ = d.shape
    return d.reshape(b, c, h2 * 2, w2 * 2)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class Adam:
    def __init__(self, params, lr=0.01):
        self.params, self.lr, self.t = params, lr, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads):
        self.t += 1
        for k, g in grads.items():
            self.m[k] = 0.9 * self.m[k] + 0.1 * g
            self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
            mh = self.m[k] / (1 - 0.9 ** self.t)
            vh = self.v[k] / (1 - 0.999 ** self.t)
            self.params[k] -= self.lr * mh / (np.sqrt(vh) + 1e-8)


# --- the two networks ----------------------------------------------------------------------

def mlp_forward(p, x, keep=False):
    a0 = x.reshape(len(x), -1)
    z1 = a0 @ p["w1"] + p["b1"]
    a1 = np.maximum(z1, 0)
    z2 = a1 @ p["w2"] + p["b2"]
    return (z2, (a0, z1, a1)) if keep else z2


def mlp_grads(p, x, y):
    z2, (a0, z1, a1) = mlp_forward(p, x, keep=True)
    d2 = softmax(z2)
    d2[np.arange(len(y)), y] -= 1
    d2 /= len(y)
    d1 = (d2 @ p["w2"].T) * (z1 > 0)
    return {"w2": a1.T @ d2, "b2": d2.sum(0), "w1": a0.T @ d1, "b1": d1.sum(0)}


def cnn_forward(p, x, keep=False):
    c1, cols1 = conv_forward(x, p["k1"], p["c1"])
    r1 = np.maximum(c1, 0)
    m1, mask1 = maxpool_forward(r1)
    c2, cols2 = conv_forward(m1, p["k2"], p["c2"])
    r2 = np.maximum(c2, 0)
    m2, mask2 = maxpool_forward(r2)
    f = m2.reshape(len(x), -1)
    z = f @ p["w"] + p["b"]
    return (z, (cols1, c1, mask1, m1, cols2, c2, mask2, f)) if keep else z


def cnn_grads(p, x, y):
    z, (cols1, c1, mask1, m1, cols2, c2, mask2, f) = cnn_forward(p, x, keep=True)
    dz = softmax(z)
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    g = {"w": f.T @ dz, "b": dz.sum(0)}
    dm2 = (dz @ p["w"].T).reshape(len(x), 16, 2, 2)
    dc2 = maxpool_backward(dm2, mask2) * (c2 > 0)
    dm1, g["k2"], g["c2"] = conv_backward(dc2, m1, p["k2"], cols2)
    dc1 = maxpool_backward(dm1, mask1) * (c1 > 0)
    _, g["k1"], g["c1"] = conv_backward(dc1, x, p["k1"], cols1)
    return g


def init_mlp(rng):
    return {"w1": rng.normal(0, np.sqrt(2 / 64), (64, 64)), "b1": np.zeros(64),
            "w2": rng.normal(0, np.sqrt(1 / 64), (64, 10)), "b2": np.zeros(10)}


def init_cnn(rng):
    return {"k1": rng.normal(0, np.sqrt(2 / 9), (8, 1, 3, 3)), "c1": np.zeros(8),
            "k2": rng.normal(0, np.sqrt(2 / 72), (16, 8, 3, 3)), "c2": np.zeros(16),
            "w": rng.normal(0, np.sqrt(1 / 64), (64, 10)), "b": np.zeros(10)}


def train(kind: str, x, y, epochs: int, lr=0.01, batch=32):
    rng = np.random.default_rng(SEED)
    params = init_mlp(rng) if kind == "mlp" else init_cnn(rng)
    params = {k: v.astype(np.float32) for k, v in params.items()}
    grads_of = mlp_grads if kind == "mlp" else cnn_grads
    opt = Adam(params, lr)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x), batch):
            idx = order[i:i + batch]
            opt.step(grads_of(params, x[idx], y[idx]))
    return params


def accuracy(kind, params, x, y) -> float:
    z = (mlp_forward if kind == "mlp" else cnn_forward)(params, x)
    return float(np.mean(z.argmax(1) == y))


# --- ONNX export ---------------------------------------------------------------------------

def to_onnx(kind: str, p):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def init(name, value):
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    if kind == "mlp":
        inits = [init("fc1.weight", p["w1"].T), init("fc1.bias", p["b1"]),
                 init("fc2.weight", p["w2"].T), init("fc2.bias", p["b2"]),
                 numpy_helper.from_array(np.array([-1, 64], np.int64), "flat_shape")]
        nodes = [helper.make_node("Reshape", ["image", "flat_shape"], ["x"], name="flatten"),
                 helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], name="fc1",
                                  transB=1),
                 helper.make_node("Relu", ["h"], ["hr"], name="relu1"),
                 helper.make_node("Gemm", ["hr", "fc2.weight", "fc2.bias"], ["logits"],
                                  name="fc2", transB=1),
                 helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax")]
    else:
        inits = [init("conv1.weight", p["k1"]), init("conv1.bias", p["c1"]),
                 init("conv2.weight", p["k2"]), init("conv2.bias", p["c2"]),
                 init("fc.weight", p["w"].T), init("fc.bias", p["b"])]
        nodes = [helper.make_node("Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"],
                                  name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
                 helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2],
                                  strides=[2, 2]),
                 helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"],
                                  name="conv2", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
                 helper.make_node("MaxPool", ["r2"], ["p2"], name="pool2", kernel_shape=[2, 2],
                                  strides=[2, 2]),
                 helper.make_node("Flatten", ["p2"], ["f"], name="flatten"),
                 helper.make_node("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], name="fc",
                                  transB=1),
                 helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax")]
    graph = helper.make_graph(
        nodes, f"digits_{kind}",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="tpuasm programs/digits/train.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model

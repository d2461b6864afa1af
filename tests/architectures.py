"""Float models of real architectures built with onnx.helper and numpy (issue 20's examples).

`transformer_block`: a transformer encoder block:
x (N, S, D) -> self-attention (Q/K/V MatMul + bias Add, heads by Reshape/Transpose, scores
MatMul, Softmax, context MatMul, output projection) + residual + LayerNormalization ->
feed-forward (MatMul + Add + Relu, MatMul + Add) + residual + LayerNormalization ->
ReduceMean over the sequence -> Gemm classifier."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def transformer_block(seq=8, dim=32, heads=4, ffn=64, classes=5, seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def linear(x, k, n, name):
        w = const(f"{name}_w", rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32))
        b = const(f"{name}_b", rng.normal(0, 0.1, n).astype(np.float32))
        return node("Add", [node("MatMul", [x, w], f"{name}_mm"), b], f"{name}_add")

    def norm(x, name):
        g = const(f"{name}_g", (1 + rng.normal(0, 0.1, dim)).astype(np.float32))
        b = const(f"{name}_b", rng.normal(0, 0.1, dim).astype(np.float32))
        return node("LayerNormalization", [x, g, b], name, axis=-1)

    dh = dim // heads
    split = const("heads_shape", np.array([0, seq, heads, dh], np.int64))
    merge = const("merge_shape", np.array([0, seq, dim], np.int64))
    parts = {}
    for p in ("q", "k", "v"):
        h = node("Reshape", [linear("x", dim, dim, p), split], f"{p}_heads")
        parts[p] = node("Transpose", [h], f"{p}_t", perm=[0, 2, 1, 3])
    kt = node("Transpose", [parts["k"]], "k_tt", perm=[0, 1, 3, 2])
    scores = node("MatMul", [parts["q"], kt], "scores")
    scaled = node("Mul", [scores, const("inv_sqrt", np.float32(1 / np.sqrt(dh)))], "scaled")
    attn = node("Softmax", [scaled], "attn", axis=-1)
    ctx = node("MatMul", [attn, parts["v"]], "context")
    ctx = node("Reshape", [node("Transpose", [ctx], "ctx_t", perm=[0, 2, 1, 3]), merge],
               "ctx_merged")
    x1 = norm(node("Add", ["x", linear(ctx, dim, dim, "proj")], "residual1"), "norm1")
    hidden = node("Relu", [linear(x1, dim, ffn, "ffn1")], "ffn_relu")
    x2 = norm(node("Add", [x1, linear(hidden, ffn, dim, "ffn2")], "residual2"), "norm2")
    pooled = node("ReduceMean", [x2, const("seq_axis", np.array([1], np.int64))], "pool",
                  keepdims=0)
    w = const("cls_w", rng.normal(0, 1 / np.sqrt(dim), (classes, dim)).astype(np.float32))
    b = const("cls_b", rng.normal(0, 0.1, classes).astype(np.float32))
    nodes.append(helper.make_node("Gemm", [pooled, w, b], ["y"], name="classifier", transB=1))
    graph = helper.make_graph(nodes, "transformer", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", seq, dim])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", classes])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def inverted_residual(seed=0) -> onnx.ModelProto:
    """MobileNetV2's inverted-residual block: 1x1 expand + ReLU6, depthwise 3x3 + ReLU6,
    1x1 project, residual Add, global average pool, Gemm.  Input (N, 16, 12, 12)."""
    b = _Net(seed)
    e = b.op("Clip", [b.conv("x", 16, 48, 1, "expand"), b.const("lo", np.float32(0)),
                      b.const("hi", np.float32(6))], "relu6a")
    dw = b.op("Clip", [b.conv(e, 48, 48, 3, "dw", group=48), "lo", "hi"], "relu6b")
    r = b.op("Add", ["x", b.conv(dw, 48, 16, 1, "project")], "residual")
    flat = b.op("Flatten", [b.op("GlobalAveragePool", [r], "gap")], "flat")
    b.nodes.append(helper.make_node("Gemm", [flat, b.const("fc_w", b.rng.normal(
        0, 0.25, (5, 16)).astype(np.float32)), b.const("fc_b", np.zeros(5, np.float32))],
        ["y"], name="fc", transB=1))
    return b.model([16, 12, 12], [5])


def audio_classifier(seed=0) -> onnx.ModelProto:
    """A 1-D conv audio classifier: Conv1d stride 2 + ReLU, depthwise Conv1d + ReLU, the
    channels moved last (Transpose), MatMul + bias + Tanh per position, mean over time,
    MatMul.  Input (N, 4, 64)."""
    b = _Net(seed)
    c1 = b.op("Relu", [b.conv("x", 4, 16, 5, "conv1", stride=2, dims=1)], "r1")
    c2 = b.op("Relu", [b.conv(c1, 16, 16, 3, "dwconv", group=16, dims=1)], "r2")
    rows = b.op("Transpose", [c2], "to_rows", perm=[0, 2, 1])
    fc1 = b.op("MatMul", [rows, b.const("fc1_w", b.rng.normal(0, 0.25, (16, 24)).astype(
        np.float32))], "fc1")
    h = b.op("Tanh", [b.op("Add", [fc1, b.const("fc1_b", b.rng.normal(0, 0.1, 24).astype(
        np.float32))], "fc1_bias")], "tanh")
    pooled = b.op("ReduceMean", [h, b.const("time", np.array([1], np.int64))], "pool",
                  keepdims=0)
    b.nodes.append(helper.make_node("MatMul", [pooled, b.const("fc2_w", b.rng.normal(
        0, 0.3, (24, 6)).astype(np.float32))], ["y"], name="fc2"))
    return b.model([4, 64], [6])


class _Net:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []

    def const(self, name, value):
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type, inputs, name, **attrs):
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def conv(self, x, c, o, k, name, group=1, stride=1, dims=2):
        w = self.rng.normal(0, 1 / np.sqrt(c // group * k ** dims),
                            (o, c // group) + (k,) * dims).astype(np.float32)
        b = self.rng.normal(0, 0.1, o).astype(np.float32)
        return self.op("Conv", [x, self.const(name + "_w", w), self.const(name + "_b", b)],
                       name, kernel_shape=[k] * dims, group=group, strides=[stride] * dims,
                       pads=[k // 2] * 2 * dims)

    def model(self, input_shape, output_shape) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "net", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, ["N", *input_shape])], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, ["N", *output_shape])], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        m.ir_version = 8
        return m

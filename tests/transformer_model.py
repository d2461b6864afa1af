"""A float transformer encoder block built with onnx.helper and numpy (issue 20's example):
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

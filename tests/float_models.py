"""Float ONNX models for the compiler's tests: a layer list -> ModelProto with random weights.

Layers are tuples: ("conv", out_channels, kernel, stride, pad), ("gemm", n), ("matmul", n),
("relu",), ("clip", lo, hi), ("sigmoid",), ("tanh",), ("maxpool", k, s, pad),
("avgpool", k, s, pad, count_include_pad), ("gap",), ("flatten",), ("transpose", perm),
("reshape", shape), ("softmax",), ("add_const",), ("div_const",)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(layers, input_shape, seed=0, batch="N", name="net") -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    shape = list(input_shape)
    current = "x"
    for i, layer in enumerate(layers):
        kind, *args = layer
        out = f"t{i}"
        lname = f"{kind}{i}"
        if kind == "conv":
            o, k, s, p = args
            c = shape[0]
            w = rng.normal(0, 1 / np.sqrt(c * k * k), (o, c, k, k)).astype(np.float32)
            b = rng.normal(0, 0.1, o).astype(np.float32)
            inits += [numpy_helper.from_array(w, f"{lname}_w"),
                      numpy_helper.from_array(b, f"{lname}_b")]
            nodes.append(helper.make_node("Conv", [current, f"{lname}_w", f"{lname}_b"], [out],
                                          name=lname, kernel_shape=[k, k], strides=[s, s],
                                          pads=[p, p, p, p]))
            shape = [o, (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif kind in ("gemm", "matmul"):
            (n,) = args
            k = shape[0]
            w = rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32)
            if kind == "gemm":
                b = rng.normal(0, 0.1, n).astype(np.float32)
                inits += [numpy_helper.from_array(np.ascontiguousarray(w.T), f"{lname}_w"),
                          numpy_helper.from_array(b, f"{lname}_b")]
                nodes.append(helper.make_node("Gemm", [current, f"{lname}_w", f"{lname}_b"],
                                              [out], name=lname, transB=1))
            else:
                inits.append(numpy_helper.from_array(w, f"{lname}_w"))
                nodes.append(helper.make_node("MatMul", [current, f"{lname}_w"], [out],
                                              name=lname))
            shape = [n]
        elif kind in ("relu", "sigmoid", "tanh", "softmax"):
            op = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "softmax": "Softmax"}
            nodes.append(helper.make_node(op[kind], [current], [out], name=lname))
        elif kind == "clip":
            lo, hi = args
            inits += [numpy_helper.from_array(np.float32(lo), f"{lname}_lo"),
                      numpy_helper.from_array(np.float32(hi), f"{lname}_hi")]
            nodes.append(helper.make_node("Clip", [current, f"{lname}_lo", f"{lname}_hi"],
                                          [out], name=lname))
        elif kind in ("maxpool", "avgpool"):
            k, s, p, *rest = args
            attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])
            if kind == "avgpool":
                attrs["count_include_pad"] = int(rest[0]) if rest else 0
            nodes.append(helper.make_node("MaxPool" if kind == "maxpool" else "AveragePool",
                                          [current], [out], name=lname, **attrs))
            shape = [shape[0], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif kind == "gap":
            nodes.append(helper.make_node("GlobalAveragePool", [current], [out], name=lname))
            shape = [shape[0], 1, 1]
        elif kind == "flatten":
            nodes.append(helper.make_node("Flatten", [current], [out], name=lname))
            shape = [int(np.prod(shape))]
        elif kind == "transpose":
            (perm,) = args
            nodes.append(helper.make_node("Transpose", [current], [out], name=lname,
                                          perm=[0] + [p + 1 for p in perm]))
            shape = [shape[p] for p in perm]
        elif kind == "reshape":
            (new,) = args
            inits.append(numpy_helper.from_array(np.array([-1, *new], np.int64), f"{lname}_s"))
            nodes.append(helper.make_node("Reshape", [current, f"{lname}_s"], [out], name=lname))
            shape = list(new)
        elif kind in ("add_const", "div_const"):
            c = rng.normal(0, 1, shape).astype(np.float32)
            if kind == "div_const":
                c = np.abs(c) + 0.5
            inits.append(numpy_helper.from_array(c, f"{lname}_c"))
            nodes.append(helper.make_node("Add" if kind == "add_const" else "Div",
                                          [current, f"{lname}_c"], [out], name=lname))
        else:
            raise ValueError(kind)
        current = out
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, *input_shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, *shape])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)

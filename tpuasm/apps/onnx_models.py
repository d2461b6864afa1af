"""The six apps as float ONNX models (onnx.helper), built from the same layer lists.

Random weights from a fixed seed (`seed`), generated on demand: nothing large is committed.
`save(name, path)` writes MODEL.onnx with its weights as external data next to it (100M
floats for CNN1 = 400 MB), so the compiler can memory-map them.  The graph per layer kind:
FC -> MatMul (+ Relu / Sigmoid / Tanh), over a Concat when it has several inputs; conv ->
Conv (same padding) + Relu; pool -> MaxPool; a vector layer -> Mul / Add of its inputs
(then Tanh); image features into an FC layer -> Flatten (and Concat).  Inputs are
(batch, features) or (batch, C, H, W) float32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .catalog import build
from .layers import FC, Conv, Pool, Vector

OPSET = 17
ACT_OP = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}


def model(name: str, seed: int = 0, batch: int | None = None):
    """The app as an onnx.ModelProto (weights inside; use `save` for external data)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    app = build(name)
    b = batch or app.batch
    g = np.random.default_rng(seed)
    nodes, inits = [], []

    def shape(t):
        return [b, t.channels] if not t.is_image else [b, t.channels, t.height, t.width]

    def weight(wname, dims, fan_in):
        w = (g.standard_normal(dims, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, wname))
        return wname

    def flat(tname):
        t = app.t(tname)
        if not t.is_image:
            return tname
        out = f"{tname}.flat"
        if not any(n.output[0] == out for n in nodes):
            nodes.append(helper.make_node("Flatten", [tname], [out], axis=1, name=out))
        return out

    for layer in app.layers:
        if isinstance(layer, FC):
            ins = [flat(x) for x in layer.inputs]
            x = ins[0]
            if len(ins) > 1:
                x = f"{layer.name}.concat"
                nodes.append(helper.make_node("Concat", ins, [x], axis=1, name=x))
            k = sum(app.t(i).channels * app.t(i).pixels for i in layer.inputs)
            m = app.t(layer.output).channels
            w = weight(f"{layer.name}.W", (k, m), k)
            pre = layer.output if layer.fn == "none" else f"{layer.name}.mm"
            nodes.append(helper.make_node("MatMul", [x, w], [pre], name=layer.name))
            if layer.fn != "none":
                nodes.append(helper.make_node(ACT_OP[layer.fn], [pre], [layer.output],
                                              name=f"{layer.name}.{layer.fn}"))
        elif isinstance(layer, Conv):
            c, o = app.t(layer.input).channels, app.t(layer.output).channels
            k, p = layer.kernel, layer.kernel // 2
            w = weight(f"{layer.name}.W", (o, c, k, k), c * k * k)
            pre = f"{layer.name}.conv"
            nodes.append(helper.make_node("Conv", [layer.input, w], [pre], name=layer.name,
                                          kernel_shape=[k, k], pads=[p, p, p, p]))
            nodes.append(helper.make_node("Relu", [pre], [layer.output], name=f"{layer.name}.relu"))
        elif isinstance(layer, Pool):
            nodes.append(helper.make_node("MaxPool", [layer.input], [layer.output],
                                          name=layer.name, kernel_shape=[layer.size] * 2,
                                          strides=[layer.size] * 2))
        elif isinstance(layer, Vector):
            ins = list(layer.inputs)
            acc = ins[0]
            for i, other in enumerate(ins[1:]):      # f*c + i*g style: alternate Mul, Add
                op = "Mul" if i % 2 == 0 else "Add"
                out = f"{layer.name}.{i}"
                nodes.append(helper.make_node(op, [acc, other], [out], name=out))
                acc = out
            final = layer.output
            if layer.fn != "none":
                nodes.append(helper.make_node(ACT_OP[layer.fn], [acc], [final],
                                              name=f"{layer.name}.{layer.fn}"))
            else:
                nodes.append(helper.make_node("Identity", [acc], [final], name=f"{layer.name}.id"))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape(app.t(n)))
              for n in app.inputs]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape(app.t(n)))
               for n in app.outputs]
    graph = helper.make_graph(nodes, app.name, inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                          producer_name="tpuasm.apps")
    m.ir_version = min(m.ir_version, 9)
    onnx.checker.check_model(m) if m.ByteSize() < 1_900_000_000 else None
    return m


def save(name: str, path: Path, seed: int = 0, batch: int | None = None) -> Path:
    """Write the model to `path`, weights as external data in PATH.data."""
    import onnx
    m = model(name, seed, batch)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    return path


def calibration(name: str, samples: int = 16, seed: int = 1) -> dict:
    """A synthetic calibration set: {input name: (samples, ...) float32}."""
    app = build(name)
    g = np.random.default_rng(seed)
    out = {}
    for n in app.inputs:
        t = app.t(n)
        dims = (samples, t.channels) if not t.is_image else (samples, t.channels, t.height, t.width)
        out[n] = g.random(dims, dtype=np.float32)
    return out

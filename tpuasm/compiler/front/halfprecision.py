"""A float16 or bfloat16 model computed in float32 between its own inputs and outputs.

Models are often shipped in half precision (Optimum's and onnxconverter's fp16 exports,
transformers.js's `model_fp16.onnx`).  onnxruntime's quantize_static then writes float32
scales beside float16 tensors, and the QDQ model fails onnx's own type check
("DequantizeLinear: x_scale ... has unsupported type: tensor(float16)").  The TPU computes
in 8 or 16-bit integers either way, so the compiler reads such a model as the float32
model of the same weights: every half-precision weight, constant and Cast target becomes
float32, each half-precision input is cast to float32 where the graph reads it and each
half-precision output cast back, so the model keeps its interface (the user's float16
data in, float16 answers out).  Its host parts then compute in float32, a little closer to
the real numbers than the shipped model; the check compares the compiled model with this
float32 model."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_HALF = {TensorProto.FLOAT16, TensorProto.BFLOAT16}
# attributes that name an element type an operator produces
_DTYPE_ATTRIBUTES = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype",
                     "RandomUniform": "dtype", "RandomNormalLike": "dtype",
                     "RandomUniformLike": "dtype", "Bernoulli": "dtype", "Multinomial": "dtype"}


def is_half_precision(model: onnx.ModelProto) -> bool:
    g = model.graph
    return any(v.type.tensor_type.elem_type in _HALF for v in [*g.input, *g.output]) or \
        any(t.data_type in _HALF for t in g.initializer)


def widen_half_precision(model: onnx.ModelProto) -> int:
    """Rewrite (in place) a half-precision model as float32 inside (see the module's note);
    the count of weights and constants widened, 0 for a model with none."""
    if not is_half_precision(model):
        return 0
    g = model.graph
    count = _widen_graph(g)
    constants = {t.name for t in g.initializer}
    for v in g.input:
        if v.type.tensor_type.elem_type in _HALF and v.name not in constants:
            wide = f"{v.name}_float32"
            _rename_reads(g, v.name, wide)
            g.node.insert(0, helper.make_node("Cast", [v.name], [wide], to=TensorProto.FLOAT,
                                              name=f"{v.name}_to_float32"))
    inputs = {v.name for v in g.input}
    for v in g.output:
        half = v.type.tensor_type.elem_type
        if half not in _HALF or v.name in inputs:
            continue
        wide = f"{v.name}_float32"
        for node in g.node:
            node.output[:] = [wide if o == v.name else o for o in node.output]
        _rename_reads(g, v.name, wide)
        g.node.append(helper.make_node("Cast", [wide], [v.name], to=half,
                                       name=f"{v.name}_to_{TensorProto.DataType.Name(half)}"))
    return count


def _widen_graph(g: onnx.GraphProto) -> int:
    """Weights, Constants, dtype attributes and value_info of `g` and its subgraphs in
    float32; the count of tensors widened."""
    count = 0
    for i, t in enumerate(g.initializer):
        if t.data_type in _HALF:
            g.initializer[i].CopyFrom(_widened(t))
            count += 1
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in _HALF:
                a.t.CopyFrom(_widened(a.t))
                count += 1
            elif a.type == onnx.AttributeProto.GRAPH:
                count += _widen_graph(a.g)
                _widen_values(a.g.input)
                _widen_values(a.g.output)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    count += _widen_graph(sub)
                    _widen_values(sub.input)
                    _widen_values(sub.output)
            elif a.name == _DTYPE_ATTRIBUTES.get(node.op_type) and a.i in _HALF:
                a.i = TensorProto.FLOAT
    _widen_values(g.value_info)
    return count


def _widened(t: onnx.TensorProto) -> onnx.TensorProto:
    values = numpy_helper.to_array(t)
    return numpy_helper.from_array(np.asarray(values, np.float32), t.name)


def _widen_values(values) -> None:
    for v in values:
        if v.type.tensor_type.elem_type in _HALF:
            v.type.tensor_type.elem_type = TensorProto.FLOAT


def _rename_reads(g: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of `old` in `g` and in the subgraphs that see it."""
    for node in g.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                if old not in {v.name for v in sub.input}:      # not shadowed there
                    _rename_reads(sub, old, new)


"""The compiled model's inputs and outputs (runtime.ValueInfo) read off its graph: per-sample
shapes along each tensor's batch axis, element types kept (int32 ids stay int32), and an
ONNX type name for a non-tensor output (a ZipMap's sequence of maps)."""
from __future__ import annotations

from onnx import helper

from tpuasm.compiler.front.graph import Graph
from tpuasm.compiler.runtime.steps import ValueInfo


def model_values(graph: Graph) -> tuple[list[ValueInfo], list[ValueInfo]]:
    """The compiled model's inputs and outputs: per-sample shapes along their batch axes,
    element types kept (an ONNX type name for a non-tensor output such as ZipMap's)."""
    def info(name, axis):
        shape = graph.shapes.get(name)
        if shape is None:
            shape = ()
        elif axis is not None:
            shape = shape[:axis] + shape[axis + 1:]
        dtype = graph.dtypes.get(name)
        if dtype is None:
            dtype = _onnx_type(graph, name)
        return ValueInfo(name, tuple(shape), str(dtype), axis)
    inputs = [info(n, graph.batch_axis.get(n)) for n in graph.inputs]
    outputs = []
    for n in graph.outputs:
        kind = None if n in graph.dtypes else _onnx_type(graph, n)
        # a sequence of maps (ZipMap) holds one map per row; other non-tensor outputs (a
        # sequence of tensors, a map) are not rows: the first batch's, whole
        per_row = kind is None or kind.startswith("seq(map(")
        if graph.shapes.get(n) == ():             # a scalar has no rows
            per_row = False
        outputs.append(info(n, graph.output_axis(n) if per_row else None))
    return inputs, outputs


def _onnx_type(graph: Graph, name: str) -> str:
    for v in graph.model.graph.output:
        if v.name == name and not v.type.HasField("tensor_type"):
            return _type_text(v.type)
    return "float32"


def _type_text(t) -> str:
    """An ONNX TypeProto as text: seq(map(int64,tensor(float)))."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({_elem_name(t.tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({_type_text(t.sequence_type.elem_type)})"
    if kind == "map_type":
        return f"map({_elem_name(t.map_type.key_type)},{_type_text(t.map_type.value_type)})"
    return kind or "unknown"


def _elem_name(elem_type: int) -> str:
    return helper.tensor_dtype_to_string(elem_type).split(".")[-1].lower()   # TensorProto.X

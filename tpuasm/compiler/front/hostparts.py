"""The host side as the compiler cuts it: sub-models of the quantized graph that the CPU will run
(onnxruntime on the same graph, so their numerics are onnxruntime's own), and the lookup
tables of element-wise operators, read off onnxruntime for each of the 256 inputs."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.graph import Graph, Node
from tpuasm.compiler.ir import QParams
from tpuasm.compiler.ort import session


def _elem_type(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _initializer(graph: Graph, name: str) -> onnx.TensorProto:
    """An initializer with its data in memory (external data cannot follow a model that
    onnxruntime gets as bytes)."""
    proto = graph.initializers[name]
    if proto.data_location == onnx.TensorProto.EXTERNAL:
        return numpy_helper.from_array(np.asarray(graph.constant(name)), name)
    return proto


def submodel(graph: Graph, nodes: list[Node], inputs: list[str], outputs: list[str],
             name: str) -> onnx.ModelProto:
    """The nodes (in graph order) as a model from `inputs` to `outputs`, with the constants
    they read and the fixed-batch shapes of the graph."""
    nodes = sorted(nodes, key=lambda n: n.index)
    wanted = {i for n in nodes for i in n.inputs if i}
    inits = [_initializer(graph, i) for i in sorted(wanted) if i in graph.initializers
             and i not in inputs]

    declared = {v.name: v for v in graph.model.graph.output
                if not v.type.HasField("tensor_type")}

    # a part with an If/Loop/Scan declares its tensors' ranks only: onnxruntime type-checks
    # every branch against fixed shapes when the session opens, and a branch the data never
    # takes (an exporter's `if x.shape[0] == 1`) may not fit them
    loose = any(n.op_type in ("If", "Loop", "Scan") for n in nodes)

    def info(tensor: str):
        if tensor in declared:           # a sequence or map output (ZipMap's): as declared
            return declared[tensor]
        dtype = graph.dtypes.get(tensor)
        if dtype is None:
            raise CompileError(f"the element type of '{tensor}' is unknown")
        shape = graph.shapes.get(tensor)
        if loose and shape is not None:
            shape = [None] * len(shape)
        return helper.make_tensor_value_info(tensor, _elem_type(dtype),
                                             None if shape is None else list(shape))

    g = helper.make_graph(_outputs_apart([n.proto for n in nodes], outputs, inputs), name,
                          [info(i) for i in inputs], [info(o) for o in outputs], inits)
    model = helper.make_model(g, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model


def _outputs_apart(protos: list, outputs: list[str], inputs: list[str]) -> list:
    """The part's nodes, where an output that nodes of the part also read is written by an
    Identity of its own.  onnxruntime's QDQ propagation moves a QuantizeLinear back past a
    Transpose or Reshape when its tensor has one reader, counting no graph output: a
    LayerNorm output read by a Transpose -> QuantizeLinear inside the part and by the next
    part reached that next part quantized and dequantized (a transformer encoder from
    PyTorch: 10 % of its outputs one step off onnxruntime on the whole QDQ model, where the
    tensor has two readers and stays float)."""
    read = {i for p in protos for i in p.input}
    shared = [o for o in outputs if o in read and o not in inputs]
    if not shared or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                         for p in protos for a in p.attribute):
        return protos      # a branch may read the tensor by its name: left as it is
    alias = {o: f"{o}/inside" for o in shared}
    out = []
    for proto in protos:
        if any(t in alias for t in [*proto.input, *proto.output]):
            copy = onnx.NodeProto()
            copy.CopyFrom(proto)
            for field in (copy.input, copy.output):
                for k, t in enumerate(field):
                    field[k] = alias.get(t, t)
            proto = copy
        out.append(proto)
    out += [helper.make_node("Identity", [alias[o]], [o], name=f"{o}/output") for o in shared]
    return out


def lookup_table(graph: Graph, node: Node, x: QParams, y: QParams) -> np.ndarray:
    """The 256-entry table of an element-wise node between quantizations x and y:
    onnxruntime's answer for every input value (table[(q + 256) % 256] = f(q))."""
    xtype = np.int8 if x.signed else np.uint8
    ytype = np.int8 if y.signed else np.uint8
    inits = [numpy_helper.from_array(np.float32(x.scale), "lut_x_scale"),
             numpy_helper.from_array(np.asarray(x.zero_point, xtype), "lut_x_zp"),
             numpy_helper.from_array(np.float32(y.scale), "lut_y_scale"),
             numpy_helper.from_array(np.asarray(y.zero_point, ytype), "lut_y_zp")]
    copy = onnx.NodeProto()
    copy.CopyFrom(node.proto)
    consts = [i for i in node.inputs[1:] if i]
    for name in consts:
        value = graph.constant(name)
        if value is None:
            raise CompileError(f"{node}: input '{name}' is not a constant")
        inits.append(numpy_helper.from_array(np.asarray(value), name))
    del copy.output[1:]
    if node.op_type.startswith("QLinear"):
        copy.input[0] = "lut_x"
        copy.output[0] = "lut_y"
        nodes = [copy]
    else:
        copy.input[0] = "lut_xf"
        copy.output[0] = "lut_yf"
        nodes = [helper.make_node("DequantizeLinear", ["lut_x", "lut_x_scale", "lut_x_zp"],
                                  ["lut_xf"]), copy,
                 helper.make_node("QuantizeLinear", ["lut_yf", "lut_y_scale", "lut_y_zp"],
                                  ["lut_y"])]
    g = helper.make_graph(nodes, "lookup", [helper.make_tensor_value_info(
        "lut_x", _elem_type(xtype), [256])], [helper.make_tensor_value_info(
            "lut_y", _elem_type(ytype), [256])], inits)
    model = helper.make_model(g, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    every = np.arange(256, dtype=np.uint8).view(xtype)
    (answers,) = session(model).run(None, {"lut_x": every})
    table = np.empty(256, ytype)
    table[every.astype(np.int64) % 256] = answers
    return table

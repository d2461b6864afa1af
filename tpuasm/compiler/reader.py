"""Reading an ONNX model: clear errors for files that are not models, opsets the compiler
does not know, dynamic shapes; the batch dimension fixed; shapes inferred.

Weights stay where they are: the model is parsed without its external data (memory-mapped
later by graph.tensor_array), and shape inference runs on a skeleton of the graph in which
every large initializer is only a declared input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.graph import Graph

MIN_OPSET = 10                     # QuantizeLinear / QLinearConv / MatMulInteger appear in 10
MAX_OPSET = onnx.defs.onnx_opset_version()
KNOWN_DOMAINS = {"", "ai.onnx", "com.microsoft"}
_SMALL = 4096                      # initializers kept in the shape-inference skeleton

QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                 "MatMulInteger", "ConvInteger", "QGemm", "QLinearAdd", "QLinearMul",
                 "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
                 "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSoftmax",
                 "DynamicQuantizeLinear"}


def read_model(path) -> onnx.ModelProto:
    """Parse and check an ONNX file (external data is not read)."""
    path = Path(path)
    if not path.is_file():
        raise CompileError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:            # protobuf's DecodeError, OSError, ...: no common base
        raise CompileError(f"{path}: not a readable ONNX model (corrupt or truncated file?): "
                           f"{_first_line(e)}") from None
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise CompileError(f"{path}: not an ONNX model with a graph (empty or truncated file?)")
    check_opsets(model, path)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    try:
        # by path when weights live in external files: the checker resolves them beside it
        onnx.checker.check_model(str(path) if external else model)
    except Exception as e:
        raise CompileError(f"{path}: invalid ONNX model: {_first_line(e)}") from None
    _name_nodes(model)
    return model


def _first_line(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def check_opsets(model: onnx.ModelProto, path) -> None:
    versions = {o.domain or "": o.version for o in model.opset_import}
    default = versions.get("", versions.get("ai.onnx"))
    if default is None:
        raise CompileError(f"{path}: the model imports no ONNX opset")
    if not MIN_OPSET <= default <= MAX_OPSET:
        raise CompileError(f"{path}: opset {default} is not supported (supported: "
                           f"{MIN_OPSET}-{MAX_OPSET}); convert it with "
                           f"onnx.version_converter")
    for node in model.graph.node:
        if (node.domain or "") not in KNOWN_DOMAINS:
            raise CompileError(f"{path}: node '{node.name or node.op_type}' uses the unknown "
                               f"operator domain '{node.domain}'")


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique name (reports, .tasm comments and the debugger use them)."""
    seen = set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)


def is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in QUANTIZED_OPS for n in model.graph.node)


def _dims(value_info) -> list:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in shape.dim]


def input_signature(model: onnx.ModelProto) -> dict[str, list]:
    """Graph inputs (not initializers) -> dims (ints, names of symbolic dims, None)."""
    inits = {t.name for t in model.graph.initializer}
    return {v.name: _dims(v) for v in model.graph.input if v.name not in inits}


def fix_batch(model: onnx.ModelProto, batch: int | None, path, apply: bool = True) -> int:
    """Set every graph input's first dimension to the batch; return it.  Without `batch`,
    the model's own fixed batch is used; a dynamic one is an error that says what to pass.
    `apply=False` only checks."""
    inits = {t.name for t in model.graph.initializer}
    chosen = batch
    for v in model.graph.input:
        if v.name in inits:
            continue
        if not v.type.HasField("tensor_type"):
            raise CompileError(f"{path}: input '{v.name}' is not a tensor")
        dims = _dims(v)
        if len(dims) < 2:
            raise CompileError(f"{path}: input '{v.name}' has shape {dims}: expected a batch "
                               f"dimension first and at least one more")
        for axis, d in enumerate(dims[1:], start=1):
            if not isinstance(d, int) or d <= 0:
                raise CompileError(f"{path}: input '{v.name}' dimension {axis} is dynamic "
                                   f"({d!r}): only the batch dimension may be; export the "
                                   f"model with a fixed shape")
        first = dims[0]
        if chosen is None:
            if not isinstance(first, int) or first <= 0:
                raise CompileError(f"{path}: input '{v.name}' has a dynamic batch dimension "
                                   f"({first!r}): pass --batch B (batch=B)")
            chosen = first
        if not apply:
            continue
        dim = v.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_value = chosen
    if chosen is None or chosen <= 0:
        raise CompileError(f"{path}: batch must be a positive integer, not {chosen}")
    for v in model.graph.output if apply else ():   # re-inferred with the new batch
        if v.type.HasField("tensor_type") and v.type.tensor_type.shape.dim:
            v.type.tensor_type.shape.dim[0].Clear()
    return chosen


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with large initializers turned into declared inputs (no data copied)."""
    g = model.graph
    small, declared = [], []
    for t in g.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL \
                and t.data_location != onnx.TensorProto.EXTERNAL:
            small.append(t)
        else:
            declared.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    inits = {t.name for t in g.initializer}
    inputs = [v for v in g.input if v.name not in inits] + declared
    graph = helper.make_graph(list(g.node), g.name or "model", inputs, list(g.output), small)
    skeleton = helper.make_model(graph, opset_imports=list(model.opset_import))
    skeleton.ir_version = model.ir_version
    return skeleton


def infer_shapes(model: onnx.ModelProto, path) -> tuple[dict, dict]:
    """(tensor -> shape tuple, tensor -> numpy dtype) for every tensor whose shape is known."""
    skeleton = _skeleton(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=True,
                                                     strict_mode=True, data_prop=True)
    except Exception as e:
        raise CompileError(f"{path}: shape inference failed: {_first_line(e)}") from None
    shapes, dtypes = {}, {}
    g = inferred.graph
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if not v.type.HasField("tensor_type"):
            continue
        dims = _dims(v)
        try:
            dtypes[v.name] = np.dtype(helper.tensor_dtype_to_np_dtype(
                v.type.tensor_type.elem_type))
        except Exception:
            pass
        if all(isinstance(d, int) for d in dims) and v.type.tensor_type.HasField("shape"):
            shapes[v.name] = tuple(dims)
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
        dtypes[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    return shapes, dtypes


def load_graph(path, batch: int | None, model: onnx.ModelProto | None = None
               ) -> tuple[Graph, int]:
    """Read (or take) a model, fix its batch, infer shapes: the graph the compiler works on."""
    path = Path(path)
    model = read_model(path) if model is None else model
    batch = fix_batch(model, batch, path)
    shapes, dtypes = infer_shapes(model, path)
    return Graph(model, path.parent, shapes, dtypes), batch

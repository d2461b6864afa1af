"""A small, read-only graph form of an ONNX model: nodes with names and attributes,
producer/consumer maps, per-tensor shapes and element types, and constants as numpy arrays
(views of the model's bytes or memory maps of its external data: weights are never copied
into a second Python object)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.errors import CompileError


@dataclass
class Node:
    name: str
    op_type: str
    domain: str
    inputs: list[str]                 # "" for an omitted optional input
    outputs: list[str]
    attrs: dict
    index: int                        # position in the model's node list
    proto: onnx.NodeProto = field(repr=False, default=None)

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def input(self, i: int) -> str:
        return self.inputs[i] if i < len(self.inputs) else ""

    def __str__(self) -> str:
        return f"{self.op_type} '{self.name}'"


def _np_dtype(elem_type: int):
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        return None


class Graph:
    """The graph of one model (shapes inferred, batch fixed) and its constants."""

    def __init__(self, model: onnx.ModelProto, base_dir: Path, shapes: dict, dtypes: dict,
                 batch_axis: dict | None = None, fixed_batch: bool = False):
        self.model = model
        self.base_dir = Path(base_dir)
        self.shapes: dict[str, tuple] = shapes        # tensor -> full shape (batch fixed)
        self.dtypes: dict[str, np.dtype] = dtypes
        g = model.graph
        self.initializers = {t.name: t for t in g.initializer}
        self.inputs = [v.name for v in g.input if v.name not in self.initializers]
        # tensor -> its batch axis (None: no batch dimension, the same for every batch), for
        # every tensor whose axis is known (batch.py); the inputs always
        self.batch_axis: dict[str, int | None] = dict(batch_axis) if batch_axis is not None \
            else {n: 0 for n in self.inputs}
        # exported with a fixed batch (batch.has_fixed_batch): axis 0 by convention, and the
        # batch may hide in constants (a Reshape to [1, -1]) where no inference follows it
        self.fixed_batch = fixed_batch
        self.outputs = [v.name for v in g.output]
        self.nodes: list[Node] = []
        self.producer: dict[str, Node] = {}
        self.consumers: dict[str, list[Node]] = {}
        self._constants: dict[str, np.ndarray] = {}
        for i, proto in enumerate(g.node):
            attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
            # an If/Loop/Scan reads outer tensors inside its subgraphs: listed after its own
            # inputs so that partition and the host parts see what it needs
            inputs = list(proto.input) + [t for t in implicit_inputs(proto)
                                          if t not in proto.input]
            node = Node(proto.name, proto.op_type, proto.domain or "", inputs,
                        list(proto.output), attrs, i, proto)
            self.nodes.append(node)
            for out in node.outputs:
                if out:
                    self.producer[out] = node
            for inp in node.inputs:
                if inp:
                    self.consumers.setdefault(inp, []).append(node)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    # --- constants ------------------------------------------------------------------------

    def is_constant(self, name: str) -> bool:
        if name in self.initializers:
            return True
        node = self.producer.get(name)
        return node is not None and node.op_type == "Constant" and "value" in node.attrs

    def constant(self, name: str) -> np.ndarray | None:
        """The value of an initializer or Constant node output; None if not a constant."""
        if name in self._constants:
            return self._constants[name]
        if name in self.initializers:
            value = tensor_array(self.initializers[name], self.base_dir)
        elif self.is_constant(name):
            value = tensor_array(self.producer[name].attrs["value"], self.base_dir)
        else:
            return None
        self._constants[name] = value
        return value

    def sample_shape(self, name: str) -> tuple[int, ...] | None:
        """A tensor's shape without its (first) batch dimension."""
        shape = self.shapes.get(name)
        return None if shape is None else tuple(shape[1:])

    @property
    def batched(self) -> bool:
        """Whether any model input has a batch axis (else the model runs once)."""
        return any(self.batch_axis.get(n) is not None for n in self.inputs)

    @property
    def batch_size(self) -> int | None:
        """The fixed batch (read off the first input with a batch axis)."""
        for n in self.inputs:
            axis = self.batch_axis.get(n)
            if axis is not None and n in self.shapes:
                return self.shapes[n][axis]
        return None

    def output_axis(self, name: str) -> int | None:
        """A model output's batch axis: the first in a model exported with a fixed batch,
        else the inferred one, else the first when the model has a batch (shape inference
        lost the batch's symbol on the way)."""
        if self.fixed_batch and self.batched:     # the batch-first convention
            return 0
        if name in self.batch_axis:
            return self.batch_axis[name]
        return 0 if self.batched else None

    def rows(self, name: str) -> int | None:
        """The rows a TPU program reads a tensor as: its leading dimension (a Conv's N, a
        Gemm's M, a MatMul's first; the rest is one row's shape, sample_shape); None when
        its shape is unknown or it has no dimension."""
        shape = self.shapes.get(name)
        return int(shape[0]) if shape else None

    def segment_rows(self, name: str) -> int | None:
        """Segment.rows of a segment that reads or writes the tensor: None when its leading
        dimension is the model's batch (batch axis 0, or unknown and of the batch's size),
        else that dimension at the compiled batch (the frames of a model run whole; the
        batch times T after a Reshape (N, T*F) -> (N*T, F))."""
        rows = self.rows(name)
        if rows is None:
            return None
        if (self.fixed_batch and self.batched) or name not in self.batch_axis:
            batch = self.batch_size if self.batched else 1
            return None if rows == batch else rows
        axis = self.batch_axis[name]
        if axis == 0 or (axis is None and not self.batched and rows == 1):
            return None
        return rows

    def not_batch_first(self, name: str) -> str | None:
        """Why a tensor cannot go to the TPU (None when it can).  Its leading dimension is
        rows (rows()): any tensor of two dimensions or more can, its program built for
        those rows when they are not the batch (segment_rows); one of fewer dimensions only
        when that one is the batch (batch axis 0, unknown, or a model without a batch whose
        tensor has one element)."""
        shape = self.shapes.get(name)
        if shape is not None and len(shape) >= 2:
            return None
        if self.fixed_batch and self.batched:     # the batch-first convention
            shape = self.shapes.get(name)
            if shape is not None and (not shape or shape[0] != self.batch_size):
                return f"'{name}' of shape {shape} is not batch-first"
            return None
        if name in self.batch_axis:
            axis = self.batch_axis[name]
        elif not self.batched:
            axis = None                   # a model that runs once: no tensor has a batch
        else:                             # unknown: batch-first unless its shape says not
            shape = self.shapes.get(name)
            if shape is not None and (not shape or shape[0] != self.batch_size):
                return f"'{name}' of shape {shape} is not batch-first"
            return None
        if axis == 0:
            return None
        if axis is None:
            shape = self.shapes.get(name)
            if not self.batched and shape and shape[0] == 1:
                return None
            return f"'{name}' has no batch dimension (the same for every batch)"
        return f"its batch dimension is axis {axis} (tensor '{name}')"


def readers_through(tensor: str, consumers: dict, passing) -> "Iterator[tuple]":
    """(reader, the tensor it reads) for every node that reads `tensor` or, through nodes
    of the op types `passing` (layout nodes), a tensor they make from it; `consumers`:
    tensor -> the nodes that read it.  Each tensor is visited once."""
    todo, seen = [tensor], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for reader in consumers.get(name, ()):
            if reader.op_type in passing:
                todo.extend(o for o in reader.output if o)
            else:
                yield reader, name


def implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors the subgraphs of a node read (none for a node without any)."""
    found: list[str] = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else \
            list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
        for sub in graphs:
            defined = {v.name for v in sub.input} | {t.name for t in sub.initializer}
            for inner in sub.node:
                for name in list(inner.input) + implicit_inputs(inner):
                    if name and name not in defined and name not in found:
                        found.append(name)
                defined.update(inner.output)
    return found


def tensor_array(tensor: onnx.TensorProto, base_dir: Path) -> np.ndarray:
    """A TensorProto as a read-only numpy array without an extra copy: external data is
    memory-mapped, raw data viewed in place."""
    dtype = _np_dtype(tensor.data_type)
    dims = tuple(tensor.dims)
    if dtype is None:
        raise CompileError(f"initializer '{tensor.name}': unsupported element type "
                           f"{tensor.data_type}")
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        path = Path(base_dir) / info.get("location", "")
        offset = int(info.get("offset", 0))
        count = int(np.prod(dims, dtype=np.int64))
        size = count * dtype.itemsize
        try:
            available = path.stat().st_size - offset
        except OSError as e:
            raise CompileError(f"initializer '{tensor.name}': external data {path}: "
                               f"{e.strerror}") from None
        if available < size:
            raise CompileError(f"initializer '{tensor.name}': external data {path} holds "
                               f"{max(available, 0)} bytes at offset {offset}, "
                               f"{size} needed (truncated?)")
        if count == 0:
            return np.zeros(dims, dtype)
        return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=dims)
    if tensor.HasField("raw_data"):
        data = np.frombuffer(tensor.raw_data, dtype=dtype)
        if data.size != int(np.prod(dims, dtype=np.int64)):
            raise CompileError(f"initializer '{tensor.name}': {data.size} values for "
                               f"shape {list(dims)}")
        return data.reshape(dims)
    from onnx import numpy_helper
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as e:
        raise CompileError(f"initializer '{tensor.name}': {e}") from None

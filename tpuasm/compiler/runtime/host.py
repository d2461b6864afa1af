"""The host parts of a compiled model at run time: each an onnxruntime session over its
sub-model (cut by front/hostparts.py), opened on first use.

Several batches at once (run_rows): a sub-model is cut with the model's fixed batch, so by
default each batch is its own session call.  When every node of the part computes each row
from that row alone (ROW_WISE, attributes checked) a second session over a copy with the
first axis left free takes all the batches in one call (a Reshape to a constant shape whose
first entry is the batch becomes one whose first entry copies the input's, 0); its first
answer is compared, byte for byte, with the batch-by-batch one, and on any difference (or
error) the part keeps going batch by batch."""
from __future__ import annotations

import numpy as np
import onnx

from onnx import numpy_helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.ort import session

# Operators whose output row r depends on input row r alone, whatever the attributes (the
# others in _ROW_WISE_IF are so when their axis is not the first).
ROW_WISE = frozenset({
    "QuantizeLinear", "DequantizeLinear", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip",
    "Cast", "Identity", "Exp", "Log", "Neg", "Abs", "Sqrt", "Erf", "Softplus", "HardSigmoid",
    "Elu", "Selu", "Round", "Floor", "Ceil", "Reciprocal"})
_AXIS_DEFAULT = {"Softmax": -1, "LogSoftmax": -1, "Flatten": 1, "ArgMax": 0, "ArgMin": 0}


class HostRunner:
    """One host part: an onnxruntime session over its sub-model, opened on first use."""

    def __init__(self, model_bytes: bytes, inputs: list[str], outputs: list[str], name: str):
        self.model_bytes = model_bytes
        self.inputs, self.outputs, self.name = inputs, outputs, name
        self._session = None
        self._model = None
        self._rows = None        # the free-batch session; False once found unusable
        self._rows_checked = False
        self._batch_major: dict[int, bool] = {}
        self.arena = True        # onnxruntime's memory arena (ort.session; steps.one_off)

    def release(self) -> None:
        """Close the sessions (and the memory their arenas hold); the next run opens them
        again."""
        self._session = self._model = self._rows = None
        self._rows_checked = False

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            if self._session is None:
                self._session = session(self.model_bytes, arena=self.arena)
            results = self._session.run(self.outputs, {k: feeds[k] for k in self.inputs})
        except Exception as e:        # onnxruntime's errors have no common public base
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CompileError(f"host part {self.name}: onnxruntime failed: {text}") from None
        return dict(zip(self.outputs, results))

    # ------------------------------------------------------------------ several batches
    def model(self) -> onnx.ModelProto:
        if self._model is None:
            self._model = onnx.load_from_string(self.model_bytes)
        return self._model

    def batch_major(self, batch: int) -> bool:
        """Every input and output is a tensor with `batch` as its first dimension (asked on
        every run: the answer kept per batch)."""
        if batch not in self._batch_major:
            graph = self.model().graph
            self._batch_major[batch] = all(_first_dim(v) == batch
                                           for v in (*graph.input, *graph.output))
        return self._batch_major[batch]

    def run_rows(self, feeds: dict[str, np.ndarray], batches: int, batch: int
                 ) -> dict[str, np.ndarray]:
        """`batches` batches stacked along every input's first axis -> the outputs stacked
        the same way (batch_major parts only)."""
        rows = self._rows_session(batch)
        if rows is not None:
            try:
                got = dict(zip(self.outputs, rows.run(self.outputs, feeds)))
            except Exception:          # onnxruntime's errors have no common public base
                got = None
            if self._rows_checked:
                if got is not None:
                    return got
                self._rows = False
            else:
                want = self._batch_by_batch(feeds, batches, batch)
                self._rows_checked = True
                if got is None or not _identical(got, want):
                    self._rows = False
                return want
        return self._batch_by_batch(feeds, batches, batch)

    def _batch_by_batch(self, feeds, batches, batch):
        parts = [self.run({k: v[b * batch:(b + 1) * batch] for k, v in feeds.items()})
                 for b in range(batches)]
        return {name: np.concatenate([p[name] for p in parts]) for name in self.outputs}

    def _rows_session(self, batch: int):
        if self._rows is None:
            self._rows = False
            free = _free_batch(self.model(), batch)
            if free is not None:
                try:
                    self._rows = session(free.SerializeToString(), arena=self.arena)
                except Exception:      # onnxruntime's errors have no common public base
                    self._rows = False
        return self._rows or None


def _free_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto | None:
    """A copy of a batch-major part with its first axis free, or None when a node may mix
    rows (or a Reshape's shape is not a constant led by the batch, -1 or 0)."""
    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    shapes = {}                                   # a Reshape's shape initializer -> its entries
    for node in graph.node:
        if node.op_type == "Reshape":
            shape = constants.get(node.input[1]) if len(node.input) > 1 else None
            allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
            entries = numpy_helper.to_array(shape).tolist() if shape is not None else []
            if allowzero or not entries or entries[0] not in (batch, -1, 0) \
                    or any(e in (-1, 0) for e in entries[1:]):
                return None
            shapes[shape.name] = entries
        elif not _row_wise(node):
            return None
    used = [i for n in graph.node if n.op_type != "Reshape" for i in n.input]
    if any(name in used for name in shapes) or not all(
            _first_dim(v) == batch for v in (*graph.input, *graph.output)):
        return None                   # a shape constant read by another node too
    free = onnx.ModelProto()
    free.CopyFrom(model)
    for v in (*free.graph.input, *free.graph.output):
        dim = v.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = "rows"
    del free.graph.value_info[:]
    for init in free.graph.initializer:
        if init.name in shapes and shapes[init.name][0] == batch:
            entries = np.array([0] + shapes[init.name][1:], np.int64)
            init.CopyFrom(numpy_helper.from_array(entries, init.name))
    return free


def _first_dim(value: onnx.ValueInfoProto):
    if not value.type.HasField("tensor_type"):
        return None
    dims = value.type.tensor_type.shape.dim
    if not dims or not dims[0].HasField("dim_value"):
        return None
    return dims[0].dim_value


def _row_wise(node: onnx.NodeProto) -> bool:
    if node.op_type in ROW_WISE:
        return True
    if node.op_type in _AXIS_DEFAULT:
        axis = _AXIS_DEFAULT[node.op_type]      # Softmax's: 1, or -1 from opset 13
        for a in node.attribute:
            if a.name == "axis":
                axis = a.i
        # a negative axis is the batch's only on a rank-1 value (the first answer's
        # comparison with the batch-by-batch one would catch it)
        return axis != 0
    return False


def _identical(a: dict, b: dict) -> bool:
    return all(isinstance(a[k], np.ndarray) and a[k].shape == b[k].shape
               and a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in b)

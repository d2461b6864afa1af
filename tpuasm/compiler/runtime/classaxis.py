"""Which axis of a float output holds classes: how the check against the float model
(validate.py) and the calibration search (calibsearch.py) judge an output.

An output whose values are scores of classes is judged by top-1 agreement: the arg-max
along its class axis, compared at every other position (each row of a classifier, each
step of a sequence recogniser's (T, N, classes) or (N, T, classes) output).  SNR alone
misses what matters there: ddddocr's captcha recogniser passed the 20 dB bar while its
best class agreed at 97.8 % of the steps and its CTC-decoded lines changed.  Taking "the last axis" for every rank-3 output is wrong as often:
YOLOv8's (N, 4 + classes, anchors) output would be judged by the arg-max over its anchors.

The rule, from the graph first and then the data:

1. the user's `--class-axis OUTPUT=AXIS|none`;
2. a rank-2 output of two or more columns: its columns (a classifier's (rows, classes));
3. a higher-rank output whose values come, through nodes that keep each position's class
   scores where they are (Identity, Cast, Dropout, Transpose, Squeeze, Unsqueeze, a Reshape
   that keeps the last axis, arithmetic with a constant), from
   - a Softmax, LogSoftmax or Hardmax over one axis (a softmax decomposed as
     Exp / ReduceSum(Exp) too), or
   - a tensor an ArgMax / ArgMin of the graph reads (the model picks its classes there), or
   - a classifier head: a Gemm or MatMul with constant weights (its columns the classes);
   the data must then have two or more entries on that axis, as many as the graph says
   where it says (a Reshape on the way is checked that way).  A head is the weakest of
   these signs (a regression's or an embedding's last layer is a MatMul too): an output
   judged by top-1 for that reason alone keeps its SNR bar as well;
4. anything else (a Concat of boxes and scores, a Sigmoid, an LSTM's state): SNR only.

The rule's result names its reason, which the report prints next to the figure."""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.prepare import _attr


@dataclass(frozen=True)
class ClassAxis:
    """What the graph (or the user) says of one output's classes.  `axis` counts from the
    end (-1: the last), None when there is no class axis; `classes` their number when the
    graph knows it; `why` the report's words."""
    axis: int | None
    why: str
    classes: int | None = None
    given: bool = False              # the user's --class-axis: counted as given, any rank
    snr_too: bool = False            # only a classifier head says so: SNR is a bar too
    # `axis` counts from the start: an ArgMax's axis on a tensor whose rank shape inference
    # does not know (after an ai.onnx.ml node, which onnx cannot infer through)
    from_start: bool = False


_MAX_PATH = 64                      # nodes walked back from an output before giving up
_SOFTMAX = {"Softmax", "LogSoftmax", "Hardmax"}
_PICKERS = {"ArgMax", "ArgMin"}
_SAME_PLACE = {"Identity", "Cast", "Dropout"}
_WITH_CONSTANT = {"Add", "Sub", "Mul", "Div"}


def parse_class_axes(items) -> dict[str, int | None]:
    """`--class-axis NAME=AXIS|none` strings (or a dict) -> {output: axis or None}."""
    from tpuasm.compiler.front.batch import parse_named_axes
    axes = parse_named_axes(items, "--class-axis", "OUTPUT")
    for name, axis in axes.items():
        if axis is not None and not -16 <= axis < 16:
            raise CompileError(f"--class-axis {name}={axis}: AXIS out of range [-16, 15]")
    return axes


def class_axes(model, given: dict | None = None) -> dict[str, ClassAxis]:
    """{output: ClassAxis} of a float model (a ModelProto or its bytes), the user's `given`
    ({output: axis or None}) first.  An output `given` names that the model has not is an
    error."""
    import onnx
    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_model_from_string(bytes(model))
    outputs = [o.name for o in model.graph.output]
    unknown = [n for n in (given or {}) if n not in outputs]
    if unknown:
        raise CompileError(f"--class-axis names no output of the model: {', '.join(unknown)} "
                           f"(its outputs: {', '.join(outputs)})")
    graph = _Graph(model)
    found = {}
    for name in outputs:
        if name in (given or {}):
            axis = given[name]
            found[name] = ClassAxis(axis, "--class-axis" if axis is not None
                                    else "--class-axis none", given=True)
        else:
            found[name] = graph.class_axis(name)
    return found


def judged_axis(rule: ClassAxis | None, shape: tuple) -> tuple[int | None, str, bool]:
    """The axis (counted from 0) of an output of `shape` that its top-1 agreement is taken
    over, or None (SNR only); why, for the report; whether its SNR is held to the bar too
    (ClassAxis.snr_too)."""
    ndim = len(shape)
    if rule is not None and rule.given:
        if rule.axis is None:
            return None, "SNR only: --class-axis none", True
        if not -ndim <= rule.axis < ndim:
            return None, f"SNR only: --class-axis {rule.axis} is outside its {ndim} axes", True
        return rule.axis % ndim, f"classes on axis {rule.axis % ndim}: --class-axis", False
    if rule is not None and rule.from_start and rule.axis is not None:
        rule = ClassAxis(rule.axis - ndim, rule.why, rule.classes, snr_too=rule.snr_too)
    if ndim == 2:
        if shape[1] < 2:
            return None, "SNR only: one column", True
        if rule is not None and rule.axis is not None and rule.axis % 2 == 1:
            return 1, f"a (rows, classes) output: {rule.why}", False
        # no sign of classes in the graph (an embedding's rows look the same): judged as a
        # classifier's all the same, and the user told how to say otherwise
        return 1, ("a (rows, columns) output taken as a classifier's (no Softmax, ArgMax or "
                   "classifier head before it; --class-axis NAME=none for SNR only)"), False
    if rule is None or rule.axis is None or ndim < 2:
        return None, "SNR only: " + (rule.why if rule is not None else "no class axis known"), \
            True
    axis = ndim + rule.axis
    if axis < 0:
        return None, f"SNR only: {rule.why}, but the output has {ndim} axes", True
    if shape[axis] < 2 or (rule.classes is not None and shape[axis] != rule.classes):
        want = f"{rule.classes}" if rule.classes is not None else "two or more"
        return None, (f"SNR only: {rule.why}, but its axis {axis} has {shape[axis]} entries, "
                      f"not {want}"), True
    return axis, f"classes on axis {axis}: {rule.why}" + (
        "; its SNR held to the bar too" if rule.snr_too else ""), rule.snr_too


# --- the classes' axis the search judges by --------------------------------------------
# calibsearch.py scores each QDQ model it tries by compare(); the float model's rule is
# worked out once per search (a parse of the whole model) and read by every score there.
_SEARCH_AXES: ContextVar[dict | None] = ContextVar("class_axes", default=None)


@contextmanager
def judging(axes: dict | None):
    """Within: searched_axes() gives `axes` ({output: ClassAxis})."""
    token = _SEARCH_AXES.set(axes)
    try:
        yield
    finally:
        _SEARCH_AXES.reset(token)


def searched_axes() -> dict | None:
    return _SEARCH_AXES.get()


class _Graph:
    """The float model's producers, consumers and constants, for the rule above."""

    def __init__(self, model):
        from tpuasm.compiler.front.prepare import _Index
        idx = _Index(model)
        self.model = model
        self.producer, self.consumers, self.opset = idx.producer, idx.consumers, idx.opset
        self.inits = idx.inits
        self._ranks = None

    # constants: initializers and Constant nodes
    def is_constant(self, name: str) -> bool:
        node = self.producer.get(name)
        return name in self.inits or (node is not None and node.op_type == "Constant")

    def _constant(self, name: str) -> np.ndarray | None:
        from tpuasm.compiler.front.prepare import _constant_value
        node = self.producer.get(name) if name else None
        return None if node is None else _constant_value(node)

    def constant_shape(self, name: str) -> tuple | None:
        if name in self.inits:
            return tuple(self.inits[name].dims)
        value = self._constant(name)
        return None if value is None else value.shape

    def ints(self, name: str) -> list[int] | None:
        """A small integer constant's values (axes), or None."""
        from onnx import numpy_helper
        t = self.inits.get(name) if name else None
        if t is not None and np.prod(t.dims, dtype=np.int64) <= 64:
            value = numpy_helper.to_array(t)
        else:
            value = self._constant(name)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]

    def rank(self, tensor: str) -> int | None:
        """From onnx shape inference (on the weightless model), when it knows."""
        if self._ranks is None:
            from tpuasm.compiler.front.prepare import _ranks
            self._ranks = _ranks(self.model)
        dims = self._ranks.get(tensor)
        return None if dims is None else len(dims)

    def dim(self, tensor: str, axis: int) -> int | None:
        if self.rank(tensor) is None:
            return None
        dims = self._ranks[tensor]
        value = dims[axis] if -len(dims) <= axis < len(dims) else None
        return value if isinstance(value, int) and value > 0 else None

    # the walk
    def class_axis(self, output: str) -> ClassAxis:
        path = []                        # nodes between the source and the output, last first
        tensor = output
        for _ in range(_MAX_PATH):
            picker = next((c for c in self.consumers.get(tensor, [])
                           if c.op_type in _PICKERS), None)
            if picker is not None:
                given = _attr(picker, "axis", 0)
                axis = self._from_end(tensor, given)
                why = f"{picker.op_type} '{picker.name}' of the graph reads it over that axis"
                if axis is None and not path and given >= 0:    # the data tells its rank
                    return ClassAxis(given, why, from_start=True)
                found = ClassAxis(axis, why,
                                  self.dim(tensor, axis) if axis is not None else None)
                return self._forward(found, path)
            node = self.producer.get(tensor)
            if node is None:
                return ClassAxis(None, "it is a graph input or a constant")
            source = self._source(node)
            if source is not None:
                return self._forward(source, path)
            data = self._data_input(node)
            if data is None:
                return ClassAxis(None, f"made by {node.op_type} '{node.name}', not by a "
                                       f"Softmax, a classifier head or an ArgMax's input")
            path.append(node)
            tensor = data
        return ClassAxis(None, "no Softmax, classifier head or ArgMax near it")

    def _source(self, node) -> ClassAxis | None:
        """The class axis a node makes: a softmax's, a classifier head's."""
        op = node.op_type
        if op in _SOFTMAX:
            given = _attr(node, "axis", -1 if self.opset >= 13 else 1)
            axis = self._from_end(node.output[0], given)
            if axis is None or (self.opset < 13 and axis != -1):
                # opset < 13 normalises over every axis from `axis` on
                return ClassAxis(None, f"made by {op} '{node.name}' over axis {given} of a "
                                       f"tensor of unknown rank" if axis is None else
                                 f"made by {op} '{node.name}' over all axes from {given} on")
            return ClassAxis(axis, f"made by {op} '{node.name}' over that axis",
                             self.dim(node.output[0], axis))
        if op == "Div" and len(node.input) == 2:
            exp, total = (self.producer.get(t) for t in node.input)
            if exp is not None and total is not None and exp.op_type == "Exp" and \
                    total.op_type == "ReduceSum" and total.input[0] == exp.output[0]:
                axes = _attr(total, "axes") or self.ints(total.input[1]
                                                         if len(total.input) > 1 else "")
                if axes is not None and len(axes) == 1:
                    axis = self._from_end(node.output[0], axes[0])
                    if axis is not None:
                        return ClassAxis(axis, f"a softmax (Exp '{exp.name}' / ReduceSum "
                                               f"'{total.name}') over that axis",
                                         self.dim(node.output[0], axis))
            return None
        if op in ("Gemm", "MatMul") and len(node.input) >= 2 and self.is_constant(node.input[1]):
            w = self.constant_shape(node.input[1])
            if not w or (op == "Gemm" and len(w) != 2):
                return None
            columns = w[0] if op == "Gemm" and _attr(node, "transB", 0) else w[-1]
            return ClassAxis(-1, f"the classifier head {op} '{node.name}' makes it "
                                 f"({columns} columns)", int(columns), snr_too=True)
        return None

    def _data_input(self, node) -> str | None:
        """The input whose class scores a node keeps in place (see the module doc), or
        None: the walk stops there."""
        op = node.op_type
        if not node.input:
            return None
        if op in _SAME_PLACE or op in ("Transpose", "Squeeze", "Unsqueeze", "Reshape",
                                       "Flatten"):
            return node.input[0]
        if op in _WITH_CONSTANT and len(node.input) == 2:
            a, b = node.input
            if self.is_constant(b) and not self.is_constant(a):
                return a
            if self.is_constant(a) and not self.is_constant(b) and op in ("Add", "Mul"):
                return b
        return None

    def _from_end(self, tensor: str, axis: int) -> int | None:
        if axis < 0:
            return axis
        rank = self.rank(tensor)
        return None if rank is None or axis >= rank else axis - rank

    def _forward(self, found: ClassAxis, path: list) -> ClassAxis:
        """`found` (at the walk's source) carried through `path` to the output."""
        axis = found.axis
        if axis is None:
            return found
        for node in reversed(path):
            axis = None if axis is None else self._through(node, axis, found.classes)
            if axis is None:
                return ClassAxis(None, f"{found.why}, but {node.op_type} '{node.name}' "
                                       f"moves that axis")
        return ClassAxis(axis, found.why, found.classes, snr_too=found.snr_too)

    def _through(self, node, axis: int, classes: int | None) -> int | None:
        """Where the axis `axis` (from the end) of node's data input is in its output."""
        op = node.op_type
        if op in _SAME_PLACE or op in _WITH_CONSTANT:
            return axis                  # broadcasting only adds leading axes
        if op in ("Reshape", "Flatten"):
            # the last axis survives when the data shows it whole (judged_axis checks
            # its size against `classes`)
            return -1 if axis == -1 and classes is not None else None
        rank = self.rank(node.input[0])
        if op == "Transpose":
            perm = _attr(node, "perm")
            rank = len(perm) if perm else rank
            if rank is None:
                return None
            perm = list(perm) if perm else list(range(rank))[::-1]
            return perm.index(rank + axis) - rank if rank + axis in perm else None
        if op in ("Squeeze", "Unsqueeze"):
            axes = _attr(node, "axes")
            if axes is None and len(node.input) > 1:
                axes = self.ints(node.input[1])
            if axes is None or rank is None:
                return None
            position = rank + axis
            if op == "Squeeze":
                gone = {a % rank for a in axes}
                if position in gone:
                    return None
                return position - sum(1 for a in gone if a < position) - (rank - len(gone))
            out_rank = rank + len(axes)
            added = sorted(a % out_rank for a in axes)
            for a in added:                # inserted in increasing order
                if a <= position:
                    position += 1
            return position - out_rank
        return None


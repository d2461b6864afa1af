"""Which axis of each tensor is the batch.

Exported models are not all batch-first: a sequence-first input (S, N, F) has its batch on
axis 1, a recurrent state of fixed shape (1, 1, 128) has none (it is passed whole to every
batch).  The rules, per model input (the user's `--batch-axis NAME=AXIS|none` first):

- exactly one dynamic dimension: that one is the batch axis;
- several dynamic dimensions: the one named like a dynamic dimension of another input (the
  'batch' of an input (batch, sequence) and of a state (2, batch, 128)), else the first;
  the others are fixed from the calibration data (free_dims: a float model's sequence
  length becomes the calibration data's, and inference data must then have it), an error
  without calibration data;
- when the rows along the batch axes run along a recurrent node's sequence axis (a
  sequence-first model (S, F) whose LSTM recurs across S; recurrent_time tells by running
  the float model on two slices of the calibration data), they are no batch: every input
  is passed whole, its dynamic dimensions fixed from the data;
- every dimension fixed: no batch axis when another input has a dynamic one; when none has
  (a model exported with a fixed batch), axis 0 as before: the model's own batch, unless
  an output's first dimension is not that batch (a Split or a reduction across axis 0) or,
  then the inputs are passed whole, the model run as one sample; in a model with a
  recurrent node whose inputs differ in their first dimension (an input (1, 576) and its
  LSTM's state (2, 1, 128)), the first input's first dimension is the batch and a state
  (dirs, batch, H) has it on axis 1.

The axis of every other tensor is read off onnx shape inference: each input's batch
dimension becomes one symbolic name and a tensor's batch axis is the axis that carries it
(None when its shape is known and none does: a constant, a state passed whole).  Where the
symbol is lost (an operator onnx does not know), the shapes at two batch sizes tell.  Axes
found before the batch is folded into constants are carried to the quantized model
(carry_axes); a model exported with a fixed batch keeps the batch-first convention
(has_fixed_batch, Graph.not_batch_first).
"""
from __future__ import annotations

import math

import onnx

from tpuasm.compiler.errors import CompileError
from tpuasm.limits import MAX_GIVEN_SAMPLE_ELEMENTS

SYMBOL = "tpuasm_batch"
_PROBES = (7, 11)                  # two batch sizes no fixed dimension is likely to equal


def _dims(value_info) -> list:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in shape.dim]


def _dynamic(d) -> bool:
    return not (isinstance(d, int) and d > 0)


def parse_batch_axes(items) -> dict[str, int | None]:
    """`--batch-axis NAME=AXIS|none` strings (or a dict) -> {input: axis or None}."""
    return parse_named_axes(items, "--batch-axis", "NAME")


def parse_named_axes(items, option: str, name_word: str) -> dict[str, int | None]:
    """`NAME=AXIS|none` strings of `option` (or a dict) -> {name: axis or None}."""
    if items is None:
        return {}
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            name, sep, value = str(item).rpartition("=")
            if not sep or not name:
                raise CompileError(f"{option} {item!r}: expected {name_word}=AXIS "
                                   f"(AXIS an integer or 'none')")
            pairs.append((name, value.strip()))
    axes = {}
    for name, value in pairs:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            axes[name] = None
            continue
        try:
            if isinstance(value, bool) or isinstance(value, float):
                raise ValueError
            axes[name] = int(value)
        except (TypeError, ValueError):
            raise CompileError(f"{option} {name}={value!r}: AXIS must be an integer or "
                               f"'none'") from None
    return axes


def parse_input_shapes(items) -> dict[str, list]:
    """`NAME=D0,D1,...` strings of --input-shape (or a dict of sequences) -> {input: dims},
    each dimension a positive integer, or a name (the batch, `N`) that stays dynamic."""
    if not items:
        return {}
    pairs = list(items.items()) if isinstance(items, dict) else []
    for item in [] if isinstance(items, dict) else items:
        name, sep, value = str(item).rpartition("=")
        if not sep or not name or not value.strip():
            raise CompileError(f"--input-shape {item!r}: expected NAME=D0,D1,... (each "
                               f"dimension a positive integer, or a name such as N for "
                               f"the batch)")
        pairs.append((name, value.split(",")))
    shapes = {}
    for name, dims in pairs:
        parsed = []
        for axis, d in enumerate(dims):
            text = str(d).strip()
            if text.lstrip("-").isdigit():
                if int(text) <= 0:
                    raise CompileError(f"--input-shape {name}: dimension {axis}'s size "
                                       f"{text} is not positive")
                parsed.append(int(text))
            elif text.isidentifier():
                parsed.append(text)
            else:
                raise CompileError(f"--input-shape {name}: dimension {axis}, {text!r}, is "
                                   f"neither a positive integer nor a name")
        elements = math.prod(d for d in parsed if isinstance(d, int))
        if elements > MAX_GIVEN_SAMPLE_ELEMENTS:
            raise CompileError(f"--input-shape {name}: {elements:,} values a sample, more "
                               f"than {MAX_GIVEN_SAMPLE_ELEMENTS:,}")
        shapes[name] = parsed
    return shapes


def named_inputs(model: onnx.ModelProto, names, option: str, path) -> dict:
    """{name: ValueInfo} of the model's graph inputs (its weights not among them); one
    error naming `option` when `names` holds one the model does not have."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {v.name: v for v in model.graph.input if v.name not in inits}
    unknown = [n for n in names if n not in inputs]
    if unknown:
        raise CompileError(f"{path}: {option} names no input of the model: "
                           f"{', '.join(unknown)} (its inputs: {', '.join(inputs)})")
    return inputs


def fix_input_shapes(model: onnx.ModelProto, shapes: dict, path) -> None:
    """Each input `shapes` names given those dimensions, in place: an integer fixes a
    dynamic one (a QDQ model's sequence length, which no calibration data fixes), a name
    keeps one dynamic (the batch); a fixed dimension given another size, a rank that does
    not match, or sizes the model's weights do not allow are errors."""
    if not shapes:
        return
    inputs = named_inputs(model, shapes, "--input-shape", path)
    fixed: dict[str, dict[int, int]] = {}
    for name, want in shapes.items():
        v = inputs[name]
        if not v.type.HasField("tensor_type"):
            raise CompileError(f"{path}: --input-shape {name}: the input is not a tensor")
        dims = v.type.tensor_type.shape.dim
        if len(dims) != len(want):
            raise CompileError(f"{path}: --input-shape {name}: {len(want)} dimensions given, "
                               f"the input has {len(dims)} {_dims(v)}")
        for axis, (dim, size) in enumerate(zip(dims, want)):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                if dim.dim_value != size:
                    raise CompileError(f"{path}: --input-shape {name}: dimension {axis} is "
                                       f"fixed to {dim.dim_value} in the model, not {size}")
                continue
            if isinstance(size, int):
                dim.Clear()
                dim.dim_value = size
                fixed.setdefault(name, {})[axis] = size
            elif not dim.HasField("dim_param"):
                dim.dim_param = size
    if fixed:
        _check_fixed_dims(model, fixed, path, "given by --input-shape")


def input_axes(model: onnx.ModelProto, given: dict | None, path, free: dict | None = None
               ) -> dict[str, int | None]:
    """Every graph input's batch axis (None: passed whole), by the rules above.  `free`: a
    dict that receives {input: [axis, ...]}, the dynamic dimensions that are not the batch
    (to be fixed from data, fix_free_dims); without it they are an error."""
    given = dict(given or {})
    inputs = list(named_inputs(model, given, "--batch-axis", path).values())
    names = [v.name for v in inputs]
    axes: dict[str, int | None] = {}
    pending = []
    for v in inputs:
        if not v.type.HasField("tensor_type"):
            raise CompileError(f"{path}: input '{v.name}' is not a tensor")
        dims = _dims(v)
        dynamic = [i for i, d in enumerate(dims) if _dynamic(d)]
        if v.name in given:
            axis = given[v.name]
            if axis is not None:
                if not -len(dims) <= axis < len(dims):
                    raise CompileError(f"{path}: --batch-axis {v.name}={axis}: the input has "
                                       f"{len(dims)} dimensions {dims}")
                axis %= len(dims)
        elif dynamic:
            axis = _shared_dim(v, dynamic, inputs)
        else:
            pending.append(v.name)
            continue
        for i in dynamic:
            if i != axis and dims[i] == 0:
                # dim_value 0 is a fixed size of nothing, not an unknown one
                raise CompileError(f"{path}: input '{v.name}' has a 0-sized dimension "
                                   f"(dimension {i} of {dims}): a tensor of no values "
                                   f"cannot be compiled; export the model with its real "
                                   f"shape")
            if i != axis and free is not None:
                free.setdefault(v.name, []).append(i)
            elif i != axis:
                raise CompileError(f"{path}: input '{v.name}' dimension {i} is dynamic "
                                   f"({dims[i]!r}): only the batch dimension may be; give "
                                   f"its size (--input-shape {v.name}=D0,D1,..., N for the "
                                   f"batch), give calibration data that fixes it (a float "
                                   f"model), or name its batch axis: --batch-axis "
                                   f"{v.name}=AXIS")
        axes[v.name] = axis
    batched = any(a is not None for a in axes.values())
    if pending and not batched and not _same_first_dimension(inputs) and \
            _has_recurrent(model.graph):
        axes.update(_state_axes([v for v in inputs if v.name in pending]))
        return {n: axes[n] for n in names}
    first = bool(pending) and not batched and _outputs_keep_first_dimension(model, inputs)
    for v in inputs:
        if v.name in pending:
            axes[v.name] = None if batched or not _dims(v) or not first else 0
    return {n: axes[n] for n in names}


def batch_fixed_at_one(model: onnx.ModelProto, axes: dict, data: dict,
                       given: dict | None) -> list[str]:
    """The inputs whose exporter fixed the batch at 1 while another dimension is dynamic
    (ddddocr's (1, 1, 64, image_width)): input_axes took the dynamic one for the batch, but
    the data has many rows on axis 0 and the model's other fixed sizes elsewhere, which only
    a batch on axis 0 explains.  Not for an axis the user named."""
    found = []
    for v in model.graph.input:
        x = data.get(v.name)
        axis = axes.get(v.name)
        dims = _dims(v)
        if v.name in (given or {}) or axis in (None, 0) or x is None \
                or getattr(x, "ndim", None) != len(dims) or dims[0] != 1 or x.shape[0] <= 1:
            continue
        if all(_dynamic(d) or d == n for d, n in zip(dims[1:], x.shape[1:])):
            found.append(v.name)
    return found


def _state_axes(inputs) -> dict[str, int | None]:
    """A fixed-shape model with a recurrent node whose inputs differ in their first
    dimension: the batch B is the first input's first dimension; a recurrent state (dirs,
    B, H) has its batch on axis 1, an input (B, ...) on axis 0, any other is passed whole
    (Silero's OpenVINO export: input (1, 576), state (2, 1, 128))."""
    batch = _dims(inputs[0])[0] if _dims(inputs[0]) else None
    axes = {}
    for v in inputs:
        dims = _dims(v)
        if dims and dims[0] == batch:
            axes[v.name] = 0
        elif len(dims) == 3 and dims[1] == batch:
            axes[v.name] = 1
        else:
            axes[v.name] = None
    return axes


def _shared_dim(v, dynamic: list[int], inputs) -> int:
    """Of an input's dynamic dimensions, the one whose name another input's dynamic
    dimension has (exporters name the batch alike everywhere), else the first."""
    dims = _dims(v)
    others = {d for u in inputs if u.name != v.name for d in _dims(u)
              if isinstance(d, str) and d}
    named = [i for i in dynamic if isinstance(dims[i], str) and dims[i] in others]
    return named[0] if len(named) == 1 else dynamic[0]


def _same_first_dimension(inputs) -> bool:
    """Whether every input of a fixed-shape model has the same first dimension (a batch
    they share); a state (2, 1, 128) beside an input (1, 576) has not."""
    return len({_dims(v)[0] for v in inputs if _dims(v)}) <= 1


def _has_recurrent(graph: onnx.GraphProto) -> bool:
    """Whether an LSTM/GRU/RNN is in the graph or a subgraph (its state inputs are (dirs,
    batch, H): not batch-first)."""
    for node in graph.node:
        if node.op_type in _RECURRENT:
            return True
        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            if any(_has_recurrent(sub) for sub in subs):
                return True
    return False


def fix_free_dims(model: onnx.ModelProto, free: dict[str, list[int]], data: dict, path
                  ) -> dict[str, dict[int, int]]:
    """Set each free dynamic dimension of an input (input_axes) to the size it has in
    `data` ({input: array}), in place: {input: {axis: size}}.  An input the data does not
    have, or has with another rank, is left for the samples' check to name."""
    fixed: dict[str, dict[int, int]] = {}
    for v in model.graph.input:
        axes = free.get(v.name)
        x = data.get(v.name) if axes else None
        if x is None or getattr(x, "ndim", None) != len(v.type.tensor_type.shape.dim):
            continue
        for axis in axes:
            size = int(x.shape[axis])
            if size <= 0:
                raise CompileError(f"{path}: the data for '{v.name}' has 0 elements along "
                                   f"its dynamic dimension {axis}")
            dim = v.type.tensor_type.shape.dim[axis]
            dim.Clear()
            dim.dim_value = size
            fixed.setdefault(v.name, {})[axis] = size
    if fixed:
        _check_fixed_dims(model, fixed, path)
    return fixed


def _check_fixed_dims(model: onnx.ModelProto, fixed: dict, path,
                      whence: str = "fixed from the data") -> None:
    """The sizes taken from the data must fit the model (its weights fix what a dynamic
    dimension can be): strict shape inference says so before anything runs."""
    from tpuasm.compiler.front.reader import skeleton
    probe = skeleton(model)
    forget_inner_shapes(probe.graph)
    del probe.graph.value_info[:]
    try:
        onnx.shape_inference.infer_shapes(probe, strict_mode=True, data_prop=True)
    except Exception as e:
        what = ", ".join(f"'{name}' dimension {axis} = {size}" for name, axes in fixed.items()
                         for axis, size in axes.items())
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CompileError(f"{path}: the dynamic dimensions {whence} ({what}) do not fit "
                           f"the model: {first}") from None


_RECURRENT = ("LSTM", "GRU", "RNN")


def recurrent_time(model: onnx.ModelProto, axes: dict, data: dict, base_dir) -> bool:
    """Whether the rows along the inputs' batch axes are the time of a recurrent node (its
    X's sequence axis grows with them): the float model run by onnxruntime on the first 2
    and the first 3 rows of `data` ({input: array}).  False when it cannot tell."""
    nodes = [n for n in model.graph.node if n.op_type in _RECURRENT]
    batched = {n: a for n, a in axes.items() if a is not None}
    if not nodes or not batched or any(n not in data or
                                       getattr(data[n], "ndim", 0) <= a or
                                       data[n].shape[a] < 3 for n, a in batched.items()):
        return False
    import numpy as np
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in probe.graph.initializer):
        try:
            onnx.load_external_data_for_model(probe, str(base_dir))
        except Exception:                      # unreadable weights: the compile will say
            return False
    del probe.graph.output[:]
    xs = [n.input[0] for n in nodes]
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(x) for x in xs)
    from tpuasm.compiler.ort import session
    try:
        run = session(probe)
        seen = []
        for rows in (2, 3):
            feeds = {n: (np.take(np.asarray(x), np.arange(rows), axis=batched[n])
                         if n in batched else np.asarray(x)) for n, x in data.items()
                     if n in axes}
            seen.append(run.run(xs, feeds))
    except Exception:                          # the model needs more rows: cannot tell
        return False
    for node, small, large in zip(nodes, *seen):
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        seq = 1 if layout else 0
        if small.ndim == 3 and large.ndim == 3 and (small.shape[seq], large.shape[seq]) \
                == (2, 3) and small.shape[1 - seq] == large.shape[1 - seq]:
            return True
    return False


def _outputs_keep_first_dimension(model: onnx.ModelProto, inputs) -> bool:
    """Whether a fixed-shape model's axis 0 can be its batch: every output whose shape onnx
    infers starts with an input's first dimension (unknown shapes do not object)."""
    firsts = {_dims(v)[0] for v in inputs if _dims(v)}
    from tpuasm.compiler.front.reader import skeleton
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton(model))
    except Exception:                   # onnx cannot tell: the convention as before
        return True
    for v in inferred.graph.output:
        if not v.type.HasField("tensor_type") or not v.type.tensor_type.HasField("shape"):
            continue
        dims = _dims(v)
        if not dims or (isinstance(dims[0], int) and dims[0] > 0 and dims[0] not in firsts):
            return False
    return True


def has_fixed_batch(model: onnx.ModelProto, given: dict | None, axes: dict | None = None
                    ) -> bool:
    """A model exported with a fixed batch (no input has a dynamic dimension, and the user
    named no axis): its batch is axis 0 by convention, and exporters bake it into constants
    (a Reshape to [1, -1]) where inference cannot follow it.  Not when an input's batch
    (`axes`, from input_axes) is on another axis (a recurrent state (2, 1, 128)): its
    tensors' axes are then inferred."""
    if given or any(a not in (0, None) for a in (axes or {}).values()):
        return False
    inits = {t.name for t in model.graph.initializer}
    return all(v.type.HasField("tensor_type") and not any(_dynamic(d) for d in _dims(v))
               for v in model.graph.input if v.name not in inits)


def tensor_axes(model: onnx.ModelProto, axes: dict[str, int | None], path=None
                ) -> dict[str, int | None]:
    """Tensor -> batch axis for every tensor whose axis shape inference can tell (the
    model's inputs always); `model` is not changed (its skeleton is).  With the model's
    `path`, tensors the symbol does not reach are probed at two batch sizes."""
    from tpuasm.compiler.front.reader import skeleton
    result = dict(axes)
    if not any(a is not None for a in axes.values()):
        return result
    probe = skeleton(model)
    forget_inner_shapes(probe.graph)
    for v in probe.graph.input:
        if v.name in axes and axes[v.name] is not None:
            dim = v.type.tensor_type.shape.dim[axes[v.name]]
            dim.Clear()
            dim.dim_param = SYMBOL
    for v in probe.graph.output:                 # declared fixed sizes would hide the symbol
        if v.type.HasField("tensor_type"):
            v.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, data_prop=True)
        values = list(inferred.graph.value_info) + list(inferred.graph.output)
    except Exception:                             # unknown to onnx: the fallback below
        values = []
    for v in values:
        if v.name in result or not v.type.HasField("tensor_type") or \
                not v.type.tensor_type.HasField("shape"):
            continue
        dims = _dims(v)
        carry = [i for i, d in enumerate(dims) if d == SYMBOL]
        if len(carry) == 1:
            result[v.name] = carry[0]
        elif not carry and all(isinstance(d, int) for d in dims):
            result[v.name] = None
    for t in model.graph.initializer:
        result.setdefault(t.name, None)
    if path is not None and any(o.name not in result for o in model.graph.output):
        _by_two_batches(model, axes, path, result)
    return result


def _by_two_batches(model: onnx.ModelProto, axes: dict, path, result: dict) -> None:
    """Where the symbol was lost (a contrib operator onnx does not know, a Reshape to a
    computed shape), the model's shapes at two batch sizes, from reader.infer_shapes (which
    asks onnxruntime about unknown operators): the batch axis is the one that changes."""
    from tpuasm.compiler.front.fold import fold_constants
    from tpuasm.compiler.front.reader import fix_batch, infer_shapes, skeleton
    seen = []
    for size in _PROBES:
        copy = skeleton(model)                     # large weights only declared: no copy
        forget_inner_shapes(copy.graph)
        try:
            fix_batch(copy, size, path, axes=axes)
            fold_constants(copy, path)     # a Shape -> Cast -> Concat target made constant
            seen.append(infer_shapes(copy, path)[0])
        except Exception:                          # left unknown: the runtime's default
            return
    small, large = seen
    for name, shape in small.items():
        other = large.get(name)
        if name in result or other is None or len(other) != len(shape):
            continue
        moved = [i for i, (a, b) in enumerate(zip(shape, other)) if a != b]
        if not moved:
            result[name] = None
        elif len(moved) == 1 and (shape[moved[0]], other[moved[0]]) == _PROBES:
            result[name] = moved[0]           # else the batch is mixed into a dimension


def forget_inner_shapes(graph: onnx.GraphProto) -> None:
    """Subgraphs (If/Loop/Scan bodies) as shape inference will redo them: their declared
    shapes, written at one batch size (onnxruntime's quantizer does), would hide the batch."""
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else \
                list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
            for sub in subs:
                del sub.value_info[:]
                for v in sub.output:
                    if v.type.HasField("tensor_type"):
                        v.type.tensor_type.ClearField("shape")
                forget_inner_shapes(sub)


def carry_axes(model: onnx.ModelProto, known: dict, inferred: dict) -> dict:
    """Axes found on the model before its batch was folded into constants (a Reshape's
    target [B, -1] hides the batch from any later inference) carried over to its quantized
    form: the same tensor names, and across the quantizer's QuantizeLinear/DequantizeLinear
    nodes (it renames a node's output when it quantizes it: `y` becomes the DequantizeLinear
    of `y_QuantizeLinear_Output` of `y_QuantizeLinear_Input`), both ways."""
    result = dict(inferred)
    result.update(known)
    sure = set(known)
    glue = [(n.input[0], n.output[0]) for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input and n.output]
    changed = True
    while changed:
        changed = False
        for a, b in glue:
            for src, dst in ((a, b), (b, a)):
                if src in sure and dst not in sure:
                    result[dst] = result[src]
                    sure.add(dst)
                    changed = True
    return result

"""Samples a user gives the compiler (calibration sets) and a compiled model (inference data),
checked against the model's inputs: every input present, its shape the model's with any
number of rows along the input's batch axis, and its element type kept.

Integer and boolean inputs stay what they are (int32 token ids feed a Gather, bytes feed a
OneHot: onnxruntime refuses them as float32).  Float inputs take any numbers, cast to the
input's float type.  An input without a batch axis (a recurrent state of fixed shape) is
given whole, once, and passed unchanged to every batch."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.errors import CompileError


def input_types(model: onnx.ModelProto) -> dict[str, np.dtype]:
    """Graph inputs (not initializers) -> numpy element type (float32 where unknown)."""
    inits = {t.name for t in model.graph.initializer}
    types = {}
    for v in model.graph.input:
        if v.name in inits:
            continue
        try:
            types[v.name] = np.dtype(helper.tensor_dtype_to_np_dtype(
                v.type.tensor_type.elem_type))
        except (KeyError, TypeError, ValueError):
            types[v.name] = np.dtype(np.float32)
    return types


def _at(where) -> str:
    return f"{where}: " if where else ""


def full_dims(shape, axis: int | None) -> list:
    """A per-sample shape (batch axis removed) -> the full shape with None on the axis."""
    dims = list(shape)
    if axis is not None:
        dims.insert(axis, None)
    return dims


def _shape_text(dims: list, axis: int | None) -> str:
    """The shape an input wants: "rows" on its batch axis, a dynamic dimension by its name
    (a past state's length is not the rows), "any" for an unnamed one."""
    def text(i, d):
        if i == axis:
            return "rows"
        if isinstance(d, int) and d > 0:
            return str(d)
        return d if isinstance(d, str) and d else "any"
    items = [text(i, d) for i, d in enumerate(dims)]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def convert(x, dtype: np.dtype, name: str, where) -> np.ndarray:
    """`x` as the input's element type; floats for an integer input are an error unless
    they are whole numbers in range (no silent truncation)."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":                     # a string input (text pipelines)
        if x.dtype.kind not in "US" and not (x.dtype.kind == "O" and all(
                isinstance(v, str) for v in x.reshape(-1))):
            raise CompileError(f"{_at(where)}data for '{name}' has dtype {x.dtype}: "
                               f"expected strings")
        return x.astype(str)
    if x.dtype.kind not in "fiub":
        raise CompileError(f"{_at(where)}data for '{name}' has dtype {x.dtype}: expected "
                           f"numbers ({dtype})")
    if x.dtype == dtype:
        return x
    if dtype.kind in "iub":
        if dtype.kind == "b":
            ok = np.all((x == 0) | (x == 1))
        else:
            info = np.iinfo(dtype)
            ok = np.all(x == np.round(x)) and (x.size == 0 or (x.min() >= info.min and
                                                             x.max() <= info.max))
        if not ok:
            raise CompileError(f"{_at(where)}data for '{name}' has dtype {x.dtype} with values "
                               f"that are not {dtype}: the model's input '{name}' is {dtype}")
    return x.astype(dtype)


def check_feed(name: str, x, dims: list, axis: int | None, dtype, where
               ) -> tuple[np.ndarray, int | None]:
    """One input's data against the model's full dims (ints; None or a name where dynamic)
    with its batch axis: (the data in the input's type, its rows; None for a whole input)."""
    x = convert(x, dtype, name, where)
    want = [d if isinstance(d, int) and d > 0 else None for d in dims]
    if axis is not None:
        want[axis] = None
    fits = x.ndim == len(want) and all(w is None or w == s for w, s in zip(want, x.shape))
    if not fits:
        hint = ""
        if axis is not None and x.ndim == len(want) - 1 and \
                tuple(x.shape) == tuple(w for i, w in enumerate(want) if i != axis):
            hint = "; add the rows dimension"
        elif axis is None and x.ndim == len(want):
            # a model run whole (a sequence's frames): its TPU programs are built for rows
            # of exactly this shape (Segment.rows), whatever --batch says
            hint = ("; the input has no batch axis: it is given whole, in the shape fixed "
                    "when compiling (compile again with data of the shape you need)")
        raise CompileError(f"{_at(where)}input '{name}' has shape {tuple(x.shape)}, expected "
                           f"{_shape_text(dims, axis)}{hint}")
    return x, (None if axis is None else x.shape[axis])


def check_samples(data: dict, signature: dict, path, types: dict | None = None,
                  axes: dict | None = None) -> dict[str, np.ndarray]:
    """Calibration data {input: array} against the model's inputs (`signature`: name ->
    dims, `types`: name -> dtype, `axes`: name -> batch axis; default: batch first,
    float32): the arrays in the inputs' element types."""
    missing = [n for n in signature if n not in data]
    if missing:
        raise CompileError(f"{path}: no calibration data for input(s) {', '.join(missing)}")
    rows = None
    out = {}
    for name, dims in signature.items():
        axis = 0 if axes is None else axes.get(name, 0)
        dtype = (types or {}).get(name, np.float32)
        x, count = check_feed(name, data[name], dims, axis, dtype, path)
        if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
            raise CompileError(f"{path}: calibration data for '{name}' must be finite numbers")
        if count is not None:
            if count == 0 or (rows is not None and count != rows):
                have = f"'{name}' has {count}" + ("" if rows is None else
                                                  f", the inputs before it {rows}")
                raise CompileError(f"{path}: calibration inputs need the same, non-zero "
                                   f"number of rows along their batch axes ({have})")
            rows = count
        out[name] = x
    return out


def read_calibration(path, model, model_path, axes: dict | None = None
                     ) -> dict[str, np.ndarray]:
    """DATA.npy (one input) or DATA.npz (keyed by input name) -> {input: array}."""
    from tpuasm.compiler.front.arrays import read_named_arrays
    from tpuasm.compiler.front.reader import input_signature
    signature = input_signature(model)
    data = read_named_arrays(path, list(signature))
    return check_samples(data, signature, path, input_types(model), axes)


def check_data(infos, data: dict) -> tuple[dict[str, np.ndarray], int]:
    """Inference data against a compiled model's inputs (ValueInfo: name, per-sample shape,
    dtype, batch_axis): (the arrays in the inputs' types, the number of rows; 0 when no
    input has a batch axis)."""
    names = [i.name for i in infos]
    missing = [n for n in names if n not in data]
    if missing:
        raise CompileError(f"missing input(s) {', '.join(missing)} (the model's inputs: "
                           f"{', '.join(names)})")
    extra = sorted(set(data) - set(names))
    if extra:
        raise CompileError(f"unknown input(s) {', '.join(extra)} (the model's inputs: "
                           f"{', '.join(names)})")
    rows, out = None, {}
    for info in infos:
        axis = getattr(info, "batch_axis", 0)
        x, count = check_feed(info.name, data[info.name], full_dims(info.shape, axis), axis,
                              np.dtype(info.dtype), None)
        if count is not None:
            if rows is not None and count != rows:
                raise CompileError(f"inputs have different numbers of rows ({rows} and "
                                   f"{count}, '{info.name}' along axis {axis})")
            rows = count
        out[info.name] = x
    return out, rows or 0


def sample_rows(samples: dict[str, np.ndarray], axes: dict | None) -> int:
    """The number of rows of checked samples (1 when no input has a batch axis)."""
    for name, x in samples.items():
        axis = 0 if axes is None else axes.get(name, 0)
        if axis is not None:
            return x.shape[axis]
    return 1


def row_range(samples: dict[str, np.ndarray], axes: dict | None, start: int, stop: int
              ) -> dict[str, np.ndarray]:
    """Rows start:stop of every batched input (inputs without a batch axis whole)."""
    axes = axes or {}
    return {name: take_rows(x, axes.get(name, 0), start, stop) for name, x in samples.items()}


def take_rows(x: np.ndarray, axis: int | None, start: int, stop: int, size: int | None = None
              ) -> np.ndarray:
    """Rows start:stop of `x` along its batch axis (the whole array when it has none),
    padded to `size` rows by repeating its first rows (calibration: min/max unchanged) when
    given."""
    if axis is None:
        return x
    chunk = np.take(x, np.arange(start, min(stop, x.shape[axis])), axis=axis)
    if size is not None and chunk.shape[axis] < size:
        extra = np.take(x, np.arange(size - chunk.shape[axis]) % x.shape[axis], axis=axis)
        chunk = np.concatenate([chunk, extra], axis=axis)
    return chunk


def calibration_feeds(samples: dict[str, np.ndarray], signature: dict,
                      axes: dict | None = None, step: int = 64):
    """Feeds for the float model, in its own layout: batches of at most `step` rows along
    each input's batch axis (exactly the model's batch when it is fixed), whole inputs
    whole in every feed."""
    axes = axes or {}
    rows = sample_rows(samples, axes)
    fixed = {}
    for name, dims in signature.items():
        axis = axes.get(name, 0)
        if axis is not None and isinstance(dims[axis], int) and dims[axis] > 0:
            fixed[name] = dims[axis]
    step = min(fixed.values()) if fixed else min(rows, step)
    for start in range(0, rows, step):
        yield {name: take_rows(x, axes.get(name, 0), start, start + step,
                               fixed.get(name))
               for name, x in samples.items()}

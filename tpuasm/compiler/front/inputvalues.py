"""`--input-value NAME=VALUE`: a model input fixed to one value when compiling.

A model for several configurations takes the configuration as an input (Silero's VAD: an
int64 scalar `sr`, 8000 or 16000) and branches on it with an If.  The compiler cannot see
through the If while `sr` may change; fixed, the input becomes an initializer, the If's
condition folds and the taken branch is inlined (fold.py, ifs.py), so its Convs and LSTM
reach the TPU.  The compiled model then has no such input: the value is part of it."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.errors import CompileError

MAX_INPUT_VALUE_ELEMENTS = 1 << 16    # a configuration value, not a data set


def parse_input_values(items) -> dict[str, list[float]]:
    """`NAME=V[,V...]` strings (or a dict NAME -> value) -> {input: list of numbers}."""
    if not items:
        return {}
    pairs = list(items.items()) if isinstance(items, dict) else []
    if not isinstance(items, dict):
        for item in items:
            name, sep, value = str(item).partition("=")
            if not sep or not name or not value.strip():
                raise CompileError(f"--input-value {item!r}: expected NAME=VALUE "
                                   f"(VALUE a number, or numbers separated by commas)")
            pairs.append((name, value))
    out = {}
    for name, value in pairs:
        if isinstance(value, str):
            try:
                numbers = [float(v) for v in value.split(",")]
            except ValueError:
                raise CompileError(f"--input-value {name}={value!r}: VALUE must be a number "
                                   f"or numbers separated by commas") from None
        else:
            numbers = [float(v) for v in np.asarray(value).reshape(-1)]
        if len(numbers) > MAX_INPUT_VALUE_ELEMENTS:
            raise CompileError(f"--input-value {name}: {len(numbers)} values, at most "
                               f"{MAX_INPUT_VALUE_ELEMENTS}")
        if not all(np.isfinite(numbers)):
            raise CompileError(f"--input-value {name}: values must be finite numbers")
        out[name] = numbers
    return out


def fix_input_values(model: onnx.ModelProto, values: dict[str, list[float]], path
                     ) -> dict[str, np.ndarray]:
    """Turn each named input into an initializer of its declared type and (fixed) shape, in
    place; the arrays it was given."""
    if not values:
        return {}
    from tpuasm.compiler.front.batch import named_inputs
    inputs = named_inputs(model, values, "--input-value", path)
    if len(values) == len(inputs):
        raise CompileError(f"{path}: --input-value fixes every input of the model: nothing "
                           f"would be left to compute")
    fixed = {}
    for name, numbers in values.items():
        v = inputs[name]
        tt = v.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, TypeError, ValueError):
            raise CompileError(f"{path}: input '{name}' is not a numeric tensor: "
                               f"--input-value cannot fix it") from None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if any(d is None for d in dims):
            shape = (len(numbers),) if dims else ()
            if len(dims) > 1 or (not dims and len(numbers) != 1):
                raise CompileError(f"{path}: input '{name}' has a dynamic shape {dims}: "
                                   f"--input-value fixes inputs of a fixed shape only")
        else:
            shape = tuple(dims)
        if int(np.prod(shape, dtype=np.int64)) != len(numbers):
            raise CompileError(f"{path}: --input-value {name}: {len(numbers)} value(s) for an "
                               f"input of shape {tuple(dims)}")
        array = np.array(numbers, np.float64).reshape(shape)
        if dtype.kind in "iub":
            if not np.all(array == np.round(array)):
                raise CompileError(f"{path}: --input-value {name}: the input is {dtype}, "
                                   f"the values are not whole numbers")
            if dtype.kind != "b":
                info = np.iinfo(dtype)
                if array.min() < info.min or array.max() > info.max:
                    raise CompileError(f"{path}: --input-value {name}: values outside "
                                       f"{dtype}'s range")
        array = array.astype(dtype)
        model.graph.initializer.append(numpy_helper.from_array(array, name))
        model.graph.input.remove(v)
        fixed[name] = array
    return fixed


def drop_fixed(data: dict, fixed: dict[str, np.ndarray], where) -> dict:
    """Data for the model's inputs without the fixed ones: a fixed input the data holds
    must hold its value (the model was compiled for that value only)."""
    if not fixed or not isinstance(data, dict):
        return data
    out = dict(data)
    for name, value in fixed.items():
        if name not in out:
            continue
        given = np.asarray(out.pop(name))
        flat, want = given.reshape(-1), value.reshape(-1)
        same = given.dtype.kind in "fiub" and given.size > 0 and (
            np.array_equal(flat, want) or (want.size == 1 and np.all(flat == want[0])))
        if not same:
            raise CompileError(f"{where}: input '{name}' is {given.reshape(-1)[:4].tolist()} "
                               f"in the data, but the model is compiled with --input-value "
                               f"{name}={','.join(str(v) for v in value.reshape(-1))}")
    return out

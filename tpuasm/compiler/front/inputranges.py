"""`--input-range NAME=LO,HI`: the range of a quantized model's float input, declared.

onnxruntime's quantize_static quantizes only the operators it has a QDQ form for, so an
LSTM, GRU or RNN reading a float model input, or an Einsum over one, stays float.  The
compiler quantizes such nodes from bounds (qdqrecurrent.py), but a float input's range is
known from data only: its products over X stayed on the host (the PyTorch LSTM's QDQ
model: 66.7 % of its MACs on the TPU).  A user who knows the input's range (audio in
[-1, 1], features standardised to a few units) declares it, as TensorRT's per-tensor
dynamic ranges and onnxruntime's TensorQuantOverrides let one do: the input is then
quantized on a symmetric grid over it (int16 where the accumulators have room), and values
beyond it are clipped, as a calibrated range clips."""
from __future__ import annotations

import math

import onnx

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.scales import MASK_RANGE

_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
           onnx.TensorProto.BFLOAT16}


def parse_input_ranges(items) -> dict[str, tuple[float, float]]:
    """`NAME=LO,HI` strings (or a dict NAME -> (lo, hi)) -> {input: (lo, hi)}."""
    if not items:
        return {}
    pairs = list(items.items()) if isinstance(items, dict) else []
    for item in [] if isinstance(items, dict) else items:
        name, sep, value = str(item).rpartition("=")
        if not sep or not name:
            raise CompileError(f"--input-range {item!r}: expected NAME=LO,HI (two numbers, "
                               f"LO below HI)")
        pairs.append((name, value.split(",")))
    ranges = {}
    for name, bounds in pairs:
        try:
            lo, hi = (float(b) for b in bounds)
        except (TypeError, ValueError):
            raise CompileError(f"--input-range {name}: expected two numbers LO,HI, got "
                               f"{bounds!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > MASK_RANGE:
            raise CompileError(f"--input-range {name}: LO and HI must be finite numbers of "
                               f"magnitude at most {MASK_RANGE:g}")
        if not lo < hi:
            raise CompileError(f"--input-range {name}: LO ({lo:g}) must be below HI ({hi:g})")
        ranges[name] = (lo, hi)
    return ranges


def check_input_ranges(model: onnx.ModelProto, ranges: dict, path) -> None:
    """Each named input exists and is float."""
    if not ranges:
        return
    from tpuasm.compiler.front.batch import named_inputs
    inputs = named_inputs(model, ranges, "--input-range", path)
    for name in ranges:
        elem = inputs[name].type.tensor_type.elem_type
        if elem not in _FLOATS:
            raise CompileError(f"{path}: --input-range {name}: the input is "
                               f"{onnx.TensorProto.DataType.Name(elem).lower()}, not float "
                               f"(a range is for a float input the model does not quantize)")

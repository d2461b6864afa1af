"""Quantized tensors of widths the TPU does not have, read as ones of a width it has, with
the same real values.

- **4-bit weights** (quantize_static's `weight_type=QInt4` / `QUInt4`, onnxruntime's
  MatMulNBits QDQ form): a DequantizeLinear of an int4 / uint4 constant.  Every 4-bit value
  is an 8-bit one, so the constant is widened to int8 / uint8 beside the same scale and zero
  point: the TPU's 8-bit weights hold it exactly.
- **unsigned or asymmetric 8-bit weights** (`QUInt4`, `QUInt8`, an int4 zero point): the
  TPU's weights are symmetric.  A weight is rewritten as its W_q - z with zero point 0:
  int8 where those fit (always for 4-bit codes), else int16 (a uint8 weight with one zero
  point per tensor: the TPU's 16-bit weights, half rate), the same products either way.
- **uint16 activations and weights** (`activation_type=QUInt16`, the A16W8 form of
  Qualcomm's QNN tools): the TPU's 16-bit activations are signed (Activate writes int16).
  A uint16 q with zero point z is the int16 q - 32768 with zero point z - 32768: the
  same real value (q - z) x scale, the same rounding and the same saturation at both ends,
  so QuantizeLinear, DequantizeLinear and the layout nodes between them compute the same
  model.

A 4-bit activation (a QuantizeLinear to int4) saturates at 4 bits, which the TPU's
requantization cannot: it stays as it is, on the host."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.front.prepare import _attr

_FOUR_BIT = {onnx.TensorProto.INT4: np.int8, onnx.TensorProto.UINT4: np.uint8}
_QDQ = {"QuantizeLinear", "DequantizeLinear"}
# nodes that move a quantized tensor's values without reading them as numbers (MaxPool: a
# shift by a constant keeps the order)
_LAYOUT = {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "MaxPool",
           "Concat", "Split", "Slice", "Gather", "Expand", "Tile", "DepthToSpace",
           "SpaceToDepth"}
_SHIFT = 1 << 15


def integer_limits(dtype) -> tuple[int, int] | None:
    """(min, max) of an integer element type, 4-bit ones included; None for any other (a
    float8 QDQ tensor's)."""
    try:
        info = ml_dtypes.iinfo(np.dtype(dtype))
    except (TypeError, ValueError):
        return None
    return int(info.min), int(info.max)


def integer_reach(dtype, zero: int) -> int | None:
    """The largest |q - zero| a tensor of an integer element type holds (what it multiplies
    a weight by), or None for a type that is not an integer one."""
    limits = integer_limits(dtype)
    return None if limits is None else max(zero - limits[0], limits[1] - zero)


def widen_4bit_constants(model: onnx.ModelProto) -> int:
    """Rewrite (in place) every int4 / uint4 initializer that only DequantizeLinear nodes
    read as the int8 / uint8 one of the same values; the count."""
    if not any(t.data_type in _FOUR_BIT for t in model.graph.initializer):
        return 0
    readers = _readers(model)
    count = 0
    for t in model.graph.initializer:
        wide = _FOUR_BIT.get(t.data_type)
        read_by = {n.op_type for n in readers.get(t.name, [])}
        if wide is None or _external(t) or read_by - {"DequantizeLinear"}:
            continue
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(wide), t.name))
        count += 1
    return count


_MATRIX = {"Conv", "ConvTranspose", "MatMul", "Gemm"}      # their input 1 is the weight


def centred_weights(model: onnx.ModelProto) -> int:
    """Rewrite (in place) each 8-bit weight of a matrix node whose zero point is not 0, or
    that is unsigned, as W_q - z with zero point 0 (int8 where those fit, else int16); the
    count."""
    g = model.graph
    inits = {t.name: t for t in g.initializer if not _external(t)}
    # (read_model runs this on every model: a symmetric int8 weight is not even read)
    candidates = [n for n in g.node if n.op_type == "DequantizeLinear"
                  and n.input[0] in inits and _asymmetric(n, inits)
                  and not _attr(n, "block_size", 0)]
    if not candidates:
        return 0
    readers = _readers(model)
    count = 0
    for node in candidates:
        if not _is_a_weight(node, readers):
            continue
        weight = numpy_helper.to_array(inits[node.input[0]])
        if weight.ndim == 0:
            continue
        zero = numpy_helper.to_array(inits[node.input[2]]) if len(node.input) > 2 and \
            node.input[2] in inits else np.zeros((), weight.dtype)
        axis = _attr(node, "axis", 1) % weight.ndim
        shape = [1] * weight.ndim
        shape[axis] = -1
        if zero.size > 1 and zero.size != weight.shape[axis]:
            continue
        centred = weight.astype(np.int16) - zero.astype(np.int16).reshape(
            shape if zero.size > 1 else ())
        # int8 where the values fit (always for 4-bit codes), else int16: the TPU's 16-bit
        # weights hold any 8-bit W_q - z exactly (a uint8 weight of one zero point per
        # tensor, onnxruntime's U8U8 form, spans up to 255 either side)
        narrow = -128 <= centred.min(initial=0) and centred.max(initial=0) <= 127
        dtype = np.int8 if narrow else np.int16
        if not narrow and _default_opset(model) < 21:
            node.domain = "com.microsoft"       # an int16 DequantizeLinear at any opset
            if not any(o.domain == "com.microsoft" for o in model.opset_import):
                model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        name = f"{node.input[0]}_centred"
        g.initializer.append(numpy_helper.from_array(centred.astype(dtype), name))
        g.initializer.append(numpy_helper.from_array(np.zeros(zero.shape, dtype),
                                                     f"{name}_zero_point"))
        node.input[0] = name
        while len(node.input) < 3:
            node.input.append("")
        node.input[2] = f"{name}_zero_point"
        count += 1
    return count


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _is_a_weight(dq, readers) -> bool:
    return any(n.op_type in _MATRIX and len(n.input) > 1 and n.input[1] == dq.output[0]
               for n in readers.get(dq.output[0], []))


def _asymmetric(dq, inits: dict) -> bool:
    """An 8-bit constant of a DequantizeLinear that is unsigned, or of a zero point not 0."""
    data = inits[dq.input[0]].data_type
    if data == onnx.TensorProto.UINT8:
        return True
    if data != onnx.TensorProto.INT8:
        return False
    zero = inits.get(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    return zero is not None and bool(numpy_helper.to_array(zero).any())


def signed_16bit(model: onnx.ModelProto) -> int:
    """Rewrite (in place) a model's uint16 quantization as int16 (see the module's note);
    the count of initializers shifted.  A model where a uint16 tensor reaches anything but
    Q/DQ and layout nodes (a graph output, QLinear operators) is left as it is."""
    g = model.graph
    constants = {t.name: t for t in g.initializer if t.data_type == onnx.TensorProto.UINT16}
    if not constants or any(_external(t) for t in constants.values()):
        return 0
    readers = _readers(model)
    for name in constants:            # a Q/DQ's data (0) or zero point (2), nothing else
        for node in readers.get(name, []):
            if node.op_type not in _QDQ or any(x == name and i not in (0, 2)
                                               for i, x in enumerate(node.input)):
                return 0
    produced = {o for n in g.node if n.op_type == "QuantizeLinear" and len(n.input) > 2
                and n.input[2] in constants for o in n.output}
    wide = set(produced)
    for node in g.node:               # the layout nodes carry the uint16 values on
        if node.op_type in _LAYOUT and node.input and node.input[0] in wide:
            wide.update(node.output)
    boundary = {v.name for v in g.output} | {v.name for v in g.input}
    for name in wide:
        if name in boundary or any(n.op_type not in _QDQ | _LAYOUT
                                   for n in readers.get(name, [])):
            return 0
    for t in constants.values():
        shifted = numpy_helper.to_array(t).astype(np.int32) - _SHIFT
        t.CopyFrom(numpy_helper.from_array(shifted.astype(np.int16), t.name))
    kept = [v for v in g.value_info if v.name not in wide]   # their element type changed
    del g.value_info[:]
    g.value_info.extend(kept)
    return len(constants)


def _external(t: onnx.TensorProto) -> bool:
    """Weights in an external file are not read here (the reader never loads them)."""
    return t.data_location == onnx.TensorProto.EXTERNAL


def _readers(model: onnx.ModelProto) -> dict[str, list]:
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers

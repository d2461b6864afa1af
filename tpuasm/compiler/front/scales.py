"""Weight channels whose scale vanishes.

onnxruntime's quantizer gives a weight channel the scale max|w| / 127.  A channel that
training drove to (almost) zero -- Paddle's OCR models have weights near 1e-35 -- then gets a
scale near 1e-37, and its int32 bias, scaled by input scale x weight scale, a subnormal or zero
scale: onnxruntime runs that, but no requantization multiplier can express it, and the reader
refuses such a scale.  Such a channel computes zero to within float32's own rounding, so it is
rewritten here as the zero it is: int8 weights 0 with scale 1, and its bias requantized to the
new input scale x 1.  The QDQ model then says exactly what the TPU computes, and onnxruntime
on it remains the reference."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# A weight scale below this is a channel of zeros for any input scale float32 can hold
# together with it: the product with an input scale above 1e-8 stays a normal float32.
VANISHING_SCALE = 1e-30
# A range of this magnitude reaches no real data: an attention mask's float minimum (the
# quantizer's range of scores + mask, a range declared with --input-range)
MASK_RANGE = 1e30
_BIASED = {"Conv": 2, "Gemm": 2}          # op -> index of its int32 bias input


def repair_vanishing_channels(qdq: onnx.ModelProto) -> int:
    """Rewrite, in place, every weight channel whose scale vanishes (see the module's note);
    the number of channels rewritten."""
    g = qdq.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output if o}
    repaired = 0
    for node in g.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        w_dq = producer.get(node.input[1])
        if not _dequantizes_initializer(w_dq, inits):
            continue
        scale = numpy_helper.to_array(inits[w_dq.input[1]]).astype(np.float32)
        gone = np.atleast_1d(scale < VANISHING_SCALE)
        if not gone.any():
            continue
        axis = _channel_axis(w_dq, node)
        weights = numpy_helper.to_array(inits[w_dq.input[0]]).copy()
        if scale.ndim == 0:
            weights[...] = 0
            new_scale = np.float32(1.0)
        else:
            index = [slice(None)] * weights.ndim
            index[axis] = gone
            weights[tuple(index)] = 0
            new_scale = np.where(gone, np.float32(1.0), scale).astype(np.float32)
        _replace(inits[w_dq.input[0]], weights)
        _replace(inits[w_dq.input[1]], new_scale)
        bias_at = _BIASED.get(node.op_type)
        if bias_at is not None and len(node.input) > bias_at:
            _rescale_bias(producer.get(node.input[bias_at]), producer.get(node.input[0]),
                          inits, gone)
        repaired += int(gone.sum())
    return repaired


def repair_underflowing_zero_biases(qdq: onnx.ModelProto) -> int:
    """Give each int32 bias value of 0 whose scale (input scale x weight scale) underflows
    float32 to a subnormal or zero the scale 1: it stays the 0 it is (the QDQ model computes
    what it did), where the reader refuses such a scale (requantizing by it divides by
    zero).  A network whose activations vanish (a random-init MobileViT or EfficientNet,
    their BatchNorms' statistics never updated: ranges near 1e-33) has them wherever a bias
    is zero.  The number rewritten."""
    g = qdq.graph
    inits = {t.name: t for t in g.initializer}
    tiny = np.finfo(np.float32).tiny
    repaired = 0
    for dq in g.node:       # every int32 initializer dequantized: a Conv's, a Gemm's bias or
        if not _dequantizes_initializer(dq, inits):          # a MatMul's fused bias Add's
            continue
        scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
        q = numpy_helper.to_array(inits[dq.input[0]])
        if q.dtype != np.int32 or scale.shape not in ((), q.shape):
            continue
        gone = (scale < tiny) & (q == 0)
        if not np.any(gone):
            continue
        _replace(inits[dq.input[1]], np.where(gone, np.float32(1.0), scale).astype(np.float32))
        repaired += int(np.sum(gone))
    return repaired


def _dequantizes_initializer(dq, inits) -> bool:
    return (dq is not None and dq.op_type == "DequantizeLinear" and len(dq.input) >= 2
            and dq.input[0] in inits and dq.input[1] in inits)


def _channel_axis(dq, node) -> int:
    for a in dq.attribute:
        if a.name == "axis":
            return a.i
    return 1 if node.op_type == "MatMul" else 0


def _rescale_bias(bias_dq, x_dq, inits, gone: np.ndarray) -> None:
    """The int32 bias of the rewritten channels, requantized to input scale x 1."""
    if not _dequantizes_initializer(bias_dq, inits) or x_dq is None \
            or x_dq.op_type != "DequantizeLinear" or x_dq.input[1] not in inits:
        return
    x_scale = np.float32(numpy_helper.to_array(inits[x_dq.input[1]]).reshape(-1)[0])
    old_scale = numpy_helper.to_array(inits[bias_dq.input[1]]).astype(np.float32)
    q = numpy_helper.to_array(inits[bias_dq.input[0]])
    if q.dtype != np.int32 or old_scale.shape not in ((), q.shape):
        return
    value = q.astype(np.float64) * old_scale.astype(np.float64)
    new_scale = np.where(gone, x_scale, old_scale).astype(np.float32)
    requantized = np.clip(np.rint(value / new_scale.astype(np.float64)), -2**31 + 1, 2**31 - 1)
    _replace(inits[bias_dq.input[0]], np.where(gone, requantized, q).astype(np.int32))
    _replace(inits[bias_dq.input[1]], new_scale if old_scale.ndim else new_scale.reshape(()))


def _replace(tensor: onnx.TensorProto, array: np.ndarray) -> None:
    tensor.CopyFrom(numpy_helper.from_array(np.asarray(array), tensor.name))

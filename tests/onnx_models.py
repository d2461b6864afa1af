"""Small ONNX models built with onnx.helper for the compiler's tests, and onnxruntime as the
oracle.  Each builder returns a ModelProto with one batch dimension of size `batch`."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
_ONNX_TYPE = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8,
              np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32}


def const(name: str, value, dtype=None) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def value_info(name: str, dtype, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _ONNX_TYPE[np.dtype(dtype)],
                                         None if shape is None else list(shape))


def model(nodes, inputs, outputs, initializers, name="test", opset=OPSET,
          ms_domain=False) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", opset)]
    if ms_domain:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    m = helper.make_model(graph, opset_imports=opsets)
    m.ir_version = 8
    return m


def run_ort(m: onnx.ModelProto, feeds: dict[str, np.ndarray], optimize: bool = True):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # the QDQ model's own arithmetic: at opset 21 (int16 activations) onnxruntime fuses
    # DequantizeLinear -> MatMul into MatMulNBits, whose default accuracy level quantizes
    # the activations to int8 (tpuasm.compiler.ort.session does the same)
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    session = ort.InferenceSession(m.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def qparams_inputs(prefix: str, scale: float, zero_point: int, signed: bool):
    """Initializers `<prefix>_scale` and `<prefix>_zp`."""
    return [const(f"{prefix}_scale", np.float32(scale)),
            const(f"{prefix}_zp", zero_point, np.int8 if signed else np.uint8)]


def agreement(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, int]:
    """(fraction of identical elements, largest difference in LSB)."""
    diff = np.abs(np.asarray(ours, np.int64) - np.asarray(theirs, np.int64))
    return float(np.mean(diff == 0)), int(diff.max(initial=0))


def assert_agrees(ours, theirs, identical: float = 0.999, lsb: int = 1):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    same, worst = agreement(ours, theirs)
    assert worst <= lsb and same >= identical, \
        f"{same:.4%} identical, worst difference {worst} LSB"


def quantized_by_onnxruntime(tmp_path, model, calib: np.ndarray, quant_format: str = "QDQ",
                             per_channel: bool = False):
    """onnxruntime's quantize_static of `model` (its one input "x"; uint8 activations, int8
    weights) calibrated on `calib` a row at a time, in `quant_format` ("QDQ" or
    "QOperator"): the quantized model's path under tmp_path."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Rows(CalibrationDataReader):
        def __init__(self):
            self.rows = iter([{"x": calib[i:i + 1]} for i in range(len(calib))])

        def get_next(self):
            return next(self.rows, None)

    src, dst = tmp_path / "float.onnx", tmp_path / f"{quant_format}.onnx"
    onnx.save(model, str(src))
    quantize_static(str(src), str(dst), Rows(), quant_format=getattr(QuantFormat, quant_format),
                    per_channel=per_channel, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return dst

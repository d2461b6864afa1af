"""The one place the compiler opens onnxruntime sessions: host parts, lookup tables, contrib
operators' shapes, constant folding and validation all run through `session`."""
from __future__ import annotations

import onnx


def quiet() -> None:
    """onnxruntime's sessions opened elsewhere (quantize_static's calibration) log warnings
    such as "Removing initializer ... not used" to stderr, hundreds for a large model: its
    default logger keeps to errors, as ours do."""
    import onnxruntime as ort
    ort.set_default_logger_severity(3)


def session(model: onnx.ModelProto | bytes, threads: int = 1, optimize: bool = True):
    """An onnxruntime session; host parts run on one thread (the emulator has the other
    cores), `threads=0` leaves onnxruntime its own count; `optimize=False` runs the graph
    as it is, no fusions (as onnxruntime's calibrators do)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])

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


def session(model: onnx.ModelProto | bytes, threads: int = 1, optimize: bool = True,
            arena: bool = True, early_free: bool = False):
    """An onnxruntime session; host parts run on one thread (the emulator has the other
    cores), `threads=0` leaves onnxruntime its own count; `optimize=False` runs the graph
    as it is, no fusions (as onnxruntime's calibrators do).

    `arena=False`: tensors allocated and freed run by run.  onnxruntime's memory arena keeps
    the largest working set a session ever had until the session goes (and grows in powers
    of two): right for a host part run batch after batch (4-5x faster runs, measured on
    Magika's host parts), wasted on the one or two runs of a compile's check, where it held
    1 GB after the check.  `early_free`: nodes run in onnxruntime's priority-based order,
    which runs a node as soon as its inputs are ready, so that a reduction placed after the
    node it reads frees that tensor at once (the calibration's ReduceMin/ReduceMax: 1.4 GB
    -> 0.33 GB on Magika in the default order).  Neither changes a value."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.enable_cpu_mem_arena = arena
    if early_free:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    # fatal only: a failing run raises its message as an exception, which the caller turns
    # into a clear error or a fallback (probes run models at batch sizes they may refuse);
    # at ERROR onnxruntime would also print it to the user's terminal
    options.log_severity_level = 4
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    # a QDQ model at opset 21 (int16 activations: front/widen.py) has its DequantizeLinear
    # -> MatMul/Gemm of int8 weights fused into MatMulNBits, whose default accuracy level
    # (4) quantizes the activations to int8 on the fly: 239 int16 steps off on a 3-layer
    # MLP.  Level 1 computes in float32, the QDQ model's own arithmetic (0 steps off)
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])

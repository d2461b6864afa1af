"""What the int8 kernel is measured against (used by bench_kernels.py and bench_emulator.py 1).

onnxruntime's integer GEMMs on the same shapes, in the same process: MatMulInteger (u8 x s8,
s8 x s8 and u8 x u8 -> int32, where this onnxruntime runs them) and QLinearMatMul (u8 x s8 ->
u8, requantized), the weights as initializers (onnxruntime packs them once when the session
is made, as the kernel packs a tile once), at a given intra-op thread count.  onnxruntime
has no 16-bit integer GEMM: 16-bit figures are compared with its u8 x s8 one.

The CPU's peak: cores x VNNI instructions per cycle x 64 MACs per 512-bit vpdpbusd x clock,
with the clock from lscpu's "CPU max MHz" when it has one, else /proc/cpuinfo's "cpu MHz" (in
a virtual machine usually the host's nominal clock, below what the core boosts to), and the
instructions per cycle assumed from the CPU model (ipc_assumption).  Next to it the measured
peak: native.vnni_probe's rate of independent vpdpbusd on one core, times the cores.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import numpy as np

MACS_PER_VNNI = 64             # a 512-bit vpdpbusd: 16 int32 lanes x 4 byte products


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def clock_mhz() -> tuple[float | None, str]:
    """(MHz, where it came from)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"^CPU max MHz:\s*([\d.]+)", out, re.M)
        if m:
            return float(m.group(1)), "lscpu 'CPU max MHz'"
    except (OSError, subprocess.SubprocessError):
        pass
    m = re.search(r"^cpu MHz\s*:\s*([\d.]+)", _cpuinfo(), re.M)
    if m:
        return float(m.group(1)), "/proc/cpuinfo 'cpu MHz'"
    return None, "no clock found"


def ipc_assumption() -> tuple[float, str]:
    """512-bit vpdpbusd per cycle per core, and why."""
    info = _cpuinfo()
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)", info, re.M)
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    name = model.group(1).strip() if model else "unknown CPU"
    if vendor and vendor.group(1) == "AuthenticAMD" and family and int(family.group(1)) == 25:
        return 1.0, (f"{name}, AMD family 25 (Zen 4): a 512-bit vpdpbusd runs as two halves on "
                     f"the two 256-bit pipes that take VNNI, 1 per cycle")
    return 1.0, f"{name}: assumed 1 per cycle (one 512-bit VNNI pipe)"


def vnni_rate(native, seconds=0.004, repeat=60) -> float | None:
    """512-bit vpdpbusd per second on one core (best of `repeat`), or None without VNNI."""
    if native.cpu_level() < native.LEVEL_VNNI:
        return None
    iterations = 1 << 16
    while True:                      # size one probe to about `seconds`
        t = time.perf_counter()
        native.vnni_probe(iterations)
        if time.perf_counter() - t > seconds / 4 or iterations > 1 << 30:
            break
        iterations *= 4
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        instructions = native.vnni_probe(iterations)
        best = min(best, time.perf_counter() - t)
    return instructions / best


class Peak:
    """The CPU's peak in GMAC/s, nominal and measured, per thread count."""

    def __init__(self, native):
        self.mhz, self.clock_source = clock_mhz()
        self.ipc, self.ipc_source = ipc_assumption()
        self.rate = vnni_rate(native)
        self.cores = cores()

    def nominal(self, threads: int) -> float | None:
        if self.mhz is None:
            return None
        return min(threads, self.cores) * self.ipc * MACS_PER_VNNI * self.mhz * 1e6 / 1e9

    def measured(self, threads: int) -> float | None:
        if self.rate is None:
            return None
        return min(threads, self.cores) * self.rate * MACS_PER_VNNI / 1e9

    def describe(self) -> str:
        lines = [f"CPU peak = cores x 512-bit vpdpbusd per cycle x {MACS_PER_VNNI} MACs x clock:"
                 f" {self.cores} x {self.ipc:g} x {MACS_PER_VNNI} x "
                 + (f"{self.mhz:.0f} MHz ({self.clock_source})" if self.mhz else "?")
                 + (f" = {self.nominal(self.cores):.0f} GMAC/s" if self.mhz else ""),
                 f"  ({self.ipc_source})"]
        if self.rate is not None:
            implied = self.rate / self.ipc / 1e6
            lines.append(f"  measured: {self.rate / 1e9:.2f} G vpdpbusd/s on one core "
                         f"(implied clock {implied:.0f} MHz at {self.ipc:g}/cycle) -> "
                         f"{self.measured(self.cores):.0f} GMAC/s on {self.cores} cores")
        return "\n".join(lines)

    def share(self, gmacs: float, threads: int) -> str:
        """'x% of nominal / y% of measured peak' for a figure on `threads` threads."""
        parts = []
        nominal, measured = self.nominal(threads), self.measured(threads)
        if nominal:
            parts.append(f"{100 * gmacs / nominal:3.0f}% nominal")
        if measured:
            parts.append(f"{100 * gmacs / measured:3.0f}% measured peak")
        return ", ".join(parts)


# ------------------------------------------------------------------ onnxruntime models

def _onnx():
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    return onnx, TensorProto, helper, numpy_helper


def matmul_integer_model(weights: list[np.ndarray], rows: int, a_signed: bool,
                         chain: bool = False) -> bytes:
    """MatMulInteger of input A (rows x K) with each weight matrix (an initializer) -> int32.
    chain=False: every product reads A (independent GEMMs, all outputs returned)."""
    onnx, TP, helper, numpy_helper = _onnx()
    k = weights[0].shape[0]
    a_type = TP.INT8 if a_signed else TP.UINT8
    inputs = [helper.make_tensor_value_info("A", a_type, [rows, k])]
    nodes, inits, outputs = [], [], []
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        nodes.append(helper.make_node("MatMulInteger", ["A", f"W{i}"], [f"Y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"Y{i}", TP.INT32, [rows, w.shape[1]]))
    graph = helper.make_graph(nodes, "matmulinteger", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]
                             ).SerializeToString()


def qlinear_chain_model(weights: list[np.ndarray], rows: int) -> bytes:
    """QLinearMatMul layers u8 x s8 -> u8, each feeding the next (the requantization to
    u8 plays the role of the TPU's Activate): a quantized MLP's matrix work."""
    onnx, TP, helper, numpy_helper = _onnx()
    k = weights[0].shape[0]
    inputs = [helper.make_tensor_value_info("A", TP.UINT8, [rows, k])]
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "a_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "a_zero"),
             numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "w_zero"),
             numpy_helper.from_array(np.array(4.0, np.float32), "y_scale")]
    nodes, x = [], "A"
    for i, w in enumerate(weights):
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        nodes.append(helper.make_node("QLinearMatMul", [x, "a_scale", "a_zero", f"W{i}",
                                                        "w_scale", "w_zero", "y_scale",
                                                        "a_zero"], [f"Y{i}"]))
        x = f"Y{i}"
    outputs = [helper.make_tensor_value_info(x, TP.UINT8, [rows, weights[-1].shape[1]])]
    graph = helper.make_graph(nodes, "qlinear", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]
                             ).SerializeToString()


def session(model: bytes, threads: int):
    """An onnxruntime CPU session on `threads` intra-op threads, or None if it cannot run."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception:                    # noqa: BLE001 - an op this build does not have
        return None


# (name, input signed, weights signed): the MatMulInteger variants benchmarked
MATMUL_INTEGER_KINDS = [("MatMulInteger u8 x s8", False, True),
                        ("MatMulInteger s8 x s8", True, True),
                        ("MatMulInteger u8 x u8", False, False)]


def random_weights(rng, count, n, signed):
    if signed:
        return [rng.integers(-128, 128, (n, n)).astype(np.int8) for _ in range(count)]
    return [rng.integers(0, 256, (n, n)).astype(np.uint8) for _ in range(count)]


def random_input(rng, rows, n, signed):
    a = rng.integers(0, 256, (rows, n)).astype(np.uint8)
    return a.view(np.int8) if signed else a


def ort_version() -> str:
    import onnxruntime as ort
    return ort.__version__

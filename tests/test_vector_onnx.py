"""VADD / VMUL against onnxruntime's QLinearAdd / QLinearMul (com.microsoft contrib ops):
one-node models built with onnx.helper, random scales and zero points, the registers from
tpuasm.machine.vector.qlinear_registers, the operation run on the emulator.  The full
measurement (2,000 parameter sets, 1.7 million elements) is
`python benchmarks/vector_exactness.py`; this is its small version (spec/isa.md 5.11)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from vector_exactness import Case, chip_results, measure, onnxruntime_result  # noqa: E402


def test_random_parameter_sets_match_onnxruntime():
    r = measure(sets=60, rows=1, seed=7)
    assert r["elements"] > 12_000
    assert set(r["by_op"]) == {"add", "sub", "mul"}
    assert r["off_rails"] > 0.5          # most results are real values, not saturation
    assert r["identical"] >= 0.999 and r["max_lsb"] <= 1, r


def test_a_residual_add_and_a_gate_product_byte_for_byte():
    # typical layer parameters: every int8 pair once
    n = 256
    a = np.repeat(np.arange(-128, 128, dtype=np.int8), 256).reshape(256, n)
    b = np.tile(np.arange(-128, 128, dtype=np.int8), 256).reshape(256, n)
    cases = [Case("add", False, 0.0478, -3, 0.0312, 5, 0.0651, 2),
             Case("mul", False, 1 / 128, 0, 1 / 256, -128, 1 / 128, 0)]
    sessions: dict = {}
    for case in cases:
        chip = chip_results([case], a.reshape(1, -1), b.reshape(1, -1), n)
        want = onnxruntime_result(case, a, b, sessions).reshape(1, -1)
        diff = np.abs(chip.view(np.int8).astype(int) - want.astype(int))
        assert diff.max() <= 1 and np.mean(diff == 0) >= 0.999, case

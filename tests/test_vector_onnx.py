"""VADD / VMUL against onnxruntime's QLinearAdd / QLinearMul (com.microsoft contrib ops),
and with 16-bit operands (X, Y, Z) against its int16 QDQ float graph:
one-node models built with onnx.helper, random scales and zero points, the registers from
tpuasm.machine.vector.qlinear_registers, the operation run on the emulator.  The full
measurement (2,000 parameter sets, 1.7 million elements) is
`python benchmarks/vector_exactness.py`; this is its small version (spec/isa.md 5.11)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from vector_exactness import (Case, chip_results, measure, onnxruntime_result,  # noqa: E402
                              qdq_result)


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
        diff = np.abs(chip - want.astype(int))
        assert diff.max() <= 1 and np.mean(diff == 0) >= 0.999, case


# ------------------------------------------------------------------ 16-bit operands


def test_sixteen_bit_combinations_match_onnxruntimes_int16_qdq_graph():
    # X, Y, Z against DequantizeLinear -> Add / Sub / Mul -> QuantizeLinear (opset 21:
    # onnxruntime has no int16 QLinearAdd / QLinearMul); the full measurement is
    # `python benchmarks/vector_exactness.py --wide`
    r = measure(sets=120, rows=1, seed=7, wide=True)
    assert r["elements"] > 30_000
    assert len(r["by_op"]) >= 18                 # most of the 3 x 7 operation x width sets
    assert r["off_rails"] > 0.5
    assert r["identical"] >= 0.999 and r["max_lsb"] <= 1, r


def test_an_lstm_cell_product_at_sixteen_bits_byte_for_byte():
    # f (int8, scale 1/128) * c (int16, scale 2^-11, zero point 0) -> int16 at c's scale:
    # power-of-two scales, so both sides are exact: every element identical
    n = 256
    f = np.repeat(np.arange(-128, 128), 64)
    c = np.tile(np.linspace(-32768, 32767, 64).astype(np.int64), 256)
    case = Case("mul", False, 1 / 128, 0, 2.0 ** -11, 0, 2.0 ** -11, 0, "YZ")
    chip = chip_results([case], f.reshape(1, -1), c.reshape(1, -1), n)[0]
    want = qdq_result(case, f.astype(np.int8), c.astype(np.int16), {})
    np.testing.assert_array_equal(chip, want.astype(np.int64))
    assert np.count_nonzero(np.abs(want.astype(np.int64)) < 32767) > len(want) // 2

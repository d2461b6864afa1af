"""The int8 MatrixMultiply kernel (tpuasm/machine/mmc_int8.c through native.py) against a
numpy int64 oracle, and the machine choosing it or the float path: same results either way."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.binary import Program
from tpuasm.encoding import Instruction
from tpuasm.isa import ISA_TABLE
from tpuasm.machine import Machine
from tpuasm.machine import kernels as K
from tpuasm.machine import native

needs_int8 = pytest.mark.skipif(not native.supported(),
                                reason="no AVX-512 VNNI or no C compiler on this machine")


def wrap32(values):
    return (np.asarray(values, np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def run_kernel(x, rows, w, signed_x, signed_w, acc, acc_row, overwrite):
    n = w.shape[0]
    packed, bias = np.zeros(n * n, np.int8), np.zeros(n, np.int32)
    native.pack_tile(w, signed_w, signed_x, packed, bias)
    native.mmc_rows(x, rows, len(rows), packed, bias, signed_x, signed_w, acc, acc_row,
                    overwrite)


def oracle(x, rows, w, signed_x, signed_w, acc, acc_row, overwrite):
    xs = (x.view(np.int8) if signed_x else x).astype(np.int64)
    ws = (w.view(np.int8) if signed_w else w).astype(np.int64)
    want = acc.astype(np.int64)
    products = xs[rows] @ ws
    end = acc_row + len(rows)
    want[acc_row:end] = products if overwrite else want[acc_row:end] + products
    return wrap32(want)


@needs_int8
@pytest.mark.parametrize("signed_x", [True, False])
@pytest.mark.parametrize("signed_w", [True, False])
@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("n, m", [(16, 1), (16, 7), (48, 13), (64, 6), (80, 25), (256, 301),
                                  (1024, 9)])
def test_kernel_matches_int64_oracle(signed_x, signed_w, overwrite, n, m):
    """Every signedness, row counts around the 6-row block, widths around the 64-column
    panel, gathered (reversed, repeated) input rows, accumulating onto random int32s."""
    rng = np.random.default_rng(n * 1000 + m)
    x = rng.integers(0, 256, (m + 5, n), dtype=np.uint8)
    w = rng.integers(0, 256, (n, n), dtype=np.uint8)
    rows = rng.integers(0, m + 5, m).astype(np.int64)
    acc = rng.integers(-2**31, 2**31, (m + 4, n)).astype(np.int32)
    want = oracle(x, rows, w, signed_x, signed_w, acc, 3, overwrite)
    run_kernel(x, rows, w, signed_x, signed_w, acc, 3, overwrite)
    assert np.array_equal(acc, want)


@needs_int8
@pytest.mark.parametrize("byte_x, byte_w, signed_x, signed_w", [
    (0x80, 0x80, True, True),            # -128 * -128 everywhere: sums of +2^14 per term
    (0x80, 0x7F, True, True),
    (0xFF, 0xFF, False, False),          # 255 * 255 * 1024 > 2^26
    (0xFF, 0x80, False, True),
    (0x80, 0xFF, True, False)])
def test_kernel_extremes_wrap_like_the_accumulators(byte_x, byte_w, signed_x, signed_w):
    n = 1024
    x = np.full((2, n), byte_x, np.uint8)
    w = np.full((n, n), byte_w, np.uint8)
    rows = np.array([0, 1], np.int64)
    acc = np.array([[2**31 - 1] * n, [-2**31] * n], np.int32)
    want = oracle(x, rows, w, signed_x, signed_w, acc, 0, False)
    run_kernel(x, rows, w, signed_x, signed_w, acc, 0, False)
    assert np.array_equal(acc, want)


def I(key, flags="", repeat=1, **operands):
    spec = ISA_TABLE.instructions[key]
    return Instruction(key, spec.flag_bits(flags), repeat, dict(operands))


def mlp(batch=300):
    body = []
    for layer, flags in enumerate(["SO", "SOU", "SOW", "SOUW"]):
        src, dst = (0, batch) if layer % 2 == 0 else (batch, 0)
        body += [I("RW", tile=layer), I("MMC", flags, ub=src, acc=0, length=batch),
                 I("MMC", "U", ub=src, acc=batch, length=batch // 2),
                 I("ACT", "R", acc=0, ub=dst, length=batch)]
    return Program(body + [I("HLT")])


def run_machine(monkeypatch, int8: bool):
    monkeypatch.setenv("TPUASM_INT8", "1" if int8 else "0")
    m = Machine()
    rng = np.random.default_rng(7)
    weights = rng.integers(-128, 128, (4, 256, 256)).astype(np.int8)
    m.load(mlp(), weights=weights)
    m.ub[:300] = rng.integers(0, 256, (300, 256), dtype=np.uint8)
    result = m.run()
    assert result.status == "halted", result
    return m


@needs_int8
def test_machine_results_equal_on_both_paths(monkeypatch):
    a, b = run_machine(monkeypatch, True), run_machine(monkeypatch, False)
    assert a._scratch.options[2] == 1 and b._scratch.options[2] == 0
    assert np.array_equal(a.acc, b.acc) and np.array_equal(a.ub, b.ub)
    assert a.cycle == b.cycle and a.counters() == b.counters()


def test_the_int8_path_is_refused_where_it_cannot_run(monkeypatch):
    with pytest.raises(RuntimeError, match="multiple of 16"):
        K.make_scratch(8, use_int8=True)
    assert K.make_scratch(8).options[2] == 0             # by default: the float path
    monkeypatch.setenv("TPUASM_INT8", "0")
    assert not native.enabled() and K.make_scratch(256).options[2] == 0


def test_a_failed_build_is_noted_and_the_float_path_serves(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "directory", lambda: tmp_path / "native-x")
    monkeypatch.setattr(native, "_compiler", lambda: ["false"])
    monkeypatch.setattr(native, "_library", None)
    with pytest.warns(RuntimeWarning, match="int8 MatrixMultiply kernel is unavailable"):
        assert native.library() is None
    assert (tmp_path / "native-x" / "FAILED").read_text().startswith("RuntimeError")
    assert not native.supported() and K.make_scratch(256).options[2] == 0
    monkeypatch.setattr(native, "_library", None)        # a later process: no second try
    assert native.library() is None

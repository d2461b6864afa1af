"""How many OpenBLAS threads a run uses (machine._run_blas_threads): one for programs of
small GEMMs, OpenBLAS's own count for large ones, TPUASM_BLAS_THREADS to force; and the
process's setting is restored after every run."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.binary import Program
from tpuasm.machine import Machine
from tpuasm.machine import gemm
from tpuasm.machine.machine import LARGE_GEMM_VECTORS, _run_blas_threads

from _machine_programs import I, cfg


def _table(*instructions):
    m = Machine(timing_only=True)
    m.load(Program([*instructions, I("HLT")]))
    return m.prog


def test_small_gemms_run_single_threaded(monkeypatch):
    monkeypatch.delenv("TPUASM_BLAS_THREADS", raising=False)
    small = _table(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=8, repeat=3))
    assert _run_blas_threads(small, 1, False) == 1


def test_large_gemms_leave_openblas_its_threads(monkeypatch):
    monkeypatch.delenv("TPUASM_BLAS_THREADS", raising=False)
    v = LARGE_GEMM_VECTORS
    large = _table(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=v))
    assert _run_blas_threads(large, 1, False) is None
    # the average per iteration counts: one large and one tiny iteration stay below
    mixed = _table(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=v),
                   I("MMC", "O", ub=0, acc=0, length=1, repeat=2))
    assert _run_blas_threads(mixed, 2, False) == 1
    # a convolution's iteration streams height x width vectors
    conv = _table(cfg("conv_kw", 1), I("RW", tile=0),
                  I("MMC", "SOC", ub=0, acc=0, height=v // 16, width=16, repeat=1))
    assert _run_blas_threads(conv, 1, False) is None


def test_forced_and_timing_only(monkeypatch):
    small = _table(I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=8))
    monkeypatch.setenv("TPUASM_BLAS_THREADS", "3")
    assert _run_blas_threads(small, 1, False) == 3
    monkeypatch.setenv("TPUASM_BLAS_THREADS", "0")
    assert _run_blas_threads(small, 1, False) is None
    assert _run_blas_threads(small, 1, True) is None          # no GEMM runs
    assert _run_blas_threads(small, 0, False) is None


@pytest.mark.skipif(gemm.blas_threads() is None, reason="no OpenBLAS thread control")
def test_a_run_restores_the_process_setting(monkeypatch):
    monkeypatch.delenv("TPUASM_BLAS_THREADS", raising=False)
    before = gemm.blas_threads()
    gemm.set_blas_threads(2)
    try:
        m = Machine()
        m.load(Program([I("RW", tile=0), I("MMC", "SO", ub=0, acc=0, length=8), I("HLT")]),
               weights=np.zeros((1, 256, 256), np.int8))
        assert m.run().status == "halted"
        assert gemm.blas_threads() == 2
    finally:
        gemm.set_blas_threads(before)

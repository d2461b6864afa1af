"""The exact GEMM behind MatrixMultiply, both paths, against a numpy int64 oracle."""
from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from fresh_process import exact_mmc_in_fresh_process

from tpuasm.machine import gemm as G

RNG = np.random.default_rng(7)


def run_gemm(x, w, c, m, use_blas):
    """The two paths as the kernels call them: BLAS on (K, N), the portable one on (N, K)."""
    if use_blas:
        G.gemm_blas(x, w, c, m)
    else:
        G.matmul_nt(x, np.ascontiguousarray(w.T), c, m)
PATHS = [False, True] if G.HAVE_BLAS else [False]

# value ranges of the operands of each MatrixMultiply mode, and the float type it needs
MODES = {
    "int8 x int8": ((-128, 128), (-128, 128), np.float32),
    "uint8 x uint8": ((0, 256), (0, 256), np.float32),
    "uint8 x int8": ((0, 256), (-128, 128), np.float32),
    "int16 x int8": ((-32768, 32768), (-128, 128), np.float64),
    "int8 x uint16": ((-128, 128), (0, 65536), np.float64),
    "uint16 x uint16": ((0, 65536), (0, 65536), np.float64),
    "int16 x int16": ((-32768, 32768), (-32768, 32768), np.float64),
}


def staged(a, b, rows, dtype):
    """Operands in staging buffers with more rows than used, as the kernels have them."""
    x = np.full((rows + 3, a.shape[1]), 99, dtype)
    x[:rows] = a
    c = np.full((rows + 3, b.shape[1]), -7, dtype)
    return x, b.astype(dtype), c


@pytest.mark.parametrize("use_blas", PATHS)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("n, rows", [(8, 1), (8, 7), (16, 13), (256, 5), (256, 300)])
def test_gemm_exact(use_blas, mode, n, rows):
    (alo, ahi), (blo, bhi), dtype = MODES[mode]
    a = RNG.integers(alo, ahi, (rows, n))
    b = RNG.integers(blo, bhi, (n, n))
    a[0] = alo if rows > 1 else ahi - 1           # extreme rows: the largest sums
    b[:, 0] = blo
    b[:, -1] = bhi - 1
    x, w, c = staged(a, b, rows, dtype)
    run_gemm(x, w, c, rows, use_blas)
    assert np.array_equal(c[:rows].astype(np.int64), a @ b)
    assert (c[rows:] == -7).all()                 # rows past m untouched


@pytest.mark.parametrize("use_blas", PATHS)
def test_gemm_extremes_float32_bound(use_blas):
    """The largest 8-bit sums (|sum| = 256*255*255 and 256*128*128) are exact in float32."""
    n = 256
    a = np.array([[255] * n, [-128] * n, [-128] * n])
    b = np.array([[255] * n] * n)
    b2 = np.array([[-128] * n] * n)
    for left, right in ((a[:1], b), (a[1:], b2), (a[1:], -b2 - 1)):
        x, w, c = staged(left, right, len(left), np.float32)
        run_gemm(x, w, c, len(left), use_blas)
        assert np.array_equal(c[:len(left)].astype(np.int64), left @ right)


@pytest.mark.parametrize("use_blas", PATHS)
def test_gemm_zero_rows_is_noop(use_blas):
    x, w, c = staged(np.zeros((0, 8)), np.ones((8, 8)), 0, np.float32)
    run_gemm(x, w, c, 0, use_blas)
    assert (c == -7).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_portable_kernel_tails(dtype):
    """matmul_nt's 4 x 4 blocks and its row and column tails, non-square too."""
    for rows, k, n in itertools.product(range(0, 10), (1, 5, 12), (1, 3, 4, 7, 9)):
        a = RNG.integers(-128, 128, (rows, k))
        b = RNG.integers(-128, 128, (k, n))
        c = np.full((rows + 1, n), -5, dtype)
        G.matmul_nt(a.astype(dtype), np.ascontiguousarray(b.T).astype(dtype), c, rows)
        assert np.array_equal(c[:rows].astype(np.int64), a @ b)
        assert (c[rows:] == -5).all()


def test_without_openblas_falls_back():
    """With the library absent (forced by TPUASM_NO_BLAS), the names still link and the
    default scratch uses the numba kernel; MatrixMultiply stays exact."""
    env = dict(os.environ, TPUASM_NO_BLAS="1", TPUASM_INT8="0")    # the numba kernel itself
    out = exact_mmc_in_fresh_process(
        "from tpuasm.machine import gemm as G\nassert not G.HAVE_BLAS\n",
        "assert s.options[0] == 0", env)
    assert out.returncode == 0, out.stderr
    assert "exact" in out.stdout

"""Exact small-integer matrix multiply for the numba core.

MatrixMultiply's products are integers, and a float GEMM is exact as long as every
partial sum stays below 2^24 (float32) or 2^53 (float64).  With K <= 256:

* 8-bit x 8-bit (any signedness): |sum| <= 256 * 255 * 255 = 16,646,400 < 2^24, so float32
  is exact (int8 x int8 stays exact up to K = 1024);
* 16-bit on either side: |sum| <= 256 * 65535 * 65535 < 2^41, so float64 is exact.

The summation order does not matter when every partial sum is an exactly representable
integer, so any BLAS (blocked, FMA, threaded) gives the exact result.

numba cannot call np.matmul on its own, but numpy's wheel ships OpenBLAS
(numpy.libs/libscipy_openblas64_*.so, ILP64 CBLAS).  We register its sgemm/dgemm
addresses with LLVM under their own names (SGEMM_SYMBOL, DGEMM_SYMBOL) and call them as
numba ExternalFunctions.  Because the compiled code refers to the *symbol name* (resolved
when the code is loaded) rather than to an address baked in at compile time, `cache=True`
and the ahead-of-time module (aot.py) keep working across processes.  When the library or symbol is missing, the
names are bound to a do-nothing C callback and `HAVE_BLAS` is False; callers then use
the register-blocked numba kernel `matmul_nt`.  Setting the
environment variable TPUASM_NO_BLAS=1 forces that path (for tests of other platforms).

Entry points (all njit):
    gemm_f32(a, b, c, m)    c[:m] = a[:m] @ b   (OpenBLAS sgemm; float32, C-contiguous)
    gemm_f64(a, b, c, m)    the same with dgemm
    gemm_blas(a, b, c, m)   either, by dtype
    matmul_nt(a, bt, c, m)  c[:m] = a[:m] @ bt.T, the portable kernel (weights transposed)
Python helpers: blas_threads(), set_blas_threads(n) (OpenBLAS is multi-threaded by default;
see set_blas_threads for the measured trade-off on a shared 2-core machine).
"""
from __future__ import annotations

import ctypes
import glob
import os

import numpy as np

from .jit import external, njit, on_materialize

CBLAS_ROW_MAJOR = 101
CBLAS_NO_TRANS = 111
# OpenBLAS's own (ILP64) names: the compiled code refers to these symbols, resolved when it
# is loaded -- by LLVM for the JIT (registered below), by the dynamic linker for the
# ahead-of-time module (aot.py loads the library with RTLD_GLOBAL first).
SGEMM_SYMBOL = "scipy_cblas_sgemm64_"
DGEMM_SYMBOL = "scipy_cblas_dgemm64_"


def _find_openblas() -> str | None:
    """Path of the OpenBLAS bundled in numpy's wheel, or None."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    for pattern in ("numpy.libs/libscipy_openblas64_*.so*", "numpy/.dylibs/libscipy_openblas64_*",
                    "numpy.libs/libscipy_openblas64_*.dll"):
        hits = sorted(glob.glob(os.path.join(site, pattern)))
        if hits:
            return hits[0]
    return None


def _open_blas():
    """(path, library) of numpy's OpenBLAS with both GEMM symbols, or (None, None)."""
    from ..environment import raw
    path = None if raw("TPUASM_NO_BLAS") else _find_openblas()
    if path is not None:
        try:
            lib = ctypes.CDLL(path)
            getattr(lib, SGEMM_SYMBOL)
            getattr(lib, DGEMM_SYMBOL)
            return path, lib
        except (OSError, AttributeError):
            pass
    return None, None


BLAS_PATH, _blas_lib = _open_blas()
HAVE_BLAS = _blas_lib is not None
_sgemm = _dgemm = None                       # numba ExternalFunctions, made by _bind_numba


def _bind_numba() -> None:
    """Declare the GEMM symbols to numba (runs when numba is first needed, see jit.py).
    Without OpenBLAS they are stand-ins, never called (use_blas is False)."""
    global _sgemm, _dgemm
    from numba import types
    from numba.extending import overload

    f32p = types.CPointer(types.float32)
    f64p = types.CPointer(types.float64)
    # cblas_?gemm(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) with
    # ILP64 integers for dimensions and 32-bit C enums.
    sgemm_sig = types.void(types.int32, types.int32, types.int32, types.int64, types.int64,
                           types.int64, types.float32, f32p, types.int64, f32p, types.int64,
                           types.float32, f32p, types.int64)
    dgemm_sig = types.void(types.int32, types.int32, types.int32, types.int64, types.int64,
                           types.int64, types.float64, f64p, types.int64, f64p, types.int64,
                           types.float64, f64p, types.int64)
    library = _blas_lib if HAVE_BLAS else None
    _sgemm = external(SGEMM_SYMBOL, sgemm_sig, library)
    _dgemm = external(DGEMM_SYMBOL, dgemm_sig, library)

    @overload(gemm_blas)
    def _gemm_blas_overload(a, b, c, m):
        if a.dtype == types.float32:
            return lambda a, b, c, m: gemm_f32(a, b, c, m)
        return lambda a, b, c, m: gemm_f64(a, b, c, m)


on_materialize(_bind_numba)


@njit(cache=True, fastmath=True)
def matmul_nt(a, bt, c, m):
    """c[:m] = a[:m] @ bt.T, the portable kernel: the weights come transposed so that every
    output element is a dot product of two contiguous rows.  4 x 4 output blocks keep 16
    partial sums in registers (8 loads per 16 multiply-adds), and fastmath lets LLVM
    vectorize the reductions -- reassociation is exact here because every partial sum is an
    integer below 2^24 (float32) or 2^53 (float64)."""
    kdim = a.shape[1]
    n = bt.shape[0]
    zero = c.dtype.type(0)
    m4 = m - m % 4
    n4 = n - n % 4
    for r in range(0, m4, 4):
        a0, a1, a2, a3 = a[r], a[r + 1], a[r + 2], a[r + 3]
        for j in range(0, n4, 4):
            b0, b1, b2, b3 = bt[j], bt[j + 1], bt[j + 2], bt[j + 3]
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
            s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = zero
            for k in range(kdim):
                x0, x1, x2, x3 = a0[k], a1[k], a2[k], a3[k]
                y0, y1, y2, y3 = b0[k], b1[k], b2[k], b3[k]
                s00 += x0 * y0
                s01 += x0 * y1
                s02 += x0 * y2
                s03 += x0 * y3
                s10 += x1 * y0
                s11 += x1 * y1
                s12 += x1 * y2
                s13 += x1 * y3
                s20 += x2 * y0
                s21 += x2 * y1
                s22 += x2 * y2
                s23 += x2 * y3
                s30 += x3 * y0
                s31 += x3 * y1
                s32 += x3 * y2
                s33 += x3 * y3
            c[r, j], c[r, j + 1], c[r, j + 2], c[r, j + 3] = s00, s01, s02, s03
            c[r + 1, j], c[r + 1, j + 1], c[r + 1, j + 2], c[r + 1, j + 3] = s10, s11, s12, s13
            c[r + 2, j], c[r + 2, j + 1], c[r + 2, j + 2], c[r + 2, j + 3] = s20, s21, s22, s23
            c[r + 3, j], c[r + 3, j + 1], c[r + 3, j + 2], c[r + 3, j + 3] = s30, s31, s32, s33
        for j in range(n4, n):              # column tail of this row block
            for q in range(4):
                _dot_into(a, bt, c, r + q, j, kdim)
    for r in range(m4, m):                  # row tail
        for j in range(n):
            _dot_into(a, bt, c, r, j, kdim)


@njit(cache=True, fastmath=True)
def _dot_into(a, bt, c, r, j, kdim):
    total = c.dtype.type(0)
    ar = a[r]
    bj = bt[j]
    for k in range(kdim):
        total += ar[k] * bj[k]
    c[r, j] = total


@njit(cache=True)
def gemm_f32(a, b, c, m):
    """c[:m] = a[:m] @ b through OpenBLAS sgemm; a (>=m, K), b (K, N), c (>=m, N), all
    C-contiguous float32.  Requires HAVE_BLAS."""
    if m <= 0:
        return
    kdim = a.shape[1]
    n = b.shape[1]
    _sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, m, n, kdim, np.float32(1.0),
           a.ctypes, kdim, b.ctypes, n, np.float32(0.0), c.ctypes, n)


@njit(cache=True)
def gemm_f64(a, b, c, m):
    """c[:m] = a[:m] @ b through OpenBLAS dgemm (the 16-bit modes).  Requires HAVE_BLAS."""
    if m <= 0:
        return
    kdim = a.shape[1]
    n = b.shape[1]
    _dgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, m, n, kdim, 1.0,
           a.ctypes, kdim, b.ctypes, n, 0.0, c.ctypes, n)


def gemm_blas(a, b, c, m):
    """gemm_f32 or gemm_f64 by dtype (njit-callable)."""
    if a.dtype == np.float32:
        gemm_f32(a, b, c, m)
    else:
        gemm_f64(a, b, c, m)


def blas_threads() -> int | None:
    """OpenBLAS's thread count (shared with numpy), or None without OpenBLAS."""
    if not HAVE_BLAS:
        return None
    return int(_blas_lib.scipy_openblas_get_num_threads64_())


def set_blas_threads(n: int) -> int | None:
    """Set OpenBLAS's thread count for the whole process (numpy's matmul too); returns the
    previous count.  Measured on the 2-core machines: 2 threads double sgemm when both cores
    are idle (~190 vs ~95 GMAC/s for 1024x256x256) but collapse to ~10-20 GMAC/s when another
    process keeps the second core busy; 1 thread stays at ~95.  Nothing here calls it: the
    machine (or the user) chooses."""
    if not HAVE_BLAS:
        return None
    previous = blas_threads()
    _blas_lib.scipy_openblas_set_num_threads64_(int(n))
    return previous

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
addresses with LLVM under names of our own (`tpuasm_cblas_sgemm`/`..._dgemm`) and call
them as numba ExternalFunctions.  Because the compiled code refers to the *symbol name*
(resolved when the code is loaded) rather than to an address baked in at compile time,
`cache=True` keeps working across processes.  When the library or symbol is missing, the
names are bound to a do-nothing C callback and `HAVE_BLAS` is False; callers then pass
`use_blas=False` and get the cache-blocked numba kernel `matmul_blocked`.  Setting the
environment variable TPUASM_NO_BLAS=1 forces that path (for tests of other platforms).

Entry points (all njit):
    gemm_f32(a, b, c, m, use_blas)   c[:m] = a[:m] @ b   (float32, C-contiguous)
    gemm_f64(a, b, c, m, use_blas)   the same in float64
    gemm(a, b, c, m, use_blas)       either, by dtype
    matmul_blocked(a, b, c, m)       the portable kernel (any float dtype)
"""
from __future__ import annotations

import ctypes
import glob
import os

import llvmlite.binding as llvm
import numpy as np
from numba import njit, types
from numba.extending import overload

CBLAS_ROW_MAJOR = 101
CBLAS_NO_TRANS = 111

_F32P = types.CPointer(types.float32)
_F64P = types.CPointer(types.float64)
# cblas_?gemm(order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) with
# ILP64 integers for dimensions and 32-bit C enums.
_SGEMM_SIG = types.void(types.int32, types.int32, types.int32, types.int64, types.int64,
                        types.int64, types.float32, _F32P, types.int64, _F32P, types.int64,
                        types.float32, _F32P, types.int64)
_DGEMM_SIG = types.void(types.int32, types.int32, types.int32, types.int64, types.int64,
                        types.int64, types.float64, _F64P, types.int64, _F64P, types.int64,
                        types.float64, _F64P, types.int64)
_C_SGEMM = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
                            ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_float, ctypes.c_void_p, ctypes.c_int64)
_C_DGEMM = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_double,
                            ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_double, ctypes.c_void_p, ctypes.c_int64)


def _find_openblas() -> str | None:
    """Path of the OpenBLAS bundled in numpy's wheel, or None."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    for pattern in ("numpy.libs/libscipy_openblas64_*.so*", "numpy/.dylibs/libscipy_openblas64_*",
                    "numpy.libs/libscipy_openblas64_*.dll"):
        hits = sorted(glob.glob(os.path.join(site, pattern)))
        if hits:
            return hits[0]
    return None


def _bind_symbols():
    """Register tpuasm_cblas_sgemm/dgemm with LLVM; returns (have_blas, keep_alive)."""
    path = None if os.environ.get("TPUASM_NO_BLAS") else _find_openblas()
    if path is not None:
        try:
            lib = ctypes.CDLL(path)
            s = ctypes.cast(lib.scipy_cblas_sgemm64_, ctypes.c_void_p).value
            d = ctypes.cast(lib.scipy_cblas_dgemm64_, ctypes.c_void_p).value
            llvm.add_symbol("tpuasm_cblas_sgemm", s)
            llvm.add_symbol("tpuasm_cblas_dgemm", d)
            return True, lib
        except (OSError, AttributeError):
            pass
    # Never called (use_blas is False), but the names must resolve for the code to link.
    stubs = (_C_SGEMM(lambda *a: None), _C_DGEMM(lambda *a: None))
    llvm.add_symbol("tpuasm_cblas_sgemm", ctypes.cast(stubs[0], ctypes.c_void_p).value)
    llvm.add_symbol("tpuasm_cblas_dgemm", ctypes.cast(stubs[1], ctypes.c_void_p).value)
    return False, stubs


HAVE_BLAS, _keep_alive = _bind_symbols()
_sgemm = types.ExternalFunction("tpuasm_cblas_sgemm", _SGEMM_SIG)
_dgemm = types.ExternalFunction("tpuasm_cblas_dgemm", _DGEMM_SIG)


@njit(cache=True)
def matmul_blocked(a, b, c, m):
    """c[:m] = a[:m] @ b with a 4-row register block: each weight row is loaded once for
    four output rows, and the inner loop over n vectorizes (no reduction in it)."""
    kdim = a.shape[1]
    n = b.shape[1]
    zero = c.dtype.type(0)
    r = 0
    while r + 4 <= m:
        c0, c1, c2, c3 = c[r], c[r + 1], c[r + 2], c[r + 3]
        for j in range(n):
            c0[j] = zero
            c1[j] = zero
            c2[j] = zero
            c3[j] = zero
        for k in range(kdim):
            a0, a1, a2, a3 = a[r, k], a[r + 1, k], a[r + 2, k], a[r + 3, k]
            bk = b[k]
            for j in range(n):
                bv = bk[j]
                c0[j] += a0 * bv
                c1[j] += a1 * bv
                c2[j] += a2 * bv
                c3[j] += a3 * bv
        r += 4
    while r < m:
        cr = c[r]
        for j in range(n):
            cr[j] = zero
        for k in range(kdim):
            av = a[r, k]
            bk = b[k]
            for j in range(n):
                cr[j] += av * bk[j]
        r += 1


@njit(cache=True)
def gemm_f32(a, b, c, m, use_blas):
    """c[:m] = a[:m] @ b; a (>=m, K), b (K, N), c (>=m, N), all C-contiguous float32."""
    if m <= 0:
        return
    if use_blas:
        kdim = a.shape[1]
        n = b.shape[1]
        _sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, m, n, kdim, np.float32(1.0),
               a.ctypes, kdim, b.ctypes, n, np.float32(0.0), c.ctypes, n)
    else:
        matmul_blocked(a, b, c, m)


@njit(cache=True)
def gemm_f64(a, b, c, m, use_blas):
    """c[:m] = a[:m] @ b in float64 (the 16-bit modes)."""
    if m <= 0:
        return
    if use_blas:
        kdim = a.shape[1]
        n = b.shape[1]
        _dgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, m, n, kdim, 1.0,
               a.ctypes, kdim, b.ctypes, n, 0.0, c.ctypes, n)
    else:
        matmul_blocked(a, b, c, m)


def gemm(a, b, c, m, use_blas):
    """c[:m] = a[:m] @ b for float32 or float64 operands (njit-callable; dispatches on dtype)."""
    if a.dtype == np.float32:
        gemm_f32(a, b, c, m, use_blas)
    else:
        gemm_f64(a, b, c, m, use_blas)


@overload(gemm)
def _gemm_overload(a, b, c, m, use_blas):
    if a.dtype == types.float32:
        return lambda a, b, c, m, use_blas: gemm_f32(a, b, c, m, use_blas)
    return lambda a, b, c, m, use_blas: gemm_f64(a, b, c, m, use_blas)

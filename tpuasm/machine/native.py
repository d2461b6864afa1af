"""The machine's C kernel (mmc_int8.c): 8-bit MatrixMultiply as integer products summed in
int32, the way the TPU's array computes.

Why.  The float path (gemm.py) converts every input vector to float32, runs OpenBLAS's
sgemm and converts the products back to int32: on the 2-core machines it reached 0.71-0.79
of np.matmul's speed, the conversions running on one core while OpenBLAS's second thread
spun.  The integer kernel reads the UB's bytes and writes the accumulators directly:
with AVX-512 VNNI (vpdpbusd: four byte products summed into each int32 lane) one thread
runs at ~200-210 GMAC/s on 1024 x 256 x 256, 0.9-1.0 of the core's measured vpdpbusd rate
and level with onnxruntime's MatMulInteger u8 x s8 on the same shapes (np.matmul float32
with two threads: ~90); with AVX2 (vpmaddwd on int16 pairs) at about sgemm's speed per
thread, without the conversions.  Calls of enough work share their rows among the cores
through a pool of helper threads that poll briefly between calls
(benchmarks/bench_kernels.py and bench_emulator.py 1 measure it side by side with
onnxruntime, as shares of the CPU's peak).

How.  The source is compiled once with the system C compiler (`cc -O3 -pthread -shared`;
the vector code is enabled per function, so the build works with any x86-64 compiler on
any CPU) into ~/.cache/tpuasm/native-<key>/, keyed by the source, and loaded with
RTLD_GLOBAL: numba's JIT finds its functions through symbols registered with LLVM, the
ahead-of-time core (aot.py) through the dynamic linker.  Without a compiler (the JIT then
binds the names to stubs that are never called), on a CPU without AVX2, for an array size
that is not a multiple of 16, or with TPUASM_INT8=0, MatrixMultiply takes the float path.
16-bit operands (H, D): at the VNNI level one pass of vpdpwssd on int16 values
(mmc_rows16, pack_tile16: the low byte and the high byte's row put together), 32 MACs per
instruction, half the 8-bit rate; at the AVX2 level two 8-bit ones, the low byte unsigned,
their products two or four kernel passes added with shifts of 8 and 16 bits (H with D keeps
the float path there, faster).  All exact modulo 2^32.  TPUASM_INT8=avx2 caps the kernel at
AVX2 (to measure or test that level on a VNNI machine); TPUASM_INT8_THREADS=n sets its
thread count (default: the cores this process may run on, at most 8).  Every path is
exact; the tests run each one this CPU has.

The whole MLP on every core.  A MatrixMultiply alone scaled to two cores, but an emulated
MLP (bench_emulator.py 1: each MatrixMultiply followed by its ReLU Activate) did not: the
second core paid nothing (0.42 x MatMulInteger on two threads against 0.89 x on one).
Measured with pool_stats(): each 2,048-row MatrixMultiply had been two calls of 1,024
rows; the helpers polled 30 us after a call, but the Activate between MatrixMultiplies
(on one thread) and the tile packing before each (38 us, bytes written 4 apart) outlasted
that, so the helpers slept and took ~100-140 us to wake (a virtual machine's idle core):
half of a call's share.  Now (1) a large plain Activate (ReLU or none, requantized, no
pooling or extension) runs on the same pool (act_rows: the arithmetic of
kernels._execute_act, in C, blocks of 64 rows); (2) a MatrixMultiply iteration of up to
16,384 rows is one call; (3) the tile is packed in write order (6 us); (4) before a
large MatrixMultiply's set-up the machine calls pool_prepare(), which wakes sleeping
helpers so that they poll when the job comes; (5) the last 96 rows of a call go in
12-row blocks, so the caller waits less for the helper's last block.

Python helpers: library() (the loaded ctypes library or None), cpu_level() (LEVEL_NONE,
LEVEL_AVX2 or LEVEL_VNNI: what this CPU and build can run), level() (what the machine will
use), threads(), vnni_probe() (the benchmarks' measured peak), pool_stats() (what the
thread pool did).  njit: pack_tile, mmc_rows, pack_tile16, mmc_rows16, act_rows,
pool_prepare.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np

from .decoded import ACT_OUT_INT16
from .jit import external, njit, on_materialize
from ..cache import ensure_built, entry, install, note_failure, staging_directory
from ..environment import raw

LEVEL_NONE, LEVEL_AVX2, LEVEL_VNNI = 0, 1, 2          # as in mmc_int8.c
MAX_THREADS = 8
SOURCE = Path(__file__).with_name("mmc_int8.c")
LIBRARY = "libtpuasm_mmc_int8.so"
MMC_SYMBOL = "tpuasm_i8_mmc"
PACK_SYMBOL = "tpuasm_i8_pack"
MMC16_SYMBOL = "tpuasm_i16_mmc"
PACK16_SYMBOL = "tpuasm_i16_pack"
ACT_SYMBOL = "tpuasm_act_rows"
PREPARE_SYMBOL = "tpuasm_pool_prepare"
_BUILD_SECONDS = 120

_library = None          # the ctypes library, False after a failure in this process, None untried


def _compiler() -> list[str]:
    command = raw("CC") or sysconfig.get_config_var("CC") or "cc"
    return command.split()


# the build's flags are part of the cache key: a change to them builds the library again
CFLAGS = ("-O3", "-pthread", "-shared", "-fPIC")


def directory() -> Path:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(platform.machine().encode())
    h.update(" ".join((*_compiler(), *CFLAGS)).encode())
    return entry("native", h.hexdigest()[:16])


def build(where: Path) -> None:
    """Compile the source into `where` (atomically: a temporary directory renamed)."""
    tmp = staging_directory(where)
    try:
        command = [*_compiler(), *CFLAGS, "-o", str(tmp / LIBRARY),
                   str(SOURCE)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_SECONDS)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()[-400:]}")
        install(tmp, where, "native-")
        tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def library():
    """The loaded library (building it if needed), or None."""
    global _library
    if _library is not None:
        return _library or None
    _library = False
    where = directory()
    try:
        if not ensure_built(where, where / LIBRARY, build):
            return None
        lib = ctypes.CDLL(str(where / LIBRARY), mode=ctypes.RTLD_GLOBAL)
        lib.tpuasm_i8_level.restype = ctypes.c_int
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
        note_failure(where, e, "the int8 MatrixMultiply kernel is unavailable; using the "
                               "float path")
        return None
    _library = lib
    return lib


def cpu_level() -> int:
    """The best level this CPU and the built library can run."""
    lib = library()
    return int(lib.tpuasm_i8_level()) if lib is not None else LEVEL_NONE


def level() -> int:
    """The level the machine uses: cpu_level(), capped by TPUASM_INT8 ("0": none,
    "avx2": at most AVX2)."""
    setting = (raw("TPUASM_INT8") or "").strip().lower()
    if setting in ("0", "off", "no"):
        return LEVEL_NONE
    best = cpu_level()
    return min(best, LEVEL_AVX2) if setting == "avx2" else best


def threads() -> int:
    """Threads a large MatrixMultiply may use: TPUASM_INT8_THREADS, else the cores this
    process may run on (at most MAX_THREADS)."""
    try:
        wanted = int(raw("TPUASM_INT8_THREADS") or "0")
    except ValueError:
        wanted = 0
    if wanted <= 0:
        try:
            wanted = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            wanted = os.cpu_count() or 1
    return max(1, min(wanted, MAX_THREADS))


POOL_STATS = ("shared calls", "calls alone (backing off)", "caller worked ns", "caller waited ns",
              "calls waited longer than worked", "helper delay ns", "helper blocks",
              "caller blocks")                    # mmc_int8.c's STAT_* order


def pool_stats(reset: bool = False) -> dict[str, int]:
    """What the kernel's thread pool did in this process since the last reset (for the
    benchmarks: how often a call was shared, how long the caller waited for its helpers,
    how long a helper took to start on a job); empty without the library."""
    lib = library()
    if lib is None:
        return {}
    out = np.zeros(len(POOL_STATS), np.int64)
    lib.tpuasm_pool_stats(ctypes.c_void_p(out.ctypes.data), ctypes.c_int32(bool(reset)))
    return dict(zip(POOL_STATS, (int(v) for v in out)))


def vnni_probe(iterations: int) -> int:
    """Run `iterations` x 12 independent 512-bit vpdpbusd on this thread; returns how many
    (for the benchmarks' measured peak).  Only where cpu_level() is LEVEL_VNNI."""
    lib = library()
    if lib is None or cpu_level() < LEVEL_VNNI:
        raise RuntimeError("this CPU or build has no AVX-512 VNNI kernel")
    probe = lib.tpuasm_i8_vnni_probe
    probe.restype, probe.argtypes = ctypes.c_int64, [ctypes.c_int64]
    return int(probe(int(iterations)))


def _bind_numba() -> None:
    """Declare the kernel's symbols to numba (see jit.py).  Without the library they are
    stand-ins, never called (level() is LEVEL_NONE)."""
    global i8_mmc, i8_pack, i16_mmc, i16_pack, act_rows_c, pool_prepare_c
    from numba import types

    u8p, i8p = types.CPointer(types.uint8), types.CPointer(types.int8)
    i32p, i64p = types.CPointer(types.int32), types.CPointer(types.int64)
    i32, i64 = types.int32, types.int64
    # tpuasm_i8_mmc(ub, ub_rows, m, n, k_live, packed, bias, signed_x, signed_w, acc,
    #               acc_row, overwrite, shift, level, threads)
    mmc_sig = types.void(u8p, i64p, i64, i64, i64, i8p, i32p, i32, i32, i32p, i64, i32, i32,
                         i32, i32)
    # tpuasm_i8_pack(w, n, signed_w, signed_x, level, packed, bias)
    pack_sig = types.void(u8p, i64, i32, i32, i32, i8p, i32p)
    i8_mmc = external(MMC_SYMBOL, mmc_sig, library())
    i8_pack = external(PACK_SYMBOL, pack_sig, library())
    # tpuasm_i16_mmc(ub, ub_rows, m, n, packed, bias, signed_x, wide_x, signed_w, wide_w,
    #                acc, acc_row, overwrite, threads)   (packed: int16 in C)
    mmc16_sig = types.void(u8p, i64p, i64, i64, i8p, i32p, i32, i32, i32, i32, i32p, i64,
                           i32, i32)
    # tpuasm_i16_pack(lo, hi, n, signed_w, wide_w, signed_x, wide_x, packed, bias)
    pack16_sig = types.void(u8p, u8p, i64, i32, i32, i32, i32, i8p, i32p)
    i16_mmc = external(MMC16_SYMBOL, mmc16_sig, library())
    i16_pack = external(PACK16_SYMBOL, pack16_sig, library())
    # tpuasm_act_rows(acc, ub, m, n, relu, mult, shift, zero, out_kind, level, threads)
    act_sig = types.void(i32p, u8p, i64, i64, i32, i64, i64, i64, i32, i32, i32)
    act_rows_c = external(ACT_SYMBOL, act_sig, library())
    pool_prepare_c = external(PREPARE_SYMBOL, types.void(i32), library())


# numba ExternalFunctions, made by _bind_numba
i8_mmc = i8_pack = i16_mmc = i16_pack = act_rows_c = pool_prepare_c = None
on_materialize(_bind_numba)


@njit(cache=True)
def pack_tile(tile, signed_w, signed_x, level, packed, bias):
    """packed, bias = the (n, n) uint8 weight tile in the layout of `level` (packed holds
    2 n^2 bytes)."""
    i8_pack(tile.ctypes, tile.shape[0], np.int32(signed_w), np.int32(signed_x),
            np.int32(level), packed.ctypes, bias.ctypes)


@njit(cache=True)
def mmc_rows(ub, ub_rows, m, packed, bias, signed_x, signed_w, acc, acc_row, overwrite,
             shift, level, threads, k_live=0):
    """acc[acc_row + r] (+)= (ub[ub_rows[r]] @ the packed tile) << shift, for r < m, int32
    wrapping.  k_live: the tile's rows from there on are zero (a multiple of 16; 0: not
    known), skipped at LEVEL_VNNI."""
    if m <= 0:
        return
    i8_mmc(ub.ctypes, ub_rows.ctypes, m, ub.shape[1], k_live, packed.ctypes, bias.ctypes,
           np.int32(signed_x), np.int32(signed_w), acc.ctypes, acc_row, np.int32(overwrite),
           np.int32(shift), np.int32(level), np.int32(threads))


@njit(cache=True)
def pack_tile16(low, high, signed_w, wide_w, signed_x, wide_x, packed, bias):
    """packed, bias = the weight tile for mmc_rows16: 8-bit (`low`; wide_w False) or 16-bit
    (`low` and `high` bytes) as int16 pairs (packed holds 2 n^2 bytes)."""
    i16_pack(low.ctypes, high.ctypes, low.shape[0], np.int32(signed_w), np.int32(wide_w),
             np.int32(signed_x), np.int32(wide_x), packed.ctypes, bias.ctypes)


@njit(cache=True)
def mmc_rows16(ub, ub_rows, m, packed, bias, signed_x, wide_x, signed_w, wide_w, acc, acc_row,
               overwrite, threads):
    """acc[acc_row + r] (+)= input r @ the tile packed by pack_tile16, for r < m, int32
    wrapping; input r is UB row ub_rows[r] and, with wide_x, its high bytes in the next row.
    LEVEL_VNNI only."""
    if m <= 0:
        return
    i16_mmc(ub.ctypes, ub_rows.ctypes, m, ub.shape[1], packed.ctypes, bias.ctypes,
            np.int32(signed_x), np.int32(wide_x), np.int32(signed_w), np.int32(wide_w),
            acc.ctypes, acc_row, np.int32(overwrite), np.int32(threads))


@njit(cache=True)
def act_rows(acc, a0, ub, u0, m, relu, mult, shift, zero, out_kind, level, threads):
    """The plain Activate (no pooling, ReLU or no function, no extension) of accumulator
    rows a0..a0+m-1 into UB rows from u0 (two per vector for int16 output), shared among
    `threads` threads when large: the same arithmetic as kernels._execute_act."""
    if m <= 0:
        return
    per = 2 if out_kind == ACT_OUT_INT16 else 1
    act_rows_c(acc[a0:a0 + m].ctypes, ub[u0:u0 + per * m].ctypes, m, acc.shape[1],
               np.int32(relu), mult, shift, zero, np.int32(out_kind), np.int32(level),
               np.int32(threads))


@njit(cache=True)
def pool_prepare(threads):
    """Tell the kernel's threads that a call to share comes soon (they poll for it rather
    than sleep): before the set-up of a large MatrixMultiply."""
    if threads > 1:
        pool_prepare_c(np.int32(threads))

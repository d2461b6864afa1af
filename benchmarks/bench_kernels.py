"""Throughput of the instruction kernels (prints measured figures; not a test).

    .venv/bin/python benchmarks/bench_kernels.py [--rows 1024] [--repeat 20] [--blas-threads 1]
                                                 [--no-onnxruntime]

int8 GEMM against onnxruntime (with the VNNI level): whole MMC instructions on the int8
kernel (U: u8 x s8, -: s8 x s8, UW: u8 x u8; H, D, HD: 16-bit operands in one vpdpwssd pass)
next to onnxruntime's MatMulInteger (u8 x s8, s8 x s8, u8 x u8) and QLinearMatMul (u8 x s8
-> u8) on the same (rows x n) @ (n x n) shapes, interleaved in one run, on 1 thread and on
every core, with the ratio and each figure as a share of the CPU's peak
(benchmarks/int8_reference.py).  onnxruntime has no 16-bit integer GEMM: 16-bit figures are
compared with its u8 x s8 one, which they cannot reach (a 16-bit MAC is two byte MACs:
vpdpwssd does 32 per instruction where vpdpbusd does 64).
GEMM: the exact float32 GEMM behind MatrixMultiply's float path (OpenBLAS through numba, and
the portable numba kernel) against np.matmul on the same float32 operands.  MMC: whole
instructions through execute_instruction: on the int8 kernel (native.py) where this CPU has
it, else on the float path (UB byte -> float conversion, GEMM, int32 accumulate), and MMC.O
and MMC.HD on each float path for comparison.  The int8 kernel runs first: after an
OpenBLAS call OpenBLAS's idle workers spin for a while and would take the core its helper
thread uses.
ACT: Activate rows per second.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tpuasm.isa import ISA_TABLE
from tpuasm.machine import decoded as D
from tpuasm.machine import gemm as G
from tpuasm.machine import kernels as K
from tpuasm.machine import native as N

import int8_reference as R


def best_time(fn, repeat):
    fn()                                   # compile / warm caches
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bench_gemm(rows, n, repeat):
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (rows, n)).astype(np.float32)
    b = rng.integers(-128, 128, (n, n)).astype(np.float32)
    c = np.empty((rows, n), np.float32)
    macs = rows * n * n
    results = {"np.matmul float32": best_time(lambda: np.matmul(a, b, out=c), repeat)}
    if G.HAVE_BLAS:
        results["gemm_f32 (OpenBLAS)"] = best_time(lambda: G.gemm_f32(a, b, c, rows), repeat)
    bt = np.ascontiguousarray(b.T)
    results["matmul_nt f32 (numba)"] = best_time(lambda: G.matmul_nt(a, bt, c, rows),
                                                 max(3, repeat // 4))
    a64, b64, c64 = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    results["np.matmul float64"] = best_time(lambda: np.matmul(a64, b64, out=c64), repeat)
    if G.HAVE_BLAS:
        results["gemm_f64 (OpenBLAS)"] = best_time(lambda: G.gemm_f64(a64, b64, c64, rows),
                                                   repeat)
    print(f"GEMM {rows} x {n} x {n}:")
    for name, t in results.items():
        print(f"  {name:28s} {macs / t / 1e9:7.1f} GMAC/s  ({t * 1e3:.2f} ms)")


LEVEL_NAMES = {N.LEVEL_VNNI: "int8 kernel, VNNI", N.LEVEL_AVX2: "int8 kernel, AVX2"}


def mmc_call(rows, n, flags, use_blas, int8_level, threads=None):
    """A function running one MMC.<flags> of `rows` vectors through execute_instruction."""
    rng = np.random.default_rng(1)
    ub = rng.integers(0, 256, (2 * rows + 8, n), dtype=np.uint8)
    acc = np.zeros((rows + 8, n), np.int32)
    host = np.zeros((1, n), np.uint8)
    weights = rng.integers(0, 256, (4, n, n), dtype=np.uint8)
    scratch = K.make_scratch(n, use_blas=use_blas, int8_level=int8_level, int8_threads=threads)
    regs = D.reset_registers()
    row = np.zeros(D.NCOLS, np.int64)
    row[D.COL_OP], row[D.COL_REPEAT], row[D.COL_LEN] = D.OP_MMC, 1, rows
    row[D.COL_FLAGS] = ISA_TABLE.instructions["MMC"].flag_bits(flags)
    active = np.array([0, 1], np.int64)
    tiles = np.zeros(0, np.int64)
    return lambda: K.execute_instruction(row, regs, ub, acc, host, weights, tiles, active,
                                         scratch, 0)


def bench_mmc(rows, n, repeat, flags, use_blas, int8_level):
    t = best_time(mmc_call(rows, n, flags, use_blas, int8_level), repeat)
    path = LEVEL_NAMES[int8_level] if int8_level else "OpenBLAS" if use_blas else "numba"
    label = f"MMC.{flags or '-'} {rows} rows, {path}"
    print(f"  {label:34s} {rows * n * n / t / 1e9:7.1f} GMAC/s  ({t * 1e3:.2f} ms)")


# Our MMC flags against the onnxruntime op of the same operand types (16-bit: ORT has no
# 16-bit integer GEMM, so its u8 x s8 figure; our MACs are 16-bit ones there).
OURS_VS_ORT = [("U", "u8 x s8", "MatMulInteger u8 x s8"),
               ("", "s8 x s8", "MatMulInteger s8 x s8"),
               ("UW", "u8 x u8", "MatMulInteger u8 x u8"),
               ("U", "u8 x s8", "QLinearMatMul u8 x s8 -> u8"),
               ("H", "s16 x s8", "MatMulInteger u8 x s8"),
               ("D", "s8 x s16", "MatMulInteger u8 x s8"),
               ("HD", "s16 x s16", "MatMulInteger u8 x s8")]


def interleaved_best(calls: dict, repeat: int, runs: int = 3, settle: float = 0.01) -> dict:
    """Best time of each call over `repeat` rounds, every call `runs` times in a row per
    round (so a burst of load from other processes hits all of them alike), each group
    after a `settle` s pause: onnxruntime's threads spin a while after a run and took the
    core the next call's helper thread needed (the first of our calls after onnxruntime's
    measured 0.56 x where the others measured 1.6 x)."""
    for fn in calls.values():
        fn()                               # compile / pack / warm caches
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeat):
        for name, fn in calls.items():
            time.sleep(settle)
            for _ in range(runs):
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
    return best


def ort_calls(rows, n, threads):
    """name -> a function running that onnxruntime op once on (rows x n) @ (n x n)."""
    rng = np.random.default_rng(3)
    calls = {}
    for name, a_signed, w_signed in R.MATMUL_INTEGER_KINDS:
        sess = R.session(R.matmul_integer_model(R.random_weights(rng, 1, n, w_signed), rows,
                                                a_signed), threads)
        if sess is not None:
            feed = {"A": R.random_input(rng, rows, n, a_signed)}
            calls[name] = lambda sess=sess, feed=feed: sess.run(None, feed)
    sess = R.session(R.qlinear_chain_model(R.random_weights(rng, 1, n, True), rows), threads)
    if sess is not None:
        feed = {"A": R.random_input(rng, rows, n, False)}
        calls["QLinearMatMul u8 x s8 -> u8"] = lambda: sess.run(None, feed)
    return calls


def bench_against_onnxruntime(rows, n, repeat, level):
    """The int8 kernel (whole MMC instructions) and onnxruntime's integer GEMMs on the same
    shapes, interleaved, on 1 thread and on every core; each figure as a share of peak."""
    peak = R.Peak(N)
    print(peak.describe())
    print(f"int8 GEMM {rows} x {n} x {n} against onnxruntime {R.ort_version()}, best of "
          f"{repeat}, interleaved (load before: {_load()}):")
    macs = rows * n * n
    for threads in sorted({1, R.cores()}):
        ours = {f: mmc_call(rows, n, f, G.HAVE_BLAS, level, threads)
                for f in dict.fromkeys(f for f, _, _ in OURS_VS_ORT)}
        theirs = ort_calls(rows, n, threads)
        best = interleaved_best({**{("ours", k): v for k, v in ours.items()},
                                 **{("ort", k): v for k, v in theirs.items()}}, repeat)
        rate = {key: macs / t / 1e9 for key, t in best.items()}
        print(f"  {threads} thread{'s' if threads > 1 else ''} (load after: {_load()}):")
        for name in theirs:
            g = rate[("ort", name)]
            print(f"    onnxruntime {name:31s} {g:6.1f} GMAC/s  ({peak.share(g, threads)})")
        for flags, kind, against in OURS_VS_ORT:
            g = rate[("ours", flags)]
            label = f"tpuasm MMC.{flags or '-'} ({kind})"
            other = rate.get(("ort", against))
            ratio = f"{g / other:5.2f} x {against}" if other else f"({against}: not run)"
            print(f"    {label:43s} {g:6.1f} GMAC/s  {ratio}  ({peak.share(g, threads)})")


def _load():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def bench_act(rows, n, repeat, flags, pool, act_float=0):
    rng = np.random.default_rng(2)
    acc = rng.integers(-2**20, 2**20, (rows, n)).astype(np.int32)
    ub = np.zeros((rows * 2 + 9, n), np.uint8)
    ub[rows * 2 + 4:rows * 2 + 8] = np.frombuffer(np.float32(2.0 ** -12).tobytes(), np.uint8)[:, None]
    regs = D.reset_registers()
    regs[D.REG_ACT_SHIFT], regs[D.REG_FN_IN_FRAC], regs[D.REG_POOL_SIZE] = 8, 12, pool
    regs[D.REG_ACT_PARAMS], regs[D.REG_ACT_FLOAT] = rows * 2, act_float
    row = np.zeros(D.NCOLS, np.int64)
    row[D.COL_OP], row[D.COL_REPEAT], row[D.COL_LEN] = D.OP_ACT, 1, rows
    row[D.COL_FLAGS] = ISA_TABLE.instructions["ACT"].flag_bits(flags)
    scratch = K.make_scratch(n)
    empty = np.zeros(0, np.int64)
    t = best_time(lambda: K.execute_instruction(row, regs, ub, acc, ub, np.zeros((1, n, n), np.uint8),
                                                empty, np.array([-1, -1]), scratch, 0), repeat)
    kind = " (act_float)" if act_float else ""
    print(f"  ACT.{flags or '-':3s} {rows} rows{kind}: {rows / t / 1e6:6.2f} M rows/s, "
          f"{rows * n / t / 1e9:5.2f} G elements/s  ({t * 1e3:.2f} ms)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="set OpenBLAS's thread count first (default: leave it)")
    ap.add_argument("--no-onnxruntime", action="store_true",
                    help="skip the side-by-side with onnxruntime's integer GEMMs")
    args = ap.parse_args()
    if args.blas_threads is not None:
        G.set_blas_threads(args.blas_threads)
    print(f"OpenBLAS: {'yes' if G.HAVE_BLAS else 'not found'}, threads {G.blas_threads()}; "
          f"{LEVEL_NAMES.get(N.level(), 'no int8 kernel')}, {N.threads()} threads")
    level = N.level() if args.n % 16 == 0 else N.LEVEL_NONE
    # The int8 kernel first: after any OpenBLAS call its idle workers spin for a while
    # (OPENBLAS_THREAD_TIMEOUT) and take the core the kernel's helper thread would use.
    if level == N.LEVEL_VNNI and not args.no_onnxruntime:
        bench_against_onnxruntime(args.rows, args.n, args.repeat, level)
    print("MatrixMultiply (execute_instruction):")
    for flags in ("O", "", "U", "H", "D", "HD"):
        bench_mmc(args.rows, args.n, args.repeat, flags, G.HAVE_BLAS, level)
    if level == N.LEVEL_VNNI:              # (H with D stays on the float path at AVX2)
        for flags in ("O", "H"):
            bench_mmc(args.rows, args.n, args.repeat, flags, G.HAVE_BLAS, N.LEVEL_AVX2)
    if level and G.HAVE_BLAS:
        for flags in ("O", "HD"):
            bench_mmc(args.rows, args.n, args.repeat, flags, True, N.LEVEL_NONE)
    bench_mmc(args.rows, args.n, max(3, args.repeat // 4), "O", False, N.LEVEL_NONE)
    bench_gemm(args.rows, args.n, args.repeat)
    print("Activate (execute_instruction):")
    for flags, pool in (("", 1), ("R", 1), ("T", 1), ("Q", 1), ("RM", 2), ("A", 4)):
        bench_act(args.rows, args.n, args.repeat, flags, pool)
    # a compiled Dense / Conv layer: per-column bias and requantization (P), fixed point and
    # onnxruntime's float32 form
    for act_float in (0, 1):
        bench_act(args.rows, args.n, args.repeat, "RP", 1, act_float)


if __name__ == "__main__":
    main()

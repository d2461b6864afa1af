"""Sweep throughput and client memory.

    python benchmarks/bench_sweep.py [scaling|memory|figure11|all] [--points N] [--cold]

scaling: the same >= 100-point sweep (full arithmetic: a 3-layer MLP of 4096 x 4096 at
         batch 256, its QDQ ONNX model compiled by tpuasm.compile as the apps are, one
         point ~0.5 s on an idle core; smaller programs now run in
         milliseconds, so the sweep's own per-point overhead would be what is measured)
         on a LocalCluster of 1 worker, then of every core; prints both wall times and
         the speed-up, next to the ideal (the core count).
memory:  a 10,000-point sweep of a tiny program (array 16, timing-only) streamed to CSV; prints the client's peak RSS next to its RSS before the
         sweep, and the points per second.
figure11: every Figure 11 point (the six apps x 5 knobs x 5 factors + TPU', timing-only),
         each run in this process on one core by the sweep's own run_point, after one
         untimed pass that compiles the apps and fills the table cache (as a warm `make
         figure11` finds them): the CPU and wall time of every point, per app and array
         shape, the slowest point named.  Then `make figure11`'s command with an empty
         result cache (a fresh sqlite file), its wall time; `--cold` also times it with
         no compiled apps (a temporary XDG_CACHE_HOME holding only the built run loop and
         kernel: every app's model written and compiled for all 13 shapes in the run).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tpuasm.apps.catalog import mlp  # noqa: E402
from tpuasm.apps.onnx_models import quantized_model  # noqa: E402
from tpuasm.sweep.engine import run_sweep  # noqa: E402
from tpuasm.cluster import dask_client  # noqa: E402
from tpuasm.sweep.grid import Grid, parse_set  # noqa: E402
from tpuasm.sweep.report import CsvStream  # noqa: E402
from tpuasm.sweep.targets import resolve  # noqa: E402

TINY = """\
.config array_size=16
.host x, 8
.ub a, 8
.acc s, 8
        RW 0
        RHM host.x, ub.a, 8
        MMC.SO ub.a, acc.s, 8
        ACT.R acc.s, ub.a, 8
        WHM ub.a, host.x, 8
        HLT
"""


def write_target(folder: Path, source: str, host_rows: int, tiles: int, n: int):
    src = folder / "p.tasm"
    src.write_text(source)
    np.save(folder / "h.npy", np.zeros((host_rows, n), np.int8))
    np.save(folder / "w.npy", np.zeros((tiles, n, n), np.int8))
    return resolve([src], folder / "h.npy", folder / "w.npy")


def grid_of(points: int) -> Grid:
    side = max(2, int(round(points ** 0.5)))
    wb = ",".join(f"x{0.25 + 0.25 * i:g}" for i in range(side))
    lat = ",".join(str(100 * i) for i in range(side))
    return Grid([parse_set(f"weight_bytes_per_cycle={wb}"),
                 parse_set(f"host_latency_cycles={lat}")], {})


def timed_sweep(targets, grid, workers, out: Path, timing_only=False):
    stream = CsvStream(out, [a.name for a in grid.axes])
    start = time.perf_counter()
    with dask_client(workers=workers) as client:
        client.run(_warm)                     # numba import and JIT cache load, not timed
        start = time.perf_counter()
        summary = run_sweep(targets, grid, stream.write, client=client,
                            timing_only=timing_only)
    seconds = time.perf_counter() - start
    stream.close()
    return seconds, summary


def _warm():
    """Import the machine and run a tiny program once, so numba's compile (or cache load)
    happens in every worker before the clock starts."""
    from tpuasm.assembler import assemble
    from tpuasm.machine import Machine, MachineConfig
    m = Machine(MachineConfig(array_size=16))
    m.load(assemble(TINY, "warm.tasm"), host=np.zeros((8, 16), np.int8),
           weights=np.zeros((1, 16, 16), np.int8))
    m.run()


def compiled_mlp(folder: Path, widths: list[int], batch: int):
    """(source, host rows, weight tiles) of an FC stack, compiled from its QDQ ONNX model
    (tpuasm.apps.onnx_models, the apps' builder) by tpuasm.compile."""
    import onnx

    from tpuasm.compiler import compile as compile_model
    path = folder / "mlp.onnx"
    onnx.save(quantized_model(mlp("bench", widths, batch)), str(path))
    compiled = compile_model(path, batch=batch)
    (program,) = [s.program for s in compiled.steps if getattr(s, "program", None)]
    return program.source, program.host_rows, int(program.weights.shape[0])


def scaling(points: int) -> None:
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        source, host_rows, tiles = compiled_mlp(d, [4096] * 4, 256)
        targets = write_target(d, source, host_rows, tiles, 256)
        grid = grid_of(points)
        t1, s1 = timed_sweep(targets, grid, 1, d / "one.csv")
        tn, sn = timed_sweep(targets, grid, cores, d / "all.csv")
    print(f"scaling: {s1.total} points of a 3-layer 4096x4096 MLP (batch 256), full runs")
    print(f"  1 worker:  {t1:7.1f} s  ({s1.total / t1:.1f} points/s)  {s1.by_status}")
    print(f"  {cores} workers: {tn:7.1f} s  ({sn.total / tn:.1f} points/s)  {sn.by_status}")
    print(f"  speed-up {t1 / tn:.2f}x (ideal {cores}x on this machine's {cores} cores)")


def memory(points: int) -> None:
    timing_only = True
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        targets = write_target(d, TINY, 8, 1, 16)
        grid = grid_of(points)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        seconds, summary = timed_sweep(targets, grid, os.cpu_count() or 1, d / "big.csv",
                                       timing_only=timing_only)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        size = (d / "big.csv").stat().st_size
    print(f"memory: {summary.total:,} points ({'timing-only' if timing_only else 'full'}) "
          f"in {seconds:.1f} s ({summary.total / seconds:.0f} points/s), CSV {size / 1e6:.1f} MB")
    print(f"  client peak RSS {peak / 1024:.0f} MiB (before the sweep: {before / 1024:.0f} MiB, "
          f"growth {(peak - before) / 1024:.0f} MiB)  {summary.by_status}")


def figure11_tasks():
    """The tasks of `python -m tpuasm.apps.figure11` (its grids, TPU' included)."""
    from tpuasm.apps.figure11 import FACTORS, KNOB_ORDER, tpu_prime_grids
    from tpuasm.apps.paper import APPS
    from tpuasm.sweep.engine import tasks
    from tpuasm.sweep.targets import Target
    factors = ",".join(f"{f:g}" for f in FACTORS)
    grids = [Grid([parse_set(f"{k}={factors}") for k in KNOB_ORDER], {}, each=True),
             *tpu_prime_grids()]
    targets = [Target("app", a) for a in APPS]
    return [t for g in grids for t in tasks(targets, g, timing_only=True)]


def figure11_points() -> None:
    from tpuasm.apps.programs import app_program
    from tpuasm.sweep.point import run_point
    from tpuasm.sweep.targets import _assembled_app
    todo = figure11_tasks()
    for task in todo:                      # untimed: compile the apps, fill the table cache
        run_point(task)
    times = []
    for task in todo:
        # what a fresh worker pays: the program from the disk caches, not this process's
        _assembled_app.cache_clear()
        app_program.cache_clear()
        cpu, wall = time.process_time(), time.perf_counter()
        row = run_point(task)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        setting = ", ".join(f"{k}={v}" for k, v in task["settings"].items() if v != "1")
        times.append((cpu, wall, row["target"], row.get("array"), setting or "baseline",
                      row["status"]))
    print(f"figure11 points: {len(times)} timing-only points, each on one core in this "
          f"process (run_point: program from the caches, load, run, counters)")
    print(f"  {'app':6} {'array':>5} {'points':>6} {'CPU s max':>9} {'wall s max':>10} "
          f"{'CPU s total':>11}")
    groups: dict = {}
    for cpu, wall, app, array, setting, status in times:
        groups.setdefault((app, array), []).append((cpu, wall))
    for (app, array), v in sorted(groups.items(), key=lambda i: (i[0][0], i[0][1] or 0)):
        print(f"  {app:6} {array!s:>5} {len(v):6d} {max(c for c, _ in v):9.3f} "
              f"{max(w for _, w in v):10.3f} {sum(c for c, _ in v):11.3f}")
    cpu, wall, app, array, setting, status = max(times)
    print(f"  slowest point: {app} {setting} (array {array}, {status}): {cpu:.3f} s CPU, "
          f"{wall:.3f} s wall; all {len(times)}: {sum(t[0] for t in times):.1f} s CPU")
    bad = [t for t in times if t[5] != "ok"]
    if bad:
        print(f"  not ok: {[(t[2], t[4], t[5]) for t in bad]}")


def figure11_cold(cold_compile: bool, workers: int | None = None) -> None:
    """`make figure11`'s command with an empty result cache (and, with cold_compile, no
    compiled apps either), timed as a whole; `workers=0`: in one process, no Dask."""
    import subprocess
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        env = dict(os.environ)
        if cold_compile:
            # a cache root without the compiled apps (and their tables) or results; the
            # run loop and the C kernel are linked in from the real one (building them is
            # a one-time cost of a new tpuasm, not of figure11)
            from tpuasm.cache import root
            env["XDG_CACHE_HOME"] = str(d / "xdg")
            mine = d / "xdg" / "tpuasm"
            mine.mkdir(parents=True)
            for item in root().glob("*"):
                if item.name.startswith(("aot-", "native-", "numba-")):
                    (mine / item.name).symlink_to(item)
        cmd = [sys.executable, "-m", "tpuasm.apps.figure11", "--out", str(d / "figure11"),
               "--cache", str(d / "results.sqlite")]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=HERE.parent, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - start
    what = "no compiled apps, tables or results cached" if cold_compile else \
        "empty result cache, apps compiled"
    status = "ok" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr[-500:]}"
    where = "one process (--workers 0)" if workers == 0 else \
        f"local cluster of {workers or os.cpu_count()} workers"
    print(f"figure11 cold ({what}): {seconds:.1f} s wall, {where} ({status})")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", nargs="?", default="all",
                   choices=("scaling", "memory", "figure11", "all"))
    p.add_argument("--points", type=int)
    p.add_argument("--cold", action="store_true",
                   help="figure11: also time it with nothing cached (compiles every app)")
    args = p.parse_args()
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    if args.what in ("scaling", "all"):
        scaling(args.points or 100)
    if args.what in ("memory", "all"):
        memory(args.points or 10_000)
    if args.what in ("figure11", "all"):
        figure11_points()
        figure11_cold(False)
        figure11_cold(False, workers=0)
        if args.cold:
            figure11_cold(True)
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Debugger responsiveness on the real machine shape (N = 256, UB 98,304 x 256).

Prints:
  * start-up to first frame at 80x24: fresh processes import everything, assemble
    programs/matmul_tiled, load its data and paint the first frame (headless); min and
    median of the total and its parts (interpreter, imports, load, frame, CPU time);
  * step latency with every pane visible and the 256-wide UB view focused: a key press
    (Pilot) until the repainted screen is idle, p50/p95 over single cycle steps and
    single instruction steps; and the handler part alone (command + pane updates).

  * `step p95 = X ms`: the worst p95 of the two, key to paint (issue 13: <= 30 ms);
  * a long run (~500k cycles): `continue` in the app, the longest gap between two screen
    paints while it runs (the screen stays live), and the whole-run timeline's redraw.

Targets: step p95 <= 30 ms (issue 13), start-up <= 0.6 s at 80x24 (issue 23).
Usage: python benchmarks/bench_debugger.py [--steps 200] [--size 200x60] [--steps-only]
       python benchmarks/bench_debugger.py --baseline DIR [--rounds 3] [--steps 40]
(--baseline: the same start-up and step measurements of older code checked out in DIR,
alternating with this code, side by side.)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "programs" / "matmul_tiled" / "matmul_tiled.tasm"
SIZE = (200, 60)
# ~500k cycles at N = 256 with few instructions: host reads of 200 rows, back to back
LONG_RUN = """\
.host x, 200
.ub   input, 200
.rept {reps}
    RHM host.x, input, 200
.endr
    HLT
"""


def make_data(out: Path) -> None:
    sys.path.insert(0, str(PROGRAM.parent))
    import gen  # noqa: E402 - the program's own data generator
    gen.generate(out)


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def first_frame(data: Path, size: tuple[int, int]) -> dict:
    """Run inside a fresh process: the time from the parent's start of the process to the
    first painted frame, in parts: interpreter start, imports, load (assemble + data), the
    first frame; and this process's CPU time up to that paint, and which heavy modules got
    imported on the way."""
    t0 = time.time()
    try:                                     # what `tpuasm debug` does first (not in older code)
        from debugger import blas_start
        blas_start.start_single_threaded()
    except ImportError:
        pass
    from argparse import Namespace
    from debugger.app import DebuggerApp
    from debugger.cli import load_session
    t1 = time.time()
    session = load_session(Namespace(program=PROGRAM, host=data / "host.npy",
                                     weights=data / "weights.npy", config=[]))
    t2 = time.time()
    # the first frame: the first screen paint after the app's on_mount (which fills the
    # panes) has run -- not the idle point after it, where work deferred past the first
    # paint would count too
    from textual.screen import Screen
    mounted, painted = [], []
    on_mount, paint = DebuggerApp.on_mount, Screen._compositor_refresh

    def timed_mount(self):
        on_mount(self)
        mounted.append(True)

    def timed_paint(self):
        paint(self)
        if mounted and not painted:
            painted.append((time.time(), time.process_time()))
    DebuggerApp.on_mount, Screen._compositor_refresh = timed_mount, timed_paint
    app = DebuggerApp(session)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        t3, cpu = painted[0] if painted else (time.time(), time.process_time())
        settled, cpu_settled = time.time(), time.process_time()
    start = float(os.environ["BENCH_T0"])
    heavy = [m for m in ("numba", "onnx", "onnxruntime", "matplotlib", "dask", "scipy")
             if m in sys.modules]
    return dict(total=t3 - start, interpreter=t0 - start, imports=t1 - t0, load=t2 - t1,
                frame=t3 - t2, cpu=cpu, settled=settled - start, cpu_settled=cpu_settled,
                heavy=heavy)


def first_mmc_view(data: Path) -> tuple[float, bool]:
    """Run inside a fresh process: the first pipeline view with a MatrixMultiply in the
    matrix stage (its progress is the core's own rule) -- seconds, and whether numba got
    imported for it."""
    from argparse import Namespace
    from debugger.cli import load_session
    session = load_session(Namespace(program=PROGRAM, host=data / "host.npy",
                                     weights=data / "weights.npy", config=[]))
    m = session.machine
    m.pipeline()                            # (warm: the views with nothing in the matrix stage)
    mmc = next(i for i, ins in enumerate(session.program.instructions) if ins.key == "MMC")
    while not (0 <= m.times[mmc, 1] < m.cycle) and m.status == "paused":
        m.step(10)                          # (the times alone: no view asked yet)
    imported = "numba" in sys.modules
    t = time.perf_counter()
    states = m.pipeline()
    seconds = time.perf_counter() - t
    assert states[1].index == mmc, states[1]
    return seconds, "numba" in sys.modules and not imported


async def step_latency(data: Path, steps: int) -> dict[str, list[float]]:
    """Per key press: from posting the key to the end of the first screen paint after the
    command's handler returned ("key to paint"), and the handler alone.  The Pilot's own
    idle detection sleeps ~20 ms several times per press, so its press+pause round trip is
    printed too, with the same round trip for a key bound to nothing as the floor."""
    from argparse import Namespace
    from debugger.app import DebuggerApp
    from debugger.cli import load_session
    from debugger.memory_view import MemoryView
    session = load_session(Namespace(program=PROGRAM, host=data / "host.npy",
                                     weights=data / "weights.npy", config=[]))
    assert session.machine.ub.shape == (98_304, 256), session.machine.ub.shape
    app = DebuggerApp(session)
    handled: list[tuple[float, float]] = []       # (start, end) of each command handler
    # wall and CPU time at the end of each paint: 2 shared cores, so CPU time says how
    # much of the wall time was this process's own work

    original = app.execute

    def timed_execute(line, echo=True):
        t = time.perf_counter()
        original(line, echo)
        handled.append((t, time.perf_counter()))
    app.execute = timed_execute
    paints: list[tuple[float, float]] = []
    out: dict[str, list[float]] = {}
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        ub = app.query_one("#mem-ub", MemoryView)
        ub.focus()
        await pilot.pause()
        screen = app.screen
        paint = screen._compositor_refresh          # instrumentation only: when a paint ends

        def timed_paint():
            paint()
            paints.append((time.perf_counter(), time.process_time()))
        screen._compositor_refresh = timed_paint
        for key, label in (("s", "step cycle"), ("n", "step instruction"), ("b", "reverse step cycle"),
                           ("f12", "no-op key")):
            if key == "b":                          # somewhere in the middle, with history behind
                original("restart", False)
                await app.workers.wait_for_complete()   # (a command is refused while one runs)
                original("run 9000", False)
                await app.workers.wait_for_complete()
                await pilot.pause()
                assert session.machine.cycle == 9000, session.machine.cycle
            to_paint, cpu, handler, round_trip = [], [], [], []
            for _ in range(steps):
                handled.clear()
                paints.clear()
                t, c = time.perf_counter(), time.process_time()
                await pilot.press(key)
                await app.workers.wait_for_complete()
                await pilot.pause()
                end = time.perf_counter()
                round_trip.append(end - t)
                if handled:
                    done = handled[-1][1]
                    handler.append(done - handled[-1][0])
                    wall, cpu_end = next((p for p in paints if p[0] >= done), (end, time.process_time()))
                    to_paint.append(wall - t)
                    cpu.append(cpu_end - c)
                if session.finished:
                    original("restart", False)
                    await app.workers.wait_for_complete()
                    await pilot.pause()
            if to_paint:
                out[label + ": key to paint"] = to_paint
                out[label + ": key to paint, CPU"] = cpu
                out[label + ": handler"] = handler
            out[label + ": Pilot round trip"] = round_trip
    return out


async def long_run(data: Path, target_cycles: int = 500_000) -> dict:
    """`continue` on a ~500k-cycle program in the app: how long, how many paints, and the
    longest gap between paints while the machine runs; then the whole-run timeline's redraw."""
    import numpy as np
    from debugger.app import DebuggerApp
    from debugger.session import Session
    from debugger.timeline import TimelinePane
    from tpuasm.assembler import assemble
    from tpuasm.machine import MachineConfig
    per = MachineConfig().host_cycles(200)
    reps = max(1, target_cycles // max(int(per), 1))
    program = assemble(LONG_RUN.format(reps=reps), "long.tasm")
    host = np.zeros((200, 256), dtype=np.int8)
    session = Session(program, host=host, source_name="long.tasm")
    app = DebuggerApp(session)
    paints: list[float] = []
    out = {}
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        paint = screen._compositor_refresh

        def timed_paint():
            paint()
            paints.append(time.perf_counter())
        screen._compositor_refresh = timed_paint
        t = time.perf_counter()
        app.execute("continue")
        while app.running:
            await asyncio.sleep(0.005)
        end = time.perf_counter()
        during = [p for p in paints if t <= p <= end]
        gaps = np.diff([t, *during, end])
        out.update(cycles=session.machine.cycle, seconds=end - t, paints=len(during),
                   max_gap=float(gaps.max()), instructions=len(program))
        await pilot.pause()
        pane = app.query_one(TimelinePane)
        pane.display = True
        await pilot.pause()
        pane.action_fit()
        draws = []
        for zoom_action in ("fit", "zoom_in", "zoom_in", "scroll"):
            pane._wave_key = None            # a new machine state: rebuild from the intervals
            t = time.perf_counter()
            if zoom_action == "zoom_in":
                pane.action_zoom(0.5)
            elif zoom_action == "scroll":
                pane.action_scroll(1)
            else:
                pane.action_fit()
            draws.append(time.perf_counter() - t)
        out["timeline_ms"] = [1000 * d for d in draws]
    return out


def _figures(times: list[float]) -> str:
    ms = [1000 * t for t in times]
    return (f" p50 {statistics.median(ms):6.1f} ms  p95 {percentile(ms, 0.95):6.1f} ms"
            f"  max {max(ms):6.1f} ms")


def compare(args, data: Path) -> tuple[dict, dict]:
    """The step measurement of this code and of the code in args.baseline, each in child
    processes (PYTHONPATH picks the code), alternating round by round so that both see the
    same load on the shared machine."""
    here, there = {}, {}
    for _ in range(args.rounds):
        for path, into in ((str(ROOT), here), (str(Path(args.baseline).resolve()), there)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, os.environ.get("PYTHONPATH", "")]))
            child = subprocess.run([sys.executable, __file__, "--steps-json", str(data),
                                    "--steps", str(args.steps), "--size", args.size],
                                   env=env, capture_output=True, text=True, check=True)
            for label, times in json.loads(child.stdout.strip().splitlines()[-1]).items():
                into.setdefault(label, []).extend(times)
    return here, there


STARTUP_SIZE = (80, 24)


def startup(args, data: Path) -> None:
    """Start-up to the first frame at STARTUP_SIZE in fresh processes, --startup-rounds
    times (after one warm-up run per code base, which fills the bytecode and numba caches),
    alternating with the code in --baseline when given so that both see the same load.
    Python's bytecode cache is on for the children (in a temporary PYTHONPYCACHEPREFIX), as
    on a user's machine, whatever PYTHONDONTWRITEBYTECODE says here."""
    codes = [("this code", str(ROOT))]
    if args.baseline:
        codes.append(("baseline", str(Path(args.baseline).resolve())))
    runs: dict[str, list[dict]] = {name: [] for name, _ in codes}
    with tempfile.TemporaryDirectory() as cache:
        for round_ in range(args.startup_rounds + 1):
            for name, path in codes:
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                    [path, os.environ.get("PYTHONPATH", "")]),
                    PYTHONPYCACHEPREFIX=os.path.join(cache, name.replace(" ", "_")))
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                env["BENCH_T0"] = repr(time.time())
                child = subprocess.run([sys.executable, __file__, "--first-frame", str(data),
                                        "--startup-size", args.startup_size],
                                       env=env, capture_output=True, text=True, check=True)
                if round_:                              # round 0 warms the caches
                    runs[name].append(json.loads(child.stdout.strip().splitlines()[-1]))
    cols, rows = STARTUP_SIZE
    print(f"start-up to first frame at {cols}x{rows}, {args.startup_rounds} fresh processes "
          f"each (load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores), seconds min / median:")
    for name, results in runs.items():
        parts = "  ".join(
            f"{part} {min(r[part] for r in results):.2f}/"
            f"{statistics.median(r[part] for r in results):.2f}"
            for part in ("total", "interpreter", "imports", "load", "frame", "cpu", "settled",
                         "cpu_settled"))
        heavy = sorted({m for r in results for m in r["heavy"]})
        print(f"  {name:<10} {parts}  heavy imports: {', '.join(heavy) or 'none'}")
    print("  (total: wall time from the process's start to the first paint after the app's "
          "on_mount, target <= 0.6 s; cpu: the process's own CPU time up to it; settled: wall "
          "time until the app is idle after it, work deferred past the first paint included; "
          "cpu_settled: CPU time until then)")


def main() -> int:
    global SIZE, STARTUP_SIZE
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--size", default=f"{SIZE[0]}x{SIZE[1]}", help="terminal COLSxROWS")
    p.add_argument("--long-cycles", type=int, default=500_000)
    p.add_argument("--steps-only", action="store_true",
                   help="only the step latencies (no start-up, no long run)")
    p.add_argument("--baseline", metavar="DIR",
                   help="also measure the steps of the code checked out in DIR (e.g. `git "
                        "worktree add /tmp/before <commit>`), alternating with this code in "
                        "child processes (start-up and steps), and print both side by side (no long run)")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --baseline: alternate this many times (steps presses each)")
    p.add_argument("--startup-size", default="80x24", help="terminal COLSxROWS of the start-up")
    p.add_argument("--startup-rounds", type=int, default=5,
                   help="fresh processes per code base for the start-up (after a warm-up)")
    p.add_argument("--first-frame", metavar="DATA", help=argparse.SUPPRESS)
    p.add_argument("--steps-json", metavar="DATA", help=argparse.SUPPRESS)
    p.add_argument("--first-mmc", metavar="DATA", help=argparse.SUPPRESS)
    args = p.parse_args()
    SIZE = tuple(int(x) for x in args.size.lower().split("x"))
    STARTUP_SIZE = tuple(int(x) for x in args.startup_size.lower().split("x"))
    args.steps_only = args.steps_only or bool(args.steps_json)
    if not args.baseline:
        args.rounds = 1
    if args.first_frame:                       # the child process of the start-up measurement
        print(json.dumps(asyncio.run(first_frame(Path(args.first_frame), STARTUP_SIZE))))
        return 0
    if args.first_mmc:                         # the child of the first-MMC measurement
        print(json.dumps(first_mmc_view(Path(args.first_mmc))))
        return 0
    if args.steps_json:                        # a child of --baseline: the numbers only
        print(json.dumps(asyncio.run(step_latency(Path(args.steps_json), args.steps))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        make_data(data)
        if not args.steps_only:
            startup(args, data)
            child = subprocess.run([sys.executable, __file__, "--first-mmc", str(data)],
                                   capture_output=True, text=True, check=True)
            seconds, numba = json.loads(child.stdout.strip().splitlines()[-1])
            print(f"first view of a MatrixMultiply's progress in a fresh process: "
                  f"{1000 * seconds:.1f} ms ({'imports numba' if numba else 'no numba import'})")
        if args.baseline:
            results, baseline = compare(args, data)
        else:
            results, baseline = asyncio.run(step_latency(data, args.steps)), None
        print(f"step latency, terminal {SIZE[0]}x{SIZE[1]}, all panes, UB view 98,304 x 256 focused, "
              f"{args.steps * args.rounds} presses each (wall time; `CPU` = this process's CPU "
              f"time over the same span, on {os.cpu_count()} cores shared with other work, load "
              f"{os.getloadavg()[0]:.2f}):")
        if baseline is not None:
            print(f"  {'':<38}{'this code':<36}baseline ({args.baseline})")
        for label, times in results.items():
            line = f"  {label:<36}" + _figures(times)
            if baseline is not None and label in baseline:
                line += "   |" + _figures(baseline[label])
            print(line)
        p95 = max(percentile([1000 * t for t in results[k]], 0.95)
                  for k in ("step cycle: key to paint", "step instruction: key to paint"))
        print(f"step p95 = {p95:.1f} ms  (worst of cycle and instruction steps, key to paint; "
              f"target <= 30 ms)")
        if baseline is not None:
            old = max(percentile([1000 * t for t in baseline[k]], 0.95)
                      for k in ("step cycle: key to paint", "step instruction: key to paint"))
            print(f"baseline step p95 = {old:.1f} ms")
        if args.steps_only or args.baseline:
            return 0
        run = asyncio.run(long_run(data, args.long_cycles))
        print(f"long run: continue over {run['cycles']:,} cycles ({run['instructions']:,} "
              f"instructions) took {run['seconds']:.2f} s with {run['paints']} screen paints; "
              f"longest gap between paints {1000 * run['max_gap']:.0f} ms")
        print("whole-run timeline redraw (fit, zoom in x2, x4, scroll): "
              + ", ".join(f"{t:.1f}" for t in run["timeline_ms"]) + " ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

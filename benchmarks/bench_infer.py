"""End-to-end inference: `CompiledModel.run` (the emulator running every segment, host parts
in onnxruntime) against onnxruntime's own session on the SAME QDQ model (OUTDIR's
model.qdq.onnx), in one run, on the same rows.  TPU v1's timing does not depend on the data,
so everything tpuasm spends beyond onnxruntime is the price of emulating the chip's data path
and of the work around it (batching, host images, host parts).

    .venv/bin/python benchmarks/bench_infer.py [--repeat 3] [--only NAME]
    .venv/bin/python benchmarks/bench_infer.py scaling [--rows 4000]   # infer on 1 -> 2 workers
    .venv/bin/python benchmarks/bench_infer.py paths    # one batch: timed pipeline vs data path
    .venv/bin/python benchmarks/bench_infer.py phases [--only NAME]   # where the time goes

Prints, per model: rows and batch, tpuasm's time, onnxruntime's time, and the ratio (the
issue's goal: <= 2x on MLP0/CNN0 shapes, <= 10x on digits-sized models), then the same in
CPU time (all threads; steadier than wall time on a loaded machine), and the load.  The
minimum of `--repeat` runs after one warm-up run is reported for each.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _digits(name: str, rows: int):
    calib = np.load(ROOT / "programs" / "digits" / "calibration.npy")
    x = np.resize(calib, (rows,) + calib.shape[1:]).astype(np.float32)
    return ROOT / "programs" / "digits" / f"{name}.onnx", {"calibration": calib}, x


def _app(name: str, rows: int):
    from tpuasm.apps.onnx_models import calibration
    from tpuasm.apps.programs import model_file
    data = calibration(name, samples=rows, seed=3)
    (x,) = data.values()
    return model_file(name), {}, x


CASES = [   # label, builder, name, rows, batch
    ("digits MLP", _digits, "mlp", 512, 64),
    ("digits CNN", _digits, "cnn", 512, 64),
    ("MLP0 (Table 1)", _app, "MLP0", 2000, 200),
    ("CNN0 (Table 1)", _app, "CNN0", 64, 8),
]


def _best(fn, repeat: int) -> float:
    fn()                                     # warm-up: JIT, first-touch pages, sessions
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def _best_cpu(fn, repeat: int) -> float:
    """The least CPU time (all threads of this process) of `repeat` runs: on the shared
    machine it moves far less with the load than wall time does."""
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def _ort_run(session, x: np.ndarray) -> np.ndarray:
    """The session on all rows: at once when its batch is dynamic, else batch by batch (the
    last one padded), as the model was exported."""
    feed = session.get_inputs()[0]
    fixed = feed.shape[0] if isinstance(feed.shape[0], int) else None
    if fixed is None:
        return session.run(None, {feed.name: x})[0]
    parts = []
    for start in range(0, len(x), fixed):
        chunk = x[start:start + fixed]
        if len(chunk) < fixed:
            chunk = np.concatenate([chunk, np.zeros((fixed - len(chunk),) + x.shape[1:],
                                                    x.dtype)])
        parts.append(session.run(None, {feed.name: chunk})[0])
    return np.concatenate(parts)[:len(x)]


def measure(label, build, name, rows, batch, repeat):
    import onnxruntime as ort

    import tpuasm
    path, options, x = build(name, rows)
    model = tpuasm.compile(path, batch=batch, **options)
    ours = _best(lambda: model.run(x), repeat)
    ours_cpu = _best_cpu(lambda: model.run(x), repeat)
    options = ort.SessionOptions()
    session = ort.InferenceSession(str(model.reference_model), options,
                                   providers=["CPUExecutionProvider"])
    theirs = _best(lambda: _ort_run(session, x), repeat)
    theirs_cpu = _best_cpu(lambda: _ort_run(session, x), repeat)
    y_ours = next(iter(model.run(x).values()))
    y_theirs = _ort_run(session, x)
    same = float(np.mean(np.isclose(y_ours, y_theirs, rtol=0, atol=1e-6)))
    return label, rows, batch, ours, theirs, same, ours_cpu, theirs_cpu


def scaling(rows: int) -> None:
    """`tpuasm infer --workers 1` against `--workers 2` on the digits CNN (whole processes:
    the cluster's start-up is part of what a user waits for, and is printed alone)."""
    import subprocess
    import tempfile

    import tpuasm
    path, options, x = _digits("cnn", rows)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cnn"
        tpuasm.compile(path, batch=64, **options).save(out)
        np.save(Path(d) / "x.npy", x)
        base = [sys.executable, "-m", "tpuasm", "infer", str(out), str(Path(d) / "x.npy"),
                "-o", str(Path(d) / "y.npy"), "-q"]
        print(f"digits CNN, {rows} rows, batch 64, whole `tpuasm infer` processes")
        for label, extra in (("one process", []), ("--workers 1", ["--workers", "1"]),
                             ("--workers 2", ["--workers", "2"])):
            t = time.perf_counter()
            subprocess.run(base + extra, check=True)
            print(f"  {label:<12} {time.perf_counter() - t:6.2f} s", flush=True)


def paths(repeat: int) -> None:
    """One batch of each digits segment through the timed four-stage pipeline (Machine.run)
    and through the data path alone (Machine.run_data), the same memories asserted."""
    import tpuasm
    from tpuasm.compiler.runtime.steps import TpuStep
    for name in ("mlp", "cnn"):
        path, options, x = _digits(name, 64)
        model = tpuasm.compile(path, batch=64, **options)
        for step in (s for s in model.steps if isinstance(s, TpuStep)):
            rng = np.random.default_rng(0)
            inputs = {t.name: rng.integers(t.quant.qmin, t.quant.qmax + 1, (64,) + t.shape)
                      .astype(np.int8 if t.quant.signed else np.uint8)
                      for t in step.segment.inputs}
            host, binary, machine = step.program.host_image(inputs), step.binary(), \
                step.machine({})
            results = {}
            for label, run in (("pipeline", machine.run), ("data path", machine.run_data)):
                def once():
                    machine.load(binary, host=host, weights=step.program.weights)
                    run()
                seconds = _best(once, repeat)
                results[label] = (seconds, machine.ub.copy(), machine.acc.copy())
            (t1, ub1, acc1), (t2, ub2, acc2) = results.values()
            assert np.array_equal(ub1, ub2) and np.array_equal(acc1, acc2)
            print(f"digits {name.upper()} {step.name}: pipeline {t1 * 1e3:.2f} ms, data path "
                  f"{t2 * 1e3:.2f} ms ({t1 / t2:.1f} x), identical memories", flush=True)


def phases(repeat: int, only: str | None) -> None:
    """Where CompiledModel.run's time goes, per model: per-phase timers around one whole
    run (host parts, host images, the data path, reading outputs, the rest: batching and
    conversions), the data path split by instruction kind (the last group's host images run
    again with the machine's Activates, then its MatrixMultiplies, turned into NOPs: what
    each removes is its share), and cProfile's top functions."""
    import cProfile
    import pstats
    from collections import Counter

    import tpuasm
    from tpuasm.compiler.codegen.program import CompiledSegment
    from tpuasm.compiler.runtime.steps import HostStep, TpuStep
    from tpuasm.machine import Machine
    from tpuasm.machine.decoded import COL_OP, OP_ACT, OP_MMC, OP_NOP
    for label, build, name, rows, batch in CASES:
        if only and only.lower() not in label.lower():
            continue
        path, options, x = build(name, rows)
        model = tpuasm.compile(path, batch=batch, **options)
        model.run(x)
        spent = Counter()
        patched = []

        def timed(owner, attr, key):
            original = getattr(owner, attr)

            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    return original(*a, **k)
                finally:
                    spent[key] += time.perf_counter() - t
            setattr(owner, attr, wrapper)
            patched.append((owner, attr, original))

        timed(HostStep, "run", "host parts (onnxruntime)")
        timed(CompiledSegment, "host_images", "host images")
        timed(Machine, "run_batches", "data path (Machine.run_batches)")
        timed(CompiledSegment, "read_batches", "outputs read")
        images = {}                 # machine -> the host images of its last group
        keep = Machine.run_batches

        def keeping(machine, hosts, lanes=1):
            images[id(machine)] = (hosts.copy(), lanes)   # (outside the timer just set)
            return keep(machine, hosts, lanes)
        Machine.run_batches = keeping
        patched.append((Machine, "run_batches", keep))
        best = None
        for _ in range(repeat):
            spent.clear()
            t = time.perf_counter()
            model.run(x)
            total = time.perf_counter() - t
            if best is None or total < best[0]:
                best = (total, dict(spent))
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)
        total, parts = best
        print(f"{label}: {total * 1e3:.1f} ms, load {_load()}")
        for key, seconds in parts.items():
            print(f"  {key:<34} {seconds * 1e3:9.2f} ms  {seconds / total:6.1%}")
        rest = total - sum(parts.values())
        print(f"  {'the rest (batching, conversions)':<34} {rest * 1e3:9.2f} ms  "
              f"{rest / total:6.1%}")
        for step in (s for s in model.steps if isinstance(s, TpuStep)):
            machine = step._machine
            # the run's own images: Activate's integer divisions take longer on real data
            hosts, lanes = images[id(machine)]
            original = machine.prog.copy()
            shares = {}
            try:
                for what, ops in (("all", ()), ("without ACT", (OP_ACT,)),
                                  ("without MMC", (OP_MMC,)),
                                  ("without both", (OP_ACT, OP_MMC))):
                    machine.prog[:] = original
                    machine.prog[np.isin(machine.prog[:, COL_OP], ops), COL_OP] = OP_NOP
                    shares[what] = _best(lambda: machine.run_batches(hosts.copy(), lanes),
                                         repeat)
            finally:
                machine.prog[:] = original
            whole = shares["all"]
            print(f"  {step.name}: data path {whole * 1e3:.1f} ms for {len(hosts)} batches: "
                  f"Activate {(whole - shares['without ACT']) * 1e3:.1f} ms, MatrixMultiply "
                  f"{(whole - shares['without MMC']) * 1e3:.1f} ms, everything else "
                  f"{shares['without both'] * 1e3:.1f} ms")
        profile = cProfile.Profile()
        profile.enable()
        model.run(x)
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(6)


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", choices=("table", "scaling", "paths", "phases"),
                   default="table")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rows", type=int, default=4096, help="rows for `scaling`")
    p.add_argument("--only", help="run only the cases whose label contains this")
    args = p.parse_args(argv)
    if args.mode == "scaling":
        scaling(args.rows)
        return 0
    if args.mode == "paths":
        paths(args.repeat)
        return 0
    if args.mode == "phases":
        phases(args.repeat, args.only)
        return 0
    print(f"load {_load()}")
    print(f"{'model':<16} {'rows':>5} {'batch':>5} {'tpuasm':>10} {'onnxruntime':>12} "
          f"{'ratio':>7} {'identical':>9} {'CPU tpuasm':>11} {'CPU ort':>9} {'ratio':>7}")
    for case in CASES:
        if args.only and args.only.lower() not in case[0].lower():
            continue
        label, rows, batch, ours, theirs, same, cpu, cpu_ort = measure(*case, args.repeat)
        print(f"{label:<16} {rows:>5} {batch:>5} {ours * 1e3:>8.1f}ms {theirs * 1e3:>10.2f}ms "
              f"{ours / theirs:>6.1f}x {same:>9.2%} {cpu * 1e3:>9.1f}ms {cpu_ort * 1e3:>7.2f}ms "
              f"{cpu / max(cpu_ort, 1e-9):>6.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

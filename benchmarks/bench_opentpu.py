"""Whole-process runs of an OpenTPU program: `tpuasm run PROG.out` against a numpy-only
stand-in for OpenTPU's sim.py (benchmarks/opentpu_sim.py), side by side, same inputs,
outputs checked equal.  Printed, not asserted.

    python benchmarks/bench_opentpu.py [--layers 64] [--batch 255] [--runs 3]

The program: RHM of `batch` input rows, then per layer RW, MMC.SO, ACT.R in place (each
layer a 256 x 256 weight tile), then WHM and HLT -- OpenTPU's own instruction set and
binary format, assembled by `tpuasm asm --format opentpu`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def source(layers: int, batch: int) -> str:
    lines = [f"RHM 0, 0, {batch}"]
    for layer in range(layers):
        lines += [f"RW {layer}", f"MMC.SO 0, 0, {batch}", f"ACT.R 0, 0, {batch}"]
    lines += [f"WHM 0, 0, {batch}", "HLT"]
    return "\n".join(lines) + "\n"


def timed(cmd, env):
    """(wall, CPU user+sys) seconds of one fresh process."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"`{' '.join(map(str, cmd))}` failed: {err.strip()[-400:]}")
    return wall, usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--batch", type=int, default=255, help="rows per layer (OpenTPU: <= 255)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "p.a").write_text(source(args.layers, args.batch))
        rng = np.random.default_rng(7)
        np.save(d / "h.npy", rng.integers(-8, 8, (args.batch, 256)).astype(np.int8))
        np.save(d / "w.npy", rng.integers(-2, 3, (args.layers, 256, 256)).astype(np.int8))
        subprocess.run([sys.executable, "-m", "tpuasm", "asm", str(d / "p.a"), "--format",
                        "opentpu", "-o", str(d / "p.out"), "--config", "array_size=256"],
                       check=True, env=env, capture_output=True)
        ours = [sys.executable, "-m", "tpuasm", "run", str(d / "p.out"), "--host",
                str(d / "h.npy"), "--weights", str(d / "w.npy"), "--out", str(d / "ours.npy"),
                "--config", "array_size=256", "-q"]      # OpenTPU's own arrays are 8 or 16
        theirs = [sys.executable, str(ROOT / "benchmarks" / "opentpu_sim.py"), str(d / "p.out"),
                  str(d / "h.npy"), str(d / "w.npy"), str(d / "theirs.npy")]
        timed(ours, env)                       # warm the caches
        results = {"tpuasm run": [], "numpy sim.py model": []}
        for _ in range(args.runs):
            results["tpuasm run"].append(timed(ours, env))
            results["numpy sim.py model"].append(timed(theirs, env))
        same = np.array_equal(np.load(d / "ours.npy"), np.load(d / "theirs.npy"))
    med = {k: (float(np.median([w for w, _ in v])), float(np.median([c for _, c in v])))
           for k, v in results.items()}
    (ow, oc), (tw, tc) = med["tpuasm run"], med["numpy sim.py model"]
    print(f"OpenTPU program, {args.layers} layers of 256x256, {args.batch} rows, whole "
          f"processes, median of {args.runs} (outputs {'equal' if same else 'DIFFER'}):")
    print(f"  tpuasm run          wall {ow:6.2f} s   cpu {oc:6.2f} s")
    print(f"  numpy sim.py model  wall {tw:6.2f} s   cpu {tc:6.2f} s")
    print(f"  tpuasm is {tw / ow:.1f}x faster (wall), {tc / oc:.1f}x (cpu)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

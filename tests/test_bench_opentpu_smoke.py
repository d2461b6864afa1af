"""benchmarks/bench_opentpu.py still runs end to end (a tiny size): the benchmark behind a
README figure once broke silently when `tpuasm run` began to refuse OpenTPU images of an
array size OpenTPU does not have without --config array_size."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_opentpu_runs_and_outputs_agree():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_opentpu.py"),
                          "--layers", "2", "--batch", "4", "--runs", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-500:]
    assert "(outputs equal)" in out.stdout

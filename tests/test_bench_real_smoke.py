"""The benchmarks behind issue 20's figures still run: benchmarks/real_models.py on one model
of the corpus (its row agrees with the test suite's oracles), and bench_compile.py --float's
two models are the ~3 MB float models it says they are (onnxruntime runs them)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from real_models import run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_compile  # noqa: E402


def test_real_models_table_row():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_models.py"),
                          "--markdown", "resnet_basic_block"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-500:]
    (row,) = [line for line in out.stdout.splitlines() if "resnet_basic_block" in line]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "13" and cells[2] == "306,688"       # nodes, MACs per sample
    assert cells[4].endswith("%") and cells[7].endswith(" s")


def test_compile_cost_models_are_3_mb_float_models(tmp_path):
    for build in (bench_compile.build_float_mlp, bench_compile.build_sequence_cnn):
        path, data = tmp_path / f"{build.__name__}.onnx", tmp_path / f"{build.__name__}.npy"
        weights = build(path, data, rows=8)
        assert 650_000 <= weights <= 850_000
        assert 2.5e6 <= path.stat().st_size <= 3.5e6
        model = onnx.load(str(path))
        stored = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                     if t.name.endswith("weight"))
        assert stored == weights
        (y,) = run(model, {"x": np.load(data)})
        assert y.shape == (8, 10) and np.all(np.isfinite(y))


def test_ort_saved_forms_row():
    """benchmarks/real_models_ortsaved.py (make bench-ortsaved) on one model and form."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_models_ortsaved.py"),
                          "--only", "conv1d_audio", "--forms", "float-extended"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-500:]
    (row,) = [line for line in out.stdout.splitlines() if "conv1d_audio" in line]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "float-extended" and cells[2] == "100.0%", row

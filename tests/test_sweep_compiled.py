"""`tpuasm sweep OUTDIR`: a compiled model as a sweep target.

Oracles: at the shape the model was compiled for, `tpuasm run` of the folder's own
segment0.tasm with its host and weight images; at another array size, `tpuasm run` of the
folder `tpuasm compile --config array_size=N` writes from the same ONNX model (the whole
compiler, not the sweep's regeneration from the saved IR).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tpuasm.cli import main as tpuasm_main
from tpuasm.compiler.cli import compile_main
from tpuasm.sweep import cli
from tpuasm.sweep.point import COUNTERS
from tpuasm.sweep.targets import resolve

DIGITS = Path(__file__).resolve().parent.parent / "programs" / "digits"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The digits MLP compiled for 16 x 16 and, independently, for 32 x 32 arrays."""
    root = tmp_path_factory.mktemp("compiled")
    out = {}
    for n in (16, 32):
        out[n] = root / f"mlp{n}"
        assert compile_main([str(DIGITS / "mlp.onnx"), "-o", str(out[n]), "--batch", "8",
                             "--calibrate", str(DIGITS / "calibration.npy"),
                             "--config", f"array_size={n}", "-q"]) == 0
    return out


def run_stats(folder: Path, tmp_path: Path, config: str) -> dict:
    stats = tmp_path / "stats.json"
    assert tpuasm_main(["run", str(folder / "segment0.tasm"), "--host",
                        str(folder / "segment0.host.npy"), "--weights",
                        str(folder / "segment0.weights.npy"), "-q", "--stats", str(stats),
                        "--config", config]) == 0
    return json.loads(stats.read_text())


def test_outdir_sweep_equals_direct_runs_and_recompiles_for_other_sizes(compiled, tmp_path):
    out = tmp_path / "r.csv"
    assert cli.main([str(compiled[16]), "--set", "array_size=16,32",
                     "--set", "weight_bytes_per_cycle=2,48", "-o", str(out), "--workers", "0",
                     "--no-cache", "--no-table", "-q"]) == 0
    rows = list(csv.DictReader(out.open()))
    # one target (the model's one TPU segment), not also its regression/ manifest
    assert {r["target"] for r in rows} == {"mlp16/segment0"} and len(rows) == 4
    for r in rows:
        n, bw = int(r["array_size"]), r["weight_bytes_per_cycle"]
        want = run_stats(compiled[n], tmp_path, f"weight_bytes_per_cycle={bw}")
        assert r["status"] == "ok" and int(r["cycles"]) == want["cycles"], r
        for name in COUNTERS:       # integers exact; the utilization rounded to 1e-6
            assert float(r[name]) == pytest.approx(want[name], abs=1e-6), (name, r)
    cycles = {(r["array_size"], r["weight_bytes_per_cycle"]): int(r["cycles"]) for r in rows}
    assert cycles[("16", "2")] > cycles[("16", "48")]      # weight-bound at 2 bytes/cycle


def test_recompiled_segment_runs_the_same_sample_batch(compiled):
    """The regenerated host image is the 32 x 32 compile's own (same seeded batch)."""
    from tpuasm.sweep.targets import build
    (target,) = resolve([compiled[16]])
    config = {**target.base_config(), "array_size": 32}
    program, host, weights, _ = build(target, config)
    np.testing.assert_array_equal(host, np.load(compiled[32] / "segment0.host.npy"))
    np.testing.assert_array_equal(weights, np.load(compiled[32] / "segment0.weights.npy"))


def test_a_shape_the_back_end_cannot_fit_is_skipped_with_its_reason(compiled, tmp_path, capsys):
    out = tmp_path / "r.csv"
    assert cli.main([str(compiled[16]), "--set", "ub_rows=8,1024", "-o", str(out),
                     "--workers", "0", "--no-cache", "--no-table", "-q"]) == 0
    by = {r["ub_rows"]: r for r in csv.DictReader(out.open())}
    assert by["1024"]["status"] == "ok"
    assert by["8"]["status"] == "skipped"
    assert "the Unified Buffer has 8" in by["8"]["error"]
    assert "skipped mlp16/segment0" in capsys.readouterr().err


def test_useful_macs_are_the_networks_own(compiled, tmp_path):
    """digits MLP: 64 x 64 + 64 x 10 MACs per sample, batch 8 (the array's padding to
    16 x 16 tiles is not counted)."""
    out = tmp_path / "r.csv"
    assert cli.main([str(compiled[16]), "--set", "array_size=16", "-o", str(out),
                     "--workers", "0", "--no-cache", "--no-table", "-q"]) == 0
    (row,) = csv.DictReader(out.open())
    macs = 8 * (64 * 64 + 64 * 10)
    assert float(row["useful_pct"]) == pytest.approx(
        100 * macs / (int(row["cycles"]) * 16 * 16), abs=1e-3)


def test_timing_only_equals_full_on_a_compiled_model(compiled, tmp_path):
    """Real (non-zero) weights and inputs, at the compiled shape and recompiled."""
    rows = {}
    for mode in ("full", "timing-only"):
        out = tmp_path / f"{mode}.csv"
        extra = ["--timing-only"] if mode == "timing-only" else []
        assert cli.main([str(compiled[16]), "--set", "array_size=16,32", "--set",
                         "weight_bytes_per_cycle=2,48", "-o", str(out), "--workers", "0",
                         "--no-cache", "--no-table", "-q", *extra]) == 0
        rows[mode] = [{k: v for k, v in r.items() if k not in ("wall_s", "key")}
                      for r in csv.DictReader(out.open())]
    assert len(rows["full"]) == 4 and rows["full"] == rows["timing-only"]


def test_a_compiled_model_missing_a_file_is_one_clear_error(compiled, tmp_path, capsys):
    import shutil
    broken = tmp_path / "broken"
    shutil.copytree(compiled[16], broken)
    (broken / "segment0.ir.npz").unlink()
    code = cli.main([str(broken), "--set", "memory=1", "-o", str(tmp_path / "r.csv"),
                     "--workers", "0", "--no-cache"])
    err = capsys.readouterr().err
    assert code == 2 and "segment0 lacks its ir file" in err and "Traceback" not in err

"""An OUTDIR written before manifests carried digests (tpuasm/compiler/outdir.py,
spec/limits.md "Compiled models"): nothing vouches for its files, so an edit that keeps
the manifest's structure (a scale, a weight) would change the answer without a word.  It
is refused, before anything runs, with the command that makes a checked one; that
command, run as printed, gives an OUTDIR that runs and answers as the original did."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def tpuasm(*args, cwd) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "tpuasm", *map(str, args)], cwd=cwd,
                       capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests"))
    import float_models
    d = tmp_path_factory.mktemp("legacy")
    float_models.save(float_models.build([("gemm", 8), ("relu",)], (16,)), d / "m.onnx")
    np.save(d / "calib.npy", np.random.default_rng(0).normal(0, 1, (20, 16)).astype(np.float32))
    np.save(d / "x.npy", np.random.default_rng(1).normal(0, 1, (5, 16)).astype(np.float32))
    r = tpuasm("compile", "m.onnx", "--calibrate", "calib.npy", "--batch", "4", "-o", "OUT",
               "-q", cwd=d)
    assert r.returncode == 0, r.stderr
    r = tpuasm("infer", "OUT", "x.npy", "-o", "want.npy", cwd=d)
    assert r.returncode == 0, r.stderr
    return d


def _older(compiled: Path, name: str, edit=None) -> Path:
    """A copy of OUTDIR as an older tpuasm wrote it: no digests in its manifest."""
    d = compiled / name
    shutil.copytree(compiled / "OUT", d)
    m = json.loads((d / "manifest.json").read_text())
    del m["digest"], m["files"]
    if edit is not None:
        edit(d, m)
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def _scaled_weights(d: Path, m: dict) -> None:
    # keeps every shape and name: the structure check cannot see it
    with np.load(d / "segment0.ir.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["op0.weight"] = (arrays["op0.weight"] // 2).astype(arrays["op0.weight"].dtype)
    np.savez(d / "segment0.ir.npz", **arrays)


@pytest.mark.parametrize("edit", [None, _scaled_weights], ids=["as written", "weights edited"])
def test_an_outdir_without_digests_is_refused_with_the_command_to_recompile(compiled, edit):
    d = _older(compiled, f"OLD-{'edited' if edit else 'plain'}", edit)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    r = tpuasm("infer", d.name, "x.npy", "-o", "y.npy", cwd=compiled)
    assert r.returncode == 2 and not (compiled / "y.npy").exists()
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {d.name}: compiled by an older tpuasm: its manifest has "
                           "no digests"), line
    assert f"`tpuasm compile m.onnx -o {d.name}`" in line
    assert before == {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}   # untouched


def test_the_printed_command_makes_an_outdir_that_answers_as_the_original(compiled):
    d = _older(compiled, "OLD-again")
    r = tpuasm("infer", d.name, "x.npy", "-o", "y.npy", cwd=compiled)
    command = r.stderr.split("`")[1]
    args = shlex.split(command)[1:] + ["--batch", "4", "--calibrate", "calib.npy", "-q"]
    assert tpuasm(*args, cwd=compiled).returncode == 0
    assert "digest" in json.loads((d / "manifest.json").read_text())
    r = tpuasm("infer", d.name, "x.npy", "-o", "y.npy", cwd=compiled)
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(compiled / "y.npy"), np.load(compiled / "want.npy"))


def test_the_debugger_refuses_it_too(compiled):
    """`tpuasm debug OUTDIR` opens a segment only after the checks infer makes."""
    d = _older(compiled, "OLD_DEBUG")
    (compiled / "s.tdb").write_text("continue\nexpect retired > 0\n")
    r = tpuasm("debug", d.name, "--batch", "s.tdb", cwd=compiled)
    assert r.returncode == 2
    assert "compiled by an older tpuasm" in r.stderr and "tpuasm compile" in r.stderr
    r = tpuasm("debug", "OUT", "--batch", "s.tdb", cwd=compiled)
    assert r.returncode == 0, r.stderr

"""The compiler's seams: one --config parser shared with `tpuasm run`, the back end imported
for real (an ImportError in it is shown, never taken for "no TPU programs"), regression
manifests written by the regression package's TOML writer, and no import circle between
OUTDIR and the pipeline."""
from __future__ import annotations

import math
import sys
import tomllib

import numpy as np
import pytest

import float_models
from tpuasm.compiler import load
from tpuasm.compiler.cli import compile_main
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.pipeline import compile_model, parse_config
from tpuasm.regression import toml
from tpuasm.regression.manifest import load_manifest
from tpuasm.regression.runner import run_manifest

MLP = [("gemm", 8), ("relu",), ("gemm", 4)]


def _mlp(tmp_path, name="mlp.onnx"):
    path = float_models.save(float_models.build(MLP, (6,)), tmp_path / name)
    calib = np.random.default_rng(0).normal(0, 1, (20, 6)).astype(np.float32)
    return path, calib


def test_compile_takes_run_s_config_syntax():
    assert parse_config(["array_size=128,fifo_depth=4", "clock_hz=1.4e9"]) == \
        {"array_size": 128, "fifo_depth": 4, "clock_hz": 1.4e9}
    with pytest.raises(CompileError, match="unknown setting 'warp'"):
        parse_config(["warp=9"])
    with pytest.raises(CompileError, match="fifo_depth must be an integer|fifo_depth"):
        parse_config(["array_size=16,fifo_depth=four"])


def test_compile_accepts_several_settings_in_one_option(tmp_path, capsys):
    path, calib = _mlp(tmp_path)
    np.save(tmp_path / "c.npy", calib)
    code = compile_main([path, "-o", str(tmp_path / "out"), "--batch", "4", "--calibrate",
                         str(tmp_path / "c.npy"), "--config", "array_size=16,fifo_depth=4", "-q"])
    assert code == 0, capsys.readouterr().err
    assert load(tmp_path / "out").config == {"array_size": 16, "fifo_depth": 4}


def test_a_broken_back_end_is_an_error_not_a_silent_fallback(tmp_path, monkeypatch):
    path, calib = _mlp(tmp_path)
    monkeypatch.setitem(sys.modules, "tpuasm.compiler.codegen", None)   # import fails
    with pytest.raises(ImportError):
        compile_model(path, batch=4, calibration=calib, config={"array_size": 16})


@pytest.mark.parametrize("text", ['we"ird', "back\\slash", "new\nline", "tab\tand\x01ctl",
                                  "ünïcode ✓", ""])
def test_toml_strings_read_back_exactly(text):
    rendered = toml.table("t", {"s": text, "key with space": 1}, comment=f"about {text}")
    assert tomllib.loads(rendered)["t"] == {"s": text, "key with space": 1}


def test_toml_values():
    doc = toml.table("a", {"i": -3, "f": 0.1, "b": True}) + \
        toml.table("r", {"x": 1}, array=True) + toml.table("r", {"x": 2}, array=True)
    assert tomllib.loads(doc) == {"a": {"i": -3, "f": 0.1, "b": True},
                                  "r": [{"x": 1}, {"x": 2}]}
    with pytest.raises(ValueError):
        toml.value(math.nan)


def test_a_model_with_an_awkward_name_gets_a_valid_regression_manifest(tmp_path):
    path, calib = _mlp(tmp_path, name='we"ird\\name.onnx')
    model = compile_model(path, batch=4, calibration=calib, config={"array_size": 16})
    out = model.save(tmp_path / "out")
    manifests = sorted((out / "regression").glob("*/test.toml"))
    assert manifests
    for manifest in manifests:
        m = load_manifest(manifest)
        assert m.name.startswith('we"ird\\name-')
        assert run_manifest(m).passed


def test_outdir_and_pipeline_do_not_import_each_other():
    import ast
    import inspect

    import tpuasm.compiler.outdir as outdir
    import tpuasm.compiler.pipeline as pipeline
    for module, other in ((outdir, "tpuasm.compiler.pipeline"),
                          (pipeline, "tpuasm.compiler.outdir")):
        tree = ast.parse(inspect.getsource(module))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert other not in imported


def test_the_stages_import_one_way():
    """front/ -> codegen/ -> runtime/: no stage imports a later one, except the step data
    types runtime/steps.py defines (what a compiled model is made of)."""
    import ast
    from pathlib import Path

    import tpuasm.compiler as compiler
    root = Path(compiler.__file__).parent
    order = {"front": 0, "codegen": 1, "runtime": 2}
    allowed = {"tpuasm.compiler.runtime.steps"}
    for stage, rank in order.items():
        for path in (root / stage).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                parts = node.module.split(".")
                if parts[:2] != ["tpuasm", "compiler"] or len(parts) < 3:
                    continue
                later = order.get(parts[2], -1) > rank
                assert not later or node.module in allowed, \
                    f"{stage}/{path.name} imports {node.module}"

"""Compiled models on the emulator (the back end's programs): against onnxruntime on the same
quantized model, on small machines (array_size=16, few accumulator rows, so K and N are not
multiples of the array and batches exceed the accumulators) and at the TPU's 256; OUTDIR's
regression manifests pass under `tpuasm test`; the programs name their ONNX nodes."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

pytest.importorskip("tpuasm.compiler.codegen")

import float_models  # noqa: E402
from onnx_models import run_ort  # noqa: E402
from tpuasm.compiler.pipeline import compile_model  # noqa: E402

SMALL = ["array_size=16", "acc_rows=64"]


def compiled(tmp_path, layers, input_shape, batch, config, seed=0):
    path = float_models.save(float_models.build(layers, input_shape, seed=seed),
                             tmp_path / "m.onnx")
    calib = np.random.default_rng(seed + 1).normal(0, 1, (40,) + input_shape).astype(np.float32)
    model = compile_model(path, batch=batch, calibration=calib, config=config)
    assert model.has_programs
    return model


def agreement(model, rows, seed=3):
    x = np.random.default_rng(seed).normal(0, 1.2, (rows,) + model.inputs[0].shape
                                           ).astype(np.float32)
    ours = model.run(x)["y"]
    (theirs,) = run_ort(onnx.load(str(model.reference_model)), {"x": x})
    scale = _output_scale(model)
    diff = np.rint(np.abs(ours.astype(np.float64) - theirs) / scale)
    return float(np.mean(diff == 0)), int(diff.max())


def _output_scale(model) -> float:
    qdq = onnx.load(str(model.reference_model))
    node = next(n for n in qdq.graph.node if n.output[0] == "y")
    init = next(t for t in qdq.graph.initializer if t.name == node.input[1])
    return float(onnx.numpy_helper.to_array(init))


@pytest.mark.parametrize("seed", range(2))
def test_mlp_on_a_small_machine(tmp_path, seed):
    rng = np.random.default_rng(seed)
    k, h, n = (int(v) for v in rng.integers(17, 70, size=3))
    model = compiled(tmp_path, [("gemm", h), ("relu",), ("gemm", n), ("sigmoid",),
                                ("gemm", 7)], (k,), batch=100, config=SMALL, seed=seed)
    same, worst = agreement(model, 150)
    assert worst <= 1 and same >= 0.999


def test_cnn_on_a_small_machine(tmp_path):
    layers = [("conv", 6, 3, 1, 1), ("relu",), ("maxpool", 2, 2, 0), ("conv", 9, 3, 1, 0),
              ("relu",), ("flatten",), ("gemm", 12), ("tanh",), ("gemm", 5)]
    model = compiled(tmp_path, layers, (2, 10, 10), batch=6, config=["array_size=16"])
    same, worst = agreement(model, 13)
    assert worst <= 1 and same >= 0.999


def test_mlp_at_256(tmp_path):
    model = compiled(tmp_path, [("gemm", 300), ("relu",), ("gemm", 10)], (270,), batch=20,
                     config=None)
    same, worst = agreement(model, 25)
    assert worst <= 1 and same >= 0.999


def test_outdir_passes_tpuasm_test_and_names_onnx_nodes(tmp_path):
    model = compiled(tmp_path, [("conv", 4, 3, 1, 1), ("relu",), ("flatten",), ("gemm", 6)],
                     (1, 5, 5), batch=4, config=["array_size=16"])
    out = tmp_path / "out"
    model.save(out)
    done = subprocess.run([sys.executable, "-m", "tpuasm", "test", str(out), "-q", "-j", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    from tpuasm import assemble
    program = assemble((out / "segment0.tasm").read_text())
    named = {program.node_of(i) for i in range(len(program.instructions))}
    assert {"conv0", "gemm3"} <= named

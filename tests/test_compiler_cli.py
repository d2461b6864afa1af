"""`tpuasm compile` / `tpuasm infer` through the real entry point, and OUTDIR round trips:
the outputs of infer equal onnxruntime's on the saved QDQ model, a loaded model runs like the
compiled one, an .npz carries several inputs and outputs."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import float_models
from onnx_models import run_ort
from tpuasm.compiler import load
from tpuasm.compiler.cli import compile_main, infer_main
from tpuasm.compiler.pipeline import compile_model

LAYERS = [("conv", 4, 3, 1, 1), ("relu",), ("maxpool", 2, 2, 0), ("flatten",), ("gemm", 10),
          ("softmax",)]


@pytest.fixture
def cnn(tmp_path):
    path = float_models.save(float_models.build(LAYERS, (1, 6, 6)), tmp_path / "cnn.onnx")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).normal(0, 1, (30, 1, 6, 6)).astype(np.float32))
    return path, calib


def test_compile_prints_the_report_and_writes_outdir(tmp_path, cnn, capsys):
    path, calib = cnn
    out = tmp_path / "out"
    code = compile_main([path, "-o", str(out), "--batch", "4", "--calibrate", str(calib),
                         "--config", "array_size=16"])
    text = capsys.readouterr().out
    assert code == 0
    for words in ("conv0", "TPU", "softmax5", "host", "Softmax has no TPU mapping",
                  "Batch 4, array 16x16"):
        assert words in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["batch"] == 4 and manifest["config"] == {"array_size": 16}
    assert [s["kind"] for s in manifest["steps"]] == ["host", "tpu", "host"]
    assert (out / "model.qdq.onnx").is_file() and (out / "report.txt").read_text() in text


def test_infer_equals_onnxruntime_on_the_saved_model(tmp_path, cnn, capsys):
    path, calib = cnn
    out = tmp_path / "out"
    assert compile_main([path, "-o", str(out), "--batch", "4", "--calibrate", str(calib),
                         "-q"]) == 0
    x = np.random.default_rng(1).normal(0, 1, (11, 1, 6, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    code = infer_main([str(out), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                       "--engine", "reference"])
    assert code == 0, capsys.readouterr().err
    y = np.load(tmp_path / "y.npy")
    (want,) = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"x": x})
    assert y.shape == (11, 10) and y.dtype == np.float32
    assert np.mean(y == want) >= 0.999 and np.abs(y - want).max() <= 1 / 256 + 1e-7


def test_loaded_model_runs_like_the_compiled_one(tmp_path, cnn):
    path, calib = cnn
    compiled = compile_model(path, batch=3, calibration=np.load(calib))
    compiled.save(tmp_path / "out")
    loaded = load(tmp_path / "out")
    x = np.random.default_rng(2).normal(0, 1, (7, 1, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run(x, engine="reference")["y"],
                                  loaded.run(x, engine="reference")["y"])
    assert loaded.report.text() == compiled.report.text()


def two_in_two_out(tmp_path):
    """a -> Gemm -> Relu -> Gemm -> y1;  y1 + b -> y2 (an Add on the host)."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.normal(0, 0.3, (6, 5)).astype(np.float32), "w1"),
             onnx.numpy_helper.from_array(rng.normal(0, 0.3, (5, 4)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["a", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y1"], name="mm2"),
             helper.make_node("Add", ["y1", "b"], ["y2"], name="add")]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 6]),
                       helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["N", 4])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "two.onnx"
    onnx.save(m, str(path))
    np.savez(tmp_path / "calib.npz", a=rng.normal(0, 1, (20, 6)).astype(np.float32),
             b=rng.normal(0, 1, (20, 4)).astype(np.float32))
    return path


def test_npz_for_several_inputs_and_outputs(tmp_path, capsys):
    path = two_in_two_out(tmp_path)
    out = tmp_path / "out"
    assert compile_main([str(path), "-o", str(out), "--batch", "5", "--calibrate",
                         str(tmp_path / "calib.npz"), "-q"]) == 0
    rng = np.random.default_rng(3)
    feeds = {"a": rng.normal(0, 1, (9, 6)).astype(np.float32),
             "b": rng.normal(0, 1, (9, 4)).astype(np.float32)}
    np.savez(tmp_path / "x.npz", **feeds)
    assert infer_main([str(out), str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz"),
                       "--engine", "reference"]) == 0
    with np.load(tmp_path / "y.npz") as y:
        got = {k: y[k] for k in y.files}
    want = run_ort(onnx.load(str(out / "model.qdq.onnx")), feeds)
    assert set(got) == {"y1", "y2"}
    np.testing.assert_array_equal(got["y1"], want[0])
    np.testing.assert_array_equal(got["y2"], want[1])
    assert infer_main([str(out), str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npy")]) == 2
    assert "write an .npz" in capsys.readouterr().err


def test_the_tpuasm_command_delegates(tmp_path, cnn):
    path, calib = cnn
    done = subprocess.run([sys.executable, "-m", "tpuasm", "compile", path, "-o",
                           str(tmp_path / "out"), "--calibrate", str(calib), "-q"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()
    help_ = subprocess.run([sys.executable, "-m", "tpuasm", "infer", "--help"],
                           capture_output=True, text=True, timeout=300)
    assert help_.returncode == 0 and "OUTDIR" in help_.stdout.upper()


def test_segment_files_name_what_the_debugger_loads(tmp_path, cnn):
    from tpuasm.compiler.errors import CompileError
    from tpuasm.compiler.outdir import segment_files
    path, calib = cnn
    out = tmp_path / "out"
    compile_model(path, batch=2, calibration=np.load(calib)).save(out)
    manifest = json.loads((out / "manifest.json").read_text())
    tpu = [s for s in manifest["steps"] if s["kind"] == "tpu"]
    if not tpu[0]["program"]:
        with pytest.raises(CompileError, match="holds no TPU program"):
            segment_files(out)
        return
    files = segment_files(out)
    assert files == segment_files(out / "segment0.tasm")
    assert files.program.is_file() and files.host.is_file() and files.weights.is_file()
    with pytest.raises(CompileError, match="no segment 'segment9'"):
        segment_files(out, "segment9")

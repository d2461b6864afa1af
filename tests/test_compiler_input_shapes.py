"""`--input-shape NAME=D0,D1,...` (front/batch.py): a dynamic dimension other than the batch
fixed from the command line, where no data fixes it (a quantized model compiles without
calibration data, so its sequence length was refused).  Oracles: onnxruntime on the QDQ
model at that shape, and one clear error for each bad option."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_models import quantized_by_onnxruntime
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.cli import compile_main, infer_main
from tpuasm.compiler.ort import session


def _sequence_model(rng) -> onnx.ModelProto:
    """x (N, T, 8) -> MatMul (8 -> 4) -> Relu: T is dynamic."""
    w = numpy_helper.from_array(rng.normal(0, 0.5, (8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="fc"),
         helper.make_node("Relu", ["a"], ["y"], name="relu")], "seq",
        [helper.make_tensor_value_info("x", T.FLOAT, ["N", "T", 8])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", "T", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def qdq(tmp_path):
    rng = np.random.default_rng(7)
    calib = rng.normal(0, 1, (24, 6, 8)).astype(np.float32)
    return quantized_by_onnxruntime(tmp_path, _sequence_model(rng), calib), calib


def test_a_quantized_model_s_sequence_length_is_given_on_the_command_line(tmp_path, capsys,
                                                                        qdq):
    path, x = qdq
    out = tmp_path / "out"
    assert compile_main([str(path), "-o", str(out), "--batch", "8"]) == 2
    err = capsys.readouterr().err
    assert "dimension 1 is dynamic" in err and "--input-shape x=D0,D1" in err
    assert compile_main([str(path), "-o", str(out), "--batch", "8",
                         "--input-shape", "x=N,6,8"]) == 0
    text = capsys.readouterr().out
    assert "on the TPU: 1,536 (100.0 %)" in text
    np.save(tmp_path / "x.npy", x)
    assert infer_main([str(out), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                       "-q"]) == 0
    got = np.load(tmp_path / "y.npy")
    want = session(path.read_bytes()).run(None, {"x": x})[0]
    scale = 1 / 255 * (want.max() - min(0.0, want.min()))
    assert got.shape == want.shape and np.abs(got - want).max() <= scale * 1.01


def test_the_api_takes_the_shapes_as_a_dict(qdq):
    path, x = qdq
    model = tpu_compile(str(path), batch=8, input_shapes={"x": ["N", 6, 8]})
    assert model.report.tpu_macs == model.report.macs > 0
    assert model.run(x[:3])["y"].shape == (3, 6, 4)


@pytest.mark.parametrize("option,message", [
    ("x=N,6", "2 dimensions given, the input has 3"),
    ("x=N,6,9", "dimension 2 is fixed to 8 in the model, not 9"),
    ("x=N,0,8", "dimension 1's size 0 is not positive"),
    ("x=N,-2,8", "dimension 1's size -2 is not positive"),
    ("x=N,6.5,8", "neither a positive integer nor a name"),
    ("nope=N,6,8", "names no input of the model"),
    ("x=N,65536,65536", "values a sample, more than"),
    ("x", "expected NAME=D0,D1"),
    ("x=", "expected NAME=D0,D1")])
def test_bad_input_shapes_are_one_clear_error(tmp_path, capsys, qdq, option, message):
    path, _ = qdq
    code = compile_main([str(path), "-o", str(tmp_path / "out"), "--input-shape", option])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_size_the_weights_do_not_allow_is_named(tmp_path, capsys):
    """x (N, K) -> MatMul (8 -> 4): K can only be 8."""
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", "K"])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    np.save(tmp_path / "c.npy", np.ones((4, 8), np.float32))
    code = compile_main([str(path), "-o", str(tmp_path / "out"), "--calibrate",
                         str(tmp_path / "c.npy"), "--input-shape", "x=N,7"])
    err = capsys.readouterr().err
    assert code == 2 and "given by --input-shape ('x' dimension 1 = 7) do not fit" in err

"""Every bad-input path of the compiler: one clear error naming the file (and node), exit
status 2 from the CLI, no traceback, and no OUTDIR (not even half of one)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import float_models
from tpuasm.compiler.cli import compile_main, infer_main
from tpuasm.compiler.pipeline import compile_model
from tpuasm.compiler.errors import CompileError


@pytest.fixture
def mlp(tmp_path):
    return float_models.save(float_models.build([("gemm", 12), ("relu",), ("gemm", 4)], (9,)),
                             tmp_path / "mlp.onnx")


@pytest.fixture
def calib(tmp_path):
    path = tmp_path / "calib.npy"
    np.save(path, np.random.default_rng(0).normal(0, 1, (20, 9)).astype(np.float32))
    return path


def run_compile(capsys, *argv):
    code = compile_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_missing_file(tmp_path, capsys):
    code, _, err = run_compile(capsys, tmp_path / "nope.onnx", "-o", tmp_path / "out")
    assert code == 2 and "nope.onnx: no such file" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_truncated_model(tmp_path, capsys, mlp, calib, cut):
    data = open(mlp, "rb").read()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(data[:int(len(data) * cut)])
    code, _, err = run_compile(capsys, bad, "-o", tmp_path / "out", "--calibrate", calib)
    assert code == 2 and "bad.onnx" in err
    assert not (tmp_path / "out").exists()


def test_garbage_file(tmp_path, capsys):
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"\xff\xfe not a protobuf \x00" * 10)
    code, _, err = run_compile(capsys, bad, "-o", tmp_path / "out")
    assert code == 2 and "garbage.onnx: not a readable ONNX model" in err


def test_unsupported_opset(tmp_path, capsys):
    # opsets below 10 are converted (tests/test_compiler_inputs.py); one newer than onnx's
    # own cannot be
    m = float_models.build([("gemm", 3)], (4,))
    newer = onnx.defs.onnx_opset_version() + 1
    m.opset_import[0].version = newer
    path = tmp_path / "new.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and f"opset {newer} is not supported" in err


def test_unknown_domain(tmp_path, capsys):
    m = float_models.build([("gemm", 3)], (4,))
    m.graph.node[0].domain = "com.example"
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    path = tmp_path / "dom.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "gemm0" in err and "com.example" in err


def test_float_model_without_calibration_says_what_to_pass(tmp_path, capsys, mlp):
    code, _, err = run_compile(capsys, mlp, "-o", tmp_path / "out")
    assert code == 2 and "float model" in err and "--calibrate" in err


def test_dynamic_batch_without_batch_takes_the_default(tmp_path, capsys, mlp, calib):
    from tpuasm.compiler import load
    from tpuasm.compiler.front.reader import DEFAULT_BATCH
    code, out, err = run_compile(capsys, mlp, "-o", tmp_path / "out", "--calibrate", calib)
    assert code == 0, err
    assert load(tmp_path / "out").batch == DEFAULT_BATCH and f"Batch {DEFAULT_BATCH}," in out


def test_dynamic_inner_dimension(tmp_path, capsys, calib):
    m = float_models.build([("gemm", 3)], (4,))
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "K"
    path = tmp_path / "dyn.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--batch", "2",
                               "--calibrate", calib)
    # fixed from the calibration data (9 columns), which the model's weight (4 rows) refuses
    assert code == 2 and "'x' dimension 1 = 9" in err and "do not fit the model" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_zero_sized_dimension_is_named_as_such(tmp_path, capsys, calib):
    m = float_models.build([("gemm", 3)], (4,))
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 0
    path = tmp_path / "zero.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--batch", "2",
                               "--calibrate", calib)
    assert code == 2 and "input 'x' has a 0-sized dimension" in err
    assert "dynamic" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_before_quantizing(tmp_path, capsys, calib, bad):
    import warnings
    from onnx import numpy_helper
    m = float_models.build([("gemm", 12), ("relu",), ("gemm", 4)], (9,))
    init = m.graph.initializer[2]                   # the second Gemm's weight
    w = numpy_helper.to_array(init).copy()
    w[1, 2] = bad
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    path = tmp_path / "nan.onnx"
    onnx.save(m, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # no numpy warning on the way
        code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--calibrate", calib)
    assert code == 2, err
    assert f"node gemm2: weight {init.name} holds NaN or infinite values" in err
    assert "scale issue" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("shape,message", [((20, 8), "has shape (20, 8)"),
                                           ((20,), "has shape (20,)"),
                                           ((0, 9), "non-zero")])
def test_calibration_of_the_wrong_shape(tmp_path, capsys, mlp, shape, message):
    path = tmp_path / "c.npy"
    np.save(path, np.zeros(shape, np.float32))
    code, _, err = run_compile(capsys, mlp, "-o", tmp_path / "out", "--calibrate", path,
                               "--batch", "4")
    assert code == 2 and "c.npy" in err and message in err


def test_calibration_not_numpy(tmp_path, capsys, mlp):
    path = tmp_path / "c.npy"
    path.write_text("hello")
    code, _, err = run_compile(capsys, mlp, "-o", tmp_path / "out", "--calibrate", path,
                               "--batch", "4")
    assert code == 2 and "c.npy" in err


def test_calibration_npz_missing_input(tmp_path, capsys, mlp):
    path = tmp_path / "c.npz"
    np.savez(path, other=np.zeros((3, 9), np.float32))
    code, _, err = run_compile(capsys, mlp, "-o", tmp_path / "out", "--calibrate", path,
                               "--batch", "4")
    assert code == 2 and "no calibration data for input(s) x" in err


def test_calibration_for_a_qdq_model_reads_it_back(tmp_path, capsys, mlp, calib):
    """A QDQ model with --calibrate is read back as float (test_compiler_qdqfloat.py); its
    quantization options still belong to float models."""
    compile_model(mlp, batch=2, calibration=np.zeros((3, 9), np.float32)).save(tmp_path / "o")
    qdq = tmp_path / "o" / "model.qdq.onnx"
    code, _, err = run_compile(capsys, qdq, "-o", tmp_path / "o2", "--calibrate", calib)
    assert code == 0, err
    assert "read back as float" in (tmp_path / "o2" / "report.txt").read_text()
    code, _, err = run_compile(capsys, qdq, "-o", tmp_path / "o3", "--per-tensor")
    assert code == 2 and "already quantized" in err


@pytest.mark.parametrize("argv,message", [(["--batch", "0"], "at least 1"),
                                          (["--config", "nonsense"], "KEY=VALUE"),
                                          (["--config", "array_size=0"], "--config")])
def test_bad_arguments(tmp_path, capsys, mlp, calib, argv, message):
    code, _, err = run_compile(capsys, mlp, "-o", tmp_path / "out", "--calibrate", calib,
                               *argv)
    assert code == 2 and message in err


def test_outdir_that_is_not_ours_is_not_replaced(tmp_path, capsys, mlp, calib):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.txt").write_text("do not delete")
    code, _, err = run_compile(capsys, mlp, "-o", out, "--calibrate", calib, "--batch", "2")
    assert code == 2 and "refusing to replace" in err
    assert (out / "thesis.txt").read_text() == "do not delete"


def test_recompiling_replaces_outdir_atomically(tmp_path, capsys, mlp, calib):
    out = tmp_path / "out"
    assert run_compile(capsys, mlp, "-o", out, "--calibrate", calib, "--batch", "2")[0] == 0
    assert run_compile(capsys, mlp, "-o", out, "--calibrate", calib, "--batch", "3")[0] == 0
    assert json.loads((out / "manifest.json").read_text())["batch"] == 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_failure_while_writing_leaves_no_outdir(tmp_path, mlp, monkeypatch):
    model = compile_model(mlp, batch=2, calibration=np.zeros((3, 9), np.float32))
    import tpuasm.compiler.outdir as outdir

    def explode(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(outdir, "_copy_reference", explode)
    with pytest.raises(CompileError, match="No space left"):
        model.save(tmp_path / "out")
    assert list(tmp_path.iterdir()) == [tmp_path / "mlp.onnx"]


# --- infer ------------------------------------------------------------------------------

@pytest.fixture
def compiled(tmp_path, mlp, calib):
    out = tmp_path / "out"
    compile_model(mlp, batch=4, calibration=calib).save(out)
    return out


def run_infer(capsys, *argv):
    code = infer_main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def test_infer_not_an_outdir(tmp_path, capsys):
    code, err = run_infer(capsys, tmp_path, tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert code == 2 and "not a compiled model" in err


def test_infer_corrupt_manifest(tmp_path, capsys, compiled):
    (compiled / "manifest.json").write_text("{")
    code, err = run_infer(capsys, compiled, tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert code == 2 and "manifest.json" in err


@pytest.mark.parametrize("shape,message", [((5, 8), "expected (rows, 9)"),
                                           ((9,), "add the rows dimension")])
def test_infer_wrong_input_shape(tmp_path, capsys, compiled, shape, message):
    np.save(tmp_path / "x.npy", np.zeros(shape, np.float32))
    code, err = run_infer(capsys, compiled, tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert code == 2 and message in err and not (tmp_path / "y.npy").exists()


def test_infer_npz_with_a_wrong_name(tmp_path, capsys, compiled):
    np.savez(tmp_path / "x.npz", image=np.zeros((2, 9), np.float32))
    code, err = run_infer(capsys, compiled, tmp_path / "x.npz", "-o", tmp_path / "y.npz")
    assert code == 2 and "missing input(s) x" in err


def test_infer_pickled_input_is_refused(tmp_path, capsys, compiled):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    code, err = run_infer(capsys, compiled, tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert code == 2 and "x.npy" in err


def test_infer_bad_output_suffix(tmp_path, capsys, compiled):
    np.save(tmp_path / "x.npy", np.zeros((2, 9), np.float32))
    code, err = run_infer(capsys, compiled, tmp_path / "x.npy", "-o", tmp_path / "y.txt")
    assert code == 2 and ".npy or .npz" in err


def test_model_with_a_non_tensor_input(tmp_path, capsys):
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph(
        [helper.make_node("SequenceLength", ["s"], ["n"]),
         helper.make_node("Cast", ["n"], ["y"], to=TensorProto.FLOAT)], "g", [seq], [out]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "seq.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--calibrate",
                               tmp_path / "none.npy")
    assert code == 2 and "seq.onnx" in err


def test_a_model_too_big_for_the_weight_memory(tmp_path, capsys):
    # a 96,000 x 96,000 int8 MatMul (8.6 GiB, 140,625 tiles of 256 x 256) against the TPU's
    # 8 GiB Weight Memory; its external data is a sparse file, so nothing is written or
    # read: the check is on shapes, before a weight is touched or an image allocated
    k = 96_000
    data = tmp_path / "big.weights"
    with open(data, "wb") as fh:
        fh.truncate(k * k)
    w = onnx.TensorProto(name="w", data_type=TensorProto.INT8, dims=[k, k],
                         data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", data.name), ("offset", "0"), ("length", str(k * k))):
        w.external_data.add(key=key, value=value)
    inits = [w, onnx.numpy_helper.from_array(np.full(k, 1e-3, np.float32), "ws"),
             onnx.numpy_helper.from_array(np.zeros(k, np.int8), "wz"),
             onnx.numpy_helper.from_array(np.float32(0.02), "s"),
             onnx.numpy_helper.from_array(np.uint8(128), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=1),
             helper.make_node("MatMul", ["xf", "wf"], ["yf"], name="huge_fc"),
             helper.make_node("QuantizeLinear", ["yf", "s", "z"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, k])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, k])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "big.onnx"
    path.write_bytes(model.SerializeToString())
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out")
    assert code == 2
    assert "big.onnx" in err and "huge_fc" in err and "Weight Memory" in err
    assert "140,625 tiles" in err and "131,072" in err
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]


def test_a_name_that_is_not_utf8_is_one_error(tmp_path, capsys, mlp, calib):
    # protobuf parses a non-UTF-8 string field and fails only when it is read (found by
    # the compile fuzz target: a traceback from onnx.helper.make_graph)
    data = open(mlp, "rb").read()
    name = onnx.load(mlp).graph.name.encode()
    assert data.count(name) == 1
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(data.replace(name, b"\xff" * len(name)))
    code, _, err = run_compile(capsys, bad, "-o", tmp_path / "out", "--calibrate", calib)
    assert code == 2 and "bad.onnx: not a readable ONNX model" in err and "UTF-8" in err
    assert not (tmp_path / "out").exists()


def test_an_output_of_weights_alone_is_refused(tmp_path, capsys, calib):
    # found by the compile fuzz target: the Gemm read its weight in place of x, the output
    # folded to a constant, and compile wrote an OUTDIR its own loader refused
    m = float_models.build([("gemm", 8), ("relu",)], (9,))
    gemm = m.graph.node[0]
    gemm.input[0] = gemm.input[1]
    gemm.input[1] = gemm.input[1]
    path = tmp_path / "const.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--calibrate", calib)
    assert code == 2 and "does not depend on any input of the model" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["empty", "fifo", "device", "zip"])
def test_validation_data_that_is_no_array_is_one_error(tmp_path, capsys, mlp, calib, kind):
    # found by the debug fuzz target (`debug OUTDIR --input /dev/null`: an EOFError
    # traceback from np.load); every reader of user arrays shares read_named_arrays
    import os
    data = tmp_path / "v.npy"
    if kind == "empty":
        data.write_bytes(b"")
    elif kind == "fifo":
        os.mkfifo(data)                       # would block np.load: refused at once
    elif kind == "zip":
        data = tmp_path / "v.npz"
        data.write_bytes(b"PK\x03\x04" + b"\0" * 40)
    else:
        data = "/dev/null"
    code, _, err = run_compile(capsys, mlp, "-o", tmp_path / "out", "--calibrate", calib,
                               "--batch", "2", "--validate", data)
    assert code == 2 and str(data) in err, err
    assert not (tmp_path / "out").exists()


def test_debug_input_of_dev_null_is_one_error(tmp_path, capsys, compiled):
    from tpuasm.cli import main
    script = tmp_path / "s.txt"
    script.write_text("step\n")
    code = main(["debug", str(compiled), "--input", "/dev/null", "--batch", str(script)])
    out, err = capsys.readouterr()
    assert code == 2 and "/dev/null" in err and "Traceback" not in out + err


def test_a_weight_whose_data_does_not_match_its_shape_is_one_error(tmp_path, capsys, calib):
    # found by the compile fuzz target: a ValueError traceback from numpy_helper.to_array
    m = float_models.build([("gemm", 12), ("relu",), ("gemm", 4)], (9,))
    init = m.graph.initializer[0]
    del init.dims[:]
    init.dims.append(2)                          # 108 values said to be 2
    path = tmp_path / "cut.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--calibrate", calib)
    assert code == 2 and f"node gemm0: weight {init.name}: its data does not match" in err
    assert not (tmp_path / "out").exists()


def test_a_quantized_model_with_a_nan_scale_is_refused(tmp_path, capsys):
    # found by the compile fuzz target: compiled (exit 0) after numpy's RuntimeWarnings
    import warnings
    from onnx import numpy_helper
    from qdq_builder import QDQBuilder
    b = QDQBuilder((8,), rows=8)
    b.quantize()
    b.matmul(4)
    m = b.model()
    scale = next(t for t in m.graph.initializer if t.data_type == TensorProto.FLOAT)
    value = numpy_helper.to_array(scale).copy()
    value.reshape(-1)[0] = np.nan
    scale.CopyFrom(numpy_helper.from_array(value, scale.name))
    path = tmp_path / "q.onnx"
    onnx.save(m, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--batch", "4")
    assert code == 2 and f"weight {scale.name} holds NaN or infinite values" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", [0.0, -0.5, 1e-45])
def test_a_quantized_model_with_a_zero_or_negative_scale_is_refused(tmp_path, capsys, bad):
    # found by the compile fuzz target: a zero weight scale compiled (exit 0) after
    # "RuntimeWarning: divide by zero" from requantizing the bias
    import warnings
    from onnx import numpy_helper
    from qdq_builder import QDQBuilder
    b = QDQBuilder((8,), rows=8)
    b.quantize()
    b.matmul(4)
    m = b.model()
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear"
              and n.input[0] in {t.name for t in m.graph.initializer})      # the weight's
    scale = next(t for t in m.graph.initializer if t.name == dq.input[1])
    value = numpy_helper.to_array(scale).copy()
    value.reshape(-1)[0] = bad
    scale.CopyFrom(numpy_helper.from_array(value, scale.name))
    path = tmp_path / "q.onnx"
    onnx.save(m, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--batch", "4")
    assert code == 2 and f"node {dq.name}: scale {scale.name} holds zero, negative or subnormal" in err
    assert not (tmp_path / "out").exists()


def test_an_input_dimension_beyond_the_manifest_limit_is_refused(tmp_path, capsys):
    # found by the compile fuzz target: compiled into an OUTDIR whose loader refused
    # "shape [...] is not a list of sizes"
    from qdq_builder import QDQBuilder
    b = QDQBuilder((8,), rows=8)
    b.quantize()
    b.matmul(4)
    m = b.model()
    m.graph.input[0].type.tensor_type.shape.dim.add().dim_value = 1 << 40
    path = tmp_path / "huge.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--batch", "4")
    assert code == 2 and f"input 'x' dimension 2 is {1 << 40}: outside" in err, err
    assert not (tmp_path / "out").exists()


def test_a_shape_inferred_out_of_range_leaves_no_outdir(tmp_path, capsys):
    # found by the compile fuzz target: a Conv's dilation of 2**31 made shape inference
    # give the output a negative size; compile wrote an OUTDIR its loader refused
    from onnx import helper as h
    from qdq_builder import QDQBuilder
    b = QDQBuilder((2, 5, 5), rows=8)
    b.quantize()
    b.conv(3, (3, 3), pads=[1, 1, 1, 1])
    m = b.model()
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    conv.attribute.append(h.make_attribute("dilations", [1 << 31, 1]))
    path = tmp_path / "dil.onnx"
    onnx.save(m, str(path))
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out")
    assert code == 2 and "would be refused when loaded" in err and "is not a list of sizes" \
        in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dil.onnx"]


def test_calibration_that_overflows_prints_no_numpy_warning(tmp_path, capsys, calib):
    # found by the compile fuzz target: weights near float32's largest value overflow the
    # activations to infinity; entropy calibration printed numpy's RuntimeWarnings
    import warnings
    from onnx import numpy_helper
    m = float_models.build([("gemm", 12), ("relu",), ("gemm", 4)], (9,))
    init = m.graph.initializer[0]
    w = numpy_helper.to_array(init).copy()
    w[0, 0] = 7.6e37                   # activations span more than float32's range
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    path = tmp_path / "big.onnx"
    onnx.save(m, str(path))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")        # what a user would be shown
        code, out, err = run_compile(capsys, path, "-o", tmp_path / "out", "--calibrate",
                                     calib, "--calibration-method", "entropy",
                                     "--no-validate")
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)]
    assert code == 2 and err.count("error") == 1, err
    assert "overflow float32 on the calibration data" in err      # names the tensor's node
    assert not (tmp_path / "out").exists()


def test_a_fixed_batch_above_the_limit_is_refused_at_once(tmp_path, capsys):
    # found by the compile fuzz target: an input of fixed shape (2**31-1, 8) took its first
    # dimension as the batch and ran past a minute and 1.3 GB; --batch was bounded, the
    # model's own batch was not
    import time
    from qdq_builder import QDQBuilder
    from tpuasm.limits import MAX_BATCH
    b = QDQBuilder((8,), rows=8)
    b.quantize()
    b.matmul(4)
    m = b.model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = (1 << 31) - 1
    path = tmp_path / "wide.onnx"
    onnx.save(m, str(path))
    started = time.perf_counter()
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--no-validate")
    assert code == 2 and f"batch 2,147,483,647 is above {MAX_BATCH:,}" in err, err
    assert time.perf_counter() - started < 5 and not (tmp_path / "out").exists()
    code, _, err = run_compile(capsys, path, "-o", tmp_path / "out", "--batch", "4")
    assert code == 0, err


def test_an_infinite_mask_constant_is_no_weight(tmp_path):
    # transformer exports add -inf masks: a constant, not a weight, and onnxruntime runs it
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from tpuasm.compiler.pipeline import compile_model
    rng = np.random.default_rng(0)
    mask = np.where(np.arange(4) < 2, 0.0, -np.inf).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1),
         helper.make_node("Add", ["h", "mask"], ["m"]),
         helper.make_node("Softmax", ["m"], ["y"], axis=1)],
        "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(rng.normal(0, 0.5, (4, 6)).astype(np.float32), "w"),
         numpy_helper.from_array(mask, "mask")])
    path = tmp_path / "masked.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    x = rng.normal(0, 1, (16, 6)).astype(np.float32)
    y = compile_model(path, batch=4, calibration=x).run(x)["y"]
    assert np.all(y[:, 2:] == 0) and np.allclose(y.sum(1), 1, atol=1e-5)


def test_a_node_shape_inference_refuses_names_the_user_s_model(tmp_path, capsys):
    """An Einsum whose output index is in no operand passes quantization (onnxruntime's
    quantizer leaves it float) and fails the shape inference of the quantized model: the
    error names the user's file, not the temporary QDQ model made from it."""
    w = onnx.numpy_helper.from_array(np.ones((6, 4), np.float32), "w")
    node = helper.make_node("Einsum", ["x", "w"], ["y"], name="einsum",
                            equation="bld,dh->blz")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x0"], ["x"], name="relu"), node], "g",
        [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["N", 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "bad_einsum.onnx"
    onnx.save(model, str(path))
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((4, 5, 6), np.float32))
    out = tmp_path / "out"
    code, _, err = run_compile(capsys, path, "--calibrate", data, "-o", out)
    assert code == 2 and f"{path}: shape inference failed" in err and ".qdq.onnx" not in err
    assert "einsum" in err and not out.exists()


def test_an_error_about_the_compile_s_own_quantized_model_names_the_user_s_file(
        tmp_path, monkeypatch):
    """The QDQ model lives in a temporary folder that is gone when the user reads the
    message: any refusal that names it (the QDQ model, or the folder's batch-one form)
    names the user's file instead; other messages are left as they are."""
    import tempfile
    from pathlib import Path
    from tpuasm.compiler import pipeline
    folder = Path(tempfile.gettempdir()) / f"{pipeline.QDQ_FOLDER}k3x_9q"

    def refuse(message):
        def compile_(*args, **kwargs):
            raise CompileError(message)
        return compile_
    user = tmp_path / "net.onnx"
    for written in (folder / "net.qdq.onnx", folder / "batch-one" / "net.onnx"):
        monkeypatch.setattr(pipeline, "_compile_model",
                            refuse(f"{written}: node 'conv' has no weights"))
        with pytest.raises(CompileError) as e:
            pipeline.compile_model(user)
        assert str(e.value) == f"{user}: node 'conv' has no weights"
    monkeypatch.setattr(pipeline, "_compile_model", refuse("batch must be positive"))
    with pytest.raises(CompileError, match="^batch must be positive$"):
        pipeline.compile_model(user)

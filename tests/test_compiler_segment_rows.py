"""A TPU segment's rows come from the tensors it reads, not only from the model's batch
(issue 20, item 3): a single sequence whose Gemm runs over its frames (Reshape (1, T*F) ->
(T, F)), and a model run whole whose per-frame Conv1d sees T rows and whose Conv over time,
after a Transpose, sees one.  Every Conv and Gemm goes to the TPU, each segment's program
built for its own rows, the host parts between reshaping; the compiled model, run with
`tpuasm infer` on the emulator, is compared with onnxruntime on OUTDIR's QDQ model (the same
quantization): >= 99.9 % of output values identical, none more than 1 LSB apart."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

pytest.importorskip("tpuasm.compiler.codegen")

from onnx_models import run_ort  # noqa: E402
from tpuasm.compiler.cli import compile_main, infer_main  # noqa: E402

FRAMES, FEATURES, HIDDEN, OUT = 12, 10, 16, 6


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def save(tmp_path, nodes, inputs, outputs, inits, name) -> str:
    m = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    return str(path)


def frames_gemm_model(tmp_path, rng, batch=1) -> str:
    """x (1, T*F) -> Reshape (T, F) -> Gemm -> Relu -> Gemm: T rows; -> Reshape (1, T*O) ->
    Gemm: one row.  With `batch` None the batch is dynamic, (N, T*F) -> (N*T, F): the
    frames' rows grow with it."""
    n = "N" if batch is None else batch
    nodes = [
        helper.make_node("Reshape", ["x", "frames"], ["xf"], name="to_frames"),
        helper.make_node("Gemm", ["xf", "w1", "b1"], ["h1"], name="frame_fc1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], name="frame_fc2"),
        helper.make_node("Reshape", ["h2", "whole"], ["flat"], name="to_sequence"),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["y"], name="sequence_fc")]
    inits = [init("frames", np.array([FRAMES if batch else -1, FEATURES], np.int64)),
             init("whole", np.array([1 if batch else -1, FRAMES * OUT], np.int64)),
             init("w1", rng.normal(0, 0.4, (FEATURES, HIDDEN)).astype(np.float32)),
             init("b1", rng.normal(0, 0.1, HIDDEN).astype(np.float32)),
             init("w2", rng.normal(0, 0.3, (HIDDEN, OUT)).astype(np.float32)),
             init("b2", rng.normal(0, 0.1, OUT).astype(np.float32)),
             init("w3", rng.normal(0, 0.2, (FRAMES * OUT, 4)).astype(np.float32)),
             init("b3", rng.normal(0, 0.1, 4).astype(np.float32))]
    return save(tmp_path, nodes, [helper.make_tensor_value_info("x", T.FLOAT,
                                                                [n, FRAMES * FEATURES])],
                [helper.make_tensor_value_info("y", T.FLOAT, [n, 4])], inits, "frames_gemm")


def frames_conv_model(tmp_path, rng) -> str:
    """x (T, L), run whole -> Unsqueeze (T, 1, L) -> Conv1d -> Relu: T rows of (4, L') ->
    Reshape (1, T, 4 L') -> Transpose (1, 4 L', T) -> Conv1d over time: one row."""
    length, c, k = 24, 4, 5
    out_len = (length - k) // 2 + 1
    nodes = [
        helper.make_node("Unsqueeze", ["x", "ax1"], ["x3"], name="frames"),
        helper.make_node("Conv", ["x3", "cw", "cb"], ["conv"], strides=[2], kernel_shape=[k],
                         name="frame_conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Reshape", ["relu", "seq"], ["seq3"], name="to_sequence"),
        helper.make_node("Transpose", ["seq3"], ["time_last"], perm=[0, 2, 1], name="time_last"),
        helper.make_node("Conv", ["time_last", "tw", "tb"], ["y"], kernel_shape=[3],
                         pads=[1, 1], name="time_conv")]
    inits = [init("ax1", np.array([1], np.int64)),
             init("seq", np.array([1, FRAMES, c * out_len], np.int64)),
             init("cw", rng.normal(0, 0.4, (c, 1, k)).astype(np.float32)),
             init("cb", rng.normal(0, 0.1, c).astype(np.float32)),
             init("tw", rng.normal(0, 0.1, (3, c * out_len, 3)).astype(np.float32)),
             init("tb", rng.normal(0, 0.1, 3).astype(np.float32))]
    return save(tmp_path, nodes, [helper.make_tensor_value_info("x", T.FLOAT,
                                                                [FRAMES, length])],
                [helper.make_tensor_value_info("y", T.FLOAT, [1, 3, FRAMES])], inits,
                "frames_conv")


def compile_and_infer(capsys, tmp_path, model, calib, data, *extra):
    out = tmp_path / "out"
    code = compile_main([model, "-o", str(out), "--calibrate", str(calib), *extra])
    _, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    y = tmp_path / "y.npz"
    code = infer_main([str(out), str(data), "-o", str(y), "--engine", "emulator", "-q"])
    _, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    with np.load(y) as got:
        return out, got["y"]


def output_scale(qdq: onnx.ModelProto, name: str) -> float:
    """The scale of the DequantizeLinear that makes the model's output `name` (one LSB)."""
    (node,) = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear"
               and n.output[0] == name]
    (scale,) = [numpy_helper.to_array(t) for t in qdq.graph.initializer
                if t.name == node.input[1]]
    return float(scale.reshape(-1)[0])


def assert_same_quantization(out, got, want):
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    diff = np.rint(np.abs(got.astype(np.float64) - want.reshape(got.shape))
                   / output_scale(qdq, "y"))
    assert diff.max() <= 1 and np.mean(diff == 0) >= 0.999, (np.mean(diff == 0), diff.max())


def segments(out):
    report = json.loads((out / "report.json").read_text())
    where = {r["node"]: r["where"] for r in report["rows"]}
    return report, where


def test_a_gemm_over_the_frames_of_one_sequence(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = frames_gemm_model(tmp_path, rng)
    calib = rng.normal(0, 1, (32, FRAMES * FEATURES)).astype(np.float32)
    data = rng.normal(0, 1, (5, FRAMES * FEATURES)).astype(np.float32)
    np.save(tmp_path / "calib.npy", calib)
    np.save(tmp_path / "data.npy", data)
    out, got = compile_and_infer(capsys, tmp_path, path, tmp_path / "calib.npy",
                                 tmp_path / "data.npy")
    report, where = segments(out)
    assert all(where[n] == "TPU" for n in ("frame_fc1", "frame_fc2", "sequence_fc")), where
    # the frames' Gemms in a program of T rows, the sequence's in one of a row (the batch)
    rows = sorted((s["rows"], s["own_rows"]) for s in report["segments"])
    assert rows == [(1, False), (FRAMES, True)], report["segments"]
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    want = np.concatenate([run_ort(qdq, {"x": row[None]})[0] for row in data])
    assert_same_quantization(out, got, want)
    float_want = np.concatenate([run_ort(onnx.load(path), {"x": row[None]})[0]
                                 for row in data])
    assert np.abs(got - float_want).max() <= 0.1 * np.abs(float_want).max()


def test_a_model_run_whole_with_segments_of_frames_and_of_one_row(tmp_path, capsys):
    rng = np.random.default_rng(1)
    path = frames_conv_model(tmp_path, rng)
    calib = rng.normal(0, 1, (FRAMES, 24)).astype(np.float32)
    data = (calib + rng.normal(0, 0.05, calib.shape)).astype(np.float32)
    np.save(tmp_path / "calib.npy", calib)
    np.save(tmp_path / "data.npy", data)
    out, got = compile_and_infer(capsys, tmp_path, path, tmp_path / "calib.npy",
                                 tmp_path / "data.npy", "--batch-axis", "x=none")
    report, where = segments(out)
    assert where["frame_conv"] == "TPU" and where["time_conv"] == "TPU", where
    rows = sorted((s["rows"], s["own_rows"]) for s in report["segments"])
    assert rows == [(1, False), (FRAMES, True)], report["segments"]
    assert f"{FRAMES} own" in (out / "report.txt").read_text()
    (want,) = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"x": data})
    assert got.shape == want.shape
    assert_same_quantization(out, got, want)
    # its rows are fixed: other frame counts are one clear error that says so
    np.save(tmp_path / "longer.npy", np.zeros((FRAMES + 3, 24), np.float32))
    code = infer_main([str(out), str(tmp_path / "longer.npy"), "-o", str(tmp_path / "z.npz")])
    err = capsys.readouterr().err
    assert code == 2 and "no batch axis" in err and "Traceback" not in err, err


@pytest.mark.parametrize("batch", [2, 3])
def test_rows_that_fold_the_batch_in_grow_with_it(tmp_path, capsys, batch):
    # (N, T*F) -> Reshape (-1, F): the frames' program takes batch x T rows, the sequence
    # Gemm's the batch; 7 rows of data run as batches of `batch` (the last one padded)
    rng = np.random.default_rng(2)
    path = frames_gemm_model(tmp_path, rng, batch=None)
    np.save(tmp_path / "calib.npy", rng.normal(0, 1, (32, FRAMES * FEATURES)).astype(np.float32))
    data = rng.normal(0, 1, (7, FRAMES * FEATURES)).astype(np.float32)
    np.save(tmp_path / "data.npy", data)
    out, got = compile_and_infer(capsys, tmp_path, path, tmp_path / "calib.npy",
                                 tmp_path / "data.npy", "--batch", str(batch))
    report, where = segments(out)
    assert all(where[n] == "TPU" for n in ("frame_fc1", "frame_fc2", "sequence_fc")), where
    rows = sorted((s["rows"], s["own_rows"]) for s in report["segments"])
    assert rows == [(batch, False), (batch * FRAMES, True)], report["segments"]
    (want,) = run_ort(onnx.load(str(out / "model.qdq.onnx")), {"x": data})
    assert got.shape == want.shape
    assert_same_quantization(out, got, want)


def test_an_outdir_with_bad_segment_rows_is_refused(tmp_path, capsys):
    rng = np.random.default_rng(3)
    path = frames_gemm_model(tmp_path, rng)
    np.save(tmp_path / "calib.npy", rng.normal(0, 1, (16, FRAMES * FEATURES)).astype(np.float32))
    out, _ = compile_and_infer(capsys, tmp_path, path, tmp_path / "calib.npy",
                               tmp_path / "calib.npy")
    manifest = json.loads((out / "manifest.json").read_text())
    (step,) = [s for s in manifest["steps"] if s.get("rows")]
    step["rows"] = -3
    (out / "manifest.json").write_text(json.dumps(manifest))
    code = infer_main([str(out), str(tmp_path / "calib.npy"), "-o", str(tmp_path / "z.npz")])
    err = capsys.readouterr().err
    assert code == 2 and "rows -3" in err and "Traceback" not in err, err


def test_rows_above_the_limit_run_on_the_host(tmp_path, monkeypatch):
    # a program takes at most limits.MAX_BATCH rows, as --batch: (here 8) the frames'
    # Gemms of 12 rows stay on the host with the reason, the sequence's Gemm maps
    import tpuasm.limits
    from tpuasm.compiler.pipeline import compile_model
    monkeypatch.setattr(tpuasm.limits, "MAX_BATCH", 8)
    rng = np.random.default_rng(4)
    path = frames_gemm_model(tmp_path, rng)
    calib = rng.normal(0, 1, (8, FRAMES * FEATURES)).astype(np.float32)
    model = compile_model(path, calibration=calib, config=["array_size=16"], validate=False)
    placed = {r.node: r for r in model.report.rows}
    assert placed["frame_fc1"].where == "host" and "12 rows" in placed["frame_fc1"].reason
    assert placed["sequence_fc"].where == "TPU", placed["sequence_fc"].reason


def test_two_branches_of_different_rows_ready_together_are_two_segments(tmp_path, capsys):
    # x (T, F) run whole: a Gemm over its frames (T rows) and, beside it, a Gemm over the
    # whole sequence (Reshape (1, T*F): one row) become ready in the same phase; the
    # partition gives each row count its own segment
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Gemm", ["x", "wf", "bf"], ["yf"], name="per_frame"),
             helper.make_node("Reshape", ["x", "whole"], ["xs"], name="to_sequence"),
             helper.make_node("Gemm", ["xs", "ws", "bs"], ["ys"], name="per_sequence")]
    inits = [init("whole", np.array([1, FRAMES * FEATURES], np.int64)),
             init("wf", rng.normal(0, 0.4, (FEATURES, OUT)).astype(np.float32)),
             init("bf", rng.normal(0, 0.1, OUT).astype(np.float32)),
             init("ws", rng.normal(0, 0.1, (FRAMES * FEATURES, 4)).astype(np.float32)),
             init("bs", rng.normal(0, 0.1, 4).astype(np.float32))]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", T.FLOAT,
                                                                [FRAMES, FEATURES])],
                [helper.make_tensor_value_info("yf", T.FLOAT, [FRAMES, OUT]),
                 helper.make_tensor_value_info("ys", T.FLOAT, [1, 4])], inits, "branches")
    calib = rng.normal(0, 1, (FRAMES, FEATURES)).astype(np.float32)
    data = (calib + rng.normal(0, 0.05, calib.shape)).astype(np.float32)
    np.save(tmp_path / "calib.npy", calib)
    np.save(tmp_path / "data.npy", data)
    out = tmp_path / "out"
    assert compile_main([path, "-o", str(out), "--calibrate", str(tmp_path / "calib.npy"),
                         "--batch-axis", "x=none", "-q"]) == 0
    y = tmp_path / "y.npz"
    assert infer_main([str(out), str(tmp_path / "data.npy"), "-o", str(y), "-q"]) == 0
    report, where = segments(out)
    assert where["per_frame"] == "TPU" and where["per_sequence"] == "TPU", where
    steps = [s for s in report["steps"] if s["kind"] == "tpu"]
    assert sorted(s["items"] for s in steps) == [["per_frame"], ["per_sequence"]], steps
    assert sorted(s["rows"] for s in report["segments"]) == [1, FRAMES]
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    want = dict(zip(["yf", "ys"], run_ort(qdq, {"x": data})))
    with np.load(y) as got:
        for name in ("yf", "ys"):
            diff = np.rint(np.abs(got[name].astype(np.float64) - want[name])
                           / output_scale(qdq, name))
            assert diff.max() <= 1 and np.mean(diff == 0) >= 0.999, name

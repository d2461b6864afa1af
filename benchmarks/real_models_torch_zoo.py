"""A zoo of PyTorch layers nobody here exported before, through the CLI as a new user would
(OPTIONAL: needs the `torch` extra; `make bench-torch-zoo`).

    .venv/bin/python benchmarks/real_models_torch_zoo.py [--only NAME] [--dynamo] [--work DIR]

Each network (a squeeze-and-excitation CNN with SiLU and LeakyReLU, a U-Net with a
ConvTranspose and a skip Concat, nearest upsampling, a dilated causal TCN with PReLU and
ELU, a two-layer bidirectional LSTM, an Elman RNN, nn.MultiheadAttention with LayerNorm, an
MLP-mixer's token mixing through Transposes, a two-headed MLP with Softmax and Softplus, Mish
with a grouped Conv and a ceil-mode MaxPool, attention and an MLP-mixer written with
torch.einsum, a ShuffleNetV2 unit, a pre-activation DenseNet block, an Inception module, a
MobileNetV3 block, a Conformer's convolution module, a CRNN with a bidirectional GRU and
per-step log-probabilities, ESPCN's PixelShuffle, reflect padding with GroupNorm and
InstanceNorm, a tabular MLP over nn.Embedding lookups of int64 categories beside float
features) is built at random, then trained 300 steps on its own initial top-1 labels (per
step for a (rows, steps, classes) output; the same function with margins, so that top-1
agreement means something), exported by torch.onnx (TorchScript, or the dynamo exporter
with --dynamo), compiled with `tpuasm compile --calibrate` on 128 rows of N(0, 1) inputs
(categories uniform in their range) and run with `tpuasm infer` on 512 new ones.  Printed
against onnxruntime on the float model: the share of the MACs on the TPU, the matrix nodes
left on the host (with their reasons), top-1 agreement and SNR per output.  Then the same
network as onnxruntime's quantize_static writes it (QDQ and QOperator, per channel)
compiled as shipped: its outputs against onnxruntime on that very model (the share of
identical elements).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models_shipped import compile_and_infer, snr  # noqa: E402

CALIBRATE, EVALUATE, TRAIN_STEPS = 128, 512, 300
MATRIX_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "QLinearConv",
              "QLinearMatMul", "QGemm"}


def networks(torch):
    nn, F = torch.nn, torch.nn.functional

    class SqueezeExcite(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 16, 3, 1, 1), nn.Conv2d(16, 8, 3, 2, 1)
            self.fc1, self.fc2, self.head = nn.Linear(16, 4), nn.Linear(4, 16), nn.Linear(8, 5)

        def forward(self, x):
            y = F.silu(self.c1(x))
            w = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3))))))
            y = F.leaky_relu(self.c2(y * w[:, :, None, None]), 0.1)
            return self.head(y.mean((2, 3)))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.down1, self.down2 = nn.Conv2d(1, 8, 3, 1, 1), nn.Conv2d(8, 16, 3, 2, 1)
            self.up, self.out = nn.ConvTranspose2d(16, 8, 2, 2), nn.Conv2d(16, 1, 1)

        def forward(self, x):
            a = torch.relu(self.down1(x))
            u = torch.relu(self.up(torch.relu(self.down2(a))))
            return torch.sigmoid(self.out(torch.cat([a, u], 1)))

    class Upsample(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.o = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 4, 3, 1, 1)

        def forward(self, x):
            y = F.interpolate(torch.relu(self.c(x)), scale_factor=2, mode="nearest")
            return self.o(y).mean((2, 3))

    class TCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv1d(4, 16, 3)
            self.c2, self.c3 = nn.Conv1d(16, 16, 3, dilation=2), nn.Conv1d(16, 16, 3, dilation=4)
            self.act, self.fc = nn.PReLU(16), nn.Linear(16, 3)

        def forward(self, x):
            y = self.act(self.c1(F.pad(x, (2, 0))))
            y = y + torch.relu(self.c2(F.pad(y, (4, 0))))
            y = y + F.elu(self.c3(F.pad(y, (8, 0))))
            return self.fc(y[:, :, -1])

    class DeepLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 24, num_layers=2, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(48, 4)

        def forward(self, x):
            return self.fc(self.lstm(x)[0].mean(1))

    class Elman(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.fc = nn.RNN(8, 32, batch_first=True), nn.Linear(32, 4)

        def forward(self, x):
            return self.fc(self.rnn(x)[1][0])

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.attn = nn.Linear(12, 32), nn.MultiheadAttention(32, 4, batch_first=True)
            self.norm, self.fc = nn.LayerNorm(32), nn.Linear(32, 3)

        def forward(self, x):
            h = self.inp(x)
            a, _ = self.attn(h, h, h, need_weights=False)
            return self.fc(self.norm(h + a)[:, 0])

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.channels = nn.Linear(16, 16), nn.Linear(24, 24)
            self.norm, self.fc = nn.LayerNorm(24), nn.Linear(24, 5)

        def forward(self, x):
            x = x + self.tokens(self.norm(x).transpose(1, 2)).transpose(1, 2)
            x = x + F.gelu(self.channels(self.norm(x)))
            return self.fc(x.mean(1))

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 32),
                                      nn.Softplus())
            self.classes, self.value = nn.Linear(32, 6), nn.Linear(32, 1)

        def forward(self, x):
            h = self.body(x)
            return torch.softmax(self.classes(h), -1), self.value(h)

    class Mish(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn = nn.Conv2d(3, 12, 5, 2, 2), nn.BatchNorm2d(12)
            self.grouped = nn.Conv2d(12, 12, 3, 1, 1, groups=3)
            self.pool, self.fc = nn.MaxPool2d(3, 2, ceil_mode=True), nn.Linear(12 * 4 * 4, 4)

        def forward(self, x):
            y = F.mish(self.bn(self.c(x)))
            y = self.pool(F.hardsigmoid(self.grouped(y)) * y)
            return self.fc(torch.flatten(y, 1))

    class EinsumAttention(nn.Module):
        """Attention written with torch.einsum, as research code writes it: projections into
        heads and back with weights, scores and mixing products of two activations."""
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wv = (nn.Parameter(torch.randn(16, 4, 8) * 0.25)
                                         for _ in range(3))
            self.bq = nn.Parameter(torch.randn(4, 8) * 0.1)
            self.wo = nn.Parameter(torch.randn(4, 8, 16) * 0.18)
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            q = torch.einsum("bld,dhk->blhk", x, self.wq) + self.bq
            k = torch.einsum("bld,dhk->blhk", x, self.wk)
            v = torch.einsum("bld,dhk->blhk", x, self.wv)
            a = torch.softmax(torch.einsum("blhk,bmhk->bhlm", q, k) / 8 ** 0.5, -1)
            y = x + torch.einsum("bhlm,bmhk,hkd->bld", a, v, self.wo)
            return self.fc(y.mean(1))

    class EinsumMixer(nn.Module):
        """Token mixing by a weight over the sequence axis ("btc,ts->bsc") and channel mixing
        by one over the channels, each with its bias and activation, in einsum."""
        def __init__(self):
            super().__init__()
            self.wt, self.bt = nn.Parameter(torch.randn(12, 12) * 0.3), nn.Parameter(
                torch.randn(12, 1) * 0.1)
            self.wc = nn.Parameter(torch.randn(10, 2, 16) * 0.3)
            self.bc = nn.Parameter(torch.randn(2, 16) * 0.1)
            self.fc = nn.Linear(32, 5)

        def forward(self, x):
            x = x + torch.relu(torch.einsum("btc,ts->bsc", x, self.wt) + self.bt)
            h = torch.tanh(torch.einsum("bsc,cgd->bsgd", x, self.wc) + self.bc)
            return self.fc(h.mean(1).flatten(1))

    class ShuffleUnit(nn.Module):
        """A ShuffleNetV2 unit: channel split, a 1x1 / depthwise 3x3 + BN / 1x1 branch,
        Concat, channel shuffle by reshape-transpose-reshape."""
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
            self.branch = nn.Sequential(
                nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU(),
                nn.Conv2d(8, 8, 3, 1, 1, groups=8), nn.BatchNorm2d(8),
                nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU())
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            y = self.stem(x)
            a, b = torch.chunk(y, 2, dim=1)
            y = torch.cat([a, self.branch(b)], 1)
            n, c, h, w = y.shape
            y = y.reshape(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
            return self.fc(y.mean((2, 3)))

    class DenseBlock(nn.Module):
        """Two pre-activation dense layers (BN -> ReLU -> Conv after a Concat: no Conv
        before the BN to fold it into), a transition with AvgPool."""
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, 1, 1)
            self.l1 = nn.Sequential(nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 6, 3, 1, 1))
            self.l2 = nn.Sequential(nn.BatchNorm2d(14), nn.ReLU(), nn.Conv2d(14, 6, 3, 1, 1))
            self.trans = nn.Sequential(nn.BatchNorm2d(20), nn.ReLU(), nn.Conv2d(20, 10, 1),
                                       nn.AvgPool2d(2))
            self.fc = nn.Linear(10, 4)

        def forward(self, x):
            y = self.stem(x)
            y = torch.cat([y, self.l1(y)], 1)
            y = torch.cat([y, self.l2(y)], 1)
            return self.fc(self.trans(y).mean((2, 3)))

    class Inception(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 12, 3, 1, 1)
            self.b1 = nn.Conv2d(12, 6, 1)
            self.b3 = nn.Sequential(nn.Conv2d(12, 4, 1), nn.ReLU(), nn.Conv2d(4, 6, 3, 1, 1))
            self.b5 = nn.Sequential(nn.Conv2d(12, 2, 1), nn.ReLU(), nn.Conv2d(2, 4, 5, 1, 2))
            self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(12, 4, 1))
            self.fc = nn.Linear(20, 5)

        def forward(self, x):
            y = torch.relu(self.stem(x))
            y = torch.relu(torch.cat([self.b1(y), self.b3(y), self.b5(y), self.bp(y)], 1))
            return self.fc(y.mean((2, 3)))

    class MobileV3(nn.Module):
        """A MobileNetV3 block: Hardswish, depthwise 5x5 stride 2, squeeze-excitation with
        Hardsigmoid."""
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.BatchNorm2d(16),
                                      nn.Hardswish())
            self.expand = nn.Sequential(nn.Conv2d(16, 32, 1), nn.BatchNorm2d(32), nn.Hardswish())
            self.dw = nn.Sequential(nn.Conv2d(32, 32, 5, 2, 2, groups=32), nn.BatchNorm2d(32),
                                    nn.Hardswish())
            self.se1, self.se2 = nn.Conv2d(32, 8, 1), nn.Conv2d(8, 32, 1)
            self.project = nn.Sequential(nn.Conv2d(32, 16, 1), nn.BatchNorm2d(16))
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            y = self.dw(self.expand(self.stem(x)))
            s = F.hardsigmoid(self.se2(torch.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
            return self.fc(self.project(y * s).mean((2, 3)))

    class ConformerConv(nn.Module):
        """A Conformer's convolution module over (N, T, C): LayerNorm, pointwise Conv1d to
        2C, GLU, depthwise Conv1d, BatchNorm1d, SiLU, pointwise Conv1d, residual."""
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(12)
            self.pw1, self.dw = nn.Conv1d(12, 24, 1), nn.Conv1d(12, 12, 7, 1, 3, groups=12)
            self.bn, self.pw2 = nn.BatchNorm1d(12), nn.Conv1d(12, 12, 1)
            self.fc = nn.Linear(12, 4)

        def forward(self, x):
            y = F.glu(self.pw1(self.norm(x).transpose(1, 2)), dim=1)
            y = self.pw2(F.silu(self.bn(self.dw(y))))
            return self.fc((x + y.transpose(1, 2)).mean(1))

    class CRNN(nn.Module):
        """Convs over a (1, 16, 24) line image, its columns as a sequence, a bidirectional
        GRU, per-step log-probabilities (N, T, classes)."""
        def __init__(self):
            super().__init__()
            self.convs = nn.Sequential(nn.Conv2d(1, 8, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                                       nn.Conv2d(8, 16, 3, 1, 1), nn.ReLU(),
                                       nn.MaxPool2d((2, 1)))
            self.gru = nn.GRU(64, 16, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(32, 6)

        def forward(self, x):
            y = self.convs(x)                                   # (N, 16, 4, 12)
            y = y.permute(0, 3, 1, 2).reshape(y.shape[0], y.shape[3], 64)
            return F.log_softmax(self.fc(self.gru(y)[0]), -1)

    class ESPCN(nn.Module):
        """Super-resolution by sub-pixel convolution: Convs, then PixelShuffle (x2)."""
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(1, 16, 5, 1, 2), nn.Conv2d(16, 8, 3, 1, 1)
            self.c3 = nn.Conv2d(8, 4, 3, 1, 1)

        def forward(self, x):
            y = torch.tanh(self.c2(torch.tanh(self.c1(x))))
            return F.pixel_shuffle(self.c3(y), 2)

    class ReflectNorm(nn.Module):
        """Convs with padding_mode='reflect', GroupNorm and InstanceNorm."""
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, 1, 1, padding_mode="reflect")
            self.c2 = nn.Conv2d(8, 8, 3, 1, 1, padding_mode="reflect")
            self.gn, self.inorm = nn.GroupNorm(2, 8), nn.InstanceNorm2d(8, affine=True)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.gn(self.c1(x)))
            y = torch.relu(self.inorm(self.c2(y)))
            return self.fc(y.mean((2, 3)))

    class Tabular(nn.Module):
        """Two categorical columns (int64) looked up in nn.Embedding tables, concatenated
        with six float features, into an MLP."""
        def __init__(self):
            super().__init__()
            self.e1, self.e2 = nn.Embedding(10, 4), nn.Embedding(7, 3)
            self.mlp = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 4))

        def forward(self, x, cat):
            return self.mlp(torch.cat([x, self.e1(cat[:, 0]), self.e2(cat[:, 1])], 1))

    return {"se": (SqueezeExcite, (3, 16, 16)), "unet": (UNet, (1, 16, 16)),
            "upsample": (Upsample, (3, 16, 16)), "tcn": (TCN, (4, 32)),
            "deeplstm": (DeepLSTM, (10, 8)), "elman": (Elman, (12, 8)),
            "attention": (Attention, (10, 12)), "mixer": (Mixer, (16, 24)),
            "twoheads": (TwoHeads, (20,)), "mish": (Mish, (3, 16, 16)),
            "einsum_attention": (EinsumAttention, (10, 16)),
            "einsum_mixer": (EinsumMixer, (12, 10)),
            "shufflenet": (ShuffleUnit, (3, 16, 16)), "densenet": (DenseBlock, (3, 12, 12)),
            "inception": (Inception, (3, 12, 12)), "mobilenetv3": (MobileV3, (3, 16, 16)),
            "conformer_conv": (ConformerConv, (16, 12)), "crnn": (CRNN, (1, 16, 24)),
            "espcn": (ESPCN, (1, 12, 12)), "reflect_norm": (ReflectNorm, (3, 16, 16)),
            "tabular": (Tabular, {"x": (6,), "cat": Categories((10, 7))})}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


class Categories(tuple):
    """An int64 input of one column per categorical feature: each column's number of
    categories (drawn uniformly); a network's other inputs are float per-row shapes."""


def input_specs(spec) -> dict:
    """A network's inputs, {name: per-row shape or Categories}: a bare shape is one float
    input "x"."""
    return spec if isinstance(spec, dict) else {"x": spec}


def draw(specs: dict, count: int, rng) -> dict:
    """`count` rows of each input: N(0, 1) floats, or categories uniform in their range."""
    out = {}
    for name, spec in specs.items():
        if isinstance(spec, Categories):
            out[name] = np.stack([rng.integers(0, k, count) for k in spec], 1).astype(np.int64)
        else:
            out[name] = rng.standard_normal((count, *spec)).astype(np.float32)
    return out


def torch_rows(torch, specs: dict, count: int, generator=None) -> dict:
    """`draw` in torch, by its own generator (the float networks' training rows)."""
    out = {}
    for name, spec in specs.items():
        if isinstance(spec, Categories):
            out[name] = torch.stack([torch.randint(0, k, (count,), generator=generator)
                                     for k in spec], 1)
        else:
            out[name] = torch.randn((count, *spec), generator=generator)
    return out


def sharpen(torch, model, specs: dict) -> None:
    """Train `model` on its own initial top-1 labels (a classifier's, per row or per step
    of a (rows, steps, classes) output; a regression's output is left as it is): the same
    decisions, with margins."""
    g = torch.Generator().manual_seed(3)
    rows = torch_rows(torch, specs, 4096, g)
    with torch.no_grad():
        out = _first(model(**rows))
    if out.ndim not in (2, 3) or out.shape[-1] < 2:
        return
    labels = out.argmax(-1)
    probabilities = bool(torch.allclose(out.sum(-1), torch.ones(out.shape[:-1]), atol=1e-4))
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    model.train()
    for _ in range(TRAIN_STEPS):
        pick = torch.randint(0, len(labels), (256,), generator=g)
        out = _first(model(**{k: v[pick] for k, v in rows.items()}))
        scores = torch.log(out + 1e-9) if probabilities else out
        loss = torch.nn.functional.cross_entropy(scores.reshape(-1, scores.shape[-1]),
                                                 labels[pick].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def export(torch, model, specs: dict, path: Path, dynamo: bool) -> None:
    example = tuple(torch_rows(torch, specs, 2).values())
    names = list(specs)
    if dynamo:
        rows = torch.export.Dim("N")
        torch.onnx.export(model, example, str(path), input_names=names, dynamo=True,
                          dynamic_shapes=tuple({0: rows} for _ in names))
    else:
        torch.onnx.export(model, example, str(path), input_names=names, dynamo=False,
                          dynamic_axes={n: {0: "N"} for n in names})


def _session(path: Path, optimize: bool = True):
    """onnxruntime as tpuasm's own oracle opens it; `optimize=False`: the graph as written,
    no fusions (onnxruntime's QLinearSoftmax, fused from a QDQ Softmax, puts its outputs on
    a 1/256 grid where the model's scale says 1/255)."""
    import onnx
    from tpuasm.compiler.ort import session
    return session(onnx.load(str(path)), threads=0, optimize=optimize)


def compare(model: Path, outdir: Path, got: dict, feeds: dict, row: dict,
            same_model: bool = False) -> None:
    """Per output against onnxruntime on `model`: SNR, top-1 for (rows, classes), and when
    it is the model compiled (`same_model`: a quantized one) the share of identical
    elements, against onnxruntime's session and against its unfused graph; the matrix
    nodes the report puts on the host."""
    sess = _session(model)
    want = sess.run(None, feeds)
    unfused = _session(model, optimize=False).run(None, feeds) if same_model else want
    for out, w, plain in zip(sess.get_outputs(), want, unfused):
        g = got[out.name].reshape(w.shape)
        figures = {"snr_db": round(snr(w, g), 1)}
        if same_model:
            figures["identical"] = round(float(np.mean(g == w)), 4)
            figures["identical_unfused"] = round(float(np.mean(g == plain)), 4)
        if w.ndim == 2 and w.shape[1] > 1:
            figures["top1"] = round(float(np.mean(w.argmax(1) == g.argmax(1))), 4)
        elif w.ndim == 3 and w.shape[2] > 1:       # (rows, steps, classes): per step
            figures["top1"] = round(float(np.mean(w.argmax(2) == g.argmax(2))), 4)
        row[out.name] = figures
    report = json.loads((outdir / "report.json").read_text())
    row["host_matrix"] = [(r["node"], r["reason"]) for r in report["rows"]
                          if r["op_type"] in MATRIX_OPS and r["where"] != "TPU"]


def quantized_forms(model: Path, calib: dict, work: Path) -> list[dict]:
    """onnxruntime's quantize_static of the float model (QDQ, QOperator), compiled as
    shipped and compared with onnxruntime on that same model; a QDQ model not all on the
    TPU also with its float inputs' ranges declared (--input-range)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Rows(CalibrationDataReader):
        def __init__(self):
            count = len(next(iter(calib.values())))
            self.rows = iter([{k: v[i:i + 1] for k, v in calib.items()} for i in range(count)])

        def get_next(self):
            return next(self.rows, None)

    rows = []
    for form in ("QDQ", "QOperator"):
        path = work / f"{model.stem}_{form.lower()}.onnx"
        row = {"model": f"{model.stem} ({form}, onnxruntime's quantize_static)"}
        quantize_static(str(model), str(path), Rows(), quant_format=getattr(QuantFormat, form),
                        per_channel=True)
        got = compile_and_infer(path, work, [], row, calibrate=False)
        if got is not None:
            compare(path, work / path.stem, got, dict(np.load(work / "eval.npz")), row,
                    same_model=True)
        rows.append(row)
        if form == "QDQ" and got is not None and row.get("tpu_share", 1) < 0.999:
            # what stayed float reads a float input: its range declared (--input-range,
            # the calibration rows' own), as a user who knows it would
            ranged = {"model": f"{row['model']}, --input-range"}
            ranges = [f"--input-range={k}={float(v.min())},{float(v.max())}"
                      for k, v in calib.items() if v.dtype.kind == "f"]
            got = compile_and_infer(path, work, ranges, ranged, calibrate=False)
            if got is not None:
                compare(path, work / path.stem, got, dict(np.load(work / "eval.npz")),
                        ranged, same_model=True)
            rows.append(ranged)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, help="where models and OUTDIRs go (default: temp)")
    p.add_argument("--only", action="append", default=[], help="one network's name")
    p.add_argument("--dynamo", action="store_true", help="torch.onnx's dynamo exporter")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: `make bench-torch-zoo` installs the torch extra",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    zoo = networks(torch)
    unknown = [n for n in args.only if n not in zoo]
    if unknown:
        print(f"unknown network {unknown[0]!r}: one of {', '.join(zoo)}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.work or Path(tmp)
        for name in args.only or zoo:
            make, spec = zoo[name]
            specs = input_specs(spec)
            work = root / name
            work.mkdir(parents=True, exist_ok=True)
            model = make().eval()
            sharpen(torch, model, specs)
            path = work / f"{name}.onnx"
            export(torch, model, specs, path, args.dynamo)
            calib, evaluation = draw(specs, CALIBRATE, rng), draw(specs, EVALUATE, rng)
            np.savez(work / "calib.npz", **calib)
            np.savez(work / "eval.npz", **evaluation)
            row = {"model": f"{name} ({'dynamo' if args.dynamo else 'TorchScript'})"}
            got = compile_and_infer(path, work, [], row)
            if got is not None:
                compare(path, work / name, got, evaluation, row)
            for printed in (row, *quantized_forms(path, calib, work)):
                printed.pop("quantization", None)     # the report's long sentence
                print(json.dumps(printed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A zoo of PyTorch layers nobody here exported before, through the CLI as a new user would
(OPTIONAL: needs the `torch` extra; `make bench-torch-zoo`).

    .venv/bin/python benchmarks/real_models_torch_zoo.py [--only NAME] [--dynamo] [--work DIR]

Each network (a squeeze-and-excitation CNN with SiLU and LeakyReLU, a U-Net with a
ConvTranspose and a skip Concat, nearest upsampling, a dilated causal TCN with PReLU and
ELU, a two-layer bidirectional LSTM, an Elman RNN, nn.MultiheadAttention with LayerNorm, an
MLP-mixer's token mixing through Transposes, a two-headed MLP with Softmax and Softplus, Mish
with a grouped Conv and a ceil-mode MaxPool, attention and an MLP-mixer written with
torch.einsum) is built at random, then trained 300 steps on
its own initial top-1 labels (the same function with margins, so that top-1 agreement
means something), exported by torch.onnx (TorchScript, or the dynamo exporter with
--dynamo), compiled with `tpuasm compile --calibrate` on 128 rows of N(0, 1) inputs and run
with `tpuasm infer` on 512 new ones.  Printed against onnxruntime on the float model: the
share of the MACs on the TPU, the matrix nodes left on the host (with their reasons), top-1
agreement and SNR per output.  Then the same network as onnxruntime's quantize_static
writes it (QDQ and QOperator, per channel) compiled as shipped: its outputs against
onnxruntime on that very model (the share of identical elements).
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

    return {"se": (SqueezeExcite, (3, 16, 16)), "unet": (UNet, (1, 16, 16)),
            "upsample": (Upsample, (3, 16, 16)), "tcn": (TCN, (4, 32)),
            "deeplstm": (DeepLSTM, (10, 8)), "elman": (Elman, (12, 8)),
            "attention": (Attention, (10, 12)), "mixer": (Mixer, (16, 24)),
            "twoheads": (TwoHeads, (20,)), "mish": (Mish, (3, 16, 16)),
            "einsum_attention": (EinsumAttention, (10, 16)),
            "einsum_mixer": (EinsumMixer, (12, 10))}


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def sharpen(torch, model, shape) -> None:
    """Train `model` on its own initial top-1 labels (a classifier's; a regression's output
    is left as it is): the same decisions, with margins."""
    g = torch.Generator().manual_seed(3)
    rows = torch.randn((4096, *shape), generator=g)
    with torch.no_grad():
        out = _first(model(rows))
    if out.ndim != 2 or out.shape[1] < 2:
        return
    labels = out.argmax(1)
    probabilities = bool(torch.allclose(out.sum(1), torch.ones(len(out)), atol=1e-4))
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    model.train()
    for _ in range(TRAIN_STEPS):
        pick = torch.randint(0, len(rows), (256,), generator=g)
        out = _first(model(rows[pick]))
        scores = torch.log(out + 1e-9) if probabilities else out
        loss = torch.nn.functional.cross_entropy(scores, labels[pick])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def export(torch, model, shape, path: Path, dynamo: bool) -> None:
    example = (torch.randn((2, *shape)),)
    if dynamo:
        torch.onnx.export(model, example, str(path), input_names=["x"], dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("N")},))
    else:
        torch.onnx.export(model, example, str(path), input_names=["x"], dynamo=False,
                          dynamic_axes={"x": {0: "N"}})


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
        row[out.name] = figures
    report = json.loads((outdir / "report.json").read_text())
    row["host_matrix"] = [(r["node"], r["reason"]) for r in report["rows"]
                          if r["op_type"] in MATRIX_OPS and r["where"] != "TPU"]


def quantized_forms(model: Path, calib: dict, work: Path) -> list[dict]:
    """onnxruntime's quantize_static of the float model (QDQ, QOperator), compiled as
    shipped and compared with onnxruntime on that same model."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Rows(CalibrationDataReader):
        def __init__(self):
            self.rows = iter([{"x": calib["x"][i:i + 1]} for i in range(len(calib["x"]))])

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
            make, shape = zoo[name]
            work = root / name
            work.mkdir(parents=True, exist_ok=True)
            model = make().eval()
            sharpen(torch, model, shape)
            path = work / f"{name}.onnx"
            export(torch, model, shape, path, args.dynamo)
            calib = {"x": rng.standard_normal((CALIBRATE, *shape)).astype(np.float32)}
            evaluation = {"x": rng.standard_normal((EVALUATE, *shape)).astype(np.float32)}
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

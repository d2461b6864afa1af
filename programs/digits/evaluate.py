"""Compile the digits models and run the whole test split on the TPU emulator; print the float
model's accuracy (onnxruntime), the compiled model's, and its agreement with onnxruntime
running the same quantized (QDQ) model.

    python programs/digits/evaluate.py [mlp|cnn ...] [--batch B] [--config array_size=N]
                                       [--engine emulator|reference] [--limit ROWS]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import digits  # noqa: E402


def ort_run(path, x):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def evaluate(kind: str, batch: int = 64, config=None, engine=None, limit=None, progress=None):
    """{float, tpu, identical, worst_lsb, rows}: accuracies over the test split."""
    import tpuasm
    _, _, x_test, y_test = digits.load_split()
    if limit:
        x_test, y_test = x_test[:limit], y_test[:limit]
    calibration = np.load(HERE / "calibration.npy", allow_pickle=False)
    model = tpuasm.compile(HERE / f"{kind}.onnx", batch=batch, calibration=calibration,
                           config=config)
    ours = model.run(x_test, progress=progress, engine=engine)["probabilities"]
    float_out = ort_run(HERE / f"{kind}.onnx", x_test)
    quantized = ort_run(model.reference_model, x_test)
    lsb = 1 / 256                   # softmax output: quantize_static's [0, 1] range, uint8
    diff = np.rint(np.abs(ours.astype(np.float64) - quantized) / lsb)
    return {"float": float(np.mean(float_out.argmax(1) == y_test)),
            "tpu": float(np.mean(ours.argmax(1) == y_test)),
            "quantized_ort": float(np.mean(quantized.argmax(1) == y_test)),
            "identical": float(np.mean(ours == quantized)), "worst_lsb": int(diff.max()),
            "rows": len(x_test), "model": model}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kinds", nargs="*", metavar="mlp|cnn", help="default: both")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--config", action="append", default=[])
    p.add_argument("--engine", choices=("emulator", "reference"))
    p.add_argument("--limit", type=int)
    args = p.parse_args(argv)
    if any(k not in ("mlp", "cnn") for k in args.kinds):
        p.error("models: mlp, cnn")
    args.kinds = args.kinds or ["mlp", "cnn"]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
    for kind in args.kinds:
        with Progress(TextColumn(f"{kind}"), BarColumn(), MofNCompleteColumn(),
                      transient=True) as bar:
            task = bar.add_task(kind, total=None)
            r = evaluate(kind, args.batch, args.config, args.engine, args.limit,
                         lambda done, total: bar.update(task, completed=done, total=total))
        print(f"{kind}: {r['rows']} test images; accuracy float {r['float']:.2%}, "
              f"TPU {r['tpu']:.2%} (onnxruntime on the same quantized model "
              f"{r['quantized_ort']:.2%}); outputs identical to onnxruntime's "
              f"{r['identical']:.2%}, worst {r['worst_lsb']} LSB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

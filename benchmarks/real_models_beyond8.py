"""The corpus of real architectures (tests/real_models.py) as onnxruntime's own tools quantize
them beyond 8 bits, compiled and run through the CLI: MatMulNBits (weight-only 4-bit blocks,
`matmul_nbits_quantizer`, symmetric and not, and its block-wise QDQ form at opset 21) given
calibration data, and quantize_static's QDQ models with 4-bit weights (W4A8), uint16
activations (A16W8, the form of Qualcomm's QNN tools) and 16-bit weights and activations
(W16A16) as shipped, and the float16 models of onnxconverter-common's conversion (the way
fp16 exports are made) given calibration data.

One row per model and form: the share of the MACs on the TPU (report.json), top-1 agreement
with the float model of `tpuasm infer` beside onnxruntime's on the shipped model, the
agreement of the two, the share of outputs identical to onnxruntime on the shipped model
and on OUTDIR's model (which differs where the compiler re-rounded 16-bit weights to fit the
int32 accumulators, front/accumroom.py), with the worst difference in output steps (forms
taken as shipped), and the time of the whole `tpuasm compile` process.  onnxruntime runs
the shipped models as the compiler's own sessions do (tpuasm/compiler/ort.py: a QDQ
MatMul's arithmetic in float32).

    .venv/bin/python benchmarks/real_models_beyond8.py [--only MODEL] [--forms F,...]
    .venv/bin/python benchmarks/real_models_beyond8.py --exported W/bert-dynamo ...
        (transformers models: `benchmarks/real_models_hf.py --work W --only bert` first)
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import version_converter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import real_models  # noqa: E402
from tpuasm.compiler.ort import session  # noqa: E402

MODELS = ("transformer_encoder", "sklearn_mlp", "token_embedding", "byte_classifier",
          "conv1d_audio", "mobilenet_v2_block")
# form -> (what it is, compiled given calibration data?)
FORMS = {"nbits4": ("MatMulNBits 4-bit, symmetric, blocks of 32", True),
         "nbits4-asym": ("MatMulNBits 4-bit, zero points, blocks of 32", True),
         "nbits-qdq": ("block-wise DequantizeLinear (opset 21), 4-bit", True),
         "w4a8": ("quantize_static QInt4 weights, QUInt8 activations", False),
         "a16w8": ("quantize_static QUInt16 activations, QInt8 weights (opset 21)", False),
         "w16a16": ("quantize_static QInt16 weights and activations (opset 21)", False),
         "fp16": ("onnxconverter-common's float16 model, float32 inputs and outputs", True),
         "fp16-io": ("onnxconverter-common's float16 model, float16 inputs and outputs",
                     True)}


def quantized(m, form: str, work: Path) -> Path | None:
    """The model in `form` as onnxruntime's tools write it, or None (no node to quantize)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    model = onnx.ModelProto()
    model.CopyFrom(m.model)                   # (the MatMulNBits quantizer edits it in place)
    if form in ("nbits-qdq", "a16w8", "w16a16"):
        model = version_converter.convert_version(model, 21)
    path = work / f"{m.name}.{form}.onnx"
    if form.startswith("fp16"):
        from onnxconverter_common import float16
        onnx.save(float16.convert_float_to_float16(model, keep_io_types=form == "fp16"),
                  str(path))
        return path
    if form.startswith("nbits"):
        from onnxruntime.quantization import matmul_nbits_quantizer as nbits
        config = nbits.DefaultWeightOnlyQuantConfig(
            block_size=32, is_symmetric=form == "nbits4", op_types_to_quantize=("MatMul",),
            quant_format=QuantFormat.QDQ if form == "nbits-qdq" else QuantFormat.QOperator)
        quantizer = nbits.MatMulNBitsQuantizer(model, algo_config=config)
        quantizer.process()
        quantizer.model.save_model_to_file(str(path), False)
        changed = onnx.load(str(path))
        if not any(n.op_type in ("MatMulNBits", "DequantizeLinear") for n in changed.graph.node):
            return None
        return path
    source = work / f"{m.name}.{form}.float.onnx"
    onnx.save(model, str(source))
    types = {"w4a8": ("QUInt8", "QInt4"), "a16w8": ("QUInt16", "QInt8"),
             "w16a16": ("QInt16", "QInt16")}[form]
    quantize_static(str(source), str(path), real_models.calibration_reader(m.calibration),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=getattr(QuantType, types[0]),
                    weight_type=getattr(QuantType, types[1]))
    return path


def exported(folder: Path) -> real_models.RealModel:
    """A model another tool exported, as `make bench-hf --work DIR` leaves it: DIR/NAME.onnx
    (NAME: DIR's name up to its first '-') beside calib.npz and eval.npz."""
    name = folder.name.split("-")[0]
    model = onnx.load(str(folder / f"{name}.onnx"))
    with np.load(folder / "calib.npz") as c, np.load(folder / "eval.npz") as e:
        calibration, evaluation = dict(c), dict(e)
    rows = len(next(iter(evaluation.values())))
    return real_models.RealModel(folder.name, model, calibration, evaluation,
                                 np.zeros(rows, np.int64), model.graph.output[0].name)


def measure(m: real_models.RealModel, form: str, work: Path, make=quantized,
            forms=FORMS) -> dict:
    """One row: `make(m, form, work)` writes the model in `form` (None: nothing to write),
    compiled given calibration data where `forms[form]` says so."""
    name = m.name
    row = {"model": name, "form": form}
    path = make(m, form, work)
    if path is None:
        row["failure"] = "onnxruntime's tool quantizes none of its nodes"
        return row
    calibrate = forms[form][1]
    names = [o.name for o in m.reference.graph.output]
    float_out = real_models.run(m.reference, m.evaluation)[names.index(m.output)]
    if form == "fp16-io":                     # its float inputs in float16
        m = _in_half(m)
    out = work / f"{name}.{form}.out"
    args = ["compile", path, "-o", out, "--batch", m.batch, "-q"]
    if calibrate:
        args += ["--calibrate", real_models.save_data(work / f"{name}.cal.npz", m.calibration)]
    start = time.perf_counter()
    done = real_models.tpuasm(*args, timeout=1800)
    row["compile_s"] = time.perf_counter() - start
    if done.returncode != 0:
        row["failure"] = (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return row
    x = real_models.save_data(work / f"{name}.x.npz", m.evaluation)
    ran = real_models.tpuasm("infer", out, x, "-o", work / f"{name}.{form}.y.npz", "-q",
                             timeout=1800)
    top1 = m.top1
    if ran.returncode != 0:
        row["failure"] = (ran.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return row
    with np.load(work / f"{name}.{form}.y.npz") as y:
        ours = y[m.output]
    shipped_model = onnx.load(str(path))
    try:
        shipped_out = _run(shipped_model, m.evaluation, m.output)
    except Exception as e:            # onnxruntime's own error: the tool wrote a bad model
        row["failure"] = f"onnxruntime cannot run the {form} model: {str(e).splitlines()[0]}"
        return row
    report = json.loads((out / "report.json").read_text())
    macs = report.get("macs") or 0
    row["tpu_share"] = (report.get("tpu_macs") or 0) / macs if macs else None
    row["top1"] = float(np.mean(top1(ours) == top1(float_out)))
    row["shipped_top1"] = float(np.mean(top1(shipped_out) == top1(float_out)))
    row["vs_shipped"] = float(np.mean(top1(ours) == top1(shipped_out)))
    step = real_models.output_steps(shipped_model).get(m.output)
    if not calibrate and step:
        oracle_model = onnx.load(str(out / "model.qdq.onnx"))
        oracle = _run(oracle_model, m.evaluation, m.output)
        for key, theirs in (("shipped", shipped_out), ("outdir", oracle)):
            diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
            row[key] = (float(np.mean(diff <= 1e-6 * step)), float(diff.max(initial=0)) / step)
    return row


def _in_half(m: real_models.RealModel) -> real_models.RealModel:
    from dataclasses import replace

    def half(data: dict) -> dict:
        return {k: v.astype(np.float16) if v.dtype == np.float32 else v
                for k, v in data.items()}
    return replace(m, calibration=half(m.calibration), evaluation=half(m.evaluation))


def _run(model: onnx.ModelProto, feeds: dict, output: str) -> np.ndarray:
    """onnxruntime as the compiler's sessions run a QDQ model (ort.py), on the inputs the
    model has."""
    run = session(model)
    names = {i.name for i in run.get_inputs()}
    return run.run([output], {k: v for k, v in feeds.items() if k in names})[0]


def _fmt(row: dict) -> str:
    head = f"| {row['model']} | {row['form']} |"
    if "failure" in row:
        return head + f" failed: {row['failure'][:100]} | | | | | |"
    share = "-" if row.get("tpu_share") is None else f"{row['tpu_share']:.1%}"

    def same(key):
        return "-" if key not in row else f"{row[key][0]:.1%} (worst {row[key][1]:.1f})"
    return (head + f" {share} | {row['top1']:.2%} ({row['shipped_top1']:.2%}) | "
            f"{row['vs_shipped']:.2%} | {same('shipped')} | {same('outdir')} | "
            f"{row['compile_s']:.1f} s |")


def main(argv=None, doc: str = __doc__, forms_known=FORMS, make=quantized,
         corpus=MODELS) -> int:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--only", action="append", choices=corpus)
    parser.add_argument("--forms", default=",".join(forms_known))
    parser.add_argument("--exported", type=Path, action="append", default=[],
                        metavar="DIR", help="a model `benchmarks/real_models_hf.py --work W` "
                        "exported (W/bert-dynamo, ...) instead of the corpus")
    parser.add_argument("--work", type=Path)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)          # onnxruntime's quantizers log every node
    forms = [f for f in args.forms.split(",") if f]
    unknown = [f for f in forms if f not in forms_known]
    if unknown:
        parser.error(f"unknown forms {unknown}; choose from {', '.join(forms_known)}")
    print("| model | form | MACs on the TPU | top-1 vs float (shipped model in onnxruntime) "
          "| top-1 vs shipped | identical to shipped (worst, output steps) | identical to "
          "OUTDIR's model | compile |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        models = [exported(d) for d in args.exported] if args.exported else \
            [real_models.BUILDERS[name]() for name in args.only or corpus]
        for m in models:
            for form in forms:
                print(_fmt(measure(m, form, work, make, forms_known)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

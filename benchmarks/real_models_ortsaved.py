"""The corpus of real architectures (tests/real_models.py) as an onnxruntime session saves
them optimized (`SessionOptions.optimized_model_filepath`), compiled and run through the
CLI: the float model at the extended level (FusedConv, FusedGemm, FusedMatMul, BiasGelu)
and at the all level, a session's default (MLAS's blocked NCHWc layout), given calibration
data; onnxruntime's quantize_static QDQ model and a QOperator model (the corpus's own, else
quantize_static's) saved at the extended level (QLinearConv, QLinearMatMul, QGemm) and at
the all level (channels-last QLinearConv between Transposes) as shipped.

The columns are those of benchmarks/real_models_beyond8.py: the share of the MACs on the
TPU (report.json), top-1 agreement with the float model of `tpuasm infer` beside
onnxruntime's on the saved model, the agreement of the two, the share of outputs
identical to onnxruntime on the saved model and on OUTDIR's model (forms taken as
shipped), and the time of the whole `tpuasm compile` process.

    .venv/bin/python benchmarks/real_models_ortsaved.py [--only MODEL] [--forms F,...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models_beyond8 as forms_bench  # noqa: E402
from real_models_beyond8 import real_models  # noqa: E402

MODELS = (*forms_bench.MODELS, "resnet_basic_block", "lstm_classifier", "qoperator_cnn")
# form -> (what it is, compiled given calibration data?)
FORMS = {"float-extended": ("float model, session at the extended level", True),
         "float-all": ("float model, session at the all level (NCHWc)", True),
         "qdq-extended": ("quantize_static QDQ model, session at the extended level", False),
         "qdq-all": ("quantize_static QDQ model, session at the all level (NHWC)", False),
         "qop-extended": ("QOperator model, session at the extended level", False),
         "qop-all": ("QOperator model, session at the all level (NHWC)", False)}


def saved(m, form: str, work: Path) -> Path:
    """The model in `form`: the float or QDQ model as a session at that level saves it."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, quantize_static
    kind, level = form.split("-")
    source = work / f"{m.name}.float.onnx"
    onnx.save(m.reference, str(source))            # the float model
    if kind == "qop" and m.quantized:              # the corpus's own QOperator model
        source = work / f"{m.name}.qop.onnx"
        onnx.save(m.model, str(source))
    elif kind != "float":
        quantized = work / f"{m.name}.{kind}.onnx"
        quantize_static(str(source), str(quantized),
                        real_models.calibration_reader(m.calibration), per_channel=True,
                        quant_format=QuantFormat.QDQ if kind == "qdq" else
                        QuantFormat.QOperator)
        source = quantized
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                               f"ORT_ENABLE_{level.upper()}")
    path = work / f"{m.name}.{form}.onnx"
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return path


if __name__ == "__main__":
    sys.exit(forms_bench.main(None, __doc__, FORMS, saved, MODELS))

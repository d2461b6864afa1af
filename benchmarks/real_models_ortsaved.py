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
    .venv/bin/python benchmarks/real_models_ortsaved.py --torch     (the `torch` extra)

With --torch, two networks PyTorch exports instead: a CNN (untrained, random images: its
rows say where the work lands and how close the compiled model stays to the float one) of
BatchNorm, ReLU6, depthwise Convs, Hardswish and residuals over 24 and 40 channels (its float
model at the extended and all levels), and a two-layer transformers BERT with eager
attention, trained for 300 steps to name the class of its first word (as a session saves
it, after onnxruntime's transformer optimizer: SkipLayerNormalization, Attention, BiasGelu,
and that model through quantize_dynamic: QAttention, onnxruntime's int8 BERT recipe), all
given calibration data.
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


# --torch's forms: (what it is, compiled given calibration data?)
TORCH_FORMS = {**{k: v for k, v in FORMS.items() if k.startswith("float")},
               "bert-optimized": ("transformer optimizer (model_type bert)", True),
               "bert-int8": ("transformer optimizer, then quantize_dynamic", True)}


def torch_saved(m, form: str, work: Path) -> Path:
    """The --torch networks' forms: a session's, or the transformer optimizer's."""
    if not form.startswith("bert"):
        return saved(m, form, work)
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    source = work / f"{m.name}.float.onnx"
    onnx.save(m.model, str(source))
    path = work / f"{m.name}.bert-optimized.onnx"
    optimize_model(str(source), model_type="bert", num_heads=4, hidden_size=64) \
        .save_model_to_file(str(path))
    if form == "bert-int8":
        dynamic = work / f"{m.name}.bert-int8.onnx"
        quantize_dynamic(str(path), str(dynamic), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        return dynamic
    return path


def torch_models(work: Path) -> list:
    """The --torch networks as the corpus's RealModel rows."""
    import numpy as np
    import torch
    from torch import nn
    torch.manual_seed(0)
    rng = np.random.default_rng(0)

    class Inverted(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c, 4 * c, 1), nn.BatchNorm2d(4 * c), nn.ReLU6(),
                nn.Conv2d(4 * c, 4 * c, 3, padding=1, groups=4 * c), nn.BatchNorm2d(4 * c),
                nn.Hardswish(), nn.Conv2d(4 * c, c, 1), nn.BatchNorm2d(c))

        def forward(self, x):
            return x + self.body(x)

    cnn = nn.Sequential(nn.Conv2d(3, 24, 3, stride=2, padding=1), nn.BatchNorm2d(24),
                        nn.ReLU(), Inverted(24), Inverted(24),
                        nn.Conv2d(24, 40, 3, stride=2, padding=1), nn.LeakyReLU(0.1),
                        nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(40, 10)).eval()
    for layer in cnn.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 2.0)
    images = rng.normal(size=(640, 3, 32, 32)).astype(np.float32)
    cnn_path = work / "torch_cnn.onnx"
    torch.onnx.export(cnn, torch.from_numpy(images[:1]), str(cnn_path), input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "n"}}, opset_version=17,
                      dynamo=False)
    from transformers import BertConfig, BertForSequenceClassification
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, vocab_size=500, max_position_embeddings=64,
                        num_labels=3)
    config._attn_implementation = "eager"       # the form the optimizer fuses
    bert = BertForSequenceClassification(config)
    ids = rng.integers(0, 500, (2368, 16)).astype(np.int64)
    mask = np.ones_like(ids)
    labels = torch.from_numpy(ids[:, 1] % 3)            # the class of the first word
    optimizer = torch.optim.Adam(bert.parameters(), lr=1e-3)
    for step in range(300):                             # on rows 320 and up
        rows = slice(320 + (step * 64) % 2048, 320 + (step * 64) % 2048 + 64)
        loss = bert(input_ids=torch.from_numpy(ids[rows]),
                    attention_mask=torch.from_numpy(mask[rows]), labels=labels[rows]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    bert.eval()
    ids, mask = ids[:320], mask[:320]
    bert_path = work / "torch_bert.onnx"
    torch.onnx.export(bert, (torch.from_numpy(ids[:2]), torch.from_numpy(mask[:2])),
                      str(bert_path), input_names=["input_ids", "attention_mask"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": {0: "b", 1: "s"},
                                    "attention_mask": {0: "b", 1: "s"}})
    return [real_models.RealModel("torch_cnn", onnx.load(str(cnn_path)),
                                  {"x": images[:256]}, {"x": images[256:]},
                                  np.zeros(384, np.int64), "y"),
            real_models.RealModel("torch_bert", onnx.load(str(bert_path)),
                                  {"input_ids": ids[:64], "attention_mask": mask[:64]},
                                  {"input_ids": ids[64:], "attention_mask": mask[64:]},
                                  np.zeros(256, np.int64), "logits")]


def torch_main() -> int:
    import logging
    import tempfile
    logging.disable(logging.WARNING)
    print("| model | form | MACs on the TPU | top-1 vs float (saved model in onnxruntime) "
          "| top-1 vs saved | identical to saved | identical to OUTDIR's model | compile |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for m in torch_models(work):
            forms = ("float-extended", "float-all") if m.name == "torch_cnn" else \
                ("float-extended", "bert-optimized", "bert-int8")
            for form in forms:
                row = forms_bench.measure(m, form, work, torch_saved, TORCH_FORMS)
                print(forms_bench._fmt(row), flush=True)
    return 0


if __name__ == "__main__":
    if "--torch" in sys.argv[1:]:
        sys.exit(torch_main())
    sys.exit(forms_bench.main(None, __doc__, FORMS, saved, MODELS))

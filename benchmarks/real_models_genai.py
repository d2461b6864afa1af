"""Language models in the form onnxruntime-genai's model builder ships them for CPU, compiled
and run through the CLI as a new user runs them (OPTIONAL: not run by `make test`; `make
bench-genai` installs the `genai` extra: PyTorch, transformers, onnxruntime-genai).

    make bench-genai                      # or, with the extra installed:
    .venv/bin/python benchmarks/real_models_genai.py [--only llama] [--work DIR]

Each decoder (random-init small configs, nothing downloaded: hidden 64, 2 layers, 4 query
and 2 key/value heads of 16, vocabulary 512) is trained for a few hundred steps on sequences
x[t] = (x[t-1] + step) mod 509 whose step the first two tokens set, so that its next token
has a trained model's margins.  The builder (`python -m onnxruntime_genai.models.builder -e
cpu`) writes it as fp32 (MatMuls) and int4 (MatMulNBits, blocks of 32, accuracy level 4):
SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization, GroupQueryAttention with
rotary positions inside, a past state per layer, every weight in model.onnx.data.

Data: one decoding step after a 15-token prompt, its past states the fp32 model's own from
that prompt (onnxruntime, no past); 64 rows to calibrate, 256 others to measure.  Figures
per model: the MatMuls on the TPU, MACs on the TPU (attention's products of two
activations on the host), top-1 of the next token against the shipped model in
onnxruntime and against the sequence's true next token (the shipped model's own beside
it), SNR of the logits, the compiled model against OUTDIR's QDQ model in onnxruntime, and
onnxruntime's own quantize_static QDQ model of the fp32 model on the same rows.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models_hf import ort_qdq  # noqa: E402
from real_models_shipped import compile_and_infer, snr  # noqa: E402

VOCAB, MODULUS, PROMPT, TRAIN_STEPS = 512, 509, 15, 1500
ARCHITECTURES = ("llama", "qwen2", "mistral")
PRECISIONS = ("fp32", "int4")


def _sequences(torch, rows: int, generator, length: int):
    start = torch.randint(0, MODULUS, (rows, 1), generator=generator)
    step = torch.randint(1, 40, (rows, 1), generator=generator)
    return (start + step * torch.arange(length)) % MODULUS


def _config(transformers, name: str):
    size = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                bos_token_id=510, eos_token_id=511)
    kind = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
            "mistral": transformers.MistralConfig}[name]
    return kind(**size)


def trained_decoder(name: str, folder: Path) -> float:
    """A small decoder trained on the progression task, saved with a word-level tokenizer
    (the builder writes the tokenizer's files too); its next-token accuracy in PyTorch."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    net = transformers.AutoModelForCausalLM.from_config(_config(transformers, name))
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    for _ in range(TRAIN_STEPS):
        x = _sequences(torch, 64, generator, PROMPT + 9)
        loss = net(input_ids=x, labels=x).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    x = _sequences(torch, 256, generator, PROMPT + 9)
    with torch.no_grad():
        accuracy = float((net(input_ids=x).logits[:, 2:-1].argmax(-1) == x[:, 3:]).float()
                         .mean())
    net.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(510)} | {"<s>": 510, "</s>": 511}
    words = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>",
                                         eos_token="</s>", unk_token="w0").save_pretrained(folder)
    return accuracy


def build(source: Path, out: Path, precision: str) -> Path:
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source),
                    "-o", str(out), "-p", precision, "-e", "cpu"], check=True,
                   capture_output=True)
    return out / "model.onnx"


def decoding_step(model: Path, rows: int, seed: int) -> tuple[dict, np.ndarray]:
    """One step's inputs after a PROMPT-token prompt (its past states the model's own) and
    the sequence's true next token."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    states = [n.name for n in session.get_inputs() if n.name.startswith("past_key_values")]
    rng = np.random.default_rng(seed)
    start, step = rng.integers(0, MODULUS, (rows, 1)), rng.integers(1, 40, (rows, 1))
    tokens = (start + step * np.arange(PROMPT + 2)) % MODULUS
    # (batch, kv heads, past, head): the head's size is a named dimension in the model
    decoder = json.loads((model.parent / "genai_config.json").read_text())["model"]["decoder"]
    empty = np.zeros((rows, decoder["num_key_value_heads"], 0, decoder["head_size"]),
                     np.float32)
    prompt = dict(zip(names, session.run(None, {
        "input_ids": tokens[:, :PROMPT], "attention_mask": np.ones((rows, PROMPT), np.int64),
        **{s: empty for s in states}})))
    step_inputs = {"input_ids": tokens[:, PROMPT:PROMPT + 1],
                   "attention_mask": np.ones((rows, PROMPT + 1), np.int64),
                   **{s: prompt[s.replace("past_key_values", "present")] for s in states}}
    return step_inputs, tokens[:, PROMPT + 1]


def _run(model: Path, data: dict, batch: int | None = None) -> dict:
    """onnxruntime over every row (in batches of `batch` for a model of a fixed batch)."""
    import onnxruntime as ort
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    rows = len(data["input_ids"])
    batch = batch or rows
    parts = [session.run(None, {k: v[i:i + batch] for k, v in data.items()})
             for i in range(0, rows, batch)]
    return {n: np.concatenate([p[j] for p in parts]) for j, n in enumerate(names)}


def measure(model: Path, work: Path, calib: dict, evaluation: dict, truth: np.ndarray,
            row: dict) -> dict:
    np.savez(work / "calib.npz", **calib)
    np.savez(work / "eval.npz", **evaluation)
    got = compile_and_infer(model, work, [], row)
    out = work / model.stem
    if got is None:
        return row
    report = json.loads((out / "report.json").read_text())
    matmuls = [r for r in report["rows"] if r["op_type"] in ("MatMul", "MatMulNBits")]
    row["matmuls_on_tpu"] = f"{sum(r['where'] == 'TPU' for r in matmuls)}/{len(matmuls)}"
    row["tpu_share"] = round(100 * row["tpu_share"], 1)
    shipped = _run(model, evaluation)
    top = lambda outputs: outputs["logits"][:, -1].argmax(-1)        # noqa: E731
    row["top1_vs_shipped"] = round(100 * float(np.mean(top(got) == top(shipped))), 2)
    row["next_token"] = round(100 * float(np.mean(top(got) == truth)), 2)
    row["shipped_next_token"] = round(100 * float(np.mean(top(shipped) == truth)), 2)
    row["logits_snr"] = round(snr(shipped["logits"], got["logits"]), 1)
    own = _run(out / "model.qdq.onnx", evaluation, report["batch"])
    row["vs_outdir_qdq_top1"] = round(100 * float(np.mean(top(got) == top(own))), 2)
    row["vs_outdir_qdq_max_diff"] = float(np.abs(got["logits"] - own["logits"]).max())
    return row


def table(rows: list[dict]) -> str:
    head = ("model", "MatMuls on TPU", "MACs on TPU", "top-1 vs shipped", "next token (shipped)",
            "logits SNR dB", "vs OUTDIR's QDQ (max diff)", "ORT quantize_static top-1",
            "compile s", "peak MB")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "failure" in r:
            lines.append(f"| {r['model']} | failed: {r['failure']} |" + " |" * (len(head) - 2))
            continue
        cells = (r["model"], r["matmuls_on_tpu"], f"{r['tpu_share']} %",
                 f"{r['top1_vs_shipped']} %",
                 f"{r['next_token']} % ({r['shipped_next_token']} %)", r["logits_snr"],
                 f"{r['vs_outdir_qdq_top1']} % ({r['vs_outdir_qdq_max_diff']:.2g})",
                 f"{r['ort_qdq_top1']} %" if "ort_qdq_top1" in r else r.get("ort_qdq", "-"),
                 f"{r['compile_s']:.1f}", r["compile_peak_mb"])
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, help="where models and OUTDIRs go (default: temp)")
    p.add_argument("--only", action="append", default=[], choices=ARCHITECTURES)
    args = p.parse_args(argv)
    try:
        import onnxruntime_genai  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"{e.name} is not installed: `make bench-genai` installs the genai extra",
              file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for name in args.only or ARCHITECTURES:
            source = work / name / "hf"
            torch_accuracy = trained_decoder(name, source)
            models = {p: build(source, work / name / p, p) for p in PRECISIONS}
            calib, _ = decoding_step(models["fp32"], 64, 1)
            evaluation, truth = decoding_step(models["fp32"], 256, 2)
            for precision, model in models.items():
                row = {"model": f"{name} {precision}", "torch_next_token": torch_accuracy}
                folder = work / name / f"run-{precision}"
                folder.mkdir(parents=True, exist_ok=True)
                measure(model, folder, calib, evaluation, truth, row)
                if precision == "fp32" and "failure" not in row:
                    shipped = _run(model, evaluation)
                    row.update(ort_qdq(model, folder, calib, evaluation,
                                       {"logits": shipped["logits"]}))
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The corpus of real architectures (tests/real_models.py) compiled and run through the CLI, as
a user would: prints the README's table, one row per model: its nodes and multiply-
accumulates per sample, the share of those MACs that runs on the TPU (report.json's `where`
for each matrix node), top-1 agreement of `tpuasm infer` with onnxruntime on the float model,
the share of output elements identical to onnxruntime on OUTDIR/model.qdq.onnx (and the worst
difference in output steps), and the time of the whole `tpuasm compile` process.

    .venv/bin/python benchmarks/real_models.py [--markdown] [MODEL ...]     (make bench-real)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import real_models  # noqa: E402


def _source_name(node: str, float_names: set[str]) -> str:
    """A QOperator node's float-model name (quantize_static appends `_quant`)."""
    if node not in float_names and node.endswith("_quant") and node[:-6] in float_names:
        return node[:-6]
    return node


def measure(name: str, work: Path) -> dict:
    m = real_models.BUILDERS[name]()
    macs = real_models.macs(m.reference, m.batch_axis, m.evaluation)
    total = sum(macs.values())
    row = {"model": name, "nodes": len(m.model.graph.node), "macs": total,
           "accuracy": float(np.mean(m.top1(real_models.run(m.reference, m.evaluation)[
               [o.name for o in m.reference.graph.output].index(m.output)]) == m.labels))}
    outcome = real_models.compile_and_infer(m, work)
    row["compile_s"] = outcome.compile_seconds
    if outcome.failure:
        row["failure"] = outcome.failure
        return row
    report = outcome.report()
    on_tpu = {_source_name(r["node"], set(macs)) for r in report["rows"] if r["where"] == "TPU"}
    row["tpu_share"] = sum(v for k, v in macs.items() if k in on_tpu) / total if total else 0.0
    row["top1"] = real_models.top1_agreement(outcome)
    compared = real_models.qdq_agreement(outcome)
    row["identical"] = min(same for same, _ in compared.values()) if compared else None
    worst = [w for _, w in compared.values() if w is not None]
    row["worst_steps"] = max(worst) if worst else None
    return row


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _fmt(row: dict) -> list[str]:
    head = [row["model"], f"{row['nodes']}", f"{row['macs']:,}", f"{row['accuracy']:.1%}"]
    if "failure" in row:
        reason = row["failure"].split(": ", 1)[-1].replace("error: ", "")
        reason = reason.split(".onnx: ", 1)[-1]
        return head + ["-", "-", "-", f"{row['compile_s']:.1f} s (failed: {_short(reason)})"]
    identical = "-" if row["identical"] is None else f"{row['identical']:.2%}"
    if row.get("worst_steps") is not None:
        identical += f" (worst {row['worst_steps']:.0f} LSB)"
    return head + [f"{row['tpu_share']:.1%}", f"{row['top1']:.2%}", identical,
                   f"{row['compile_s']:.1f} s"]


HEADER = ["model", "nodes", "MACs / sample", "float accuracy", "MACs on the TPU",
          "top-1 = float", "identical to QDQ", "compile (whole process)"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", choices=[[], *real_models.BUILDERS], default=[],
                   metavar="MODEL", help=f"any of {', '.join(real_models.BUILDERS)}")
    p.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = p.parse_args()
    names = args.models or list(real_models.BUILDERS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tpuasm-real-") as d:
        for name in names:
            work = Path(d) / name
            work.mkdir()
            rows.append(_fmt(measure(name, work)))
            if not args.markdown:
                print("  ".join(rows[-1]), flush=True)
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        print("\ncolumns: " + ", ".join(HEADER))
    return 0


if __name__ == "__main__":
    sys.exit(main())

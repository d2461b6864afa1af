"""Pools with rectangular windows between two Convs (the QDQ models of
tests/test_compiler_rect_pool.py): where the pool runs, the TPU segments and host steps, the TPU cycles
per batch, and the share of outputs identical to onnxruntime on the same model.

    .venv/bin/python benchmarks/rect_pools.py

(Before Activate's column registers, spec/isa.md 5.5, each of these pools ran on the host
between two TPU segments.)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from onnx_models import run_ort  # noqa: E402
from test_compiler_rect_pool import SMALL, conv_pool_conv  # noqa: E402
from tpuasm.compiler.pipeline import compile_model  # noqa: E402

POOLS = {   # tests/test_compiler_rect_pool.py's models, by what they are
    "MaxPool (2,1) stride (2,1) (CRNN)": "crnn",
    "MaxPool (2,2) stride (2,1) pads (0,1,0,1)": "paddle",
    "AveragePool (1,3) pads (0,1,0,1)": "avg_1x3",
    "AveragePool (1,3) pads (0,1,0,1) counted": "avg_1x3_counted",
}


def main():
    x = np.random.default_rng(7).normal(0, 1.2, (20, 3, 8, 6)).astype(np.float32)
    for name, pool in POOLS.items():
        m, _ = conv_pool_conv(pool)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.onnx"
            onnx.save(m, str(path))
            compiled = compile_model(path, batch=6, config=SMALL)
            (want,) = run_ort(m, {"x": x})
            got = compiled.run(x)["y"]
        kinds = [s["kind"] for s in compiled.report.steps]
        where = {r.node: r.where for r in compiled.report.rows}["pool"]
        cycles = sum(s.cycles or 0 for s in compiled.report.segments)
        print(f"{name:44s} pool on {where:4s}  {kinds.count('tpu')} TPU segment(s), "
              f"{kinds.count('host')} host steps, {cycles} TPU cycles a batch, "
              f"{np.mean(got == want):.2%} identical to onnxruntime")


if __name__ == "__main__":
    main()

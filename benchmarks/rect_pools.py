"""Pools with rectangular windows between two Convs (QDQ models made with onnx.helper by
tests/qdq_builder.py): where the pool runs, the TPU segments and host steps, the TPU cycles
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
from qdq_builder import QDQBuilder  # noqa: E402
from tpuasm.compiler.pipeline import compile_model  # noqa: E402

POOLS = {
    "MaxPool (2,1) stride (2,1) (CRNN)": ("MaxPool", dict(kernel_shape=[2, 1], strides=[2, 1])),
    "MaxPool (2,2) stride (2,1) pads (0,1,0,1)": (
        "MaxPool", dict(kernel_shape=[2, 2], strides=[2, 1], pads=[0, 1, 0, 1])),
    "AveragePool (1,3) pads (0,1,0,1)": (
        "AveragePool", dict(kernel_shape=[1, 3], strides=[1, 1], pads=[0, 1, 0, 1],
                            count_include_pad=0)),
    "AveragePool (1,3) pads (0,1,0,1) counted": (
        "AveragePool", dict(kernel_shape=[1, 3], strides=[1, 1], pads=[0, 1, 0, 1],
                            count_include_pad=1)),
}


def model(op: str, attrs: dict) -> onnx.ModelProto:
    """conv -> Relu -> pool -> conv, as tests/test_compiler_rect_pool.py builds it."""
    b = QDQBuilder((3, 8, 6), seed=0)
    b.quantize()
    b.conv(8, (3, 3), pads=[1, 1, 1, 1], name="conv1")
    b.unary("Relu")
    b.quantize()
    b.unary(op, name="pool", **attrs)
    b.quantize(same=op == "MaxPool", widen=1.0371)
    b.conv(5, (3, 3), pads=[1, 1, 1, 1], name="conv2")
    return b.model()


def main():
    x = np.random.default_rng(7).normal(0, 1.2, (20, 3, 8, 6)).astype(np.float32)
    for name, (op, attrs) in POOLS.items():
        m = model(op, attrs)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "m.onnx"
            onnx.save(m, str(path))
            compiled = compile_model(path, batch=6, config=["array_size=16", "acc_rows=256"])
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

"""A MobileNet-sized depthwise convolution on the TPU: 3x3, 144 channels (groups = 144) on
56x56 images, bias and ReLU6, as a QDQ model through `tpuasm.compile`: the compile time,
the weight tiles (the block-diagonal kernel's all-zero tiles are skipped: one tile per tap
on the 256 x 256 array), the program's cycles for one batch (the emulator; TPU v1 timing
does not depend on the data) and its agreement with onnxruntime on the same model.

    .venv/bin/python benchmarks/bench_depthwise.py [--batch 8]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tpuasm  # noqa: E402

C, HW = 144, 56


def depthwise_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (C, 1, 3, 3)).astype(np.int8)
    w_scale = rng.uniform(0.002, 0.004, C).astype(np.float32)
    x_scale, y_scale = np.float32(0.02), np.float32(6 / 255)
    bias = rng.integers(-2000, 2000, C).astype(np.int32)
    inits = [numpy_helper.from_array(v, n) for n, v in [
        ("xs", x_scale), ("xz", np.uint8(128)), ("w", w), ("ws", w_scale),
        ("wz", np.zeros(C, np.int8)), ("b", bias), ("bs", (x_scale * w_scale)),
        ("bz", np.zeros(C, np.int32)), ("ys", y_scale), ("yz", np.uint8(0)),
        ("lo", np.float32(0)), ("hi", np.float32(6))]]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], name="depthwise",
                              kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=C),
             helper.make_node("Clip", ["c", "lo", "hi"], ["r"], name="relu6"),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    graph = helper.make_graph(nodes, "depthwise", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", C, HW, HW])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", C, HW, HW])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    from tpuasm.compiler.ort import session
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "depthwise.onnx"
        model = depthwise_model()
        onnx.save(model, str(path))
        start = time.perf_counter()
        compiled = tpuasm.compile(path, batch=args.batch)
        seconds = time.perf_counter() - start
        (step,) = [s for s in compiled.steps if hasattr(s, "program")]
        row = next(r for r in compiled.report.rows if r.node == "depthwise")
        print(f"depthwise 3x3, {C} channels, {HW}x{HW}, batch {args.batch}")
        print(f"  compile: {seconds:.2f} s; {step.program.weights.shape[0]} weight tiles; "
              f"{step.program.passes} pass(es); {step.program.instructions:,} instructions")
        print(f"  report: {row.where}: {row.note}")
        x = np.random.default_rng(1).normal(0, 1.5, (args.batch, C, HW, HW)).astype(np.float32)
        start = time.perf_counter()
        ours = compiled.run(x)["y"]
        run_seconds = time.perf_counter() - start
        (theirs,) = session(model).run(None, {"x": x})
        same = float(np.mean(np.rint(np.abs(ours - theirs) / (6 / 255)) == 0))
        machine = step.machine(compiled.config)
        print(f"  emulator: {machine.cycle:,} cycles for the batch, {run_seconds:.2f} s; "
              f"{same:.4%} of the outputs identical to onnxruntime")


if __name__ == "__main__":
    main()

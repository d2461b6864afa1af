"""Front-end speed and memory on a large quantized model: a QDQ MLP of ~100M int8 weights
(10 Gemm layers of 3162 x 3162, the size of the paper's CNN1), its weights in an external
data file.  Prints, side by side: the time to read the file with onnx.load (a reference for
"touching every byte once"), the compiler's front end (read, shapes, lowering, partition:
codegen=False) and, when the back end is there, the whole compile; and each run's peak
resident memory (measured in a child process, VmHWM) against the weights' size.

    .venv/bin/python benchmarks/bench_compile.py [--width 3162] [--layers 10] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
mode, path = sys.argv[1], sys.argv[2]
t = time.perf_counter()
if mode == "onnx.load":
    import onnx
    m = onnx.load(path)
else:
    from tpuasm.compiler.pipeline import compile_model
    m = compile_model(path, batch=8, codegen=(mode == "compile"))
elapsed = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"seconds": elapsed, "peak_mb": hwm / 1024}))
"""


def build(path: Path, width: int, layers: int) -> int:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    act = "x"
    inits += [numpy_helper.from_array(np.float32(0.02), "s"),
              numpy_helper.from_array(np.uint8(128), "z")]
    nodes.append(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q0"]))
    for i in range(layers):
        w = rng.integers(-127, 128, (width, width), dtype=np.int8)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array(np.full(width, 1e-3, np.float32), f"ws{i}"),
                  numpy_helper.from_array(np.zeros(width, np.int8), f"wz{i}")]
        nodes += [helper.make_node("DequantizeLinear", [f"q{i}", "s", "z"], [f"x{i}"]),
                  helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"],
                                   [f"wf{i}"], axis=0),
                  helper.make_node("Gemm", [f"x{i}", f"wf{i}"], [f"y{i}"], transB=1),
                  helper.make_node("QuantizeLinear", [f"y{i}", "s", "z"], [f"q{i + 1}"])]
        act = f"q{i + 1}"
    nodes.append(helper.make_node("DequantizeLinear", [act, "s", "z"], ["y"]))
    graph = helper.make_graph(nodes, "big", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", width])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="big.weights", size_threshold=1024)
    return width * width * layers


def _fail(mode):
    raise SystemExit(f"{mode}: the child process failed")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=3162)
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.onnx"
        weights = build(path, args.width, args.layers)
        print(f"QDQ MLP: {args.layers} layers of {args.width}x{args.width}, "
              f"{weights / 1e6:.1f}M int8 weights ({weights / 2**20:.0f} MiB)")
        modes = ["onnx.load", "front end"]
        try:
            import tpuasm.compiler.codegen  # noqa: F401
            modes.append("compile")
        except ImportError:
            pass
        for mode in modes:
            runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD, mode, str(path)],
                                              capture_output=True, text=True,
                                              check=False).stdout or _fail(mode))
                    for _ in range(args.repeat)]
            secs = sorted(r["seconds"] for r in runs)
            mem = max(r["peak_mb"] for r in runs)
            print(f"  {mode:<10} {secs[0]:6.2f}-{secs[-1]:6.2f} s   peak {mem:7.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Front-end speed and memory on a large quantized model: a QDQ MLP of ~100M int8 weights
(10 Gemm layers of 3162 x 3162, the size of the paper's CNN1), its weights in an external
data file.  Prints, side by side: the time to read the file with onnx.load (a reference for
"touching every byte once"), the compiler's front end (read, shapes, lowering, partition:
codegen=False) and, when the back end is there, the whole compile; and each run's peak
resident memory (measured in a child process, VmHWM) against the weights' size.

    .venv/bin/python benchmarks/bench_compile.py [--width 3162] [--layers 10] [--repeat 3]

With --float (issue 20, item 7: compile cost): ~3 MB FLOAT models, an MLP
(512-640-512-256-10, 789k float32 weights), a sequence CNN shaped like the issue's
file-type classifier ((N, 1024, 16) input, three Conv1d over the sequence, 709k weights),
each with a calibration set of 256 rows, and a look-alike of Magika standard_v3_3 at its
sizes (tests/magika_like.py MAGIKA: int32 bytes (N, 2048), one-hot, Dense + GELU and two
LayerNorms in primitives, a Conv1d of 512 filters, 214 classes; 3.1 MB, 366.7 M MACs a
sample) with 400 rows.  Times the whole `tpuasm compile` process (quantization, lowering,
code generation, the check against the float model on 128 evenly spread calibration rows
(runtime/validate.py's CALIBRATION_CHECK_ROWS), OUTDIR) next to processes that run only
onnxruntime's own quantize_static on the same model with the same rows and options (QDQ,
int8 weights per channel, uint8 activations, MinMax, every operator), fed in chunks of 64
rows as tpuasm's quantize.py feeds it, and again in chunks of 16 (its peak memory follows a
chunk's activations, not the weights), in the same run.  Each process's peak resident
memory is the kernel's (wait4's ru_maxrss) as a small launcher process sees it (a child
forked from this process, which holds the models it built, is charged this process's
memory until its exec); a process that only imports onnxruntime's quantization tools
is the floor.  The look-alike's untrained front keeps fewer of its answers at 8 bits than
Magika's (min-max: about 90 % top-1 on the check's rows), so a default compile runs the
whole calibration search; `--compile-option=--calibration-method=minmax` is Magika's own
path (its check accepts min-max).

    .venv/bin/python benchmarks/bench_compile.py --float [--model mlp|seqcnn|magika]
        [--repeat 3] [--compile-option=--calibration-method=minmax]

and a model of the user's, e.g. Magika's 3.2 MB model.onnx with the calibration file
benchmarks/real_models_shipped.py writes for it (int32 bytes: the ORT child feeds any inputs
of a .npz by name):

    .venv/bin/python benchmarks/bench_compile.py --float --float-model WORK/model.onnx \
        --calibration WORK/calib.npz
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
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


FLOAT_WIDTHS = (512, 640, 512, 256, 10)
SEQ_LENGTH, SEQ_DEPTH = 1024, 16
SEQ_CONVS = ((16, 128, 9), (128, 256, 9), (256, 256, 5))     # (in, out, kernel) Conv1d layers

ORT_QUANTIZE = r"""
import sys
import numpy as np
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_static)
import onnx
model, data, out = sys.argv[1:4]
chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 64
loaded = np.load(data)
inputs = dict(loaded) if hasattr(loaded, "files") else \
    {onnx.load(model, load_external_data=False).graph.input[0].name: loaded}
rows = len(next(iter(inputs.values())))


class Reader(CalibrationDataReader):
    def __init__(self):
        self.start = 0

    def get_next(self):
        if self.start >= rows:
            return None
        self.start += chunk
        return {k: v[self.start - chunk:self.start] for k, v in inputs.items()}


quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
"""


def _save(path: Path, nodes, inits, input_shape, outputs: int) -> None:
    import onnx
    from onnx import TensorProto, helper
    nodes[-1].output[0] = "logits"
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", *input_shape])], [helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["N", outputs])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _gemm(rng, nodes, inits, act: str, k: int, n: int, name: str, relu: bool) -> tuple[str, int]:
    """torch Linear (Gemm transB=1), optionally + Relu; returns the output and the weights."""
    from onnx import helper, numpy_helper
    w = rng.normal(0, np.sqrt(2 / k), (n, k)).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}.weight"),
              numpy_helper.from_array(rng.normal(0, 0.05, n).astype(np.float32),
                                      f"{name}.bias")]
    out = f"/{name}/Gemm_output_0"
    nodes.append(helper.make_node("Gemm", [act, f"{name}.weight", f"{name}.bias"], [out],
                                  name=f"/{name}/Gemm", transB=1))
    if relu:
        nodes.append(helper.make_node("Relu", [out], [f"/{name}/Relu_output_0"],
                                      name=f"/{name}/Relu"))
        out = f"/{name}/Relu_output_0"
    return out, w.size


def build_float_mlp(path: Path, calibration: Path, rows: int = 256) -> int:
    """A float MLP as torch exports Linear layers (Gemm transB=1) with Relus, and its
    calibration rows; returns the number of weights."""
    rng = np.random.default_rng(0)
    nodes, inits, act, count = [], [], "x", 0
    layers = list(zip(FLOAT_WIDTHS, FLOAT_WIDTHS[1:]))
    for i, (k, n) in enumerate(layers):
        act, size = _gemm(rng, nodes, inits, act, k, n, f"fc{i}", relu=i < len(layers) - 1)
        count += size
    _save(path, nodes, inits, [FLOAT_WIDTHS[0]], FLOAT_WIDTHS[-1])
    np.save(calibration, rng.normal(0, 1, (rows, FLOAT_WIDTHS[0])).astype(np.float32))
    return count


def build_sequence_cnn(path: Path, calibration: Path, rows: int = 256) -> int:
    """The shape of the issue's file-type classifier: a (N, 1024, 16) one-hot-like sequence
    (NWC, as JAX writes it) transposed to NCW, three Conv1d + Relu over the sequence, a mean
    over time, two Dense layers; returns the number of weights."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Transpose", ["x"], ["/Transpose_output_0"], name="/Transpose",
                              perm=[0, 2, 1])]
    inits, act, count = [], "/Transpose_output_0", 0
    for i, (cin, cout, k) in enumerate(SEQ_CONVS):
        w = rng.normal(0, np.sqrt(2 / (cin * k)), (cout, cin, k)).astype(np.float32)
        count += w.size
        inits += [numpy_helper.from_array(w, f"conv{i}.weight"),
                  numpy_helper.from_array(rng.normal(0, 0.05, cout).astype(np.float32),
                                          f"conv{i}.bias")]
        nodes += [helper.make_node("Conv", [act, f"conv{i}.weight", f"conv{i}.bias"],
                                   [f"/conv{i}/Conv_output_0"], name=f"/conv{i}/Conv",
                                   kernel_shape=[k], pads=[k // 2, k // 2], strides=[1]),
                  helper.make_node("Relu", [f"/conv{i}/Conv_output_0"],
                                   [f"/conv{i}/Relu_output_0"], name=f"/conv{i}/Relu")]
        act = f"/conv{i}/Relu_output_0"
    nodes.append(helper.make_node("ReduceMean", [act], ["/pool/ReduceMean_output_0"],
                                  name="/pool/ReduceMean", axes=[2], keepdims=0))
    act, size = _gemm(rng, nodes, inits, "/pool/ReduceMean_output_0", SEQ_CONVS[-1][1], 256,
                      "dense0", relu=True)
    count += size
    act, size = _gemm(rng, nodes, inits, act, 256, 10, "dense1", relu=False)
    count += size
    _save(path, nodes, inits, [SEQ_LENGTH, SEQ_DEPTH], 10)
    nibbles = rng.integers(0, SEQ_DEPTH, (rows, SEQ_LENGTH))
    np.save(calibration, np.eye(SEQ_DEPTH, dtype=np.float32)[nibbles])
    return count


# A child's peak memory as a small process sees it: wait4's ru_maxrss counts the memory of
# the process a child is forked from until its exec (the kernel keeps the larger), so a
# child of this process, which holds the models it built, would report this process's size.
LAUNCHER = r"""
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def timed_process(argv: list[str], timeout: float = 900) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS in MiB, exit status, last stderr line) of one whole child
    process, run by LAUNCHER (its own start, ~30 ms, is in the seconds)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        done = subprocess.run([sys.executable, "-c", LAUNCHER, *argv], stdout=subprocess.PIPE,
                              stderr=err, timeout=timeout, check=False)
        elapsed = time.perf_counter() - start
        err.seek(0)
        last = (err.read().decode(errors="replace").strip().splitlines() or [""])[-1]
    peak, status = (int(v) for v in done.stdout.split())
    return elapsed, peak / 1024, status, last


def build_magika_like(path: Path, calibration: Path, rows: int = 400) -> int:
    """tests/magika_like.py at Magika standard_v3_3's sizes (int32 bytes (N, 2048), one-hot,
    Dense + GELU and LayerNorms in primitives, a Conv of 512 filters of 5 over 512
    positions, 214 classes; 3.1 MB, 366.7 M MACs a sample), its head trained on 400 files,
    and `rows` other files to calibrate on; returns the number of weights."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import onnx
    from magika_like import MAGIKA, files, trained
    model, rng = trained(MAGIKA)
    onnx.save(model, str(path))
    np.save(calibration, files(rng, rows, MAGIKA)[0])
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT)


MODELS = {"mlp": ("float MLP " + "-".join(map(str, FLOAT_WIDTHS)), build_float_mlp, 64),
          "seqcnn": (f"sequence CNN ({SEQ_LENGTH}x{SEQ_DEPTH} input, 3 Conv1d, 2 Dense)",
                     build_sequence_cnn, 64),
          "magika": ("Magika look-alike (tests/magika_like.py MAGIKA: int32 bytes, one-hot, "
                     "GELU and LayerNorm in primitives, Conv1d)", build_magika_like, 64)}


def _given(model: Path, data: Path):
    """A float model and calibration file of the user's (--float-model, --calibration):
    the build step of MODELS for a model that already exists."""
    def build(path: Path, calibration: Path) -> int:
        import onnx
        from onnx import numpy_helper
        path.write_bytes(model.read_bytes())
        calibration.write_bytes(data.read_bytes())
        m = onnx.load(str(model))
        return sum(numpy_helper.to_array(t).size for t in m.graph.initializer
                   if t.data_type == onnx.TensorProto.FLOAT)
    return (f"{model.name} (given)", build, 64, data.suffix)


def compile_cost(repeat: int, models: list[str], given=None, options=()) -> int:
    """tpuasm compile vs onnxruntime's quantize_static on the same ~3 MB float models."""
    failed = 0
    for key in models:
        title, build, batch, *suffix = given if key == "given" else MODELS[key]
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            model, data = d / f"{key}.onnx", d / f"calibration{(suffix or ['.npy'])[0]}"
            weights = build(model, data)
            loaded = np.load(data, mmap_mode="r")
            rows = len(loaded[loaded.files[0]]) if hasattr(loaded, "files") else len(loaded)
            print(f"{title}: {weights:,} float32 weights, {model.stat().st_size / 1e6:.2f} MB "
                  f"file; calibration {rows} rows; {repeat} runs each, whole processes; "
                  f"load {open('/proc/loadavg').read().split()[0]}")
            batch_option = ["--batch", str(batch)] if key != "given" else []
            runs = {
                f"tpuasm compile {' '.join(batch_option)} (whole compile, OUTDIR)":
                    [sys.executable, "-m", "tpuasm", "compile", str(model), "-o",
                     str(d / "out"), *batch_option, "--calibrate", str(data), "-q",
                     *options],
                "onnxruntime quantize_static alone":
                    [sys.executable, "-c", ORT_QUANTIZE, str(model), str(data),
                     str(d / "q.onnx")],
                "  the same, calibration chunks of 16 rows":
                    [sys.executable, "-c", ORT_QUANTIZE, str(model), str(data),
                     str(d / "q16.onnx"), "16"],
                "import onnxruntime.quantization (floor)":
                    [sys.executable, "-c", "import onnxruntime.quantization"],
            }
            results = {}
            for label, argv in runs.items():
                got = [timed_process(argv) for _ in range(repeat)]
                secs = sorted(g[0] for g in got)
                peak = max(g[1] for g in got)
                results[label] = (secs, peak)
                bad = [g for g in got if g[2] != 0]
                note = f"   FAILED (exit {bad[0][2]}): {bad[0][3]}" if bad else ""
                failed += bool(bad)
                print(f"  {label:<52} {secs[0]:6.2f}-{secs[-1]:6.2f} s   peak {peak:6.0f} MiB"
                      f"{note}")
            report = d / "out" / "report.json"
            if report.is_file():
                checked = json.loads(report.read_text()).get("validation") or {}
                figures = [f"{o['output']} top-1 {100 * o['agreement']:.2f} %"
                           for o in checked.get("outputs", []) if o.get("agreement") is not None]
                if figures:
                    print(f"  tpuasm's check against the float model on {checked['rows']} "
                          f"calibration rows: {', '.join(figures)}")
            (ours, ours_peak), (ort, ort_peak) = list(results.values())[:2]
            met = ours[-1] < 10 and ours_peak < 500
            print(f"  tpuasm compile / quantize_static: {ours[0] / ort[0]:.1f}x the time, "
                  f"{ours_peak / ort_peak:.1f}x the peak memory (issue 20's bar, seconds and "
                  f"under 500 MB: {'met' if met else 'NOT met'})")
    return 1 if failed else 0


def _fail(mode):
    raise SystemExit(f"{mode}: the child process failed")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=3162)
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--float", action="store_true",
                   help="compile cost of a ~3 MB float model next to onnxruntime's "
                        "quantize_static (issue 20, item 7)")
    p.add_argument("--model", dest="models", action="append", choices=list(MODELS),
                   help="with --float: which model (repeatable; default all)")
    p.add_argument("--float-model", type=Path,
                   help="with --float: also this float model (e.g. Magika's 3.2 MB "
                        "model.onnx), calibrated on --calibration")
    p.add_argument("--calibration", type=Path, help="DATA.npy or DATA.npz for --float-model")
    p.add_argument("--compile-option", action="append", default=[], metavar="ARG",
                   help="with --float: an argument added to `tpuasm compile` (repeatable), "
                        "e.g. --compile-option=--calibration-method=minmax")
    args = p.parse_args()
    if args.float:
        if args.float_model and not args.calibration:
            p.error("--float-model needs --calibration")
        given = _given(args.float_model, args.calibration) if args.float_model else None
        models = list(args.models or ([] if given else list(MODELS)))
        return compile_cost(args.repeat, models + (["given"] if given else []), given,
                            args.compile_option)
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

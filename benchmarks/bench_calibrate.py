"""Calibration cost: tpuasm's streaming passes (compiler/front/calibrate.py: min-max from the
range pass, its min and max computed in the graph; percentile and entropy from one histogram
pass), next to onnxruntime's own calibrators (create_calibrator:
MinMax, Percentile with 2048 bins, Entropy with 512 bins and 128 levels, as quantize.py set
them before) on the same model, the same tensors (the inputs and outputs of the operator
types tpuasm quantizes) and the same rows, in the same run.  Each is a whole child process:
its wall time and peak resident memory (wait4's ru_maxrss).  "auto" (runtime/calibsearch.py)
needs every method when min-max falls below the bar: onnxruntime's calibrators then ran the
model once per method, and its histogram methods hold every intermediate tensor of every
row until the pass ends.

    .venv/bin/python benchmarks/bench_calibrate.py MODEL.onnx DATA.npz [--rows 128]
        [--repeat 2]

e.g. Magika's model.onnx with the calib.npz benchmarks/real_models_shipped.py writes for it.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compile import timed_process  # noqa: E402

CHILD = r"""
import sys, tempfile
import numpy as np
import onnx
who, model_path, data, rows, methods = sys.argv[1:6]
rows = int(rows)
from tpuasm.compiler.front.quantize import QuantOptions, _with_shapes, tpu_nodes
from tpuasm.compiler.front.calibrate import float_tensors
model = _with_shapes(onnx.load(model_path))
op_types = sorted({n.op_type for n in model.graph.node
                   if n.name in set(tpu_nodes(model, QuantOptions()))})
names = float_tensors(model, [n.name for n in model.graph.node if n.op_type in op_types])
loaded = np.load(data)
inputs = {k: loaded[k][:rows] for k in loaded.files}
CHUNK = 16


def feeds(step):
    for start in range(0, rows, step):
        yield {k: v[start:start + step] for k, v in inputs.items()}


if who == "tpuasm":
    from tpuasm.compiler.front.calibrate import CalibrationPass
    calibration = CalibrationPass()
    calibration.collect(model, names, feeds, most_rows=CHUNK,
                        histograms=methods != "minmax")       # min-max: the range pass
    for method in methods.split(","):
        calibration.ranges(names, method)
else:
    import contextlib, io
    from onnxruntime.quantization.calibrate import (CalibrationDataReader,
                                                    CalibrationMethod, create_calibrator)
    settings = {"minmax": (CalibrationMethod.MinMax, {}),
                "percentile": (CalibrationMethod.Percentile, {"percentile": 99.999}),
                "entropy": (CalibrationMethod.Entropy, {"num_bins": 512,
                                                        "num_quantized_bins": 128})}

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = feeds(CHUNK)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        source = f"{tmp}/model.onnx"
        onnx.save(model, source)
        for method in methods.split(","):
            kind, extra = settings[method]
            c = create_calibrator(source, op_types, augmented_model_path=f"{tmp}/a.onnx",
                                  calibrate_method=kind, extra_options=extra)
            c.collect_data(Reader())
            c.compute_data()
            del c
print(len(names))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("data", type=Path, help="DATA.npz keyed by input name")
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    load = open("/proc/loadavg").read().split()[0]
    print(f"{args.model.name}: {args.model.stat().st_size / 1e6:.2f} MB, {args.rows} rows in "
          f"chunks of 16, best of {args.repeat}, whole processes, load {load}")
    runs = [("tpuasm: the range pass, min-max", "tpuasm", "minmax"),
            ("tpuasm: one histogram pass, all three methods", "tpuasm",
             "minmax,percentile,entropy"),
            ("onnxruntime MinMax calibrator", "onnxruntime", "minmax"),
            ("onnxruntime Percentile calibrator", "onnxruntime", "percentile"),
            ("onnxruntime Entropy calibrator", "onnxruntime", "entropy"),
            ("onnxruntime all three (auto's search before)", "onnxruntime",
             "minmax,percentile,entropy")]
    failed = 0
    for label, who, methods in runs:
        got = [timed_process([sys.executable, "-c", CHILD, who, str(args.model),
                              str(args.data), str(args.rows), methods])
               for _ in range(args.repeat)]
        secs = min(g[0] for g in got)
        peak = max(g[1] for g in got)
        bad = [g for g in got if g[2] != 0]
        failed += bool(bad)
        note = f"   FAILED (exit {bad[0][2]}): {bad[0][3]}" if bad else ""
        print(f"  {label:<52} {secs:7.2f} s   peak {peak:7.0f} MiB{note}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

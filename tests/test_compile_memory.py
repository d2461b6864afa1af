"""What a compile holds in memory (issue 20, item 7): the data flows that kept a 3 MB model's
compile at 1.4 GB, checked where they are decided, and one whole process under a ceiling.

- The calibration's range pass computes each tensor's min and max inside onnxruntime's
  graph: a run returns three numbers a tensor, never the tensor (calibrate.py).
- The check against the float model runs the compiled model a batch at a time, each step's
  memory let go when its run ends (steps.one_off), and the float model's answers on the
  check rows are computed once for the calibration search and the validation.
- A compile of a model whose host part makes a (16, 4096, 257) one-hot in float (67 MB a
  batch) stays under MEMORY_CEILING_MIB: 196 MiB measured, where the flow before held the
  check's two batches at once in a free-batch session next to the batch session, each with
  its arena kept, and ran the float model 48 rows a call (404 MiB)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tpuasm.compiler.front.calibrate import CalibrationPass
from tpuasm.compiler.pipeline import compile_model
from tpuasm.compiler.runtime.steps import HostStep, TpuStep

LENGTH, CLASSES = 4096, 10
MEMORY_CEILING_MIB = 300       # 1.5 x the compile measured (196 MiB on the 2-core machine)


def _byte_counter(length: int = LENGTH) -> onnx.ModelProto:
    """int32 bytes (N, length) -> one-hot by Equal (host, float) -> a histogram of the byte
    values by ReduceSum (host) -> Gemm, Relu, Gemm (the TPU)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([-1, length, 1], np.int64), "shape"),
             numpy_helper.from_array(np.arange(257, dtype=np.int32).reshape(1, 1, 257),
                                     "values"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(rng.normal(0, 0.05, (64, 257)).astype(np.float32),
                                     "w0"),
             numpy_helper.from_array(rng.normal(0, 0.3, (CLASSES, 64)).astype(np.float32),
                                     "w1")]
    nodes = [helper.make_node("Reshape", ["bytes", "shape"], ["r"], name="reshape"),
             helper.make_node("Equal", ["r", "values"], ["eq"], name="equal"),
             helper.make_node("Cast", ["eq"], ["onehot"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["onehot", "axis1"], ["counts"], name="histogram",
                              keepdims=0),
             helper.make_node("Gemm", ["counts", "w0"], ["h"], name="dense0", transB=1),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("Gemm", ["hr", "w1"], ["logits"], name="dense1", transB=1)]
    g = helper.make_graph(nodes, "bytes", [helper.make_tensor_value_info(
        "bytes", TensorProto.INT32, ["N", length])], [helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["N", CLASSES])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _rows(count: int, length: int = LENGTH) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 257, (count, length)).astype(np.int32)


def test_the_range_pass_returns_three_numbers_a_tensor_never_the_tensor(monkeypatch):
    """A fixed batch of 16 rows of the one-hot model: every run of the min-max pass brings
    back a ReduceMin, a ReduceMax and a Size per tensor (the one-hot's float values are 67 MB
    a run), and the ranges are the tensors' own."""
    from tpuasm.compiler import ort
    model = _byte_counter()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 16
    model = onnx.shape_inference.infer_shapes(model)
    returned, real = [], ort.session

    def counting(*args, **kwargs):
        sess = real(*args, **kwargs)

        class Spy:
            def run(self, names, feed):
                out = sess.run(names, feed)
                returned.append(sum(np.asarray(v).nbytes for v in out))
                return out
        return Spy()

    monkeypatch.setattr(ort, "session", counting)
    x = _rows(32)
    names = ["onehot", "counts", "h"]
    stats = CalibrationPass()
    stats.collect(model, names, lambda rows: ({"bytes": x[i:i + 16]} for i in range(0, 32, 16)))
    assert len(returned) == 2 and max(returned) <= 3 * len(names) * 8
    assert stats._bytes["onehot"] == 16 * LENGTH * 257 * 4
    monkeypatch.undo()
    counts = np.stack([(x == v).sum(1) for v in range(257)], 1).astype(np.float32)
    lo, hi = stats.ranges(["counts"], "minmax")["counts"]
    assert (float(lo[0]), float(hi[0])) == (counts.min(), counts.max())
    assert [float(v[0]) for v in stats.ranges(["onehot"], "minmax")["onehot"]] == [0.0, 1.0]


def test_the_check_runs_a_batch_at_a_time_and_keeps_no_step_memory(tmp_path, monkeypatch):
    """The check's host parts see one batch a call (no free-batch session over its rows),
    and after the compile no segment keeps a machine nor a host part a session; the float
    model runs once for the search and the validation (its QDQ model once for the score)."""
    from tpuasm.compiler.runtime import host, validate
    path = tmp_path / "bytes.onnx"
    onnx.save(_byte_counter(256), str(path))
    seen, floats, real_run, real_float = [], [], host.HostRunner.run, validate.run_float

    def run(self, feeds):
        seen.append({len(v) for v in feeds.values()})
        return real_run(self, feeds)

    def run_float(model, *args, **kwargs):
        floats.append(model)
        return real_float(model, *args, **kwargs)

    monkeypatch.setattr(host.HostRunner, "run", run)
    monkeypatch.setattr(validate, "run_float", run_float)
    compiled = compile_model(path, batch=16, calibration=_rows(64, 256),
                             config={"array_size": 16})
    assert compiled.report.validation.rows == 64
    assert seen and all(s == {16} for s in seen)
    assert len(floats) == 2 and isinstance(floats[0], bytes)      # the float model, once
    for step in compiled.steps:
        if isinstance(step, TpuStep):
            assert step._machine is None and not step.one_off
        elif isinstance(step, HostStep):
            assert step.runner._session is None and step.runner.arena
    assert compiled.run({"bytes": _rows(3, 256)})["logits"].shape == (3, CLASSES)


LAUNCHER = r"""
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""

COMPILE = r"""
import sys
import numpy as np
from tpuasm.compiler.front.quantize import QuantOptions
from tpuasm.compiler.pipeline import compile_model
m = compile_model(sys.argv[1], batch=16, calibration=np.load(sys.argv[2]), codegen=False,
                  quantization=QuantOptions(calibration_method="minmax"))
assert m.report.validation.rows == 128 and m.report.validation.outputs
"""


def test_a_compile_with_a_large_host_part_stays_under_the_ceiling(tmp_path):
    """The whole process's peak (the kernel's ru_maxrss), measured by a small launcher
    process: a child forked from this test process would count the test's own memory,
    which the kernel keeps as the child's until its exec.  The back end is left out
    (codegen=False: the check runs reference.py's engine): what is measured is the
    calibration and the check's data flow, not the emulator's build or images."""
    path = tmp_path / "bytes.onnx"
    onnx.save(_byte_counter(), str(path))
    np.save(tmp_path / "rows.npy", _rows(128))
    done = subprocess.run([sys.executable, "-c", LAUNCHER, sys.executable, "-c", COMPILE,
                           str(path), str(tmp_path / "rows.npy")], capture_output=True,
                          text=True, timeout=600)
    peak_kib, status = (int(v) for v in done.stdout.split()[-2:])
    assert status == 0, done.stderr[-2000:]
    assert peak_kib / 1024 < MEMORY_CEILING_MIB, f"peak {peak_kib / 1024:.0f} MiB"

"""Running a compiled model: batches of float inputs through host parts (onnxruntime) and TPU
segments (the emulator running the back end's programs, or reference.py's numpy semantics).

Every value between steps is held in its ONNX layout, (batch, *onnx shape): quantized tensors
as their 8-bit integers, float tensors as float32.  A segment's inputs and outputs are reshaped
to the IR's shapes at its boundary (a Gemm over an image yields (N, 1, 1) on the TPU and (N,)
in ONNX; the bytes are the same), and a channels-last tensor (ONNX (*rows, C), IR (C, rows, 1))
is transposed there."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.host import HostRunner
from tpuasm.compiler.ir import Segment, SegmentProgram, ir_array, onnx_array
from tpuasm.errors import TpuasmError


class InferenceFault(TpuasmError):
    """The emulator faulted (or did not halt) while running a segment."""


@dataclass
class ValueInfo:
    """A model input or output: its name, per-sample shape and element type."""
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class TpuStep:
    segment: Segment
    onnx_shapes: dict[str, tuple]             # tensor -> ONNX per-sample shape
    program: SegmentProgram | None = None
    _binary: object = field(default=None, repr=False)
    _machine: object = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.segment.name

    def run(self, values: dict, batch: int, engine: str, config) -> None:
        inputs = {t.name: ir_array(t, values[t.name], batch) for t in self.segment.inputs}
        if engine == "reference":
            from tpuasm.compiler.reference import run_segment
            outputs = run_segment(self.segment, inputs)
        else:
            outputs = self._run_emulator(inputs, config, timed=engine == "pipeline")
        for t in self.segment.outputs:
            values[t.name] = onnx_array(t, outputs[t.name], batch, self.onnx_shapes[t.name])

    def binary(self):
        if self._binary is None:
            from tpuasm import assemble
            self._binary = assemble(self.program.source)
        return self._binary

    def machine(self, config):
        if self._machine is None:
            from tpuasm.machine import Machine
            shape_keys = ("array_size", "ub_rows", "acc_rows", "fifo_depth", "profile")
            overrides = {k: v for k, v in (config or {}).items() if k not in shape_keys}
            self._machine = Machine.for_program(self.binary(), **overrides)
        return self._machine

    def _run_emulator(self, inputs: dict, config, timed: bool = False) -> dict:
        """The program on the emulator: its data path alone (Machine.run_data: the program is
        proven by one timing-only run, then every batch runs without pipeline timing), or
        with `timed` the whole four-stage pipeline for every batch."""
        if self.program is None:
            raise CompileError(f"{self.name}: no TPU program (the back end did not generate "
                               f"one); run with engine='reference'")
        machine = self.machine(config)
        machine.load(self.binary(), host=self.program.host_image(inputs),
                     weights=self.program.weights)
        result = machine.run() if timed else machine.run_data()
        if result.status != "halted":
            raise InferenceFault(f"{self.name}: {result.fault or result.status}")
        return self.program.read_outputs(machine.host)


@dataclass
class HostStep:
    runner: HostRunner
    nodes: list[str]
    input_shapes: dict[str, tuple]            # tensor -> ONNX shape (batch first)

    @property
    def name(self) -> str:
        return self.runner.name

    def run(self, values: dict, batch: int, engine: str, config) -> None:
        feeds = {t: values[t].reshape(tuple(self.input_shapes[t]))
                 for t in self.runner.inputs}
        values.update(self.runner.run(feeds))


Progress = Callable[[int, int], None]


def run_model(steps: list, batch: int, inputs: list[ValueInfo], outputs: list[ValueInfo],
              data: dict[str, np.ndarray], engine: str = "emulator", config=None,
              progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Run `data` (float32 in the model's layout, any number of rows) in batches of `batch`;
    the last batch is padded with zeros and its padding dropped."""
    rows = check_inputs(inputs, data)
    results = {o.name: [] for o in outputs}
    done = 0
    if progress:
        progress(0, rows)
    while done < rows:
        take = min(batch, rows - done)
        values = {}
        for info in inputs:
            chunk = np.zeros((batch,) + info.shape, np.dtype(info.dtype))
            chunk[:take] = data[info.name][done:done + take]
            values[info.name] = chunk
        for step in steps:
            step.run(values, batch, engine, config)
        for o in outputs:
            results[o.name].append(np.asarray(values[o.name])[:take])
        done += take
        if progress:
            progress(done, rows)
    return {name: (np.concatenate(parts) if parts else
                   np.zeros((0,) + next(o.shape for o in outputs if o.name == name)))
            for name, parts in results.items()}


def check_inputs(inputs: list[ValueInfo], data: dict[str, np.ndarray]) -> int:
    """The number of rows; a clear error for a missing input or a wrong shape."""
    missing = [i.name for i in inputs if i.name not in data]
    if missing:
        raise CompileError(f"missing input(s) {', '.join(missing)} (the model's inputs: "
                           f"{', '.join(i.name for i in inputs)})")
    extra = sorted(set(data) - {i.name for i in inputs})
    if extra:
        raise CompileError(f"unknown input(s) {', '.join(extra)} (the model's inputs: "
                           f"{', '.join(i.name for i in inputs)})")
    rows = None
    for info in inputs:
        x = np.asarray(data[info.name])
        if x.shape[1:] != tuple(info.shape):
            if x.shape == tuple(info.shape):
                raise CompileError(f"input '{info.name}' has shape {x.shape}: expected "
                                   f"(rows, {', '.join(map(str, info.shape))}); add the rows "
                                   f"dimension")
            raise CompileError(f"input '{info.name}' has shape {x.shape}: expected "
                               f"(rows, {', '.join(map(str, info.shape))})")
        if x.dtype.kind not in "fiub":
            raise CompileError(f"input '{info.name}' has dtype {x.dtype}: expected numbers")
        if rows is not None and len(x) != rows:
            raise CompileError(f"inputs have different numbers of rows ({rows} and {len(x)})")
        rows = len(x)
    return rows or 0

"""Running a compiled model: batches of float inputs through host parts (onnxruntime) and TPU
segments (the emulator running the back end's programs, or reference.py's numpy semantics).

Every value between steps is held in its ONNX layout, (batch, *onnx shape): quantized tensors
as their 8-bit integers, float tensors as float32.  A segment's inputs and outputs are reshaped
to the IR's shapes at its boundary (a Gemm over an image yields (N, 1, 1) on the TPU and (N,)
in ONNX; the bytes are the same), and a channels-last tensor (ONNX (*rows, C), IR (C, rows, 1))
is transposed there."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.runtime.host import HostRunner
from tpuasm.compiler.ir import Segment, SegmentProgram, ir_array, onnx_array
from tpuasm.errors import TpuasmError


class InferenceFault(TpuasmError):
    """The emulator faulted (or did not halt) while running a segment."""


@dataclass
class ValueInfo:
    """A model input or output: its name, per-sample shape (the shape without the batch
    axis; the whole shape when it has none), element type (numpy's name; an ONNX type such
    as `seq(map(int64,tensor(float)))` for a non-tensor output) and batch axis (None: the
    same for every batch, given once and passed whole)."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    batch_axis: int | None = 0

    def full_shape(self, batch: int) -> tuple[int, ...]:
        """The shape of one batch of `batch` rows."""
        if self.batch_axis is None:
            return tuple(self.shape)
        shape = list(self.shape)
        shape.insert(self.batch_axis, batch)
        return tuple(shape)

    @property
    def is_tensor(self) -> bool:
        try:
            np.dtype(self.dtype)
        except (TypeError, ValueError):   # (numpy reads "seq(map(...))" as a bad format)
            return False
        return True


@dataclass
class TpuStep:
    segment: Segment
    onnx_shapes: dict[str, tuple]             # tensor -> ONNX per-sample shape
    program: SegmentProgram | None = None
    _binary: object = field(default=None, repr=False)
    _machine: object = field(default=None, repr=False)
    _worth: tuple | None = field(default=None, repr=False)   # (program table, lanes pay)
    one_off: bool = field(default=False, repr=False)     # release after each run (one_off)

    def release(self) -> None:
        """Let the machine (and the memories it holds) go; the next run makes another."""
        if self._machine is not None:
            from tpuasm.machine import dataonly
            dataonly.forget()          # its arguments, which the data path keeps
        self._machine = self._worth = None

    @property
    def name(self) -> str:
        return self.segment.name

    def run(self, values: dict, batch: int, engine: str, config, batches: int = 1) -> None:
        """The segment on `batches` batches held in `values` (batch after batch along each
        tensor's first axis): on the emulator all of them in one Machine.run_batches call,
        with the other engines (which run one batch at a time) batches must be 1.  The
        program's rows are the batch's, or the segment's own (Segment.rows: its tensors'
        leading dimension is not the batch; group_size then keeps batches at 1)."""
        rows = batches * self.segment.program_rows(batch)
        inputs = {t.name: ir_array(t, values[t.name], rows) for t in self.segment.inputs}
        if engine == "reference":
            from tpuasm.compiler.reference import run_segment
            outputs = run_segment(self.segment, inputs)
        elif engine == "pipeline":
            outputs = self._run_emulator(inputs, config, timed=True)
        else:
            outputs = self._run_batches(inputs, batches, config)
        if self.one_off:
            self.release()
        for t in self.segment.outputs:
            values[t.name] = onnx_array(t, outputs[t.name], rows, self.onnx_shapes[t.name])

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

    def _checked_program(self):
        if self.program is None:
            raise CompileError(f"{self.name}: no TPU program (the back end did not generate "
                               f"one); run with engine='reference'")
        return self.program

    def _run_emulator(self, inputs: dict, config, timed: bool = False) -> dict:
        """One batch on the emulator: the whole four-stage pipeline with `timed`, else its
        data path alone (Machine.run_data: the program proven by one timing-only run)."""
        program = self._checked_program()
        machine = self.machine(config)
        machine.load(self.binary(), host=program.host_image(inputs), weights=program.weights)
        result = machine.run() if timed else machine.run_data()
        if result.status != "halted":
            raise InferenceFault(f"{self.name}: {result.fault or result.status}")
        return program.read_outputs(machine.host)

    def _lanes_worth(self, machine) -> bool:
        """lanes.worth_it for the machine's program, found once per loaded program."""
        if self._worth is None or self._worth[0] is not machine.prog:
            from tpuasm.machine.lanes import worth_it
            self._worth = (machine.prog, worth_it(machine.prog, self.program.array_size))
        return self._worth[1]

    def _run_batches(self, inputs: dict, batches: int, config) -> dict:
        """`batches` batches through the data path in one call: their host images packed
        together, the machine loaded once per program (Machine.run_batches starts each
        batch from the loaded state; as lanes when lanes.worth_it), the outputs read from
        all images at once."""
        program = self._checked_program()
        machine = self.machine(config)
        hosts = program.host_images(inputs, batches)
        binary = self.binary()
        if machine.program is not binary or machine.host.shape != hosts.shape[1:]:
            # run_batches never reads the machine's own host memory, only its shape: the
            # first image itself, not a copy (Magika's first segment: 98 MB a batch)
            machine.load(binary, host=hosts[0], weights=program.weights, copy_host=False)
        # the batches as lanes (each instruction once for all) where the program's
        # MatrixMultiplies are big enough to gain from it (machine/lanes.py)
        lanes = batches if self._lanes_worth(machine) else 1
        result = machine.run_batches(hosts, lanes=lanes)
        if result.status != "halted":
            raise InferenceFault(f"{self.name}: {result.fault or result.status}")
        return program.read_batches(hosts)


@dataclass
class HostStep:
    runner: HostRunner
    nodes: list[str]
    input_shapes: dict[str, tuple]            # tensor -> ONNX shape (batch fixed)

    @property
    def name(self) -> str:
        return self.runner.name

    @property
    def one_off(self) -> bool:
        return not self.runner.arena

    @one_off.setter
    def one_off(self, value: bool) -> None:
        self.runner.arena = not value        # one_off: runs free their memory as they end

    def release(self) -> None:
        self.runner.release()

    def run(self, values: dict, batch: int, engine: str, config, batches: int = 1) -> None:
        """The host part on `batches` batches held in `values` (batch after batch along
        each tensor's first axis): in one onnxruntime call when the part's rows are
        independent (HostRunner.run_rows), else batch by batch."""
        if batches == 1:
            feeds = {t: _as_shape(values[t], self.input_shapes.get(t))
                     for t in self.runner.inputs}
            values.update(self.runner.run(feeds))
            return
        feeds = {t: _as_shape(values[t], _rows_shape(self.input_shapes.get(t), batches))
                 for t in self.runner.inputs}
        values.update(self.runner.run_rows(feeds, batches, batch))

    def batch_major(self, batch: int) -> bool:
        """Every input and output of the part has the batch as its first axis (so batches
        can be stacked along it)."""
        return all(shape is None or (len(shape) > 0 and shape[0] == batch)
                   for shape in self.input_shapes.values()) and self.runner.batch_major(batch)


@contextmanager
def one_off(steps):
    """Steps run once or twice, as a compile's check against the float model runs them:
    each TPU segment's machine let go after its run, the host parts' onnxruntime sessions
    without their memory arena (ort.session), and every session and machine released at
    the end.  The memory is then one step's working set, not the sum of every step's kept
    for the process's life (Magika's check: 0.6 GB kept by its segments' machines and its
    host parts' arenas); a machine costs milliseconds to make and prove, an arena pays for
    itself only over many runs."""
    steps = list(steps)
    for step in steps:
        step.release()
        step.one_off = True
    try:
        yield
    finally:
        for step in steps:
            step.one_off = False
            step.release()


def _rows_shape(shape, batches: int):
    """A fixed-batch ONNX shape for `batches` batches stacked along the first axis."""
    if shape is None:
        return None
    return (shape[0] * batches, *shape[1:])


def _as_shape(value, shape):
    """A value in its ONNX shape (a TPU output arrives in the IR's); as it is when the shape
    is unknown (computed at run time) or the value is not a tensor (a sequence)."""
    if shape is None or not isinstance(value, np.ndarray):
        return value
    return value.reshape(tuple(shape))


Progress = Callable[[int, int], None]


def run_model(steps: list, batch: int, inputs: list[ValueInfo], outputs: list[ValueInfo],
              data: dict[str, np.ndarray], engine: str = "emulator", config=None,
              progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Run `data` (in the model's layout and element types, any number of rows along each
    input's batch axis) in batches of `batch`: each input is cut along its batch axis (the
    last batch padded with zeros), inputs without one are passed whole to every batch, and
    the outputs are joined along theirs (padding dropped; an output without a batch axis is
    the first batch's).  A model with no batch axis at all runs once.

    On the emulator, a model whose every input, output and host part is batch-major runs
    several batches per step call (group_size): each segment's batches in one
    Machine.run_batches call, each host part in one onnxruntime call where it can."""
    data, rows = prepare_inputs(inputs, data)
    batched = any(i.batch_axis is not None for i in inputs)
    total = rows if batched else 1
    group = group_size(steps, batch, inputs, outputs, rows, engine) if batched else 1
    results = {o.name: [] for o in outputs}
    outputs = list(outputs)            # each one's batch axis as its values show it
    done = 0
    if progress:
        progress(0, total)
    while done < total:
        take = min(group * batch, rows - done) if batched else 1
        batches = -(-take // batch) if batched else 1
        values = batch_values(inputs, data, done, take, batches * batch)
        for step in steps:
            step.run(values, batch, engine, config, batches)
        for k, o in enumerate(outputs):
            value = values[o.name]
            if batched and isinstance(value, np.ndarray):
                o = outputs[k] = replace(o, batch_axis=batch_axis_of(value, o.batch_axis,
                                                                     batches * batch))
            whole = o.batch_axis is None or not batched or (
                isinstance(value, np.ndarray) and value.ndim <= o.batch_axis)
            if whole:
                if not results[o.name]:
                    results[o.name].append(value)
            elif isinstance(value, list):                # a sequence (of maps): row by row
                results[o.name].append(value[:take])
            elif o.batch_axis == 0:
                results[o.name].append(np.asarray(value)[:take])
            else:
                results[o.name].append(np.take(np.asarray(value), np.arange(take),
                                               axis=o.batch_axis))
        done += take
        if progress:
            progress(done, total)
    return {o.name: join_parts(o, results[o.name]) for o in outputs}


# The host images of one group of batches (the bytes packed per call) stay below this, and
# a group holds at most GROUP_BATCHES batches (progress is reported once per group; a
# group's fixed costs, a few hundred microseconds, are small against 16 batches).
GROUP_BYTES = 64 << 20
GROUP_BATCHES = 16


def group_size(steps: list, batch: int, inputs: list[ValueInfo], outputs: list[ValueInfo],
               rows: int, engine: str) -> int:
    """Batches per step call: 1 unless the engine is the emulator's data path and every
    value is batch-major (inputs and outputs tensors with batch axis 0, host parts with the
    batch first); then as many as the rows need, up to GROUP_BATCHES, the host images of a
    group under GROUP_BYTES."""
    if engine != "emulator" or rows <= batch:
        return 1
    if not all(v.is_tensor and v.batch_axis == 0 for v in (*inputs, *outputs)):
        return 1
    image = 0
    for step in steps:
        if isinstance(step, HostStep):
            if not step.batch_major(batch):
                return 1
        elif step.segment.rows is not None:     # rows of its own: batches do not stack
            return 1
        elif step.program is not None:
            image += step.program.host_rows * step.program.array_size
    return max(1, min(-(-rows // batch), GROUP_BATCHES, GROUP_BYTES // max(image, 1)))


def batch_values(inputs: list[ValueInfo], data: dict, start: int, take: int, batch: int
                 ) -> dict:
    """One batch of checked data (prepare_inputs): `take` rows from `start` along each
    input's batch axis, padded with zeros to `batch`; inputs without one whole."""
    return {info.name: _batch_of(info, data[info.name], start, take, batch)
            for info in inputs}


def _batch_of(info: ValueInfo, x: np.ndarray, start: int, take: int, batch: int):
    if info.batch_axis is None:
        return x
    chunk = np.zeros(info.full_shape(batch), x.dtype)
    index = [slice(None)] * chunk.ndim
    index[info.batch_axis] = slice(0, take)
    source = [slice(None)] * x.ndim
    source[info.batch_axis] = slice(start, start + take)
    chunk[tuple(index)] = x[tuple(source)]
    return chunk


def batch_axis_of(value: np.ndarray, axis: int | None, rows: int) -> int | None:
    """The axis of `value` (one run's output over `rows` padded rows) that holds the rows:
    `axis` when its size says so, else the first axis of that size.  An output whose shape
    inference lost (a contrib operator before it) was given axis 0, the convention, but a
    time-first (T, 1, classes) output of a batch of 1 holds it on axis 1."""
    if axis is None or (value.ndim > axis and value.shape[axis] == rows):
        return axis
    return next((a for a in range(value.ndim) if value.shape[a] == rows), axis)


def join_parts(o: ValueInfo, parts: list):
    """An output's parts (one per batch or chunk, in order) joined along its batch axis: a
    sequence output's lists chained, an output without a batch axis the first part."""
    if not parts:
        if not o.is_tensor:
            return []
        return np.zeros(o.full_shape(0), np.dtype(o.dtype))
    if o.batch_axis is None or len(parts) == 1 or (
            isinstance(parts[0], np.ndarray) and parts[0].ndim <= o.batch_axis):
        return parts[0]
    if isinstance(parts[0], list):
        return [item for part in parts for item in part]
    return np.concatenate(parts, axis=o.batch_axis)


def prepare_inputs(inputs: list[ValueInfo], data: dict) -> tuple[dict, int]:
    """The data checked (samples.check_data) in the inputs' element types, and its rows."""
    from tpuasm.compiler.front.samples import check_data
    return check_data(inputs, data)


def check_inputs(inputs: list[ValueInfo], data: dict[str, np.ndarray]) -> int:
    """The number of rows; a clear error for a missing input or a wrong shape or type."""
    return prepare_inputs(inputs, data)[1]

"""The compiler's pipeline and its result.

    read (reader.py) -> batch axes (batch.py) -> [float model: fix the batch and fold
    constants (fold.py), quantize (quantize.py) from checked samples (samples.py)]
    -> fix batch, fold constants, infer shapes (reader.py, ortshapes.py)
    -> lower QDQ / QOperator patterns to IR operators (lower.py)
    -> partition into TPU segments and host parts (partition.py)
    -> back end: each segment -> SegmentProgram (tpuasm.compiler.codegen)
    -> CompiledModel: run (runtime.py), report (report.py), save (outdir.py)
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.graph import Graph
from tpuasm.compiler.host import HostRunner, lookup_table, submodel
from tpuasm.compiler.batch import (has_fixed_batch, input_axes, parse_batch_axes,
                                   tensor_axes)
from tpuasm.compiler.fold import fold_float_model
from tpuasm.compiler.values import model_values
from tpuasm.compiler.provenance import Provenance
from tpuasm.compiler.reader import (fix_batch, input_signature, is_quantized, load_graph,
                                    read_model)
from tpuasm.compiler.ir import Segment
from tpuasm.compiler.lower import GLUE, Lowered, lower
from tpuasm.compiler.partition import HostPart, plan
from tpuasm.compiler.report import CompileReport, NodeRow, describe
from tpuasm.compiler.runtime import HostStep, TpuStep, ValueInfo, run_model



class CompiledModel:
    """A model compiled for the TPU: `run(inputs)`, `report`, `save(outdir)`."""

    def __init__(self, steps, batch, inputs, outputs, report, config, reference_model,
                 keep=None):
        self.steps = steps
        self.batch = batch
        self.inputs: list[ValueInfo] = inputs
        self.outputs: list[ValueInfo] = outputs
        self.report: CompileReport = report
        self.config: dict = dict(config or {})
        self.reference_model = Path(reference_model)   # the QDQ model (onnxruntime's oracle)
        self._keep = keep                               # a temporary directory to keep alive
        self.provenance = None                          # input-model nodes (provenance.py)

    @property
    def segments(self):
        return [s.segment for s in self.steps if isinstance(s, TpuStep)]

    @property
    def has_programs(self) -> bool:
        return all(s.program is not None for s in self.steps if isinstance(s, TpuStep))

    def run(self, inputs, progress=None, engine: str | None = None) -> dict[str, np.ndarray]:
        """Inputs in the model's layout and element types (an array for a one-input model,
        else {name: array}), any number of rows along each input's batch axis -> {output
        name: array (a list for a sequence output)}.  `engine`: "emulator" (default when
        the back end made programs) or "reference" (reference.py's numpy semantics)."""
        if not isinstance(inputs, dict):
            if len(self.inputs) != 1:
                raise CompileError(f"the model has {len(self.inputs)} inputs: pass a dict "
                                   f"keyed by name ({', '.join(i.name for i in self.inputs)})")
            inputs = {self.inputs[0].name: inputs}
        if engine is None:
            engine = "emulator" if self.has_programs else "reference"
        if engine not in ("emulator", "reference"):
            raise ValueError(f"engine must be 'emulator' or 'reference', not {engine!r}")
        machine = {k: v for k, v in self.config.items()}
        return run_model(self.steps, self.batch, self.inputs, self.outputs, inputs, engine,
                         machine, progress)

    def save(self, outdir) -> Path:
        from tpuasm.compiler.outdir import save
        return save(self, outdir)


def parse_config(items) -> dict:
    """`--config key=value` strings (or a dict) -> machine overrides with typed values."""
    if items is None:
        return {}
    if isinstance(items, dict):
        return dict(items)
    config = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CompileError(f"--config {item!r}: expected KEY=VALUE")
        key = key.strip().replace("-", "_")
        value = value.strip()
        for cast in (int, float):
            try:
                value = cast(value)
                break
            except ValueError:
                continue
        config[key] = value
    return config


def _machine_config(config: dict):
    from tpuasm.machine import MachineConfig
    try:
        return MachineConfig(**config)
    except TypeError as e:
        raise CompileError(f"--config: {e}") from None
    except ValueError as e:
        raise CompileError(f"--config: {e}") from None


def compile_model(path, batch: int | None = None, calibration=None, config=None,
                  codegen: bool = True, batch_axes=None) -> CompiledModel:
    """Compile an ONNX model (float with a calibration set, or already quantized).
    `batch_axes`: {input: axis or None} (or `NAME=AXIS|none` strings) where the inferred
    batch axes (batch.py) are not the right ones."""
    path = Path(path)
    config = parse_config(config)
    machine = _machine_config(config)
    if batch is not None and (not isinstance(batch, (int, np.integer)) or batch <= 0):
        raise CompileError(f"batch must be a positive integer, not {batch!r}")
    model = read_model(path)
    provenance = Provenance.of(model)
    given = parse_batch_axes(batch_axes)
    axes = input_axes(model, given, path)
    fixed_batch = has_fixed_batch(model, given)
    keep = known_axes = None
    if is_quantized(model):
        if calibration is not None:
            raise CompileError(f"{path} is already quantized: --calibrate applies to float "
                               f"models only")
        source = "quantized model, taken with its own scales and zero points"
        reference = path
    else:
        if calibration is None:
            raise CompileError(f"{path} is a float model: pass --calibrate DATA.npy|.npz "
                               f"(calibration inputs in the model's layout) to quantize it "
                               f"to int8")
        fix_batch(model, batch, path, apply=False, axes=axes)   # fail before quantizing
        from tpuasm.compiler.quantize import quantize
        from tpuasm.compiler.samples import (check_samples, input_types, read_calibration,
                                             sample_rows)
        if isinstance(calibration, (str, Path)):
            samples = read_calibration(calibration, model, path, axes)
        else:
            signature = input_signature(model)
            data = calibration if isinstance(calibration, dict) else \
                {next(iter(signature)): calibration}
            samples = check_samples(data, signature, "calibration", input_types(model), axes)
        count = sample_rows(samples, axes)
        keep = tempfile.TemporaryDirectory(prefix="tpuasm-qdq-")
        # shapes made static before quantizing (fold.py): the quantizer then sees them too
        float_path, float_model = fold_float_model(path, model, batch, axes, provenance,
                                                   Path(keep.name))
        if float_model is not model:          # the batch is in its constants now
            known_axes = tensor_axes(model, axes, path)
        reference = Path(keep.name) / (path.stem + ".qdq.onnx")
        quantize(float_path, samples, input_signature(float_model), reference,
                 batch_axes=axes)
        source = (f"float model quantized by onnxruntime (QDQ, int8 weights per output "
                  f"channel, uint8 activations per tensor) from {count} calibration samples")
        model = read_model(reference)
    graph, batch = load_graph(reference, batch, model, axes, provenance, known_axes,
                              fixed_batch)
    lowered, the_plan, steps = _lower_and_generate(graph, batch, machine, path, codegen)
    report = _report(path, graph, lowered, the_plan, steps, batch, machine.array_size, source)
    inputs, outputs = model_values(graph)
    compiled = CompiledModel(steps, batch, inputs, outputs, report, config, reference, keep)
    compiled.provenance = provenance
    return compiled


def _runtime_steps(graph: Graph, the_plan) -> list:
    steps = []
    for step in the_plan.steps:
        if isinstance(step, HostPart):
            model = submodel(graph, step.nodes, step.inputs, step.outputs, step.name)
            runner = HostRunner(model.SerializeToString(), step.inputs, step.outputs, step.name)
            shapes = {t: graph.shapes.get(t) for t in step.inputs}   # None: at run time
            steps.append(HostStep(runner, [n.name for n in step.nodes], shapes))
        else:
            tensors = [*step.inputs, *step.outputs]
            steps.append(TpuStep(step, {t.name: graph.sample_shape(t.name) or t.shape
                                        for t in tensors}))
    return steps


def _codegen():
    """The back end's module, or None while it is not there."""
    try:
        from tpuasm.compiler import codegen
    except ImportError:
        return None
    return codegen if hasattr(codegen, "generate") else None


def _lower_and_generate(graph: Graph, batch, machine, path, codegen: bool):
    """Lower, partition and generate the programs.  A segment the back end fails on (an
    exception other than its CodegenError: a case it mishandles) is not a traceback: its
    operators go back to the host, with the failure as their reason, and the model is
    lowered again without them."""
    refused: dict[str, str] = {}

    def supported(op):
        return refused.get(op.name) or backend_support(op)

    while True:
        lowered = lower(graph, lookup_table, supported)
        the_plan = plan(graph, lowered)
        steps = _runtime_steps(graph, the_plan)
        if not codegen:
            return lowered, the_plan, steps
        failed = _generate_programs(steps, batch, machine, path, fall_back=True)
        if not failed:
            return lowered, the_plan, steps
        refused.update(failed)


def _generate_programs(steps, batch, machine, path="the model", fall_back: bool = False
                       ) -> dict[str, str]:
    """The back end, when it is there: one SegmentProgram per segment.  With `fall_back`,
    an unexpected failure on a segment is returned ({operator: why}) instead of raised."""
    codegen = _codegen()
    if codegen is None:
        return {}
    _check_weight_memory(steps, machine.array_size, path, codegen)
    failed = {}

    def generate(segment):
        return codegen.generate(segment, batch, array_size=machine.array_size,
                                ub_rows=machine.ub_rows, acc_rows=machine.acc_rows,
                                fifo_depth=machine.fifo_depth)

    for step in steps:
        if isinstance(step, TpuStep):
            try:
                step.program = generate(step.segment)
            except getattr(codegen, "CodegenError", ()) as e:
                raise CompileError(f"{step.name}: {e}") from None
            except Exception as e:    # a case the back end mishandles
                why = f"code generation failed ({type(e).__name__}: {_first_line(e)})"
                if not fall_back:
                    raise CompileError(f"{path}: {step.name}: {why}") from None
                failed.update(_culprits(step.segment, generate, why))
    return failed


def _culprits(segment: Segment, generate, why: str) -> dict[str, str]:
    """The operators of a failing segment that fail alone ({name: why}); all of them when
    none does (the failure needs their company)."""
    found = {}
    for op in segment.operators:
        try:
            generate(Segment(f"{segment.name}_{op.name}", [op], [op.input], [op.output]))
        except Exception as e:
            found[op.name] = f"code generation failed ({type(e).__name__}: {_first_line(e)})"
    return found or {op.name: why for op in segment.operators}


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _check_weight_memory(steps, n: int, path, codegen) -> None:
    """Every segment's tiles together must fit the Weight Memory: checked from the shapes,
    before a weight is read or an image allocated; the error names the node that crosses."""
    tile_bytes = n * n
    limit = codegen.WEIGHT_MEMORY_BYTES // tile_bytes
    used = 0
    for step in steps:
        if not isinstance(step, TpuStep):
            continue
        for op in codegen.pack_segment(step.segment, n)[0].operators:
            used += codegen.weight_tiles(op, n)
            if used > limit:
                raise CompileError(
                    f"{path}: node {op.name}: the model's weights do not fit the Weight "
                    f"Memory: {used:,} tiles of {n} x {n} ({used * tile_bytes / 2**30:,.1f} "
                    f"GiB) by this node, the TPU's {codegen.WEIGHT_MEMORY_BYTES >> 30} GiB "
                    f"hold {limit:,}")


def backend_support(op) -> str | None:
    """None when the back end maps the operator, else its reason (shown in the report)."""
    codegen = _codegen()
    supports = getattr(codegen, "supports", None) if codegen else None
    return supports(op) if supports else None


def _report(path, graph, lowered: Lowered, the_plan, steps, batch, array_size, source):
    where_op = {}
    for step in steps:
        if isinstance(step, TpuStep):
            for op in step.segment.operators:
                where_op[op.name] = (step.name, op)
    where_host = {}
    for step in steps:
        if isinstance(step, HostStep):
            for name in step.nodes:
                where_host[name] = step.name
    rows = []
    for node in graph.nodes:
        if node.name in where_host:
            reason = lowered.host_reasons.get(node.name)
            if reason is None:
                reason = _glue_reason(node) if node.op_type in GLUE else "needed by the host"
            rows.append(NodeRow(node.name, node.op_type, "host", where_host[node.name], reason))
        elif node.name in lowered.fused:
            op_name = lowered.fused[node.name]
            seg, op = where_op[op_name]
            note = describe(op) if op_name == node.name else f"fused into {op_name}"
            rows.append(NodeRow(node.name, node.op_type, "TPU", seg, note))
        else:
            rows.append(NodeRow(node.name, node.op_type, "unused", "-",
                                "its result is not needed"))
    step_rows = []
    for step in steps:
        if isinstance(step, TpuStep):
            step_rows.append({"name": step.name, "kind": "tpu",
                              "items": [op.name for op in step.segment.operators]})
        else:
            step_rows.append({"name": step.name, "kind": "host", "items": list(step.nodes)})
    return CompileReport(str(path), batch, array_size, source, rows, step_rows)


def _glue_reason(node) -> str:
    if node.op_type == "QuantizeLinear":
        return "quantizes a host value"
    if node.op_type == "DequantizeLinear":
        return "dequantizes a value for the host"
    if node.op_type == "Constant":
        return "a constant the host needs"
    return "layout change of a host value"

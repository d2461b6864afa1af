"""The compiler's pipeline and its result.

    read (load.py) -> [quantize a float model (quantize.py)] -> fix batch, infer shapes
    -> match QDQ / QOperator patterns into IR operators (match.py)
    -> partition into TPU segments and host parts (partition.py)
    -> back end: each segment -> SegmentProgram (tpuasm.compiler.codegen)
    -> CompiledModel (model.py): run (runtime.py), report (report.py), save (outdir.py)
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from tpuasm.compiler.backend import backend_support, generate_programs, machine_config
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.graph import Graph
from tpuasm.compiler.host import HostRunner, lookup_table, submodel
from tpuasm.compiler.match import GLUE, Lowered, lower
from tpuasm.compiler.model import CompiledModel
from tpuasm.compiler.partition import HostPart, plan
from tpuasm.compiler.reader import (fix_batch, input_signature, is_quantized, load_graph,
                                    read_model)
from tpuasm.compiler.report import CompileReport, NodeRow, describe
from tpuasm.compiler.runtime import HostStep, TpuStep, ValueInfo
from tpuasm.errors import TpuasmError



def parse_config(items) -> dict:
    """`--config key=value[,key=value]` strings (or a dict) -> machine overrides with typed
    values, by the same parser as `tpuasm run` (tpuasm.settings)."""
    if items is None:
        return {}
    if isinstance(items, dict):
        return dict(items)
    from tpuasm.settings import parse_settings
    try:
        return parse_settings(list(items))
    except TpuasmError as e:
        raise CompileError(str(e)) from None


def compile_model(path, batch: int | None = None, calibration=None, config=None,
                  codegen: bool = True) -> CompiledModel:
    """Compile an ONNX model (float with a calibration set, or already quantized)."""
    path = Path(path)
    config = parse_config(config)
    machine = machine_config(config)
    if batch is not None and (not isinstance(batch, (int, np.integer)) or batch <= 0):
        raise CompileError(f"batch must be a positive integer, not {batch!r}")
    model = read_model(path)
    keep = None
    if is_quantized(model):
        if calibration is not None:
            raise CompileError(f"{path} is already quantized: --calibrate applies to float "
                               f"models only")
        source = "quantized model, taken with its own scales and zero points"
        reference = path
    else:
        if calibration is None:
            raise CompileError(f"{path} is a float model: pass --calibrate DATA.npy|.npz "
                               f"(calibration inputs, rows first) to quantize it to int8")
        fix_batch(model, batch, path, apply=False)    # dynamic shapes: fail before quantizing
        from tpuasm.compiler.quantize import check_samples, quantize, read_calibration
        signature = input_signature(model)
        if isinstance(calibration, (str, Path)):
            samples = read_calibration(calibration, model, path)
            count = len(next(iter(samples.values())))
        else:
            data = calibration if isinstance(calibration, dict) else \
                {next(iter(signature)): calibration}
            samples = check_samples(data, signature, "calibration")
            count = len(next(iter(samples.values())))
        keep = tempfile.TemporaryDirectory(prefix="tpuasm-qdq-")
        reference = Path(keep.name) / (path.stem + ".qdq.onnx")
        quantize(path, samples, signature, reference)
        source = (f"float model quantized by onnxruntime (QDQ, int8 weights per output "
                  f"channel, uint8 activations per tensor) from {count} calibration samples")
        model = read_model(reference)
    graph, batch = load_graph(reference, batch, model)
    lowered = lower(graph, lookup_table, backend_support)
    the_plan = plan(graph, lowered)
    steps = _runtime_steps(graph, the_plan)
    if codegen:
        generate_programs(steps, batch, machine, path)
    report = _report(path, graph, lowered, the_plan, steps, batch, machine.array_size, source)
    inputs = [ValueInfo(n, graph.sample_shape(n), str(graph.dtypes[n])) for n in graph.inputs]
    outputs = [ValueInfo(n, graph.sample_shape(n) or (), str(graph.dtypes.get(n, "float32")))
               for n in graph.outputs]
    return CompiledModel(steps, batch, inputs, outputs, report, config, reference, keep)


def _runtime_steps(graph: Graph, the_plan) -> list:
    steps = []
    for step in the_plan.steps:
        if isinstance(step, HostPart):
            model = submodel(graph, step.nodes, step.inputs, step.outputs, step.name)
            runner = HostRunner(model.SerializeToString(), step.inputs, step.outputs, step.name)
            shapes = {t: graph.shapes[t] for t in step.inputs}
            steps.append(HostStep(runner, [n.name for n in step.nodes], shapes))
        else:
            tensors = [*step.inputs, *step.outputs]
            steps.append(TpuStep(step, {t.name: graph.sample_shape(t.name) or t.shape
                                        for t in tensors}))
    return steps


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

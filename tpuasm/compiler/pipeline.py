"""The compiler's pipeline and its result.

    read (reader.py) -> batch axes (batch.py) -> [a float model: samples checked
    (samples.py), the batch fixed and constants folded (fold.py), rewritten (prepare.py),
    the TPU's nodes quantized (quantize.py)] -> fix batch, fold constants, infer shapes
    (reader.py, ortshapes.py)
    -> match QDQ / QOperator patterns into IR operators (match.py)
    -> partition into TPU segments and host parts (partition.py)
    -> back end: each segment -> SegmentProgram (tpuasm.compiler.codegen)
    -> CompiledModel (model.py): run (runtime.py), report (report.py), save (outdir.py)
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from tpuasm.compiler.codegen.backend import (backend_support, generate_programs, machine_config,
                                             room)
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.graph import Graph
from tpuasm.compiler.front.hostparts import lookup_table, submodel
from tpuasm.compiler.runtime.host import HostRunner
from tpuasm.compiler.front.batch import (batch_fixed_at_one, fix_free_dims, fix_input_shapes,
                                         has_fixed_batch, input_axes, parse_batch_axes,
                                         parse_input_shapes, recurrent_time, tensor_axes)
from tpuasm.compiler.front.fold import fold_float_model
from tpuasm.compiler.front.macs import MATRIX_OPS, node_macs
from tpuasm.compiler.front.match import GLUE, Lowered, lower
from tpuasm.compiler.runtime.model import CompiledModel
from tpuasm.compiler.runtime.probes import score_probes, with_probes, without_probes
from tpuasm.compiler.front.qdqrecurrent import (quantize_float_recurrent,
                                                quantize_float_matrices)
from tpuasm.compiler.front.partition import HostPart, lone_elementwise, plan
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.front.reader import (QUANTIZED_OPS, fix_batch, input_signature,
                                          is_quantized, load_graph, read_model)
from tpuasm.compiler.report import (CompileReport, NodeRow, SegmentRow, describe, input_rows,
                                    mac_warnings)
from tpuasm.compiler.runtime.steps import HostStep, TpuStep
from tpuasm.compiler.front.values import model_values
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


def compile_model(path, *args, **kwargs) -> CompiledModel:
    """Compile an ONNX model (float with a calibration set, or already quantized).
    `batch_axes`: {input: axis or None} (or `NAME=AXIS|none` strings) where the inferred
    batch axes (batch.py) are not the right ones.  `time_segments=False` leaves the report's
    per-segment cycles out (assembling and timing each segment is most of a big program's
    compile; the apps time their joined program instead).  `quantization`: a quantize.QuantOptions
    for a float model; `validate`: None (check the compiled model against the float one on
    the calibration data), False (no check), or data (array, {input: array}, .npy/.npz path)
    to check it on.  `input_values`: {input: value} (or `NAME=V[,V...]` strings): inputs
    made constants of the model (inputvalues.py), so Ifs on them fold away.  `class_axes`:
    {output: axis or None} (or `NAME=AXIS|none` strings): the axis of an output's classes
    for the check against the float model, where classaxis.py's rule is not the right one.
    `input_shapes`: {input: dims} (or `NAME=D0,D1,...` strings; a name such as N keeps a
    dimension dynamic): the sizes of an input's dynamic dimensions (batch.fix_input_shapes).
    `input_ranges`: {input: (lo, hi)} (or `NAME=LO,HI` strings): a quantized model's float
    inputs' ranges (inputranges.py).  An error about the quantized model the compile wrote
    in a temporary folder names the user's file instead (the fault is in it, and the folder
    is gone when the user reads it)."""
    try:
        return _compile_model(Path(path), *args, **kwargs)
    except CompileError as e:
        message = _TEMPORARY_FILE.sub(str(path), str(e))
        if message == str(e):
            raise
        raise CompileError(message) from None


# a file in the compile's temporary folder (tempfile.TemporaryDirectory(prefix=QDQ_FOLDER))
QDQ_FOLDER = "tpuasm-qdq-"
_TEMPORARY_FILE = re.compile(re.escape(str(Path(tempfile.gettempdir()) / QDQ_FOLDER))
                             + r"[^/\\\s]+[/\\][^\s:'\"]*")


def _compile_model(path: Path, batch: int | None = None, calibration=None, config=None,
                   codegen: bool = True, batch_axes=None, quantization=None,
                   validate=None, min_agreement: float = 0.99, min_snr: float = 20.0,
                   time_segments: bool = True, input_values=None,
                   class_axes=None, input_shapes=None, input_ranges=None) -> CompiledModel:
    from tpuasm.compiler.runtime.classaxis import parse_class_axes
    from tpuasm.compiler.runtime.validate import check_thresholds
    min_agreement, min_snr = check_thresholds(min_agreement, min_snr)
    class_axes = parse_class_axes(class_axes)
    float_check = float_reference = None
    config = parse_config(config)
    machine = machine_config(config)
    if batch is not None and (not isinstance(batch, (int, np.integer)) or batch <= 0):
        raise CompileError(f"batch must be a positive integer, not {batch!r}")
    # a quantized model given calibration data is read back as float, its scales dropped:
    # onnxruntime's quantizer writes an infinite one for a range reaching a mask's -inf
    model = read_model(path, scales=calibration is None)
    if calibration is not None:
        # the read-backs below rewrite weights: those in external files too (a language
        # model's builder writes them all there)
        _load_weights(model, path)
    weight_only = _dequantized_weight_only(model) if calibration is not None else 0
    dequantized = _dequantized_dynamic(model, path) if calibration is not None else 0
    read_back = _read_back_qdq(model, path) if calibration is not None and \
        is_quantized(model) else 0
    from tpuasm.compiler.front.halfprecision import widen_half_precision
    half = widen_half_precision(model) if calibration is not None else 0
    from tpuasm.compiler.front.inputvalues import (drop_fixed, fix_input_values,
                                                   parse_input_values)
    fixed_values = fix_input_values(model, parse_input_values(input_values), path)
    fix_input_shapes(model, parse_input_shapes(input_shapes), path)
    from tpuasm.compiler.front.inputranges import check_input_ranges, parse_input_ranges
    ranges = parse_input_ranges(input_ranges)
    check_input_ranges(model, ranges, path)
    provenance = Provenance.of(model)       # every rewrite below records into it
    given = parse_batch_axes(batch_axes)
    # a float model's dynamic dimensions other than the batch: fixed from its calibration data
    free = {} if calibration is not None and not is_quantized(model) else None
    axes = input_axes(model, given, path, free)
    fixed_batch = has_fixed_batch(model, given, axes)
    keep = known_axes = prepared = None
    fitted = 0                          # matrix nodes whose weights accumroom.py re-rounded
    probes: dict = {}
    # a quantized model's nodes a rewrite left as they are (recurrent ones left float,
    # channels-last ones not read back): their reasons, for the report
    kept_reasons: dict[str, str] = {}
    # a weight-only model without data runs as shipped: its MatMulNBits on the host
    if is_quantized(model) or (calibration is None and _weight_only_left(model)):
        if calibration is not None:
            raise CompileError(f"{path} is already quantized: --calibrate applies to float "
                               f"models only")
        if quantization is not None or validate not in (None, False) or class_axes:
            raise CompileError(f"{path} is already quantized: quantization options, "
                               f"--validate and --class-axis apply to float models only")
        source = "quantized model, taken with its own scales and zero points"
        reference = path
    else:
        if ranges:
            raise CompileError(f"{path}: --input-range is for a quantized model's float "
                               f"inputs; a float model's ranges come from its calibration "
                               f"data")
        if calibration is None:
            raise CompileError(f"{path} is a float model: pass --calibrate DATA.npy|.npz "
                               f"(calibration inputs in the model's layout) to quantize it "
                               f"to int8")
        fix_batch(model, batch, path, apply=False, axes=axes)   # fail before quantizing
        from tpuasm.compiler.front.quantize import quantize
        from tpuasm.compiler.front.samples import check_samples, input_types, sample_rows
        data, where = _raw_data(calibration, model, "calibration")
        data = drop_fixed(data, fixed_values, where)
        at_one = batch_fixed_at_one(model, axes, data, given)
        if at_one:
            free = {}
            axes = input_axes(model, {**{n: 0 for n in at_one}, **given}, path, free)
        if recurrent_time(model, axes, data, path.parent):
            # the rows are the time of an LSTM: no batch; every input whole, its dynamic
            # dimensions (the sequence) fixed from the data (an explicit --batch-axis stays)
            free = {}
            axes = input_axes(model, {**{n: None for n in axes}, **given}, path, free)
        declared = {v.name: v.SerializeToString() for v in model.graph.input}
        fix_free_dims(model, free or {}, data, path)
        samples = check_samples(data, input_signature(model), where, input_types(model),
                                axes)
        count = sample_rows(samples, axes)
        keep = tempfile.TemporaryDirectory(prefix=QDQ_FOLDER)
        # a label's (a ZipMap's) class scores: outputs of every model from here on, for the
        # check alone (probes.py)
        probes = with_probes(model, score_probes(model))
        # the float model, for the validation: its inputs as declared (an If's branches may
        # not type-check in onnxruntime once a dynamic dimension is fixed)
        original = _with_inputs(model, declared)
        from tpuasm.compiler.runtime import classaxis
        float_classes = classaxis.class_axes(model, class_axes)   # the check's metric
        # shapes made static before quantizing (fold.py): the quantizer then sees them too
        _, float_model = fold_float_model(path, model, batch, axes, provenance,
                                          Path(keep.name))
        if float_model is not model:          # the batch is in its constants now
            known_axes = tensor_axes(model, axes, path)
        reference = Path(keep.name) / (path.stem + ".qdq.onnx")
        from tpuasm.compiler.front.quantize import QuantOptions
        options = quantization if quantization is not None else QuantOptions()
        float_check = (original, *_check_data(validate, model, samples, axes,
                                              "the calibration data", fixed_values))
        from tpuasm.compiler.front.prepare import prepare
        prepared = prepare(float_model, provenance, room(machine), path.parent)
        notes = ""                     # what the rewrites keep in float (not the user's)
        cells = len(prepared.keep_float)
        if cells:
            notes += f"; {cells} nodes of long LSTM cells kept in float"
        users_float = options.keep_float
        if prepared.keep_float:         # the rewrites' own float nodes join --keep-float's
            options = replace(options, keep_float=(*options.keep_float,
                                                   *prepared.keep_float))
        from tpuasm.compiler.runtime.calibsearch import quantize_checked
        from tpuasm.compiler.runtime.validate import (CALIBRATION_CHECK_ROWS, FloatReference,
                                                      spread_subset)
        check = spread_subset(float_check[1], axes, CALIBRATION_CHECK_ROWS
                              if validate is None else None)
        # the float model's answers on the check rows, computed once for the calibration
        # search and the validation
        float_reference = FloatReference(original, check,
                                         all(a == 0 for a in (axes or {}).values()))
        if validate is False:          # no check asked for: the options as given
            options = replace(options, search_calibration=False)
        # the batch folded into the model's constants: its histograms (percentile, entropy)
        # may need the model at a batch of one (front/calibrate.py)
        one = _at_batch_one(path, model, axes, Path(keep.name), machine) \
            if float_model is not model else None
        with classaxis.judging(float_classes):
            _, options, chosen = quantize_checked(
                prepared.model, samples, input_signature(float_model), reference, options,
                path, provenance, axes, float_reference, check, min_agreement, min_snr,
                held_out=validate is None, tied=prepared.tied, at_batch_one=one)
        said = replace(options, keep_float=users_float).describe() + notes
        source = (f"float model quantized by onnxruntime (QDQ, only the nodes the TPU takes; "
                  f"{said}) from {count} calibration samples"
                  + (f"; {chosen}" if chosen else "")
                  + (f"; dynamically quantized: its {dequantized} Conv/MatMul chains and "
                     f"LSTMs dequantized to float first" if dequantized else "")
                  + (f"; weight-only quantized: its {weight_only} MatMulNBits read back "
                     f"as float MatMuls first" if weight_only else "")
                  + ("; a half-precision model, computed in float32 between its inputs "
                     "and outputs (front/halfprecision.py)" if half else "")
                  + (f"; a QDQ model: its {read_back} quantized tensors read back as float "
                     f"first (its scales replaced by the calibration's)" if read_back else ""))
        model = read_model(reference)
    if prepared is None:
        # a float model's ConvTransposes became Convs in prepare; a quantized one's here
        from tpuasm.compiler.front.convforms import rewrite_quantized_transposes
        rewrite_quantized_transposes(model, provenance)
        from tpuasm.compiler.front.ortfusions import channels_first_quantized
        # onnxruntime's all-level NHWC form (a node not read back: its reason reported)
        channels_first_quantized(model, provenance, kept_reasons)
        fitted, said = _fitted_accumulators(model)
        source += said
    # a quantized model's float recurrent nodes (qdqrecurrent.py): those of the graph now,
    # its batch still free; those inside an If on shapes once load_graph's folding has
    # inlined it
    # (not one whose weights live in external files, which a rewritten copy would lose)
    rewrites = prepared is None and not any(t.data_location == onnx.TensorProto.EXTERNAL
                                            for t in model.graph.initializer)
    graph_file = reference             # the file the graph is read beside
    recurrent = [quantize_float_recurrent(model, provenance, kept_reasons, ranges)
                 if rewrites else 0]
    if recurrent[0] or fitted:
        keep = tempfile.TemporaryDirectory(prefix=QDQ_FOLDER)
        reference = _rewritten_reference(model, path, keep)

    def quantize_recurrent(folded) -> int:
        recurrent.append(quantize_float_recurrent(folded, provenance, kept_reasons,
                                                  ranges))
        matrices.append(quantize_float_matrices(folded, provenance, kept_reasons,
                                                ranges))
        return recurrent[-1] + matrices[-1]

    matrices = [0]

    graph, batch = load_graph(graph_file, batch, model, axes,
                              provenance if prepared is None else None, known_axes,
                              fixed_batch, quantize_recurrent if rewrites else None)
    if sum(recurrent[1:]) or sum(matrices):  # the oracle is the folded model, batch fixed
        keep = keep or tempfile.TemporaryDirectory(prefix=QDQ_FOLDER)
        reference = _rewritten_reference(graph.model, path, keep)
    if sum(matrices):
        count = sum(matrices)
        source += (f"; {count} float MatMul{'s' if count > 1 else ''} that onnxruntime's "
                   f"quantizer does not reach (Einsums with a weight, Loop, Scan or If "
                   f"bodies) quantized by the compiler from bounds: int8 weights (int16 over "
                   f"an 8-bit input where they fit), int16 inputs and sums "
                   f"(front/qdqrecurrent.py)")
    if ranges and (sum(recurrent) or sum(matrices)):
        source += "; float inputs of declared ranges (values beyond them clipped): " + \
            ", ".join(f"{name} [{lo:g}, {hi:g}]" for name, (lo, hi) in ranges.items())
    if sum(recurrent):
        count = sum(recurrent)
        source += (f"; its {count} recurrent node{'s' if count > 1 else ''} that "
                   f"onnxruntime's quantizer left float (or quantizes at run time: "
                   f"DynamicQuantizeLSTM) unrolled and quantized by the compiler from bounds, "
                   f"not data: int8 weights (int16 where the accumulators have room), int16 "
                   f"states and gate sums "
                   f"(front/qdqrecurrent.py)")
    lowered, the_plan, steps = _lower_and_generate(
        graph, batch, machine, path, codegen,
        None if prepared is None else (prepared, options, provenance))
    lowered.host_reasons.update({k: v for k, v in kept_reasons.items()
                                 if k in lowered.host_reasons})
    narrow = _wide_refused(graph, lowered) if prepared is not None and codegen else []
    if narrow:
        # the back end could not hold a matrix operator with its int16 tensors (a Unified
        # Buffer twice as full): those tensors 8-bit, quantized and compiled again
        options = replace(options, search_calibration=False,
                          narrow_tensors=(*options.narrow_tensors, *narrow))
        quantize(prepared.model, samples, input_signature(float_model), reference, options,
                 path, provenance, batch_axes=axes, tied=prepared.tied, at_batch_one=one)
        source += (f"; kept 8-bit for the back end (int16 would not fit the machine): "
                   f"{', '.join(narrow[:6])}{' ...' if len(narrow) > 6 else ''}")
        model = read_model(reference)
        graph, batch = load_graph(reference, batch, model, axes, None, known_axes,
                                  fixed_batch)
        lowered, the_plan, steps = _lower_and_generate(graph, batch, machine, path, codegen,
                                                       (prepared, options, provenance))
    # a float model was rewritten (fold, prepare) and quantized: the report maps the
    # quantized graph back through those steps to the user's nodes
    report_provenance = (provenance if prepared is None
                         else _quantized_provenance(prepared.model, graph, base=provenance))
    report = _report(path, graph, lowered, the_plan, steps, batch, machine.array_size, source,
                     report_provenance, machine=machine, timed=time_segments)
    inputs, outputs = model_values(graph)
    if probes:
        _drop_probes(reference, probes)
    compiled = CompiledModel(steps, batch, inputs, [o for o in outputs if o.name not in probes],
                             report, config, reference, keep,
                             probes=[o for o in outputs if o.name in probes])
    compiled.provenance = provenance
    if float_check is not None and validate is not False:
        from tpuasm.compiler.runtime.validate import CALIBRATION_CHECK_ROWS
        from tpuasm.compiler.runtime.validate import validate as check
        # on the calibration data a bounded, evenly spread subset; the user's data whole
        report.validation = check(compiled, *float_check, min_agreement, min_snr,
                                  max_rows=CALIBRATION_CHECK_ROWS if validate is None
                                  else None, classes=float_classes,
                                  reference=float_reference,
                                  expected=options.calibration_method == "minmax",
                                  probes=probes)
        if weight_only or dequantized or read_back:
            # not the shipped file as onnxruntime runs it: a MatMulNBits of accuracy
            # level 4 also rounds its activations to int8, the dynamic forms theirs
            report.validation.against = "the model read back as float"
    return compiled


def _rewritten_reference(model, path: Path, folder) -> Path:
    """A quantized model the compiler rewrote, saved as OUTDIR's oracle (what is compiled
    is no longer the user's file)."""
    reference = Path(folder.name) / (path.stem + ".qdq.onnx")
    onnx.save_model(model, reference)
    return reference


def _drop_probes(reference: Path, probes: dict) -> None:
    """The QDQ model OUTDIR keeps, and onnxruntime's oracle, with the user's outputs only."""
    qdq = onnx.load_model(reference)
    if without_probes(qdq, probes):
        onnx.save_model(qdq, reference)


def _at_batch_one(path, model, axes, workdir: Path, machine):
    """A function giving the float model folded and prepared as the compile does, at a batch
    of one (made once, on first use; None when nothing folds at that batch)."""
    made: list = []

    def build():
        if not made:
            from tpuasm.compiler.front.prepare import prepare
            where = workdir / "batch-one"
            where.mkdir(exist_ok=True)
            _, folded = fold_float_model(path, model, 1, axes, None, where)
            made.append(None if folded is model else
                        prepare(folded, None, room(machine), path.parent).model)
        return made[0]
    return build


def _load_weights(model, path) -> None:
    """A float model's external weights, read into it (the rewrites rescale them)."""
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        onnx.load_external_data_for_model(model, str(path.parent))


def _with_inputs(model, declared: dict) -> bytes:
    """The model serialized with its graph inputs' value infos replaced by `declared`
    (name -> serialized ValueInfoProto)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for v in copy.graph.input:
        if v.name in declared:
            v.ParseFromString(declared[v.name])
    return copy.SerializeToString()


def _read_back_qdq(model, path) -> int:
    """A QDQ or QOperator model given calibration data: read back as float (qoperator.py,
    qdqfloat.py), to be
    quantized by the compiler whole (its float LSTM/GRU nodes unrolled onto the TPU); the
    count of tensors read back."""
    from tpuasm.compiler.front.qdqfloat import read_back
    from tpuasm.compiler.front.qoperator import to_qdq
    _, why = to_qdq(model)            # a QOperator model: its QDQ form first
    count, why = read_back(model) if why is None else (0, why)
    if why is not None:
        raise CompileError(f"{path} is already quantized and --calibrate cannot read it back "
                           f"as float: {why}; compile it without --calibrate (with its own "
                           f"scales), or give the float model")
    return count


def _dequantized_dynamic(model, path) -> int:
    """A dynamically quantized model given calibration data: its chains back in float
    (dynamicquant.py), to be quantized statically; the count."""
    from tpuasm.compiler.front.dynamicquant import dequantize_dynamic, is_dynamically_quantized
    if not is_dynamically_quantized(model):
        return 0
    count = dequantize_dynamic(model)
    left = sorted({n.op_type for n in model.graph.node if n.op_type in QUANTIZED_OPS})
    if left:
        raise CompileError(f"{path} is dynamically quantized and some of its chains "
                           f"({', '.join(left)}) could not be read back as float "
                           f"Conv/MatMul: compile it without --calibrate (on the host), or "
                           f"give the float model")
    return count


def _fitted_accumulators(model) -> tuple[int, str]:
    """A quantized model's int16 weights re-rounded where its sums could wrap the int32
    accumulators (accumroom.py): (how many nodes, what the report's quantization line says
    of them)."""
    from tpuasm.compiler.front.accumroom import fit_accumulators
    notes: dict[str, str] = {}
    count = fit_accumulators(model, notes)
    if not count:
        return 0, ""
    named = "; ".join(f"'{node}': {note}" for node, note in list(notes.items())[:4])
    more = f" (and {count - 4} more)" if count > 4 else ""
    return count, (f"; {count} matrix node{'s' if count > 1 else ''} given coarser weights "
                   f"to fit the int32 accumulators (front/accumroom.py): {named}{more}")


def _weight_only_left(model) -> bool:
    from tpuasm.compiler.front.weightonly import matmul_nbits_nodes
    return bool(matmul_nbits_nodes(model))


def _dequantized_weight_only(model) -> int:
    """A weight-only quantized model given calibration data: its MatMulNBits as the float
    MatMuls they compute (weightonly.py), to be quantized statically; the count.  One that
    cannot be read back stays as it is: onnxruntime runs it on the host, and the report
    says why."""
    from tpuasm.compiler.front.weightonly import dequantize_matmul_nbits
    return dequantize_matmul_nbits(model)[0]


def _raw_data(data, model, what: str) -> tuple[dict, str]:
    """User data (an .npy/.npz path, an array for a one-input model, or {input: array})
    as {input: array} not yet checked, and what to call it in errors."""
    signature = input_signature(model)
    if isinstance(data, (str, Path)):
        from tpuasm.compiler.front.arrays import read_named_arrays
        return read_named_arrays(data, list(signature)), str(data)
    if not isinstance(data, dict):
        return {next(iter(signature)): data}, what
    return dict(data), what


def _check_data(data, model, samples: dict, axes, what: str, fixed_values=None):
    """(rows, what they are) to check the compiled model on: the calibration samples, or
    the user's --validate data (read and checked before anything is compiled)."""
    if data is None or data is False:
        return samples, what
    from tpuasm.compiler.front.inputvalues import drop_fixed
    from tpuasm.compiler.front.samples import check_samples, input_types
    data, what = _raw_data(data, model, "the validation data")
    data = drop_fixed(data, fixed_values or {}, what)
    return check_samples(data, input_signature(model), what, input_types(model), axes), what


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


def _lower_and_generate(graph: Graph, batch, machine, path, codegen: bool, rewritten=None):
    """Match, partition and generate the programs.  A segment the back end fails on (an
    exception other than its CodegenError: a case it mishandles) is not a traceback: its
    operators go back to the host, with the failure as their reason, and the model is
    matched again without them.  `rewritten`: (prepare.Prepared, QuantOptions, Provenance)
    of a float model, whose host reasons say what the rewrites and options decided."""
    refused: dict[str, str] = {}
    cuts: set[str] = set()           # operators that start a segment (one too large whole)

    def supported(op):
        return refused.get(op.name) or backend_support(op)

    while True:
        lowered = lower(graph, lookup_table, supported)
        lone = lone_elementwise(lowered)
        if lone:                 # until none is left: removing one may leave another alone
            refused.update(lone)
            continue
        if rewritten is not None:
            _prepared_reasons(graph, lowered, *rewritten)
        the_plan = plan(graph, lowered, cuts)
        steps = _runtime_steps(graph, the_plan)
        if not codegen:
            return lowered, the_plan, steps
        known = len(cuts)
        failed = generate_programs(steps, batch, machine, path, fall_back=True, cuts=cuts)
        if not failed and len(cuts) == known:
            return lowered, the_plan, steps
        refused.update(failed)


def _wide_refused(graph: Graph, lowered: Lowered) -> list[str]:
    """The int16 tensors (by the float model's names) that a matrix node the back end
    refused reads or writes: each QuantizeLinear / DequantizeLinear of int16 next to it,
    named after its scale (onnxruntime's "<tensor>_scale")."""
    found: dict[str, None] = {}
    for node in graph.nodes:
        reason = lowered.host_reasons.get(node.name, "")
        if node.op_type not in MATRIX_OPS or "back end" not in reason:
            continue
        near = [graph.producer.get(node.inputs[0]) if node.inputs else None]
        near += [c for out in node.outputs for c in graph.consumers.get(out, [])]
        for q in near:
            if q is None or q.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                continue
            tensor = q.inputs[0] if q.op_type == "DequantizeLinear" else q.outputs[0]
            scale = q.input(1)
            if graph.dtypes.get(tensor) == np.dtype(np.int16) and scale.endswith("_scale"):
                found[scale[:-len("_scale")]] = None
    return list(found)


def _prepared_reasons(graph: Graph, lowered: Lowered, prepared, options, provenance) -> None:
    """Why a rewritten float model's node is on the host: a recurrent node left as it was,
    a node kept in float (--keep-float)."""
    lowered.host_reasons.update({k: v for k, v in prepared.reasons.items()
                                 if k in lowered.host_reasons})
    for node in graph.nodes:
        if node.name in lowered.host_reasons and node.name in prepared.keep_float:
            lowered.host_reasons[node.name] = prepared.keep_float[node.name]
        elif node.name in lowered.host_reasons and \
                options.keeps(node.name, node.op_type, provenance):
            user = replace(options, checked_float=()).keeps(node.name, node.op_type,
                                                            provenance)
            lowered.host_reasons[node.name] = "kept in float (--keep-float)" if user else (
                "kept in float by the check against the float model: its 8-bit output cost "
                "top-1 agreement (the report's Quantization line)")


def _report(path, graph, lowered: Lowered, the_plan, steps, batch, array_size, source,
            provenance: Provenance | None = None, machine=None, timed: bool = True
            ) -> CompileReport:
    """The report: the compiled graph's rows aggregated to the input model's nodes through
    `provenance` (identity when None), each segment timed on `machine` (a MachineConfig;
    the default one of this array size when None), the MAC shares and their warnings."""
    from tpuasm.machine import MachineConfig
    provenance = provenance or Provenance.of(graph.model)
    compiled = _compiled_rows(graph, lowered, steps, provenance.own_work)
    rows = input_rows(provenance, compiled)
    macs = sum(r.macs for r in compiled if r.macs and r.where != "unused")
    tpu_macs = sum(r.macs for r in compiled if r.macs and r.where == "TPU")
    machine = machine or MachineConfig(array_size=array_size)
    segments, warnings = _segment_rows(steps, compiled, macs, machine, timed, batch)
    step_rows = []
    for step in steps:
        if isinstance(step, TpuStep):
            step_rows.append({"name": step.name, "kind": "tpu",
                              "items": [op.name for op in step.segment.operators]})
        else:
            step_rows.append({"name": step.name, "kind": "host", "items": list(step.nodes)})
    report = CompileReport(str(path), batch, array_size, source, rows, step_rows, compiled,
                           segments, macs, tpu_macs, float(machine.clock_hz))
    report.wide_tensors = _wide_tensors(steps)
    report.wide_weights = [op.name for step in steps if isinstance(step, TpuStep)
                           for op in step.segment.operators
                           if getattr(op, "wide_weights", False)]
    unknown = [r.node for r in compiled
               if r.op_type in MATRIX_OPS and r.macs is None and r.where != "unused"]
    if unknown:
        warnings.append(f"the MACs of {len(unknown)} matrix node{'s' if len(unknown) > 1 else ''}"
                        f" are not counted (shapes unknown): {', '.join(unknown[:3])}"
                        f"{' ...' if len(unknown) > 3 else ''}")
    report.warnings = warnings + mac_warnings(report) + _branch_warnings(graph, compiled)
    return report


def _wide_tensors(steps) -> list[str]:
    """The int16 tensors of the TPU segments (16-bit activations), in order of appearance."""
    seen: dict[str, None] = {}
    for step in steps:
        if isinstance(step, TpuStep):
            for op in step.segment.operators:
                for t in (*op.inputs, op.output):
                    if t.quant.wide:
                        seen[t.name] = None
    return list(seen)


def _branch_warnings(graph: Graph, compiled: list[NodeRow]) -> list[str]:
    """An If left on the host with matrix nodes inside whose MACs shape inference cannot
    count (the branches' shapes are computed): say that its matrix work does not map."""
    out = []
    for row in compiled:
        if row.op_type != "If" or row.where != "host" or row.macs:
            continue
        inside = _matrix_nodes(graph.node(row.node).proto)
        if inside:
            kinds = ", ".join(sorted(set(inside)))
            out.append(f"If '{row.node}' runs on the host with {len(inside)} matrix nodes "
                       f"inside ({kinds}; their MACs not counted): less than half the "
                       f"model's matrix work maps to the TPU.  An If on a model input "
                       f"folds when the input is fixed: --input-value NAME=VALUE")
    return out


def _matrix_nodes(node) -> list[str]:
    """The op types of the matrix nodes in a node's subgraphs (recursively)."""
    found = []
    for a in node.attribute:
        subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for sub in subs:
            for inner in sub.node:
                if inner.op_type in MATRIX_OPS:
                    found.append(inner.op_type)
                found += _matrix_nodes(inner)
    return found


def _compiled_rows(graph, lowered: Lowered, steps, own_work: dict | None = None
                   ) -> list[NodeRow]:
    """One row per node of the compiled graph: where it runs, in which step, why; its MACs
    the network's own (`own_work`: the share of a rewritten node's products that are)."""
    where_op = {}
    where_host = {}
    for step in steps:
        if isinstance(step, TpuStep):
            for op in step.segment.operators:
                where_op[op.name] = (step.name, op)
        else:
            for name in step.nodes:
                where_host[name] = step.name
    rows = []
    for node in graph.nodes:
        macs = node_macs(node, graph.shapes)
        if macs is not None and node.name in (own_work or {}):
            num, den = own_work[node.name]
            macs = macs * num // den
        if node.name in where_host:
            reason = lowered.host_reasons.get(node.name)
            if reason is None:
                reason = _glue_reason(node) if node.op_type in GLUE else "needed by the host"
            rows.append(NodeRow(node.name, node.op_type, "host", where_host[node.name], reason,
                                macs))
        elif node.name in lowered.fused:
            op_name = lowered.fused[node.name]
            seg, op = where_op[op_name]
            note = describe(op) + "".join(f"; {n}" for n in lowered.notes.get(op_name, [])) \
                if op_name == node.name else f"fused into {op_name}"
            rows.append(NodeRow(node.name, node.op_type, "TPU", seg, note, macs))
        else:
            rows.append(NodeRow(node.name, node.op_type, "unused", "-",
                                "its result is not needed", macs))
    return rows


def _segment_rows(steps, compiled: list[NodeRow], total_macs: int, machine,
                  timed: bool = True, batch: int = 1):
    """Per TPU segment: its rows (at `batch`), MACs and share, and (`timed`) its cycles
    from a timing-only run of its program (when the back end made one)."""
    from tpuasm.compiler.codegen.timing import time_segments
    n2 = machine.array_size ** 2
    timings = time_segments(steps, machine) if timed else {}
    rows, warnings = [], []
    for step in steps:
        if not isinstance(step, TpuStep):
            continue
        macs = sum(r.macs for r in compiled
                   if r.macs and r.where == "TPU" and r.step == step.name)
        row = SegmentRow(step.name, len(step.segment.operators), macs,
                         macs / total_macs if total_macs else 0.0,
                         rows=step.segment.program_rows(batch),
                         own_rows=step.segment.rows is not None)
        timing = timings.get(step.name)
        if timing is not None and timing.fault is not None:
            warnings.append(f"{step.name}: its timing run did not halt: {timing.fault}")
        elif timing is not None:
            row.cycles = timing.cycles
            row.time_us = round(timing.seconds * 1e6, 3)
            row.array_active_cycles = timing.array_active_cycles
            row.utilisation = macs / max(timing.cycles * n2, 1)
        rows.append(row)
    return rows, warnings


def _quantized_provenance(float_model, graph: Graph, base: Provenance | None = None
                          ) -> Provenance:
    """Which node of the float model each node of the quantized one came from: quantize_static
    keeps each node's outputs (unnamed nodes get different names in the two), adds the
    Q/DQ glue (no source) and drops Relu/Clip whose range the quantization absorbs.

    `base`: when a rewrite made `float_model` from the user's model (folding, unrolling),
    its Provenance; the result then maps the quantized graph to the user's nodes."""
    provenance = Provenance.of(float_model)
    by_output = {o: n for n in float_model.graph.node for o in n.output if o}
    for node in graph.nodes:
        made = next((by_output[o] for o in node.outputs if o in by_output), None)
        if made is not None and made.op_type == node.op_type:
            provenance.derive(node.name, made.name)
    covered = {provenance.source(n.name) for n in graph.nodes}
    for node in float_model.graph.node:
        if node.name not in covered:
            producer = next((by_output[i].name for i in node.input if i in by_output), None)
            provenance.fold(node.name, "removed when quantizing" + (
                f": the quantized range of {producer}'s output does its work"
                if producer else ""))
    return provenance if base is None else _through(base, provenance, graph)


def _through(base: Provenance, step: Provenance, graph: Graph) -> Provenance:
    """`step` (quantized graph -> float model) followed by `base` (float model -> the user's
    model)."""
    out = Provenance(list(base.nodes), dict(base.origin), dict(base.folded),
                     notes=dict(base.notes))
    for node in graph.nodes:
        made = step.source(node.name)
        if made in base.own_work:
            out.own_work[node.name] = base.own_work[made]
    for node in graph.nodes:
        made = step.source(node.name)
        source = base.source(made) if made is not None else None
        if source is not None and source != node.name:
            out.origin[node.name] = source
    for name, why in step.folded.items():
        source = base.source(name)
        if source is not None:
            out.folded.setdefault(source, why)
    return out


def _glue_reason(node) -> str:
    if node.op_type == "QuantizeLinear":
        return "quantizes a host value"
    if node.op_type == "DequantizeLinear":
        return "dequantizes a value for the host"
    if node.op_type == "Constant":
        return "a constant the host needs"
    return "layout change of a host value"

"""Post-training static int8 quantization of a float model from a calibration set, by
onnxruntime.quantization.quantize_static (QDQ format): only the nodes the TPU can take are
quantized (tpu_nodes), everything the host runs stays float, so the host parts compute what
the float model computes.  Weights int8 symmetric per output channel (or per tensor),
activations uint8 per tensor (or int8 with zero point 0), calibrated by min-max, entropy or
a percentile (QuantOptions), the ranges from one streaming pass of the float model
(calibrate.py) given to quantize_static as its calibration cache.  The QDQ model it writes
is the model the compiler then compiles and the reference it is checked against."""
from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front import widen, wideweights
from tpuasm.compiler.front.calibrate import CalibrationPass, float_tensors
from tpuasm.compiler.front.graph import readers_through
from tpuasm.compiler.front.samples import calibration_feeds, row_range, sample_rows

CALIBRATION_METHODS = ("minmax", "entropy", "percentile")
MATRIX_OPS = {"Conv", "Gemm", "MatMul"}
# element-wise ops the TPU runs as a 256-entry lookup table (lower.LOOKUP_OPS) and the ones
# that keep a TPU value on the TPU when they read one: pooling, layout
_POOL_OPS = {"MaxPool", "AveragePool", "GlobalAveragePool"}
_LAYOUT_OPS = {"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze"}
# reductions that sum their input: a normalization's statistics (mean, E[x^2], norms)
_SUM_REDUCTIONS = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2",
                   "ReduceLogSum", "ReduceLogSumExp"}


@dataclass(frozen=True)
class QuantOptions:
    """How a float model is quantized (the CLI's --per-tensor, --symmetric-activations,
    --calibration-method, --percentile, --keep-float).  The method "auto" (the default) is
    min-max, and the others when min-max's answers fall below the check's bars
    (runtime/calibsearch.py): `search_calibration` then says so."""
    per_channel: bool = True
    symmetric_activations: bool = False
    calibration_method: str = "auto"
    percentile: float = 99.999
    keep_float: tuple[str, ...] = field(default_factory=tuple)
    search_calibration: bool = False
    # nodes the check moved to float (runtime/calibsearch.py), apart from the user's keep_float
    checked_float: tuple[str, ...] = ()
    # 16-bit activations (front/widen.py): 16 makes every tensor that can be int16 so;
    # wide_tensors names some (--wide-tensor), checked_wide the check's choice (calibsearch)
    activation_bits: int = 8
    wide_tensors: tuple[str, ...] = ()
    checked_wide: tuple[str, ...] = ()
    # tensors kept 8-bit whatever the above ask: the back end could not hold them at int16
    narrow_tensors: tuple[str, ...] = ()
    # 16-bit weights (front/wideweights.py): 16 gives every matrix node that can have them
    # int16 weights; wide_weights names nodes (--wide-weight), checked_wide_weights the
    # check's choice (calibsearch)
    weight_bits: int = 8
    wide_weights: tuple[str, ...] = ()
    checked_wide_weights: tuple[str, ...] = ()
    # min-max ranges widened by their growth from half the calibration rows to all of them
    # (calibrate.Extrapolated): the check's choice when rows it held out were clipped
    extrapolate_ranges: bool = False

    def __post_init__(self):
        method = str(self.calibration_method).lower().replace("-", "").replace("_", "")
        if method == "auto":
            method = "minmax"
            object.__setattr__(self, "search_calibration", True)
        if method not in CALIBRATION_METHODS:
            raise CompileError(f"calibration method {self.calibration_method!r}: expected one "
                               f"of auto, {', '.join(CALIBRATION_METHODS)}")
        object.__setattr__(self, "calibration_method", method)
        try:
            p = float(self.percentile)
        except (TypeError, ValueError):
            raise CompileError(f"percentile {self.percentile!r} is not a number") from None
        if not 50.0 <= p <= 100.0 or p != p:
            raise CompileError(f"percentile {self.percentile!r}: expected a number in "
                               f"[50, 100] (the share of values the range covers)")
        object.__setattr__(self, "percentile", p)
        keep = self.keep_float
        if isinstance(keep, str):
            keep = [keep]
        keep = tuple(k.strip() for item in (keep or ()) for k in str(item).split(",")
                     if k.strip())
        object.__setattr__(self, "keep_float", keep)
        bits = _bits(self.activation_bits, "activation")
        object.__setattr__(self, "activation_bits", bits)
        object.__setattr__(self, "weight_bits", _bits(self.weight_bits, "weight"))
        object.__setattr__(self, "wide_tensors", _names(self.wide_tensors))
        object.__setattr__(self, "wide_weights", _names(self.wide_weights))

    def keeps(self, name: str, op_type: str, provenance=None) -> bool:
        """Is the node `name` kept in float: by its name or operator type, or by those of
        the user's node it came from (`provenance`)?"""
        if not self.keep_float and not self.checked_float:
            return False
        source = provenance.source(name) if provenance is not None else None
        source_op = dict(provenance.nodes).get(source) if source is not None else None
        return bool({name, op_type, source, source_op} &
                    (set(self.keep_float) | set(self.checked_float)))

    def describe(self) -> str:
        """The report's words for these options."""
        weights = "per output channel" if self.per_channel else "per tensor"
        acts = "int8 activations symmetric (zero point 0)" if self.symmetric_activations \
            else "uint8 activations per tensor"
        method = {"minmax": "min-max", "entropy": "entropy",
                  "percentile": f"{self.percentile:g}th percentile"}[self.calibration_method]
        width = "int16 weights wherever the TPU takes them (--weight-bits 16)" \
            if self.weight_bits == 16 else "int8 weights"
        text = f"{width} {weights}, {acts}, {method} calibration"
        if self.extrapolate_ranges and self.calibration_method == "minmax":
            text += (" with its ranges extrapolated to new rows (each widened by its growth "
                     "from half the calibration rows to all)")
        if self.activation_bits == 16:
            text += ", int16 activations wherever the TPU takes them (--activation-bits 16)"
        elif self.wide_tensors:
            text += f", int16 activations asked for: {', '.join(self.wide_tensors)}"
        if self.checked_wide:
            shown = ", ".join(self.checked_wide[:6])
            more = f" ... ({len(self.checked_wide)} tensors)" if len(self.checked_wide) > 6 \
                else ""
            text += f", made int16 by the check: {shown}{more}"
        if self.wide_weights and self.weight_bits == 8:
            text += f", int16 weights asked for: {', '.join(self.wide_weights)}"
        if self.checked_wide_weights:
            shown = ", ".join(self.checked_wide_weights[:6])
            more = f" ... ({len(self.checked_wide_weights)} nodes)" \
                if len(self.checked_wide_weights) > 6 else ""
            text += f", int16 weights chosen by the check: {shown}{more}"
        if self.keep_float:
            text += f", kept in float: {', '.join(self.keep_float)}"
        if self.checked_float:
            shown = ", ".join(self.checked_float[:6])
            more = f" ... ({len(self.checked_float)} nodes)" if len(self.checked_float) > 6 \
                else ""
            text += f", kept in float by the check: {shown}{more}"
        return text


def _bits(value, what: str) -> int:
    """8 or 16 from an option's value; one clear error otherwise."""
    try:
        bits = int(str(value).strip())
    except ValueError:
        bits = None
    if bits not in (8, 16):
        raise CompileError(f"{what} bits {value!r}: expected 8 or 16 (the TPU's 8-bit or "
                           f"16-bit {what}s)")
    return bits


def _names(value) -> tuple[str, ...]:
    """Names from an option: a string, or strings, each a name or names separated by
    commas."""
    if isinstance(value, str):
        value = [value]
    return tuple(k.strip() for item in (value or ()) for k in str(item).split(",")
                 if k.strip())


def tpu_nodes(model: onnx.ModelProto, options: QuantOptions, path="the model",
              provenance=None) -> list[str]:
    """The names of the nodes to quantize: the ones the TPU can take.  Conv, Gemm and MatMul
    with a constant weight (a matrix for MatMul); the Relu/Clip, lookup-table operators,
    pooling and layout nodes that read such a node's output; the bias Add of a MatMul on a
    tensor of rank >= 3; an Add/Sub/Mul (VADD/VMUL) of two activations that each come from
    such a node or a model input, one at least from such a node (a residual block's skip
    Add), of one shape or one per channel or one channel of the other; or of one such
    activation and a finite constant, a scalar or one value per channel.  Never a MatMul of
    two activations, a Gather, OneHot, Softmax, the parts of a LayerNorm (made by host
    nodes), nor an Add/Sub/Mul whose output a sum or mean reduction reads (_feeds_sum):
    quantizing those costs the host parts their float accuracy and gains the TPU nothing.

    `options.keep_float` names nodes or operator types of the prepared model or, through
    `provenance`, of the user's model (keeping an LSTM float keeps every node unrolled from
    it float)."""
    from tpuasm.compiler.front.match import LOOKUP_OPS
    from tpuasm.compiler.front.prepare import matmul_bias_pairs
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    original = dict(provenance.nodes) if provenance is not None else {}
    _check_keep_float(model, options.keep_float, path, original)
    producer = {o: n for n in g.node for o in n.output if o}
    bias_adds = {add.name for _, add, _, rank in matmul_bias_pairs(model) if rank >= 3}
    chosen: set[str] = set()
    graph_inputs = {v.name for v in g.input if v.name not in inits}
    shapes = _known_shapes(model)
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    names = []
    for node in g.node:
        op = node.op_type
        if options.keeps(node.name, op, provenance) or (
                node.domain not in ("", "ai.onnx") and not (
                    node.domain == "com.microsoft" and op in LOOKUP_OPS)):
            continue          # a contrib GELU (gelu.py's fusion) is a lookup table
        src = producer.get(node.input[0]) if node.input and node.input[0] else None
        from_tpu = src is not None and src.name in chosen
        take = False
        if op in MATRIX_OPS:
            w = inits.get(node.input[1]) if len(node.input) > 1 else None
            take = w is not None and (op != "MatMul" or len(w.dims) == 2)
        elif op in LOOKUP_OPS or op in _POOL_OPS or op in _LAYOUT_OPS:
            take = from_tpu
        elif op == "Add" and node.name in bias_adds:      # its MatMul is chosen
            take = any(i in producer and producer[i].name in chosen for i in node.input)
        elif op in ("Add", "Sub", "Mul"):
            take = _vector_operands(node, producer, chosen, graph_inputs, shapes, inits) \
                and not _feeds_sum(node.output[0], consumers)
        if take:
            chosen.add(node.name)
            names.append(node.name)
    return names


def _feeds_sum(tensor: str, consumers: dict) -> bool:
    """Does a sum or mean reduction read `tensor` (through layout nodes)?  Such a value is
    a normalization's statistic: a LayerNorm's E[x^2] in var = E[x^2] - E[x]^2, where the
    subtraction cancels and 1/sqrt(var + eps) then multiplies the 8-bit error.  Quantized on
    VMUL it cost Magika 10 points of top-1 agreement (issue 20); on the host it is float."""
    return any(node.op_type in _SUM_REDUCTIONS
               for node, _ in readers_through(tensor, consumers, _SELECT_OPS))


def _vector_operands(node, producer, chosen, graph_inputs, shapes, inits) -> bool:
    """An Add/Sub/Mul the TPU's VADD/VMUL take once quantized: two activation operands,
    each made by a chosen node or a model input (quantized anyway), at least one by a
    chosen node, of one shape when the shapes are known (a broadcast stays float); or one
    made by a chosen node and a constant (an initializer) that does not grow it: a scalar
    or one value per channel (match.py checks the axis)."""
    if len(node.input) != 2 or not all(node.input):
        return False
    from_tpu = [i in producer and producer[i].name in chosen for i in node.input]
    constant = [i in inits for i in node.input]
    if any(constant):
        if all(constant) or not any(from_tpu):
            return False
        k = constant.index(True)
        value = inits[node.input[k]]
        other = shapes.get(node.input[1 - k])
        dims = tuple(value.dims)
        if int(np.prod(dims)) > 65536 or not np.isfinite(
                numpy_helper.to_array(value).astype(np.float64)).all():
            return False          # an attention mask's -inf: no scale quantizes it
        if int(np.prod(dims)) == 1:
            return True
        if other is None or len(dims) > len(other) or (len(dims) == len(other) and
                                                        dims and dims[0] != 1):
            return False           # a constant per sample is not one row for every sample
        return all(d == 1 or d == o for d, o in zip(dims[::-1], other[::-1]))
    if not any(from_tpu) or not all(t or _from_input(i, producer, graph_inputs)
                                    for t, i in zip(from_tpu, node.input)):
        return False
    a, b = (shapes.get(i) for i in node.input)
    return a is None or b is None or a == b or any(
        f(x, y) for f in (_per_channel, _one_channel) for x, y in ((a, b), (b, a)))


def _one_channel(small: tuple, big: tuple) -> bool:
    """`small` is one channel of `big`'s pixels ((N, 1, H, W) against (N, C, H, W), (N, 1)
    against (N, C)): spread over the channels by the array, then VADD/VMUL."""
    if len(small) != len(big) or len(big) < 2 or small[0] != big[0]:
        return False
    differ = [i for i, (d, e) in enumerate(zip(small[1:], big[1:])) if d != e]
    return len(differ) == 1 and small[1 + differ[0]] == 1 and \
        differ[0] in (0, len(big) - 2)


def _per_channel(small: tuple, big: tuple) -> bool:
    """`small` is one value per channel of `big` per sample ((N, C, 1, 1) against
    (N, C, H, W), (N, 1, C) against (N, T, C)): VADD/VMUL's B row per sample."""
    if len(small) != len(big) or len(big) < 3 or small[0] != big[0]:
        return False
    spread = [i for i, (d, e) in enumerate(zip(small[1:], big[1:])) if d != 1]
    return all(d == 1 or d == e for d, e in zip(small[1:], big[1:])) and \
        len(spread) <= 1 and (not spread or spread[0] in (0, len(big) - 2))


_SELECT_OPS = {"Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Transpose", "Identity"}


def _from_input(name: str, producer: dict, graph_inputs: set) -> bool:
    """A model input, or a part of one the host selects (an LSTM's initial state: Slice and
    Squeeze of the input): the runtime quantizes it for the TPU at no cost in float accuracy
    elsewhere (its float value stays where the host reads it)."""
    for _ in range(16):
        if name in graph_inputs:
            return True
        node = producer.get(name)
        if node is None or node.op_type not in _SELECT_OPS or not node.input:
            return False
        name = node.input[0]
    return False


def _known_shapes(model) -> dict[str, tuple]:
    """Tensor name -> its shape where shape inference knows every dimension (symbolic
    dimensions by name), for telling a broadcast apart; {} when inference fails."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:                     # noqa: BLE001 - no shapes: decide without them
        return {}
    shapes = {}
    g = inferred.graph
    for v in list(g.input) + list(g.value_info) + list(g.output):
        dims = v.type.tensor_type.shape.dim if v.type.HasField("tensor_type") else ()
        shape = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or None
                      for d in dims)
        if dims and all(d is not None for d in shape):
            shapes[v.name] = shape
    return shapes


def _check_keep_float(model, keep, path, original: dict) -> None:
    names = {n.name for n in model.graph.node} | set(original)
    ops = {n.op_type for n in model.graph.node} | set(original.values())
    for k in keep:
        if k not in names and k not in ops:
            raise CompileError(f"{path}: --keep-float {k}: no node or operator type of that "
                               f"name in the model")


def _refuse_non_finite_weights(model: onnx.ModelProto, path, provenance=None,
                               quantized: set | None = None) -> None:
    """A NaN or infinite weight of a node to quantize has no quantization scale:
    onnxruntime's calibration then fails with "'scale issue'" after numpy's RuntimeWarnings.
    Name the node and weight.  (The host's float nodes may read such constants: an
    attention mask's -inf.)"""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if quantized is not None and node.name not in quantized:
            continue
        for name in node.input:
            t = inits.get(name)
            if t is None or t.data_type not in (onnx.TensorProto.FLOAT,
                                                onnx.TensorProto.DOUBLE,
                                                onnx.TensorProto.FLOAT16):
                continue
            values = numpy_helper.to_array(t)
            if not np.isfinite(values).all():
                source = provenance.source(node.name) if provenance is not None else None
                raise CompileError(f"{path}: node {source or node.name or node.op_type}: "
                                   f"weight {name} holds NaN or infinite values")


def quantize(model, samples: dict[str, np.ndarray], signature: dict, out_path,
             options: QuantOptions | None = None, path=None, provenance=None,
             batch_axes: dict | None = None, tied: dict | None = None,
             notes: dict | None = None,
             calibration: CalibrationPass | None = None, at_batch_one=None) -> list[str]:
    """Write the QDQ model for `model` (a path or a float ModelProto, prepared by
    prepare.py, whose `provenance` maps its nodes to the user's) calibrated on `samples`
    (in the model's own layout and types; `batch_axes`: input -> batch axis or None, default
    batch first) to `out_path`.  `tied`: groups of tensors given one range (prepare.py's
    Prepared.tied, an unrolled LSTM's steps) when the samples have fewer than
    TIED_BELOW_ROWS rows.  `notes` (a dict) gets what the report should
    say beyond the options: {"kept 8-bit": {tensor: why}} (front/widen.py).  `calibration`:
    the statistics of earlier calls on the same model and samples (calibrate.py), reused
    and extended: every method from one pass over the samples.  `at_batch_one()`: None, or
    `model` as the compile would make it at a batch of one (a float model whose batch the
    compile fixed in its constants), for the histograms of a fixed batch too large to expose
    at once (calibration_model).  Returns the quantized nodes."""
    from onnxruntime.quantization import (CalibrationMethod, QuantFormat, QuantType,
                                          quantize_static)
    options = options or QuantOptions()
    path = path if path is not None else model
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    if options.per_channel:
        model = _per_axis_opset(model, path)
    model = _with_shapes(model)
    nodes = tpu_nodes(model, options, path, provenance)
    _refuse_non_finite_weights(model, path, provenance, set(nodes))
    weighted = wideweights.requested(model, set(nodes), options, path, provenance)

    if not nodes:
        # nothing the TPU can take: the model stays float (onnxruntime needs one node)
        onnx.save(model, str(out_path))
        return []
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[options.calibration_method]
    extra = {"ActivationSymmetric": options.symmetric_activations,
             "WeightSymmetric": True, "CalibPercentile": options.percentile}
    import logging
    logging.getLogger().setLevel(logging.ERROR)      # quantize_static's pre-processing hints
    from tpuasm.compiler.ort import quiet
    quiet()
    op_types = sorted({n.op_type for n in model.graph.node if n.name in set(nodes)})
    calibration = calibration if calibration is not None else CalibrationPass()
    if options.extrapolate_ranges and options.calibration_method == "minmax":
        from tpuasm.compiler.front.calibrate import Extrapolated
        half = row_range(samples, batch_axes, 0, sample_rows(samples, batch_axes) // 2)
        calibration = Extrapolated(calibration, lambda rows: calibration_feeds(
            half, signature, batch_axes, rows))
    try:
        # numpy's RuntimeWarnings from calibration (activations that overflow to infinity)
        # are not for the user: the failure, if any, is the one message below
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), \
                np.errstate(all="ignore"), \
                tempfile.TemporaryDirectory(prefix="tpuasm-calib-") as tmp:
            warnings.simplefilter("ignore", RuntimeWarning)
            chosen = set(nodes)
            names = onnxruntime_tensors(model, op_types, Path(tmp))
            groups = tied_groups(model, tied, chosen) if tied and \
                options.calibration_method == "minmax" and \
                sample_rows(samples, batch_axes) < TIED_BELOW_ROWS else {}
            calibration.collect(model, [*names, *(t for g in groups.values() for t in g)],
                                lambda rows: calibration_feeds(samples, signature,
                                                               batch_axes, rows),
                                most_rows=calibration_rows(model),
                                histograms=options.calibration_method != "minmax",
                                rebatched=None if at_batch_one is None else lambda:
                                calibration_model(model, at_batch_one, samples, batch_axes,
                                                  path))
            ranges = calibration.ranges(names, options.calibration_method,
                                        options.percentile)
            ranges = _finite_ranges(ranges, chosen, options.calibration_method, path,
                                    provenance, model)
            cache = _ranges_cache(ranges, Path(tmp), options, flat_below(model, chosen))
            if groups:
                extra["TensorQuantOverrides"] = tied_ranges(groups, calibration)
            wide = widen.choose(model, chosen, options, path)
            weight_overrides = {}
            if wide or weighted:
                # one pass of the float model for both guards (16-bit activations first,
                # then the weights' steps given the activations' widths)
                readers = [n.name for found in widen.readers(model, wide, chosen).values()
                           for n in found]
                # the ranges onnxruntime will use: the method's, a tied group's union
                used = dict(ranges)
                used.update({t: (entries[0]["rmin"], entries[0]["rmax"]) for t, entries
                             in extra.get("TensorQuantOverrides", {}).items()})
                accumulators = widen.Accumulators(
                    model, [*readers, *weighted],
                    [*wide, *wideweights.measured(model, weighted, chosen)],
                    _Feeds(calibration_feeds(samples, signature, batch_axes,
                                             calibration_rows(model))), used)
                widen.drop_wrapping(model, wide, chosen, accumulators, options.per_channel,
                                    notes)
                weight_overrides = wideweights.overrides(model, weighted, chosen, wide,
                                                         accumulators, options, notes)
            if wide or weight_overrides:
                overrides = extra.setdefault("TensorQuantOverrides", {})
                for t in (m for members in wide.values() for m in members):
                    for entry in overrides.setdefault(t, [{}]):
                        entry["quant_type"] = QuantType.QInt16
                _convert_for_tables(model, wide, chosen, overrides, ranges,
                                    QuantType.QInt8 if options.symmetric_activations
                                    else QuantType.QUInt8)
                overrides.update(weight_overrides)
            # the ranges are given: quantize_static calibrates nothing itself
            quantize_static(model, str(out_path), None, quant_format=QuantFormat.QDQ,
                            per_channel=options.per_channel,
                            activation_type=QuantType.QInt8 if options.symmetric_activations
                            else QuantType.QUInt8,
                            weight_type=QuantType.QInt8, nodes_to_quantize=nodes,
                            op_types_to_quantize=op_types, calibrate_method=method,
                            extra_options=extra, calibration_cache_path=cache)
        qdq = onnx.load(str(out_path))
        from tpuasm.compiler.front.scales import (repair_underflowing_zero_biases,
                                                  repair_vanishing_channels)
        fixed = set(extra.get("TensorQuantOverrides", {}))
        # the pools first: the biases the other two write read their new input scales
        if own_pool_scales(qdq, model, ranges, options.symmetric_activations, fixed) + \
                fuse_bias_adds(qdq, model) + repair_vanishing_channels(qdq) + \
                repair_underflowing_zero_biases(qdq):
            onnx.save(qdq, str(out_path))
    except CompileError:
        raise
    except Exception as e:      # onnxruntime's own errors have no common base
        raise CompileError(f"{path}: quantization failed: "
                           f"{str(e).strip().splitlines()[0] if str(e).strip() else e!r}"
                           ) from None
    return nodes


def _convert_for_tables(model, wide: dict, chosen: set, overrides: dict, ranges: dict,
                        quant_type) -> None:
    """Give each 16-bit tensor a lookup table reads (widen.converted) onnxruntime's
    `convert` to the 8-bit `quant_type` for those readers, over widen.index_range (its own
    range, or a tied group's, narrowed to where the function still changes)."""
    for t, readers in widen.converted(model, wide, chosen).items():
        entry = overrides[t][0]
        if "rmin" in entry:
            low, high = float(np.min(entry["rmin"])), float(np.max(entry["rmax"]))
        elif t in ranges:
            low, high = float(np.min(ranges[t][0])), float(np.max(ranges[t][1]))
        else:
            continue                    # no range: onnxruntime converts over its own
        low, high = widen.index_range(model, readers, low, high, ranges)
        entry["convert"] = {"quant_type": quant_type, "recv_nodes": set(readers),
                            "rmin": np.array(low, np.float32),
                            "rmax": np.array(high, np.float32)}


def calibration_model(model: onnx.ModelProto, at_batch_one, samples, batch_axes, path):
    """(the model at a batch of one, its calibration feeds) for CalibrationPass's histogram
    pass, or None: `at_batch_one()` normalised as quantize() normalises `model`, taken only
    when it is `model` but for its int64 constants (the shapes the batch is folded into), so
    that its tensors are `model`'s, one row at a time."""
    from tpuasm.compiler.front.reader import input_signature
    try:
        one = at_batch_one()
        if one is None:
            return None
        one = _with_shapes(_per_axis_opset(one, path) if _opset(model) != _opset(one)
                           else one)
    except Exception:                   # noqa: BLE001 - no such model: the fixed batch
        return None
    if not same_but_shapes(model, one):
        return None
    signature = input_signature(one)
    return one, lambda rows: calibration_feeds(samples, signature, batch_axes, rows)


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def same_but_shapes(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """The same nodes (names, types, inputs, outputs, attributes) and initializers (names,
    types, values), but for the values of int64 vectors (shapes)."""
    if len(a.graph.node) != len(b.graph.node) or \
            len(a.graph.initializer) != len(b.graph.initializer):
        return False
    if any(x != y for x, y in zip(a.graph.node, b.graph.node)):
        return False
    for x, y in zip(a.graph.initializer, b.graph.initializer):
        if x.name != y.name or x.data_type != y.data_type:
            return False
        shape_like = x.data_type == onnx.TensorProto.INT64 and len(x.dims) <= 1
        if not shape_like and x != y:
            return False
    return True


class _Feeds:
    """Calibration feeds a chunk at a time, in onnxruntime's reader protocol (get_next):
    widen.py's accumulator pass reads them."""

    def __init__(self, chunks):
        self.chunks = chunks

    def get_next(self):
        return next(self.chunks, None)


PER_AXIS_OPSET = 13          # DequantizeLinear takes `axis` (per-channel scales) from 13


def _per_axis_opset(model: onnx.ModelProto, path) -> onnx.ModelProto:
    """The model at opset 13 or later, so that per-channel weights can be written (Paddle's
    exports, say, are opset 11-12); converted by onnx's version converter."""
    versions = {o.domain or "": o.version for o in model.opset_import}
    if versions.get("", versions.get("ai.onnx", PER_AXIS_OPSET)) >= PER_AXIS_OPSET:
        return model
    from tpuasm.compiler.front.reader import converted_to
    try:
        return converted_to(model, PER_AXIS_OPSET)
    except Exception as e:
        raise CompileError(f"{path}: per-channel weights need opset {PER_AXIS_OPSET}, and "
                           f"onnx's version converter could not convert the model "
                           f"({str(e).strip().splitlines()[0] if str(e).strip() else e!r}); "
                           f"try --per-tensor") from None


def onnxruntime_tensors(model: onnx.ModelProto, op_types, tmp: Path) -> list[str]:
    """The tensors onnxruntime's own calibrator would calibrate for quantize_static: the
    float inputs and outputs of every node of `op_types`, by onnxruntime's shape inference
    of its own copy (it knows types our model does not: a paddle2onnx MatMul's output), so
    that quantize_static gets the very ranges its calibrator gave (its quantizer reads
    ranges of neighbours of the nodes it quantizes)."""
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer
    source = tmp / "for-types.onnx"
    onnx.save(model, str(source))
    inferred = load_model_with_shape_infer(source)
    source.unlink()
    chosen = [n.name for n in inferred.graph.node if n.op_type in set(op_types)]
    return float_tensors(inferred, chosen)


def _finite_ranges(ranges: dict, chosen: set, method: str, path, provenance,
                   model) -> dict:
    """`ranges` without the tensors no chosen node reads or writes whose range is not
    finite: onnxruntime's calibrator covers every node of the quantized op types, and a
    host node's tensor can hold what no scale quantizes (BERT's attention mask, -3.4e38
    where a token is padding) without harm.  A chosen node's tensor whose range is not
    finite (activations that overflow float32, or a histogram over a span float32 cannot
    hold: onnxruntime's own calibrators fail there too) has no 8-bit scale: one error
    naming it and the node that makes it."""
    touched = {t for n in model.graph.node if n.name in chosen for t in [*n.input, *n.output]}
    producer = {o: n.name for n in model.graph.node for o in n.output if o}
    kept = {}
    for name, (lo, hi) in ranges.items():
        if np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)):
            kept[name] = (lo, hi)
            continue
        if name not in touched:
            continue
        node = producer.get(name)
        source = provenance.source(node) if provenance is not None and node else None
        made = f" (made by node {source or node})" if node else ""
        raise CompileError(f"{path}: {method} calibration of tensor {name}{made}: its values "
                           f"overflow float32 on the calibration data, no 8-bit scale holds "
                           f"them")
    return kept


# Below this many calibration rows (sequences) an unrolled LSTM's per-step quantities are
# given one range over all steps (tied_groups): a step's range fitted on one or a few
# sequences does not hold for the next data (a 24-step LSTM on one sequence: hn 10 -> 36 dB).
# From here on each step has its own: the union is as wide as the widest step (c grows along
# the sequence, the first steps are near their initial state), and on 128 sequences it cost
# a PyTorch LSTM classifier 1.4 points of top-1 agreement on 2,048 new rows (97.1 -> 98.5 %).
TIED_BELOW_ROWS = 32


def tied_groups(model: onnx.ModelProto, tied: dict, chosen: set) -> dict:
    """Each group of `tied` tensors (prepare.py's Prepared.tied) with the tensors that hold
    the same values, kept to those a chosen node reads or writes."""
    touched = {t for n in model.graph.node if n.name in chosen
               for t in [*n.input, *n.output] if t}
    return {k: [t for t in _through_layout(model, names) if t in touched]
            for k, names in tied.items()}


def tied_ranges(groups: dict, calibration: CalibrationPass) -> dict:
    """onnxruntime's TensorQuantOverrides giving each of `groups` (tied_groups) the
    min-max range of the whole group over the calibration pass: {tensor: [{"rmin": ...,
    "rmax": ...}]}."""
    overrides = {}
    for group in groups.values():
        found = [s for s in (calibration.tensors.get(t) for t in group)
                 if s is not None and s.low is not None]
        lo = min((float(s.low) for s in found), default=np.inf)
        hi = max((float(s.high) for s in found), default=-np.inf)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            continue
        for t in group:
            overrides[t] = [{"rmin": np.array(lo, np.float32), "rmax": np.array(hi, np.float32)}]
    return overrides


_SAME_VALUES = {"Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Transpose"}


def _through_layout(model: onnx.ModelProto, names: list[str]) -> list[str]:
    """`names` and the tensors that hold the same values: the outputs of layout nodes that
    read one of them, and of a Concat of them only (the last step's h on its way to the
    model's Y_h and the Gemm after it): one range for all, or the quantizer puts a
    requantization between them."""
    group = list(names)
    members = set(group)
    changed = True
    while changed:
        changed = False
        for node in model.graph.node:
            data = [i for i in node.input[:1 if node.op_type != "Concat" else None] if i]
            if node.op_type not in _SAME_VALUES | {"Concat"} or not data or \
                    not all(i in members for i in data):
                continue
            for out in node.output:
                if out and out not in members:
                    members.add(out)
                    group.append(out)
                    changed = True
    return group


# GELU(x) for x below this is within 1.3e-4 of 0: less than half the step of any 8-bit
# GELU output (its range holds at least [-0.17, 0], a step >= 6.7e-4), so a lookup table
# whose input range starts here gives every such x the output its true value would
_GELU_FLAT_BELOW = -4.0
_FLAT_BELOW = {"FastGelu": _GELU_FLAT_BELOW, "Gelu": _GELU_FLAT_BELOW}


def flat_below(model: onnx.ModelProto, quantized: set) -> dict[str, float]:
    """Tensor -> the value below which what reads it is flat: the input of a quantized GELU
    that nothing else reads.  A Conv's output before its GELU spans [-187, 174] in Magika;
    everything below -4 maps to GELU's 0, so its range starts at -4 and the 8-bit step of
    the Conv's output halves (issue 20)."""
    readers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {v.name for v in model.graph.output}
    found = {}
    for n in model.graph.node:
        bound = _FLAT_BELOW.get(n.op_type)
        if bound is None or n.name not in quantized or not n.input or n.input[0] in outputs:
            continue
        if all(r.op_type in _FLAT_BELOW and r.name in quantized
               for r in readers.get(n.input[0], [])):
            found[n.input[0]] = bound
    return found


def _ranges_cache(ranges: dict, tmp: Path, options: QuantOptions, flat: dict) -> Path:
    """`ranges` ({tensor: (lowest, highest)} by options' method), written as onnxruntime's
    calibration cache for quantize_static, with each tensor of `flat` (flat_below) starting
    no lower than where its reader is flat.  Entropy on a histogram of 512 bins:
    onnxruntime's own entropy calibrator has 128 bins for 128 quantized levels, one
    candidate range, the same as min-max.  Percentile as onnxruntime's (2048 bins of |x|)."""
    from onnxruntime.quantization.calibrate import (CalibrationMethod, TensorData,
                                                    TensorsData, save_tensors_data)
    ranges = dict(ranges)
    for name, bound in flat.items():
        if name in ranges:
            lo, hi = ranges[name]
            ranges[name] = (np.maximum(lo, bound).astype(lo.dtype), hi)
    method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
              "percentile": CalibrationMethod.Percentile}[options.calibration_method]
    data = TensorsData(method, {name: TensorData(lowest=lo, highest=hi)
                                for name, (lo, hi) in ranges.items()})
    cache = tmp / "ranges.json"
    save_tensors_data(data, cache)
    return cache


CALIBRATION_BYTES = 64 << 20      # float activations of one calibration chunk, about
MAX_CALIBRATION_ROWS = 64


def calibration_rows(model: onnx.ModelProto) -> int:
    """Rows per calibration chunk: onnxruntime holds the intermediate tensors of the chunk
    it runs (and calibrate.py the quantized ones of that chunk), so a model with large
    activations per row takes fewer rows (a sequence CNN over (1024, 16) inputs peaked at
    798 MiB with 64 rows, 278 MiB with 16, under onnxruntime's own calibrator)."""
    per_row = 0
    for v in model.graph.value_info:
        dims = v.type.tensor_type.shape.dim if v.type.HasField("tensor_type") else []
        known = [d.dim_value for d in dims[1:] if d.HasField("dim_value")]
        if dims and len(known) == len(dims) - 1:
            per_row += 4 * int(np.prod(known, dtype=np.int64))
    if per_row == 0:
        return MAX_CALIBRATION_ROWS
    return int(min(MAX_CALIBRATION_ROWS, max(1, CALIBRATION_BYTES // per_row)))


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference, as onnxruntime's pre-processing does (a model it cannot infer
    is quantized as it is: onnxruntime infers again itself)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return model
    return _with_contrib_types(inferred)


def _with_contrib_types(model: onnx.ModelProto) -> onnx.ModelProto:
    """The types and shapes of contrib operators' outputs (onnx does not know them, and
    onnxruntime's quantizer leaves a node whose input has no type in float: the MatMul
    after ddddocr's DynamicQuantizeLSTM), learned by running each such node alone
    (reader.infer_shapes), added as value infos."""
    if all(n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    g = model.graph
    typed = {v.name for v in (*g.value_info, *g.input, *g.output)
             if v.type.tensor_type.elem_type}
    missing = [o for n in g.node for o in n.output if o and o not in typed]
    if not missing:
        return model
    from tpuasm.compiler.front.reader import infer_shapes, skeleton
    probe = skeleton(model)             # no copy of the large weights
    for v in probe.graph.input:         # run alone on zeros: a dynamic dimension as 1
        for d in v.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") or d.dim_value <= 0:
                d.Clear()
                d.dim_value = 1
    try:
        _, dtypes = infer_shapes(probe, "the model")
    except Exception:                   # noqa: BLE001 - as before: the quantizer infers
        return model
    # the type only: the shapes were learned at a batch of 1
    g.value_info.extend(
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtypes[name]),
                                      None)
        for name in missing if name in dtypes)
    return model


def fuse_bias_adds(qdq: onnx.ModelProto, float_model: onnx.ModelProto) -> int:
    """Give the bias Add after a MatMul on a rank >= 3 tensor its fused form:

        DequantizeLinear(x) -> MatMul(., DequantizeLinear(W)) -> Add(., DequantizeLinear(
        b int32, scale x.scale * w.scale[n], zero point 0)) -> QuantizeLinear

    (quantize_static quantized the MatMul output and the bias like activations; the
    QuantizeLinear/DequantizeLinear pair between them goes).  Returns how many."""
    from tpuasm.compiler.front.prepare import matmul_bias_pairs
    g = qdq.graph
    nodes = {n.name: n for n in g.node}
    producer = {o: n for n in g.node for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    done = 0
    for mm_f, add_f, bias, rank in matmul_bias_pairs(float_model):
        mm, add = nodes.get(mm_f.name), nodes.get(add_f.name)
        if rank < 3 or mm is None or add is None:
            continue
        x_dq, w_dq = producer.get(mm.input[0]), producer.get(mm.input[1])
        if x_dq is None or w_dq is None or "DequantizeLinear" not in (x_dq.op_type,
                                                                        w_dq.op_type) \
                or x_dq.op_type != w_dq.op_type:
            continue
        x_scale = numpy_helper.to_array(inits[x_dq.input[1]]).astype(np.float32).reshape(-1)
        w_scale = numpy_helper.to_array(inits[w_dq.input[1]]).astype(np.float32).reshape(-1)
        scale = (x_scale[0] * w_scale).astype(np.float32)
        n = bias.size
        q = np.rint(bias.astype(np.float64) / scale.astype(np.float64))
        q = np.clip(q, -2**31 + 1, 2**31 - 1).astype(np.int32)
        # the Add reads the MatMul's output directly, and the int32 bias
        mm_out = mm.output[0]
        for i, name in enumerate(add.input):
            if name == mm_out or _reads(producer, name, mm_out):
                add.input[i] = mm_out
            else:
                b_name = f"{add.name}_bias_int32"
                per_channel = scale.size > 1      # else scalars: no axis (any opset)
                zero = np.zeros(n, np.int32) if per_channel else np.int32(0)
                g.initializer.extend([
                    numpy_helper.from_array(q, b_name),
                    numpy_helper.from_array(scale if per_channel else scale[0],
                                            b_name + "_scale"),
                    numpy_helper.from_array(zero, b_name + "_zero")])
                dq = helper.make_node("DequantizeLinear", [b_name, b_name + "_scale",
                                                           b_name + "_zero"],
                                      [b_name + "_dequantized"], name=b_name + "_dq",
                                      **({"axis": 0} if per_channel else {}))
                g.node.insert(list(g.node).index(add), dq)
                add.input[i] = dq.output[0]
        done += 1
    if done:
        _drop_dead(qdq)
    return done


def own_pool_scales(qdq: onnx.ModelProto, float_model: onnx.ModelProto, ranges: dict,
                    symmetric: bool, fixed=()) -> int:
    """Give each AveragePool whose windows can hold an even count the scale and zero point
    of its own calibrated range, where quantize_static gave its output its input's.  With
    equal scales the exact mean of a window of 2k values lands on a half step for one
    window sum in 2k; onnxruntime averages dequantized floats and its float32 error picks
    the side of such a tie, the TPU sums exactly and rounds half to even: a conv + 2x2
    AveragePool model was 97.3 % identical.  With the output's own range the ratio of the
    scales lands no exact mean on a half step (the TPU's mean is then onnxruntime's, as
    for QLinearAveragePool with two scales), and the output's step is no coarser.  The
    nodes after it that quantize_static gave the same parameters (a Flatten) get the new
    ones too, and the int32 bias of a Conv or Gemm reading them is quantized again at the
    new input scale x its weight's.
    `ranges` are by the float model's tensor names (a graph output's differs in `qdq`);
    `fixed`: tensors whose quantization the caller's overrides set.  Returns how many."""
    from onnxruntime.quantization.quant_utils import (QuantType, compute_scale_zp,
                                                      get_qmin_qmax_for_qType)
    g = qdq.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output if o}
    readers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    written = {n.name: n.output[0] for n in float_model.graph.node}
    done = 0
    for node in g.node:
        out = node.output[0] if node.op_type == "AveragePool" else None
        calibrated = written.get(node.name)
        if out is None or calibrated in fixed or calibrated not in ranges or \
                not _ties_possible(node):
            continue
        dq, qs = producer.get(node.input[0]), readers.get(out, [])
        if dq is None or dq.op_type != "DequantizeLinear" or len(qs) != 1 or \
                qs[0].op_type != "QuantizeLinear" or list(qs[0].input[1:3]) != \
                list(dq.input[1:3]) or len(dq.input) < 3 or dq.input[2] not in inits:
            continue                     # not quantize_static's shared form
        zero = numpy_helper.to_array(inits[dq.input[2]])
        if zero.dtype not in (np.uint8, np.int8) or zero.size != 1:
            continue
        qtype = QuantType.QUInt8 if zero.dtype == np.uint8 else QuantType.QInt8
        qmin, qmax = get_qmin_qmax_for_qType(qtype.tensor_type, symmetric=symmetric)
        lo, hi = (np.asarray(v, np.float32).reshape(()) for v in ranges[calibrated])
        new_zero, new_scale = compute_scale_zp(np.minimum(lo, 0), np.maximum(hi, 0),
                                               qmin, qmax, symmetric)
        old_scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
        if not np.isfinite(new_scale) or new_scale <= 0 or new_scale == old_scale:
            continue
        q = qs[0]
        names = (f"{out}_own_scale", f"{out}_own_zero_point")
        for array, name in ((np.asarray(new_scale, np.float32), names[0]),
                            (np.asarray(new_zero).astype(zero.dtype), names[1])):
            inits[name] = numpy_helper.from_array(array.reshape(()), name)
            g.initializer.append(inits[name])
        for pair in _same_scale_pairs(q, readers):
            pair.input[1], pair.input[2] = names
            if pair.op_type == "DequantizeLinear":
                _requantize_biases(qdq, float_model, pair, readers, producer, inits)
        done += 1
    if done:
        _drop_dead(qdq)
    return done


def _same_scale_pairs(q, readers: dict) -> list:
    """The QuantizeLinear `q` and its DequantizeLinears, and on from there those of each
    node that quantize_static quantized with its input's parameters (a Flatten, Reshape,
    MaxPool after the pool: its output's QuantizeLinear names q's scale and zero point)."""
    params = list(q.input[1:3])
    found, todo = [], [q]
    while todo:
        quant = todo.pop()
        found.append(quant)
        for dq in readers.get(quant.output[0], []):
            if dq.op_type != "DequantizeLinear" or list(dq.input[1:3]) != params:
                continue
            found.append(dq)
            for node in readers.get(dq.output[0], []):
                todo += [r for out in node.output for r in readers.get(out, [])
                         if r.op_type == "QuantizeLinear" and list(r.input[1:3]) == params
                         and r not in found and r not in todo]
    return found


def _requantize_biases(qdq, float_model, dq, readers, producer, inits) -> None:
    """The int32 bias of each Conv / Gemm that reads `dq` (its new scale) as its input,
    quantized as quantize_static does (round(b / (x.scale * w.scale)) in float64, the
    scale a float32 product) from the float model's bias."""
    floats = {t.name: t for t in float_model.graph.initializer}
    x_scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float32)
    for node in readers.get(dq.output[0], []):
        if node.op_type not in ("Conv", "Gemm") or node.input[0] != dq.output[0] or \
                len(node.input) < 3:
            continue
        w_dq, b_dq = producer.get(node.input[1]), producer.get(node.input[2])
        if w_dq is None or b_dq is None or "DequantizeLinear" != w_dq.op_type or \
                b_dq.op_type != "DequantizeLinear" or b_dq.input[0] not in inits:
            continue
        old = numpy_helper.to_array(inits[b_dq.input[0]])
        if old.dtype != np.int32:
            continue
        w_scale = numpy_helper.to_array(inits[w_dq.input[1]]).astype(np.float32)
        source = floats.get(b_dq.output[0])
        bias = numpy_helper.to_array(source) if source is not None else \
            old * numpy_helper.to_array(inits[b_dq.input[1]]).astype(np.float64)
        scale = (x_scale * w_scale).astype(np.float32)
        q = np.rint(np.asarray(bias, np.float64) / scale.astype(np.float64))
        q = np.clip(q, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
        names = [f"{b_dq.input[0]}_own", f"{b_dq.input[1]}_own"]
        g = qdq.graph
        g.initializer.extend([numpy_helper.from_array(q.reshape(old.shape), names[0]),
                              numpy_helper.from_array(scale.reshape(
                                  numpy_helper.to_array(inits[b_dq.input[1]]).shape), names[1])])
        b_dq.input[0], b_dq.input[1] = names


def _ties_possible(pool) -> bool:
    """Can a window of this AveragePool hold an even number of values (the only counts
    whose exact mean can land on a half step)?  An even kernel, or windows cut short where
    padding is not counted or ceil_mode runs past the edge."""
    from tpuasm.compiler.front.prepare import _attr
    kernel = list(_attr(pool, "kernel_shape", []))
    padded = any(_attr(pool, "pads", [])) or _attr(pool, "auto_pad", b"NOTSET") not in (
        b"NOTSET", b"VALID")
    cut = (padded and not _attr(pool, "count_include_pad", 0)) or _attr(pool, "ceil_mode", 0)
    return bool(cut) or not kernel or int(np.prod(kernel)) % 2 == 0


def _reads(producer, name: str, source: str) -> bool:
    """`name` is `source` through a QuantizeLinear -> DequantizeLinear pair."""
    dq = producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return False
    q = producer.get(dq.input[0])
    return q is not None and q.op_type == "QuantizeLinear" and q.input[0] == source


def _drop_dead(model: onnx.ModelProto) -> None:
    """Nodes whose outputs nothing reads, and initializers nothing reads."""
    g = model.graph
    outputs = {v.name for v in g.output}
    while True:
        used = {i for n in g.node for i in n.input} | outputs
        dead = [n for n in g.node if not any(o in used for o in n.output if o)]
        if not dead:
            break
        for n in dead:
            g.node.remove(n)
    used = {i for n in g.node for i in n.input} | outputs
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)

"""Reading an ONNX model: clear errors for files that are not models, opsets the compiler
does not know, dynamic shapes; the batch dimension fixed; shapes inferred.

Weights stay where they are: the model is parsed without its external data (memory-mapped
later by graph.tensor_array), and shape inference runs on a skeleton of the graph in which
every large initializer is only a declared input."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front import ortshapes
from tpuasm.compiler.front.graph import Graph
from tpuasm.compiler.front.weightonly import check_matmul_nbits
from tpuasm.compiler.front.widths import (centred_weights, signed_16bit,
                                          widen_4bit_constants)

MIN_OPSET = 10                     # QuantizeLinear / QLinearConv / MatMulInteger appear in 10
MAX_OPSET = onnx.defs.onnx_opset_version()
_SMALL = 4096                      # initializers kept in the shape-inference skeleton

QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul",
                 "MatMulInteger", "ConvInteger", "QGemm", "QLinearAdd", "QLinearMul",
                 "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool",
                 "QLinearGlobalAveragePool", "QLinearConcat", "QLinearSoftmax",
                 "DynamicQuantizeLinear"}


def read_model(path, scales: bool = True) -> onnx.ModelProto:
    """Parse and check an ONNX file (external data is not read); with `scales=False` its
    quantization scales are not checked (a quantized model read back as float: the
    calibration's replace them)."""
    path = Path(path)
    if not path.is_file():
        raise CompileError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:            # protobuf's DecodeError, OSError, ...: no common base
        raise CompileError(f"{path}: not a readable ONNX model (corrupt or truncated file?): "
                           f"{_first_line(e)}") from None
    if not _text_is_utf8(model):
        raise CompileError(f"{path}: not a readable ONNX model (corrupt file?): a name or "
                           f"text field is not UTF-8")
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise CompileError(f"{path}: not an ONNX model with a graph (empty or truncated file?)")
    _modernize_ir(model)
    check_opsets(model, path)
    reordered = _sort_nodes(model)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    checked = _checker_view(model)
    try:
        # by path when weights live in external files: the checker resolves them beside it
        onnx.checker.check_model(str(path) if external and not reordered and checked is model
                                 else checked)
    except Exception as e:
        raise CompileError(f"{path}: invalid ONNX model: {_first_line(e)}") from None
    _refuse_constant_outputs(model, path)
    _check_dimensions(model, path)
    _name_nodes(model)
    _check_weights(model, path, scales)
    check_matmul_nbits(model, path)
    widen_4bit_constants(model)       # QDQ tensors of the same values in the TPU's widths
    centred_weights(model)
    signed_16bit(model)
    return model


MAX_DIMENSION = (1 << 31) - 1     # what an OUTDIR's manifest may hold (outdir.py)


def _check_dimensions(model: onnx.ModelProto, path) -> None:
    """An input's or output's size beyond any memory is refused here: compiled, it made
    an OUTDIR whose manifest its own loader refused.  A negative size is a dynamic one."""
    for kind, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            if not v.type.HasField("tensor_type"):
                continue
            for i, d in enumerate(v.type.tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value < 0:
                    # Paddle's exporter writes -1 for "unknown", as onnxruntime reads it
                    d.Clear()
                    d.dim_param = f"{v.name}_dim{i}"
                elif d.HasField("dim_value") and not 0 <= d.dim_value <= MAX_DIMENSION:
                    raise CompileError(f"{path}: {kind} '{v.name}' dimension {i} is "
                                       f"{d.dim_value}: outside 0..{MAX_DIMENSION}")


# nodes whose constant inputs after the first are weights (and biases, BN statistics, gates)
_WEIGHTED_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization", "LSTM",
                 "GRU", "RNN", "QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger",
                 "ConvInteger", "LinearClassifier", "LinearRegressor"}


def _check_weights(model: onnx.ModelProto, path, check_scales: bool = True) -> None:
    """Every weight's data matches its shape and type (the checker does not look), and a
    float weight of a matrix node or a quantization scale holds no NaN or infinity (no
    quantization scale exists for it; numpy's casts of it warn).  External data is not read
    here."""
    users, scales, weights = {}, {}, set()
    for node in model.graph.node:
        for name in node.input:
            users.setdefault(name, node.name or node.op_type)
        if node.op_type in _WEIGHTED_OPS:
            weights.update(node.input[1:])
        if check_scales and node.op_type in ("QuantizeLinear", "DequantizeLinear") and \
                len(node.input) > 1:
            scales.setdefault(node.input[1], node.name or node.op_type)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
              onnx.TensorProto.BFLOAT16)
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue
        where = f"node {users[t.name]}: weight" if t.name in users else "weight"
        try:
            values = numpy_helper.to_array(t)
        except Exception as e:         # onnx raises ValueError, TypeError, KeyError, ...
            raise CompileError(f"{path}: {where} {t.name}: its data does not match its shape "
                               f"{list(t.dims)} and type ({_first_line(e)})") from None
        if t.data_type in floats and (t.name in weights or t.name in scales):
            # (another constant may hold them: an attention mask's -inf is ordinary)
            flat = values.reshape(-1)
            step = 1 << 22              # in chunks: no mask as large as the weight
            if not all(np.isfinite(flat[i:i + step]).all() for i in range(0, flat.size, step)):
                # (onnxruntime's quantizer writes an infinite scale for a range reaching an
                # attention mask's -inf)
                hint = "; --calibrate DATA reads a quantized model back as float, its " \
                       "scales replaced by the calibration's" if t.name in scales else ""
                raise CompileError(f"{path}: {where} {t.name} holds NaN or infinite "
                                   f"values{hint}")
            if t.name in scales and values.size and \
                    not (values >= np.finfo(np.float32).tiny).all():
                # a zero (or subnormal) scale divides by zero when the bias is requantized
                raise CompileError(f"{path}: node {scales[t.name]}: scale {t.name} holds "
                                   f"zero, negative or subnormal values (a scale must be "
                                   f"positive)")


def _refuse_constant_outputs(model: onnx.ModelProto, path) -> None:
    """An output computed from weights alone folds to a constant, which no step makes: the
    OUTDIR written would be refused when loaded.  Say so when compiling."""
    g = model.graph
    constant = {t.name for t in g.initializer}
    feeds = {v.name for v in g.input} - constant
    for node in g.node:
        has_graph = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for a in node.attribute)      # a subgraph may read any outer value
        if has_graph or feeds & set(node.input):
            feeds |= set(node.output)
        elif (node.input and all(i in constant or not i for i in node.input)) or \
                node.op_type == "Constant":
            constant |= set(node.output)
    for v in g.output:
        if v.name in constant and v.name not in feeds:
            raise CompileError(f"{path}: output '{v.name}' does not depend on any input of "
                               f"the model (it is computed from weights alone): nothing to "
                               f"compile")


def _text_is_utf8(message) -> bool:
    """protobuf parses a string field that is not UTF-8; reading it then gives bytes (upb)
    or raises UnicodeDecodeError (the pure-Python backend), somewhere later.  Read every
    string field of every nested message once here; numeric and bytes fields are not
    touched (a weight's data is not copied)."""
    from google.protobuf.descriptor import FieldDescriptor as F
    try:
        stack = [message]
        while stack:
            m = stack.pop()
            for field, value in m.ListFields():
                repeated = field.is_repeated if hasattr(field, "is_repeated") \
                    else field.label == F.LABEL_REPEATED
                if field.type == F.TYPE_MESSAGE:
                    stack.extend(value if repeated else [value])
                elif field.type == F.TYPE_STRING:
                    if any(not isinstance(v, str) for v in (value if repeated else [value])):
                        return False
    except UnicodeDecodeError:
        return False
    return True


def _sort_nodes(model: onnx.ModelProto) -> bool:
    """Put the nodes in an order where each comes after what it reads, its subgraphs'
    outer-scope reads included (onnxruntime's quantizer orders an If/Loop by its explicit
    inputs only); the model's own order wherever it is one.  Whether anything moved."""
    from tpuasm.compiler.front.graph import implicit_inputs
    nodes = list(model.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    needs = [{producer[t] for t in list(n.input) + implicit_inputs(n)
              if t in producer and producer[t] != i} for i, n in enumerate(nodes)]
    if all(all(j < i for j in deps) for i, deps in enumerate(needs)):
        return False
    import heapq
    waiting = [len(deps) for deps in needs]
    users: dict[int, list[int]] = {}
    for i, deps in enumerate(needs):
        for j in deps:
            users.setdefault(j, []).append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in users.get(i, ()):
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    if len(order) != len(nodes):              # a cycle: the checker will say so
        return False
    del model.graph.node[:]
    model.graph.node.extend(nodes[i] for i in order)
    return True


def _modernize_ir(model: onnx.ModelProto) -> None:
    """An IR version 3 model (PyTorch 0.3's exporter, onnx's own backend test data) lists
    every initializer among the graph's inputs, and the checker refuses a constant that is
    not one; every graph the compiler builds from it (the QDQ model, host parts) adds such
    constants.  From IR 4 on, initializers are constants of their own: drop them from the
    inputs and raise the version (onnxruntime reads the weights the same way either way)."""
    if model.ir_version >= 4:
        return
    constants = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in constants]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.ir_version = 4


def _first_line(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def check_opsets(model: onnx.ModelProto, path) -> None:
    _one_import_per_domain(model)
    versions = {o.domain or "": o.version for o in model.opset_import}
    default = versions.get("", versions.get("ai.onnx"))
    if default is None:
        raise CompileError(f"{path}: the model imports no ONNX opset")
    if default < MIN_OPSET and _upgrade(model):
        default = _UPGRADE_TO
    if not MIN_OPSET <= default <= MAX_OPSET:
        raise CompileError(f"{path}: opset {default} is not supported (supported: "
                           f"{MIN_OPSET}-{MAX_OPSET}); convert it with "
                           f"onnx.version_converter")
    # other operator domains (ai.onnx.ml, com.microsoft, a vendor's) are accepted: their
    # nodes run on the host, so onnxruntime must know them (or the model define them)
    local = {(f.domain, f.name) for f in model.functions}
    others = [n for n in model.graph.node if (n.domain or "") not in ("", "ai.onnx")
              and (n.domain, n.op_type) not in local]
    known = _runtime_operators() if others else None   # importing onnxruntime costs 20 MB
    for node in others if known is not None else ():
        domain = node.domain
        if (domain, node.op_type) not in known:
            raise CompileError(f"{path}: node '{node.name or node.op_type}' uses operator "
                               f"{node.op_type} of domain '{domain}', which onnxruntime "
                               f"does not know (so the host could not run it either)")


def _one_import_per_domain(model: onnx.ModelProto) -> None:
    """One opset import per domain, the newest: skl2onnx writes the ONNX domain twice for
    a model of scikit-learn operators alone (a Ridge), which onnxruntime runs but its
    quantizer refuses ("Failed to find proper ai.onnx domain")."""
    newest: dict[str, int] = {}
    for o in model.opset_import:
        domain = "" if o.domain == "ai.onnx" else o.domain
        newest[domain] = max(newest.get(domain, 0), o.version)
    if len(newest) != len(model.opset_import):
        del model.opset_import[:]
        model.opset_import.extend(helper.make_opsetid(d, v) for d, v in newest.items())


_RUNTIME_DOMAIN = "tpuasm.onnxruntime"     # the checker's name for onnxruntime's own ONNX ops


def _checker_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model`, or a copy for onnx's checker in which the ONNX-domain operators that onnx
    has no schema for at the model's opset but onnxruntime registers (its transformer
    tools' SimplifiedLayerNormalization, their LayerNormalization below opset 17) sit in a
    domain of their own: onnxruntime runs them, and they run on the host."""
    versions = {o.domain or "": o.version for o in model.opset_import}
    opset = versions.get("", versions.get("ai.onnx", 0))
    unknown = {n.op_type for n in model.graph.node if (n.domain or "") in ("", "ai.onnx")
               and not onnx.defs.has(n.op_type, opset, "")}
    if not unknown:
        return model
    runtime = _runtime_operators() or set()
    extensions = {op for op in unknown if ("", op) in runtime}
    if not extensions:
        return model                  # the checker names the first unknown operator
    view = onnx.ModelProto()
    view.CopyFrom(model)
    outside = [t for t in view.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    for t in outside:
        # declared as inputs: a copy in memory cannot resolve files beside the model (the
        # weights' own reading checks them)
        view.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        view.graph.initializer.remove(t)
    for node in view.graph.node:
        if (node.domain or "") in ("", "ai.onnx") and node.op_type in extensions:
            node.domain = _RUNTIME_DOMAIN
    view.opset_import.append(helper.make_opsetid(_RUNTIME_DOMAIN, 1))
    return view


def _runtime_operators() -> set | None:
    """(domain, op_type) of every operator onnxruntime's CPU build knows (None: unknown)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
        return {(s.domain, s.name) for s in ort_state.get_all_operator_schema()}
    except Exception:             # an onnxruntime without the listing: let it decide later
        return None


UPGRADED = "tpuasm.upgraded_from_opset"
_UPGRADE_TO = 13                   # per-axis DequantizeLinear (per-channel weights) from 13


def _upgrade(model: onnx.ModelProto) -> bool:
    """A model older than QuantizeLinear (opset < 10: scikit-learn exports of linear models
    use 9) converted in place by onnx's version converter; False when it cannot be."""
    versions = {o.domain or "": o.version for o in model.opset_import}
    try:
        converted = converted_to(model, _UPGRADE_TO)
    except Exception:
        return False
    model.CopyFrom(converted)
    model.metadata_props.add(key=UPGRADED, value=str(versions.get("", "")))
    return True


def converted_to(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` converted to `opset` by onnx's version converter (which raises when it
    cannot), its IR version raised to what that opset needs."""
    from onnx import version_converter
    from onnx.helper import find_min_ir_version_for
    converted = version_converter.convert_version(model, opset)
    converted.ir_version = max(converted.ir_version, find_min_ir_version_for(
        [o for o in converted.opset_import if (o.domain or "") in ("", "ai.onnx")]))
    return converted


def upgraded(model: onnx.ModelProto) -> bool:
    """Whether read_model converted the model to a newer opset (the file is the old one)."""
    return any(p.key == UPGRADED for p in model.metadata_props)


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique name (reports, .tasm comments and the debugger use them)."""
    seen = set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        node.name = name
        seen.add(name)


def is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in QUANTIZED_OPS for n in model.graph.node)


def _dims(value_info) -> list:
    shape = value_info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in shape.dim]


def input_signature(model: onnx.ModelProto) -> dict[str, list]:
    """Graph inputs (not initializers) -> dims (ints, names of symbolic dims, None)."""
    inits = {t.name for t in model.graph.initializer}
    return {v.name: _dims(v) for v in model.graph.input if v.name not in inits}


DEFAULT_BATCH = 64        # the TPU programs' batch when neither --batch nor the model fixes it


def fix_batch(model: onnx.ModelProto, batch: int | None, path, apply: bool = True,
              axes: dict | None = None) -> int:
    """Set every graph input's batch dimension (`axes`: input -> axis or None, from
    batch.input_axes; default: the first) to the batch; return it.  Without `batch`, the
    model's own fixed batch is used, DEFAULT_BATCH for a dynamic one.  A
    model with no batch axis at all runs once: batch 1.  `apply=False` only checks."""
    from tpuasm.compiler.front.batch import input_axes
    if axes is None:
        axes = input_axes(model, None, path)
    inits = {t.name for t in model.graph.initializer}
    chosen = batch
    batched = False
    for v in model.graph.input:
        if v.name in inits or axes.get(v.name) is None:
            continue
        batched = True
        axis = axes[v.name]
        first = _dims(v)[axis]
        if chosen is None:
            # a dynamic batch (what exporters write) gets the default; --batch sets another
            chosen = first if isinstance(first, int) and first > 0 else DEFAULT_BATCH
        if not apply:
            continue
        dim = v.type.tensor_type.shape.dim[axis]
        dim.Clear()
        dim.dim_value = chosen
    if not batched:
        return 1
    if chosen is None or chosen <= 0:
        raise CompileError(f"{path}: batch must be a positive integer, not {chosen}")
    from tpuasm.limits import MAX_BATCH
    if chosen > MAX_BATCH:
        # the model's own fixed batch is bounded as --batch is (its rows are allocated)
        raise CompileError(f"{path}: the model's batch {chosen:,} is above {MAX_BATCH:,} "
                           f"(spec/limits.md); pass a smaller --batch")
    for v in model.graph.output if apply else ():   # re-inferred with the new batch
        if v.type.HasField("tensor_type") and v.type.tensor_type.shape.dim:
            for dim in v.type.tensor_type.shape.dim:
                dim.Clear()
    if apply:
        from tpuasm.compiler.front.batch import forget_inner_shapes
        del model.graph.value_info[:]                # declared with the old batch
        forget_inner_shapes(model.graph)
    return chosen


def skeleton(model: onnx.ModelProto, known=()) -> onnx.ModelProto:
    """The graph with large initializers turned into declared inputs (no data copied) and
    the shape-keeping contrib operators as ONNX nodes onnx infers (ortshapes.stand_in);
    `known`: value infos learned elsewhere (ortshapes) declared in it."""
    g = model.graph
    small, declared = [], []
    for t in g.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL \
                and t.data_location != onnx.TensorProto.EXTERNAL:
            small.append(t)
        else:
            declared.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    inits = {t.name for t in g.initializer}
    inputs = [v for v in g.input if v.name not in inits] + declared
    elem_types = {t.name: t.data_type for t in g.initializer}
    nodes = [ortshapes.stand_in(n, elem_types) or n for n in g.node]
    graph = helper.make_graph(nodes, g.name or "model", inputs, list(g.output), small,
                              value_info=list(known))
    probe = helper.make_model(graph, opset_imports=list(model.opset_import))
    probe.ir_version = model.ir_version
    return probe


def infer_shapes(model: onnx.ModelProto, path) -> tuple[dict, dict]:
    """(tensor -> shape tuple, tensor -> numpy dtype) for every tensor whose shape is known.
    Nodes onnx does not know (contrib operators) are run alone by onnxruntime on zeros to
    learn their outputs (ortshapes.py), and inference goes on from there."""
    known: list = []
    tried: set[str] = set()
    while True:
        shapes, dtypes = _infer_once(model, path, known)
        todo = [n for n in ortshapes.unknown_nodes(model, shapes, dtypes)
                if n.name not in tried]
        if not todo:
            return shapes, dtypes
        for node in todo:
            tried.add(node.name)
            known += ortshapes.value_infos(ortshapes.run_alone(
                node, model, Path(path).parent, shapes, dtypes))


def _subgraph_values(graph: onnx.GraphProto) -> list:
    """The value infos of every subgraph nested in `graph`'s nodes (tensors only)."""
    found = []
    for node in graph.node:
        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else \
                list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
            for sub in subs:
                found += [v for v in [*sub.input, *sub.value_info, *sub.output]
                          if v.type.HasField("tensor_type")]
                found += _subgraph_values(sub)
    return found


def _strict_inference(probe: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(probe, check_type=True, strict_mode=True,
                                                 data_prop=True)
    except Exception:
        # onnx's data propagation reads the values of small integer tensors as shapes and
        # can reject a graph whose shapes are sound: BERT's mask indices, Range(0, 64)
        # unsqueezed to (64, 1, 1, 1) plus Range(0, 32) to (1, 1, 1, 32), are added as
        # if they were two shape vectors of different lengths.  Without it the shapes
        # still follow; folding makes the values constant round by round.
        return onnx.shape_inference.infer_shapes(probe, check_type=True, strict_mode=True)


def _infer_once(model: onnx.ModelProto, path, known) -> tuple[dict, dict]:
    probe = skeleton(model, known)
    try:
        inferred = _strict_inference(probe)
    except Exception as e:
        # Exporters sometimes declare an output shape the graph does not compute (ddddocr's
        # PyTorch export says (1, seqlen) for a (T, 1, classes) output, which shows once
        # the batch is fixed); onnxruntime only warns.  The computed shape wins: the
        # declaration is dropped from the model too, so no later session warns either.
        declared = [v for v in model.graph.output if v.type.tensor_type.HasField("shape")]
        if not declared:
            raise CompileError(f"{path}: shape inference failed: {_first_line(e)}") from None
        for graph in (model.graph, probe.graph):
            for v in graph.output:
                v.type.tensor_type.ClearField("shape")
        try:
            inferred = _strict_inference(probe)
        except Exception:
            raise CompileError(f"{path}: shape inference failed: {_first_line(e)}") from None
    shapes, dtypes = {}, {}
    g = inferred.graph
    # the shapes inside If/Loop bodies too (names are unique across subgraphs): a host If
    # counts the MACs of its branches (macs.py)
    for v in _subgraph_values(g):
        dims = _dims(v)
        if all(isinstance(d, int) for d in dims) and v.type.tensor_type.HasField("shape"):
            shapes[v.name] = tuple(dims)
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if not v.type.HasField("tensor_type"):
            continue
        dims = _dims(v)
        try:
            dtypes[v.name] = np.dtype(helper.tensor_dtype_to_np_dtype(
                v.type.tensor_type.elem_type))
        except Exception:
            pass
        if all(isinstance(d, int) for d in dims) and v.type.tensor_type.HasField("shape"):
            shapes[v.name] = tuple(dims)
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
        dtypes[t.name] = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    return shapes, dtypes


def load_graph(path, batch: int | None, model: onnx.ModelProto | None = None,
               batch_axes: dict | None = None, provenance=None, known_axes=None,
               fixed_batch: bool | None = None, rewrite=None) -> tuple[Graph, int]:
    """Read (or take) a model, find each tensor's batch axis (batch.py; `known_axes`: found
    on the float model before its batch was folded in; `fixed_batch`: whether the model as
    the user gave it had one, default: read off this model), fix the batch, fold constant
    subgraphs (fold.py), infer shapes: the graph the compiler works on.  `rewrite(model)`:
    run on the folded model (its Ifs on shapes inlined), folded again when it returns true."""
    from tpuasm.compiler.front.batch import carry_axes, has_fixed_batch, input_axes, tensor_axes
    from tpuasm.compiler.front.fold import fold_constants
    path = Path(path)
    model = read_model(path) if model is None else model
    if fixed_batch is None:
        fixed_batch = has_fixed_batch(model, batch_axes)
    axes = input_axes(model, batch_axes, path)
    tensor_axis = tensor_axes(model, axes, path)
    if known_axes:
        tensor_axis = carry_axes(model, known_axes, tensor_axis)
    batch = fix_batch(model, batch, path, axes=axes)
    fold_constants(model, path, provenance)
    if rewrite is not None and rewrite(model):
        fold_constants(model, path, provenance)
    shapes, dtypes = infer_shapes(model, path)
    return Graph(model, path.parent, shapes, dtypes, tensor_axis, fixed_batch), batch

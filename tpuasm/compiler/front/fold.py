"""Constant folding once the batch is fixed: shapes made static before matching.

Exporters compute shapes at run time: the pads of a Pad from Shape -> Gather -> Concat, the
target of a Reshape from Shape -> Slice -> Concat, a Cast or Unsqueeze of a constant.  With
the batch fixed every such value is known when compiling; left in the graph, it hides the
shapes of the tensors after it (`the shape of '.../Pad_output_0' is unknown`).  This pass
replaces each node whose result is known by an initializer:

- Shape and Size of a tensor whose shape is static;
- any deterministic operator of the default domain whose inputs are all constants.

An If whose condition becomes a constant is replaced by the branch it takes (ifs.py), and
the folding goes on inside it.

A value is computed only when shape inference already says how large it is, and only up to
MAX_ELEMENTS (a huge constant, say a ConstantOfShape of an image, is never materialised),
or MAX_WEIGHT_ELEMENTS for the weight input of a Conv, Gemm or MatMul; a weight of one value
repeated (ConstantOfShape: AlexNet's and VGG's fully connected weights in onnx's "light" zoo,
37.7 M and 102.8 M elements) up to generated_weight_limit(), made by numpy.full.
The DequantizeLinear of a weight (the matcher reads those) and model outputs are kept; a
QuantizeLinear of a constant float weight does fold (into the int8 weight the matcher looks
for behind its DequantizeLinear).  Every removed node is recorded in the Provenance.  Values are
computed on a one-node model: integer ones by onnx's reference evaluator (exact), float ones
by onnxruntime (the kernels the unfolded model would have run).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front.provenance import Provenance

MAX_ELEMENTS = 1 << 20
# a matrix operator's weight computed from constants (onnx's "light" zoo models make theirs
# with ConstantOfShape at load time) is a weight all the same: folded up to 64 MiB of float32
MAX_WEIGHT_ELEMENTS = 1 << 24
_WEIGHTED = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
# a matrix operator's weight of one value repeated (ConstantOfShape) is what a user's real
# model holds as an initializer: folded while the float32 copies the compile holds at its
# peak (the folded model, the file handed to the quantizer, its calibration session, the
# quantizer's own array: GENERATED_WEIGHT_COPIES; 5.5 measured on AlexNet and VGG-19, most
# of them onnxruntime's quantizer's) take at most half the machine's memory,
# and never beyond MAX_GENERATED_WEIGHT_ELEMENTS (1 GiB of float32)
MAX_GENERATED_WEIGHT_ELEMENTS = 1 << 28
GENERATED_WEIGHT_COPIES = 6
_ROUNDS = 8                        # fold, infer shapes again, fold what became static, ...
_IF_ROUNDS = 16                    # more when Ifs are inlined: one nesting level a round
KEEP = {"DequantizeLinear", "DynamicQuantizeLinear", "Constant",
        "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
        "Multinomial", "Bernoulli", "If", "Loop", "Scan"}
_SHAPE_OPS = {"Shape", "Size"}


def fold_constants(model: onnx.ModelProto, path, provenance=None,
                   max_elements: int = MAX_ELEMENTS) -> int:
    """Fold in place (the batch already fixed); the number of nodes removed."""
    splits_as_onnxruntime_runs_them(model)          # before any shape is read
    from tpuasm.compiler.front.reader import infer_shapes
    from tpuasm.compiler.front.ifs import inline_constant_ifs
    from tpuasm.compiler.front.loops import unroll_constant_loops
    total = 0
    made: set[str] = set()             # initializers this pass added
    rounds = 0
    while rounds < (_IF_ROUNDS if _has_if(model) else _ROUNDS):
        rounds += 1
        count = inline_constant_ifs(model, lambda name: _condition_value(model, name),
                                    provenance)
        count += unroll_constant_loops(model, lambda name: _condition_value(model, name),
                                       provenance)
        count += _weights_as_initializers(model, provenance)
        if not _candidates(model):
            total += count
            break
        shapes, dtypes = infer_shapes(model, path)
        count += _fold_once(model, Path(path).parent, shapes, dtypes, provenance,
                            max_elements, made)
        total += count
        if not count:
            break
    if total:
        _drop_unused(model, made)
    return total


def fold_float_model(path, model: onnx.ModelProto, batch, axes, provenance, workdir: Path
                     ) -> tuple[Path, onnx.ModelProto]:
    """A float model before quantization: (the file to quantize, its model).  When anything
    folds, a copy with the batch fixed and its constants folded, written to `workdir`;
    otherwise the model as it is (and a model whose weights live in external files is
    taken as it is: its copy could not find them)."""
    from tpuasm.compiler.front.reader import fix_batch, upgraded
    path = Path(path)
    external = any(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in model.graph.initializer)
    if external or not _candidates(model):
        copy = model
    else:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        fix_batch(copy, batch, path, axes=axes)
        scratch = Provenance.of(model)             # recorded only if the copy is taken
        try:
            folded = fold_constants(copy, path, scratch)
        except CompileError:          # shape inference fails: the quantized model will say
            folded = 0
        if not folded:
            copy = model
        elif provenance is not None:
            for name, why in scratch.folded.items():
                provenance.fold(name, why)
            for new, old in scratch.origin.items():     # nodes an inlined If brought
                provenance.derive(new, old)
    if copy is model and not upgraded(model):    # as it is on disk
        return path, model
    out = Path(workdir) / (path.stem + ".folded.onnx")
    from tpuasm.files import atomic_write
    atomic_write(out, copy.SerializeToString(), what="folded model")
    return out, copy


def splits_as_onnxruntime_runs_them(model: onnx.ModelProto) -> int:
    """Each SplitToSequence with a scalar split of 1 and keepdims=0 (torch.onnx writes
    tensor.nonzero(as_tuple=True) so: Longformer's global-attention indices) without its split
    input, which is how onnxruntime runs it: chunks of one, the axis dropped.  The spec
    ignores keepdims when a split is given, and onnx's shape inference, following it, keeps
    the axis: every tensor after it one rank too many, and a Shape of one folded into a
    constant onnxruntime then refuses.  The number rewritten."""
    g = model.graph
    scalars = {t.name: numpy_helper.to_array(t) for t in g.initializer if not t.dims}
    for node in g.node:
        if node.op_type == "Constant" and node.output and node.attribute \
                and node.attribute[0].name == "value" and not node.attribute[0].t.dims:
            scalars[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    rewritten = 0
    for node in g.node:
        if node.op_type != "SplitToSequence" or len(node.input) < 2 \
                or _attr(node, "keepdims", 1) != 0:
            continue
        split = scalars.get(node.input[1])
        if split is not None and split.ndim == 0 and int(split) == 1:
            del node.input[1:]
            rewritten += 1
    return rewritten


def generated_weight_limit() -> int:
    """Elements of the largest ConstantOfShape weight folded on this machine (see
    GENERATED_WEIGHT_COPIES); its physical memory, not what is free now, so that a compile
    decides the same way every time."""
    import os
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):       # not a POSIX system: assume 8 GiB
        memory = 8 << 30
    return max(MAX_WEIGHT_ELEMENTS, min(MAX_GENERATED_WEIGHT_ELEMENTS,
                                        memory // 2 // (4 * GENERATED_WEIGHT_COPIES)))


_WEIGHT_READERS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN",
                   "BatchNormalization"}


def _weights_as_initializers(model: onnx.ModelProto, provenance=None) -> int:
    """Constant nodes that hold a weight of a matrix or recurrent node made initializers
    (an If's inlined branch brings its weights so): the quantizer and the matcher look for
    weights there, and folding must not treat them as shape constants."""
    from tpuasm.compiler.front.prepare import constants_to_initializers
    weights = {i for n in model.graph.node if n.op_type in _WEIGHT_READERS
               for i in n.input[1:] if i}
    return constants_to_initializers(model, provenance, only=weights)


def _has_if(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "If" for n in model.graph.node)


def _condition_value(model: onnx.ModelProto, name: str):
    """The value of a one-element initializer or a Constant's output (an If's condition),
    else None."""
    from tpuasm.compiler.front.prepare import _constant_value
    for t in model.graph.initializer:
        if t.name == name:
            if t.data_location == onnx.TensorProto.EXTERNAL or \
                    int(np.prod(t.dims, dtype=np.int64)) > 1:
                return None
            return numpy_helper.to_array(t)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output and n.output[0] == name:
            return _constant_value(n)
    return None


def _candidates(model: onnx.ModelProto) -> bool:
    """Cheap test before shape inference: could any node fold?"""
    const = {t.name for t in model.graph.initializer}
    const |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    outputs = {v.name for v in model.graph.output}
    weights = {i for n in model.graph.node if n.op_type in _WEIGHT_READERS
               for i in n.input[1:] if i}
    for node in model.graph.node:
        if node.op_type == "If" and node.input and node.input[0] in const:
            return True                  # an If on a known condition: inlined
        if node.op_type == "Loop" and node.input and node.input[0] in const:
            return True                  # a Loop of a known trip count: unrolled (loops.py)
        if node.op_type == "Constant" and node.output and node.output[0] in weights:
            return True                  # a weight held by a Constant: an initializer
        if not _foldable_kind(node) or any(o in outputs for o in node.output):
            continue
        if node.op_type in _SHAPE_OPS or all(not i or i in const for i in node.input):
            return True
    return False


def _foldable_kind(node: onnx.NodeProto) -> bool:
    return (node.domain or "") in ("", "ai.onnx") and node.op_type not in KEEP and \
        not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in node.attribute)


def _fold_once(model, base_dir: Path, shapes: dict, dtypes: dict, provenance, max_elements,
               made: set) -> int:
    from tpuasm.compiler.front.graph import tensor_array
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    constants = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}
    outputs = {v.name for v in g.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                 onnx.defs.onnx_opset_version())
    keep, new_inits, count = [], [], 0
    weights = {n.input[1] for n in g.node if n.op_type in _WEIGHTED and len(n.input) > 1}
    generated = generated_weight_limit()

    def limit(node, name) -> int:
        if name not in weights:
            return max_elements
        return max(max_elements, generated if node.op_type == "ConstantOfShape"
                   else MAX_WEIGHT_ELEMENTS)

    def value_of(name):
        if name in inits:
            return np.asarray(tensor_array(inits[name], base_dir))
        attrs = {a.name: a for a in constants[name].attribute}
        return np.asarray(numpy_helper.to_array(attrs["value"].t)) if "value" in attrs \
            else None                      # value_float, sparse_value, ...: left alone

    for node in g.node:
        values = None
        outs = [o for o in node.output if o]
        if _foldable_kind(node) and not any(o in outputs for o in outs) and \
                all(_small(o, shapes, dtypes, limit(node, o)) for o in outs):
            values = _evaluate(node, shapes, dtypes, value_of, inits, constants, opset)
        if values is None:
            keep.append(node)
            continue
        for name, value in zip(outs, values):
            tensor = numpy_helper.from_array(np.asarray(value, dtypes[name]), name)
            new_inits.append(tensor)
            inits[name] = tensor
            made.add(name)
        count += 1
        if provenance is not None:
            what = ", ".join(f"{o} {tuple(shapes[o])}" for o in outs)
            provenance.fold(node.name, f"constant-folded: {what} computed when compiling "
                                       f"(the batch fixed)")
    if count:
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(new_inits)
    return count


def _small(name, shapes, dtypes, max_elements) -> bool:
    shape = shapes.get(name)
    return shape is not None and name in dtypes and \
        int(np.prod(shape, dtype=np.int64)) <= max_elements


def _evaluate(node, shapes, dtypes, value_of, inits, constants, opset):
    """The node's output values, or None when they are not constant (or not computable)."""
    if node.op_type in _SHAPE_OPS:
        shape = shapes.get(node.input[0])
        if shape is None:
            return None
        if node.op_type == "Size":
            return [np.int64(np.prod(shape, dtype=np.int64))]
        rank = len(shape)
        start = _attr(node, "start", 0)
        end = _attr(node, "end", rank)
        start, end = (max(0, min(rank, s + rank if s < 0 else s)) for s in (start, end))
        return [np.array(shape[start:end], np.int64)]
    names = [i for i in node.input if i]
    if not all(i in inits or i in constants for i in names):
        return None
    feeds = {}
    for name in names:
        value = value_of(name)
        if value is None:
            return None
        feeds[name] = value
    if node.op_type == "ConstantOfShape":
        return _filled(node, feeds[names[0]], dtypes.get(node.output[0]))
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype),
                                            list(v.shape)) for n, v in feeds.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    one = helper.make_model(helper.make_graph([node], "fold", inputs, outs),
                            opset_imports=[helper.make_opsetid("", opset)])
    # integer results (shape arithmetic) from onnx's evaluator: exact and quick; any float
    # from onnxruntime, whose kernels the unfolded model would have run
    exact = all(dtypes.get(o, np.dtype(np.float32)).kind in "iub"
                for o in node.output if o)
    try:
        if exact:
            from onnx.reference import ReferenceEvaluator
            return ReferenceEvaluator(one).run(None, feeds)
        from tpuasm.compiler.ort import session
        return session(one).run(None, feeds)
    except Exception:              # it cannot: the node stays, onnxruntime runs it later
        return None


def _filled(node, shape, dtype):
    """ConstantOfShape's value without a one-node session: one array (a large weight's
    float32 copy made once; onnxruntime would hold its own beside it)."""
    value = _attr(node, "value", None)
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else \
        np.zeros(1, np.float32)
    if fill.size != 1 or (dtype is not None and np.dtype(dtype) != fill.dtype):
        return None
    dims = [int(d) for d in np.asarray(shape).reshape(-1)]
    if any(d < 0 for d in dims):
        return None
    return [np.full(dims, fill[0], fill.dtype)]


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _drop_unused(model: onnx.ModelProto, made: set) -> None:
    """Folded values that no node reads any more (the inside of a folded chain)."""
    from tpuasm.compiler.front.graph import implicit_inputs
    g = model.graph
    read = {i for n in g.node for i in list(n.input) + implicit_inputs(n)}
    read |= {v.name for v in g.output}
    kept = [t for t in g.initializer if t.name not in made or t.name in read]
    if len(kept) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(kept)

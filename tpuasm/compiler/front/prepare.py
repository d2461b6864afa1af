"""Rewrites of the FLOAT model before quantization, so that its matrix work has the forms the
TPU maps (docs/compiler.md, "Preparing a float model"):

- an Einsum of an activation and a constant weight as a MatMul (einsumforms.py);
- a dilated Conv and a ConvTranspose as plain Convs (convforms.py);
- a Conv (and the Relu and pooling after it) whose image the Unified Buffer cannot hold as
  bands of rows (banding.py);
- a BatchNormalization folded into the Conv / Gemm / MatMul (constant weight) before it;
- a Split or Slices of a matrix node's output channels (a GLU, ShuffleNet's channel
  split) as one matrix node per part (splitforms.py);
- MatMul(x, W) + Add(b) with a constant weight and bias: one Gemm when x is (batch, K); for
  x of rank >= 3 the pair stays and quantize.py gives it an int32 bias (the fused-bias form);
- LSTM, GRU and RNN nodes unrolled over their static sequence into per-step Gemms (constant
  weights: on the TPU) and float gate arithmetic (Add, Sigmoid, Tanh, Mul, Sub);
- a GELU written out in primitives (x^3, Tanh, ...) as one com.microsoft FastGelu / Gelu
  node (gelu.py): quantized at its input and output only, one lookup table on the TPU;
- a Div by a float constant as a Mul by its reciprocal (VMUL takes it; the product differs
  from the quotient by at most one float32 rounding);
- a ReduceMean over the spatial axes before a classifier (x.mean((2, 3))) as a
  GlobalAveragePool;
- scikit-learn's linear models as skl2onnx writes them (ai.onnx.ml LinearClassifier and
  LinearRegressor): a Gemm, its post-transform, and an ArgMax over the class labels.

Each rewrite is one function over the ModelProto that records, in a Provenance, which input
node each new node came from and which nodes disappeared.  The rewrites never change what
the model computes beyond float rounding (the tests compare with onnxruntime)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.front.provenance import Provenance


@dataclass
class Prepared:
    """The rewritten model, where its nodes came from, and why some were left alone."""
    model: onnx.ModelProto
    provenance: Provenance
    reasons: dict[str, str] = field(default_factory=dict)   # node -> why it was not rewritten
    # nodes the rewrites want left in float on the host (a long LSTM's cell state):
    # node -> why; the quantizer keeps them float as it does --keep-float's
    keep_float: dict[str, str] = field(default_factory=dict)
    # tensors that are one quantity at different steps of an unrolled LSTM/GRU (the input
    # x_t, each gate, h_t): group -> names.  quantize.py gives each group one range, the
    # union over the steps: ranges per step, calibrated on few sequences, do not hold for
    # the next data (a one-sequence calibration gives each step one sample)
    tied: dict[str, list[str]] = field(default_factory=dict)


def prepare(model: onnx.ModelProto, provenance: Provenance | None = None,
            room=None, base_dir=None) -> Prepared:
    """Apply every rewrite, in place, in the order that lets each feed the next (a
    BatchNormalization after a MatMul becomes a bias Add, which the fusion then takes).
    `room` (codegen/capacity.py Room: the back end's capacity on the machine the model is
    compiled for): with it, a Conv (with its Relu and pool) whose image the Unified Buffer
    cannot hold is cut into bands of rows (banding.py: last, on the Convs as the other
    rewrites leave them).  `base_dir` (the model's folder, for its external data): with it,
    the outputs of nodes outside the ONNX domain get their types and shapes declared from
    onnxruntime first (ortshapes.py): the rewrites read onnx inference, which stops there."""
    prov = provenance if provenance is not None else Provenance.of(model)
    reasons: dict[str, str] = {}
    if base_dir is not None:
        from tpuasm.compiler.front.ortshapes import declare_foreign_outputs
        declare_foreign_outputs(model, Path(base_dir))
    from tpuasm.compiler.front.nchwc import unblock_nchwc
    from tpuasm.compiler.front.ortfusions import unfuse_float_operators
    unblock_nchwc(model, prov, reasons)            # onnxruntime's saved layouts and
    unfuse_float_operators(model, prov, reasons)   # fusions: standard nodes
    from tpuasm.compiler.front.gemmforms import rewrite_scaled_gemms
    rewrite_scaled_gemms(model, prov)            # a Gemm's alpha and beta into its constants
    constants_to_initializers(model, prov)     # first: every rewrite reads initializers
    from tpuasm.compiler.front.einsumforms import hoist_past_head_splits, rewrite_einsums
    rewrite_einsums(model, prov, reasons)      # a product with a weight: a MatMul
    hoist_past_head_splits(model)              # a bias after a split into heads: the MatMul's
    tied: dict[str, list[str]] = {}
    keep_float: dict[str, str] = {}
    from tpuasm.compiler.front.convforms import rewrite_convolutions
    rewrite_convolutions(model, prov, reasons)     # before BN folding: a Conv takes its BN
    rewrite_linear_models(model, prov, reasons)
    from tpuasm.compiler.front.svmforms import rewrite_linear_svms
    rewrite_linear_svms(model, prov)                 # a linear kernel's products: one Gemm
    unroll_recurrent(model, prov, reasons, tied, keep_float)
    fold_batch_norms(model, prov)
    batch_norms_as_affines(model, prov)    # the ones no Conv/Gemm before them takes
    fold_constant_affines(model, prov)
    from tpuasm.compiler.front.gelu import fuse_gelu_chains
    fuse_gelu_chains(model, prov)        # a GELU in primitives: one node, one lookup table
    divisions_as_products(model, prov)
    sums_as_additions(model, prov)
    means_as_global_pools(model, prov)       # x.mean((2, 3)) before a classifier
    fuse_matmul_bias(model, prov)
    from tpuasm.compiler.front.splitforms import split_matrix_outputs
    split_matrix_outputs(model, prov)          # a GLU's Split: one Conv per part
    if room is not None:
        from tpuasm.compiler.front.banding import band_convolutions
        band_convolutions(model, prov, room, reasons)
    drop_unused_initializers(model)
    return Prepared(model, prov, reasons, keep_float, tied)


# --- the model as a small mutable index ------------------------------------------------

class _Index:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.inits = {t.name: t for t in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.consumers: dict[str, list] = {}
        for n in g.node:
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.outputs = {v.name for v in g.output}
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          13)
        self._taken: set | None = None         # every tensor and node name (unique())

    def const(self, name: str) -> np.ndarray | None:
        t = self.inits.get(name) if name else None
        if t is None or t.data_location == onnx.TensorProto.EXTERNAL:
            return None                # not read into the model: no rewrite of its node
        return numpy_helper.to_array(t)

    def sole_consumer(self, tensor: str):
        cons = self.consumers.get(tensor, [])
        if len(cons) != 1 or tensor in self.outputs:
            return None
        return cons[0]

    def add_init(self, array: np.ndarray, name: str) -> str:
        name = self.unique(name)
        t = numpy_helper.from_array(array, name)
        self.model.graph.initializer.append(t)
        self.inits[name] = t
        return name

    def unique(self, name: str) -> str:
        """`name`, or `name_1`, `name_2`, ...: no tensor or node of the model has it."""
        if self._taken is None:
            g = self.model.graph
            self._taken = ({t.name for t in g.initializer} | {v.name for v in g.input}
                           | {o for n in g.node for o in n.output} | {n.name for n in g.node})
        base, i = name, 1
        while name in self._taken:
            name = f"{base}_{i}"
            i += 1
        self._taken.add(name)
        return name


# nodes whose output is zeros wherever their first input is (a state's Slice of a zero tensor)
_SAME_ZEROS = {"Slice", "Reshape", "Squeeze", "Unsqueeze", "Expand", "Transpose", "Identity",
               "Cast", "Gather", "Flatten"}


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _set_attr(node, name, value) -> None:
    for i, a in enumerate(node.attribute):
        if a.name == name:
            del node.attribute[i]
            break
    node.attribute.append(helper.make_attribute(name, value))


def inferred_values(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Tensor -> its value info from onnx shape inference of the model without its weights
    ({} when it fails)."""
    try:
        g = onnx.shape_inference.infer_shapes(_without_weights(model)).graph
    except Exception:                     # noqa: BLE001 - no shapes: none known
        return {}
    return {v.name: v for v in [*g.input, *g.value_info, *g.output]
            if v.type.HasField("tensor_type")}


def _ranks(model: onnx.ModelProto) -> dict[str, tuple]:
    """Tensor -> dims (ints or None) from onnx shape inference ({} when it fails)."""
    out = {}
    for v in inferred_values(model).values():
        t = v.type.tensor_type
        if t.HasField("shape"):
            out[v.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                for d in t.shape.dim)
    for t in model.graph.initializer:
        out[t.name] = tuple(t.dims)
    return out


def constants_to_initializers(model: onnx.ModelProto, prov: Provenance | None,
                              only: set | None = None) -> int:
    """Constant nodes (those whose output is in `only`, when given) as initializers.  Some
    exporters (paddle2onnx, older PyTorch) give every weight as a Constant node; the quantizer
    and the rewrites here only take an initializer as a weight, so such a model would
    otherwise stay float on the host.  Returns how many."""
    g = model.graph
    outputs = {v.name for v in g.output}
    keep, made = [], []
    for node in g.node:
        out = node.output[0] if node.output else ""
        value = _constant_value(node) if out not in outputs and \
            (only is None or out in only) else None
        if value is None:
            keep.append(node)
            continue
        made.append(numpy_helper.from_array(value, out))
        if prov is not None:
            prov.fold(node.name, "a Constant: its value is an initializer (a weight) of the "
                                 "nodes that read it")
    if made:
        del g.node[:]
        g.node.extend(keep)
        g.initializer.extend(made)
    return len(made)


def _constant_value(node) -> np.ndarray | None:
    """A default-domain Constant's numeric value; None for anything else (a sparse or string
    value is left as the node it is)."""
    if node.op_type != "Constant" or (node.domain or "") not in ("", "ai.onnx") \
            or len(node.attribute) != 1 or len(node.output) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        if attr.t.data_type == onnx.TensorProto.STRING \
                or attr.t.data_location == onnx.TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(attr.t)
    kinds = {"value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    if attr.name in kinds:
        return np.asarray(helper.get_attribute_value(attr), kinds[attr.name])
    return None

# initializers shape inference may need the values of (a Reshape's shape, pads, axes)
_VALUE_ELEMENTS = 4096


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model for shape inference: its large initializers (weights) declared as graph
    inputs of their type and shape instead.  Shape inference serializes the model it is
    given: with a 400 MB weight that is seconds and the weight's size again in memory per
    call, and no shape depends on a weight's values."""
    g = model.graph
    big = [t for t in g.initializer if int(np.prod(t.dims, dtype=np.int64)) > _VALUE_ELEMENTS]
    if not big:
        return model
    declared = {v.name for v in g.input}
    inputs = list(g.input) + [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                              for t in big if t.name not in declared]
    small = [t for t in g.initializer if int(np.prod(t.dims, dtype=np.int64)) <= _VALUE_ELEMENTS]
    graph = helper.make_graph(list(g.node), g.name, inputs, list(g.output), small,
                              value_info=list(g.value_info),
                              sparse_initializer=list(g.sparse_initializer))
    light = helper.make_model(graph, opset_imports=list(model.opset_import),
                              functions=list(model.functions))
    light.ir_version = model.ir_version
    return light


def drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Initializers no node reads any more (weights replaced by their rescaled copies)."""
    g = model.graph
    used = _names_read(g.node) | {v.name for v in g.output}
    declared = {v.name for v in g.input}
    keep = [t for t in g.initializer if t.name in used or t.name in declared]
    if len(keep) != len(g.initializer):
        del g.initializer[:]
        g.initializer.extend(keep)


def _names_read(nodes) -> set[str]:
    """Every tensor name the nodes read, the subgraphs' (If, Loop, Scan bodies: they may read
    the outer graph's tensors by name) included."""
    names = set()
    for n in nodes:
        names.update(i for i in n.input if i)
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                names |= _names_read(sub.node)
    return names


# --- BatchNormalization folding --------------------------------------------------------

def fold_batch_norms(model: onnx.ModelProto, prov: Provenance) -> int:
    """Fold each inference-mode BatchNormalization into the Conv, Gemm or MatMul (constant
    weight, (batch, K) input) whose output only it reads, into a MatMul through a merge of
    its output's rows (_fold_through_row_merge), or else into the Gemm that alone reads it
    (_fold_into_next_gemm).  Returns how many were folded."""
    idx = _Index(model)
    ranks = None
    gone = []
    for bn in list(model.graph.node):
        params = _batch_norm_params(idx, bn)
        if params is None:
            continue
        producer = idx.producer.get(bn.input[0])
        factor, shift = params
        folded = False
        if producer is not None and idx.sole_consumer(bn.input[0]) is bn:
            if producer.op_type in ("MatMul", "Flatten", "Reshape") and ranks is None:
                ranks = _ranks(model)
            if producer.op_type in ("Flatten", "Reshape"):
                folded = _fold_through_row_merge(idx, producer, bn, factor, shift, ranks, prov)
            elif _fold_into(idx, producer, factor, shift, ranks or {}):
                producer.output[0] = bn.output[0]
                idx.producer[bn.output[0]] = producer
                prov.fold(bn.name, f"folded into {producer.op_type} '{producer.name}'")
                folded = True
        if folded or _fold_into_next_gemm(idx, bn, params, prov):
            gone.append(bn)
    for bn in gone:
        model.graph.node.remove(bn)
    return len(gone)


def _fold_through_row_merge(idx: _Index, merge, bn, factor, shift, ranks, prov) -> bool:
    """A BatchNormalization over the rows of a MatMul's output merged to 2-D (LeViT's
    Linear + BatchNorm1d: MatMul (B, T, C) -> Flatten/Reshape (B*T, C) -> BN): the merge
    keeps the channel axis last, so the BN is the MatMul's weight columns times its factor
    and a bias Add of its shift after the MatMul (which the bias fusion then takes).  The
    merge then writes the BN's output.  False (nothing changed) for any other form."""
    mm = idx.producer.get(merge.input[0])
    if mm is None or mm.op_type != "MatMul" or idx.sole_consumer(merge.input[0]) is not merge:
        return False
    w = idx.const(mm.input[1])
    n = factor.size
    merged, before = ranks.get(merge.output[0], ()), ranks.get(merge.input[0], ())
    if w is None or w.ndim != 2 or w.shape[1] != n or len(merged) != 2 or merged[1] != n \
            or len(before) < 2 or before[-1] != n:
        return False
    mm.input[1] = idx.add_init((w.astype(np.float64) * factor[None, :]).astype(np.float32),
                               f"{mm.name}_w_bn")
    biased, add = idx.unique(f"{mm.output[0]}_bn"), idx.unique(f"{bn.name}_shift_add")
    shift_name = idx.add_init(shift.astype(np.float32), f"{bn.name}_shift")
    node = helper.make_node("Add", [mm.output[0], shift_name], [biased], name=add)
    nodes = idx.model.graph.node
    nodes.insert(list(nodes).index(mm) + 1, node)      # graph order: after its MatMul
    merge.input[0] = biased
    merge.output[0] = bn.output[0]
    idx.producer[bn.output[0]] = merge
    prov.derive(add, mm.name)                          # the MatMul's bias, like its weight
    prov.fold(bn.name, f"folded into MatMul '{mm.name}'")
    return True


def _gemm_terms(idx, gemm, n: int):
    """(alpha, beta, C as n float64s) of a Gemm with n outputs, or None when its C is not
    a constant of 1 or n values (per row, a C the fold cannot carry)."""
    alpha, beta = float(_attr(gemm, "alpha", 1.0)), float(_attr(gemm, "beta", 1.0))
    c = None
    if len(gemm.input) > 2 and gemm.input[2]:
        c = idx.const(gemm.input[2])
        if c is None or c.size not in (1, n) or (c.ndim == 2 and c.shape[0] != 1):
            return None
    return alpha, beta, (np.zeros(n) if c is None else
                         np.broadcast_to(c.astype(np.float64).reshape(-1), n))


def _fold_into_next_gemm(idx: _Index, bn, params, prov) -> bool:
    """A BatchNormalization on a (batch, C) tensor whose one reader is a Gemm with a constant
    weight (LeViT's classifier: BatchNorm1d then Linear): Gemm(x * f + s) is Gemm(x) with
    the weight's rows (the C axis) times f and s @ W added to its bias.  False (nothing
    changed) for any other form."""
    gemm = idx.sole_consumer(bn.output[0])
    if gemm is None or gemm.op_type != "Gemm" or gemm.input[0] != bn.output[0] \
            or _attr(gemm, "transA", 0) or len(gemm.input) < 2:
        return False
    factor, shift = params
    w = idx.const(gemm.input[1])
    trans_b = _attr(gemm, "transB", 0)
    if w is None or w.ndim != 2 or (w.shape[1] if trans_b else w.shape[0]) != factor.size:
        return False
    w64 = (w.T if trans_b else w).astype(np.float64)          # (C, N)
    n = w64.shape[1]
    terms = _gemm_terms(idx, gemm, n)
    if terms is None:
        return False
    alpha, beta, b = terms
    new_w = alpha * w64 * factor[:, None]
    _set_inputs(idx, gemm, new_w.T if trans_b else new_w, beta * b + alpha * (shift @ w64))
    _set_attr(gemm, "alpha", 1.0)
    _set_attr(gemm, "beta", 1.0)
    gemm.input[0] = bn.input[0]
    readers = idx.consumers.get(bn.input[0], [])
    readers[readers.index(bn)] = gemm
    prov.fold(bn.name, f"folded into Gemm '{gemm.name}'")
    return True


def batch_norms_as_affines(model: onnx.ModelProto, prov: Provenance) -> int:
    """Each inference-mode BatchNormalization left after folding (its input made by a
    Concat, a pool, the model's input: DenseNet's and pre-activation ResNets' BN -> Relu ->
    Conv) -> Mul(x, factor) -> Add(shift), per channel: VMUL and VADD take a constant per
    channel, where a BatchNormalization node has no TPU mapping.  Returns how many."""
    idx = _Index(model)
    ranks = None
    rewritten, done = [], 0
    for bn in model.graph.node:
        params = _batch_norm_params(idx, bn)
        if params is not None and ranks is None:
            ranks = _ranks(model)
        rank = len(ranks.get(bn.input[0], ())) if params is not None else 0
        if params is None or rank < 2:
            rewritten.append(bn)
            continue
        factor, shift = params
        per_channel = (factor.size,) + (1,) * (rank - 2)          # C of (N, C, ...)
        scale = idx.add_init(factor.astype(np.float32).reshape(per_channel), f"{bn.name}_factor")
        offset = idx.add_init(shift.astype(np.float32).reshape(per_channel), f"{bn.name}_shift")
        scaled = idx.unique(f"{bn.name}_scaled")
        mul, add = idx.unique(f"{bn.name}_mul"), idx.unique(f"{bn.name}_add")
        rewritten += [helper.make_node("Mul", [bn.input[0], scale], [scaled], name=mul),
                      helper.make_node("Add", [scaled, offset], [bn.output[0]], name=add)]
        prov.derive(mul, bn.name)
        prov.derive(add, bn.name)
        done += 1
    if done:
        del model.graph.node[:]
        model.graph.node.extend(rewritten)
    return done


def _batch_norm_params(idx: _Index, bn):
    """(factor, shift) as float64 per channel of an inference-mode BatchNormalization with
    constant parameters; None for any other node."""
    if bn.op_type != "BatchNormalization" or len([o for o in bn.output if o]) != 1 \
            or _attr(bn, "spatial", 1) == 0 or _attr(bn, "training_mode", 0):
        return None                    # training outputs / per-element statistics: stays
    params = [idx.const(bn.input[i]) if i < len(bn.input) else None for i in range(1, 5)]
    if any(p is None for p in params):
        return None
    gamma, beta, mean, var = (p.astype(np.float64).reshape(-1) for p in params)
    factor = gamma / np.sqrt(var + float(_attr(bn, "epsilon", 1e-5)))
    return factor, beta - mean * factor


_AFFINE = {"Mul": lambda c: (c, 0.0), "Div": lambda c: (1.0 / c, 0.0),
           "Add": lambda c: (1.0, c), "Sub": lambda c: (1.0, -c)}


def fold_constant_affines(model: onnx.ModelProto, prov: Provenance) -> int:
    """Fold a Mul, Div, Add or Sub by a constant (one value, or one per output channel) into
    the Conv or Gemm whose output only it reads, as BatchNormalization is folded.  PaddleOCR's
    "learnable affine" blocks put a scalar Mul and Add after every Conv: quantized as they
    stand, each is another 8-bit rounding of the layer's output, and the OCR model lost a
    tenth of its characters to them.  Returns how many were folded."""
    idx = _Index(model)
    gone = []
    for node in list(model.graph.node):
        if node.op_type not in _AFFINE or len(node.input) != 2:
            continue
        for x_at in (0, 1):
            if node.op_type in ("Div", "Sub") and x_at == 1:
                break                              # c / x and c - x are not affine in x
            producer = idx.producer.get(node.input[x_at])
            c = idx.const(node.input[1 - x_at])
            if producer is None or c is None or producer.op_type not in ("Conv", "Gemm") \
                    or idx.sole_consumer(node.input[x_at]) is not node:
                continue
            n = _output_channels(idx, producer)
            per_channel = _per_channel_constant(c, n, producer, idx)
            if per_channel is None or (node.op_type == "Div" and not per_channel.all()):
                continue
            factor, shift = _AFFINE[node.op_type](per_channel)
            factor = np.broadcast_to(np.asarray(factor, np.float64), n)
            shift = np.broadcast_to(np.asarray(shift, np.float64), n)
            if not _fold_into(idx, producer, factor, shift, {}):
                continue
            producer.output[0] = node.output[0]
            idx.producer[node.output[0]] = producer
            prov.fold(node.name, f"folded into {producer.op_type} '{producer.name}'")
            gone.append(node)
            break
    for node in gone:
        model.graph.node.remove(node)
    return len(gone)


def _output_channels(idx: _Index, node) -> int | None:
    w = idx.const(node.input[1]) if len(node.input) > 1 else None
    if w is None or w.ndim < 2:
        return None
    if node.op_type == "Gemm":
        return w.shape[0] if _attr(node, "transB", 0) else w.shape[1]
    return w.shape[0]


def _per_channel_constant(c: np.ndarray, n: int | None, node, idx: _Index):
    """`c` as n float64 values, one per output channel of `node`, if it broadcasts so
    against the node's output (one value, or n along the channel axis); else None."""
    if n is None or not np.all(np.isfinite(c)):
        return None
    c = c.astype(np.float64)
    if c.size == 1:
        return np.full(n, c.reshape(-1)[0])
    w = idx.const(node.input[1])
    channel_axis_from_end = (w.ndim - 1) if node.op_type == "Conv" else 1   # C of NCHW / N of (M, N)
    if c.size != n or c.ndim < channel_axis_from_end or c.shape[-channel_axis_from_end] != n:
        return None
    if node.op_type == "Conv" and c.ndim > w.ndim:
        return None
    return c.reshape(-1)


def _fold_into(idx: _Index, node, factor, shift, ranks) -> bool:
    """Rescale `node`'s weight and bias (float64, written as float32); False if it cannot."""
    w = idx.const(node.input[1]) if len(node.input) > 1 else None
    if w is None:
        return False
    n = factor.size
    w64 = w.astype(np.float64)
    if node.op_type == "Conv":
        if w.ndim < 3 or w.shape[0] != n:
            return False
        bias = idx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if len(node.input) > 2 and node.input[2] and bias is None:
            return False
        b = np.zeros(n) if bias is None else bias.astype(np.float64).reshape(-1)
        new_w = w64 * factor.reshape((n,) + (1,) * (w.ndim - 1))
        new_b = b * factor + shift
        _set_inputs(idx, node, new_w, new_b)
        return True
    if node.op_type == "Gemm":
        if w.ndim != 2 or _attr(node, "transA", 0):
            return False
        trans_b = _attr(node, "transB", 0)
        if (w.shape[0] if trans_b else w.shape[1]) != n:
            return False
        terms = _gemm_terms(idx, node, n)
        if terms is None:
            return False
        alpha, beta, b = terms
        scale = (factor[:, None] if trans_b else factor[None, :]) * alpha
        _set_inputs(idx, node, w64 * scale, beta * b * factor + shift)
        _set_attr(node, "alpha", 1.0)
        _set_attr(node, "beta", 1.0)
        return True
    if node.op_type == "MatMul":
        x_rank = len(ranks.get(node.input[0], ()))
        if w.ndim != 2 or w.shape[1] != n or x_rank != 2:
            return False                 # BN's channel axis 1 is MatMul's N only for rank 2
        # MatMul has no bias: it becomes a Gemm with one
        node.op_type = "Gemm"
        _set_inputs(idx, node, w64 * factor[None, :], shift)
        return True
    return False


def _set_inputs(idx: _Index, node, w: np.ndarray, b: np.ndarray) -> None:
    """New weight and bias initializers for `node` (the old ones may be shared)."""
    w_name = idx.add_init(w.astype(np.float32), f"{node.name}_w_bn")
    b_name = idx.add_init(b.astype(np.float32), f"{node.name}_b_bn")
    inputs = [node.input[0], w_name, b_name]
    del node.input[:]
    node.input.extend(inputs)


# --- MatMul + bias Add ------------------------------------------------------------------

def matmul_bias_pairs(model: onnx.ModelProto, ranks: dict | None = None):
    """(MatMul node, Add node, bias (N,) array, x rank) for every MatMul with a constant 2-D
    weight whose output only an Add reads, the Add's other input a constant broadcast over
    the last axis."""
    idx = _Index(model)
    ranks = _ranks(model) if ranks is None else ranks
    pairs = []
    for mm in model.graph.node:
        if mm.op_type != "MatMul" or len(mm.input) != 2:
            continue
        w = idx.const(mm.input[1])
        if w is None or w.ndim != 2:
            continue
        add = idx.sole_consumer(mm.output[0])
        if add is None or add.op_type != "Add" or len(add.input) != 2:
            continue
        other = add.input[1] if add.input[0] == mm.output[0] else add.input[0]
        b = idx.const(other)
        x_rank = len(ranks.get(mm.input[0], ()))
        n = w.shape[1]
        if b is None or b.size != n or (b.ndim and b.shape[-1] != n) or x_rank < 2 \
                or b.ndim > x_rank or b.dtype != w.dtype:
            continue
        pairs.append((mm, add, b.reshape(n), x_rank))
    return pairs


def fuse_matmul_bias(model: onnx.ModelProto, prov: Provenance) -> int:
    """MatMul(x, W) + Add(b) on a (batch, K) x -> one Gemm(x, W, b).  Pairs on x of rank
    >= 3 stay (quantize.py gives their Add an int32 bias, the fused-bias QDQ pattern)."""
    idx = _Index(model)
    fused = 0
    for mm, add, b, x_rank in matmul_bias_pairs(model):
        if x_rank != 2:
            continue
        b_name = idx.add_init(b, f"{mm.name}_bias")
        gemm = helper.make_node("Gemm", [mm.input[0], mm.input[1], b_name], [add.output[0]],
                                name=mm.name)
        pos = list(model.graph.node).index(mm)
        model.graph.node.remove(mm)
        model.graph.node.insert(pos, gemm)
        model.graph.node.remove(add)
        prov.derive(gemm.name, mm.name)
        prov.fold(add.name, f"folded into Gemm '{gemm.name}'")
        fused += 1
    return fused


# --- Div by a constant --------------------------------------------------------------------

def divisions_as_products(model: onnx.ModelProto, prov: Provenance) -> int:
    """Div(x, c) with c a float constant, finite and non-zero everywhere, and x not a
    constant -> Mul(x, 1 / c) (node name kept): the TPU's VMUL takes a product with a scalar
    or per-channel constant, not a quotient (issue 20, item 3: a HardSwish written as
    x * relu6(x + 3) / 6, a mean as a sum / n).  Returns how many."""
    idx = _Index(model)
    done = 0
    for node in model.graph.node:
        if node.op_type != "Div" or node.domain not in ("", "ai.onnx") or \
                len(node.input) != 2 or idx.const(node.input[0]) is not None:
            continue
        c = idx.const(node.input[1])
        if c is None or c.dtype not in (np.float32, np.float64) or \
                not np.all(np.isfinite(c)) or np.any(c == 0):
            continue
        inverse = (1.0 / c.astype(np.float64)).astype(c.dtype)
        if not np.all(np.isfinite(inverse)):
            continue
        name = idx.add_init(inverse, f"{node.input[1]}_reciprocal")
        node.op_type = "Mul"
        node.input[1] = name
        prov.derive(node.name, node.name)
        done += 1
    if done:
        drop_unused_initializers(model)
    return done


# --- Sum of n tensors ------------------------------------------------------------------

def sums_as_additions(model: onnx.ModelProto, prov: Provenance) -> int:
    """Sum(a, b, ...) -> Add(Add(a, b), ...) (the first Add keeps the node's name when there
    are two inputs): Caffe2 and older exporters write a residual connection as a Sum, which
    VADD takes only as Add.  A Sum of one input becomes an Identity.  Returns how many."""
    idx = _Index(model)
    done = 0
    rewritten = []
    for node in model.graph.node:
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or not node.input \
                or not all(node.input):
            rewritten.append(node)
            continue
        done += 1
        if len(node.input) == 1:
            rewritten.append(helper.make_node("Identity", list(node.input), list(node.output),
                                              name=node.name))
            prov.derive(node.name, node.name)
            continue
        total = node.input[0]
        for i, term in enumerate(node.input[1:], start=1):
            last = i == len(node.input) - 1
            out = node.output[0] if last else idx.unique(f"{node.name}_partial{i}")
            name = node.name if last else idx.unique(f"{node.name}_add{i}")
            rewritten.append(helper.make_node("Add", [total, term], [out], name=name))
            prov.derive(name, node.name)
            total = out
    if done:
        del model.graph.node[:]
        model.graph.node.extend(rewritten)
    return done


# --- a spatial mean before a matrix node ---------------------------------------------------

_PASS_ON = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def means_as_global_pools(model: onnx.ModelProto, prov: Provenance) -> int:
    """ReduceMean over every axis after the channels of an (N, C, ...) tensor whose result
    goes, through Reshape / Flatten / Squeeze alone, into Conv / Gemm / MatMul nodes with
    constant weights -> GlobalAveragePool [-> Flatten when keepdims=0] (node name kept).
    PyTorch writes a CNN's pooled head or a squeeze-excitation's squeeze as x.mean((2, 3)),
    which has no TPU mapping: it ran on the host between the last Conv and the classifier;
    GlobalAveragePool is one on the TPU.  A mean some other node reads (a LayerNorm's or
    InstanceNorm's statistic: its Sub, its variance) stays.  Returns how many."""
    idx = _Index(model)
    ranks = None
    done = 0
    rewritten = []
    for node in model.graph.node:
        made = None
        if node.op_type == "ReduceMean" and node.domain in ("", "ai.onnx") and \
                _feeds_matrix_nodes(idx, node.output[0]):
            ranks = _ranks(model) if ranks is None else ranks
            made = _global_pool(idx, node, len(ranks.get(node.input[0], ())))
        if made is None:
            rewritten.append(node)
            continue
        for n in made:
            prov.derive(n.name, node.name)
        rewritten += made
        done += 1
    if done:
        del model.graph.node[:]
        model.graph.node.extend(rewritten)
        drop_unused_initializers(model)
    return done


def _feeds_matrix_nodes(idx: _Index, tensor: str) -> bool:
    """Every reader of `tensor`, through _PASS_ON nodes, is a Conv / Gemm / MatMul that
    takes it as its input and has a constant weight (and there is one)."""
    readers = idx.consumers.get(tensor, [])
    if not readers or tensor in idx.outputs:
        return False
    for r in readers:
        if r.op_type in _PASS_ON and r.input[0] == tensor:
            if not _feeds_matrix_nodes(idx, r.output[0]):
                return False
        elif not (r.op_type in ("Conv", "Gemm", "MatMul") and r.input[0] == tensor and
                  len(r.input) > 1 and idx.const(r.input[1]) is not None):
            return False
    return True


def _global_pool(idx: _Index, node, rank: int):
    """The GlobalAveragePool [+ Flatten] for a ReduceMean over axes 2 .. rank - 1, or None."""
    if rank < 3:
        return None
    axes = _attr(node, "axes", None)
    if len(node.input) > 1 and node.input[1]:
        axes = idx.const(node.input[1])           # opset 18: an input
        if axes is None:
            return None
    if axes is None or _attr(node, "noop_with_empty_axes", 0):
        return None
    if sorted(int(a) % rank for a in np.asarray(axes).reshape(-1)) != list(range(2, rank)):
        return None
    if _attr(node, "keepdims", 1):
        return [helper.make_node("GlobalAveragePool", [node.input[0]], list(node.output),
                                 name=node.name)]
    pooled = idx.unique(f"{node.output[0]}_pooled")
    return [helper.make_node("GlobalAveragePool", [node.input[0]], [pooled], name=node.name),
            helper.make_node("Flatten", [pooled], list(node.output),
                             name=idx.unique(f"{node.name}_flatten"), axis=1)]


# --- scikit-learn's linear models ---------------------------------------------------------

_POST_TRANSFORMS = {"NONE": None, "SOFTMAX": "Softmax", "LOGISTIC": "Sigmoid"}


def rewrite_linear_models(model: onnx.ModelProto, prov: Provenance,
                          reasons: dict[str, str] | None = None) -> int:
    """ai.onnx.ml LinearClassifier (multi-class) and LinearRegressor as standard operators:
    scores = Gemm(X, coefficients^T, intercepts) (a constant weight: the TPU's), the
    post-transform (Softmax, Sigmoid) on the scores, and for a classifier the label
    Gather(classlabels, ArgMax(scores)).  A binary classifier (one coefficient row), another
    post-transform or input type stays as it is, on the host, with its reason."""
    reasons = {} if reasons is None else reasons

    def wanted(n):
        return n.domain == "ai.onnx.ml" and n.op_type in ("LinearClassifier", "LinearRegressor")
    if not any(wanted(n) for n in model.graph.node):
        return 0
    idx = _Index(model)
    types = _value_types(model)
    return _expand_nodes(model, prov, reasons, "rewritten", wanted,
                         lambda n: _linear_nodes(idx, n, types.get(n.input[0])))


def _expand_nodes(model: onnx.ModelProto, prov: Provenance, reasons: dict, verb: str,
                  wanted, expand) -> int:
    """Replace each node `wanted(node)` picks by the nodes `expand(node)` makes (in place,
    in order, each derived from it); a NotRewritten keeps the node, its reason recorded."""
    new_nodes, done = [], 0
    for node in model.graph.node:
        if not wanted(node):
            new_nodes.append(node)
            continue
        try:
            made = expand(node)
        except NotRewritten as e:
            reasons[node.name] = f"{node.op_type} not {verb}: {e}"
            new_nodes.append(node)
            continue
        for n in made:
            prov.derive(n.name, node.name)
        new_nodes.extend(made)
        done += 1
    if done:
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
    return done


_SCHEMA_TYPES = {"tensor(float)": onnx.TensorProto.FLOAT,
                 "tensor(double)": onnx.TensorProto.DOUBLE,
                 "tensor(int64)": onnx.TensorProto.INT64}


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Tensor -> element type: declared, inferred, or the one type an operator's schema
    gives its output where onnx infers none (skl2onnx writes a MinMaxScaler as Cast, Mul,
    Add and declares none of their outputs; onnx infers no type for ai.onnx.ml's
    Normalizer, whose schema says tensor(float))."""
    g = model.graph
    declared = {v.name: v for v in [*g.input, *g.value_info, *g.output]
                if v.type.HasField("tensor_type")}
    types = {name: v.type.tensor_type.elem_type
             for name, v in {**inferred_values(model), **declared}.items()}
    for node in g.node:
        for k, out in enumerate(node.output):
            if out and not types.get(out):
                fixed = _schema_output_type(node, k)
                if fixed:
                    types[out] = fixed
    return types


def _schema_output_type(node, k: int) -> int | None:
    try:
        schema = onnx.defs.get_schema(node.op_type, onnx.defs.onnx_opset_version(),
                                      node.domain or "")
    except Exception:                     # noqa: BLE001 - an operator onnx does not know
        return None
    return _SCHEMA_TYPES.get(schema.outputs[k].type_str) if k < len(schema.outputs) else None


def _linear_nodes(idx: "_Index", node, x_type) -> list:
    if x_type != onnx.TensorProto.FLOAT:
        raise NotRewritten("its input is not float32")
    coef = np.asarray(_attr(node, "coefficients", []), np.float32)
    classifier = node.op_type == "LinearClassifier"
    labels = len(_attr(node, "classlabels_ints", []) or _attr(node, "classlabels_strings", []))
    given = _attr(node, "intercepts", [])
    targets = len(given) if given else (labels if classifier else _attr(node, "targets", 1))
    intercepts = np.asarray(given or [0.0] * targets, np.float32)
    post = _attr(node, "post_transform", b"NONE")
    post = post.decode() if isinstance(post, bytes) else post
    if post not in _POST_TRANSFORMS:
        raise NotRewritten(f"post_transform {post}")
    if classifier and targets != labels:
        raise NotRewritten("a binary classifier (one coefficient row)" if targets == 1 else
                          f"{targets} coefficient rows for {labels} classes")
    if not targets or coef.size % targets:
        raise NotRewritten("coefficients and intercepts of other shapes")
    w = coef.reshape(targets, -1)
    scores_out = node.output[1] if classifier else node.output[0]
    raw = idx.unique(f"{node.name}_scores") if _POST_TRANSFORMS[post] else scores_out
    made = [helper.make_node("Gemm", [node.input[0], idx.add_init(w, f"{node.name}_W"),
                                      idx.add_init(intercepts, f"{node.name}_b")],
                             [raw], name=idx.unique(f"{node.name}_gemm"), transB=1)]
    if _POST_TRANSFORMS[post]:
        made.append(helper.make_node(_POST_TRANSFORMS[post], [raw], [scores_out],
                                     name=idx.unique(f"{node.name}_{post.lower()}"),
                                     **({"axis": 1} if post == "SOFTMAX" else {})))
    if classifier:
        ints = _attr(node, "classlabels_ints", [])
        labels = (np.asarray(ints, np.int64) if ints else
                  np.asarray([t.decode() if isinstance(t, bytes) else t
                              for t in _attr(node, "classlabels_strings")], dtype=object))
        best = idx.unique(f"{node.name}_argmax")
        made += [helper.make_node("ArgMax", [raw], [best], name=best, axis=1, keepdims=0),
                 helper.make_node("Gather", [idx.add_init(labels, f"{node.name}_labels"),
                                             best], [node.output[0]],
                                  name=idx.unique(f"{node.name}_label"), axis=0)]
    return made


# --- LSTM, GRU and RNN unrolled -------------------------------------------------------

class NotRewritten(Exception):
    """Why a node stays as it is (on the host): a recurrent node not unrolled, a linear
    model not rewritten."""


# An LSTM's cell state c is unbounded (Silero's reaches |c| = 13) and carried from step to
# step: as uint8 per step (a step of 0.1 there) its rounding accumulates, and over Silero's
# 64-frame sequence the speech probability drifts by up to 0.8.  Beyond this many steps the
# cell's chain (f*c + i*g, tanh(c), o*tanh(c)) stays float on the host: no MACs, a host
# round trip per step; h, bounded by 1, is quantized finely for the next step's Gemms.
# Shorter LSTMs (the corpus's 10-step classifier) keep the whole cell on the TPU.
LONG_SEQUENCE = 16
CELL_IN_FLOAT = (f"the cell state of an LSTM longer than {LONG_SEQUENCE} steps, kept in float "
                 f"on the host (its 8-bit rounding would accumulate over the steps)")

_DEFAULT_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"],
                 "RNN": ["tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
# an RNN's one activation, as ONNX names it, and the operator that computes it (PyTorch's
# nn.RNN(nonlinearity="relu") exports activations=["Relu"])
_RNN_ACTIVATIONS = {"tanh": "Tanh", "relu": "Relu", "sigmoid": "Sigmoid"}


def unroll_recurrent(model: onnx.ModelProto, prov: Provenance,
                     reasons: dict[str, str] | None = None,
                     tied: dict[str, list[str]] | None = None,
                     keep_float: dict[str, str] | None = None) -> int:
    """Every LSTM / GRU / RNN node that can be unrolled, unrolled; the others keep their
    reason.
    `tied` receives the per-step tensors that are one quantity (Prepared.tied);
    `keep_float` the cell-state nodes of an LSTM longer than LONG_SEQUENCE steps."""
    reasons = {} if reasons is None else reasons
    if not any(n.op_type in _GATES for n in model.graph.node):
        return 0
    ranks = _ranks(model)
    idx = _Index(model)
    return _expand_nodes(model, prov, reasons, "unrolled",
                         lambda n: n.op_type in _GATES and n.domain in ("", "ai.onnx"),
                         lambda n: _Unroller(idx, n, ranks, tied, keep_float).run())


class _Unroller:
    """One LSTM/GRU/RNN node -> its per-step nodes (ONNX operator semantics, opset 7..22)."""

    def __init__(self, idx: _Index, node, ranks: dict, tied: dict | None = None,
                 keep_float: dict | None = None):
        self.idx, self.node, self.ranks = idx, node, ranks
        self.tied = {} if tied is None else tied
        self.keep_float = {} if keep_float is None else keep_float
        self.long = False                       # set by run(): more than LONG_SEQUENCE steps
        self.nodes: list = []
        self._made: dict = {}                   # _shared's initializers, by value
        self.kind = node.op_type
        self.gates = _GATES[self.kind]
        self.activation = "Tanh"                # an RNN's, set by _check

    # node builders: unique names under the recurrent node's name
    def _emit(self, op, inputs, tag, **attrs) -> str:
        name = self.idx.unique(f"{self.node.name}/{tag}")
        out = self.idx.unique(f"{self.node.name}/{tag}:0")
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        step, sep, role = tag.partition("/")
        if sep and step[:1] == "t" and step[1:].isdigit():   # "t7/d0/i_x": step 7's i_x
            self.tied.setdefault(f"{self.node.name}/{role}", []).append(out)
        return out

    def _const(self, array, tag) -> str:
        return self.idx.add_init(np.asarray(array), f"{self.node.name}/{tag}")

    def _state(self, tensor, axis, d, role) -> str | None:
        """Direction d's initial state, None when there is none.  A constant of zeros (what
        PyTorch's exporter writes for a call without h0: ConstantOfShape, folded once the
        batch is fixed) is none either: its R h products are constants the first step
        would otherwise compute at run time, on the host."""
        if not tensor:
            return None
        value = self.idx.const(tensor)
        if value is not None and not np.any(value) or self._zeros_of_a_shape(tensor):
            return None
        return self._take(tensor, axis, d, f"d{d}/{role}")

    def _zeros_of_a_shape(self, tensor) -> bool:
        """A ConstantOfShape of zeros not yet folded (a quantized model's LSTM is unrolled
        before its batch is fixed), a part of one (PyTorch slices a stacked LSTM's layers'
        states out of one), or a constant zero expanded to a shape computed at run time
        (tf2onnx's Keras LSTM: Expand(0, Concat(batch, units)), then Unsqueeze)."""
        node = self.idx.producer.get(tensor)
        for _ in range(8):
            if node is None or node.op_type not in _SAME_ZEROS or not node.input:
                break
            value = self.idx.const(node.input[0])
            if value is not None:
                return not np.any(value)
            node = self.idx.producer.get(node.input[0])
        if node is None or node.op_type != "ConstantOfShape":
            return False
        value = _attr(node, "value")
        return value is None or not np.any(numpy_helper.to_array(value))

    def _take(self, tensor, axis, i, tag) -> str:
        """tensor[..., i, ...] along `axis`, that axis removed (Slice + Squeeze)."""
        starts = self._const(np.array([i], np.int64), f"{tag}_start")
        ends = self._const(np.array([i + 1], np.int64), f"{tag}_end")
        axes = self._const(np.array([axis], np.int64), f"{tag}_axis")
        part = self._emit("Slice", [tensor, starts, ends, axes], f"{tag}_slice")
        return self._squeeze(part, axis, tag)

    def _squeeze(self, tensor, axis, tag) -> str:
        if self.idx.opset >= 13:
            axes = self._const(np.array([axis], np.int64), f"{tag}_sq_axes")
            return self._emit("Squeeze", [tensor, axes], f"{tag}_squeeze")
        return self._emit("Squeeze", [tensor], f"{tag}_squeeze", axes=[axis])

    def _unsqueeze(self, tensor, axes, tag) -> str:
        if self.idx.opset >= 13:
            a = self._const(np.array(axes, np.int64), f"{tag}_unsq_axes")
            return self._emit("Unsqueeze", [tensor, a], f"{tag}_unsqueeze")
        return self._emit("Unsqueeze", [tensor], f"{tag}_unsqueeze", axes=list(axes))

    def _cols(self, tensor, start, stop, tag) -> str:
        """tensor[:, start:stop] (one gate's columns of a (batch, k*H) product)."""
        starts = self._const(np.array([start], np.int64), f"{tag}_start")
        ends = self._const(np.array([stop], np.int64), f"{tag}_end")
        axes = self._const(np.array([1], np.int64), f"{tag}_axis")
        return self._emit("Slice", [tensor, starts, ends, axes], tag)

    def _gemm(self, x, w_t: np.ndarray, b: np.ndarray | None, tag) -> str:
        ins = [x, self._shared(w_t.astype(np.float32), f"{tag}_w")]
        if b is not None:
            ins.append(self._shared(b.astype(np.float32), f"{tag}_b"))
        return self._emit("Gemm", ins, tag)

    def _shared(self, array: np.ndarray, tag) -> str:
        """One initializer for every step's copy of a weight or bias: the quantizer then
        quantizes each gate's matrix once, not once a step (a 24-step bidirectional LSTM:
        16 matrices, not 384)."""
        key = (array.shape, hashlib.sha256(array.tobytes()).digest())
        if key not in self._made:
            self._made[key] = self._const(array, tag.split("/", 1)[-1] if tag[:1] == "t"
                                          else tag)
        return self._made[key]

    def _concat(self, parts, axis, out, tag) -> None:
        name = self.idx.unique(f"{self.node.name}/{tag}")
        if len(parts) == 1:      # one direction's Y_h: an Identity, which the TPU reads through
            self.nodes.append(helper.make_node("Identity", parts, [out], name=name))
            return
        self.nodes.append(helper.make_node("Concat", parts, [out], name=name, axis=axis))

    # the checks that decide whether the node is unrolled
    def _check(self):
        node, idx = self.node, self.idx
        inputs = list(node.input) + [""] * (8 - len(node.input))
        w, r = idx.const(inputs[1]), idx.const(inputs[2])
        if w is None or r is None:
            raise NotRewritten("its weights W and R are not constants")
        b = idx.const(inputs[3]) if inputs[3] else None
        if inputs[3] and b is None:
            raise NotRewritten("its bias B is not a constant")
        if self.kind == "LSTM" and inputs[7]:
            raise NotRewritten("peephole weights P")
        if _attr(node, "clip") is not None:
            raise NotRewritten("cell clipping (clip)")
        if _attr(node, "input_forget", 0):
            raise NotRewritten("input_forget=1")
        direction = _attr(node, "direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        if direction not in ("forward", "reverse", "bidirectional"):
            raise NotRewritten(f"direction {direction!r}")
        dirs = 2 if direction == "bidirectional" else 1
        acts = _attr(node, "activations")
        if acts is not None:
            acts = [a.decode().lower() if isinstance(a, bytes) else a.lower() for a in acts]
            if self.kind == "RNN":
                if acts[:1] * dirs != acts or acts[0] not in _RNN_ACTIVATIONS:
                    raise NotRewritten(f"activations {acts} (an RNN is unrolled with one of "
                                       f"{', '.join(_RNN_ACTIVATIONS)} in every direction)")
                self.activation = _RNN_ACTIVATIONS[acts[0]]
            elif acts != _DEFAULT_ACTS[self.kind] * dirs:
                raise NotRewritten(f"activations {acts} (only the defaults are unrolled)")
        if _attr(node, "activation_alpha") or _attr(node, "activation_beta"):
            raise NotRewritten("activation_alpha / activation_beta")
        layout = _attr(node, "layout", 0)
        hidden = _attr(node, "hidden_size")
        h = r.shape[-1]
        if hidden is not None and hidden != h:
            raise NotRewritten(f"hidden_size {hidden} does not match R's {h}")
        if w.shape[:2] != (dirs, self.gates * h) or r.shape != (dirs, self.gates * h, h):
            raise NotRewritten(f"W {w.shape} / R {r.shape} do not match {dirs} direction(s)")
        if b is None:
            b = np.zeros((dirs, 2 * self.gates * h), np.float32)
        if b.shape != (dirs, 2 * self.gates * h):
            raise NotRewritten(f"B has shape {b.shape}")
        x_dims = self.ranks.get(inputs[0])
        if x_dims is None or len(x_dims) != 3:
            raise NotRewritten("the shape of its input X is unknown")
        seq = x_dims[1 if layout else 0]
        if not isinstance(seq, int) or seq <= 0:
            raise NotRewritten("its sequence length is not static")
        if inputs[4]:
            lens = idx.const(inputs[4])
            if lens is None or np.any(lens != seq):
                raise NotRewritten("sequence_lens that are not all the full length")
        return inputs, w, r, b, dirs, direction, layout, h, seq

    def run(self) -> list:
        inputs, w, r, b, dirs, direction, layout, h, seq = self._check()
        self.long = seq > LONG_SEQUENCE
        outs = list(self.node.output) + [""] * (3 - len(self.node.output))
        ys = [[None] * dirs for _ in range(seq)]
        finals = []
        for d in range(dirs):
            reverse = direction == "reverse" or d == 1
            state_axis = 1 if layout else 0
            h_prev = self._state(inputs[5], state_axis, d, "h0")
            c_prev = self._state(inputs[6], state_axis, d, "c0") if self.kind == "LSTM" \
                else None
            # the initial state is the state of an earlier call: one range with every h_t
            for start, role in ((h_prev, "h"), (c_prev, "c")):
                if start is not None:
                    self.tied.setdefault(f"{self.node.name}/d{d}/{role}", []).append(start)
            order = range(seq - 1, -1, -1) if reverse else range(seq)
            for t in order:
                tag = f"t{t}/d{d}"
                x_t = self._take(inputs[0], 1 if layout else 0, t, f"{tag}/x")
                if self.kind == "LSTM":
                    h_prev, c_prev = self._lstm_step(x_t, h_prev, c_prev, w[d], r[d], b[d],
                                                     h, tag)
                elif self.kind == "GRU":
                    h_prev = self._gru_step(x_t, h_prev, w[d], r[d], b[d], h, tag)
                else:
                    h_prev = self._rnn_step(x_t, h_prev, w[d], r[d], b[d], tag)
                ys[t][d] = h_prev
            finals.append((h_prev, c_prev))
        if outs[0]:                        # Y: (S, D, N, H) or (N, S, D, H)
            per_t = []
            for t in range(seq):
                parts = [self._unsqueeze(ys[t][d], [1, 2] if layout else [0, 1],
                                         f"t{t}/d{d}/y") for d in range(dirs)]
                if dirs == 1:
                    per_t.append(parts[0])
                else:
                    out = self.idx.unique(f"{self.node.name}/t{t}/y:0")
                    self._concat(parts, 2 if layout else 1, out, f"t{t}/y_concat")
                    per_t.append(out)
            self._concat(per_t, 1 if layout else 0, outs[0], "Y_concat")
        for k, out in ((0, outs[1]), (1, outs[2] if self.kind == "LSTM" else "")):
            if out:                        # Y_h / Y_c: (D, N, H) or (N, D, H)
                parts = [self._unsqueeze(finals[d][k], [1 if layout else 0],
                                         f"d{d}/final{k}") for d in range(dirs)]
                self._concat(parts, 1 if layout else 0, out, f"final{k}_concat")
        return self.nodes

    def _lstm_step(self, x_t, h_prev, c_prev, w, r, b, h, tag):
        # gate order i, o, f, c; B = [Wb, Rb].  One Gemm pair per gate (not one Gemm and
        # four column Slices): each gate is then a whole tensor, so its Add, Sigmoid/Tanh
        # and the cell's Mul/Add chain can stay on the TPU (VADD / VMUL, lookup tables)
        wb, rb = b[:4 * h], b[4 * h:]

        def gate(k, name):
            cols = slice(k * h, (k + 1) * h)
            if h_prev is None:   # zero state: R h = 0, the recurrent bias joins the input's
                return self._gemm(x_t, w.T[:, cols], wb[cols] + rb[cols], f"{tag}/{name}_x")
            gx = self._gemm(x_t, w.T[:, cols], wb[cols], f"{tag}/{name}_x")
            gh = self._gemm(h_prev, r.T[:, cols], rb[cols], f"{tag}/{name}_h")
            return self._emit("Add", [gx, gh], f"{tag}/{name}_gates")

        i = self._emit("Sigmoid", [gate(0, "i")], f"{tag}/i")
        o = self._emit("Sigmoid", [gate(1, "o")], f"{tag}/o")
        f = self._emit("Sigmoid", [gate(2, "f")], f"{tag}/f")
        g = self._emit("Tanh", [gate(3, "c")], f"{tag}/g")
        first = len(self.nodes)
        ig = self._emit("Mul", [i, g], f"{tag}/i_g")
        if c_prev is None:
            c = ig
        else:
            fc = self._emit("Mul", [f, c_prev], f"{tag}/f_c")
            c = self._emit("Add", [fc, ig], f"{tag}/c")
        h_new = self._emit("Mul", [o, self._emit("Tanh", [c], f"{tag}/tanh_c")], f"{tag}/h")
        if self.long:
            for made in self.nodes[first:]:
                self.keep_float[made.name] = CELL_IN_FLOAT
        return h_new, c

    def _rnn_step(self, x_t, h_prev, w, r, b, tag):
        # H = f(X W^T + Wb + H_prev R^T + Rb); B = [Wb, Rb]
        h = r.shape[-1]
        wb, rb = b[:h], b[h:]
        if h_prev is None:       # zero state: R h = 0, the recurrent bias joins the input's
            pre = self._gemm(x_t, w.T, wb + rb, f"{tag}/h_x")
        else:
            pre = self._emit("Add", [self._gemm(x_t, w.T, wb, f"{tag}/h_x"),
                                     self._gemm(h_prev, r.T, rb, f"{tag}/h_h")],
                             f"{tag}/h_pre")
        return self._emit(self.activation, [pre], f"{tag}/h")

    def _gru_step(self, x_t, h_prev, w, r, b, h, tag):
        # gate order z, r, h; B = [Wb, Rb].  One Gemm (pair) per gate, as for the LSTM: each
        # gate a whole tensor (no column Slices), so the gate chain stays on the TPU
        lbr = _attr(self.node, "linear_before_reset", 0)
        wb, rb = b[:3 * h], b[3 * h:]

        def cols(k):
            return slice(k * h, (k + 1) * h)

        def gate(k, name):
            if h_prev is None:   # zero state: R h = 0, the recurrent bias joins the input's
                return self._gemm(x_t, w.T[:, cols(k)], wb[cols(k)] + rb[cols(k)],
                                  f"{tag}/{name}_x")
            gx = self._gemm(x_t, w.T[:, cols(k)], wb[cols(k)], f"{tag}/{name}_x")
            gh = self._gemm(h_prev, r.T[:, cols(k)], rb[cols(k)], f"{tag}/{name}_h")
            return self._emit("Add", [gx, gh], f"{tag}/{name}_gates")

        z = self._emit("Sigmoid", [gate(0, "z")], f"{tag}/z")
        rg = self._emit("Sigmoid", [gate(1, "r")], f"{tag}/r")
        if h_prev is None and not lbr:
            # r (.) 0 = 0: the candidate's recurrent part is its bias alone
            pre = self._gemm(x_t, w.T[:, cols(2)], wb[cols(2)] + rb[cols(2)], f"{tag}/h_x")
        else:
            if h_prev is None:              # r (.) (R_h 0 + Rb_h) = r (.) Rb_h
                rh = self._emit("Mul", [rg, self._const(rb[cols(2)].astype(np.float32),
                                                        f"{tag}/rb_h")], f"{tag}/r_hh")
            elif lbr:
                rh = self._gemm(h_prev, r.T[:, cols(2)], rb[cols(2)], f"{tag}/gemm_hh")
                rh = self._emit("Mul", [rg, rh], f"{tag}/r_hh")
            else:
                reset = self._emit("Mul", [rg, h_prev], f"{tag}/r_h")
                rh = self._gemm(reset, r.T[:, cols(2)], rb[cols(2)], f"{tag}/gemm_hh")
            cand_x = self._gemm(x_t, w.T[:, cols(2)], wb[cols(2)], f"{tag}/h_x")
            pre = self._emit("Add", [cand_x, rh], f"{tag}/h_pre")
        cand = self._emit("Tanh", [pre], f"{tag}/h_cand")
        # H = (1 - z) (.) cand + z (.) H_prev = cand - z (.) (cand - H_prev)
        if h_prev is None:
            return self._emit("Sub", [cand, self._emit("Mul", [z, cand], f"{tag}/z_cand")],
                              f"{tag}/h")
        diff = self._emit("Sub", [cand, h_prev], f"{tag}/cand_minus_h")
        return self._emit("Sub", [cand, self._emit("Mul", [z, diff], f"{tag}/z_diff")],
                          f"{tag}/h")

"""A matrix node's output cut along its channels as one matrix node per part (float model,
before quantization; see prepare.py for the other rewrites).

A GLU (a Conformer's convolution module: pointwise Conv to 2C, then a * sigmoid(b)) cuts
the channels of a Conv's output with a Split (or Slices).  Those run on the host (an IR
operator writes one whole tensor), so the Conv's output went to the host and back, and the
GLU's Sigmoid and Mul ran there in float.  When a Conv (group 1), Gemm or MatMul with
constant weights feeds nothing but such cuts along its output channels, perhaps through
element-wise operators of one input (a Relu), each part becomes its own node with its rows
of the weight and bias, followed by its copy of those operators: the parts are whole
tensors the TPU writes, and the arithmetic that reads them (VMUL, lookup tables) can stay
on the TPU.  Each channel is computed by the same weights as before.

The price: each part is another pass of the array over the node's input (a Conv of 16
output channels cut in two costs two Convs of 8, as many cycles each).  So a cut is left to
the host unless every part is read, through layout nodes, by something the TPU takes: a
part only the model's output, a Concat or a product of two activations reads goes to the
host anyway (ShuffleNet's channel split sends one half straight to the unit's Concat: in
a deep ShuffleNet the Split follows the previous unit's Concat and shuffle in the same host
part, and cutting the zoo unit's stem Conv in two cost it 62 % more cycles for one host
round trip fewer; attention's packed Q/K/V projection feeds products of activations)."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tpuasm.compiler.front.graph import readers_through
from tpuasm.compiler.front.match import LOOKUP_OPS
from tpuasm.compiler.front.prepare import _attr, _Index, _ranks
from tpuasm.compiler.front.provenance import Provenance

# readers that make a part worth a node of its own: what the TPU takes (a matrix node with a
# constant weight, checked apart), found through layout nodes
_TPU_READERS = LOOKUP_OPS | {"Add", "Sub", "Mul", "MaxPool", "AveragePool", "GlobalAveragePool"}
_LAYOUT = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"}
# element-wise operators of one activation (constant operands only: Clip's bounds) that
# commute with a cut of the channels
_PER_ELEMENT = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish",
                "Elu", "Selu", "Softplus", "Softsign", "Mish", "Gelu", "Identity"}


def split_matrix_outputs(model, prov: Provenance) -> int:
    """Each Conv / Gemm / MatMul (constant weights) whose output, through a chain of
    `_PER_ELEMENT` operators, only Splits and Slices of its channel axis read, no part
    going to the host anyway: one node and one chain per part (in place); the count of
    nodes split."""
    idx = _Index(model)
    ranks = None
    plans = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        if node.op_type == "MatMul" and ranks is None:
            ranks = _ranks(model)
        plan = _plan(idx, node, ranks or {})
        if plan is not None:
            plans.append(plan)
    if not plans:
        return 0
    replaced = {}                       # name of a node that goes -> nodes in its place
    for node, chain, parts, cuts in plans:
        made = []
        for k, (start, stop, out) in enumerate(parts):
            made += _part(idx, prov, node, chain, start, stop, out, k)
        replaced[node.name] = made
        for gone in chain:              # its copies, one per part, derive from it
            replaced[gone.name] = []
        for cut in cuts:
            replaced[cut.name] = []
            prov.fold(cut.name, f"folded into {node.op_type} '{made[0].name}' (one node per "
                      f"part of {node.name}'s channels)")
    nodes = []
    for n in model.graph.node:
        nodes.extend(replaced.get(n.name, [n]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(plans)


def _chain(idx: _Index, tensor: str):
    """The `_PER_ELEMENT` nodes from `tensor`, each the sole reader of the one before,
    and the tensor at its end."""
    chain = []
    while True:
        reader = idx.sole_consumer(tensor)
        if reader is None or reader.op_type not in _PER_ELEMENT or reader.input[0] != tensor \
                or any(i and idx.const(i) is None for i in reader.input[1:]):
            return chain, tensor
        chain.append(reader)
        tensor = reader.output[0]


def _plan(idx: _Index, node, ranks: dict):
    """(node, chain, parts [(start, stop, output)], cuts) or None."""
    w = idx.const(node.input[1]) if len(node.input) > 1 else None
    if w is None or w.ndim < 2 or (node.op_type == "MatMul" and w.ndim != 2):
        return None
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    if bias and idx.const(bias) is None:
        return None
    if node.op_type == "Conv":
        if _attr(node, "group", 1) != 1:
            return None
        rank, channels = w.ndim, w.shape[0]
    elif node.op_type == "Gemm":
        rank, channels = 2, w.shape[0] if _attr(node, "transB", 0) else w.shape[1]
        c = idx.const(bias) if bias else None
        if c is not None and c.size > 1 and (c.shape[-1] != channels or
                                             int(np.prod(c.shape[:-1])) != 1):
            return None                   # a C per row: not cut by channels
    else:
        rank, channels = len(ranks.get(node.input[0], ())), w.shape[1]
        if rank < 2:                      # unknown, or a vector's product
            return None
    axis = 1 if node.op_type == "Conv" else rank - 1
    chain, end = _chain(idx, node.output[0])
    if end in idx.outputs:
        return None
    cuts = idx.consumers.get(end, [])
    parts = []
    for cut in cuts:
        found = _cut_parts(idx, cut, end, axis, rank, channels)
        if found is None:
            return None
        parts += found
    if not parts or any(_for_the_host(idx, out) for _, _, out in parts):
        return None
    return node, chain, parts, cuts


def _for_the_host(idx: _Index, tensor: str) -> bool:
    """Does `tensor` go to the host whatever runs before it: read, through layout nodes, by
    no node the TPU would take (a Concat, a product of two activations, a Softmax, only the
    model's output)?"""
    return not any(reader.op_type in _TPU_READERS or (
        reader.op_type in ("Conv", "Gemm", "MatMul") and len(reader.input) > 1
        and reader.input[0] == name and idx.const(reader.input[1]) is not None)
        for reader, name in readers_through(tensor, idx.consumers, _LAYOUT))


def _cut_parts(idx: _Index, cut, tensor: str, axis: int, rank: int, channels: int):
    """[(start, stop, output)] of a Split or Slice of `tensor` along `axis`, or None."""
    if cut.input[0] != tensor:
        return None
    if cut.op_type == "Split":
        a = _attr(cut, "axis", 0)
        if (a + rank if a < 0 else a) != axis:
            return None
        sizes = idx.const(cut.input[1]) if len(cut.input) > 1 and cut.input[1] else None
        if sizes is None and len(cut.input) > 1 and cut.input[1]:
            return None                   # sizes computed at run time
        if sizes is None:
            sizes = _attr(cut, "split", None)
        count = len(cut.output)
        if sizes is None:                 # equal parts, the last one smaller
            each = -(-channels // count)
            sizes = [min(each, channels - k * each) for k in range(count)]
        sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
        if len(sizes) != count or sum(sizes) != channels or min(sizes) <= 0:
            return None
        starts = np.cumsum([0, *sizes])
        return [(int(starts[k]), int(starts[k + 1]), out)
                for k, out in enumerate(cut.output) if out]
    if cut.op_type == "Slice" and len(cut.input) >= 3:
        values = [idx.const(i) if i else None for i in cut.input[1:5]]
        if any(v is None for v, i in zip(values, cut.input[1:5]) if i):
            return None
        starts, ends = values[0].reshape(-1), values[1].reshape(-1)
        axes = values[2].reshape(-1) if len(values) > 2 and values[2] is not None \
            else np.arange(len(starts))
        steps = values[3].reshape(-1) if len(values) > 3 and values[3] is not None \
            else np.ones(len(starts), np.int64)
        if len(starts) != 1 or int(steps[0]) != 1 or \
                (int(axes[0]) + rank if int(axes[0]) < 0 else int(axes[0])) != axis:
            return None
        start, stop = (int(np.clip(v + channels if v < 0 else v, 0, channels))
                       for v in (int(starts[0]), int(ends[0])))
        return [(start, stop, cut.output[0])] if stop > start else None
    return None


def _part(idx: _Index, prov: Provenance, node, chain, start: int, stop: int, out: str,
          k: int) -> list:
    """The node's channels [start, stop) and its chain, the last writing `out`."""
    w = idx.const(node.input[1])
    if node.op_type == "Conv" or (node.op_type == "Gemm" and _attr(node, "transB", 0)):
        w_part = w[start:stop]
    else:
        w_part = w[:, start:stop]
    inputs = [node.input[0], idx.add_init(np.ascontiguousarray(w_part),
                                          f"{node.name}_part{k}_W")]
    if len(node.input) > 2 and node.input[2]:
        b = idx.const(node.input[2])
        b_part = b if b.size == 1 else b.reshape(*b.shape[:-1], -1)[..., start:stop]
        inputs.append(idx.add_init(np.ascontiguousarray(b_part), f"{node.name}_part{k}_B"))
    made = []
    source = node
    for nxt in [*chain, None]:
        name = idx.unique(f"{source.name}_part{k}")
        target = out if nxt is None else idx.unique(f"{source.output[0]}_part{k}")
        copy = helper.make_node(source.op_type, inputs, [target], name=name,
                                domain=source.domain or None)
        copy.attribute.extend(source.attribute)
        prov.derive(name, source.name)
        made.append(copy)
        if nxt is not None:
            inputs, source = [target, *nxt.input[1:]], nxt
    return made

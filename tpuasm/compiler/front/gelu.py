"""A GELU written out in primitives, made one node again (prepare.py's rewrite).

JAX, TensorFlow and PyTorch exports write GELU as a chain of scalar arithmetic on one tensor:

    tanh form:  0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    erf form:   0.5 * x * (1 + erf(x / sqrt(2)))

Quantized node by node, each link of the chain (x^3, the sum, the Tanh, ...) is an 8-bit
tensor of its own, and the TPU runs it as five to ten VMUL/VADD passes: Magika's
Dense + GELU lost top-1 agreement that way (issue 20).  As one node (onnxruntime's
com.microsoft FastGelu for the tanh form, Gelu for the erf form) it is quantized at its input
and output only, and the TPU runs it as one 256-entry lookup table (match.LOOKUP_OPS).

The chain is found structurally (from its Tanh or Erf: the element-wise nodes above it up to
one tensor x, below it up to the Mul by x) and accepted numerically: evaluated in float64 on
probe values of x it must give the GELU's values.  Nothing else reads its inner tensors."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.front.prepare import _Index
from tpuasm.compiler.front.provenance import Provenance

_ARITH = {"Add", "Sub", "Mul", "Div", "Pow"}
_CENTRE = {"Tanh": "FastGelu", "Erf": "Gelu"}      # the chain's nonlinearity -> fused op
_MAX_LINKS = 12                                    # nodes on either side of the centre
_PROBE = np.concatenate([np.linspace(-8.0, 8.0, 161), [-0.3, 0.05, 0.7, 2.5]])
_TOLERANCE = 2e-3       # float32 constants (0.7978846 for sqrt(2/pi)) against the formula


def _gelu(op: str, x: np.ndarray) -> np.ndarray:
    if op == "FastGelu":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))
    from math import erf
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


class _Chains(_Index):
    """The model's producers and consumers (prepare.py's index) with the walks that find a
    GELU written out in primitives."""

    def scalar(self, name: str) -> float | None:
        t = self.inits.get(name)
        if t is None or t.data_location == onnx.TensorProto.EXTERNAL:
            return None
        value = numpy_helper.to_array(t)
        if value.size != 1 or value.dtype.kind != "f":
            return None
        return float(value.reshape(()))

    def _arith(self, node) -> bool:
        return node.domain in ("", "ai.onnx") and node.op_type in _ARITH and \
            len(node.input) == 2 and len(node.output) == 1

    def upward(self, tensor: str, stop: str | None = None):
        """(x, nodes): the arithmetic nodes that compute `tensor` from one tensor x (`stop`
        when given) and scalar constants, or None.  The nodes in the order found."""
        nodes, leaves, todo = [], set(), [tensor]
        while todo:
            name = todo.pop()
            node = self.producer.get(name)
            if name == stop or node is None or not self._arith(node) or \
                    len(nodes) > _MAX_LINKS:
                leaves.add(name)
                continue
            if node in nodes:
                continue
            nodes.append(node)
            for i in node.input:
                if self.scalar(i) is None:
                    todo.append(i)
        # the leaf x is what every path reaches: exactly one non-constant tensor
        return (leaves.pop(), nodes) if len(leaves) == 1 and nodes else None

    def candidates(self, tensor: str):
        """Each (x, nodes) above `tensor`: x any tensor its arithmetic reads, nearest
        first (the GELU's input may itself be made by arithmetic, a bias Add)."""
        found = self.upward(tensor)
        seen = []
        for node in (found[1] if found else self.upward_nodes(tensor)):
            for i in node.input:
                if self.scalar(i) is None and i not in seen:
                    seen.append(i)
        for x in seen:
            up = self.upward(tensor, stop=x)
            if up is not None and up[0] == x:
                yield up

    def upward_nodes(self, tensor: str) -> list:
        nodes, todo = [], [tensor]
        while todo and len(nodes) <= _MAX_LINKS:
            node = self.producer.get(todo.pop())
            if node is None or not self._arith(node) or node in nodes:
                continue
            nodes.append(node)
            todo.extend(i for i in node.input if self.scalar(i) is None)
        return nodes

    def downward(self, start: str, x: str, op: str, above: list, centre):
        """The nodes after the centre up to the one whose output is GELU(x), or None."""
        chain, tensor = [], start
        for _ in range(_MAX_LINKS):
            readers = self.consumers.get(tensor, [])
            if len(readers) != 1 or tensor in self.outputs or not self._arith(readers[0]):
                return None
            node = readers[0]
            other = node.input[1] if node.input[0] == tensor else node.input[0]
            if other != x and self.scalar(other) is None:
                return None
            chain.append(node)
            nodes = [*above, centre, *chain]
            if self.computes_gelu(nodes, x, node.output[0], op):
                return chain
            tensor = node.output[0]
        return None

    def computes_gelu(self, nodes, x: str, out: str, op: str) -> bool:
        values = {x: _PROBE}
        order = sorted(nodes, key=list(self.model.graph.node).index)
        with np.errstate(all="ignore"):
            for node in order:
                args = [values[i] if i in values else self.scalar(i) for i in node.input]
                if any(a is None for a in args):
                    return False
                values[node.output[0]] = _apply(node.op_type, args)
        got = values.get(out)
        if got is None or not np.all(np.isfinite(got)):
            return False
        want = _gelu(op, _PROBE)
        return bool(np.all(np.abs(got - want) <= _TOLERANCE * (1.0 + np.abs(want))))

    def private(self, nodes, keep: str) -> bool:
        """Only the chain reads its inner tensors (every output but `keep`)."""
        inside = {id(n) for n in nodes}
        for n in nodes:
            for o in n.output:
                if o == keep:
                    continue
                if o in self.outputs or any(id(c) not in inside
                                            for c in self.consumers.get(o, [])):
                    return False
        return True


def _apply(op: str, args) -> np.ndarray:
    a, *rest = args
    if op == "Tanh":
        return np.tanh(a)
    if op == "Erf":
        from math import erf
        return np.vectorize(erf)(np.asarray(a, np.float64))
    b = rest[0]
    return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide,
            "Pow": np.power}[op](np.asarray(a, np.float64), np.asarray(b, np.float64))


def fuse_gelu_chains(model: onnx.ModelProto, prov: Provenance) -> int:
    """Replace, in place, each GELU chain by one com.microsoft FastGelu (tanh form) or Gelu
    (erf form) node named after the chain's Tanh/Erf; returns how many."""
    fused = 0
    typed = None
    while True:
        found = _next_chain(model)
        if found is None:
            return fused
        x, nodes, out, op, centre = found
        g = model.graph
        if typed is None:
            typed = _value_types(model)
        _declare(model, out, typed.get(out) or typed.get(x))
        gelu = helper.make_node(op, [x], [out], name=centre.name, domain="com.microsoft")
        last = max(list(g.node).index(n) for n in nodes)
        g.node.insert(last + 1, gelu)
        for n in nodes:
            g.node.remove(n)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        prov.derive(gelu.name, centre.name)
        for n in nodes:
            if n is not centre:
                prov.fold(n.name, f"part of the GELU '{centre.name}' (one {op} node)")
        fused += 1


def _value_types(model: onnx.ModelProto) -> dict:
    """Tensor -> its ValueInfoProto from onnx shape inference ({} when it fails)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:                     # noqa: BLE001 - no shapes: none declared
        return {}
    g = inferred.graph
    return {v.name: v for v in [*g.input, *g.value_info, *g.output]}


def _declare(model: onnx.ModelProto, name: str, info) -> None:
    """The fused node's output type and shape in the graph's value_info: onnx shape
    inference does not know com.microsoft operators, and without it every shape after the
    GELU is unknown (the Conv and MatMul after it would not map)."""
    g = model.graph
    if info is None or any(v.name == name for v in [*g.value_info, *g.output]):
        return
    declared = onnx.ValueInfoProto()
    declared.CopyFrom(info)
    declared.name = name
    g.value_info.append(declared)


def _next_chain(model: onnx.ModelProto):
    chains = _Chains(model)
    for centre in model.graph.node:
        op = _CENTRE.get(centre.op_type)
        if op is None or centre.domain not in ("", "ai.onnx") or len(centre.input) != 1:
            continue
        for x, above in chains.candidates(centre.input[0]):
            below = chains.downward(centre.output[0], x, op, above, centre)
            if below is None:
                continue
            nodes = [*above, centre, *below]
            out = below[-1].output[0]
            if chains.private(nodes, out):
                return x, nodes, out, op, centre
    return None

"""Quantization from bounds, not data: the ranges of a float part of a quantized model
carried through it by interval arithmetic, and its matrix nodes (Gemm, MatMul with a
constant (K, N) weight) given QuantizeLinear / DequantizeLinear nodes from them.

Where the ranges come from: a DequantizeLinear's grid (its values are on it whatever made
them), the bounded functions (sigmoid [0, 1], tanh [-1, 1]), constants, the states the
caller names ([-1, 1]), and a GRU's convex update z * a + (1 - z) * b, kept in the hull of
a's and b's ranges.  What a matrix node gets: int8 weights per output channel (symmetric;
int16 where the accumulator has room for any input on its grid, 8 or 16-bit, at steps 4
times finer than int8's at least, _wide_scale), an int32 bias at
the input's step times the weight's, its input on the grid it came from or int16 over its
range (int8 where K products of 32767 x 127 would pass int32), and its sum on the grid of
the QuantizeLinear the model gives it next, else int16 over the largest value those ranges
allow (com.microsoft's int16 QuantizeLinear / DequantizeLinear, at any opset).  front/qdqrecurrent.py says which nodes, and why."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tpuasm.compiler.front.prepare import _attr, _Index
from tpuasm.compiler.front.widths import integer_limits, integer_reach

_CONTRIB = "com.microsoft"
_INT16_MAX = 32767
_LAYOUT = {"Slice", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Transpose", "Flatten"}
# nodes whose outputs hold their first input's values (a Split's every part, a Gather's
# rows, an Expand of an initial state)
_SAME_VALUES = {"Split", "Gather", "Expand", "ReverseSequence", "Tile"}
# nodes whose outputs lie within their first input's range (a mean, a maximum, a pool)
_WITHIN_RANGE = {"ReduceMean", "ReduceMax", "ReduceMin", "GlobalAveragePool",
                 "GlobalMaxPool", "AveragePool", "MaxPool"}
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}
_ACCUMULATOR = 2 ** 31 - 1


class Grid:
    """A tensor's quantization as a DequantizeLinear of the model gives it."""

    def __init__(self, scale: float, zero, dtype):
        self.scale, self.zero, self.dtype = float(scale), zero, np.dtype(dtype)

    @property
    def bounds(self) -> tuple[float, float]:
        low, high = integer_limits(self.dtype)
        zp = float(np.asarray(self.zero).reshape(-1)[0])
        return self.scale * (low - zp), self.scale * (high - zp)


def dequantized_grids(model, idx: _Index) -> dict[str, Grid]:
    """Each activation a per-tensor DequantizeLinear makes -> its grid (its values are on it
    whatever made them: a QuantizeLinear, a QLinearConv); and each float activation the
    model quantizes per tensor for another reader -> that QuantizeLinear's grid.  The second
    is what a QOperator model loses of its QDQ form: quantize_static's QDQ model gives every
    reader of a quantized tensor its DequantizeLinear (an Einsum, which it leaves float,
    reads x on x's grid), its QOperator model only the quantized readers (the Einsum reads
    the float x beside QuantizeLinear(x)); read on that grid, the product is the QDQ
    form's (values beyond the calibrated range clipped as there)."""
    grids, quantized = {}, {}
    for node in model.graph.node:
        if node.op_type not in ("DequantizeLinear", "QuantizeLinear") or \
                node.input[0] in idx.inits:
            continue
        scale = idx.const(node.input[1])
        zero = idx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if scale is None or scale.size != 1 or (zero is not None and zero.size != 1):
            continue
        dtype = zero.dtype if zero is not None else np.uint8
        if integer_limits(dtype) is None:       # a float8 grid: not the TPU's
            continue
        grid = Grid(scale.reshape(-1)[0], np.zeros((), dtype) if zero is None else zero,
                    dtype)
        if node.op_type == "DequantizeLinear":
            grids[node.output[0]] = grid
        else:
            quantized.setdefault(node.input[0], grid)
    for tensor, grid in quantized.items():
        grids.setdefault(tensor, grid)
    return grids


class BoundsQuantizer:
    """QDQ nodes around the unrolled nodes' Gemms; the range of every tensor they make
    carried through them (interval arithmetic, each state held to [-1, 1])."""

    def __init__(self, model, grids: dict, states: set, declared: dict | None = None):
        self.model, self.grids, self.states = model, grids, states
        self.idx = _Index(model)
        # the user's float inputs' ranges (--input-range), the others carried from them
        self.ranges: dict[str, tuple[float, float]] = dict(declared or {})
        self.weights: dict[str, tuple] = {}          # a weight -> (its DQ output, scales)
        self.read: dict[tuple, str] = {}              # (tensor, grid) -> its QDQ's output
        self.reasons: dict[str, str] = {}             # a Gemm left float -> why
        self.done = 0                                 # matrix nodes quantized
        self.inserted: dict[int, list] = {}           # before which node -> new nodes
        self.uses_contrib = False

    # ranges ---------------------------------------------------------------------------
    def range_of(self, tensor: str) -> tuple[float, float] | None:
        if tensor in self.ranges:
            return self.ranges[tensor]
        grid = self._grid(tensor)
        if grid is not None:
            return grid.bounds
        if tensor in self.states:
            return -1.0, 1.0
        value = self.idx.const(tensor)
        if value is not None and value.size:
            return float(value.min()), float(value.max())
        return None

    def _grid(self, tensor: str) -> Grid | None:
        """The grid of a DequantizeLinear the tensor comes from through layout nodes."""
        for _ in range(16):
            if tensor in self.grids:
                return self.grids[tensor]
            node = self.idx.producer.get(tensor)
            if node is None or node.op_type not in _LAYOUT or not node.input:
                return None
            tensor = node.input[0]
        return None

    def _carry(self, node) -> None:
        """The range of each output of `node` from its inputs' (interval arithmetic)."""
        ins = [self.range_of(t) if t else None for t in node.input]
        op = node.op_type
        found = None
        if op == "Sigmoid":
            found = (0.0, 1.0)
        elif op == "Tanh":
            found = (-1.0, 1.0)
        elif op == "Relu" and ins and ins[0] is not None:
            found = (max(ins[0][0], 0.0), max(ins[0][1], 0.0))
        elif op == "Neg" and ins and ins[0] is not None:
            found = (-ins[0][1], -ins[0][0])
        elif op in _LAYOUT or op in _SAME_VALUES or (op == "Cast" and _attr(node, "to")
                                                    in _FLOAT_TYPES):
            found = ins[0] if ins else None              # (a Slice's starts are not data)
        elif op in _WITHIN_RANGE and ins and ins[0] is not None:
            found = ins[0]
        elif op == "Concat" and ins and None not in ins:
            found = (min(r[0] for r in ins), max(r[1] for r in ins))
        elif op == "Add" and self._mix(node) is not None:
            found = self._mix(node)
        elif op in ("Add", "Sub", "Mul") and len(ins) == 2 and None not in ins:
            (a, b), (c, d) = ins
            if op == "Add":
                found = (a + c, b + d)
            elif op == "Sub":
                found = (a - d, b - c)
            else:
                products = (a * c, a * d, b * c, b * d)
                found = (min(products), max(products))
        for out in node.output:
            bounded = found
            if out in self.states:                  # by construction, whatever the sums say
                bounded = (-1.0, 1.0) if found is None else (max(found[0], -1.0),
                                                             min(found[1], 1.0))
            if out and bounded is not None:
                self.ranges[out] = bounded

    def _mix(self, node) -> tuple[float, float] | None:
        """A GRU's update z * a + (1 - z) * b (either order, either side of each product):
        a convex mix, in the hull of a's and b's ranges, where interval arithmetic would
        widen the state by its own range every step."""
        products = [self._through_casts(t) for t in node.input]
        if len(products) != 2 or any(p is None or p.op_type != "Mul" for p in products):
            return None
        for (z, a), (w, b) in ((pz, pw) for pz in _pairs(products[0])
                               for pw in _pairs(products[1])):
            if self._one_minus(w, z) or self._one_minus(z, w):
                ra, rb = self.range_of(a), self.range_of(b)
                zr = self.range_of(z)
                if ra is None or rb is None or zr is None or zr[0] < 0 or zr[1] > 1:
                    continue
                return min(ra[0], rb[0]), max(ra[1], rb[1])
        return None

    def _through_casts(self, tensor: str):
        """The node that makes `tensor`, past float Casts and Identities (jax2onnx writes
        a Cast to float32 after each product)."""
        node = self.idx.producer.get(tensor)
        while node is not None and (node.op_type == "Identity" or (
                node.op_type == "Cast" and _attr(node, "to") in _FLOAT_TYPES)):
            node = self.idx.producer.get(node.input[0])
        return node

    def _one_minus(self, w: str, z: str) -> bool:
        """Whether `w` is 1 - z."""
        node = self._through_casts(w)
        if node is None or node.op_type != "Sub" or len(node.input) != 2 or node.input[1] != z:
            return False
        one = self.idx.const(node.input[0])
        return one is not None and one.size >= 1 and bool(np.all(one == 1))

    # the Gemms ------------------------------------------------------------------------
    def quantize(self, nodes: list, unknown, matrices: set | None = None) -> None:
        """Ranges carried through `nodes` (in order) and each Gemm / MatMul of them
        (`matrices`: of those names only) quantized; `unknown(node)`: why one whose input
        has no known range stays float (the report's reason)."""
        for node in nodes:
            if node.op_type in ("Gemm", "MatMul") and (matrices is None or
                                                       node.name in matrices):
                self._matrix(node, unknown)
            else:
                self._carry(node)

    def _matrix(self, node, unknown) -> None:
        a, w_name = node.input[0], node.input[1]
        gemm = node.op_type == "Gemm"
        b_name = node.input[2] if gemm and len(node.input) > 2 else ""
        a_range = self.range_of(a)
        w = self.idx.const(w_name)
        plain = not gemm or (not _attr(node, "transA", 0) and not _attr(node, "transB", 0)
                             and _attr(node, "alpha", 1.0) == 1.0
                             and (not b_name or _attr(node, "beta", 1.0) == 1.0))
        if w is None or w.ndim != 2 or not plain:
            return                                   # not a constant (K, N) weight
        if a_range is None:
            self.reasons[node.name] = unknown(node)
            return
        bias = self.idx.const(b_name) if b_name else np.zeros(w.shape[1], np.float32)
        if bias is None or bias.size != w.shape[1]:
            return
        bias = bias.reshape(-1).astype(np.float64)
        a_q = self._grid(a)
        if a_q is not None and a_q.dtype.itemsize == 1:
            w_q, w_scale = self._weight(w_name, w, wide=_wide_scale(w, bias, a_q.scale))
        else:
            # an int16 input (a state, a sum, a declared range): int16 weights too where the
            # accumulators have room at steps still 4 times finer than int8's
            grid = a_q or _int16_grid(a_range)
            wide = _wide_scale(w, bias, grid.scale, _reach(grid))
            w_q, w_scale = self._weight(w_name, w, wide=wide)
            a_q = a_q or (grid if wide is not None else self._symmetric_grid(a_range, w_q))
        lo, hi = a_q.bounds
        # the sum's bound: each product at the end of A's range that makes it largest
        w_real = w_q.astype(np.float64) * w_scale
        top = np.maximum(w_real * lo, w_real * hi).sum(0) + bias
        low = np.minimum(w_real * lo, w_real * hi).sum(0) + bias
        bound = max(float(np.max(np.abs(top))), float(np.max(np.abs(low))), 1e-6)
        self.ranges[node.output[0]] = (float(low.min()), float(top.max()))
        b_scale = (a_q.scale * w_scale).astype(np.float32)
        b_q = np.rint(bias / b_scale).astype(np.int64)
        if np.abs(b_q).max(initial=0) > _ACCUMULATOR:
            return
        key = (a, a_q.scale, a_q.dtype.str)
        if key not in self.read:                     # one QDQ of h for every gate's Gemm
            self.read[key] = self._qdq(a, a_q, f"{node.name}/a")
        inputs = [self.read[key], self.weights[(w_name, w_q.dtype == np.int16)][0]]
        if b_name:
            inputs.append(self._dequantized(b_q.astype(np.int32), b_scale,
                                            np.zeros(len(b_scale), np.int32),
                                            f"{node.name}/bias", axis=0))
        out = node.output[0]
        del node.input[:]
        node.input.extend(inputs)
        self.done += 1
        grid, direct = self._requantized(out)
        if direct:                        # the model's own QuantizeLinear takes the sum
            return
        raw = self.idx.unique(f"{out}/float")
        node.output[0] = raw
        grid = grid or Grid(bound / _INT16_MAX, np.zeros((), np.int16), np.int16)
        self._qdq(raw, grid, f"{node.name}/sum", out=out, after=node)

    def _requantized(self, tensor: str) -> tuple[Grid | None, bool]:
        """(the grid, whether right after it) of the per-tensor QuantizeLinear the model
        gives `tensor` (through layout nodes, read by nothing else), or (None, False): an
        Einsum onnxruntime left float between two quantized layers.  Its sum is put on that
        grid at the MatMul (once more after the layout nodes: the same values)."""
        direct = True
        for _ in range(16):
            node = self.idx.sole_consumer(tensor)
            if node is None:
                return None, False
            if node.op_type == "QuantizeLinear" and node.input[0] == tensor:
                scale = self.idx.const(node.input[1])
                zero = self.idx.const(node.input[2]) if len(node.input) > 2 and \
                    node.input[2] else np.zeros((), np.uint8)
                if scale is None or scale.size != 1 or zero is None or zero.size != 1:
                    return None, False
                return Grid(scale.reshape(-1)[0], zero.reshape(()), zero.dtype), direct
            if node.op_type not in _LAYOUT or node.input[0] != tensor:
                return None, False
            tensor, direct = node.output[0], False
        return None, False

    def _symmetric_grid(self, a_range, w_q) -> Grid:
        """int16 over a range (a state's: [-1, 1]), or int8 where int16 products would overflow the
        int32 accumulator (a sum of K products of 32767 x 127)."""
        if int(np.abs(w_q.astype(np.int64)).sum(0).max()) * _INT16_MAX < _ACCUMULATOR:
            return _int16_grid(a_range)
        top = max(abs(a_range[0]), abs(a_range[1]), 1e-6)
        return Grid(top / 127, np.zeros((), np.int8), np.int8)

    def _weight(self, name: str, w: np.ndarray, wide: np.ndarray | None = None):
        """int8 per output channel (the columns of a (K, N) weight), symmetric, or int16 at
        the steps `wide` gives (_wide_scale); one DequantizeLinear for every step's Gemm
        that shares it."""
        key = (name, wide is not None)
        if key not in self.weights:
            if wide is None:
                peak = np.abs(w).max(0)
                scale = np.where(peak > 0, peak / 127, 1.0).astype(np.float32)
                w_q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
            else:
                scale = wide
                w_q = np.clip(np.rint(w / scale), -_INT16_MAX, _INT16_MAX).astype(np.int16)
                self.uses_contrib = True
            dq = self._dequantized(w_q, scale, np.zeros(len(scale), w_q.dtype), f"{name}/q",
                                   axis=1)
            self.weights[key] = (dq, scale, w_q)
        _, scale, w_q = self.weights[key]
        return w_q, scale.astype(np.float64)

    def _dequantized(self, q: np.ndarray, scale, zero, tag: str, axis: int) -> str:
        q_name = self.idx.add_init(q, tag)
        s_name = self.idx.add_init(np.asarray(scale, np.float32), f"{tag}_scale")
        z_name = self.idx.add_init(np.asarray(zero), f"{tag}_zero")
        out = self.idx.unique(f"{tag}:dq")
        domain = _CONTRIB if q.dtype == np.int16 else ""    # int16 at any opset
        self._add(helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [out],
                                   name=self.idx.unique(f"{tag}/DequantizeLinear"), axis=axis,
                                   domain=domain),
                  None)
        return out

    def _qdq(self, tensor: str, grid: Grid, tag: str, out: str | None = None,
             after=None) -> str:
        """QuantizeLinear -> DequantizeLinear of `tensor` on `grid`: the dequantized name."""
        domain = _CONTRIB if grid.dtype == np.int16 else ""
        self.uses_contrib |= bool(domain)
        s_name = self.idx.add_init(np.asarray(grid.scale, np.float32), f"{tag}_scale")
        z_name = self.idx.add_init(np.asarray(grid.zero, grid.dtype).reshape(()), f"{tag}_zero")
        q_out = self.idx.unique(f"{tag}:q")
        out = out or self.idx.unique(f"{tag}:dq")
        q = helper.make_node("QuantizeLinear", [tensor, s_name, z_name], [q_out],
                             name=self.idx.unique(f"{tag}/QuantizeLinear"), domain=domain)
        dq = helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [out],
                              name=self.idx.unique(f"{tag}/DequantizeLinear"), domain=domain)
        self._add(q, after)
        self._add(dq, after)
        return out

    def _add(self, node, after) -> None:
        """`node` into the graph: after `after` when given (a Gemm's output), else before
        the Gemm being rewritten (its inputs): finish() puts them in place."""
        self.inserted.setdefault(id(after) if after is not None else None, []).append(node)

    def finish(self) -> None:
        """The new nodes in topological order: inputs' QDQ (and weights) first, each Gemm's
        output QDQ right after it."""
        before = self.inserted.pop(None, [])
        nodes = list(before)
        for node in self.model.graph.node:
            nodes.append(node)
            nodes.extend(self.inserted.get(id(node), []))
        # an input's QuantizeLinear reads a tensor made earlier in the graph: sort
        nodes = _topological(nodes, self.model)
        del self.model.graph.node[:]
        self.model.graph.node.extend(nodes)
        if self.uses_contrib and not any(o.domain == _CONTRIB for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid(_CONTRIB, 1))


# int16 weights are kept where their rounding noise is this far below int8's (steps 4 times
# finer), as wideweights.MIN_GAIN_DB: each costs the array half its rate
_WIDE_GAIN_DB = 12.0
_BYTE = 255                     # the largest 8-bit input, raw or less its zero point


def _int16_grid(a_range) -> Grid:
    top = max(abs(a_range[0]), abs(a_range[1]), 1e-6)
    return Grid(top / _INT16_MAX, np.zeros((), np.int16), np.int16)


def _reach(grid: Grid) -> int:
    """The largest |q - z| an input on `grid` multiplies a weight by."""
    return integer_reach(grid.dtype, int(np.asarray(grid.zero).reshape(-1)[0]))


def _wide_scale(w: np.ndarray, bias: np.ndarray, a_scale: float,
                reach: int = 2 * _BYTE) -> np.ndarray | None:
    """int16 weight steps per output channel for a (K, N) weight over an input of integer
    reach `reach` (default: an 8-bit input, 255 twice: the products, once more for a zero
    point's correction), or None where int8 does as well: each channel's finest step
    (max |w| / 32767), widened until no input can pass the int32 accumulator, and kept
    where the noise (the sum of the squared steps) is _WIDE_GAIN_DB below int8's.  At step s
    the accumulator holds at most reach x sum |w_q| plus |bias| / (a_scale s), and
    sum |w_q| <= sum |w| / s + K / 2 (the rounding)."""
    peak = np.abs(w).max(0).astype(np.float64)
    live = peak > 0
    room = _ACCUMULATOR - reach * w.shape[0] / 2
    if not live.any() or room <= 0:
        return None
    fits = (reach * np.abs(w).sum(0) + np.abs(bias) / a_scale) / room
    scale = np.where(live, np.maximum(peak / _INT16_MAX, fits), 1.0)
    eight = peak / 127
    gain = 10 * np.log10(np.sum(eight[live] ** 2) / np.sum(scale[live] ** 2))
    return scale.astype(np.float32) if gain >= _WIDE_GAIN_DB else None


def _pairs(mul) -> list[tuple[str, str]]:
    """A Mul's (factor, other factor), both ways round."""
    a, b = mul.input[0], mul.input[1]
    return [(a, b), (b, a)]


def _topological(nodes: list, model) -> list:
    """`nodes` in an order where every tensor is made before it is read (stable)."""
    known = {t.name for t in model.graph.initializer} | {v.name for v in model.graph.input}
    known.add("")
    made_by = {o: k for k, n in enumerate(nodes) for o in n.output}
    order, state = [], {}

    def visit(k):
        stack = [(k, False)]
        while stack:
            i, done = stack.pop()
            if done:
                if state.get(i) != 2:
                    state[i] = 2
                    order.append(nodes[i])
                continue
            if state.get(i):
                continue
            state[i] = 1
            stack.append((i, True))
            for t in reversed(nodes[i].input):
                j = made_by.get(t)
                if t not in known and j is not None and not state.get(j):
                    stack.append((j, False))

    for k in range(len(nodes)):
        visit(k)
    return order

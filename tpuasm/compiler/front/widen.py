"""Which activation tensors are quantized to 16 bits (the TPU v1's 8-bit weights x 16-bit
activations, at half the multiply rate: MatrixMultiply's H flag reads an int16 vector from
two UB rows, Activate's act_out = 2 writes one).

A tensor can be int16 when every TPU operator that touches it takes 16 bits:
- it is made by a matrix node (Conv, Gemm, MatMul, with its fused Relu / Clip or bias Add)
  that Activate requantizes, by a VADD / VMUL of two activations of one (rows, channels)
  shape (an LSTM's cell state c = f*c + i*g: X, Y, Z take 16-bit operands, spec/isa.md
  5.11), or it comes from the host (a model input, a host node's output: the runtime
  quantizes it);
- every quantized node that reads it (through layout nodes: Flatten, Reshape, ...) is a
  matrix node reading it as its activation, such a VADD / VMUL, or a Tanh or Sigmoid
  table, which reads it through onnxruntime's `convert` to 8 bits (QuantizeLinear of the
  dequantized int16: `converted`), the byte the 256-entry table indexes, over the range
  where the function still changes (`index_range`: finer than the tensor's own).
Pooling, other tables, Relu / Clip (fused into the op before them as its clamp) and VADD /
VMUL with a constant or a broadcast operand take 8-bit tensors only, so a tensor one of
them reads or writes stays 8-bit (`refusals` says why).  Host nodes read the dequantized
float value either way.  Weights are int8 per channel unless front/wideweights.py gives
them 16 bits.

onnxruntime quantizes a chosen tensor as QInt16 through its TensorQuantOverrides (the model
is moved to opset 21, whose QuantizeLinear / DequantizeLinear take int16).

The accumulators stay int32 and wrap (spec/isa.md 5.4): an int16 input makes each product
256 times larger than an 8-bit one.  `accumulator_refusals` estimates, from the float
model's values on the calibration data (`Accumulators`: one onnxruntime pass, shared with
the 16-bit weights' own guard, front/wideweights.py), the largest sum each reader of a
chosen tensor would hold (its int32 bias plus ACC_HEADROOM times its products' largest
sum, in units of input step x weight step); a tensor whose readers would not fit int32
stays 8-bit, with the figure as its reason."""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from tpuasm.compiler.errors import CompileError

MATRIX_OPS = {"Conv", "Gemm", "MatMul"}
LAYOUT_OPS = {"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity"}
VECTOR_OPS = {"Add", "Sub", "Mul"}
_FUSED_ACTIVATIONS = {"Relu", "Clip"}
# functions whose 8-bit input saturates: the index range stops where they stop changing
_SATURATING = {"Tanh": np.tanh, "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}


def eligible(model: onnx.ModelProto, chosen: set[str], vectors: bool = True
             ) -> tuple[dict, dict]:
    """({tensor: [tensors quantized alike]}, {tensor: why it stays 8-bit}) over the
    activation tensors that a quantized matrix node reads or writes, and with `vectors`
    those of VADD / VMUL and the Tanh / Sigmoid tables too (without: only the tensors
    between matrix operators, which cost no instruction more); `chosen`: the quantized
    nodes (quantize.tpu_nodes).  Each key is the tensor as its producer writes it (before
    any layout node); its list holds it and the layout nodes' outputs that carry its
    values."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output if o}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            if i:
                consumers.setdefault(i, []).append(n)
    vector = _vector_nodes(model, chosen) if vectors else set()
    roots: dict[str, None] = {}
    for n in g.node:
        if n.name in chosen and n.op_type in MATRIX_OPS and n.input and n.input[0] not in inits:
            roots[root_of(n.input[0], producer, chosen)] = None
            roots[_written(n, consumers, chosen)] = None      # its result (host readers)
        elif n.name in vector:
            for t in n.input:
                roots[root_of(t, producer, chosen)] = None
            roots[n.output[0]] = None
    groups, refusals = {}, {}
    for root in roots:
        why = _producer_refusal(root, producer, consumers, chosen, vector)
        members = _carried(root, consumers, chosen)
        if why is None:
            why = _reader_refusal(members, consumers, chosen, vector, vectors)
        if why is None:
            groups[root] = members
        else:
            refusals[root] = why
    return groups, refusals


def root_of(name: str, producer: dict, chosen: set) -> str:
    """The tensor before the quantized layout nodes that lead to `name`."""
    for _ in range(64):
        node = producer.get(name)
        if node is None or node.name not in chosen or node.op_type not in LAYOUT_OPS:
            return name
        name = node.input[0]
    return name


def _written(node, consumers: dict, chosen: set) -> str:
    """The tensor a matrix node's Activate writes: its output, or that of the Relu / Clip or
    bias Add fused into it."""
    out = node.output[0]
    readers = consumers.get(out, [])
    if len(readers) == 1 and readers[0].name in chosen and (
            readers[0].op_type in _FUSED_ACTIVATIONS or
            (readers[0].op_type == "Add" and node.op_type == "MatMul")):
        return readers[0].output[0]
    return out


def _carried(root: str, consumers: dict, chosen: set) -> list[str]:
    """`root` and the outputs of the quantized layout nodes that read it (recursively)."""
    members, todo = [root], [root]
    while todo:
        for node in consumers.get(todo.pop(), ()):
            if node.name in chosen and node.op_type in LAYOUT_OPS:
                for out in node.output:
                    if out and out not in members:
                        members.append(out)
                        todo.append(out)
    return members


def _vector_nodes(model: onnx.ModelProto, chosen: set) -> set[str]:
    """The quantized Add / Sub / Mul nodes of two activations of one (rows, channels) shape:
    a VADD / VMUL whose operands and result may each be 16-bit (X, Y, Z).  Image tensors,
    constants and broadcasts keep their 8-bit forms (the B flag's constant row, padding
    rows and the array's spread read bytes)."""
    g = model.graph
    inits = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant"
                                               for o in n.output}
    shapes = {v.name: v.type.tensor_type.shape for v in
              (*g.value_info, *g.input, *g.output)}
    if any(n.name in chosen and n.op_type in VECTOR_OPS and o not in shapes
           for n in g.node for o in n.output):
        # a model without its value infos (the search's prepared model): onnx infers them
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph
        except Exception:               # noqa: BLE001 - no shapes: no 16-bit vector nodes
            inferred = g
        shapes.update({v.name: v.type.tensor_type.shape for v in inferred.value_info})

    def dims(name):
        shape = shapes.get(name)
        if shape is None:
            return None
        return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param
                     for d in shape.dim)

    found = set()
    for n in g.node:
        if n.name not in chosen or n.op_type not in VECTOR_OPS or len(n.input) != 2 or \
                any(not i or i in inits for i in n.input):
            continue
        a, b, y = dims(n.input[0]), dims(n.input[1]), dims(n.output[0])
        if a is not None and len(a) == 2 and a == b == y:
            found.add(n.name)
    return found


def _producer_refusal(root: str, producer: dict, consumers: dict, chosen: set,
                      vector: set) -> str | None:
    node = producer.get(root)
    if node is None or node.name not in chosen or node.op_type in MATRIX_OPS or \
            node.name in vector:
        return None
    if node.op_type in _FUSED_ACTIVATIONS and node.input:
        before = producer.get(node.input[0])
        if before is not None and before.name in chosen and before.op_type in MATRIX_OPS \
                and len(consumers.get(node.input[0], ())) == 1:
            return None                 # Relu / Clip fused into the matrix op's Activate
    if node.op_type == "Add" and any(
            producer.get(i) is not None and producer[i].op_type == "MatMul" and
            producer[i].name in chosen for i in node.input):
        return None                     # a MatMul's bias Add (fused into it)
    return f"made by {node.op_type} '{node.name}' on the TPU, which writes 8-bit only"


def _reader_refusal(members: list[str], consumers: dict, chosen: set,
                    vector: set, tables: bool) -> str | None:
    names = set(members)
    for t in members:
        for node in consumers.get(t, ()):
            if node.name not in chosen or node.name in vector or \
                    (tables and _table_reader(node)):
                continue                # the host reads the dequantized float value
            if node.op_type in LAYOUT_OPS and node.output and node.output[0] in names:
                continue
            if node.op_type in MATRIX_OPS and node.input and node.input[0] == t and \
                    t not in node.input[1:]:
                continue
            return (f"read by {node.op_type} '{node.name}' on the TPU, which reads 8-bit only "
                    f"(pooling, tables but Tanh / Sigmoid, VADD/VMUL with a constant, a "
                    f"broadcast or an image)")
    return None


def _table_reader(node) -> bool:
    """A lookup table node that reads a 16-bit tensor converted to 8 bits (`converted`):
    Tanh and Sigmoid, whose index range narrows to where they still change (index_range).
    Any other table would read the same 256 steps as an 8-bit tensor, for one more VADD."""
    return node.op_type in _SATURATING


def converted(model: onnx.ModelProto, picked: dict, chosen: set) -> dict[str, list[str]]:
    """{16-bit tensor of `picked`: the quantized lookup nodes that read it}: each reads it
    converted to 8 bits (onnxruntime's `convert` override: its QuantizeLinear to int16,
    DequantizeLinear, then a QuantizeLinear to 8 bits and its DequantizeLinear), the byte
    its table indexes; on the TPU a VADD with X requantizes it and looks it up at once."""
    tables: dict[str, list[str]] = {}
    for n in model.graph.node:
        if n.name in chosen and _table_reader(n):
            for i in dict.fromkeys(n.input):
                tables.setdefault(i, []).append(n.name)
    return {t: tables[t] for members in picked.values() for t in members if t in tables}


def index_range(model: onnx.ModelProto, node_names, low: float, high: float,
                ranges: dict) -> tuple[float, float]:
    """The 8-bit range a 16-bit tensor of range (low, high) is converted to for the lookup
    nodes `node_names` (converted): where Tanh / Sigmoid saturate, within half of their
    output's 8-bit step (its calibrated range in `ranges`) of their limit, the range stops:
    the index's 256 steps go where the function still changes.  Several readers (or any
    other function) keep the whole range."""
    nodes = [n for n in model.graph.node if n.name in set(node_names)]
    function = _SATURATING.get(nodes[0].op_type) if len(nodes) == 1 else None
    out = ranges.get(nodes[0].output[0]) if nodes else None
    if function is None or out is None or not high > low:
        return low, high
    bottom, top = min(float(np.min(out[0])), 0.0), max(float(np.max(out[1])), 0.0)
    step = (top - bottom) / 255
    if not step > 0:
        return low, high
    grid = np.linspace(low, high, 4097)
    values = function(grid)          # increasing: the levels between are one interval
    changing = np.flatnonzero((values > bottom + step / 2) & (values < top - step / 2))
    if changing.size == 0:
        return low, high
    # one grid point beyond the last that still changes: saturated from there on
    return (float(grid[max(changing[0] - 1, 0)]),
            float(grid[min(changing[-1] + 1, grid.size - 1)]))


def requantized_inputs(qdq: onnx.ModelProto, nodes) -> list[str]:
    """The matrix nodes among `nodes` (names) whose activation reaches them through a
    requantization in the QDQ model `qdq`: a DequantizeLinear, layout nodes, then another
    QuantizeLinear/DequantizeLinear pair of other parameters (a 16-bit tensor on one side
    of a host Squeeze, 8 bits on the other).  The TPU operator cannot read such an input
    (match.py), so it would run on the host."""
    g = qdq.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output if o}
    wanted = set(nodes)

    def params(node):
        return tuple(numpy_helper.to_array(inits[i]).tobytes() + bytes([inits[i].data_type])
                     if i in inits else i.encode() for i in node.input[1:3])

    found = []
    for node in g.node:
        if node.name not in wanted or node.op_type not in MATRIX_OPS or not node.input:
            continue
        first, current = None, node.input[0]
        for _ in range(256):
            dq = producer.get(current)
            while dq is not None and dq.op_type in LAYOUT_OPS:
                dq = producer.get(dq.input[0])
            if dq is None or dq.op_type != "DequantizeLinear":
                break
            if first is None:
                first = params(dq)
            elif params(dq) != first:
                found.append(node.name)
                break
            q = producer.get(dq.input[0])
            if q is None or q.op_type != "QuantizeLinear":
                break
            inner = producer.get(q.input[0])
            if inner is None or inner.op_type not in LAYOUT_OPS | {"DequantizeLinear"}:
                break                   # a real quantization: the tensor's source
            current = q.input[0]
    return found


def choose(model: onnx.ModelProto, chosen: set[str], options, path="the model") -> dict:
    """{tensor: [tensors quantized alike]} of the 16-bit tensors `options` asks for:
    every eligible one with activation_bits 16, and those named by wide_tensors (the user's;
    a name that is not an eligible tensor is refused with its reason) or checked_wide (the
    calibration check's).  `drop_wrapping` then keeps 8-bit those whose readers'
    accumulators could wrap."""
    groups, refusals = eligible(model, chosen)
    carrier = {m: root for root, members in groups.items() for m in members}
    picked: dict[str, list] = {}
    if options.activation_bits == 16:
        picked.update(groups)
    for name in options.wide_tensors:
        root = carrier.get(name)
        if root is None:
            why = refusals.get(name)
            known = {o for n in model.graph.node for o in n.output} | \
                {v.name for v in model.graph.input}
            if why is None:
                why = ("no tensor of that name in the model" if name not in known else
                       "not an activation that a matrix operator on the TPU reads")
            raise CompileError(f"{path}: --wide-tensor {name}: cannot be 16-bit: {why}")
        picked[root] = groups[root]
    for name in options.checked_wide:
        root = carrier.get(name)
        if root is not None:
            picked[root] = groups[root]
    for root in [r for r, members in picked.items()
                 if set(members) & set(options.narrow_tensors)]:
        del picked[root]
    return picked


def drop_wrapping(model: onnx.ModelProto, picked: dict, chosen: set[str], accumulators,
                  per_channel: bool = True, notes: dict | None = None) -> None:
    """Remove from `picked` (choose) the tensors whose readers' accumulators could wrap
    with them int16 (accumulator_refusals, over `accumulators`); `notes` gets {"kept
    8-bit": {tensor: why}}."""
    refused = accumulator_refusals(model, picked, chosen, accumulators, per_channel)
    for root in refused:
        picked.pop(root, None)
    if notes is not None and refused:
        notes.setdefault("kept 8-bit", {}).update(refused)


def readers(model: onnx.ModelProto, picked: dict, chosen: set[str]) -> dict[str, list]:
    """{picked root: the quantized matrix nodes with a constant weight that read it}."""
    inits = {t.name for t in model.graph.initializer}
    out = {}
    for root, members in picked.items():
        names = set(members)
        out[root] = [node for node in model.graph.node
                     if node.name in chosen and node.op_type in MATRIX_OPS and node.input
                     and node.input[0] in names and len(node.input) > 1
                     and node.input[1] in inits]
    return out


INT32_LIMIT = 2 ** 31 - 1
ACC_HEADROOM = 4          # the calibration data's largest accumulator, times this, must fit


class Accumulators:
    """What the calibration data says about matrix nodes' int32 accumulators, from one
    onnxruntime pass of the float model over the feeds of `reader`: the range of each of
    `tensors`, and per output channel of each of `nodes` (matrix nodes) the products'
    largest sum max |y[n] - b[n]| (its output before any fused Relu, less its bias: what
    the accumulators hold before the bias is added) and its bias.  `ranges` ({tensor:
    (low, high)}, the calibration method's) take the place of the pass's min-max where
    they name a tensor: they are the steps onnxruntime will choose.  `ok` is False when the
    pass could not run (no figures: nothing is refused)."""

    def __init__(self, model: onnx.ModelProto, nodes, tensors, reader,
                 ranges: dict | None = None):
        from tpuasm.compiler.front.prepare import matmul_bias_pairs
        g = model.graph
        inits = {t.name: t for t in g.initializer}
        wanted = set(nodes)
        self.nodes = {n.name: n for n in g.node if n.name in wanted}
        fused = {mm.name: b for mm, _, b, rank in matmul_bias_pairs(model) if rank >= 3}
        self.bias: dict[str, np.ndarray] = {}
        for node in self.nodes.values():
            if node.op_type == "MatMul" and node.name in fused:   # its fused bias Add
                self.bias[node.name] = np.asarray(fused[node.name], np.float64).reshape(-1)
            elif node.op_type != "MatMul" and len(node.input) > 2 and node.input[2] in inits:
                self.bias[node.name] = numpy_helper.to_array(
                    inits[node.input[2]]).astype(np.float64).reshape(-1)
        subtract = {n.output[0]: self.bias[n.name] for n in self.nodes.values()
                    if n.name in self.bias and n.op_type != "MatMul"}
        outputs = sorted(set(tensors) | {n.output[0] for n in self.nodes.values()})
        self.low = {t: math.inf for t in tensors}
        self.high = {t: -math.inf for t in tensors}
        self.peak: dict[str, np.ndarray] = {}          # node output -> per channel
        self.ok = True
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
        known = {o.name for o in probe.graph.output}
        probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t)
                                  for t in outputs if t not in known)
        from tpuasm.compiler.ort import session
        try:
            run = session(probe, threads=0)
            while (feed := reader.get_next()) is not None:
                for t, value in zip(outputs, run.run(outputs, feed)):
                    self._fold(t, np.asarray(value, np.float64), subtract.get(t), g)
        except Exception:               # noqa: BLE001 - no figures: decide without them
            self.ok = False
        for t, (lo, hi) in (ranges or {}).items():
            if t in self.low:
                self.low[t] = float(np.min(lo))
                self.high[t] = float(np.max(hi))

    def _fold(self, t: str, value: np.ndarray, bias, graph) -> None:
        if not value.size:
            return
        if t in self.low:
            self.low[t] = min(self.low[t], float(value.min()))
            self.high[t] = max(self.high[t], float(value.max()))
        channels = -1 if _last_axis(t, graph) else (1 if value.ndim >= 2 else 0)
        moved = np.moveaxis(value, channels, 0)
        moved = moved.reshape(moved.shape[0], -1)
        if bias is not None and bias.size == moved.shape[0]:
            moved = moved - bias[:, None]
        per = np.abs(moved).max(axis=1)
        self.peak[t] = per if t not in self.peak else np.maximum(self.peak[t], per)

    def step(self, tensor: str, bits: int) -> float | None:
        """The quantization step of `tensor` at `bits` (its range, widened to hold 0, over
        2^bits - 1 levels); None without a finite, non-empty range."""
        lo, hi = min(self.low.get(tensor, math.inf), 0.0), max(self.high.get(tensor, -math.inf),
                                                               0.0)
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo <= 0:
            return None
        return (hi - lo) / (2 ** bits - 1)

    def _sums(self, node: str):
        """(the products' largest sums, |bias|) per output channel of `node`, or None."""
        found = self.nodes.get(node)
        products = None if found is None else self.peak.get(found.output[0])
        if products is None:
            return None
        bias = self.bias.get(node)
        b = np.zeros(products.shape) if bias is None or bias.size != products.size \
            else np.abs(bias)
        return products, b

    def fitted_steps(self, node: str, x_step: float, w_steps) -> np.ndarray | None:
        """The weight steps onnxruntime writes for `w_steps` (one, or one per channel) at
        input step `x_step`: it widens a step until the int32 bias fits (its
        _adjust_weight_scale_for_int32_bias), so the bias then nearly fills int32."""
        sums = self._sums(node)
        if sums is None or not x_step:
            return None
        products, b = sums
        w = np.broadcast_to(w_steps, products.shape) if np.size(w_steps) == 1 else \
            np.asarray(w_steps, np.float64)
        if w.shape != products.shape:
            w = np.full(products.shape, float(np.max(w_steps)))
        return np.maximum(w, 1.0001 * 2 * b / ((2.0 ** 32 - 2) * x_step))

    def need(self, node: str, x_step: float, w_steps: np.ndarray,
             headroom: float = ACC_HEADROOM) -> np.ndarray | None:
        """Per output channel of matrix node `node`, the largest value its accumulators
        would reach at input step `x_step` and weight steps `w_steps` (as onnxruntime
        fits them, fitted_steps): its int32 bias |b[n]| / (x_step w[n]) plus `headroom`
        times its products' largest sum (the sums wrap modulo 2^32, so only the final value
        matters).  None without figures for it."""
        w = self.fitted_steps(node, x_step, w_steps)
        if w is None:
            return None
        products, b = self._sums(node)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(w > 0, (b + headroom * products) / (x_step * w), 0.0)

    def fitting_steps(self, node: str, x_step: float, headroom: float = ACC_HEADROOM,
                      bound: np.ndarray | None = None) -> np.ndarray | None:
        """Per output channel, the finest weight step at which `node`'s accumulators fit
        int32 at input step `x_step`: its bias plus `headroom` times its products' largest
        sum, or plus `bound` (the products' sum that no input can exceed) where that is
        less; None without figures."""
        sums = self._sums(node)
        if sums is None or not x_step:
            return None
        products, b = sums
        sums = headroom * products if bound is None else np.minimum(headroom * products,
                                                                    bound)
        return 1.0001 * (b + sums) / (x_step * INT32_LIMIT)

    def reach(self, tensor: str) -> float | None:
        """The largest |value| `tensor`'s quantization can hold (its range, widened to
        hold 0: values beyond it saturate); None without a range."""
        lo, hi = self.low.get(tensor, math.inf), self.high.get(tensor, -math.inf)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return None
        return max(abs(lo), abs(hi))


def accumulator_refusals(model: onnx.ModelProto, picked: dict, chosen: set[str],
                         accumulators: Accumulators, per_channel: bool = True,
                         wide_weights=frozenset()) -> dict[str, str]:
    """{tensor of `picked`: why its readers' int32 accumulators could wrap with it int16}:
    per output channel of each reader, at the input's int16 step and the weight steps
    onnxruntime will choose (8-bit, or 16-bit for the nodes of `wide_weights`), the need
    (Accumulators.need) must fit int32."""
    if not picked or not accumulators.ok:
        return {}
    inits = {t.name: t for t in model.graph.initializer}
    refusals = {}
    for root, nodes in readers(model, picked, chosen).items():
        step = accumulators.step(root, 16)
        if step is None:
            continue
        worst, culprit = 0.0, ""
        for node in nodes:
            need = accumulators.need(node.name, step, weight_steps(
                node, inits[node.input[1]], per_channel, 16 if node.name in wide_weights
                else 8))
            if need is not None and need.size and float(need.max()) > worst:
                worst, culprit = float(need.max()), node.name
        if worst > INT32_LIMIT:
            refusals[root] = (f"int16, the accumulators of '{culprit}' would reach "
                              f"{worst:.3g} on the calibration data with {ACC_HEADROOM}x "
                              f"headroom on the products (int32 holds {INT32_LIMIT:.3g})")
    return refusals


def _last_axis(tensor: str, graph) -> bool:
    """A MatMul's output: its channels are the last axis."""
    for node in graph.node:
        if tensor in node.output:
            return node.op_type == "MatMul"
    return False


def channel_axis(node) -> int:
    """The axis of `node`'s weight that holds its output channels (onnxruntime's per-channel
    axis): 0 for a Conv and a Gemm with transB, else 1."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
        return 0
    return 1


def weight_peaks(node, weight) -> np.ndarray:
    """max |w| per output channel of a matrix node's float weight."""
    w = np.abs(numpy_helper.to_array(weight).astype(np.float64))
    moved = np.moveaxis(w, channel_axis(node), 0)
    return moved.reshape(moved.shape[0], -1).max(axis=1)


def weight_sums(node, weight) -> np.ndarray:
    """sum |w| per output channel of a matrix node's float weight: times the largest
    |input| its quantization holds, the largest sum of products any input can give."""
    w = np.abs(numpy_helper.to_array(weight).astype(np.float64))
    moved = np.moveaxis(w, channel_axis(node), 0)
    return moved.reshape(moved.shape[0], -1).sum(axis=1)


def weight_steps(node, weight, per_channel: bool, bits: int = 8) -> np.ndarray:
    """The weight step per output channel at `bits` (max |w| / 127 or / 32767, the
    symmetric scale)."""
    per = weight_peaks(node, weight)
    if not per_channel:
        per = np.full_like(per, per.max(initial=0.0))
    steps = per / (2 ** (bits - 1) - 1)
    # a channel whose weights vanish becomes zeros at scale 1 (scales.py): its sum is its
    # bias alone, at the input's scale
    from tpuasm.compiler.front.scales import VANISHING_SCALE
    steps[steps < VANISHING_SCALE] = 1.0
    return steps

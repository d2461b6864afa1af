"""Which matrix nodes get 16-bit weights (the TPU v1's 16-bit weights, MatrixMultiply's D
flag: each weight tile is a pair, its low bytes then its high bytes; the array runs at half
rate, a quarter with an int16 input too; spec/isa.md 5.4, spec/timing.md 6).

Every quantized Conv, Gemm and MatMul with a constant weight can have them (the unrolled
LSTM / GRU gate Gemms too).  `requested` says which the options ask for: every one with
weight_bits 16, the nodes named by wide_weights (the user's: a node of the prepared model,
or a node of the user's model, whose every unrolled or folded matrix node is meant), and
checked_wide_weights (the calibration check's choice).  onnxruntime quantizes a chosen
weight as QInt16 through its TensorQuantOverrides (opset 21), so the QDQ model it writes
stays the reference the compiled model is checked against.

The accumulators stay int32 and wrap: an int16 weight makes each product 256 times larger
than an int8 one (65,536 times with an int16 input).  From the float model's values on the
calibration data (widen.Accumulators, the pass the 16-bit activations' guard reads too),
each node's largest accumulator is estimated at its input's step and the finest int16
weight step (max |w| / 32767 per channel): its bias plus HEADROOM times the calibration's
largest products, or plus the largest sum any input can give where that is less.  Where it
would not fit int32, the weight step of each channel that would overflow is widened until
it fits (its range given to onnxruntime as rmin / rmax per channel).  int16 weights are kept while their rounding noise
(the sum of the squared steps over the live channels) stays MIN_GAIN_DB below that of the
int8 steps onnxruntime would write (which it widens where an int32 bias needs it); a node whose
accumulators leave less keeps 8-bit weights, with the figure as its reason (`notes`)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.front import widen
from tpuasm.compiler.front.scales import VANISHING_SCALE

# int16 weights are worth their half rate while their rounding noise stays this far below
# int8's (12 dB: steps 4 times finer; the finest int16 steps are 258 times finer, 48 dB).
# PP-OCRv4's recogniser (auto, its activations int16): 24 dB kept 13 of its 47 weights
# int8 (CTC lines 78 % identical to float), 12 dB none (92 %)
MIN_GAIN_DB = 12.0
# the calibration data's largest products, times this, must fit int32 at the steps chosen
# (or the sum no input can exceed, where that is less): a coarser step fits the sums
# exactly there, with no slack left beyond it.  4 (the 16-bit activations' guard) was not
# enough for Silero's sequence form: calibrated on one 64-frame stream, another stream's
# LSTM gate sums reached 5.5 times its largest, and the int16-weight gates wrapped
HEADROOM = 16.0


def candidates(model: onnx.ModelProto, chosen: set[str]) -> dict[str, str]:
    """{node: its weight initializer} of the quantized matrix nodes with a constant weight."""
    inits = {t.name for t in model.graph.initializer}
    return {n.name: n.input[1] for n in model.graph.node
            if n.name in chosen and n.op_type in widen.MATRIX_OPS and len(n.input) > 1
            and n.input[1] in inits}


def requested(model: onnx.ModelProto, chosen: set[str], options, path="the model",
              provenance=None) -> list[str]:
    """The matrix nodes `options` asks 16-bit weights for (see the module's note).  A name
    of wide_weights that is no node of the model, or only of nodes that cannot have them,
    is one error that says why."""
    found = candidates(model, chosen)
    picked: dict[str, None] = dict.fromkeys(found) if options.weight_bits == 16 else {}
    if options.wide_weights:
        by_name = {n.name: n for n in model.graph.node}
        unrolled: dict[str, list] = {}
        if provenance is not None:
            for n in model.graph.node:
                unrolled.setdefault(provenance.source(n.name), []).append(n)
        for name in options.wide_weights:
            nodes = [by_name[name]] if name in by_name else unrolled.get(name, [])
            if not nodes and provenance is not None and name in provenance.names:
                raise CompileError(f"{path}: --wide-weight {name}: cannot have 16-bit "
                                   f"weights: the compiler folded it away (the report's row "
                                   f"for it says into what)")
            if not nodes:
                raise CompileError(f"{path}: --wide-weight {name}: no node of that name in "
                                   f"the model")
            hits = [n.name for n in nodes if n.name in found]
            if not hits:
                raise CompileError(f"{path}: --wide-weight {name}: cannot have 16-bit "
                                   f"weights: {_why_not(nodes[0], chosen, model)}")
            picked.update(dict.fromkeys(hits))
    picked.update(dict.fromkeys(n for n in options.checked_wide_weights if n in found))
    return list(picked)


def _why_not(node, chosen: set[str], model) -> str:
    if node.op_type not in widen.MATRIX_OPS:
        return f"it is a {node.op_type}, not a Conv, Gemm or MatMul"
    if node.name not in chosen:
        return "it is not quantized for the TPU (kept in float, or the TPU does not take it)"
    return "its weight is not a constant"


def overrides(model: onnx.ModelProto, nodes: list[str], chosen: set[str], wide: dict,
              accumulators, options, notes: dict | None = None) -> dict[str, list]:
    """onnxruntime's TensorQuantOverrides giving the weights of `nodes` 16 bits: {weight:
    [{"axis", "quant_type"}, ...]} per channel (or one dict per tensor), with an "rmin" /
    "rmax" per channel where the accumulators need a coarser step.  `wide`: the int16
    activation tensors ({root: members}, widen.choose) the nodes' inputs may be;
    `accumulators`: a widen.Accumulators over the calibration data (None: no guard).
    `notes` gets {"weights kept 8-bit": {node: why}, "weights coarser": {node: how far
    their rounding stays below int8's, in dB}}."""
    from onnxruntime.quantization import QuantType
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output if o}
    members = {m: root for root, group in wide.items() for m in group}
    weight_of = candidates(model, chosen)
    users: dict[str, list] = {}           # a weight shared by several nodes: decided once
    for node in g.node:
        if node.name in weight_of:
            users.setdefault(weight_of[node.name], []).append(node)
    out: dict[str, list] = {}
    for copies in same_values(inits, [weight_of[n] for n in nodes if n in weight_of]):
        readers = [node for weight in copies for node in users[weight]]
        first = readers[0]
        init = inits[copies[0]]
        steps = _steps(readers, init, members, producer, chosen, accumulators,
                       options.per_channel)
        finest, wide_steps, narrow_steps, worst, culprit = steps
        # channels whose weights vanish (at int16's finer step already: scales.py makes
        # them zeros at scale 1) are zeros at any width: not counted
        live = widen.weight_peaks(first, init) / 32767 >= VANISHING_SCALE
        gain = 10 * np.log10(float((narrow_steps[live] ** 2).sum()) /
                             max(float((wide_steps[live] ** 2).sum()), 1e-300)) \
            if live.any() else 0.0
        if gain < MIN_GAIN_DB:
            if notes is not None:
                notes.setdefault("weights kept 8-bit", {})[first.name] = (
                    f"int16 weights, the accumulators of '{culprit}' would reach "
                    f"{worst:.3g} on the calibration data with {HEADROOM:g}x headroom "
                    f"on the products at the finest int16 step (int32 holds "
                    f"{widen.INT32_LIMIT:.3g}); the steps that fit (up to "
                    f"{float((wide_steps / finest)[live].max(initial=1.0)):.3g}x the "
                    f"finest) leave their rounding "
                    + (f"only {gain:.1f} dB below int8's" if gain >= 0 else
                       f"{-gain:.1f} dB coarser than int8's"))
            continue
        head = {"quant_type": QuantType.QInt16}
        if options.per_channel:
            head["axis"] = widen.channel_axis(first)
        coarser = wide_steps > finest * 1.0001
        entries = [head]
        if coarser.any():
            entries = [dict(head)] + [{} for _ in range(len(wide_steps) - 1)]
            for entry, step in zip(entries, wide_steps):
                r = np.float32(step * (2 ** 15 - 1))
                entry["rmin"], entry["rmax"] = -r, r
        out.update({weight: [dict(e) for e in entries] for weight in copies})
        if coarser.any() and notes is not None:
            notes.setdefault("weights coarser", {})[first.name] = gain
    return out


def same_values(inits: dict, weights: list[str]) -> list[list[str]]:
    """`weights` in groups of equal values (shape, type and bytes): an unrolled LSTM copies
    each gate's weights into every step, and each step's Gemm sees only its own step of the
    calibration data (one frame of a stream run whole); the copies are decided together,
    over every step's sums, and quantized alike."""
    import hashlib
    groups: dict[tuple, list[str]] = {}
    for weight in dict.fromkeys(weights):
        t = inits[weight]
        data = t.raw_data or numpy_helper.to_array(t).tobytes()
        key = (tuple(t.dims), t.data_type, hashlib.blake2b(data, digest_size=16).digest())
        groups.setdefault(key, []).append(weight)
    return list(groups.values())


def measured(model: onnx.ModelProto, nodes: list[str], chosen: set[str]) -> list[str]:
    """The tensors whose ranges the guard reads: the input of each of `nodes` as its
    producer writes it (before layout nodes), whose step the node's input has."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    wanted = set(nodes)
    return list(dict.fromkeys(widen.root_of(n.input[0], producer, chosen)
                              for n in model.graph.node if n.name in wanted and n.input))


def _steps(readers, init, members: dict, producer: dict, chosen: set[str], accumulators,
           per_channel: bool):
    """(the finest int16 weight steps, the int16 steps every reader's accumulators hold,
    the int8 steps onnxruntime would write, the largest need at the finest steps, its
    node): per output channel (one for all with per_channel False)."""
    finest = widen.weight_steps(readers[0], init, per_channel, 16)
    narrow = widen.weight_steps(readers[0], init, per_channel, 8)
    wide = finest.copy()
    worst, culprit = 0.0, readers[0].name
    if accumulators is None or not accumulators.ok:
        return finest, wide, narrow, worst, culprit
    absolute = widen.weight_sums(readers[0], init)
    for node in readers:
        root = members.get(node.input[0])
        bits = 16 if root is not None else 8
        if root is None:
            root = widen.root_of(node.input[0], producer, chosen)
        step, reach = accumulators.step(root, bits), accumulators.reach(root)
        if step is None or reach is None:
            continue
        need = accumulators.need(node.name, step, finest, HEADROOM)
        fits = accumulators.fitting_steps(node.name, step, HEADROOM, absolute * reach)
        if need is None or fits is None or need.shape != finest.shape:
            continue
        if float(need.max(initial=0.0)) > worst:
            worst, culprit = float(need.max()), node.name
        wide = np.maximum(wide, fits)
        narrow = np.maximum(narrow, accumulators.fitted_steps(node.name, step, narrow))
    if not per_channel:
        wide = np.full(wide.shape, wide.max(initial=0.0))
        narrow = np.full(narrow.shape, narrow.max(initial=0.0))
    return finest, wide, narrow, worst, culprit

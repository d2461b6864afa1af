"""Convolutions whose image the Unified Buffer cannot hold, cut into bands of rows (a rewrite
of the FLOAT model, before quantization, like convforms.py).

The back end keeps a segment's tensors whole in the Unified Buffer; VGG's 224 x 224 x 64
images (input and output of one Conv: ~101 K rows of the 96 K) do not fit, and such a Conv
used to go to the host.  Here its output image is split into k bands of consecutive rows:

    x -> Slice(rows a_i .. b_i) -> Conv (the band's own pads) [-> Relu/Clip] [-> Pool] -> band i
    Concat(band 0 .. band k-1, axis = height) -> the chain's old output

Each band reads its rows plus the kernel's halo (the rows above and below its window needs);
the image's top padding stays on the first band, its bottom padding on the last, the
padding of the other sides on every band.  A Relu/Clip and a Max/AveragePool after the Conv
(VGG's `conv -> relu -> pool`) are banded with it, so the pool reads the band its own rows
came from and the full image never exists on the chip.  A padded pool whose bands would keep
their padding on one side only is left whole after the Concat (the partition orders the
bands' Convs before their Pools, and an unfused pool would hold all their images at once).  A pool is not banded on its own: its bands would read host
Slices, and the quantizer takes a pool only after a TPU node (they would stay on the host).
The Slices and the Concat run on the host (layout), the bands' Convs and Pools on the TPU,
one segment.

How many bands: the fewest whose segment the back end places, asked of the back end's own
capacity rule (codegen/capacity.py, the rule generate() raises its "one sample needs ... UB
rows" error from) on placeholder IR operators of the bands' shapes.  The front end does not
import the back end: the pipeline hands the rewrite a `Room` of its questions.

MACs: with an overlapping pool (window > stride) neighbouring bands compute some Conv rows
twice; each band records in Provenance.own_work the share of its rows that are its own, so
the report counts the network's MACs once."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tpuasm.compiler.front.prepare import NotRewritten, _attr, _Index, _ranks
from tpuasm.compiler.front.provenance import Provenance

MAX_BANDS = 256            # at most this many bands per image (each is a Conv of its own)
_ACTIVATIONS = ("Relu", "Clip")
_POOLS = ("MaxPool", "AveragePool")


def band_convolutions(model, prov: Provenance, room,
                      reasons: dict[str, str] | None = None) -> int:
    """Band (in place) every Conv [-> Relu/Clip] [-> Pool] chain whose segment the machine
    cannot hold; the count banded.  `room`: the back end's capacity questions for the
    machine (codegen/capacity.py Room: fits, parameter_rows, refuses, cannot_hold)."""
    reasons = {} if reasons is None else reasons
    idx = _Index(model)
    ranks = _ranks(model)
    done = 0
    taken: set[str] = set()
    replaced: dict[str, tuple[list, list]] = {}          # first node -> (chain, new nodes)
    for node in list(model.graph.node):
        if node.name in taken or node.op_type != "Conv":
            continue
        try:
            chain = _chain(idx, node, ranks)
            if chain is None:
                continue
            try:
                plan = _plan(chain, room)
            except _Unmapped as e:
                if chain.pool is None:
                    raise NotRewritten(str(e)) from None
                # a pool whose padding the bands would leave on one side: the Conv (and its
                # activation) banded alone, the pool after their Concat
                chain.nodes.pop()
                chain.pool = None
                plan = _plan(chain, room)
            if plan is None:
                continue                                 # it fits whole
            replaced[node.name] = (chain.nodes, _banded(idx, chain, plan, prov))
            taken.update(n.name for n in chain.nodes)
            done += 1
        except NotRewritten as e:
            reasons[node.name] = f"{node.op_type} not banded: {e}"
        except (ValueError, TypeError, KeyError, IndexError) as e:
            # a form this rewrite mishandles: the node stays whole (on the host if it does
            # not fit), with the failure as its reason, never a traceback
            reasons[node.name] = (f"{node.op_type} not banded: the rewrite failed "
                                  f"({type(e).__name__}: {e})")
    if done:
        gone = {n.name for chain, _ in replaced.values() for n in chain}
        new_nodes = []
        for node in model.graph.node:
            if node.name in replaced:
                new_nodes.extend(replaced[node.name][1])
            elif node.name not in gone:
                new_nodes.append(node)
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
        # the chains' inner tensors are gone (each band has its own): no stale shapes
        inner = {o for chain, _ in replaced.values() for n in chain[:-1] for o in n.output}
        kept = [v for v in model.graph.value_info if v.name not in inner]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)
    return done


# --- the chain: Conv [-> Relu/Clip] [-> Pool] ---------------------------------------------

class _Chain:
    def __init__(self, nodes, shape, conv, weight_shape, act=None, pool=None):
        self.nodes = nodes                 # in order
        self.shape = shape                 # the first node's input (C, H, W)
        self.conv, self.act, self.pool = conv, act, pool
        self.weight_shape = weight_shape   # (O, C / groups, kh, kw) of the Conv

    @property
    def output(self) -> str:
        return self.nodes[-1].output[0]


class _Window:
    """One sliding window along the rows: kernel, stride, pads (top, bottom)."""

    def __init__(self, kernel, stride, top, bottom):
        self.kernel, self.stride, self.top, self.bottom = kernel, stride, top, bottom

    def out_rows(self, height: int) -> int:
        return (height + self.top + self.bottom - self.kernel) // self.stride + 1

    def reads(self, first: int, stop: int, height: int) -> tuple[int, int, int, int]:
        """Output rows [first, stop) read input rows [a, b) (clipped to the image) with
        `top` and `bottom` rows of padding: (a, b, top, bottom)."""
        a = first * self.stride - self.top
        b = (stop - 1) * self.stride - self.top + self.kernel
        return max(a, 0), min(b, height), max(0, -a), max(0, b - height)


def _windows(node, kernel=None) -> tuple[_Window, tuple[int, int, int, int]]:
    """The row window of a Conv or Pool and its full pads (top, left, bottom, right);
    `kernel`: a Conv's (kh, kw) from its weight (its kernel_shape is optional)."""
    if _attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotRewritten("auto_pad is set")
    if any(d != 1 for d in _attr(node, "dilations", [1, 1])):
        raise NotRewritten("a dilated window")
    kernel = _attr(node, "kernel_shape") or kernel
    strides = list(_attr(node, "strides", [1, 1]))
    t, l, b, r = _attr(node, "pads", [0, 0, 0, 0])
    return _Window(kernel[0], strides[0], t, b), (t, l, b, r)


def _chain(idx: _Index, node, ranks) -> _Chain | None:
    """The Conv `node` with the Relu/Clip and the pool that alone read its result."""
    shape = ranks.get(node.input[0])
    if shape is None or len(shape) != 4 or any(not isinstance(d, int) or d <= 0
                                               for d in shape[1:]):
        return None                    # not a 2-D image of known size
    w = ranks.get(node.input[1]) if len(node.input) > 1 else None
    if node.input[1] not in idx.inits or w is None or len(w) != 4:
        return None                    # a weight the TPU would not take anyway
    chain = _Chain([node], tuple(shape[1:]), node, tuple(w))
    nxt = idx.sole_consumer(node.output[0])
    if nxt is not None and nxt.op_type in _ACTIVATIONS:
        chain.act = nxt
        chain.nodes.append(nxt)
        nxt = idx.sole_consumer(nxt.output[0])
    if nxt is not None and _bandable_pool(nxt):
        chain.pool = nxt
        chain.nodes.append(nxt)
    return chain


def _bandable_pool(node) -> bool:
    return (node.op_type in _POOLS and len(_attr(node, "kernel_shape", [])) == 2
            and not _attr(node, "ceil_mode", 0) and not _attr(node, "storage_order", 0)
            and len(node.output) == 1
            and _attr(node, "auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET")
            and all(d == 1 for d in _attr(node, "dilations", [1, 1])))


# --- how many bands: the back end's capacity rule ----------------------------------------

class _Band:
    """One band: the input rows it slices and, per windowed node, its own pads."""

    def __init__(self):
        self.rows = (0, 0)                         # input rows [a, b)
        self.conv_pads = self.pool_pads = None     # (top, bottom) of the band
        self.conv_rows = self.out_rows = (0, 0)    # the Conv's and the chain's output rows
        self.own = 0                               # Conv rows that are this band's own


class _Unmapped(NotRewritten):
    """A band's operator the back end does not map (a pool's padding left on one side)."""


def _plan(chain: _Chain, room) -> list[_Band] | None:
    """The bands (fewest that fit), or None when the chain fits whole."""
    final = _out_height(chain)
    try:
        whole = _segment(chain, _bands(chain, 1))
        if room.fits(whole):
            return None
        # each band brings its own per-column parameters (its own scales): past the count
        # whose parameters alone fill the Unified Buffer no more bands can fit
        per_band = max(1, room.parameter_rows(whole))
        most = min(final, MAX_BANDS, room.ub_rows // per_band)
        for k in _counts(most):
            bands = _bands(chain, k)
            if room.fits(_segment(chain, bands, room)):
                return bands
    except room.errors as e:
        raise NotRewritten(f"the back end cannot place its bands ({e})") from None
    raise NotRewritten(f"{room.cannot_hold}: no number of bands of rows up to {most} fits the "
                       f"Unified Buffer ({room.ub_rows} rows; each band holds {per_band} "
                       f"rows of its own parameters)")


def _out_height(chain: _Chain) -> int:
    h = _windows(chain.conv, chain.weight_shape[2:])[0].out_rows(chain.shape[1])
    if chain.pool is not None:
        h = _windows(chain.pool)[0].out_rows(h)
    return h


def _bands(chain: _Chain, k: int) -> list[_Band]:
    """k bands of nearly equal output rows, traced back through the pool and the Conv."""
    height = chain.shape[1]
    conv_w = _windows(chain.conv, chain.weight_shape[2:])[0]
    pool_w = _windows(chain.pool)[0] if chain.pool is not None else None
    conv_h = conv_w.out_rows(height)
    final = _out_height(chain)
    if final < 1:
        raise NotRewritten("an empty output image")
    edges = [final * i // k for i in range(k + 1)]
    bands = []
    for first, stop in zip(edges, edges[1:]):
        band = _Band()
        band.out_rows = (first, stop)
        c0, c1 = first, stop
        if pool_w is not None:
            c0, c1, pt, pb = pool_w.reads(first, stop, conv_h)
            band.pool_pads = (pt, pb)
        band.conv_rows = (c0, c1)
        a, b, pt, pb = conv_w.reads(c0, c1, height)
        band.conv_pads = (pt, pb)
        band.rows = (a, b)
        bands.append(band)
    # each Conv row is its own in the first band that computes it; rows no band computes
    # (a pool's window leaves the last ones out) go to the last band: sum = the image's
    done_to = 0
    for band in bands:
        c0, c1 = band.conv_rows
        band.own = max(0, c1 - max(c0, done_to))
        done_to = max(done_to, c1)
    bands[0].own += bands[0].conv_rows[0]
    bands[-1].own += conv_h - done_to
    return bands


def _counts(most: int):
    """Band counts to try, fewest first: every one up to 16, then a quarter more each time
    (a segment of k bands is allocated whole to ask; hundreds of k would take seconds)."""
    k = 2
    while k <= most:
        yield k
        k = k + 1 if k < 16 else max(k + 1, k * 5 // 4)


def _segment(chain: _Chain, bands: list[_Band], room=None):
    """The segment the partition makes of the bands (their Convs and Pools, each band's
    slice an input, its result an output), of placeholder operators; with `room`, raise
    _Unmapped when the back end would refuse a band's operator."""
    from tpuasm.compiler.ir import Segment
    ops, inputs, outputs = [], [], []
    for i, band in enumerate(bands):
        made = _ir_ops(chain, band, f"band{i}")
        for op in made if room is not None else ():
            why = room.refuses(op)
            if why is not None:
                raise _Unmapped(f"{type(op).__name__.lower()} of a band: {why}")
        if room is not None and band.pool_pads is not None and \
                band.pool_pads != tuple(_windows(chain.pool)[1][0::2]):
            # Activate pads each side on its own, but the partition orders the bands' Convs
            # before their Pools: an unfused pool's inputs would all be held at once (the
            # image banding avoids), and the segment cut in several
            raise _Unmapped("pool of a band: its bands would pad it on one side only")
        ops += made
        inputs.append(made[0].input)
        outputs.append(made[-1].output)
    return Segment("banding", ops, inputs, outputs)


def _ir_ops(chain: _Chain, band: _Band, tag: str) -> list:
    """Placeholder IR operators of one band (shapes, windows and pads as the matched model's
    will be; weights, scales and zero points that do not change the rows they take)."""
    from tpuasm.compiler.ir import Activation, Conv, Pool, QParams, Tensor
    c, _h, width = chain.shape
    relu = chain.act is not None
    q_in = QParams(1.0, 0, False)
    q = QParams(1.0, 0, not relu)
    a, b = band.rows
    x = Tensor(f"{tag}_in", (c, b - a, width), q_in)
    o, per_group, kh, kw = chain.weight_shape
    _, (_t, left, _b, right) = _windows(chain.conv, chain.weight_shape[2:])
    sh, sw = _attr(chain.conv, "strides", [1, 1])
    wo = (width + left + right - kw) // sw + 1
    c0, c1 = band.conv_rows
    y = Tensor(f"{tag}_conv", (o, c1 - c0, wo), q)
    top, bottom = band.conv_pads
    ops = [Conv(f"{tag}_conv", x, y, np.zeros((o, per_group, kh, kw), np.int8),
                np.ones(o, np.float32), np.zeros(o, np.int32), (sh, sw),
                (top, left, bottom, right), Activation("relu") if relu else Activation(),
                groups=int(_attr(chain.conv, "group", 1)))]
    x, width = y, wo
    if chain.pool is not None:
        _, (_t, left, _b, right) = _windows(chain.pool)
        kh, kw = _attr(chain.pool, "kernel_shape")
        sh, sw = _attr(chain.pool, "strides", [1, 1])
        wo = (width + left + right - kw) // sw + 1
        first, stop = band.out_rows
        y = Tensor(f"{tag}_pool", (x.shape[0], stop - first, wo), x.quant)
        top, bottom = band.pool_pads
        ops.append(Pool(f"{tag}_pool", x, y, "max" if chain.pool.op_type == "MaxPool"
                        else "avg", (kh, kw), (sh, sw), (top, left, bottom, right),
                        bool(_attr(chain.pool, "count_include_pad", 0))))
    return ops


# --- the rewrite ------------------------------------------------------------------------

def _banded(idx: _Index, chain: _Chain, bands: list[_Band], prov: Provenance) -> list:
    """The nodes that replace the chain: per band a Slice of its input rows and the chain's
    nodes with the band's pads; a Concat of the bands into the chain's output."""
    made, parts = [], []
    x = chain.nodes[0].input[0]
    tag = chain.nodes[0].name + "_band"
    own = prov.own_work.get(chain.conv.name)
    for i, band in enumerate(bands):
        at = f"{tag}{i}"
        rows = idx.unique(f"{at}_rows")
        made.append(_slice(idx, x, rows, *band.rows, at))
        current = rows
        for node in chain.nodes:
            out = idx.unique(f"{node.output[0]}_band{i}")
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            pads = band.conv_pads if node is chain.conv else \
                band.pool_pads if node is chain.pool else None
            if pads is not None:
                t, l, _b, r = attrs.get("pads", [0, 0, 0, 0])
                attrs["pads"] = [pads[0], l, pads[1], r]
            new = helper.make_node(node.op_type, [current, *node.input[1:]], [out],
                                   name=idx.unique(f"{node.name}_band{i}"), **attrs)
            prov.derive(new.name, node.name)
            if node is chain.conv:
                computed = band.conv_rows[1] - band.conv_rows[0]
                num, den = own if own is not None else (1, 1)
                if band.own != computed or own is not None:
                    prov.own_work[new.name] = (num * band.own, den * computed)
            made.append(new)
            current = out
        parts.append(current)
    made.append(helper.make_node("Concat", parts, [chain.output], axis=2,
                                 name=idx.unique(tag + "_join")))
    for node in chain.nodes:
        if node is not chain.act:             # a Relu is folded into the Conv's range
            prov.notes[prov.source(node.name) or node.name] = (
                f"in {len(bands)} bands of rows (its image does not fit the Unified Buffer "
                f"whole; Slices and a Concat on the host)")
    return made


def _slice(idx: _Index, x: str, out: str, start: int, stop: int, tag: str):
    name = idx.unique(tag + "_slice")
    if idx.opset < 10:
        return helper.make_node("Slice", [x], [out], name=name, starts=[start], ends=[stop],
                                axes=[2])
    return helper.make_node("Slice", [x, idx.add_init(np.array([start], np.int64), tag + "_s0"),
                                      idx.add_init(np.array([stop], np.int64), tag + "_s1"),
                                      idx.add_init(np.array([2], np.int64), tag + "_axis")],
                            [out], name=name)

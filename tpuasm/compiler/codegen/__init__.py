"""The back end: a quantized `Segment` (compiler/ir.py) -> readable .tasm, a weight image and
the host layout (a `CompiledSegment`, a SegmentProgram).

    program = generate(segment, batch=32, array_size=256)
    host = program.host_image({"x": x_q})        # (rows, N) int8
    # assemble program.source, run it with program.weights, then
    y = program.read_outputs(machine.host)["y"]

Passes, each a small module testable alone:
  fuse.py     which Pool / Lookup fold into the Activate of the layer before them
  layout.py   every tensor's UB/host layout (channels across a row, padded images)
  alloc.py    UB slots with reuse by lifetime; the batch split into passes that fit
  capacity.py the UB rows a segment needs (one rule: generate() and the front end's banding)
  lower.py    Dense / Conv / Pool / Lookup -> instructions (tiling, taps, bands)
  emit.py     the text, configuration tracking and the weight stream (Read_Weights ahead)
  weights.py  the (tiles, N, N) int8 image, each weight copied once
  quant.py    per-column bias and requantization parameters (Activate P)
  program.py  host image packing and output unpacking
Around it, as the pipeline and OUTDIR use the back end:
  backend.py  the machine shape, one program per segment, the Weight Memory check
  timing.py   each segment's cycles, measured when compiling
  golden.py   a regression manifest per segment (`tpuasm test OUTDIR`)
  whole.py    a compiled model as one TPU program (`tpuasm profile`, `tpuasm sweep`)
"""
from __future__ import annotations

import re

import numpy as np

from ...isa import ISA_TABLE
from ..ir import Conv, Dense, Elementwise, HostLayout, Lookup, Pool, Segment
from .capacity import Footprint, fits, ub_rows_needed
from .emit import Emitter
from .fuse import Fusion, plan_fusion
from .layout import plan_layouts
from .lower import MAX_DMA, CodegenError, Lowering, Refused
from .pack import pack_segment
from .program import CompiledSegment
from .weights import WEIGHT_MEMORY_BYTES, WeightImage, group_chunks, identity_tile

DEFAULTS = ISA_TABLE.machine

__all__ = ["generate", "supports", "fits", "ub_rows_needed", "weight_tiles", "pack_segment",
           "CodegenError", "Refused", "CompiledSegment", "WEIGHT_MEMORY_BYTES"]


def supports(op) -> str | None:
    """None if the back end maps `op` on its own, else why not (for the placement report)."""
    tensors = (*op.inputs, op.output) if hasattr(op, "inputs") else ()
    if any(t.quant.wide and not t.quant.signed for t in tensors):
        return "a uint16 tensor (the TPU's 16-bit activations are int16: Activate's act_out 2)"
    if isinstance(op, Pool) and any(t.quant.wide for t in tensors):
        return "a 16-bit tensor: pooling (Activate's) reads and writes 8-bit tensors"
    if isinstance(op, Lookup) and (op.output.quant.wide or
                                   (op.input.quant.wide and op.index is None)):
        return ("a 16-bit tensor: a table maps bytes (an int16 input needs its 8-bit "
                "requantization, onnxruntime's convert)")
    if isinstance(op, Dense):
        return None
    if isinstance(op, Conv):
        if op.strides[0] != op.strides[1]:
            return f"strides {op.strides} differ (MMC.C has one stride for both axes)"
        return None
    if isinstance(op, Pool):
        kh, kw = op.kernel
        t, l, b, r = op.pads
        if op.kind not in ("max", "avg"):
            return f"pooling kind {op.kind!r}"
        if max(kh, kw, *op.strides) > 256 or max(op.pads) > 255:
            return "pooling window, stride or padding beyond the pool registers' range"
        if max(t, b) >= kh or max(l, r) >= kw:
            return (f"padding {op.pads} as large as the {kh}x{kw} window (Activate's windows "
                    f"must each hold an image element)")
        return None
    if isinstance(op, Lookup):
        return None if len(op.table) == 256 else "a lookup table needs 256 entries"
    if isinstance(op, Elementwise):
        if op.op not in ("add", "sub", "mul"):
            return f"element-wise {op.op!r} (VADD adds and subtracts, VMUL multiplies)"
        if op.reverse and op.op != "sub":
            return f"a reversed {op.op!r}"
        if op.b is None:
            if op.constant is None or op.constant_quant is None:
                return "neither a second tensor nor a constant"
            if np.asarray(op.constant).size not in (1, op.a.shape[0]):
                return ("a constant that is not one value per channel (B's constant row "
                        "repeats one row of channels)")
            v = np.asarray(op.constant, np.int64) - op.constant_quant.zero_point
            if v.size and int(v.max() - v.min()) > 255:
                return "a constant whose values span more than one byte"
        elif op.broadcasts_b:
            if op.b.shape[0] != op.a.shape[0] or int(np.prod(op.b.shape[1:])) != 1:
                return ("b is neither a's shape nor one pixel of its channels (B's row is "
                        "one row of channels)")
        elif op.reverse and not op.spreads_b:
            return "a reversed Sub of two tensors of one shape"
        tensors = (*op.inputs, op.output)
        if op.a.shape != op.output.shape:
            return "operands of different shapes (VADD/VMUL read equal row ranges)"
        if len({t.quant.signed for t in tensors if not t.quant.wide}) > 1:
            return "8-bit operands of different signedness (one U flag for A, B and C)"
        if any(t.quant.wide for t in tensors) and (
                op.b is None or op.broadcasts_b or op.spreads_b):
            return "an int16 operand with a constant or broadcast b (B's row is bytes)"
        if op.output.quant.wide and op.activation.kind != "none":
            return "a clamp on an int16 output (the table maps bytes: no L with Z)"
        return None
    return f"{type(op).__name__} is not a TPU operator"


def weight_tiles(op, n: int) -> int:
    """The weight tiles `op` adds to the image on an n x n array (closed form, from shapes
    alone: what lower.py registers; an identity copy shares one tile per segment).  For a
    segment, count the operators of `pack_segment(segment, n)[0]`: packing changes them."""
    switches = _weight_switches(op, n)
    return 2 * switches if isinstance(op, (Dense, Conv)) and op.wide_weights else switches


def _weight_switches(op, n: int) -> int:
    """The tiles (int16 weights: tile pairs) `op` switches to, from its shapes."""
    def blocks(count):
        return -(-count // n)
    if isinstance(op, Dense):
        k, m = op.weight.shape
        if len(op.input.shape) == 3:                     # a flattened image, pixel by pixel
            c, h, w = op.input.shape
            return blocks(m) * blocks(c) * h * w
        return blocks(m) * blocks(k)
    if isinstance(op, Conv):
        o, c, kh, kw = op.weight.shape
        if op.groups != 1:            # block-diagonal: only the chunks a block's groups read
            return kh * kw * sum(len(group_chunks(op, j, n)) for j in range(blocks(o)))
        return blocks(o) * blocks(c) * kh * kw
    if isinstance(op, Elementwise) and op.spreads_b:
        return 1                      # the ones-row tile that spreads b's channel
    return 0


class Context:
    """What the lowering of one segment shares (see lower.Lowering)."""

    def __init__(self, segment, n, batch, layouts, alloc, fifo_depth, half_rows):
        self.segment = segment
        self.n = n
        self.batch = batch                    # samples per pass
        self.layouts = layouts
        self.alloc = alloc
        self.emitter = Emitter(fifo_depth)
        self.weights = WeightImage(n)
        self.tiles: dict[str, list] = {}
        self.half_rows = half_rows
        self._half = 1
        self.const_rows: list[np.ndarray] = []     # UB-resident constants (params, tables)
        self._const_at: dict = {}
        self._region_names: dict[str, str] = {}
        # UB slot -> padding_key of the padding its rows hold now: writers of a padded
        # tensor touch only the interior, so the next tenant with the same layout keeps it
        self.padded: dict[str, tuple | None] = {}

    def next_half(self) -> str:
        self._half ^= 1
        return f"half{self._half}"

    def _const(self, key, rows: np.ndarray) -> str:
        at = self._const_at.get(key)
        if at is None:
            at = sum(len(r) for r in self.const_rows)
            self.const_rows.append(rows)
            self._const_at[key] = at
        return f"ub.params + {at}" if at else "ub.params"

    def param_block(self, key, rows: np.ndarray) -> str:
        return self._const(("params", key), rows)

    def table_block(self, key, table) -> str:
        t = np.asarray(table)
        if t.shape != (256,):
            raise CodegenError(f"{key}: lookup table of shape {t.shape}, expected (256,)")
        rows = np.zeros(-(-256 // self.n) * self.n, np.uint8)
        rows[:256] = t.astype(np.int64) & 0xFF
        return self._const(("table", key), rows.reshape(-1, self.n))

    def identity(self):
        return ("identity", 0)

    def tile_region_name(self, op_name: str) -> str:
        name = self._region_names.get(op_name)
        if name is None:
            base = symbol(op_name)
            name, k = base, 1
            while name in self._region_names.values() or name in ("identity",):
                k += 1
                name = f"{base}_{k}"
            self._region_names[op_name] = name
        return name


def plus(base: str, offset: int) -> str:
    return f"{base} + {offset}" if offset else base


def symbol(text: str) -> str:
    """An assembler identifier from an ONNX name."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_") or "t"
    return s if not s[0].isdigit() else "t_" + s


def generate(segment: Segment, batch: int, *, array_size: int = DEFAULTS.array_size,
             ub_rows: int = DEFAULTS.ub_rows, acc_rows: int = DEFAULTS.acc_rows,
             fifo_depth: int = DEFAULTS.fifo_depth) -> CompiledSegment:
    """Compile one segment for `batch` samples on the given machine shape."""
    if batch < 1:
        raise CodegenError(f"segment {segment.name}: batch {batch} < 1")
    for op in segment.operators:
        why = supports(op)
        if why is not None:
            raise CodegenError(f"{op.name}: {why}")
    n = array_size
    half_rows = acc_rows // 2
    original = segment
    segment, packings = pack_segment(segment, n)
    fusion = plan_fusion(segment, half_rows)
    layouts = plan_layouts(segment, n)
    steps = fusion.steps
    order = [(s.reads, [s.writes]) for s in steps]
    inputs = [t.name for t in segment.inputs]
    outputs = [t.name for t in segment.outputs]
    needs_dense = any(isinstance(s.op, Dense) for s in steps)

    # samples per pass: the accumulators (a Dense block is one row per sample) and the UB
    # (capacity.py: the rule the front end's banding asks too).  Another pass streams every
    # weight again, so before splitting the batch, inputs are loaded less far ahead of their
    # readers (down to just in time)
    room = Footprint(segment, fusion, layouts, n)
    p = min(batch, half_rows) if needs_dense else batch
    lead = room.lead_for(p, ub_rows)
    while True:
        need = room.rows(p, lead)
        if need <= ub_rows or p == 1:
            break
        p = max(1, min(p - 1, p * (ub_rows - room.const) // max(1, need - room.const)))
    if need > ub_rows:
        raise CodegenError(f"segment {segment.name}: one sample needs {need} UB "
                           f"rows, the Unified Buffer has {ub_rows}")
    passes = -(-batch // p)
    p = -(-batch // passes)                  # equal passes, as few padding samples as possible
    alloc, load_at = room.allocation(p, lead)
    ctx = Context(segment, n, p, layouts, alloc, fifo_depth, half_rows)
    if any(s.needs_identity for s in steps):
        ctx.weights.add("identity", identity_tile(n))
    low = Lowering(ctx)
    e = ctx.emitter
    e.start_weights()
    e.blank()
    const_mark = None
    for k in range(passes):
        if passes > 1:
            e.blank()
            e.comment(f"==== pass {k + 1} of {passes}: samples {k * p}..{(k + 1) * p - 1}")
        pending = list(segment.inputs)

        def load(names):
            """Segment inputs at their load points (alloc.load_points)."""
            for t in [t for t in pending if t.name in names]:
                pending.remove(t)
                lay = layouts[t.name]
                rows = lay.rows(p)
                ctx.padded[alloc.of[t.name].name] = lay.padding_key   # loaded whole
                e.node(f"{segment.name}/inputs")
                for a in range(0, rows, MAX_DMA):
                    e.line(f"RHM {plus(f'host.in_{symbol(t.name)}', k * rows + a)}, "
                           f"{low.ub_row(t.name, a)}, {min(MAX_DMA, rows - a)}",
                           f"input {t.name}" if a == 0 else "")

        for i, s in enumerate(steps):
            load({t for t, at in load_at.items() if at == i})
            e.blank()
            e.comment(s.describe(layouts))
            e.node(s.op.name)
            mark = len(e.items)
            s.lower(low)
            if const_mark is None:        # the parameters after the first multiply: it
                const_mark = next(        # needs the input, not them, and the in-order
                    (i + 1 for i in range(mark, len(e.items))   # front end would hold it
                     if isinstance(e.items[i], tuple)), mark)   # behind their load
            slot = alloc.of.get(s.writes)
            if slot is not None and layouts[s.writes].padding_key is None:
                ctx.padded.pop(slot.name, None)      # written whole: its rows are data now
            if s.writes in outputs:
                rows = layouts[s.writes].rows(p)
                for a in range(0, rows, MAX_DMA):
                    e.line(f"WHM {low.ub_row(s.writes, a)}, "
                           f"{plus(f'host.out_{symbol(s.writes)}', k * rows + a)}, "
                           f"{min(MAX_DMA, rows - a)}",
                           f"output {s.writes}" if a == 0 else "")
    e.items.append(".node")
    e.line("HLT")
    # the constants (known now): one RHM at the start
    const_rows = np.concatenate(ctx.const_rows) if ctx.const_rows else np.zeros((0, n), np.uint8)
    head = []
    for a in range(0, len(const_rows), MAX_DMA):
        head.append(f"        RHM {plus('host.params', a)}, {plus('ub.params', a)}, "
                    f"{min(MAX_DMA, len(const_rows) - a)}")
    e.items[const_mark:const_mark] = (["; per-column parameters and tables of every layer"]
                                      + head if head else [])
    e.instructions += len(head)
    body = e.finish()
    # host memory: params, then inputs and outputs
    host_layouts, host_regions, top = {}, [], 0

    def host_region(name, rows):
        nonlocal top
        host_regions.append((name, rows, top))
        top += rows
        return top - rows

    params_at = host_region("params", max(1, len(const_rows)))
    inputs_hl, outputs_hl = {}, {}
    for t in segment.inputs:
        lay = layouts[t.name]
        base = host_region(f"in_{symbol(t.name)}", passes * lay.rows(p))
        how = lay.describe()
        if t.name in packings:
            how = f"{packings[t.name].describe()}: {how}"
        inputs_hl[t.name] = HostLayout(t, base, passes * lay.rows(p), how)
    for t in segment.outputs:
        lay = layouts[t.name]
        base = host_region(f"out_{symbol(t.name)}", passes * lay.rows(p))
        outputs_hl[t.name] = HostLayout(t, base, passes * lay.rows(p), lay.describe())
    constants = {}
    if len(const_rows):
        constants[params_at] = const_rows
    source = _header(segment, batch, p, passes, n, ub_rows, acc_rows, fifo_depth, ctx,
                     layouts, alloc, fusion, host_regions, len(const_rows), half_rows) \
        + "\n".join(body) + "\n"
    weights = ctx.weights.build()
    return CompiledSegment(segment=original, packings=packings, batch=batch, source=source, weights=weights,
                           host_rows=top, host_constants=constants, inputs=inputs_hl,
                           outputs=outputs_hl, array_size=n, layouts=layouts, pass_batch=p,
                           passes=passes, instructions=e.instructions)


def _header(segment, batch, p, passes, n, ub_rows, acc_rows, fifo_depth, ctx, layouts, alloc,
            fusion, host_regions, const_rows, half_rows) -> str:
    cfg = [f"array_size={n}"]
    for key, value, default in (("ub_rows", ub_rows, DEFAULTS.ub_rows),
                                ("acc_rows", acc_rows, DEFAULTS.acc_rows),
                                ("fifo_depth", fifo_depth, DEFAULTS.fifo_depth)):
        if value != default:
            cfg.append(f"{key}={value}")
    lines = [
        f"; {segment.name}: generated by tpuasm's compiler back end (tpuasm.compiler.codegen)",
        (f"; batch {batch}" if segment.rows is None else
         f"; {batch} rows (the segment's own: its tensors' leading dimension)")
        + (f" in {passes} passes of {p} samples" if passes > 1 else "")
        + f"; {n}x{n} array; {ctx.weights.tiles} weight tiles; operators:",
    ]
    for s in fusion.steps:
        lines.append(f";   {s.summary()}")
    lines.append("; tensors (UB rows per pass: [chunk][sample][row][column], one pixel's "
                 "channels per row):")
    for name, lay in layouts.items():
        slot = alloc.of.get(name)
        where = f"ub.{slot.name}" if slot else "-"
        lines.append(f";   {name}: {lay.tensor.shape} {lay.tensor.quant.type_name}"
                     f" -> {where}, {lay.rows(p)} rows: {lay.describe()}")
    lines += ["", f".config {', '.join(cfg)}", ""]
    for name, rows, base in host_regions:
        lines.append(f".host  {name}, {rows}")
    lines.append(f".ub    params, {max(1, const_rows)}")
    for slot in alloc.slots:
        lines.append(f".ub    {slot.name}, {slot.rows}                 ; {', '.join(slot.tensors)}")
    lines.append(f".acc   half0, {half_rows}             ; double-buffered accumulator halves")
    lines.append(f".acc   half1, {half_rows}")
    for r in ctx.weights.regions:
        lines.append(f".tile  {r.name}, {r.count}")
    lines.append("")
    return "\n".join(lines) + "\n"

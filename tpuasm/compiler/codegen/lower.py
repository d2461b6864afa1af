"""Lowering: one IR operator (with what is fused into it) -> instructions for one pass.

Dense: output column block j (N columns) at a time, into alternating accumulator halves so
the Activate of block j overlaps the multiplies of block j+1.  The K tiles of a block are
summed by switching MatrixMultiplies of at most fifo_depth + 1 tiles each (the first
overwrites).  A vector input is K chunks of B rows: one `MMC.S` with rep_ub_stride = B
walks consecutive chunks.  A flattened image input (C, H, W) is read pixel by pixel: tile
(c, p) holds the weights of pixel p's channels of chunk c, and `MMC.CS` with conv_pitch =
the image's rows, height = B, width 1 reads pixel p of every sample (tap i = pixel p + i).

Conv: kernel taps as MMC.C repeat iterations (tap i = (i // kw, i % kw), one weight tile
per tap and input-channel chunk), no im2col copy.  The samples' padded images are stacked
into one tall image, so one MMC.C computes a tap for every sample at once; output rows that
straddle two samples are computed and never read.  When the accumulator half cannot hold
the whole batch's output, the rows are cut into bands (the taps are fetched again per band).
Activate applies P's per-channel bias and requantization (the input zero point folded into
the bias; float32 multipliers under act_float, onnxruntime's arithmetic), the clip bounds,
a fused max pooling (M) and a fused lookup table (L).

Elementwise: the operands and the output share one layout (layout.py), so one VADD / VMUL
walks all their rows, padding included (it comes out as z_c), in iterations of at most 4095
rows (the length field), repeat walking them; a fused Relu / Clip / Lookup is the L table.

Pool / Lookup that could not be fused: an identity tile copies the image into the
accumulators (MMC.C with one tap skips the padding), then Activate pools (max: exact; average:
P with bias -z_x; a global one with the float32 multiplier x.scale / (y.scale * count) as
MLAS, others with the count folded into the exact division, one rounding) or looks up.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...machine.vector import qlinear_float_registers, qlinear_registers
from ..ir import Conv, Dense, Elementwise, Lookup, Pool, QParams
from ..reference import activation_bounds
from . import quant
from .layout import Layout, output_hw
from .weights import (conv_tile, dense_tile, group_chunks, grouped_conv_tile,
                      strided_dense_tile, weight_planes)

MAX_DMA = 65535             # RHM/WHM/RHMA length field
MAX_REPEAT = 256
MAX_VECTOR = 4095           # VADD/VMUL length field (12 bits)


class CodegenError(ValueError):
    """An operator (or combination) the back end cannot map; names the node."""


class Refused(CodegenError):
    """One operator the back end cannot map in this segment's company (`operator`): the
    pipeline puts it on the host and compiles the rest again."""

    def __init__(self, operator: str, message: str):
        super().__init__(message)
        self.operator = operator


def signed_flag(layout: Layout) -> str:
    """MatrixMultiply's flags for reading `layout`'s tensor: U (uint8), H (int16)."""
    q = layout.tensor.quant
    return ("" if q.signed else "U") + ("H" if q.wide else "")


def weight_flag(op) -> str:
    """MatrixMultiply's D flag for an operator with int16 weights (a tile pair per switch)."""
    return "D" if op.wide_weights else ""


def switched(units) -> list:
    """The FIFO tiles of consecutive switches (a unit: one tile, or an int16 pair)."""
    return [tile for unit in units for tile in unit]


def act_out(q) -> int:
    """Activate's act_out for a result quantized as `q`: 0 int8, 1 uint8, 2 int16."""
    if q.wide:
        if not q.signed:
            raise CodegenError("Activate writes int16, not uint16")
        return 2
    return 0 if q.signed else 1


class Lowering:
    """Shared state of one segment's lowering (see codegen/__init__.py for the driver)."""

    def __init__(self, ctx):
        self.c = ctx

    # ------------------------------------------------------------------ helpers
    @property
    def e(self):
        return self.c.emitter

    def ub(self, tensor: str, offset: int = 0) -> str:
        """The UB address of vector `offset` of `tensor` (its row `per` times that: an
        int16 vector is two rows)."""
        return self.ub_row(tensor, offset * self.c.layouts[tensor].per
                           if tensor in self.c.layouts else offset)

    def ub_row(self, tensor: str, row: int = 0) -> str:
        """The UB address of row `row` of `tensor`'s slot (DMA counts rows)."""
        slot = self.c.alloc.of[tensor].name
        return f"ub.{slot} + {row}" if row else f"ub.{slot}"

    def acc(self, half: str, offset: int = 0) -> str:
        return f"acc.{half} + {offset}" if offset else f"acc.{half}"

    def act_output(self, q, lo: int, hi: int, params: str | None, table: str | None,
                   zero: int, as_float: bool = True):
        """Activate's output registers for a result quantized as `q` (QParams); with P
        (`params`), `as_float` chooses the float32 requantization (act_float, quant.py)."""
        regs = dict(act_out=act_out(q), act_zero=zero,
                    act_lo=lo, act_hi=hi)
        if params is not None:
            regs["act_params"] = params
            regs["act_float"] = int(as_float)
        if table is not None:
            regs["act_table"] = table
        self.e.cfg(**regs)

    def write_image(self, act_flags: str, acc_half: str, acc_first: int, acc_stride: int,
                    dst: Layout, chunk: int, samples: range, rows: range, cols: range,
                    comment: str):
        """Activate accumulator images into `dst`: sample b's pixel (y, x) of the band's
        rows and columns is at acc_first + (b - samples.start) * acc_stride
        + (y - rows.start) * len(cols) + x - cols.start."""
        self.activate_images(act_flags, acc_half, acc_first, acc_stride, dst, chunk, samples,
                             rows[0], len(rows) * len(cols), len(cols), comment, cols[0])

    def activate_images(self, act_flags: str, acc_half: str, acc_first: int, acc_stride: int,
                        dst: Layout, chunk: int, samples: range, first_row: int, length: int,
                        out_width: int, comment: str, first_col: int = 0):
        """One Activate per 256 samples of `length` accumulator rows each: repeat walks the
        samples, act_ub_pitch puts each output row (out_width vectors) at dst's padded
        pitch, from image row first_row on."""
        e = self.e
        p = self.c.batch
        pitch = 0 if dst.pitch == out_width else dst.pitch
        for s0 in range(0, len(samples), MAX_REPEAT):
            group = samples[s0:s0 + MAX_REPEAT]
            e.cfg(rep_acc_stride=acc_stride, rep_ub_stride=dst.image_rows * dst.per,
                  act_ub_pitch=pitch)
            if pitch:
                e.cfg(act_ub_width=out_width)
            rep = f", repeat={len(group)}" if len(group) > 1 else ""
            e.line(f"ACT{act_flags} {self.acc(acc_half, acc_first + s0 * acc_stride)}, "
                   f"{self.ub(dst.tensor.name, dst.pixel(p, chunk, group[0], first_row, first_col))}, "
                   f"{length}{rep}", comment)

    def fill_pads(self, layout: Layout):
        """Write the zero point into every padding row of an on-chip tensor before its
        producer writes the interior; nothing when the UB slot's padding rows already hold
        it (ctx.padded).  On the chip, not over PCIe: an Activate with act_mult = 0 writes
        act_zero whatever the accumulator rows it reads hold, at one row per cycle (a host
        DMA costs a round trip and 16.7 cycles per row).  Four Activates per tensor: the
        side padding between image rows (act_ub_pitch), the runs between consecutive
        images (repeat), the first image's head and the last image's tail."""
        if not layout.pads.any:
            return
        e = self.e
        p = self.c.batch
        name = layout.tensor.name
        slot = self.c.alloc.of[name].name
        if self.c.padded.get(slot) == layout.padding_key:
            e.comment(f"  padding of {name}: already in place (the slot's previous tenant "
                      f"had the same layout, and writers only touch the interior)")
            return
        self.c.padded[slot] = layout.padding_key
        q = layout.tensor.quant
        e.comment(f"  padding of {name} := zero point {q.zero_point} (Activate: 0 x acc + "
                  f"zero point)")
        # read the half the next multiply overwrites: its last writer finished long ago
        half = f"half{self.c._half ^ 1}"
        e.cfg(act_mult=0, act_shift=0, act_zero=q.zero_point, act_out=act_out(q),
              act_lo=q.qmin, act_hi=q.qmax)
        images = layout.chunks * p
        pitch, width, rows = layout.pitch, layout.width, layout.image_rows
        head = layout.pads.top * pitch + layout.pads.left     # before the first pixel
        span = (layout.height - 1) * pitch + width              # first to last pixel
        gap = pitch - width
        if gap and layout.height > 1:
            self.zero_rows(half, name, head + width, gap, layout.height - 1, pitch, images,
                           rows)
        between = rows - span                        # an image's tail + the next's head
        self.zero_rows(half, name, 0, head, 1, 0, 1, 0)
        self.zero_rows(half, name, head + span, between, 1, 0, images - 1, rows)
        self.zero_rows(half, name, (images - 1) * rows + head + span, between - head, 1, 0,
                       1, 0)

    def zero_rows(self, half: str, name: str, start: int, width: int, count: int,
                  pitch: int, repeat: int, stride: int):
        """Activate (registers set by fill_pads) writing `count` runs of `width` rows,
        `pitch` apart, from row `start` of the tensor; the whole pattern `repeat` times,
        `stride` rows apart.  Split to fit an accumulator half and the repeat field."""
        if width <= 0 or count <= 0 or repeat <= 0:
            return
        e = self.e
        half_rows = self.c.half_rows
        if count == 1:                     # one contiguous run: pieces of a half at most
            for a in range(0, width, half_rows):
                self._zero_act(half, name, start + a, min(half_rows, width - a), 0, 0,
                               repeat, stride)
            return
        per = max(1, half_rows // width)   # runs per Activate
        for c0 in range(0, count, per):
            runs = min(per, count - c0)
            self._zero_act(half, name, start + c0 * pitch, width * runs, width, pitch,
                           repeat, stride)

    def _zero_act(self, half, name, start, length, width, pitch, repeat, stride):
        e = self.e
        for r0 in range(0, repeat, MAX_REPEAT):
            reps = min(MAX_REPEAT, repeat - r0)
            e.cfg(act_ub_pitch=pitch, rep_acc_stride=0,
                  rep_ub_stride=stride * self.c.layouts[name].per)
            if pitch:
                e.cfg(act_ub_width=width)
            rep = f", repeat={reps}" if reps > 1 else ""
            e.line(f"ACT {self.acc(half)}, {self.ub(name, start + r0 * stride)}, {length}{rep}")

    def tile_groups(self, count: int, row_len: int = 0, per_switch: int = 1
                    ) -> list[tuple[int, int]]:
        """Split `count` consecutive switches into MMCs of at most fifo_depth + 1 tiles
        (`per_switch` tiles a switch: 2 with int16 weights); with row_len (a convolution's
        kernel width) a group that starts inside a kernel row ends with it (tap i of an
        MMC.C is (i // kw, i % kw) from its base)."""
        ahead = max(1, (self.c.emitter.fifo_depth + 1) // per_switch)
        groups, q = [], 0
        while q < count:
            t = min(ahead, count - q)
            if row_len and q % row_len:
                t = min(t, row_len - q % row_len)
            groups.append((q, t))
            q += t
        return groups

    # ------------------------------------------------------------------ parameters
    def requant_block(self, key, bias, real, n0: int, as_float: bool = True) -> str:
        """UB address of P's parameter rows for columns n0..n0+N-1 (registered once): the
        float32 multipliers' bits (act_float = 1, onnxruntime's arithmetic), or the exact
        fixed point's (multiplier, shift)."""
        n = self.c.n
        b = bias[n0:n0 + n]
        if as_float:
            mult = quant.float_words(real[n0:n0 + n])
            shift = np.zeros(len(mult), np.int64)
        else:
            mult, shift = quant.multipliers(real[n0:n0 + n])
        return self.c.param_block((key, n0, as_float),
                                  quant.parameter_rows(b, mult, shift, n))

    # ------------------------------------------------------------------ Dense
    def dense(self, op: Dense, lookup: Lookup | None):
        c = self.c
        n, p = c.n, c.batch
        src = c.layouts[op.input.name]
        out_tensor = lookup.output if lookup else op.output
        dst = c.layouts[out_tensor.name]
        k_total, n_out = op.weight.shape
        pixels = src.height * src.width
        if src.pads.any:
            raise CodegenError(f"{op.name}: a Dense cannot read a padded image "
                               f"({src.tensor.name} also feeds a padded convolution)")
        if k_total != src.channels * pixels:
            raise CodegenError(f"{op.name}: weight has {k_total} rows, input "
                               f"{src.tensor.name} has {src.channels * pixels} elements")
        colsum = op.weight.sum(axis=0, dtype=np.int64)
        bias = quant.folded_bias(op.bias, colsum, op.input.quant.zero_point)
        real = quant.layer_multipliers(op.input.quant.scale, op.weight_scale,
                                       op.output.quant.scale)
        lo, hi = quant.clip_bounds(op.activation, op.output.quant)
        table = c.table_block(lookup.name, lookup.table) if lookup else None
        tiles = self.dense_tiles(op, src)
        u = signed_flag(src) + weight_flag(op)
        k_steps = src.chunks * pixels
        per_block = k_steps
        e = self.e
        for j in range(-(-n_out // n)):
            half = c.next_half()
            block_tiles = tiles[j * per_block:(j + 1) * per_block]
            for g, (q, t) in enumerate(self.tile_groups(k_steps, 0 if pixels == 1 else pixels,
                                                        len(tiles[0]))):
                o = "O" if g == 0 else ""
                if pixels == 1:           # vector: chunk q is B rows at q * B
                    e.cfg(rep_ub_stride=p * src.per, rep_acc_stride=0)
                    rep = f", repeat={t}" if t > 1 else ""
                    e.mmc(f"MMC.S{o}{u} {self.ub(src.tensor.name, q * p)}, {self.acc(half)}, "
                          f"{p}{rep}", switched(block_tiles[q:q + t]),
                          f"cols {j * n}..: K chunks {q}..{q + t - 1}" if g == 0 or t else "")
                else:                     # flattened image: pixel p of every sample per tap
                    chunk, pix = divmod(q, pixels)
                    e.cfg(conv_pitch=src.image_rows, conv_kw=MAX_REPEAT, conv_stride=1)
                    rep = f", repeat={t}" if t > 1 else ""
                    e.mmc(f"MMC.CS{o}{u} {self.ub(src.tensor.name, src.pixel(p, chunk, 0, 0, 0) + pix)}, "
                          f"{self.acc(half)}, {p}, 1{rep}", switched(block_tiles[q:q + t]),
                          f"cols {j * n}..: chunk {chunk} pixels {pix}..{pix + t - 1}")
            params = self.requant_block(op.name, bias, real, j * n)
            self.act_output(op.output.quant, lo, hi, params, table, op.output.quant.zero_point)
            act = "ACT.P" + ("L" if lookup else "")
            e.cfg(act_ub_pitch=0)
            e.line(f"{act} {self.acc(half)}, {self.ub(dst.tensor.name, dst.pixel(p, j, 0, 0, 0))}, {p}",
                   f"cols {j * n}..{min(n_out, (j + 1) * n) - 1}: bias, requantize"
                   + (f", {lookup.function or 'lookup'}" if lookup else ""))

    def matrix_tiles(self, op, region: str, recipe) -> tuple:
        """One switch's tiles of `op`, registered: (tile,), or the (low, high) pair of its
        int16 weights (D)."""
        if op.wide_weights:
            return tuple(self.c.weights.add(region, plane)
                         for plane in weight_planes(recipe, self.c.n))
        return (self.c.weights.add(region, recipe),)

    def dense_tiles(self, op: Dense, src: Layout) -> list[tuple]:
        """The Dense's tiles in consumption order, one unit per switch (matrix_tiles):
        column block, then chunk, then pixel."""
        cached = self.c.tiles.get(op.name)
        if cached is not None:
            return cached
        n = self.c.n
        pixels = src.height * src.width
        region = self.c.tile_region_name(op.name)
        refs = []
        for j in range(-(-op.weight.shape[1] // n)):
            for chunk in range(src.chunks):
                for pix in range(pixels):
                    if pixels == 1:
                        recipe = dense_tile(op.weight, chunk * n, j * n, n)
                    else:
                        count = min(n, src.channels - chunk * n)
                        recipe = strided_dense_tile(op.weight, chunk * n * pixels + pix, count,
                                                    pixels, j * n, n)
                    refs.append(self.matrix_tiles(op, region, recipe))
        self.c.tiles[op.name] = refs
        return refs

    # ------------------------------------------------------------------ Conv
    def conv(self, op: Conv, pool: Pool | None, lookup: Lookup | None):
        c = self.c
        n, p, half_rows = c.n, c.batch, c.half_rows
        src = c.layouts[op.input.name]
        final = lookup.output if lookup else (pool.output if pool else op.output)
        dst = c.layouts[final.name]
        o_total, c_total, kh, kw = op.weight.shape
        sh, sw = op.strides
        if sh != sw:
            raise CodegenError(f"{op.name}: strides {op.strides} differ (MMC.C has one stride)")
        if c_total * op.groups != src.channels:
            raise CodegenError(f"{op.name}: weight has {c_total} input channels x "
                               f"{op.groups} groups, {src.tensor.name} has {src.channels}")
        ho, wo = output_hw(op)
        pt, pl = op.pads[0], op.pads[1]
        view = (src.pads.top - pt) * src.pitch + (src.pads.left - pl)   # the conv's (0, 0)
        rows_per_sample = src.padded_height // sh                        # tall-image rows
        colsum = op.weight.sum(axis=(1, 2, 3), dtype=np.int64)
        bias = quant.folded_bias(op.bias, colsum, op.input.quant.zero_point)
        real = quant.layer_multipliers(op.input.quant.scale, op.weight_scale,
                                       op.output.quant.scale)
        lo, hi = quant.clip_bounds(op.activation, op.output.quant)
        table = c.table_block(lookup.name, lookup.table) if lookup else None
        # several samples per band: stacked into one tall image, one MMC.C per tap group
        # computes every sample, but also the (kh - 1) / stride rows between two samples,
        # which are never read.  Where there are such rows, one MMC.C per sample and tap
        # instead (the tap's tile switched in by the first sample, reused by the others):
        # every row that enters the array is a useful one, as in the paper's CNN0 (row 1 =
        # row 2), for more (short) instructions.
        per_sample = rows_per_sample > ho and p > 1 and ho * wo <= half_rows
        bands = self.conv_bands(op, ho, wo, ho if per_sample else rows_per_sample,
                                pool is not None)
        tiles = self.conv_tiles(op, src)
        e = self.e
        self.fill_pads(dst)
        e.cfg(conv_pitch=src.pitch, conv_kw=kw, conv_stride=sh)
        for j in range(-(-o_total // n)):
            params = self.requant_block(op.name, bias, real, j * n)
            for samples, rows, cols in bands:
                half = c.next_half()
                if per_sample:
                    self.conv_per_sample(op, src, j, samples, half, view, ho, wo, tiles)
                    stride = ho * wo
                elif len(samples) > 1:
                    height = (len(samples) - 1) * rows_per_sample + ho
                    band_base = src.pixel(p, 0, samples[0], 0, 0) - src.pixel(p, 0, 0, 0, 0)
                else:
                    height = len(rows)
                    band_base = (samples[0] * src.image_rows + rows[0] * sh * src.pitch
                                 + cols[0] * sw)
                if not per_sample:
                    self.conv_stacked(op, src, j, half, view + band_base, height, len(cols),
                                      tiles)
                    stride = rows_per_sample * len(cols)
                self.act_output(op.output.quant, lo, hi, params, table, op.output.quant.zero_point)
                act = ".P" + ("M" if pool else "") + ("L" if lookup else "")
                what = f"out ch {j * n}..: bias, requantize" + (", max pool" if pool else "") \
                    + (f", {lookup.function or 'lookup'}" if lookup else "")
                if pool is not None:
                    self.pool_activate(pool, act, half, 0, stride, dst, j, samples, ho, wo, what)
                else:
                    self.write_image(act, half, 0, stride, dst, j, samples, rows, cols, what)

    def conv_stacked(self, op, src, j, half, base, height, wo, tiles):
        """The band's samples as one tall image: per input chunk (of those output block j
        reads: a grouped conv skips the zero tiles), tap groups of at most fifo_depth + 1
        taps, each one MMC.C with S (repeat walks the taps).  tiles[j]: block j's tiles."""
        n, p = self.c.n, self.c.batch
        _o, _c, kh, kw = op.weight.shape
        taps = kh * kw
        u = signed_flag(src) + weight_flag(op)
        e = self.e
        first = True
        for ci, chunk in enumerate(group_chunks(op, j, n)):
            chunk_base = chunk * src.chunk_rows(p) + base
            for q, t in self.tile_groups(taps, kw, len(tiles[j][0])):
                dy, dx = divmod(q, kw)
                o = "O" if first else ""
                rep = f", repeat={t}" if t > 1 else ""
                k0 = ci * taps + q
                e.mmc(f"MMC.CS{o}{u} {self.ub(src.tensor.name, chunk_base + dy * src.pitch + dx)}, "
                      f"{self.acc(half)}, {height}, {wo}{rep}", switched(tiles[j][k0:k0 + t]),
                      f"out ch {j * n}.., in ch {chunk * n}.., taps {q}..{q + t - 1}"
                      if first else "")
                first = False

    def conv_per_sample(self, op, src, j, samples, half, view, ho, wo, tiles):
        """One MMC.C per sample and tap: sample i of the band at accumulator rows
        i * ho * wo; the first sample's MMC switches to the tap's tile, the others reuse it."""
        n, p = self.c.n, self.c.batch
        _o, _c, kh, kw = op.weight.shape
        taps = kh * kw
        u = signed_flag(src) + weight_flag(op)
        e = self.e
        for ci, chunk in enumerate(group_chunks(op, j, n)):
            for q in range(taps):
                dy, dx = divmod(q, kw)
                k0 = ci * taps + q
                o = "O" if ci == 0 and q == 0 else ""
                for i, b in enumerate(samples):
                    ub = chunk * src.chunk_rows(p) + view + b * src.image_rows \
                        + dy * src.pitch + dx
                    e.mmc(f"MMC.C{'S' if i == 0 else ''}{o}{u} {self.ub(src.tensor.name, ub)}, "
                          f"{self.acc(half, i * ho * wo)}, {ho}, {wo}",
                          tiles[j][k0] if i == 0 else [],
                          f"out ch {j * n}.., in ch {chunk * n}.., tap {q}, samples "
                          f"{samples[0]}..{samples[-1]}" if i == 0 else "")

    def conv_bands(self, op, ho, wo, rows_per_sample, pooled):
        """[(samples, output rows, output columns)]: whole samples while the tall image fits
        an accumulator half, else one sample's rows in bands, else (an output row wider
        than a half: YOLOv8's 2100-anchor DFL Conv) one row's columns in bands (not with a
        fused pooling)."""
        p, half = self.c.batch, self.c.half_rows
        whole = range(wo)
        if ho * wo <= half:
            per = max(1, (half // wo - ho) // rows_per_sample + 1)
            return [(range(b, min(p, b + per)), range(ho), whole) for b in range(0, p, per)]
        if pooled:
            raise CodegenError(f"{op.name}: a {ho}x{wo} output does not fit an accumulator "
                               f"half ({half} rows) with its pooling fused")
        if wo > half:
            return [(range(b, b + 1), range(y, y + 1), range(x, min(wo, x + half)))
                    for b in range(p) for y in range(ho) for x in range(0, wo, half)]
        rows = half // wo
        return [(range(b, b + 1), range(y, min(ho, y + rows)), whole)
                for b in range(p) for y in range(0, ho, rows)]

    def conv_tiles(self, op: Conv, src: Layout) -> list[list[tuple]]:
        """Per output block j, its tiles in consumption order, one unit per switch
        (matrix_tiles): input chunk, then tap."""
        cached = self.c.tiles.get(op.name)
        if cached is not None:
            return cached
        n = self.c.n
        o_total, _c, kh, kw = op.weight.shape
        region = self.c.tile_region_name(op.name)
        refs = []                     # per output block j: its chunks' taps, in order
        for j in range(-(-o_total // n)):
            block = []
            for chunk in group_chunks(op, j, n):
                for dy in range(kh):
                    for dx in range(kw):
                        recipe = (conv_tile(op.weight, j * n, chunk * n, dy, dx, n)
                                  if op.groups == 1 else
                                  grouped_conv_tile(op.weight, op.groups, j * n, chunk * n,
                                                    dy, dx, n))
                        block.append(self.matrix_tiles(op, region, recipe))
            refs.append(block)
        self.c.tiles[op.name] = refs
        return refs

    # ------------------------------------------------------------------ Pool
    def pool_registers(self, pool: Pool, height: int, width: int):
        """The pool registers of `pool` on a height x width image: the rows' window, stride
        and padding, and the columns' where they differ (their reset values, 0 and -1, take
        the rows': a square pool sets only the rows', as before registers 33-36)."""
        kh, kw = pool.kernel
        sh, sw = pool.strides
        t, l, b, r = pool.pads
        if max(t, b) >= kh or max(l, r) >= kw:
            raise CodegenError(f"{pool.name}: pooling {pool.kernel} pads {pool.pads}: a pad "
                               f"as large as the window")
        self.e.cfg(pool_size=kh, pool_width=width, pool_stride=sh, pool_pad=t, pool_pad_end=b,
                   pool_count_pad=int(pool.count_include_pad),
                   pool_size_x=0 if kw == kh else kw, pool_stride_x=0 if sw == sh else sw,
                   pool_pad_x=-1 if l == t else l, pool_pad_end_x=-1 if r == b else r)

    def pool_activate(self, pool: Pool, act: str, half: str, acc_first: int, acc_stride: int,
                      dst: Layout, chunk: int, samples: range, height: int, width: int,
                      what: str, out_row0: int = 0):
        """Pool each sample's height x width accumulator image into dst (its pooled rows
        from out_row0 on)."""
        hp, wp = output_hw_pool(pool, height, width)
        _c, h, w = pool.output.shape
        whole = height == pool.input.shape[1]          # else a band of rows (pool_bands)
        if wp != w or (whole and hp != h):
            raise CodegenError(f"{pool.name}: pooling {pool.kernel} stride {pool.strides} pads "
                               f"{pool.pads} of a {height}x{width} image makes {hp}x{wp}, not "
                               f"the output's {h}x{w}")
        self.pool_registers(pool, height, width)
        self.activate_images(act, half, acc_first, acc_stride, dst, chunk, samples, out_row0,
                             height * width, wp, what)

    def copy_to_acc(self, src: Layout, chunk: int, samples: range, rows: range, half: str,
                    first_switch: bool) -> int:
        """Identity MatrixMultiply: rows of the samples' images (pads skipped) into `half`;
        returns the accumulator rows between consecutive samples."""
        p = self.c.batch
        u = signed_flag(src)
        s = "S" if first_switch else ""
        tiles = [self.c.identity()] if first_switch else []
        e = self.e
        name = src.tensor.name
        if not src.pads.any and len(rows) == src.height:
            e.mmc(f"MMC.{s}O{u} {self.ub(name, src.pixel(p, chunk, samples[0], 0, 0))}, "
                  f"{self.acc(half)}, {len(samples) * src.image_rows}", tiles,
                  "copy through the identity tile")
            return src.image_rows
        e.cfg(conv_pitch=src.pitch, conv_kw=1, conv_stride=1)
        height = (len(samples) - 1) * src.padded_height + len(rows)
        e.mmc(f"MMC.C{s}O{u} {self.ub(name, src.pixel(p, chunk, samples[0], rows[0], 0))}, "
              f"{self.acc(half)}, {height}, {src.width}", tiles,
              "copy through the identity tile (padding skipped)")
        return src.padded_height * src.width

    def sample_groups(self, src: Layout, what: str) -> list[range]:
        p, half = self.c.batch, self.c.half_rows
        per_sample = src.padded_height * src.width
        if src.height * src.width > half:
            raise CodegenError(f"{what}: a {src.height}x{src.width} image does not fit an "
                               f"accumulator half ({half} rows)")
        per = max(1, (half - src.height * src.width) // per_sample + 1)
        return [range(b, min(p, b + per)) for b in range(0, p, per)]

    def pool(self, op: Pool, lookup: Lookup | None):
        c = self.c
        src = c.layouts[op.input.name]
        final = lookup.output if lookup else op.output
        dst = c.layouts[final.name]
        table = c.table_block(lookup.name, lookup.table) if lookup else None
        self.fill_pads(dst)
        qi, qo = op.input.quant, op.output.quant
        if op.kind == "max":
            if (qi.scale, qi.zero_point, qi.signed) != (qo.scale, qo.zero_point, qo.signed):
                raise CodegenError(f"{op.name}: max pooling with different input and output "
                                   f"quantization")
            act = ".M" + ("L" if lookup else "")
            self.e.cfg(act_mult=1, act_shift=0)
            self.act_output(qo, qo.qmin, qo.qmax, None, table, 0)
        elif op.kind == "avg":
            n = c.n
            bias = np.full(src.channels, -int(qi.zero_point), np.int64)
            # a global average: MLAS's integer sum times one float32 multiplier that holds
            # the count, which the float form computes bit for bit; other windows:
            # onnxruntime sums dequantized floats, the exact form rounds the exact mean
            # (equal but on ties; docs/compiler.md, Rounding)
            as_float = op.kernel == (src.height, src.width) and not any(op.pads)
            if as_float:
                real = np.full(src.channels, quant.global_average_multiplier(
                    qi.scale, qo.scale, src.height * src.width))
            else:
                real = np.full(src.channels, np.float32(qi.scale) / np.float32(qo.scale))
            act = ".PA" + ("L" if lookup else "")
        else:
            raise CodegenError(f"{op.name}: pooling kind {op.kind!r}")
        switched = False
        big = src.height * src.width > c.half_rows
        for chunk in range(src.chunks):
            if op.kind == "avg":
                params = self.requant_block(op.name, bias, real, chunk * n, as_float)
                self.act_output(qo, qo.qmin, qo.qmax, params, table, qo.zero_point,
                                as_float)
            if big:
                self.pool_bands(op, act, src, dst, chunk, not switched)
                switched = True
                continue
            for samples in self.sample_groups(src, op.name):
                half = c.next_half()
                stride = self.copy_to_acc(src, chunk, samples, range(src.height), half,
                                          not switched)
                switched = True
                self.pool_activate(op, act, half, 0, stride, dst, chunk, samples, src.height,
                                   src.width, f"{op.kind} pool, channels {chunk * c.n}..")

    def pool_bands(self, op: Pool, act: str, src: Layout, dst: Layout, chunk: int,
                   first_switch: bool):
        """An image larger than an accumulator half: bands of pooled rows, each copying the
        input rows its windows need (overlapping when the window exceeds the stride)."""
        k, s = op.kernel[0], op.strides[0]          # bands of rows: the rows' window
        if op.pads[0] or op.pads[2]:                 # (columns' padding: every band's own)
            raise CodegenError(f"{op.name}: a pooling padded above or below of a "
                               f"{src.height}x{src.width} image larger than an accumulator half")
        ho, _wo = output_hw_pool(op, src.height, src.width)
        per_band = max(1, ((self.c.half_rows // src.width) - k) // s + 1)
        if k * src.width > self.c.half_rows:
            raise CodegenError(f"{op.name}: {k} rows of width {src.width} exceed an "
                               f"accumulator half")
        for b in range(self.c.batch):
            for oy0 in range(0, ho, per_band):
                oy1 = min(ho, oy0 + per_band)
                rows = range(oy0 * s, (oy1 - 1) * s + k)
                half = self.c.next_half()
                self.copy_to_acc(src, chunk, range(b, b + 1), rows, half, first_switch)
                first_switch = False
                self.pool_activate(op, act, half, 0, len(rows) * src.width, dst, chunk,
                                   range(b, b + 1), len(rows), src.width,
                                   f"{op.kind} pool rows {oy0}..{oy1 - 1}", oy0)

    # ------------------------------------------------------------------ Elementwise
    def elementwise(self, op: Elementwise, lookup: Lookup | None):
        c = self.c
        p = c.batch
        lay_a = c.layouts[op.a.name]
        final = lookup.output if lookup else op.output
        dst = c.layouts[final.name]
        rows = dst.vectors(p)            # offsets count vectors (an int16 one is two rows)
        operands = [lay_a] if op.b is None or op.broadcasts_b else \
            [lay_a, c.layouts[op.b.name]]
        if not all((lay.vectors(p) == rows or lay.tensor is op.b) and lay.pads == dst.pads and
                   lay.image_rows == dst.image_rows for lay in operands):
            raise CodegenError(f"{op.name}: operands and output in different layouts "
                               f"({'; '.join(lay.describe() for lay in operands)}; "
                               f"{dst.describe()})")
        qc = op.output.quant
        e = self.e
        if op.spreads_b:                 # b's one channel into every chunk of the output
            self.spread_channel(op, c.layouts[op.b.name], dst)
        e.cfg(**vector_registers(op))
        table = elementwise_table(op, lookup)
        row_b = op.b is None or op.broadcasts_b          # B: one row read for every row
        flags = vector_flags(op, row_b, table is not None)
        # the repeat stride moves A, B and C alike: mixed widths repeat nothing
        widths = {lay.per for lay in operands} | {dst.per}
        per = widths.pop() if len(widths) == 1 else 0
        if table is not None:
            e.cfg(act_table=c.table_block(("elementwise", op.name), table))
        name = "VMUL" if op.op == "mul" else "VADD"
        mnemonic = f"{name}.{flags}" if flags else name
        what = (f"{op.op}{' (reversed)' if op.reverse else ''}"
                f"{' a constant row' if op.b is None else ''}"
                f"{' a row per sample' if op.broadcasts_b else ''}, requantized"
                + (f", {op.activation.kind}" if op.activation.kind != "none" else "")
                + (f", {lookup.function or 'lookup'}" if lookup else ""))
        for first, count, b_at in self.operand_runs(op, dst, rows):
            at = first
            while at < first + count:    # whole iterations of MAX_VECTOR rows, then the rest
                length = min(MAX_VECTOR, first + count - at)
                reps = min(MAX_REPEAT, (first + count - at) // length) if per else 1
                rep = ""
                if reps > 1:
                    e.cfg(rep_ub_stride=per * length)
                    rep = f", repeat={reps}"
                b = b_at if row_b else self.ub(
                    dst.tensor.name if op.spreads_b else op.b.name, at)
                e.line(f"{mnemonic} {self.ub(op.a.name, at)}, {b}, "
                       f"{self.ub(dst.tensor.name, at)}, {length}{rep}",
                       f"{what}: rows {at}..{at + reps * length - 1}")
                at += reps * length
        slot = c.alloc.of[dst.tensor.name].name
        if dst.pads.any:
            # A and a tensor B hold their zero points in the padding (real 0), which adds
            # and multiplies to z_c; a constant added or subtracted moves it, as a table may
            moved = row_b and op.op != "mul"
            if moved or (table is not None and table[qc.zero_point & 0xFF] !=
                         (dst.tensor.quant.zero_point & 0xFF)):
                c.padded.pop(slot, None)   # the padding came out wrong: write it again
                self.fill_pads(dst)
            else:
                c.padded[slot] = dst.padding_key

    def spread_channel(self, op: Elementwise, src: Layout, dst: Layout):
        """Write b (one channel) into every channel of dst, which the VADD / VMUL then reads
        as its b in place: a MatrixMultiply of b's rows by a tile whose first row is ones
        puts b's value in every accumulator column, and an identity Activate per chunk
        writes it in b's own type.  Bands of an accumulator half."""
        c, e = self.c, self.e
        p = c.batch
        tiles = c.tiles.get(op.name)
        if tiles is None:
            tiles = c.tiles[op.name] = [c.weights.add(c.tile_region_name(op.name),
                                                      ones_row_tile())]
        qb = op.b.quant
        u = signed_flag(src)
        total = src.rows(p)
        for at in range(0, total, c.half_rows):
            length = min(c.half_rows, total - at)
            half = c.next_half()
            first = at == 0
            e.mmc(f"MMC.{'S' if first else ''}O{u} {self.ub(op.b.name, at)}, "
                  f"{self.acc(half)}, {length}", tiles if first else [],
                  f"{op.b.name} into every column (a tile whose first row is ones)")
            e.cfg(act_mult=1, act_shift=0, act_ub_pitch=0, rep_acc_stride=0,
                  rep_ub_stride=0)
            self.act_output(qb, qb.qmin, qb.qmax, None, None, 0)
            for j in range(dst.chunks):
                e.line(f"ACT {self.acc(half)}, "
                       f"{self.ub(dst.tensor.name, j * dst.chunk_rows(p) + at)}, {length}",
                       f"{op.b.name} as channels {j * c.n}..: rows {at}..{at + length - 1}")

    def operand_runs(self, op: Elementwise, dst: Layout, rows: int):
        """[(first row, rows, B's constant row or None)]: every row at once for two tensors
        or a constant that is one value everywhere; else one run per chunk of N channels,
        each with its chunk's constant row."""
        n, p = self.c.n, self.c.batch
        if op.broadcasts_b:          # each sample's pixels with its own row of b
            lay_b = self.c.layouts[op.b.name]
            if lay_b.pads.any or lay_b.height * lay_b.width != 1:
                raise CodegenError(f"{op.name}: the broadcast operand {op.b.name} is not one "
                                   f"unpadded pixel per sample ({lay_b.describe()})")
            per = dst.image_rows
            return [(j * dst.chunk_rows(p) + s * per, per,
                     self.ub(op.b.name, lay_b.pixel(p, j, s, 0, 0)))
                    for j in range(dst.chunks) for s in range(p)]
        if op.b is not None:
            return [(0, rows, None)]
        stored, _zero = constant_rows(op, dst.channels, n)
        if len(stored) == 1 or np.all(stored == stored[0]):
            return [(0, rows, self.c.param_block(("vconst", op.name, 0), stored[:1]))]
        per = dst.chunk_rows(p)
        return [(j * per, per, self.c.param_block(("vconst", op.name, j), stored[j:j + 1]))
                for j in range(dst.chunks)]

    # ------------------------------------------------------------------ Lookup
    def lookup(self, op: Lookup):
        if op.index is not None:
            return self.elementwise(requantization(op), op)
        c = self.c
        src = c.layouts[op.input.name]
        dst = c.layouts[op.output.name]
        table = c.table_block(op.name, op.table)
        self.fill_pads(dst)
        self.e.cfg(act_mult=1, act_shift=0)
        q = op.input.quant
        # the byte written before the lookup must be x_q itself: the input's own type
        self.e.cfg(act_out=act_out(q), act_zero=0, act_lo=q.qmin, act_hi=q.qmax,
                   act_table=table)
        switched = False
        what = f"{op.function or 'lookup'}, channels"
        if src.width > c.half_rows:
            raise CodegenError(f"{op.name}: a lookup over rows {src.width} pixels wide (an "
                               f"accumulator half holds {c.half_rows})")
        for chunk in range(src.chunks):
            if src.height * src.width > c.half_rows:      # bands of rows, sample by sample
                per = max(1, c.half_rows // src.width)
                for b in range(c.batch):
                    for y0 in range(0, src.height, per):
                        rows = range(y0, min(src.height, y0 + per))
                        half = c.next_half()
                        self.copy_to_acc(src, chunk, range(b, b + 1), rows, half, not switched)
                        switched = True
                        self.write_image(".L", half, 0, len(rows) * src.width, dst, chunk,
                                         range(b, b + 1), rows, range(src.width),
                                         f"{what} {chunk * c.n}..")
                continue
            for samples in self.sample_groups(src, op.name):
                half = c.next_half()
                stride = self.copy_to_acc(src, chunk, samples, range(src.height), half,
                                          not switched)
                switched = True
                self.write_image(".L", half, 0, stride, dst, chunk, samples, range(src.height),
                                 range(src.width), f"{what} {chunk * c.n}..")


def requantization(op: Lookup) -> Elementwise:
    """A Lookup of an int16 input as the VADD that requantizes it to its 8-bit index (plus a
    constant 0 at A's scale: one shift for both multipliers), the table then fused (L):
    `VADD.BLX`, with U for a uint8 index."""
    x = op.input
    return Elementwise(op.name, x, None, replace(op.output, quant=op.index), "add",
                       nodes=op.nodes, constant=np.zeros(1, np.int64),
                       constant_quant=QParams(x.quant.scale, 0, op.index.signed))


def ones_row_tile():
    """A weight tile whose first row is ones: every output column is input element 0."""
    def fill(out):
        out[0, :] = 1
    return fill


def constant_rows(op: Elementwise, channels: int, n: int) -> tuple[np.ndarray, int]:
    """An Elementwise's constant b as UB rows (one per chunk of n channels, uint8 bytes as
    stored) and the zero point B is read with.  The bytes are b's centred integers v = q - z
    moved into the output's type (the U flag reads A, B and C alike) by a zero point of our
    own: any 8-bit tensor's v spans at most 255, so some zb in -128..255 fits them all."""
    v = np.asarray(op.constant, np.int64).reshape(-1) - op.constant_quant.zero_point
    zero = constant_zero(op)
    chunks = -(-channels // n)
    if v.size == 1:                  # a scalar: every column (one row serves every chunk)
        stored = np.full(chunks * n, v[0] + zero, np.int64)
    elif v.size != channels:
        raise CodegenError(f"{op.name}: {v.size} constant values for {channels} channels")
    else:
        stored = np.full(chunks * n, zero, np.int64)
        stored[:channels] = v + zero
    return (stored & 0xFF).astype(np.uint8).reshape(chunks, n), zero


def constant_zero(op: Elementwise) -> int:
    """The zero point B reads an Elementwise's constant row with (constant_rows)."""
    v = np.asarray(op.constant, np.int64).reshape(-1) - op.constant_quant.zero_point
    lo_t, hi_t = (-128, 127) if op.output.quant.signed else (0, 255)
    zero = max(-128, lo_t - int(v.min()))
    if zero > min(255, hi_t - int(v.max())):
        raise CodegenError(f"{op.name}: constant values span {int(v.max() - v.min())} "
                           f"steps, more than one byte holds")
    return zero


def vector_flags(op: Elementwise, row_b: bool, table: bool) -> str:
    """VADD / VMUL's flags: U when its 8-bit operands are uint8 (one signedness: match.py,
    unsupported), B for one row of b, L for a table, X / Y / Z for int16 A / B / C."""
    narrow = [t.quant for t in (*op.inputs, op.output) if not t.quant.wide]
    wide = "".join(flag for flag, t in (("X", op.a), ("Y", op.b), ("Z", op.output))
                   if t is not None and t.quant.wide)
    return ("U" if narrow and not narrow[0].signed else "") + ("B" if row_b else "") + \
        ("L" if table else "") + wide


def vector_registers(op: Elementwise) -> dict[str, int]:
    """VADD / VMUL's requantization registers for `op` (spec/isa.md 5.11): onnxruntime's
    QLinearAdd / QLinearMul scales and zero points; a Sub's B multiplier negated; b - a (a
    constant first) with the roles of the two multipliers swapped, A staying the tensor.
    With an int16 operand the exact fixed point (vec_float is onnxruntime's 8-bit kernel)."""
    qa, qc = op.a.quant, op.output.quant
    wide = any(t.quant.wide for t in (*op.inputs, op.output))
    if op.b is not None and op.op in ("add", "mul") and not wide:
        # two activations: onnxruntime's float32 arithmetic (vec_float), identical to its
        # QLinearAdd / QLinearMul; a Sub or a re-encoded constant keeps the fixed point
        return qlinear_float_registers(op.op, qa.scale, qa.zero_point, op.b.quant.scale,
                                       op.b.quant.zero_point, qc.scale, qc.zero_point)
    if op.b is None:
        zb = constant_zero(op)
        sb = op.constant_quant.scale
    else:
        zb, sb = op.b.quant.zero_point, op.b.quant.scale
    if op.reverse:
        regs = qlinear_registers(op.op, sb, zb, qa.scale, qa.zero_point, qc.scale,
                                 qc.zero_point)
        regs["vec_mult_a"], regs["vec_mult_b"] = regs["vec_mult_b"], regs["vec_mult_a"]
        regs["vec_zero_a"], regs["vec_zero_b"] = regs["vec_zero_b"], regs["vec_zero_a"]
        return {**regs, "vec_float": 0}
    return {**qlinear_registers(op.op, qa.scale, qa.zero_point, sb, zb, qc.scale,
                                qc.zero_point), "vec_float": 0}


def elementwise_table(op: Elementwise, lookup: Lookup | None) -> np.ndarray | None:
    """The L table of a VADD / VMUL, indexed by the stored output byte: the fused clamp
    (Relu / Clip), then a fused Lookup's table; None when neither is fused."""
    if op.activation.kind == "none" and lookup is None:
        return None
    q = op.output.quant
    stored = np.arange(256)
    value = stored - 256 * (stored >= 128) if q.signed else stored
    lo, hi = activation_bounds(op.activation, q)
    byte = np.clip(value, lo, hi) & 0xFF
    if lookup is not None:
        return np.asarray(lookup.table).astype(np.int64)[byte] & 0xFF
    return byte


def output_hw_pool(pool: Pool, height: int, width: int) -> tuple[int, int]:
    kh, kw = pool.kernel
    sh, sw = pool.strides
    t, l, b, r = pool.pads
    return (height + t + b - kh) // sh + 1, (width + l + r - kw) // sw + 1


__all__ = ["Lowering", "CodegenError", "Conv", "Dense", "Lookup", "Pool"]

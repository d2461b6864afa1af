"""How each tensor of a segment lies in the Unified Buffer (and in host memory).

Every tensor is an image of C channels x H x W pixels (a vector (K,) is K channels of one
pixel).  One UB row holds one pixel's channels for one chunk of N channels; the rows are
ordered [chunk][sample][padded row][padded column]:

    row(c, b, y, x) = c * chunk_rows + b * image_rows + (pad_top + y) * pitch + pad_left + x

so a vector tensor is the usual "K chunks of B rows" (mlp0), and a convolution reads a tap
of every sample with one MMC.C: the samples' padded images are stacked into one tall image
(image_rows = height * pitch, height a multiple of every consumer's stride).  The padding
holds the tensor's zero point (real zero), as ONNX pads.  Host memory uses the same layout,
one pass of samples after another.

An Elementwise (VADD / VMUL) reads its two operands (or one and a constant row) and writes its
output row for row, so they share one layout: the union of their padding and the lcm of their
row multiples.  Its padding then comes out right by itself: (z_a - z_a) and (z_b - z_b) give
z_c (a constant added or subtracted moves it: lower.py writes it again).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Conv, Dense, Elementwise, Lookup, Segment, Tensor


@dataclass(frozen=True)
class Pads:
    top: int = 0
    left: int = 0
    bottom: int = 0
    right: int = 0

    def union(self, other: "Pads") -> "Pads":
        return Pads(max(self.top, other.top), max(self.left, other.left),
                    max(self.bottom, other.bottom), max(self.right, other.right))

    @property
    def any(self) -> bool:
        return bool(self.top or self.left or self.bottom or self.right)


@dataclass(frozen=True)
class Layout:
    tensor: Tensor
    n: int                      # array size (channels per row)
    pads: Pads
    row_multiple: int = 1       # padded height is a multiple of this (consumers' strides)

    @property
    def channels(self) -> int:
        return self.tensor.shape[0]

    # any rank: (K,) one pixel, (C, L) one row of L pixels, (C, H, W), (C, H, *rest) rows
    # of prod(rest) pixels (the bytes are the same; element-wise operators need no more)
    @property
    def height(self) -> int:
        return self.tensor.shape[1] if len(self.tensor.shape) >= 3 else 1

    @property
    def width(self) -> int:
        shape = self.tensor.shape
        return int(math.prod(shape[2:])) if len(shape) >= 3 else (shape[1] if len(shape) == 2
                                                                  else 1)

    @property
    def chunks(self) -> int:
        return -(-self.channels // self.n)

    @property
    def pitch(self) -> int:
        return self.pads.left + self.width + self.pads.right

    @property
    def padded_height(self) -> int:
        h = self.pads.top + self.height + self.pads.bottom
        return -(-h // self.row_multiple) * self.row_multiple

    @property
    def image_rows(self) -> int:
        return self.padded_height * self.pitch

    def chunk_rows(self, batch: int) -> int:
        return batch * self.image_rows

    @property
    def per(self) -> int:
        """UB rows per vector: 2 for an int16 tensor (low bytes, then high bytes: the rows
        MatrixMultiply's H flag reads and Activate's act_out = 2 writes), else 1.  Every
        offset of this class counts vectors; UB and host rows are `per` times as many."""
        return 2 if self.tensor.quant.wide else 1

    def rows(self, batch: int) -> int:
        """UB (and host) rows of the whole tensor for `batch` samples."""
        return self.per * self.vectors(batch)

    def vectors(self, batch: int) -> int:
        """Vectors (pixels of a chunk of channels) of the whole tensor: `per` rows each."""
        return self.chunks * self.chunk_rows(batch)

    def pixel(self, batch: int, c: int, b: int, y: int, x: int) -> int:
        """Row offset of chunk c, sample b, pixel (y, x) (image coordinates, pads excluded)."""
        return (c * self.chunk_rows(batch) + b * self.image_rows
                + (self.pads.top + y) * self.pitch + self.pads.left + x)

    @property
    def padding_key(self) -> tuple | None:
        """What decides which rows of a tensor's block are padding, and their byte: two
        tensors with equal keys have the same padding rows holding the same value."""
        if not self.pads.any:
            return None
        return (self.chunks, self.image_rows, self.pitch, self.pads, self.height,
                self.width, self.tensor.quant.zero_point & 0xFFFF, self.per)

    def describe(self) -> str:
        p = self.pads
        pad = f", padded t{p.top} l{p.left} b{p.bottom} r{p.right}" if p.any else ""
        wide = ", int16: two rows per pixel" if self.per == 2 else ""
        return (f"{self.chunks} chunk(s) of {self.n} channels x samples x "
                f"{self.padded_height}x{self.pitch} pixels{pad}{wide}")


def conv_pads(op: Conv) -> Pads:
    t, l, b, r = op.pads
    return Pads(t, l, b, r)


def plan_layouts(segment: Segment, n: int) -> dict[str, Layout]:
    """A layout for every tensor: padded for the convolutions that read it, its height a
    multiple of their strides (so the tall stacked image keeps every sample aligned)."""
    tensors: dict[str, Tensor] = {}
    pads: dict[str, Pads] = {}
    multiple: dict[str, int] = {}
    for t in segment.inputs:
        tensors[t.name] = t
    for op in segment.operators:
        for t in op.inputs:
            tensors.setdefault(t.name, t)
        tensors.setdefault(op.output.name, op.output)
        if isinstance(op, Conv):
            name = op.input.name
            pads[name] = pads.get(name, Pads()).union(conv_pads(op))
            multiple[name] = math.lcm(multiple.get(name, 1), op.strides[0])
    shared = _elementwise_classes(segment)
    for members in {id(c): c for c in shared.values()}.values():
        union, lcm = Pads(), 1
        for name in members:
            union = union.union(pads.get(name, Pads()))
            lcm = math.lcm(lcm, multiple.get(name, 1))
        for name in members:
            pads[name], multiple[name] = union, lcm
    layouts = {name: Layout(t, n, pads.get(name, Pads()), multiple.get(name, 1))
               for name, t in tensors.items()}
    for op in segment.operators:
        if isinstance(op, Dense) and op.input.name in shared and layouts[op.input.name].pads.any:
            culprit = next(e for e in segment.operators if isinstance(e, Elementwise)
                           and op.input.name in shared[e.output.name])
            from .lower import Refused
            raise Refused(culprit.name, f"{culprit.name}: its operands and output share one "
                          f"padded layout (a convolution reads one of them), and the Dense "
                          f"{op.name} cannot read a padded image")
    return layouts


def _elementwise_classes(segment: Segment) -> dict[str, list[str]]:
    """Tensor -> the tensors that must share its layout (linked by Elementwise operators,
    and a Lookup's output after one: fuse.py may make it the VADD's L table, which writes
    it row for row; or after an int16 input, which a VADD requantizes), as one list object
    per class."""
    cls: dict[str, list[str]] = {}
    made = {op.output.name for op in segment.operators if isinstance(op, Elementwise)}
    for op in segment.operators:
        if isinstance(op, Elementwise):
            names = (op.a.name, *(() if op.b is None or op.broadcasts_b else (op.b.name,)),
                     op.output.name)
        elif isinstance(op, Lookup) and (op.input.name in made or op.index is not None):
            names = (op.input.name, op.output.name)
        else:
            continue
        merged: list[str] = []
        for name in names:
            members = cls.get(name, [name])
            for m in members:
                if m not in merged:
                    merged.append(m)
        for m in merged:
            cls[m] = merged
    return cls


def output_hw(op) -> tuple[int, int]:
    """Output height and width of a Conv or Pool (floor mode, as the IR's shapes say)."""
    _c, h, w = op.input.shape
    if isinstance(op, Conv):
        kh, kw = op.weight.shape[2:]
    else:
        kh, kw = op.kernel
    t, l, b, r = op.pads
    sh, sw = op.strides
    return (h + t + b - kh) // sh + 1, (w + l + r - kw) // sw + 1


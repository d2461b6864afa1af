"""Packing a convolution's taps into the rows of its input, on the host (im2col where it pays).

A convolution over C input channels uses C of the N rows of each tap's weight tile, and
streams its input once per tap: a 5x5 convolution over 48 channels (CNN0's first layer)
keeps the array busy for 25 passes at 48/256 of its rows.  When the input comes from the
host anyway (a segment input read by this convolution alone), the host can lay it out with
several taps side by side in each row, for free:

- all taps (C * kh * kw <= N): row (y, x) holds the whole receptive field of output pixel
  (y, x), channel (dy * kw + dx) * C + c; the convolution becomes a 1x1 one;
- a kernel row (C * kw <= N, stride 1): row (y, x) holds input pixels (y, x .. x + kw - 1),
  channel dx * C + c; the convolution becomes kh x 1 (vertical padding stays on the chip).

The weights are rearranged the same way (a copy of the first layer's, small), so the
arithmetic is the same sums in another order: exact.  The host image has one row per
(packed) pixel as before; it has fewer rows when the horizontal padding goes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..ir import Conv, Segment, Tensor


@dataclass(frozen=True)
class Packing:
    """How the host turns input (batch, C, H, W) into the packed (batch, C', H', W')."""
    kh: int                        # taps packed vertically (1 or the kernel height)
    kw: int                        # taps packed horizontally
    stride: int
    pads: tuple[int, int, int, int]   # padding applied on the host (top, left, bottom, right)
    out_hw: tuple[int, int]
    zero_point: int

    def apply(self, x: np.ndarray) -> np.ndarray:
        t, l, b, r = self.pads
        x = np.asarray(x)
        xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=self.zero_point)
        ho, wo = self.out_hw
        s = self.stride
        parts = [xp[:, :, dy:dy + (ho - 1) * s + 1:s, dx:dx + (wo - 1) * s + 1:s]
                 for dy in range(self.kh) for dx in range(self.kw)]
        return np.concatenate(parts, axis=1)

    def describe(self) -> str:
        what = "all taps" if self.kh > 1 else f"{self.kw} taps of a kernel row"
        return f"packed on the host ({what} per row, im2col)"


def pack_segment(segment: Segment, n: int) -> tuple[Segment, dict[str, Packing]]:
    """The segment with every packable input convolution rewritten over its packed input
    (same tensor name, packed shape), and the host packing of each such input."""
    readers: dict[str, list] = {}
    for op in segment.operators:
        for name in dict.fromkeys(t.name for t in op.inputs):
            readers.setdefault(name, []).append(op)
    outputs = {t.name for t in segment.outputs}
    packings: dict[str, Packing] = {}
    new_ops, new_inputs = list(segment.operators), list(segment.inputs)
    for k, x in enumerate(segment.inputs):
        ops = readers.get(x.name, [])
        if len(ops) != 1 or not isinstance(ops[0], Conv) or x.name in outputs:
            continue
        op = ops[0]
        packed = _pack_conv(op, n)
        if packed is None:
            continue
        conv, packing = packed
        new_ops[new_ops.index(op)] = conv
        new_inputs[k] = conv.input
        packings[x.name] = packing
    if not packings:
        return segment, {}
    return replace(segment, operators=new_ops, inputs=new_inputs), packings


def _pack_conv(op: Conv, n: int):
    o, c, kh, kw = op.weight.shape
    sh, sw = op.strides
    _c, h, w = op.input.shape
    t, l, b, r = op.pads
    if sh != sw or kh * kw == 1 or op.groups != 1:
        return None
    ho = (h + t + b - kh) // sh + 1
    wo = (w + l + r - kw) // sw + 1
    zp = op.input.quant.zero_point
    if c * kh * kw <= n:                          # every tap: a 1x1 convolution
        weight = op.weight.transpose(0, 2, 3, 1).reshape(o, kh * kw * c, 1, 1)
        packing = Packing(kh, kw, sh, (t, l, b, r), (ho, wo), zp)
        shape, strides, pads = (kh * kw * c, ho, wo), (1, 1), (0, 0, 0, 0)
    elif c * kw <= n and sh == 1:                 # one kernel row: a kh x 1 convolution
        weight = op.weight.transpose(0, 3, 1, 2).reshape(o, kw * c, kh, 1)
        packing = Packing(1, kw, 1, (0, l, 0, r), (h, wo), zp)
        shape, strides, pads = (kw * c, h, wo), (1, 1), (t, 0, b, 0)
    else:
        return None
    x = Tensor(op.input.name, shape, op.input.quant)
    conv = replace(op, input=x, weight=np.ascontiguousarray(weight), strides=strides,
                   pads=pads)
    return conv, packing

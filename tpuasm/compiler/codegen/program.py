"""The back end's SegmentProgram: the host image of one batch, and the outputs read back.

A tensor's host rows are its UB layout (codegen/layout.py) for one pass of samples, pass
after pass; padding rows and columns hold the zero point, so an input arrives ready for the
convolutions that read it with one RHM per pass."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir import SegmentProgram
from .layout import Layout


@dataclass
class CompiledSegment(SegmentProgram):
    layouts: dict[str, Layout] = field(default_factory=dict)
    pass_batch: int = 1                 # samples per pass
    passes: int = 1
    instructions: int = 0               # instructions in the source (after macro expansion)
    packings: dict = field(default_factory=dict)   # input -> pack.Packing (host im2col)

    def host_image(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.host_images(inputs, 1)[0].view(np.int8)

    def read_outputs(self, host: np.ndarray) -> dict[str, np.ndarray]:
        return self.read_batches(np.asarray(host).view(np.uint8)[None])

    def host_images(self, inputs: dict[str, np.ndarray], batches: int) -> np.ndarray:
        """The host images of `batches` batches at once, (batches, host_rows, N) uint8 (the
        layout Machine.run_batches takes): each input (batches * batch, *shape), batch
        after batch, packed straight into its rows of every image."""
        host = np.zeros((batches, self.host_rows, self.array_size), np.uint8)
        for row, rows in self.host_constants.items():
            host[:, row:row + len(rows)] = np.asarray(rows).view(np.uint8)
        for name, h in self.inputs.items():
            if name not in inputs:
                raise ValueError(f"segment {self.segment.name}: no data for input {name!r}")
            data = np.asarray(inputs[name])
            if name in self.packings:           # taps side by side in each row (pack.py)
                data = self.packings[name].apply(data)
            shape = (batches * self.batch, *h.tensor.shape)
            if data.shape != shape:
                raise ValueError(f"segment {self.segment.name}: input {name!r} has shape "
                                 f"{data.shape}, expected {shape}")
            self._pack(self.layouts[name], data, host[:, h.base:h.base + h.rows])
        return host

    def read_batches(self, hosts: np.ndarray) -> dict[str, np.ndarray]:
        """Each output (batches * batch, *shape) from the host images (batches, rows, N)
        that Machine.run_batches left."""
        hosts = np.asarray(hosts).view(np.uint8)
        return {name: self._unpack(self.layouts[name], hosts[:, h.base:h.base + h.rows])
                for name, h in self.outputs.items()}

    # ------------------------------------------------------------------ layout
    def _view(self, layout: Layout, rows: np.ndarray) -> np.ndarray:
        """(batches, passes, chunks, samples, padded height, pitch, N) view of a tensor's
        rows in each of `batches` images; an int16 tensor's has one more axis before N,
        (low bytes, high bytes)."""
        per = (layout.per,) if layout.per > 1 else ()
        return rows.reshape(len(rows), self.passes, layout.chunks, self.pass_batch,
                            layout.padded_height, layout.pitch, *per, self.array_size)

    def _interior(self, layout: Layout, view: np.ndarray) -> np.ndarray:
        p = layout.pads
        if layout.per > 1:
            return view[..., p.top:p.top + layout.height, p.left:p.left + layout.width, :, :]
        return view[..., p.top:p.top + layout.height, p.left:p.left + layout.width, :]

    def _pack(self, layout: Layout, data: np.ndarray, rows: np.ndarray) -> None:
        """data (batches * batch, *shape) into `rows`, (batches, tensor rows, N) of images
        that hold zeros: each chunk's real channels written straight into their lanes (a
        one-channel image no longer goes through a 256-lane staging copy), everything
        else the zero point."""
        q = layout.tensor.quant
        if q.wide:
            self._pack_wide(layout, data, rows)
            return
        batches = len(rows)
        total = self.passes * self.pass_batch
        c, h, w, n = layout.channels, layout.height, layout.width, self.array_size
        zero = np.uint8(q.zero_point & 0xFF)
        # bytes all the way (an int64 staging copy of a long sequence's batch took 8x the
        # image, twice): an 8-bit value's byte is its two's complement
        data = _bytes(data).reshape(batches, self.batch, c, h, w)
        if total != self.batch:                 # padding samples of the last pass
            padded = np.full((batches, total, c, h, w), zero, np.uint8)
            padded[:, :self.batch] = data
            data = padded
        data = data.reshape(batches, self.passes, self.pass_batch, c, h, w)
        if zero:
            rows[:] = zero
        interior = self._interior(layout, self._view(layout, rows))  # (K, P, C, B, h, w, N)
        for chunk in range(layout.chunks):
            lanes = min(n, c - chunk * n)
            part = data[:, :, :, chunk * n:chunk * n + lanes]          # (K, P, B, l, h, w)
            interior[:, :, chunk, ..., :lanes] = part.transpose(0, 1, 2, 4, 5, 3)

    def _pack_wide(self, layout: Layout, data: np.ndarray, rows: np.ndarray) -> None:
        """An int16 tensor: each vector as two rows, its values' low bytes then high bytes
        (the rows MatrixMultiply's H flag reads); padding holds the zero point's bytes."""
        q = layout.tensor.quant
        batches = len(rows)
        total = self.passes * self.pass_batch
        c, h, w, n = layout.channels, layout.height, layout.width, self.array_size
        values = np.asarray(data).astype(np.int16).reshape(batches, self.batch, c, h, w)
        if total != self.batch:
            padded = np.full((batches, total, c, h, w), q.zero_point, np.int16)
            padded[:, :self.batch] = values
            values = padded
        values = values.reshape(batches, self.passes, self.pass_batch, c, h, w)
        view = self._view(layout, rows)
        zero = np.array([q.zero_point], np.int16).view(np.uint8)     # little-endian bytes
        view[..., 0, :] = zero[0]
        view[..., 1, :] = zero[1]
        interior = self._interior(layout, view)        # (K, P, C, B, h, w, 2, N)
        planes = values.view(np.uint8).reshape(*values.shape, 2)     # (K, P, B, c, h, w, 2)
        for chunk in range(layout.chunks):
            lanes = min(n, c - chunk * n)
            part = planes[:, :, :, chunk * n:chunk * n + lanes]      # (K, P, B, l, h, w, 2)
            interior[:, :, chunk, ..., :lanes] = part.transpose(0, 1, 2, 4, 5, 6, 3)

    def _unpack(self, layout: Layout, rows: np.ndarray) -> np.ndarray:
        q = layout.tensor.quant
        batches = len(rows)
        if q.wide:
            v = self._interior(layout, self._view(layout, rows))  # (K, P, C, B, H, W, 2, N)
            x = np.ascontiguousarray(v.transpose(0, 1, 3, 2, 7, 4, 5, 6))  # (.., N, H, W, 2)
            x = x.view(np.int16)[..., 0]
            x = x.reshape(batches, self.passes * self.pass_batch,
                          layout.chunks * self.array_size, layout.height,
                          layout.width)[:, :self.batch, :layout.channels]
            return np.ascontiguousarray(x).reshape(batches * self.batch,
                                                   *layout.tensor.shape)
        v = self._interior(layout, self._view(layout, rows))  # (K, P, C, B, H, W, N)
        x = v.transpose(0, 1, 3, 2, 6, 4, 5)                   # (K, P, B, chunks, N, H, W)
        x = x.reshape(batches, self.passes * self.pass_batch,
                      layout.chunks * self.array_size, layout.height,
                      layout.width)[:, :self.batch, :layout.channels]
        x = x.view(np.int8) if q.signed else x
        return np.ascontiguousarray(x).reshape(batches * self.batch, *layout.tensor.shape)


def _bytes(data) -> np.ndarray:
    """The low byte of each value, as uint8 (int8 and uint8 data without a copy)."""
    data = np.asarray(data)
    if data.dtype in (np.int8, np.uint8):
        return data.view(np.uint8)
    return (data.astype(np.int64) & 0xFF).astype(np.uint8)

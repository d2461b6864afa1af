"""Hand-written code generation for the six apps: layer shapes -> .tasm for any machine shape.

The same scheme as programs/mlp0 (which this generalises), chosen as a TPU engineer would:
- Vectors live in the UB as K chunks of B rows (chunk k = features kN..kN+N-1 of every
  sample); images one pixel per row, one plane per channel chunk, each image padded by a
  margin of zeros so a convolution needs no bounds.
- FC: per output block, `MMC.S` over the K chunks (up to `fifo_depth` tiles per
  instruction, `rep_ub_stride = B`), then one Activate; accumulator blocks taken round
  robin so the next block multiplies while the previous one activates.
- Conv: per group of images that fits half the accumulators, per output channel chunk,
  per kernel tap and input chunk one tile; the first image's `MMC.C` switches to it, the
  others reuse it.  A pool that follows a convolution is done in its Activate (ACT.M).
- Vector layers (LSTM gate arithmetic) are Activate passes over the accumulator rows of
  their latest input, one row per cycle.
- Weights are streamed in consumption order; Read_Weights keep `fifo_depth + 1` tiles
  ahead of the switches (the most spec/isa.md 5.3 allows).
- Host inputs not needed at once are loaded in chunks between layers' work, so the input
  DMA overlaps the matrix unit.

Weight and input values do not change timing, so the generated data are zeros; the
programs are for cycle counts (profile, sweep), not for checking arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .layers import FC, App, Conv, Pool, Tensor, Vector

FN_FLAG = {"relu": "R", "sigmoid": "Q", "tanh": "T", "none": ""}
HOST_CHUNK_ROWS = 256        # input DMA granule between layers' work


class CodegenError(ValueError):
    """The app does not fit this machine shape (reported as a skipped point)."""


@dataclass
class Generated:
    source: str
    host_rows: int
    weight_tiles: int
    instructions: int


@dataclass
class _Region:
    base: int
    rows: int


class _Allocator:
    """First-fit rows of one memory."""

    def __init__(self, size: int, what: str):
        self.size, self.what = size, what
        self.free = [(0, size)]

    def take(self, rows: int, name: str) -> int:
        for i, (start, length) in enumerate(self.free):
            if length >= rows:
                self.free[i] = (start + rows, length - rows)
                return start
        raise CodegenError(f"{name}: {rows:,} {self.what} rows do not fit "
                           f"({self.size:,} rows, fragmented or full)")

    def give(self, start: int, rows: int) -> None:
        self.free.append((start, rows))
        self.free.sort()
        merged = []
        for s, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self.free = merged


def generate(app: App, array_size: int = 256, ub_rows: int = 98304, acc_rows: int = 4096,
             fifo_depth: int = 4) -> Generated:
    return _Gen(app, array_size, ub_rows, acc_rows, fifo_depth).run()


class _Gen:
    def __init__(self, app, n, ub_rows, acc_rows, fifo_depth):
        self.app, self.n, self.b = app, n, app.batch
        self.acc_rows, self.fifo = acc_rows, fifo_depth
        if 2 * self.b > acc_rows:
            raise CodegenError(f"{app.name}: batch {self.b} needs {2 * self.b} accumulator "
                               f"rows for double buffering, the machine has {acc_rows}")
        self.ub = _Allocator(ub_rows, "UB")
        self.items: list = []             # str, or (mmc text, tiles it switches)
        self.regs: dict[str, int] = {}
        self.tiles = 0                    # weight tiles in consumption order
        self.slot = 0                     # round-robin accumulator blocks of B rows
        self.half = 0                     # conv: which half of the accumulators
        self.region: dict[str, _Region] = {}
        self.acc_home: dict[str, list[int]] = {}   # tensor -> acc base of each chunk
        self.margin = self._margins()
        self.host_rows = 0
        self.host_of: dict[str, int] = {}
        self.pending: list[tuple[str, int, int]] = []   # (tensor, first row, rows)
        self.fused: set[str] = set()      # pools done inside their convolution's Activate
        self.last_use = self._last_uses()

    # -- layout ------------------------------------------------------------------------
    def _margins(self) -> dict[str, int]:
        m = {name: 0 for name in self.app.tensors}
        for layer in self.app.layers:
            if isinstance(layer, Conv):
                m[layer.input] = max(m[layer.input], layer.kernel // 2)
        return m

    def _last_uses(self) -> dict[str, int]:
        last = {}
        for i, layer in enumerate(self.app.layers):
            for name in _inputs(layer):
                last[name] = i
        for name in self.app.outputs:
            last[name] = len(self.app.layers)
        return last

    def chunks(self, t: Tensor) -> int:
        return math.ceil(t.channels / self.n)

    def pitch(self, t: Tensor) -> int:
        return t.width + 2 * self.margin[t.name]

    def image_rows(self, t: Tensor) -> int:
        m = self.margin[t.name]
        return (t.height + 2 * m) * (t.width + 2 * m)

    def rows(self, t: Tensor) -> int:
        if t.is_image and not self._vector_layout(t):
            return self.chunks(t) * self.b * self.image_rows(t)
        return self.chunks(t) * t.pixels * self.b

    def _vector_layout(self, t: Tensor) -> bool:
        """Images that only FC layers read are kept as vectors: chunk (pixel, channel
        chunk) = B rows (the pool writes them image-major; the host transposes)."""
        readers = [layer for layer in self.app.layers if t.name in _inputs(layer)]
        return bool(readers) and all(isinstance(layer, FC) for layer in readers)

    def alloc(self, name: str) -> _Region:
        if name not in self.region:
            t = self.app.t(name)
            rows = self.rows(t)
            self.region[name] = _Region(self.ub.take(rows, name), rows)
        return self.region[name]

    def release_after(self, index: int) -> None:
        for name, last in self.last_use.items():
            if last == index and name in self.region:
                r = self.region.pop(name)
                self.ub.give(r.base, r.rows)

    # -- emission ----------------------------------------------------------------------
    def emit(self, text: str) -> None:
        self.items.append(text)

    def cfg(self, reg: str, value: int) -> None:
        if self.regs.get(reg) != value:
            self.regs[reg] = value
            self.emit(f"CFG {reg}, {value}")

    def mmc(self, flags: str, ub: int, acc: int, length: str, switches: int, repeat: int = 1):
        rep = f", repeat={repeat}" if repeat > 1 else ""
        dot = "." if flags else ""
        self.items.append((f"MMC{dot}{flags} {ub}, {acc}, {length}{rep}", switches))
        self.tiles += switches

    def next_slot(self) -> int:
        slots = self.acc_rows // self.b
        base = (self.slot % slots) * self.b
        self.slot += 1
        return base

    # -- host traffic ------------------------------------------------------------------
    def plan_inputs(self) -> None:
        """Host rows for every input now; UB rows when its first chunk is loaded."""
        first = {}
        for i, layer in enumerate(self.app.layers):
            for name in _inputs(layer):
                first.setdefault(name, i)
        for name in sorted(self.app.inputs, key=lambda n: first.get(n, 0)):
            rows = self.rows(self.app.t(name))
            self.host_of[name] = self.host_rows
            for start in range(0, rows, HOST_CHUNK_ROWS):
                self.pending.append((name, start, min(HOST_CHUNK_ROWS, rows - start)))
            self.host_rows += rows

    def load(self, item) -> None:
        name, start, rows = item
        base = self.alloc(name).base
        self.emit(f"RHM {self.host_of[name] + start}, {base + start}, {rows}")

    def need(self, names) -> None:
        """Load what is still pending of these inputs (all of it, now)."""
        names = set(names)
        for item in [p for p in self.pending if p[0] in names]:
            self.load(item)
        self.pending = [p for p in self.pending if p[0] not in names]

    def trickle(self) -> None:
        """One pending input chunk, between units of matrix work."""
        if self.pending:
            self.load(self.pending.pop(0))

    # -- layers ------------------------------------------------------------------------
    def run(self) -> Generated:
        self.plan_inputs()
        layers = self.app.layers
        for i, layer in enumerate(layers):
            self.need(_inputs(layer))
            if isinstance(layer, FC):
                self.fc(layer)
            elif isinstance(layer, Conv):
                nxt = layers[i + 1] if i + 1 < len(layers) else None
                pool = nxt if isinstance(nxt, Pool) and nxt.input == layer.output else None
                if pool is not None and self.last_use.get(layer.output) != i + 1:
                    pool = None
                self.conv(layer, pool)
                if pool is not None:
                    self.fused.add(pool.name)
            elif isinstance(layer, Vector):
                self.vector(layer)
            elif isinstance(layer, Pool):
                if layer.name not in self.fused:
                    raise CodegenError(f"{self.app.name}: pool {layer.name} must follow the "
                                       "convolution it pools")
            self.release_after(i)
        for name in self.app.outputs:
            r = self.region[name]
            self.emit(f"WHM {r.base}, {self.host_rows}, {r.rows}")
            self.host_rows += r.rows
        return self.finish()

    def fc(self, layer: FC) -> None:
        n, b = self.n, self.b
        out = self.app.t(layer.output)
        dst = self.alloc(layer.output)
        runs = []                          # (ub base of first chunk, chunks) per input
        for name in layer.inputs:
            t = self.app.t(name)
            runs.append((self.region[name].base, self.chunks(t) * t.pixels))
        self.cfg("rep_ub_stride", b)
        self.cfg("rep_acc_stride", 0)
        homes = []
        for block in range(self.chunks(out)):
            acc = self.next_slot()
            first = True
            for base, count in runs:
                for k in range(0, count, self.fifo):
                    step = min(self.fifo, count - k)
                    self.mmc("SO" if first else "S", base + k * b, acc, str(b), step, step)
                    first = False
            self.emit(f"ACT{_fn(layer.fn)} {acc}, {dst.base + block * b}, {b}")
            homes.append(acc)
            self.trickle()
        self.acc_home[layer.output] = homes

    def vector(self, layer: Vector) -> None:
        b = self.b
        out = self.app.t(layer.output)
        dst = self.alloc(layer.output)
        source = max((x for x in layer.inputs if x in self.acc_home),
                     key=lambda x: list(self.acc_home).index(x), default=None)
        if source is None:
            raise CodegenError(f"{layer.name}: no input computed on the chip")
        homes = self.acc_home[source]
        for block in range(self.chunks(out)):
            acc = homes[block % len(homes)]
            self.emit(f"ACT{_fn(layer.fn)} {acc}, {dst.base + block * b}, {b}")
        self.acc_home[layer.output] = homes

    def conv(self, layer: Conv, pool: Pool | None) -> None:
        n = self.n
        x, y = self.app.t(layer.input), self.app.t(layer.output)
        src = self.region[layer.input]
        target = pool.output if pool is not None else layer.output
        t_out = self.app.t(target)
        dst = self.alloc(target)
        pixels = y.pixels
        half = self.acc_rows // 2
        if pixels > half:
            raise CodegenError(f"{layer.name}: one image's {pixels} output pixels exceed "
                               f"half the accumulators ({half} rows)")
        group = max(1, half // pixels)
        ct, ot = self.chunks(x), self.chunks(y)
        pitch, m_in, p = self.pitch(x), self.margin[layer.input], layer.kernel // 2
        img_in = self.image_rows(x)
        plane_in = self.b * img_in
        self.cfg("conv_pitch", pitch)
        self.cfg("conv_kw", 1)
        self.cfg("conv_stride", 1)
        k = pool.size if pool is not None else 1
        host_transpose = pool is not None and self._vector_layout(t_out)
        for g0 in range(0, self.b, group):
            images = range(g0, min(self.b, g0 + group))
            for o in range(ot):
                acc0 = (self.half % 2) * half
                self.half += 1
                first = True
                for dy in range(layer.kernel):
                    for dx in range(layer.kernel):
                        off = (dy + m_in - p) * pitch + (dx + m_in - p)
                        for c in range(ct):
                            for j, im in enumerate(images):
                                flags = "C" + ("S" if j == 0 else "") + ("O" if first else "")
                                self.mmc(flags, src.base + c * plane_in + im * img_in + off,
                                         acc0 + j * pixels, f"{y.height}, {y.width}",
                                         1 if j == 0 else 0)
                            first = False
                for j, im in enumerate(images):
                    self.activate_image(layer, acc0 + j * pixels, y, t_out, dst, o, im, k,
                                        host_transpose)
                self.trickle()
        if host_transpose:
            self.transpose(target, dst)

    def activate_image(self, layer, acc, y: Tensor, t_out: Tensor, dst: _Region, o: int,
                       im: int, k: int, compact: bool) -> None:
        """Write one image's output channel chunk o: padded for a convolution, compact
        (image-major, pixel by pixel) when it goes to FC layers through the host."""
        flags = FN_FLAG[layer.fn] + ("M" if k > 1 else "")
        fn = f".{flags}" if flags else ""
        if compact:
            per_image = self.chunks(t_out) * t_out.pixels
            ub, pitch_out = dst.base + im * per_image + o * t_out.pixels, t_out.width
        else:
            m = self.margin[t_out.name]
            pitch_out = self.pitch(t_out)
            ub = (dst.base + o * self.b * self.image_rows(t_out) + im * self.image_rows(t_out)
                  + m * pitch_out + m)
        self.cfg("rep_acc_stride", k * y.width)
        self.cfg("rep_ub_stride", pitch_out)
        if k > 1:
            self.cfg("pool_size", k)
            self.cfg("pool_width", y.width)
            self.emit(f"ACT{fn} {acc}, {ub}, {k * y.width}, repeat={y.height // k}")
        else:
            self.emit(f"ACT{fn} {acc}, {ub}, {y.width}, repeat={y.height}")

    def transpose(self, name: str, dst: _Region) -> None:
        """Image-major rows -> vector layout, through host memory (strided Alternate read)."""
        per_image = dst.rows // self.b
        host = self.host_rows
        self.host_rows += dst.rows
        self.emit(f"WHM {dst.base}, {host}, {dst.rows}")
        self.cfg("dma_host_stride", per_image)
        self.cfg("dma_ub_stride", 1)
        self.cfg("rep_host_stride", 1)
        self.cfg("rep_ub_stride", self.b)
        for c0 in range(0, per_image, 256):
            reps = min(256, per_image - c0)
            self.emit(f"RHMA {host + c0}, {dst.base + c0 * self.b}, {self.b}, repeat={reps}")

    # -- weights -----------------------------------------------------------------------
    def finish(self) -> Generated:
        """Insert the Read_Weights: `ahead` tiles requested beyond the switches so far."""
        ahead = self.fifo + 1
        total = self.tiles
        out = [f"; {self.app.name}: generated by tpuasm.apps.codegen for a {self.n} x {self.n} "
               f"array, batch {self.b}", f".config array_size={self.n}, ub_rows={self.ub.size}, acc_rows={self.acc_rows}, "
               f"fifo_depth={self.fifo}"]
        requested = consumed = 0

        def request(upto):
            nonlocal requested
            upto = min(upto, total)
            while requested < upto:
                count = min(256, upto - requested)
                rep = f", repeat={count}" if count > 1 else ""
                out.append(f"RW {requested}{rep}")
                requested += count

        request(ahead)
        count = 0
        for item in self.items:
            if isinstance(item, tuple):
                text, switches = item
                request(consumed + switches)
                out.append(text)
                count += 1
                consumed += switches
                if switches:
                    request(consumed + ahead)
            else:
                out.append(item)
                count += 1
        out.append("HLT")
        source = "\n".join(out) + "\n"
        return Generated(source, max(self.host_rows, 1), max(total, 1), len(out) - 2)


def _inputs(layer) -> tuple[str, ...]:
    if isinstance(layer, (FC, Vector)):
        return layer.inputs
    return (layer.input,)


def _fn(fn: str) -> str:
    flag = FN_FLAG[fn]
    return f".{flag}" if flag else ""

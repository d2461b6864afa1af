"""The compiler's intermediate form: the seam between the front end and the back end.

The front end (ONNX -> graph -> quantization -> partition) produces `Segment`s: runs of
quantized operators the TPU executes, separated by host operators.  The back end
(`tpuasm.compiler.codegen`) turns one `Segment` and a batch size into a `SegmentProgram`:
ordinary `.tasm` source, a weight image and the host-memory layout of its inputs and outputs.

Conventions (the same as ONNX's QLinear operators and onnxruntime's QDQ kernels):
- A quantized tensor holds integers q with real value `(q - zero_point) * scale`, per tensor:
  8-bit (int8 / uint8), or int16 (`QParams.bits` = 16, the TPU v1's 16-bit activations: a
  vector is two UB rows, low bytes then high bytes; the Dense / Conv / Pool reading it uses
  MatrixMultiply's H flag at half rate, its producer Activate's act_out = 2).  Lookup and
  Elementwise read and write 8-bit tensors only (the L table maps bytes; VADD/VMUL are 8-bit).
- Weights are int8, symmetric (zero point 0), with one scale per output channel; or int16
  (`weight.dtype` int16, `wide_weights`: the TPU v1's 16-bit weights, MatrixMultiply's D
  flag: each weight tile is a pair, its low bytes then its high bytes; x2 the multiply
  time, x4 with an int16 input).
- A bias is int32 in units of `input.scale * weight_scale[n]`.
- Shapes are per sample, without the batch dimension: `(K,)` for vectors, `(C, H, W)` for
  images (ONNX's NCHW order; how the back end lays them out in memory is its own business).
  A 1-D signal (C, L) is the image (C, L, 1) (a pixel per row).  A tensor whose ONNX layout is channels-last,
  `(*rows, C)` per sample (the activations of a MatMul over rank 3 and up: every leading
  dimension is a row), is the image (C, rows, 1) with `channels_last` set: the runtime
  converts at a segment's boundary (`ir_array` / `onnx_array`), and a Dense applied to each
  row is a 1x1 Conv over it.

Semantics every back end must reproduce (`reference.py` evaluates them in numpy; the
tolerance against them is one unit in the last place, on rounding ties only):

Dense and Conv, for each output element n:
    acc  = sum_k (x_q[k] - x.zero_point) * w[k, n]  (+ bias[n])       exact, int32
    real = acc * x.scale * weight_scale[n]
    y_q  = clamp(round_half_even(real / y.scale) + y.zero_point, lo, hi)
where [lo, hi] is the output type's range narrowed by the activation: "relu" lo >= the
quantized 0, "clip" the quantized bounds (round_half_even(bound / y.scale) + zero_point).
Convolution pads with real zeros (quantized: x.zero_point), as ONNX does.  A grouped
convolution (`groups` = G) sums output channel o over input channels of its group only,
g(o) * C/G .. (g(o) + 1) * C/G - 1, with g(o) = o // (O/G); its weight is (O, C/G, kh, kw).

Pool: max pooling on the quantized values (input and output share quantization); average
pooling as onnxruntime's QLinearAveragePool:
    y_q = clamp(round_half_even(mean(x_q - x.zero_point) * x.scale / y.scale) + y.zero_point)
with the mean over the window's elements inside the image unless `count_include_pad`.

Lookup: y_q = table[x_q] element-wise (table indexed by the input's integer value: for int8
inputs, `table[(x_q + 256) % 256]`).  The front end fills the table exactly as onnxruntime's
quantized sigmoid / tanh do, so the back end needs no floating point.

Elementwise (two inputs a, b of one shape, or one input a and a per-channel constant b;
every other operator reads one tensor: passes that walk the dataflow use `op.inputs`, a
tuple):
    add: real = a.dequantize(a_q) + b.dequantize(b_q)      (float32, as onnxruntime)
    sub: real = a.dequantize(a_q) - b.dequantize(b_q)      (b - a when `reverse`)
    mul: real = a.dequantize(a_q) * b.dequantize(b_q)
    y_q  = clamp(round_half_even(real / y.scale) + y.zero_point, lo, hi)
with [lo, hi] as for Dense (a fused Relu / Clip).  The chip computes the exact real value with
31-bit multipliers (VADD / VMUL, spec/isa.md 5.11): one unit apart on near-ties only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class QParams:
    """Per-tensor quantization: real = (q - zero_point) * scale."""
    scale: float
    zero_point: int
    signed: bool                      # int8 when True, uint8 when False
    bits: int = 8                     # 16: int16 (signed), two UB rows per vector (MMC H,
    #                                   Activate act_out = 2)

    @property
    def wide(self) -> bool:
        return self.bits == 16

    @property
    def qmin(self) -> int:
        if self.wide:
            return -32768 if self.signed else 0
        return -128 if self.signed else 0

    @property
    def qmax(self) -> int:
        if self.wide:
            return 32767 if self.signed else 65535
        return 127 if self.signed else 255

    @property
    def dtype(self) -> np.dtype:
        if self.wide:
            return np.dtype(np.int16 if self.signed else np.uint16)
        return np.dtype(np.int8 if self.signed else np.uint8)

    @property
    def type_name(self) -> str:
        return self.dtype.name

    def quantize(self, real: np.ndarray) -> np.ndarray:
        q = np.rint(np.asarray(real, np.float32) / np.float32(self.scale)) + self.zero_point
        return np.clip(q, self.qmin, self.qmax).astype(self.dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return ((np.asarray(q, np.int32) - self.zero_point) * np.float32(self.scale)
                ).astype(np.float32)


@dataclass(frozen=True)
class Tensor:
    """A quantized activation tensor of the graph (one sample's shape)."""
    name: str
    shape: tuple[int, ...]            # (K,) or (C, H, W)
    quant: QParams
    channels_last: bool = False       # ONNX holds it as (*rows, C): shape is (C, rows, 1)


def ir_array(t: Tensor, x: np.ndarray, batch: int) -> np.ndarray:
    """A batch of tensor `t` in its ONNX layout -> (batch, *t.shape)."""
    x = np.asarray(x)
    if t.channels_last:
        rows = x.reshape(batch, -1, t.shape[0])
        return np.ascontiguousarray(rows.transpose(0, 2, 1)).reshape((batch,) + t.shape)
    return x.reshape((batch,) + tuple(t.shape))


def onnx_array(t: Tensor, y: np.ndarray, batch: int, onnx_shape) -> np.ndarray:
    """(batch, *t.shape) -> the same values in the ONNX layout (batch, *onnx_shape)."""
    y = np.asarray(y)
    if t.channels_last:
        y = np.ascontiguousarray(y.reshape(batch, t.shape[0], -1).transpose(0, 2, 1))
    return y.reshape((batch,) + tuple(onnx_shape))


@dataclass(frozen=True)
class Activation:
    kind: str = "none"                # "none" | "relu" | "clip"
    lo: float | None = None           # "clip": real bounds (ReLU6 is 0, 6)
    hi: float | None = None


class _OneInput:
    """An operator that reads one tensor (`input`); `inputs` is what every pass that walks
    a segment's dataflow uses (an Elementwise reads two)."""

    @property
    def inputs(self) -> tuple:
        return (self.input,)


class _Weighted(_OneInput):
    """A matrix operator: its `weight` int8, or int16 (`wide_weights`)."""

    @property
    def wide_weights(self) -> bool:
        return np.asarray(self.weight).dtype == np.int16


@dataclass
class Dense(_Weighted):
    """y = x @ weight (+ bias): x (K,), y (N,)."""
    name: str                         # the ONNX node it came from (first of a fused group)
    input: Tensor
    output: Tensor
    weight: np.ndarray                # (K, N) int8 or int16
    weight_scale: np.ndarray          # (N,) float32
    bias: np.ndarray | None = None    # (N,) int32
    activation: Activation = field(default_factory=Activation)
    nodes: tuple[str, ...] = ()       # every ONNX node fused into this operator


@dataclass
class Conv(_Weighted):
    """2-D convolution, dilation 1: x (C, H, W) -> y (O, Ho, Wo)."""
    name: str
    input: Tensor
    output: Tensor
    weight: np.ndarray                # (O, C / groups, kh, kw) int8 or int16
    weight_scale: np.ndarray          # (O,) float32
    bias: np.ndarray | None = None    # (O,) int32
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)   # top, left, bottom, right (ONNX order
    #                                                   is begin_h, begin_w, end_h, end_w)
    activation: Activation = field(default_factory=Activation)
    nodes: tuple[str, ...] = ()
    groups: int = 1                   # grouped / depthwise (groups = C) convolution


@dataclass
class Pool(_OneInput):
    """Max or average pooling of an image x (C, H, W); global pooling is kernel = (H, W)."""
    name: str
    input: Tensor
    output: Tensor
    kind: str                         # "max" | "avg"
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    count_include_pad: bool = False
    nodes: tuple[str, ...] = ()


@dataclass
class Lookup(_OneInput):
    """Element-wise y = table[x] (quantized sigmoid, tanh, ...); shape unchanged.  An int16
    input is first requantized to `index` (8-bit: onnxruntime's `convert`, the dequantized
    value quantized again), the byte the table reads: a VADD with X on the TPU."""
    name: str
    input: Tensor
    output: Tensor
    table: np.ndarray                 # (256,) of the output's integer type
    function: str = ""                # "sigmoid", "tanh", ... (for reports and comments)
    nodes: tuple[str, ...] = ()
    index: QParams | None = None      # an int16 input's 8-bit requantization


@dataclass
class Elementwise:
    """y = a + b, a - b or a * b element by element (onnxruntime's QLinearAdd / QLinearMul,
    and DequantizeLinear -> Sub -> QuantizeLinear): two tensors of the same shape and
    layout, each with its own quantization, the output with its own; an optional fused
    Relu / Clip (`activation`) clamps the result.

    `b` may also hold one channel of a's pixels (`spreads_b`: (1, H, W), (1,)), spread over
    every channel, or one pixel of a's channels per sample ((C,), (C, 1, 1): a squeeze-and-
    excitation gate, a per-channel scale computed per sample), broadcast over a's pixels
    (`broadcasts_b`).

    Or one tensor `a` and a constant b (`b` None): `constant` holds b's integers, one per
    channel of `a` (a scalar repeated), quantized as `constant_quant`, broadcast over every
    pixel / row of every sample (the B flag's constant UB row).  `reverse` (sub only):
    y = b - a (GRU's 1 - z)."""
    name: str
    a: Tensor
    b: Tensor | None
    output: Tensor
    op: str = "add"                   # "add" | "sub" | "mul"
    activation: Activation = field(default_factory=Activation)
    nodes: tuple[str, ...] = ()
    constant: np.ndarray | None = None       # (C,) integers of b when b is a constant
    constant_quant: QParams | None = None    # their quantization (any zero point)
    reverse: bool = False                    # sub: b - a

    @property
    def inputs(self) -> tuple:
        return (self.a,) if self.b is None else (self.a, self.b)

    @property
    def broadcasts_b(self) -> bool:
        """b is one pixel per sample, read for every pixel of a."""
        return self.b is not None and tuple(self.b.shape) != tuple(self.a.shape) and \
            not self.spreads_b

    @property
    def spreads_b(self) -> bool:
        """b is one channel of a's pixels ((1, H, W) against (C, H, W), (1,) against (C,)),
        spread over every channel."""
        return self.b is not None and len(self.a.shape) == len(self.b.shape) and \
            self.b.shape[0] == 1 != self.a.shape[0] and \
            tuple(self.b.shape[1:]) == tuple(self.a.shape[1:])

    def constant_real(self) -> np.ndarray:
        """b's real values per channel (float32, as DequantizeLinear computes them)."""
        q = self.constant_quant
        return ((np.asarray(self.constant, np.int32) - q.zero_point) * np.float32(q.scale)
                ).astype(np.float32)


Operator = Dense | Conv | Pool | Lookup | Elementwise


@dataclass
class Segment:
    """A run of TPU operators in execution order.  `inputs` come from the host (quantized
    by the runtime), `outputs` go back to it; every other tensor lives only on the chip.

    Its program works on rows: the leading dimension of the ONNX tensors it reads and
    writes (a Conv's N, a Gemm's M; the shapes above are one row's).  `rows` None: that
    dimension is the model's batch, so the program is built for the batch and its rows
    grow with it; an int: the tensors' leading dimension is not the batch (a sequence
    model run whole over its 64 frames, a Reshape (1, T*F) -> (T, F)) and the program is
    built for that many rows, fixed, whatever the batch."""
    name: str
    operators: list[Operator]
    inputs: list[Tensor]
    outputs: list[Tensor]
    rows: int | None = None

    def program_rows(self, batch: int) -> int:
        """The rows one run of the segment's program takes when the model's batch is
        `batch`."""
        return batch if self.rows is None else self.rows


@dataclass
class HostLayout:
    """Where one input or output tensor of a segment lives in host memory, and how a batch of
    samples maps onto host rows.  Built by the back end, used by the runtime through
    `SegmentProgram.pack` / `unpack`."""
    tensor: Tensor
    base: int                         # first host row
    rows: int                         # host rows the whole batch occupies
    layout: str                       # the back end's words, for manifests and reports


@dataclass
class SegmentProgram:
    """What the back end produces for one segment at one batch size (its rows:
    Segment.program_rows)."""
    segment: Segment
    batch: int
    source: str                       # .tasm text (assembles with tpuasm.assemble)
    weights: np.ndarray               # (tiles, N, N) int8 weight image
    host_rows: int                    # size of the host image
    host_constants: dict[int, np.ndarray]   # host row -> rows of constant data to preload
    inputs: dict[str, HostLayout]
    outputs: dict[str, HostLayout]
    array_size: int = 256

    def host_image(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The host image for one batch: constants plus each input (batch, *shape) packed."""
        raise NotImplementedError("provided by the back end's SegmentProgram")

    def read_outputs(self, host: np.ndarray) -> dict[str, np.ndarray]:
        """Each output (batch, *shape) unpacked from the host image after the run."""
        raise NotImplementedError("provided by the back end's SegmentProgram")

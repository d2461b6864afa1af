"""The back end (tpuasm.compiler.codegen): generated programs assembled, run on the emulator
and compared with the IR's numpy semantics (tpuasm.compiler.reference, onnxruntime's
arithmetic).  Equal except on requantization near-ties, by at most one unit: the machine
multiplies exactly in integers, onnxruntime rounds a float32 product first.

Shapes are random and deliberately awkward (K, N and channels not multiples of the array,
batches larger than an accumulator half), on small arrays so that runs stay fast."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.assembler import assemble
from tpuasm.compiler import reference
from tpuasm.compiler.codegen import CodegenError, generate
from tpuasm.compiler.ir import (Activation, Conv, Dense, Lookup, Pool, QParams, Segment,
                                Tensor)
from tpuasm.machine import Machine

MAX_CYCLES = 50_000_000


# ----------------------------------------------------------------------------- builders

def qparams(rng, signed=None) -> QParams:
    signed = bool(rng.integers(0, 2)) if signed is None else signed
    zero = int(rng.integers(-20, 20)) if signed else int(rng.integers(0, 60))
    return QParams(float(rng.uniform(0.02, 0.08)), zero, signed)


def dense(rng, name, x: Tensor, n_out: int, activation=None, signed_out=None) -> Dense:
    k = int(np.prod(x.shape))
    out = Tensor(name + "_y", (n_out,), qparams(rng, signed_out))
    act = activation or Activation(str(rng.choice(["none", "relu"])))
    return Dense(name, x, out, rng.integers(-127, 128, (k, n_out)).astype(np.int8),
                 rng.uniform(0.002, 0.01, n_out).astype(np.float32),
                 rng.integers(-3000, 3000, n_out).astype(np.int32), act, (name,))


def conv(rng, name, x: Tensor, out_ch: int, kernel: int, stride: int, pad: int,
         activation=None) -> Conv:
    c, h, w = x.shape
    ho = (h + 2 * pad - kernel) // stride + 1
    wo = (w + 2 * pad - kernel) // stride + 1
    out = Tensor(name + "_y", (out_ch, ho, wo), qparams(rng))
    return Conv(name, x, out, rng.integers(-127, 128, (out_ch, c, kernel, kernel)).astype(np.int8),
                rng.uniform(0.001, 0.006, out_ch).astype(np.float32),
                rng.integers(-2000, 2000, out_ch).astype(np.int32), (stride, stride),
                (pad, pad, pad, pad), activation or Activation("relu"), (name,))


def pool(rng, name, x: Tensor, kind, kernel, stride, pad=0, count_include_pad=False,
         out_quant=None) -> Pool:
    c, h, w = x.shape
    ho = (h + 2 * pad - kernel) // stride + 1
    wo = (w + 2 * pad - kernel) // stride + 1
    q = x.quant if kind == "max" else (out_quant or qparams(rng, x.quant.signed))
    return Pool(name, x, Tensor(name + "_y", (c, ho, wo), q), kind, (kernel, kernel),
                (stride, stride), (pad, pad, pad, pad), count_include_pad, (name,))


def lookup(rng, name, x: Tensor) -> Lookup:
    out_q = qparams(rng)
    info = np.iinfo(np.int8 if out_q.signed else np.uint8)
    table = rng.integers(info.min, info.max + 1, 256).astype(info.dtype)
    return Lookup(name, x, Tensor(name + "_y", x.shape, out_q), table, "random", (name,))


def random_input(rng, t: Tensor, batch: int) -> np.ndarray:
    info = np.iinfo(np.int8 if t.quant.signed else np.uint8)
    return rng.integers(info.min, info.max + 1, (batch, *t.shape)).astype(info.dtype)


def run(segment: Segment, batch: int, rng, inputs=random_input, **machine):
    """(emulator outputs, reference outputs, program, machine) for random inputs (made by
    `inputs(rng, tensor, batch)`)."""
    program = generate(segment, batch, **machine)
    inputs = {t.name: inputs(rng, t, batch) for t in segment.inputs}
    binary = assemble(program.source)
    m = Machine.for_program(binary)
    m.load(binary, host=program.host_image(inputs), weights=program.weights)
    r = m.run(max_cycles=MAX_CYCLES)
    assert r.status == "halted", (r, str(r.fault))
    return program.read_outputs(m.host), reference.run_segment(segment, inputs), program, m


def assert_close(ours: dict, theirs: dict):
    for name, want in theirs.items():
        got = ours[name]
        assert got.shape == want.shape and got.dtype == want.dtype, (name, got.shape, want.shape)
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        assert diff.max(initial=0) <= 1, f"{name}: {int((diff > 1).sum())} elements off by > 1"
        assert (diff == 0).mean() >= 0.99, f"{name}: only {(diff == 0).mean():.4f} identical"


def seg(ops, inputs=None, outputs=None) -> Segment:
    return Segment("seg", list(ops), inputs or [ops[0].input], outputs or [ops[-1].output])


SMALL = dict(array_size=8, acc_rows=64, ub_rows=4096)


# ----------------------------------------------------------------------------- operators

@pytest.mark.parametrize("seed", range(4))
def test_dense_random_shapes_and_batches_beyond_the_accumulators(seed):
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(3, 40)), int(rng.integers(3, 30))
    batch = int(rng.integers(20, 80))          # an accumulator half holds 32 rows
    x = Tensor("x", (k,), qparams(rng))
    act = [Activation("none"), Activation("relu"), Activation("clip", 0.0, 1.5)][seed % 3]
    op = dense(rng, "fc", x, n, act)
    ours, theirs, program, _ = run(seg([op]), batch, rng, **SMALL)
    assert program.passes == -(-batch // 32)
    assert_close(ours, theirs)


@pytest.mark.parametrize("seed", range(4))
def test_conv_random_kernels_strides_padding(seed):
    rng = np.random.default_rng(100 + seed)
    c, o = int(rng.integers(1, 20)), int(rng.integers(1, 20))
    kernel, stride = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    pad = int(rng.integers(0, kernel))
    h, w = int(rng.integers(kernel, 9)), int(rng.integers(kernel, 9))
    x = Tensor("x", (c, h, w), qparams(rng))
    op = conv(rng, "conv", x, o, kernel, stride, pad)
    ours, theirs, _, _ = run(seg([op]), int(rng.integers(1, 5)), rng, **SMALL)
    assert_close(ours, theirs)


@pytest.mark.parametrize("c, kernel, stride, pad, packed", [
    (2, 2, 1, 1, "all taps"),                 # 2 x 2 x 2 = 8 rows of an 8-wide array
    (1, 3, 2, 1, None),                        # 9 rows > 8, stride 2: no packing
    (2, 3, 1, 1, "kernel row"),               # a kernel row: 3 x 2 = 6 rows
    (3, 2, 2, 0, None)])                       # 12 > 8, stride 2
def test_first_convolution_packed_on_the_host(c, kernel, stride, pad, packed):
    # a segment input read by one convolution with few channels: its taps side by side in
    # each host row (im2col on the host), the convolution 1x1 or kh x 1 on the chip
    rng = np.random.default_rng(c * 100 + kernel * 10 + stride)
    x = Tensor("x", (c, 7, 6), qparams(rng))
    op = conv(rng, "conv", x, 5, kernel, stride, pad)
    ours, theirs, program, _ = run(seg([op]), 3, rng, **SMALL)
    assert_close(ours, theirs)
    how = program.inputs["x"].layout
    assert (packed is None and "packed" not in how) or \
        (packed is not None and "packed" in how and (packed == "all taps") == ("all" in how))
    taps = kernel * kernel
    tiles = {None: taps, "all taps": 1, "kernel row": kernel}[packed]
    assert program.weights.shape[0] == tiles


def test_packing_is_im2col():
    from tpuasm.compiler.codegen.pack import Packing
    x = np.arange(2 * 2 * 4 * 5).reshape(2, 2, 4, 5)
    p = Packing(3, 3, 2, (1, 1, 1, 1), (2, 3), zero_point=-1)
    got = p.apply(x)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-1)
    for dy in range(3):
        for dx in range(3):
            for ch in range(2):
                want = xp[:, ch, dy:dy + 3:2, dx:dx + 5:2]
                np.testing.assert_array_equal(got[:, (dy * 3 + dx) * 2 + ch], want)


def test_padding_written_on_the_chip_once_per_slot_and_layout():
    # four padded 3x3 convolutions in a row ping-pong between two UB slots of one layout:
    # the first two fill their padding (Activate, act_mult 0), the others find it in place;
    # the inputs' zero points differ per tensor, so the quantization decides (one zp here)
    rng = np.random.default_rng(5)
    q = QParams(0.05, 7, False)
    x = Tensor("x", (5, 6, 6), q)
    ops, t = [], x
    for i in range(4):
        op = conv(rng, f"c{i}", t, 5, 3, 1, 1)
        op = Conv(op.name, op.input, Tensor(op.output.name, op.output.shape, q), op.weight,
                  op.weight_scale, op.bias, op.strides, op.pads, op.activation, op.nodes)
        ops.append(op)
        t = op.output
    ours, theirs, program, _ = run(seg(ops), 3, rng, **SMALL)
    assert_close(ours, theirs)
    src = program.source
    assert src.count("already in place") >= 2
    assert "RHMA" not in src                      # no padding over PCIe


def test_conv_output_larger_than_an_accumulator_half_is_banded():
    rng = np.random.default_rng(7)
    x = Tensor("x", (5, 12, 11), qparams(rng))
    op = conv(rng, "conv", x, 9, 3, 1, 1)       # 12 x 11 = 132 output pixels > 32
    ours, theirs, _, _ = run(seg([op]), 2, rng, **SMALL)
    assert_close(ours, theirs)


@pytest.mark.parametrize("kind, kernel, stride, pad, include", [
    ("max", 2, 2, 0, False), ("max", 3, 2, 1, False), ("avg", 2, 2, 0, False),
    ("avg", 3, 2, 1, False), ("avg", 3, 1, 1, True), ("avg", 6, 1, 0, False)])
def test_pool_alone(kind, kernel, stride, pad, include):
    rng = np.random.default_rng(kernel * 10 + stride)
    x = Tensor("x", (11, 6, 6), qparams(rng))
    op = pool(rng, "pool", x, kind, kernel, stride, pad, include)
    ours, theirs, _, _ = run(seg([op]), 3, rng, **dict(SMALL, acc_rows=128))
    assert_close(ours, theirs)


def rect_pool(rng, name, x: Tensor, kind, kernel, stride, pads=(0, 0, 0, 0),
              count_include_pad=False) -> Pool:
    """A pool with a window, stride and padding per axis (pads: top, left, bottom, right)."""
    c, h, w = x.shape
    (kh, kw), (sh, sw), (t, l, b, r) = kernel, stride, pads
    ho, wo = (h + t + b - kh) // sh + 1, (w + l + r - kw) // sw + 1
    q = x.quant if kind == "max" else qparams(rng, x.quant.signed)
    return Pool(name, x, Tensor(name + "_y", (c, ho, wo), q), kind, tuple(kernel),
                tuple(stride), tuple(pads), count_include_pad, (name,))


RECTANGULAR = [
    ("max", (2, 1), (2, 1), (0, 0, 0, 0), False),          # a CRNN's height halving
    ("max", (2, 2), (2, 1), (0, 1, 0, 1), False),          # PaddleOCR's
    ("avg", (1, 3), (1, 1), (0, 1, 0, 1), False),
    ("avg", (1, 3), (1, 1), (0, 1, 0, 1), True),
    ("avg", (3, 2), (2, 1), (1, 0, 0, 1), False),
    ("max", (1, 3), (1, 2), (0, 1, 0, 0), False),
]


@pytest.mark.parametrize("kind, kernel, stride, pads, include", RECTANGULAR)
def test_rectangular_pool_alone(kind, kernel, stride, pads, include):
    rng = np.random.default_rng(sum(kernel) * 10 + sum(stride) + sum(pads))
    x = Tensor("x", (11, 6, 7), qparams(rng))
    op = rect_pool(rng, "pool", x, kind, kernel, stride, pads, include)
    ours, theirs, program, _ = run(seg([op]), 3, rng, **dict(SMALL, acc_rows=128))
    assert_close(ours, theirs)
    if kind == "max":
        np.testing.assert_array_equal(ours["pool_y"], theirs["pool_y"])
    if kernel[0] != kernel[1]:
        assert f"CFG pool_size_x, {kernel[1]}" in program.source


@pytest.mark.parametrize("kind, kernel, stride, pads, include", RECTANGULAR[:2])
def test_rectangular_max_pool_fused_into_a_conv(kind, kernel, stride, pads, include):
    rng = np.random.default_rng(5)
    x = Tensor("x", (3, 8, 7), qparams(rng))
    c1 = conv(rng, "conv1", x, 10, 3, 1, 1)
    p1 = rect_pool(rng, "pool1", c1.output, kind, kernel, stride, pads, include)
    c2 = conv(rng, "conv2", p1.output, 6, 3, 1, 1)
    ours, theirs, program, _ = run(seg([c1, p1, c2]), 2, rng, **dict(SMALL, acc_rows=256))
    assert_close(ours, theirs)
    assert "ACT.PM" in program.source and "identity" not in program.source


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_rectangular_pool_of_an_image_larger_than_a_half_is_banded(kind):
    # 63 pixels > 32 rows: bands of pooled rows, each with the columns' own padding
    rng = np.random.default_rng(32)
    x = Tensor("x", (4, 9, 7), qparams(rng))
    op = rect_pool(rng, "pool", x, kind, (2, 2), (2, 1), (0, 1, 0, 1))
    ours, theirs, program, _ = run(seg([op]), 2, rng, **SMALL)
    assert_close(ours, theirs)
    assert program.source.count("ACT.") > 2                    # several bands


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool_and_lookup_of_images_larger_than_an_accumulator_half_are_banded(kind):
    rng = np.random.default_rng(31)
    x = Tensor("x", (4, 9, 7), qparams(rng))         # 63 pixels > 32 rows
    op = pool(rng, "pool", x, kind, 3, 2)
    ours, theirs, _, _ = run(seg([op]), 2, rng, **SMALL)
    assert_close(ours, theirs)
    lk = lookup(rng, "lut", x)
    ours, theirs, _, _ = run(seg([lk]), 2, rng, **SMALL)
    assert_close(ours, theirs)


def test_lookup_alone_and_fused_into_dense():
    rng = np.random.default_rng(3)
    x = Tensor("x", (19,), qparams(rng))
    lk = lookup(rng, "sig", x)
    ours, theirs, program, _ = run(seg([lk]), 5, rng, **SMALL)
    assert_close(ours, theirs)
    fc = dense(rng, "fc", x, 12)
    lk2 = lookup(rng, "tanh", fc.output)
    ours, theirs, program, _ = run(seg([fc, lk2]), 5, rng, **SMALL)
    assert_close(ours, theirs)
    assert "ACT.PL" in program.source and "identity" not in program.source


def test_conv_relu_maxpool_fused_into_one_activate():
    rng = np.random.default_rng(11)
    x = Tensor("x", (3, 9, 9), qparams(rng))
    c1 = conv(rng, "conv1", x, 10, 3, 1, 1)
    p1 = pool(rng, "pool1", c1.output, "max", 3, 2, 1)
    ours, theirs, program, _ = run(seg([c1, p1]), 2, rng, **dict(SMALL, acc_rows=256))
    assert_close(ours, theirs)
    assert "ACT.PM" in program.source


def test_padded_pool_into_a_padded_conv_like_a_resnet_stem():
    # conv -> max pool 3x3 stride 2 pad 1 -> conv pad 1: the pooled image is written at the
    # next convolution's padded pitch (act_ub_pitch), one Activate per band of samples
    rng = np.random.default_rng(41)
    x = Tensor("x", (3, 10, 10), qparams(rng))
    c1 = conv(rng, "stem", x, 12, 3, 2, 1)                 # (12, 5, 5)
    p1 = pool(rng, "pool", c1.output, "max", 3, 2, 1)       # (12, 3, 3)
    c2 = conv(rng, "conv2", p1.output, 7, 3, 1, 1)
    for machine in (SMALL, dict(SMALL, acc_rows=256)):      # pool alone, then fused
        ours, theirs, program, _ = run(seg([c1, p1, c2]), 3, rng, **machine)
        assert_close(ours, theirs)
        assert "CFG act_ub_pitch, 5" in program.source      # 3 + 2 padding columns


def test_chain_conv_pool_conv_globalpool_dense_lookup():
    rng = np.random.default_rng(21)
    x = Tensor("image", (3, 10, 10), qparams(rng, signed=False))
    c1 = conv(rng, "conv1", x, 9, 3, 1, 1)
    p1 = pool(rng, "pool1", c1.output, "max", 2, 2)
    c2 = conv(rng, "conv2", p1.output, 13, 3, 2, 1)
    gp = pool(rng, "gap", c2.output, "avg", 3, 3)          # global average on 3 x 3
    fc = dense(rng, "fc", gp.output, 7)
    sg = lookup(rng, "sigmoid", fc.output)
    segment = seg([c1, p1, c2, gp, fc, sg])
    ours, theirs, program, _ = run(segment, 3, rng, **SMALL)
    assert_close(ours, theirs)
    # every operator is named in the source, and the assembler maps instructions to nodes
    binary = assemble(program.source)
    assert {"conv1", "conv2", "gap", "fc"} <= set(binary.nodes())


def test_flattened_image_into_dense():
    rng = np.random.default_rng(5)
    x = Tensor("x", (6, 3, 4), qparams(rng))
    c1 = conv(rng, "conv1", x, 11, 2, 1, 0)              # (11, 2, 3), flattened into fc
    fc = dense(rng, "fc", c1.output, 9)
    ours, theirs, program, _ = run(seg([c1, fc]), 4, rng, **SMALL)
    assert_close(ours, theirs)
    assert "MMC.CS" in program.source


def test_segment_with_two_outputs_and_reuse():
    rng = np.random.default_rng(8)
    x = Tensor("x", (30,), qparams(rng))
    a = dense(rng, "a", x, 25)
    b = dense(rng, "b", a.output, 20)
    c = dense(rng, "c", b.output, 17)
    segment = seg([a, b, c], outputs=[b.output, c.output])
    ours, theirs, program, _ = run(segment, 6, rng, **SMALL)
    assert_close(ours, theirs)
    # x's rows are reused once it is dead (act0 holds x, then c's output)
    assert any(len(line.split(";")[-1].split(",")) > 1 for line in program.source.splitlines()
               if line.startswith(".ub    act"))


def test_unsupported_shapes_name_the_node():
    rng = np.random.default_rng(1)
    x = Tensor("x", (3, 6, 6), qparams(rng))
    op = pool(rng, "odd", x, "max", 2, 2)
    op.kernel = (2, 3)
    with pytest.raises(CodegenError, match="odd"):
        generate(seg([op]), 2, **SMALL)


# ----------------------------------------------------------------------------- quality

def big_dense(rng, k, n):
    x = Tensor("x", (k,), qparams(rng, signed=True))
    return dense(rng, "fc", x, n, Activation("relu"))


def test_instruction_count_is_bounded_by_tiles_not_rows():
    rng = np.random.default_rng(0)
    op = big_dense(rng, 2048, 2048)               # 8 x 8 = 64 tiles of 256 x 256
    small = generate(seg([op]), 100)
    large = generate(seg([op]), 2000)
    tiles = len(small.weights)
    assert tiles == 64
    assert small.instructions == large.instructions      # rows never add instructions
    # per output block: 2 MMC + 2 RW (fifo 5 ahead) + ACT + its CFG; plus a small prologue
    assert small.instructions <= tiles // 2 + 4 * 8 + 20, small.instructions


def test_weight_fetches_overlap_the_matrix_unit_on_a_large_dense():
    # 16 tiles x 1,350 fetch cycles = 21,600 cycles of weights; 2,048 rows per tile keep the
    # array busy 32,768 cycles.  With the fetches requested 5 tiles ahead, the matrix unit
    # never waits for weights after the first tile (the host input, 8,192 rows at 16.7
    # cycles each, is a RAW wait before the first multiply and is not counted here).
    rng = np.random.default_rng(1)
    op = big_dense(rng, 1024, 1024)
    ours, theirs, program, m = run(seg([op]), 2048, rng)
    assert_close(ours, theirs)
    c = m.counters()
    assert c["array_active_cycles"] == 16 * 2048
    weights_wait = c["weight_stall_cycles"] + c["weight_shift_cycles"]
    share = c["array_active_cycles"] / (c["array_active_cycles"] + weights_wait)
    assert share >= 0.95, (share, c)
    # between the input's arrival and the last Activate (the host DMA on both sides is the
    # host link's time), the run takes little more than the multiplies themselves
    ins = m.program.instructions
    input_done = max(m.finish_cycle(i) for i, x in enumerate(ins) if x.key == "RHM")
    last_act = max(m.finish_cycle(i) for i, x in enumerate(ins) if x.key == "ACT")
    assert last_act - input_done <= 1.1 * c["array_active_cycles"] + 1500, \
        (last_act - input_done, c)

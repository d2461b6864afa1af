"""16-bit weights in the back end (MatrixMultiply's D flag, spec/isa.md 5.4): an operator
whose weights are int16 switches to a *pair* of FIFO tiles, its low bytes (unsigned) then
its high bytes (signed), and multiplies at half rate (a quarter with an int16 input too).
Generated programs run on the emulator and are compared with the IR's numpy semantics
(reference.py: exact integer sums, onnxruntime's float32 requantization); the weight image's
pairs are checked against a numpy model of the ISA's arithmetic, w = lo + 256 * hi."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from test_codegen import SMALL, assert_close, conv, dense, qparams, run, seg
from test_codegen_wide import random16, wide
from tpuasm.compiler.codegen import generate, weight_tiles
from tpuasm.compiler.ir import Activation, Tensor


def widened(rng, op, scale=1 / 256):
    """`op` with int16 weights over the whole int16 range (both extremes included) and
    weight scales `scale` times as fine, so its outputs stay in their range."""
    w = rng.integers(-32768, 32768, op.weight.shape).astype(np.int16)
    w.flat[0], w.flat[-1] = -32768, 32767
    return replace(op, weight=w, weight_scale=(op.weight_scale * scale).astype(np.float32))


def mmc_lines(source: str) -> list[str]:
    return [line.split(";")[0].strip() for line in source.splitlines()
            if line.strip().startswith("MMC")]


@pytest.mark.parametrize("seed", range(4))
def test_dense_with_int16_weights_on_8_bit_inputs(seed):
    """K and N beyond the 8-wide array, batches beyond an accumulator half: every MMC of the
    layer carries D, and its outputs are the reference's."""
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(9, 40)), int(rng.integers(3, 30))
    x = Tensor("x", (k,), qparams(rng))
    op = widened(rng, dense(rng, "fc", x, n, Activation(["none", "relu"][seed % 2])))
    ours, theirs, program, _ = run(seg([op]), int(rng.integers(20, 70)), rng, **SMALL)
    lines = mmc_lines(program.source)
    assert lines and all("D" in line.split()[0] for line in lines), lines
    assert_close(ours, theirs)
    assert (ours["fc_y"] == theirs["fc_y"]).mean() == 1.0     # float32 requantization


@pytest.mark.parametrize("seed", range(3))
def test_padded_strided_conv_with_int16_weights(seed):
    rng = np.random.default_rng(40 + seed)
    c, o = int(rng.integers(1, 14)), int(rng.integers(1, 14))
    kernel, stride = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    h, w = int(rng.integers(kernel, 9)), int(rng.integers(kernel, 9))
    x = Tensor("x", (c, h, w), qparams(rng))
    op = widened(rng, conv(rng, "conv", x, o, kernel, stride, int(rng.integers(0, kernel))))
    ours, theirs, program, _ = run(seg([op]), int(rng.integers(1, 5)), rng, **SMALL)
    assert all("D" in line.split()[0] for line in mmc_lines(program.source))
    assert_close(ours, theirs)


@pytest.mark.parametrize("groups", [3, 12])
def test_depthwise_and_grouped_conv_with_int16_weights(groups):
    """Block-diagonal tiles, all-zero ones skipped: each pair holds a block's two planes."""
    rng = np.random.default_rng(groups)
    c = 12
    x = Tensor("x", (c, 5, 6), qparams(rng))
    op = conv(rng, "dw", x, c, 3, 1, 1)
    op = widened(rng, replace(op, weight=op.weight[:, :c // groups], groups=groups))
    ours, theirs, program, _ = run(seg([op]), 3, rng, **SMALL)
    assert_close(ours, theirs)
    assert program.weights.shape[0] == weight_tiles(op, 8)


def test_int16_weights_and_int16_input_together():
    """H and D in one MatrixMultiply (16 x 16 bits, a quarter of the rate)."""
    rng = np.random.default_rng(11)
    x = Tensor("x", (21,), wide(rng))
    op = dense(rng, "fc", x, 13, Activation("none"))
    op = replace(widened(rng, op), weight=(rng.integers(-300, 300, (21, 13))).astype(np.int16),
                 weight_scale=(op.weight_scale * 0.05).astype(np.float32))
    ours, theirs, program, _ = run(seg([op]), 7, rng, inputs=random16, **SMALL)
    assert all(set("HD") <= set(line.split()[0]) for line in mmc_lines(program.source))
    assert_close(ours, theirs)


def test_weight_pairs_hold_the_low_then_the_high_bytes():
    """Tile 2q is the low plane (read unsigned), 2q + 1 the high plane (signed) of the 8-bit
    operator's tile q: lo + 256 * hi gives the int16 weights back, zeros beyond the matrix."""
    rng = np.random.default_rng(5)
    x = Tensor("x", (19,), qparams(rng))
    op = widened(rng, dense(rng, "fc", x, 11))
    narrow = replace(op, weight=np.zeros(op.weight.shape, np.int8))
    p16, p8 = generate(seg([op]), 4, **SMALL), generate(seg([narrow]), 4, **SMALL)
    assert len(p16.weights) == 2 * len(p8.weights) == weight_tiles(op, 8)
    lo = p16.weights[0::2].view(np.uint8).astype(np.int64)
    hi = p16.weights[1::2].astype(np.int64)
    tiles = lo + 256 * hi                                   # the ISA's int16 weights
    n = 8
    for q, tile in enumerate(tiles):                        # column block j, K chunk c
        j, chunk = divmod(q, -(-19 // n))
        block = op.weight[chunk * n:(chunk + 1) * n, j * n:(j + 1) * n]
        expect = np.zeros((n, n), np.int64)
        expect[:block.shape[0], :block.shape[1]] = block
        assert np.array_equal(tile, expect), q


def test_each_switch_takes_a_pair_and_a_small_fifo_takes_one_pair_per_multiply():
    """fifo_depth 1 leaves room for two fetched tiles: one pair per MMC (repeat 1), the
    Read_Weights two tiles at a time, and the program still runs and agrees."""
    rng = np.random.default_rng(9)
    x = Tensor("x", (40,), qparams(rng))
    op = widened(rng, dense(rng, "fc", x, 10))
    ours, theirs, program, _ = run(seg([op]), 9, rng, **dict(SMALL, fifo_depth=1))
    assert_close(ours, theirs)
    for line in mmc_lines(program.source):
        assert "repeat" not in line, line
    switches = sum(1 for line in mmc_lines(program.source) if "S" in line.split()[0])
    assert 2 * switches == len(program.weights) == 2 * 5 * 2   # 5 K chunks x 2 col blocks


@pytest.mark.parametrize("wide_input", [False, True])
def test_int16_weights_take_the_array_twice_as_long_and_four_times_with_int16_input(
        wide_input):
    """spec/timing.md 6: x2 with D, x4 with H and D: the array-active cycles of the same
    layer against its 8-bit form."""
    rng = np.random.default_rng(3)
    quant = wide(rng) if wide_input else qparams(rng)
    x = Tensor("x", (24,), quant)
    op = dense(rng, "fc", x, 16, Activation("none"))
    make = random16 if wide_input else None
    kwargs = {"inputs": make} if make else {}
    *_, m8 = run(seg([op]), 12, rng, **kwargs, **SMALL)
    op16 = replace(widened(rng, op), weight=rng.integers(-99, 99, op.weight.shape)
                   .astype(np.int16))
    *_, m16 = run(seg([op16]), 12, rng, **kwargs, **SMALL)
    base = m8.counters()["array_active_cycles"]
    assert m16.counters()["array_active_cycles"] == 2 * base
    if wide_input:
        narrow = replace(op, input=Tensor("x", (24,), qparams(rng)))
        *_, m_plain = run(seg([narrow]), 12, rng, **SMALL)
        assert m16.counters()["array_active_cycles"] == 4 * \
            m_plain.counters()["array_active_cycles"]


def test_d_flag_on_every_multiply_of_a_conv_that_reuses_its_tiles_per_sample():
    """A conv whose stacked samples would waste rows runs one MMC per sample and tap, the
    later samples without S: they keep D, or the machine faults (weight width mismatch)."""
    rng = np.random.default_rng(21)
    x = Tensor("x", (3, 6, 6), qparams(rng))
    op = widened(rng, conv(rng, "conv", x, 5, 3, 2, 0))
    ours, theirs, program, _ = run(seg([op]), 4, rng, **SMALL)
    lines = mmc_lines(program.source)
    assert any(re.match(r"MMC\.C[^S ]*D", line) for line in lines), lines   # no S, with D
    assert_close(ours, theirs)

"""The reference model against hand-computed results (spec/isa.md).

Every expected number is worked out in the comments next to it, from the spec's text,
not from running the model.  Machines are tiny (N = 4) so each test runs in milliseconds.
"""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.binary import MachineShape, Program
from tpuasm.encoding import Instruction
from tpuasm.isa import ISA_TABLE
from tpuasm.machine.reference import run_reference, wrap_int32

N = 4
SHAPE = MachineShape(array_size=N, ub_rows=32, acc_rows=16, fifo_depth=2)
BIG_FIFO = MachineShape(array_size=N, ub_rows=32, acc_rows=16, fifo_depth=8)


def I(key: str, flags: str = "", repeat: int = 1, **operands) -> Instruction:
    spec = ISA_TABLE.instructions[key]
    return Instruction(key, spec.flag_bits(flags), repeat, operands)


def CFG(name: str, value: int) -> Instruction:
    return I("CFG", reg=ISA_TABLE.registers[name].index, value=value)


def run(instructions, host=None, weights=None, shape=SHAPE):
    return run_reference(Program(list(instructions), shape), host, weights)


def rows(*values) -> np.ndarray:
    """Host image whose row r is values[r] (a scalar fills the row)."""
    return np.array([[v] * N if np.isscalar(v) else v for v in values], dtype=np.int64) \
        .astype(np.int8)


def numbered_host(count: int) -> np.ndarray:
    """Host row r = [10r, 10r+1, 10r+2, 10r+3] (distinct everywhere)."""
    return (np.arange(count)[:, None] * 10 + np.arange(N)[None, :]).astype(np.int8)


def ub_i8(result, start, stop):
    return result.ub[start:stop].view(np.int8).astype(int).tolist()


EYE = np.eye(N, dtype=np.int8)


def load_acc16(values, acc=0):
    """Instructions + host + weights that leave `values` (rows x N, int16 range) in ACC[acc..].

    Each value is stored as two host rows (low byte, high byte: the MMC.H layout) and multiplied
    by the identity tile with MMC.SOH: ACC[acc + v] = x[v] @ I = x[v]."""
    values = np.asarray(values, dtype=np.int64)
    u16 = values & 0xFFFF
    host = np.empty((2 * len(values), N), dtype=np.uint8)
    host[0::2] = u16 & 0xFF
    host[1::2] = u16 >> 8
    prog = [I("RHM", host=0, ub=16, length=2 * len(values)),
            I("RW", tile=0),
            I("MMC", "SOH", ub=16, acc=acc, length=len(values))]
    return prog, host, EYE[None]


# ---------------------------------------------------------------- host transfers
def test_rhm_copies_rows():
    r = run([I("RHM", host=1, ub=3, length=2)], numbered_host(4))
    assert ub_i8(r, 3, 5) == [[10, 11, 12, 13], [20, 21, 22, 23]]
    assert r.ub[:3].sum() == 0 and r.ub[5:].sum() == 0
    assert r.fault_kind is None


def test_rhm_repeat_negative_ub_stride():
    # iteration i: host 1+2i.., ub 10-2i..: i=0 host 1,2 -> ub 10,11; i=1 host 3,4 -> ub 8,9;
    # i=2 host 5,6 -> ub 6,7.  So ub 6..11 = host rows 5,6,3,4,1,2.
    r = run([CFG("rep_host_stride", 2), CFG("rep_ub_stride", -2),
             I("RHM", repeat=3, host=1, ub=10, length=2)], numbered_host(8))
    assert ub_i8(r, 6, 12) == numbered_host(8)[[5, 6, 3, 4, 1, 2]].tolist()


def test_rhm_repeat_zero_ub_stride_later_iteration_wins():
    # rep_ub_stride 0, rep_host_stride 1: ub 0,1 <- host 0,1 then 1,2 then 2,3.
    r = run([CFG("rep_host_stride", 1), I("RHM", repeat=3, host=0, ub=0, length=2)],
            numbered_host(4))
    assert ub_i8(r, 0, 2) == numbered_host(4)[[2, 3]].tolist()


def test_whm_repeat_strides():
    # ub rows 0..3 get host rows 0..3; then WHM with rep_ub_stride 2, rep_host_stride -1:
    # i=0: ub 0,1 -> host 5,6; i=1: ub 2,3 -> host 4,5.  Host 5 is written twice, last by i=1
    # (ub 3).  Final host 4,5,6 = original rows 2, 3, 1.
    host = numbered_host(8)
    r = run([I("RHM", host=0, ub=0, length=4),
             CFG("rep_ub_stride", 2), CFG("rep_host_stride", -1),
             I("WHM", repeat=2, ub=0, host=5, length=2)], host)
    expect = host.copy()
    expect[[4, 5, 6]] = host[[2, 3, 1]]
    assert r.host.view(np.int8).tolist() == expect.tolist()


def test_rhma_negative_and_zero_strides():
    # dma_host_stride 3, dma_ub_stride -1: vectors k=0,1,2 host 0,3,6 -> ub 5,4,3.
    host = numbered_host(8)
    r = run([CFG("dma_host_stride", 3), CFG("dma_ub_stride", -1),
             I("RHMA", host=0, ub=5, length=3)], host)
    assert ub_i8(r, 3, 6) == host[[6, 3, 0]].tolist()
    # dma_ub_stride 0: host 0,1,2 all land on ub 7; the later k wins -> host row 2.
    r = run([CFG("dma_ub_stride", 0), I("RHMA", host=0, ub=7, length=3)], host)
    assert ub_i8(r, 7, 8) == host[[2]].tolist()
    assert r.ub[6].sum() == 0 and r.ub[8].sum() == 0


def test_rhma_2d_patch():
    # A 4x4 image of host rows (pixel (y, x) at host row 4y + x); cut the 2x2 patch at (1, 1):
    # dma_host_stride 1, rep_host_stride 4, rep_ub_stride 2, RHMA 5, 0, 2, repeat=2
    # -> ub 0,1 = host 5,6 and ub 2,3 = host 9,10.
    host = numbered_host(16)
    r = run([CFG("rep_host_stride", 4), CFG("rep_ub_stride", 2),
             I("RHMA", repeat=2, host=5, ub=0, length=2)], host)
    assert ub_i8(r, 0, 4) == host[[5, 6, 9, 10]].tolist()


def test_whma_scatter_with_collision():
    # ub 0..2 = host rows 0..2; WHMA ub=0 host=7 length 3 with dma_host_stride -2,
    # dma_ub_stride 1: k=0 ub0 -> host7, k=1 ub1 -> host5, k=2 ub2 -> host3.
    host = numbered_host(8)
    r = run([I("RHM", host=0, ub=0, length=3), CFG("dma_host_stride", -2),
             I("WHMA", ub=0, host=7, length=3)], host)
    expect = host.copy()
    expect[[7, 5, 3]] = host[[0, 1, 2]]
    assert r.host.view(np.int8).tolist() == expect.tolist()
    # dma_host_stride 0: ub 0,1,2 all land on host 6; the later k wins -> ub 2 = row 2.
    r = run([I("RHM", host=0, ub=0, length=3), CFG("dma_host_stride", 0),
             I("WHMA", ub=0, host=6, length=3)], host)
    expect = host.copy()
    expect[6] = host[2]
    assert r.host.view(np.int8).tolist() == expect.tolist()


# ---------------------------------------------------------------- MatrixMultiply
# W1[k, n]: rows 0..2 diagonal 1, 2, 3; row 3 all ones.  For x = [a, b, c, d]:
# out = [a + d, 2b + d, 3c + d, d].  (The transpose would give [a, 2b, 3c, a + b + c + d].)
W1 = np.array([[1, 0, 0, 0], [0, 2, 0, 0], [0, 0, 3, 0], [1, 1, 1, 1]], dtype=np.int8)


def test_mmc_orientation_and_signed_inputs():
    # x0 = [1, 2, 3, 4] -> [1+4, 4+4, 9+4, 4] = [5, 8, 13, 4]
    # x1 = [-1, 0, 0, -128] -> [-1-128, -128, -128, -128] = [-129, -128, -128, -128]
    host = rows([1, 2, 3, 4], [-1, 0, 0, -128])
    r = run([I("RHM", host=0, ub=0, length=2), I("RW", tile=0),
             I("MMC", "S", ub=0, acc=2, length=2)], host, W1[None])
    assert r.acc[2:4].tolist() == [[5, 8, 13, 4], [-129, -128, -128, -128]]
    assert r.acc[:2].sum() == 0 and r.active == (0,) and r.fifo == []


def test_mmc_unsigned_input_and_weights():
    # U: bytes [0xFF, 0, 0, 0x80] are [255, 0, 0, 128] -> [255+128, 128, 128, 128].
    host = rows([-1, 0, 0, -128])
    r = run([I("RHM", host=0, ub=0, length=1), I("RW", tile=0),
             I("MMC", "SU", ub=0, acc=0, length=1)], host, W1[None])
    assert r.acc[0].tolist() == [383, 128, 128, 128]
    # W: tile of all 0xFF is 255 (signed it is -1).  x = [1, 2, 3, 4]: sum 10.
    # W: 10 * 255 = 2550 in every column; without W: -10.
    host = rows([1, 2, 3, 4])
    ones = np.full((1, N, N), -1, dtype=np.int8)
    r = run([I("RHM", host=0, ub=0, length=1), I("RW", tile=0),
             I("MMC", "SW", ub=0, acc=0, length=1), I("MMC", ub=0, acc=1, length=1)],
            host, ones)
    assert r.acc[0].tolist() == [2550] * N
    assert r.acc[1].tolist() == [-10] * N


def test_mmc_accumulate_overwrite_and_reuse():
    # x = [1, 2, 3, 4] -> out [5, 8, 13, 4] (see W1).
    # MMC.SO writes it; MMC (no S: reuses the active tile) adds it again -> [10, 16, 26, 8];
    # a third MMC.O overwrites -> back to [5, 8, 13, 4] in row 1, row 0 keeps the double.
    host = rows([1, 2, 3, 4])
    r = run([I("RHM", host=0, ub=0, length=1), I("RW", tile=0),
             I("MMC", "SO", ub=0, acc=0, length=1),
             I("MMC", ub=0, acc=0, length=1),
             I("MMC", ub=0, acc=1, length=1), I("MMC", ub=0, acc=1, length=1),
             I("MMC", "O", ub=0, acc=1, length=1)], host, W1[None])
    assert r.acc[0].tolist() == [10, 16, 26, 8]
    assert r.acc[1].tolist() == [5, 8, 13, 4]


def test_mmc_switch_takes_tiles_in_order():
    # Tiles: 0 = identity, 1 = 2 * identity.  RW 0; RW 1; MMC.S (tile 0); MMC.S (tile 1).
    # x = [1, 2, 3, 4]: first [1, 2, 3, 4] into acc 0, then [2, 4, 6, 8] into acc 1.
    weights = np.stack([EYE, 2 * EYE])
    host = rows([1, 2, 3, 4])
    r = run([I("RHM", host=0, ub=0, length=1), I("RW", tile=0), I("RW", tile=1),
             I("MMC", "S", ub=0, acc=0, length=1), I("MMC", "S", ub=0, acc=1, length=1)],
            host, weights)
    assert r.acc[0].tolist() == [1, 2, 3, 4]
    assert r.acc[1].tolist() == [2, 4, 6, 8]
    assert r.active == (1,)


def test_mmc_repeat_acc_stride_zero_reduces_over_k():
    # K = 2N reduction: ub 0 = x0 = [1, 1, 1, 1], ub 1 = x1 = [1, 2, 3, 4];
    # tiles 0 = identity, 1 = 3 * identity.  rep_ub_stride 1, rep_acc_stride 0, MMC.SO repeat 2:
    # iteration 0 overwrites acc 5 with x0 @ I = [1, 1, 1, 1] (the old 100s vanish),
    # iteration 1 adds x1 @ 3I = [3, 6, 9, 12]  -> [4, 7, 10, 13].
    weights = np.stack([EYE, 3 * EYE])
    # (Tile order in the FIFO: 0 for the setup MMC.S, then 0 and 1 for the two iterations.)
    host = rows([1, 1, 1, 1], [1, 2, 3, 4], 100)
    r = run([I("RHM", host=0, ub=0, length=3), I("RW", tile=0), I("RW", tile=0),
             I("RW", tile=1), I("MMC", "S", ub=2, acc=5, length=1),      # acc 5 = 100s
             CFG("rep_ub_stride", 1),
             I("MMC", "SO", repeat=2, ub=0, acc=5, length=1)], host, weights)
    assert r.acc[5].tolist() == [4, 7, 10, 13]


def test_mmc_repeat_acc_stride_nonzero_overwrites_every_iteration():
    # acc 0..2 first hold 100s (x = [100]*4 @ I).  Then, with rep_ub_stride 1 and
    # rep_acc_stride 1, MMC.O repeat 3 over ub 0, 1, 2 = [1]*4, [2]*4, [3]*4 overwrites each row:
    # acc 0, 1, 2 = [1]*4, [2]*4, [3]*4.  Without O (second program) it adds: 101, 102, 103.
    host = rows(1, 2, 3, 100)
    setup = [I("RHM", host=0, ub=0, length=4), I("RW", tile=0), I("MMC", "S", ub=3, acc=0, length=1),
             I("MMC", ub=3, acc=1, length=1), I("MMC", ub=3, acc=2, length=1),
             CFG("rep_ub_stride", 1), CFG("rep_acc_stride", 1)]
    r = run(setup + [I("MMC", "O", repeat=3, ub=0, acc=0, length=1)], host, EYE[None])
    assert r.acc[0:3, 0].tolist() == [1, 2, 3]
    r = run(setup + [I("MMC", repeat=3, ub=0, acc=0, length=1)], host, EYE[None])
    assert r.acc[0:3, 0].tolist() == [101, 102, 103]


def test_mmc_repeat_with_switch_each_iteration():
    # Tiles 0 = I, 1 = 2I, 2 = 3I; x = [1, 2, 3, 4] at ub 0; rep_acc_stride 1, rep_ub_stride 0:
    # MMC.SO repeat 3 -> acc 0, 1, 2 = x, 2x, 3x; all three tiles consumed.
    weights = np.stack([EYE, 2 * EYE, 3 * EYE])
    r = run([I("RHM", host=0, ub=0, length=1), I("RW", repeat=3, tile=0),
             CFG("rep_acc_stride", 1), I("MMC", "SO", repeat=3, ub=0, acc=0, length=1)],
            rows([1, 2, 3, 4]), weights, shape=BIG_FIFO)
    assert r.acc[0:3].tolist() == [[1, 2, 3, 4], [2, 4, 6, 8], [3, 6, 9, 12]]
    assert r.fifo == [] and r.active == (2,)


def test_mmc_16bit_inputs():
    # H: vector v = lo (row 2v, unsigned) + 256 * hi (row 2v+1, signed unless U).
    # column 0: lo 0x34, hi 0x12 -> 0x1234 = 4660;  column 1: lo 0xFF, hi 0xFF -> 255 - 256 = -1;
    # column 2: lo 0x80, hi 0x00 -> 128;  column 3: lo 0x00, hi 0x80 -> -128 * 256 = -32768.
    # With U: column 1 -> 65535, column 3 -> 128 * 256 = 32768.  Identity tile: acc = x.
    host = np.array([[0x34, 0xFF, 0x80, 0x00], [0x12, 0xFF, 0x00, 0x80]], dtype=np.uint8)
    prog = [I("RHM", host=0, ub=0, length=2), I("RW", tile=0),
            I("MMC", "SH", ub=0, acc=0, length=1), I("MMC", "HU", ub=0, acc=1, length=1)]
    r = run(prog, host, EYE[None])
    assert r.acc[0].tolist() == [4660, -1, 128, -32768]
    assert r.acc[1].tolist() == [4660, 65535, 128, 32768]


def test_mmc_16bit_weights():
    # D: the switch takes two tiles, lo (unsigned) then hi (signed unless W).
    # lo = 0xFF on the diagonal, hi = 0x01 on the diagonal -> 255 + 256 = 511 on the diagonal.
    # lo = 0x00, hi = 0xFF -> -256 (signed) or 65280 (W).   x = [1, 2, 3, 4].
    lo = np.diag([0xFF] * N).astype(np.uint8)
    hi = np.diag([0x01] * N).astype(np.uint8)
    hi2 = np.diag([0xFF] * N).astype(np.uint8)
    zero = np.zeros((N, N), dtype=np.uint8)
    weights = np.stack([lo, hi, zero, hi2])
    r = run([I("RHM", host=0, ub=0, length=1), I("RW", repeat=2, tile=0),
             I("MMC", "SDO", ub=0, acc=0, length=1),          # 511 * x
             I("RW", repeat=2, tile=2),
             I("MMC", "SD", ub=0, acc=1, length=1),           # -256 * x
             I("MMC", "DW", ub=0, acc=2, length=1)],          # same tiles, W: 65280 * x
            rows([1, 2, 3, 4]), weights)
    assert r.acc[0].tolist() == [511, 1022, 1533, 2044]
    assert r.acc[1].tolist() == [-256, -512, -768, -1024]
    assert r.acc[2].tolist() == [65280, 130560, 195840, 261120]
    assert r.active == (2, 3)


def test_mmc_int32_wraps():
    # H and D with x = -32768 in every column and w = -32768 everywhere (lo 0x00, hi 0x80):
    # each product is 2^30; N = 4 of them sum to 2^32, which wraps to 0.
    # x = [-32768, -32768, -32768, 0]: 3 * 2^30 = 3221225472 -> wraps to -1073741824.
    # Accumulating that three times into one row (repeat 3, rep_acc_stride 0, no O):
    # -2^30, -2^31, then -3 * 2^30 wraps to +2^30 = 1073741824.
    host = np.array([[0x00] * 4, [0x80] * 4, [0x00] * 4, [0x80, 0x80, 0x80, 0x00]], dtype=np.uint8)
    lo = np.zeros((N, N), dtype=np.uint8)
    hi = np.full((N, N), 0x80, dtype=np.uint8)
    r = run([I("RHM", host=0, ub=0, length=4), I("RW", repeat=2, tile=0),
             I("MMC", "SHD", ub=0, acc=0, length=1),
             I("MMC", "HD", repeat=3, ub=2, acc=1, length=1)],
            host, np.stack([lo, hi]))
    assert r.acc[0].tolist() == [0] * N
    assert r.acc[1].tolist() == [1073741824] * N
    assert wrap_int32(3 * 2 ** 30) == -1073741824


# ---------------------------------------------------------------- Convolve
# A 4x4 image, one pixel per UB row, pixel (y, x) = 4y + x in channel 0 (other channels 0).
IMAGE = np.zeros((16, N), dtype=np.int8)
IMAGE[:, 0] = np.arange(16)


def conv_tiles(kernel):
    """Tile per tap: w[0, 0] = kernel tap, w[0, 1] = 1 (channel 1 sums the window)."""
    tiles = np.zeros((len(kernel), N, N), dtype=np.int8)
    tiles[:, 0, 0] = kernel
    tiles[:, 0, 1] = 1
    return tiles


def test_conv_3x3_over_4x4():
    # Kernel k[dy][dx] = 3dy + dx + 1 (1..9), stride 1, pitch 4, output 2x2 at acc 2..5.
    # out(y, x) = sum k[dy][dx] * (4(y+dy) + (x+dx)) = 45 (4y + x) + sum k * (4dy + dx)
    # sum k * (4dy + dx): dy=0: 1*0 + 2*1 + 3*2 = 8; dy=1: 4*4 + 5*5 + 6*6 = 77;
    # dy=2: 7*8 + 8*9 + 9*10 = 218; total 303.
    # -> (0,0) 303, (0,1) 348, (1,0) 483, (1,1) 528.
    # Channel 1 = window sum = 9 (4y + x) + 45 -> 45, 54, 81, 90.
    # Acc 2..5 held 7s before: O overwrites at tap 0, the other taps add.
    tiles = conv_tiles(list(range(1, 10)))
    host = np.concatenate([IMAGE, rows(7, 7, 7, 7)])
    prog = [I("RHM", host=0, ub=0, length=20),
            I("RW", tile=9), I("MMC", "S", ub=16, acc=2, length=4),          # acc 2..5 = 7s
            CFG("conv_kw", 3), CFG("conv_pitch", 4)]
    prog += [I("RW", repeat=8, tile=0), I("RW", tile=8)]
    prog += [I("MMC", "CSO", repeat=9, ub=0, acc=2, height=2, width=2)]
    weights = np.concatenate([tiles, EYE[None]])
    r = run(prog, host, weights, shape=MachineShape(array_size=N, ub_rows=32, acc_rows=16,
                                                      fifo_depth=8))
    assert r.fault_kind is None
    assert r.acc[2:6, 0].tolist() == [303, 348, 483, 528]
    assert r.acc[2:6, 1].tolist() == [45, 54, 81, 90]
    assert r.acc[2:6, 2:].sum() == 0
    assert r.acc[1].sum() == 0 and r.acc[6].sum() == 0


def test_conv_stride_2_without_overwrite_adds():
    # 2x2 kernel [[1, 2], [3, 4]], conv_kw 2, stride 2, pitch 4 over the 4x4 image -> 2x2 out:
    # out(y, x) = sum k[dy][dx] * (4(2y+dy) + 2x+dx) = 10 (8y + 2x) + (1*0 + 2*1 + 3*4 + 4*5 = 34)
    # -> (0,0) 34, (0,1) 54, (1,0) 114, (1,1) 134.  No O: added to zeros, then run twice -> x2.
    tiles = conv_tiles([1, 2, 3, 4])
    prog = [I("RHM", host=0, ub=0, length=16), CFG("conv_kw", 2), CFG("conv_pitch", 4),
            CFG("conv_stride", 2), I("RW", repeat=4, tile=0),
            I("MMC", "CS", repeat=4, ub=0, acc=0, height=2, width=2)]
    r = run(prog, IMAGE, tiles, shape=BIG_FIFO)
    assert r.acc[0:4, 0].tolist() == [34, 54, 114, 134]
    # The active tile is now tap 3 (k = 4); MMC.C without S and repeat 1 applies it at tap (0,0):
    # adds 4 * pixel(2y, 2x) = 4 * [0, 2, 8, 10].
    r = run(prog + [I("MMC", "C", ub=0, acc=0, height=2, width=2)], IMAGE, tiles, shape=BIG_FIFO)
    assert r.acc[0:4, 0].tolist() == [34 + 0, 54 + 8, 114 + 32, 134 + 40]


def test_conv_pitch_zero_means_width():
    # conv_pitch 0 -> pitch = width = 3; height 2, width 3, kw 1, one tap (0, 0):
    # v = 3y + x, so output rows are the first 6 UB rows in order: pixel values 0..5 times 5.
    tiles = conv_tiles([5])
    r = run([I("RHM", host=0, ub=0, length=16), I("RW", tile=0),
             I("MMC", "CSO", ub=0, acc=0, height=2, width=3)], IMAGE, tiles)
    assert r.acc[0:6, 0].tolist() == [0, 5, 10, 15, 20, 25]


def test_conv_16bit_input():
    # H: input vector v is UB rows 2v (lo) and 2v+1 (hi).  Pixels v = 0..3 hold 1000 v
    # (lo = 1000v & 0xFF, hi = 1000v >> 8).  kw 2, one row of taps (repeat 2), 1x2 window, pitch 0
    # (= width 2), tiles 1 and 2 in channel 0: out(0, x) = 1 * p(x) + 2 * p(x + 1)
    # -> x=0: 0 + 2000 = 2000; x=1: 1000 + 4000 = 5000.
    values = np.arange(4) * 1000
    host = np.zeros((8, N), dtype=np.uint8)
    host[0::2, 0] = values & 0xFF
    host[1::2, 0] = values >> 8
    tiles = conv_tiles([1, 2])
    r = run([I("RHM", host=0, ub=0, length=8), CFG("conv_kw", 2), I("RW", repeat=2, tile=0),
             I("MMC", "CSOH", repeat=2, ub=0, acc=0, height=1, width=2)], host, tiles)
    assert r.acc[0:2, 0].tolist() == [2000, 5000]


# ---------------------------------------------------------------- Activate
def act_run(values, *extra, acc=0):
    prog, host, weights = load_acc16(values, acc)
    return run(prog + list(extra), host, weights)


def test_act_identity_and_relu_after_reset():
    # Reset: identity requantization into saturating int8.
    # [200, -200, 5, -5] -> ACT: [127, -128, 5, -5]; ACT.R: [127, 0, 5, 0].
    r = act_run([[200, -200, 5, -5]], I("ACT", acc=0, ub=0, length=1),
                I("ACT", "R", acc=0, ub=1, length=1))
    assert ub_i8(r, 0, 2) == [[127, -128, 5, -5], [127, 0, 5, 0]]


def test_act_sigmoid_and_tanh_with_fn_in_frac():
    # fn_in_frac 8: acc 256 is 1.0 -> t = 256.  SIGMOID[256] = round(32768 / (1 + e^-1))
    # = round(23955.33) = 23955;  TANH[256] = round(32768 tanh 1) = round(24955.92) = 24956.
    # acc 0 -> t = 0: sigmoid 16384, tanh 0.  acc -128 -> t = -128: sigmoid(-0.5)
    # = round(12371.25) = 12371, tanh(-0.5) = round(-15142.66) = -15143.
    # acc 30000 -> t clipped to 4095: round(32767.996) = 32768 (both); acc -30000 -> t -4096:
    # sigmoid round(0.0037) = 0, tanh -32768.
    # Requantize act_shift 8, act_out 2 (int16): (y + 128) >> 8:
    #   sigmoid: 23955 -> 24083 >> 8 = 94;  16384 -> 64;  12371 -> 12499 >> 8 = 48;
    #            32768 -> 128; 0 -> 0.
    #   tanh:    24956 -> 25084 >> 8 = 97;  0 -> 0;  -15143 -> -15015 >> 8 = -59 (floor -58.65);
    #            32768 -> 128; -32768 -> -32640 >> 8 = -127.5 -> floor -128.
    values = [[256, 0, -128, 30000], [-30000, 0, 0, 0]]
    r = act_run(values, CFG("fn_in_frac", 8), CFG("act_shift", 8), CFG("act_out", 2),
                I("ACT", "Q", acc=0, ub=0, length=2), I("ACT", "T", acc=0, ub=4, length=2))

    def int16_rows(start, count):
        lo = r.ub[start:start + 2 * count:2].astype(int)
        hi = r.ub[start + 1:start + 2 * count:2].view(np.int8).astype(int)
        return (lo + 256 * hi).tolist()

    assert int16_rows(0, 2) == [[94, 64, 48, 128], [0, 64, 64, 64]]
    assert int16_rows(4, 2) == [[97, 0, -59, 128], [-128, 0, 0, 0]]


@pytest.mark.parametrize("frac, x, expected", [
    # Expected raw Q15 tanh, read back with act_out 2 (int16 saturates at 32767).
    (0, 1, 24956),          # t = 1 << 8 = 256 -> TANH[256] = 24956
    (7, 128, 24956),        # t = 128 << 1 = 256
    (8, 257, 25010),        # t = 257: round(32768 tanh(257/256)) = round(25009.51) = 25010
    (10, 1024, 24956),      # t = (1024 + 2) >> 2 = 256
    (10, 1026, 25010),      # t = (1026 + 2) >> 2 = 257: rounds half up
    (10, 1025, 24956),      # t = (1025 + 2) >> 2 = 256
    (9, -257, -15143),      # t = (-257 + 1) >> 1 = -128 -> TANH[-128] = round(-15142.66)
    (0, -20, -32768),       # t = -20 << 8 = -5120, clipped to -4096 -> TANH[-4096] = -32768
])
def test_act_fn_in_frac(frac, x, expected):
    r = act_run([[x, 0, 0, 0]], CFG("fn_in_frac", frac), CFG("act_out", 2),
                I("ACT", "T", acc=0, ub=0, length=1))
    value = int(r.ub[0, 0]) + 256 * int(r.ub[1:2].view(np.int8)[0, 0])
    assert value == expected


def test_act_fn_in_frac_negative_rounding():
    # f = 9: t = (x + 1) >> 1.  x = -257 -> -256 >> 1 = -128; x = -258 -> -257 >> 1 = -129.
    # The sigmoid table is monotonic, so t = -129 gives a smaller value than t = -128:
    # SIGMOID[-128] = round(32768 / (1 + e^0.5)) = round(12371.25) = 12371,
    # SIGMOID[-129] = round(32768 / (1 + e^(129/256))): e^0.50390625 = 1.65520, 32768 / 2.65520
    # = 12341.1 -> 12341.
    r = act_run([[-257, -258, 0, 0]], CFG("fn_in_frac", 9), CFG("act_out", 2),
                I("ACT", "Q", acc=0, ub=0, length=1))
    lo, hi = r.ub[0].astype(int), r.ub[1].view(np.int8).astype(int)
    assert (lo + 256 * hi)[:2].tolist() == [12371, 12341]


def test_act_pool_1d_max_and_avg_with_negatives_and_rounding():
    # pool_size 2, pool_width 0: rows (0, 1) and (2, 3) per column.
    # column 0: -3, -4 | 5, 6      max -3, 6;  avg floor((-7 + 1) / 2) = -3, floor((11 + 1)/2) = 6
    # column 1: -2, -3 | 2, 3      max -2, 3;  avg floor(-4/2) = -2 (-2.5 -> -2), floor(6/2) = 3
    # column 2: -1, -2 | 0, 1      max -1, 1;  avg floor(-2/2) = -1 (-1.5 -> -1), floor(2/2) = 1
    # column 3: -1, 0 | -9, -10    max 0, -9;  avg floor(0/2) = 0 (-0.5 -> 0), floor(-18/2) = -9
    #           (-19 + 1 = -18)
    values = [[-3, -2, -1, -1], [-4, -3, -2, 0], [5, 2, 0, -9], [6, 3, 1, -10]]
    r = act_run(values, CFG("pool_size", 2), I("ACT", "M", acc=0, ub=0, length=4),
                I("ACT", "A", acc=0, ub=2, length=4))
    assert ub_i8(r, 0, 2) == [[-3, -2, -1, 0], [6, 3, 1, -9]]
    assert ub_i8(r, 2, 4) == [[-3, -2, -1, 0], [6, 3, 1, -9]]
    # ReLU first, then pool: column 0 relu -> 0, 0 | 5, 6 -> max 0, 6; avg 0, 6.
    r = act_run(values, CFG("pool_size", 2), I("ACT", "RA", acc=0, ub=0, length=4))
    assert ub_i8(r, 0, 2) == [[0, 0, 0, 0], [6, 3, 1, 0]]


def test_act_pool_2d():
    # pool_width 4, length 8 -> a 2 x 4 image, pool_size 2 -> 1 x 2 windows, output 2 rows:
    # window 0 = rows 0, 1, 4, 5; window 1 = rows 2, 3, 6, 7.
    # column 0: rows 0..7 = 1, 2, 3, 4, 5, 6, 7, 8 -> window 0: 1, 2, 5, 6 max 6, avg (14+2)//4 = 4
    #                                                  window 1: 3, 4, 7, 8 max 8, avg (22+2)//4 = 6
    # column 1: -1, -2, -3, -4, -5, -6, -7, -9 -> w0 -1,-2,-5,-6 max -1, avg (-14+2)//4 = -3
    #                                             w1 -3,-4,-7,-9 max -3, avg (-23+2)//4 = -21/4 -> -6
    col0 = [1, 2, 3, 4, 5, 6, 7, 8]
    col1 = [-1, -2, -3, -4, -5, -6, -7, -9]
    values = [[a, b, 0, 0] for a, b in zip(col0, col1)]
    r = act_run(values, CFG("pool_size", 2), CFG("pool_width", 4),
                I("ACT", "M", acc=0, ub=0, length=8), I("ACT", "A", acc=0, ub=2, length=8))
    assert ub_i8(r, 0, 2) == [[6, -1, 0, 0], [8, -3, 0, 0]]
    assert ub_i8(r, 2, 4) == [[4, -3, 0, 0], [6, -6, 0, 0]]


def test_act_requantize_rounding():
    # act_mult 3, act_shift 2, act_zero -1:  y = ((3x + 2) >> 2) - 1
    # x = 1: (3 + 2) >> 2 = 1 -> 0;   x = -1: (-3 + 2) >> 2 = -1 -> -2;
    # x = 2: (6 + 2) >> 2 = 2 -> 1;   x = -2: (-6 + 2) >> 2 = -1 -> -2.
    r = act_run([[1, -1, 2, -2]], CFG("act_mult", 3), CFG("act_shift", 2), CFG("act_zero", -1),
                I("ACT", acc=0, ub=0, length=1))
    assert ub_i8(r, 0, 1) == [[0, -2, 1, -2]]
    # Halves round up: act_shift 2, x = 2 -> (2 + 2) >> 2 = 1 (0.5 -> 1);
    # x = -2 -> 0 >> 2 = 0 (-0.5 -> 0); x = 6 -> 8 >> 2 = 2 (1.5 -> 2); x = -6 -> -4 >> 2 = -1.
    r = act_run([[2, -2, 6, -6]], CFG("act_shift", 2), I("ACT", acc=0, ub=0, length=1))
    assert ub_i8(r, 0, 1) == [[1, 0, 2, -1]]
    # Large: act_mult = 2^31 - 1 with x = 30000 is exact in 64 bits:
    # 30000 * 2147483647 = 64424509410000; >> 40 (+ 2^39): 64424509410000 / 2^40 = 58.59 -> 59.
    r = act_run([[30000, 0, 0, 0]], CFG("act_mult", 2 ** 31 - 1), CFG("act_shift", 40),
                I("ACT", acc=0, ub=0, length=1))
    assert ub_i8(r, 0, 1) == [[59, 0, 0, 0]]


def test_act_every_output_type():
    # Loaded values [150, -3, -100, 20000] (int16), act_mult 2 -> y = [300, -6, -200, 40000].
    # act_out 0: clip int8      -> [127, -6, -128, 127]
    # act_out 1: clip uint8     -> [255, 0, 0, 255]
    # act_out 2: clip int16     -> [300, -6, -200, 32767] = 0x012C, 0xFFFA, 0xFF38, 0x7FFF:
    #            low bytes (ub 2) 0x2C, 0xFA, 0x38, 0xFF; high bytes (ub 3) 0x01, 0xFF, 0xFF, 0x7F
    # act_out 3: y & 0xFF       -> 300 - 256 = 44, 256 - 6 = 250, -200 + 256 = 56,
    #                              40000 = 0x9C40 -> 0x40 = 64
    r = act_run([[150, -3, -100, 20000]], CFG("act_mult", 2),
                I("ACT", acc=0, ub=0, length=1),
                CFG("act_out", 1), I("ACT", acc=0, ub=1, length=1),
                CFG("act_out", 2), I("ACT", acc=0, ub=2, length=1),
                CFG("act_out", 3), I("ACT", acc=0, ub=4, length=1))
    assert ub_i8(r, 0, 1) == [[127, -6, -128, 127]]
    assert r.ub[1].tolist() == [255, 0, 0, 255]
    assert r.ub[2].tolist() == [0x2C, 0xFA, 0x38, 0xFF]
    assert r.ub[3].tolist() == [0x01, 0xFF, 0xFF, 0x7F]
    assert r.ub[4].tolist() == [44, 250, 56, 64]


def test_act_repeat_strides():
    # acc 0..3 = [1]*4 .. [4]*4.  rep_acc_stride 2, rep_ub_stride -1, ACT length 1 repeat 2 at ub 5:
    # i=0 acc 0 -> ub 5 (= 1s); i=1 acc 2 -> ub 4 (= 3s).  With act_out 2 each vector is two rows:
    # rep_ub_stride 2 -> i=0 ub 10,11 = (1, 0); i=1 ub 12,13 = (3, 0).
    r = act_run([[1] * 4, [2] * 4, [3] * 4, [4] * 4],
                CFG("rep_acc_stride", 2), CFG("rep_ub_stride", -1),
                I("ACT", repeat=2, acc=0, ub=5, length=1),
                CFG("rep_ub_stride", 2), CFG("act_out", 2),
                I("ACT", repeat=2, acc=0, ub=10, length=1))
    assert ub_i8(r, 4, 6) == [[3] * 4, [1] * 4]
    assert ub_i8(r, 10, 14) == [[1] * 4, [0] * 4, [3] * 4, [0] * 4]


# ---------------------------------------------------------------- CFG, events, HLT
def test_cfg_registers_and_numbered_reset():
    r = run([CFG("act_shift", 8), CFG("rep_ub_stride", -16777216)])
    assert r.registers["act_shift"] == 8
    assert r.registers["rep_ub_stride"] == -16777216
    assert r.registers["act_mult"] == 1 and r.registers["pool_size"] == 1
    assert r.registers["dma_host_stride"] == 1 and r.registers["conv_kw"] == 1


def test_events_and_halt():
    # INT and TAG are logged in order; HLT stops: the TAG after it never runs.
    r = run([I("TAG", tag=7), I("NOP", repeat=3), I("SYNC"), I("WSYNC"), I("INT", code=42),
             I("HLT"), I("TAG", tag=8)])
    assert r.events == [("tag", 0, 7), ("interrupt", 4, 42)]
    assert r.fault_kind is None and r.next_index == 5


# ---------------------------------------------------------------- faults
def assert_fault(r, kind, index):
    assert (r.fault_kind, r.fault_index) == (kind, index), r.fault_message


def test_fault_config_has_no_effect():
    r = run([CFG("act_shift", 3), CFG("act_shift", 63), CFG("act_shift", 5)])
    assert_fault(r, "config", 1)
    assert r.registers["act_shift"] == 3
    for name, bad in [("act_out", 4), ("pool_size", 0), ("conv_kw", 257), ("fn_in_frac", -1),
                      ("rep_acc_stride", 65536), ("dma_ub_stride", -16777217)]:
        assert_fault(run([CFG(name, bad)]), "config", 0)


def test_fault_address_every_memory():
    host = numbered_host(4)
    assert_fault(run([I("RHM", host=3, ub=0, length=2)], host), "address", 0)      # host 4
    assert_fault(run([I("RHM", host=0, ub=31, length=2)], host), "address", 0)     # ub 32
    assert_fault(run([I("RHM", host=0, ub=0, length=1)]), "address", 0)            # no host
    assert_fault(run([I("WHM", ub=0, host=4, length=1)], host), "address", 0)
    assert_fault(run([I("RW", tile=1)], host, EYE[None]), "address", 0)
    assert_fault(run([I("RW", tile=0)], host, None), "address", 0)                  # no weights
    assert_fault(run([I("RW", tile=0), I("MMC", "S", ub=30, acc=0, length=3)], host, EYE[None]),
                 "address", 1)
    r = run([I("RW", tile=0), I("MMC", "S", ub=0, acc=14, length=3)], host, EYE[None])
    assert_fault(r, "address", 1)
    assert r.fifo == [0] and r.active is None                      # the switch did not happen
    assert_fault(run([I("ACT", acc=15, ub=0, length=2)]), "address", 0)
    # act_out 2: 2 rows per vector -> ub 30, 31, 32.
    assert_fault(run([CFG("act_out", 2), I("ACT", acc=0, ub=30, length=2)]), "address", 1)
    # H: 2 UB rows per vector.
    assert_fault(run([I("RW", tile=0), I("MMC", "SH", ub=28, acc=0, length=3)], host, EYE[None]),
                 "address", 1)


def test_fault_address_checks_every_iteration_first():
    # RHM repeat 3 with rep_ub_stride 12: ub 0, 12, 24, 36 -> the 4th iteration is out of range,
    # so nothing is written at all; the instruction before completed.
    host = numbered_host(4)
    r = run([I("RHM", host=0, ub=20, length=1), CFG("rep_ub_stride", 12),
             I("RHM", repeat=4, host=1, ub=0, length=1)], host)
    assert_fault(r, "address", 2)
    assert ub_i8(r, 20, 21) == [[0, 1, 2, 3]]
    assert r.ub[:20].sum() == 0 and r.ub[21:].sum() == 0
    # Negative strides below 0 fault too: RHMA with dma_ub_stride -1 from ub 1, length 3.
    r = run([CFG("dma_ub_stride", -1), I("RHMA", host=0, ub=1, length=3)], host)
    assert_fault(r, "address", 1)
    assert r.ub.sum() == 0
    # Conv: taps beyond the image.  4x4 image area, 2x2 window, pitch 4, kw 3, taps 9 -> the
    # last tap reads v = (1 + 2) * 4 + (1 + 2) = 15 at ub 20 + 15 = 35 > 31.
    r = run([CFG("conv_kw", 3), CFG("conv_pitch", 4), I("RW", tile=0),
             I("MMC", "S", ub=0, acc=0, length=1),
             I("MMC", "CO", repeat=9, ub=20, acc=0, height=2, width=2)], host, EYE[None])
    assert_fault(r, "address", 4)


def test_fault_no_tile_and_weight_width():
    host = numbered_host(4)
    assert_fault(run([I("MMC", ub=0, acc=0, length=1)], host), "no_tile", 0)
    assert_fault(run([I("MMC", "C", ub=0, acc=0, height=1, width=1)], host), "no_tile", 0)
    two = np.stack([EYE, EYE])
    # Active 8-bit, MMC.D -> weight_width; active 16-bit, plain MMC -> weight_width.
    r = run([I("RW", tile=0), I("MMC", "S", ub=0, acc=0, length=1),
             I("MMC", "D", ub=0, acc=1, length=1)], host, two)
    assert_fault(r, "weight_width", 2)
    r = run([I("RW", repeat=2, tile=0), I("MMC", "SD", ub=0, acc=0, length=1),
             I("MMC", ub=0, acc=1, length=1)], host, two)
    assert_fault(r, "weight_width", 2)
    # With S the width comes from the switch: MMC.S after 16-bit weights is fine.
    r = run([I("RW", repeat=2, tile=0), I("MMC", "SD", ub=0, acc=0, length=1),
             I("RW", tile=0), I("MMC", "S", ub=0, acc=1, length=1)], host, two)
    assert r.fault_kind is None and r.active == (0,)


def test_fault_deadlock():
    host = numbered_host(4)
    # fifo_depth 2: the FIFO and the shadow hold 3 tiles; a 4th Read_Weights deadlocks.
    w = np.stack([EYE] * 4)
    r = run([I("RW", tile=0), I("RW", tile=1), I("RW", tile=2), I("RW", tile=3)], host, w)
    assert_fault(r, "deadlock", 3)
    assert r.fifo == [0, 1, 2]
    # A repeat counts every tile: RW repeat 4 alone deadlocks, with no effect.
    r = run([I("RW", repeat=4, tile=0)], host, w)
    assert_fault(r, "deadlock", 0)
    assert r.fifo == []
    # A switch of an earlier instruction makes room.
    r = run([I("RW", repeat=3, tile=0), I("MMC", "S", ub=0, acc=0, length=1), I("RW", tile=3)],
            host, w)
    assert r.fault_kind is None and r.fifo == [1, 2, 3]
    # S with an empty FIFO; S repeat 2 with one tile; SD needs two tiles.
    assert_fault(run([I("MMC", "S", ub=0, acc=0, length=1)], host, w), "deadlock", 0)
    r = run([I("RW", tile=0), I("MMC", "S", repeat=2, ub=0, acc=0, length=1)], host, w)
    assert_fault(r, "deadlock", 1)
    assert r.fifo == [0] and r.acc.sum() == 0
    assert_fault(run([I("RW", tile=0), I("MMC", "SD", ub=0, acc=0, length=1)], host, w),
                 "deadlock", 1)
    # Conv: each tap switches -> repeat 2 needs 2 tiles.
    assert_fault(run([I("RW", tile=0), I("MMC", "CS", repeat=2, ub=0, acc=0, height=1, width=1)],
                     host, w), "deadlock", 1)


def test_fault_shape():
    # 1-D: length 3 with pool_size 2.  2-D: length 8 not a multiple of width 3; a 2 x 3 image
    # with pool_size 2 (width 3 not a multiple of 2).  Functions without pooling never check.
    assert_fault(run([CFG("pool_size", 2), I("ACT", "M", acc=0, ub=0, length=3)]), "shape", 1)
    assert_fault(run([CFG("pool_size", 2), CFG("pool_width", 3),
                      I("ACT", "A", acc=0, ub=0, length=8)]), "shape", 2)
    assert_fault(run([CFG("pool_size", 2), CFG("pool_width", 3),
                      I("ACT", "A", acc=0, ub=0, length=6)]), "shape", 2)
    r = run([CFG("pool_size", 2), I("ACT", "R", acc=0, ub=0, length=3)])
    assert r.fault_kind is None


def test_fault_stops_everything_after():
    # The TAG before the fault is logged, the one after is not; the RHM before completed.
    host = numbered_host(4)
    r = run([I("RHM", host=0, ub=0, length=1), I("TAG", tag=1), I("MMC", ub=0, acc=0, length=1),
             I("TAG", tag=2), I("RHM", host=1, ub=1, length=1)], host)
    assert_fault(r, "no_tile", 2)
    assert r.events == [("tag", 1, 1)]
    assert ub_i8(r, 0, 2) == [[0, 1, 2, 3], [0, 0, 0, 0]]


def test_invalid_instruction():
    # ACT.RQ breaks the exclusive group R/Q/T; a zero length does not encode.
    assert_fault(run([I("NOP"), I("ACT", "RQ", acc=0, ub=0, length=1)]), "invalid_instruction", 1)
    assert_fault(run([I("RHM", host=0, ub=0, length=0)]), "invalid_instruction", 0)


def test_inputs_are_not_modified():
    host = numbered_host(4)
    before = host.copy()
    r = run([I("RHM", host=0, ub=0, length=1), I("WHM", ub=0, host=3, length=1)], host)
    assert (host == before).all()
    assert r.host.view(np.int8)[3].tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------- OpenTPU profile
OPENTPU = MachineShape(array_size=N, ub_rows=32, acc_rows=16, fifo_depth=2, profile="opentpu")


def test_opentpu_activate_keeps_the_low_8_bits():
    # spec/opentpu.md section 4.  x = [100, -1, 3, 0] times 2I -> acc [200, -2, 6, 0].
    # ACT:   low 8 bits: 200, 254, 6, 0 (no saturation; act_shift 3 is not used).
    # ACT.R: max(x, 0) then low 8 bits: 200, 0, 6, 0.
    # ACT.Q: int(255 / (1 + e^-x)): 200 -> 255 (x >= 37), -2 -> 30, 6 -> 254, 0 -> 127.
    host = rows([100, -1, 3, 0])
    r = run([I("RHM", host=0, ub=0, length=1), I("RW", tile=0),
             I("MMC", "SO", ub=0, acc=0, length=1), CFG("act_shift", 3),
             I("ACT", acc=0, ub=1, length=1), I("ACT", "R", acc=0, ub=2, length=1),
             I("ACT", "Q", acc=0, ub=3, length=1)], host, (2 * EYE)[None], shape=OPENTPU)
    assert r.ub[1:4].tolist() == [[200, 254, 6, 0], [200, 0, 6, 0], [255, 30, 254, 127]]


def test_opentpu_sigmoid_steps():
    # The step table of spec/opentpu.md, and its edges: -6 -> 0, 5 -> 253, 36 -> 254, 37 -> 255,
    # -2^31 -> 255 (OpenTPU negates it back to -2^31).
    from tpuasm.machine.reference import opentpu_sigmoid
    assert [opentpu_sigmoid(x) for x in (-7, -6, -5, -1, 0, 1, 5, 6, 36, 37, 2 ** 31 - 1)] == \
        [0, 0, 1, 68, 127, 186, 253, 254, 254, 255, 255]
    assert opentpu_sigmoid(-2 ** 31) == 255


def test_opentpu_sigmoid_agrees_with_opentpu_py_over_the_transition():
    # Two independent writings of spec/opentpu.md's table: the oracle's and tpuasm.opentpu's.
    from tpuasm.machine.reference import opentpu_sigmoid
    from tpuasm.opentpu import opentpu_sigmoid as table_sigmoid
    xs = range(-50, 51)
    assert [opentpu_sigmoid(x) for x in xs] == table_sigmoid(np.array(xs)).tolist()


def test_npy_paths_and_max_instructions(tmp_path):
    host = numbered_host(4)
    np.save(tmp_path / "host.npy", host)
    np.save(tmp_path / "weights.npy", EYE[None])
    prog = Program([I("RHM", host=1, ub=0, length=1), I("RW", tile=0),
                    I("MMC", "S", ub=0, acc=0, length=1)], SHAPE)
    r = run_reference(prog, str(tmp_path / "host.npy"), tmp_path / "weights.npy")
    assert r.acc[0].tolist() == [10, 11, 12, 13]
    # max_instructions 2: RHM and RW ran, the MMC did not; no fault.
    r = run_reference(prog, host, EYE[None], max_instructions=2)
    assert r.executed == 2 and r.next_index == 2 and r.fault_kind is None
    assert r.acc.sum() == 0 and r.fifo == [0]


def test_opentpu_tanh_and_pooling_keep_the_low_8_bits():
    # spec/opentpu.md section 4: T reads fn_in_frac, M/A read pool_size; requantization and
    # act_out are ignored (act_shift 3, act_out 2 below change nothing; one UB row per vector).
    # Rows: r0 [256, -256, 0, 0]; r1 [300, -300, 1, -1]; r2 [301, -299, 2, -2].
    # ACT.T (fn_in_frac 8) on r0: TANH[256] = 24956 = 0x617C -> 0x7C = 124;
    #   TANH[-256] = -24956 -> -24956 + 98 * 256 = 132; 0 -> 0.
    # ACT.A pool_size 2 on r1, r2: (601 + 1)//2 = 301 -> 45; (-599 + 1)//2 = -299 -> 213;
    #   (3 + 1)//2 = 2; (-3 + 1)//2 = -1 -> 255.
    # ACT.M: max 301 -> 45, -299 -> 213, 2, -1 -> 255.
    prog, host, weights = load_acc16([[256, -256, 0, 0], [300, -300, 1, -1], [301, -299, 2, -2]])
    prog += [CFG("act_shift", 3), CFG("act_out", 2), CFG("fn_in_frac", 8),
             I("ACT", "T", acc=0, ub=0, length=1),
             CFG("pool_size", 2), I("ACT", "A", acc=1, ub=1, length=2),
             I("ACT", "M", acc=1, ub=2, length=2)]
    r = run(prog, host, weights, shape=OPENTPU)
    assert r.ub[0:3].tolist() == [[124, 132, 0, 0], [45, 213, 2, 255], [45, 213, 2, 255]]

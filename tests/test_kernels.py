"""The numba instruction kernels against spec/isa.md: hand-computed cases and numpy int64
oracles written from the spec (independent of the kernels' code paths)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tpuasm.functions import SIGMOID_Q15, TANH_Q15
from tpuasm.isa import ISA_TABLE
from tpuasm.machine import decoded as D
from tpuasm.machine import gemm as G
from tpuasm.machine import kernels as K
from tpuasm.machine import native as N

RNG = np.random.default_rng(20260522)
REG_NAMES = {name: getattr(D, "REG_" + name.upper()) for name in (
    "act_mult", "act_shift", "act_zero", "act_out", "fn_in_frac", "pool_size", "pool_width",
    "conv_pitch", "conv_kw", "conv_stride", "rep_ub_stride", "rep_acc_stride",
    "rep_host_stride", "dma_host_stride", "dma_ub_stride", "act_lo", "act_hi")}
# MatrixMultiply's kernels: the portable numba one, OpenBLAS (float), and the int8 kernel
# (C) at each instruction-set level this CPU has (16-bit operands as byte passes; H with D
# at the AVX2 level goes through OpenBLAS)
INT8_LEVELS = {"int8-avx2": N.LEVEL_AVX2, "int8-vnni": N.LEVEL_VNNI}
PATHS = ["portable"] + (["blas"] if G.HAVE_BLAS else []) + \
    [path for path, level in INT8_LEVELS.items() if level <= N.cpu_level()]


def path_options(path):
    if path is None:
        return {}
    return dict(use_blas=path == "blas" or (path in INT8_LEVELS and G.HAVE_BLAS),
                int8_level=INT8_LEVELS.get(path, 0))


# ----------------------------------------------------------------------------- builders

def make_row(op, flags="", repeat=1, ub=0, acc=0, host=0, tile=0, length=0, height=0, width=0,
             reg=0, value=0):
    row = np.zeros(D.NCOLS, np.int64)
    row[D.COL_OP] = op
    row[D.COL_FLAGS] = ISA_TABLE.instructions["MMC" if op == D.OP_MMC else "ACT"].flag_bits(flags)
    row[D.COL_REPEAT] = repeat
    row[D.COL_UB], row[D.COL_ACC], row[D.COL_HOST], row[D.COL_TILE] = ub, acc, host, tile
    row[D.COL_LEN], row[D.COL_HEIGHT], row[D.COL_WIDTH] = length, height, width
    row[D.COL_REG], row[D.COL_VALUE] = reg, value
    return row


def make_regs(**values):
    regs = D.reset_registers()
    for name, v in values.items():
        regs[REG_NAMES[name]] = v
    return regs


class Machine:
    """Small machine state plus the arguments execute_instruction needs."""

    def __init__(self, n, ub_rows=64, acc_rows=64, host_rows=32, tiles=4, path=None,
                 chunk_rows=1024):
        self.n = n
        self.ub = RNG.integers(0, 256, (ub_rows, n), dtype=np.uint8)
        self.acc = RNG.integers(-2**31, 2**31, (acc_rows, n), dtype=np.int64).astype(np.int32)
        self.host = RNG.integers(0, 256, (host_rows, n), dtype=np.uint8)
        self.weights = RNG.integers(0, 256, (tiles, n, n), dtype=np.uint8)
        self.active = np.array([0, -1], np.int64)
        self.scratch = K.make_scratch(n, chunk_rows=chunk_rows, **path_options(path))

    def check(self, row, regs):
        info = np.zeros(3, np.int64)
        fault = K.check_instruction(row, regs, self.ub.shape[0], self.acc.shape[0],
                                    self.host.shape[0], self.weights.shape[0], info)
        return fault, tuple(int(v) for v in info)

    def run(self, row, regs, tiles=()):
        assert self.check(row, regs)[0] == K.FAULT_NONE
        K.execute_instruction(row, regs, self.ub, self.acc, self.host, self.weights,
                              np.asarray(tiles, np.int64), self.active, self.scratch, 0)


# ----------------------------------------------------------------------------- oracles

def wrap32(x):
    return ((np.asarray(x, np.int64) + 2**31) % 2**32 - 2**31).astype(np.int64)


def signed8(a):
    a = np.asarray(a, np.int64)
    return np.where(a >= 128, a - 256, a)


def input_vector(ub, r, flags):
    """The spec's x for the vector whose (low) row is UB row r."""
    if "H" in flags:
        hi = ub[r + 1].astype(np.int64)
        return ub[r].astype(np.int64) + 256 * (hi if "U" in flags else signed8(hi))
    return ub[r].astype(np.int64) if "U" in flags else signed8(ub[r])


def weight_values(weights, active, flags):
    if "D" in flags:
        hi = weights[active[1]].astype(np.int64)
        return weights[active[0]].astype(np.int64) + 256 * (hi if "W" in flags else signed8(hi))
    w = weights[active[0]].astype(np.int64)
    return w if "W" in flags else signed8(w)


def mmc_oracle(m, row, regs, flags, tiles):
    """New (acc, active) after the MMC, computed one vector at a time in int64."""
    acc = m.acc.astype(np.int64)
    active = list(m.active)
    reps = int(row[D.COL_REPEAT])
    per = 2 if "H" in flags else 1
    queue = list(tiles)
    for i in range(reps):
        if "S" in flags:
            active = [queue.pop(0), queue.pop(0) if "D" in flags else -1]
        w = weight_values(m.weights, active, flags)
        if "C" in flags:
            h, wd = int(row[D.COL_HEIGHT]), int(row[D.COL_WIDTH])
            pitch = int(regs[D.REG_CONV_PITCH]) or wd
            s, kw = int(regs[D.REG_CONV_STRIDE]), int(regs[D.REG_CONV_KW])
            dy, dx = divmod(i, kw)
            pairs = [(int(row[D.COL_UB]) + per * ((y * s + dy) * pitch + x * s + dx),
                      int(row[D.COL_ACC]) + y * wd + x) for y in range(h) for x in range(wd)]
            ow = "O" in flags and i == 0
        else:
            u0 = int(row[D.COL_UB] + i * regs[D.REG_REP_UB_STRIDE])
            a0 = int(row[D.COL_ACC] + i * regs[D.REG_REP_ACC_STRIDE])
            pairs = [(u0 + per * b, a0 + b) for b in range(int(row[D.COL_LEN]))]
            ow = "O" in flags and (i == 0 or regs[D.REG_REP_ACC_STRIDE] != 0)
        for u, a in pairs:
            out = wrap32(input_vector(m.ub, u, flags) @ w)
            acc[a] = out if ow else wrap32(acc[a] + out)
    return acc.astype(np.int32), active


def q8(x, f):
    """spec 5.5, element by element with Python ints."""
    if f < 8:
        t = x << (8 - f)
    elif f == 8:
        t = x
    else:
        t = (x + (1 << (f - 9))) >> (f - 8)
    return min(max(t, -4096), 4095)


def act_oracle(m, row, regs, flags):
    """New UB after the Activate; Python ints for the function and requantization."""
    ub = m.ub.copy()
    n = m.n
    g = lambda name: int(regs[REG_NAMES[name]])  # noqa: E731
    length = int(row[D.COL_LEN])
    for i in range(int(row[D.COL_REPEAT])):
        a0 = int(row[D.COL_ACC]) + i * g("rep_acc_stride")
        u0 = int(row[D.COL_UB]) + i * g("rep_ub_stride")
        x = m.acc[a0:a0 + length].astype(np.int64)
        if "R" in flags:
            x = np.maximum(x, 0)
        elif "Q" in flags or "T" in flags:
            table = SIGMOID_Q15 if "Q" in flags else TANH_Q15
            x = np.array([[table[q8(int(v), g("fn_in_frac")) + 4096] for v in r] for r in x],
                         np.int64).reshape(length, n)
        k, pw = g("pool_size"), g("pool_width")
        if "M" in flags or "A" in flags:
            if pw == 0:
                win = x.reshape(length // k, k, n)
            else:
                hgt = length // pw
                win = x.reshape(hgt // k, k, pw // k, k, n).transpose(0, 2, 1, 3, 4)
                win = win.reshape(-1, k * k, n)
            if "M" in flags:
                x = win.max(axis=1)
            else:
                cnt = win.shape[1]
                x = np.floor_divide(win.sum(axis=1) + cnt // 2, cnt)
        for o, vec in enumerate(x):
            ys = []
            for v in vec:
                y = int(v) * g("act_mult")
                if g("act_shift") > 0:
                    y = (y + (1 << (g("act_shift") - 1))) >> g("act_shift")
                # step 3's clip bounds (reset: the int32 range), before the output type
                ys.append(min(max(y + g("act_zero"), g("act_lo")), g("act_hi")))
            ys = np.array(ys, dtype=object)
            kind = g("act_out")
            if kind == 0:
                ub[u0 + o] = np.array([min(max(y, -128), 127) % 256 for y in ys], np.uint8)
            elif kind == 1:
                ub[u0 + o] = np.array([min(max(y, 0), 255) for y in ys], np.uint8)
            elif kind == 2:
                c = [min(max(y, -32768), 32767) % 65536 for y in ys]
                ub[u0 + 2 * o] = np.array([v % 256 for v in c], np.uint8)
                ub[u0 + 2 * o + 1] = np.array([v // 256 for v in c], np.uint8)
            else:
                ub[u0 + o] = np.array([y % 256 for y in ys], np.uint8)
    return ub


def dma_oracle(m, row, regs):
    """New (ub, host) after RHM/WHM/RHMA/WHMA, vector by vector."""
    ub, host = m.ub.copy(), m.host.copy()
    op = int(row[D.COL_OP])
    strided = op in (D.OP_RHMA, D.OP_WHMA)
    su = int(regs[D.REG_DMA_UB_STRIDE]) if strided else 1
    sh = int(regs[D.REG_DMA_HOST_STRIDE]) if strided else 1
    for i in range(int(row[D.COL_REPEAT])):
        for k in range(int(row[D.COL_LEN])):
            u = int(row[D.COL_UB]) + i * int(regs[D.REG_REP_UB_STRIDE]) + k * su
            h = int(row[D.COL_HOST]) + i * int(regs[D.REG_REP_HOST_STRIDE]) + k * sh
            if op in (D.OP_RHM, D.OP_RHMA):
                ub[u] = host[h]
            else:
                host[h] = ub[u]
    return ub, host


# ----------------------------------------------------------------------------- DMA

def test_rhm_hand_computed():
    m = Machine(8)
    m.host[3] = np.arange(8)
    m.host[4] = np.arange(8) + 100
    m.run(make_row(D.OP_RHM, ub=10, host=3, length=2), make_regs())
    assert m.ub[10].tolist() == list(range(8))
    assert m.ub[11].tolist() == [100 + i for i in range(8)]


@pytest.mark.parametrize("op", [D.OP_RHM, D.OP_WHM, D.OP_RHMA, D.OP_WHMA])
@pytest.mark.parametrize("strides", [
    dict(),
    dict(rep_ub_stride=5, rep_host_stride=3),
    dict(rep_ub_stride=-4, rep_host_stride=0, dma_ub_stride=2, dma_host_stride=-1),
    dict(dma_ub_stride=0, dma_host_stride=3, rep_ub_stride=1, rep_host_stride=-2),
    dict(dma_ub_stride=-3, dma_host_stride=0, rep_ub_stride=0, rep_host_stride=1),
])
def test_dma_against_oracle(op, strides):
    m = Machine(16)
    row = make_row(op, repeat=3, ub=30, host=12, length=4)
    regs = make_regs(**strides)
    want_ub, want_host = dma_oracle(m, row, regs)
    m.run(row, regs)
    assert np.array_equal(m.ub, want_ub)
    assert np.array_equal(m.host, want_host)


def test_rhma_zero_stride_later_vector_wins():
    m = Machine(8)
    m.host[0:3] = np.array([[1], [2], [3]], np.uint8)
    m.run(make_row(D.OP_RHMA, ub=5, host=0, length=3), make_regs(dma_ub_stride=0))
    assert (m.ub[5] == 3).all()


def test_whma_patch_scatter_spec_example():
    """spec 5.6: a 4x4 patch out of a 32-wide image, here in the write direction."""
    m = Machine(8, ub_rows=64, host_rows=200)
    row = make_row(D.OP_WHMA, repeat=4, ub=0, host=32 * 2 + 3, length=4)
    regs = make_regs(dma_host_stride=1, rep_host_stride=32, rep_ub_stride=4)
    before = m.host.copy()
    m.run(row, regs)
    for py in range(4):
        for px in range(4):
            assert np.array_equal(m.host[(2 + py) * 32 + 3 + px], m.ub[py * 4 + px])
    changed = np.flatnonzero((m.host != before).any(axis=1))
    assert all(r in [(2 + py) * 32 + 3 + px for py in range(4) for px in range(4)] for r in changed)


# ----------------------------------------------------------------------------- MatrixMultiply

def test_mmc_hand_computed():
    """2-element vectors: x = (1, -2) (bytes 1, 254), w = [[3, 4], [5, -1]]."""
    m = Machine(2, acc_rows=4)
    m.ub[0] = [1, 254]
    m.weights[2] = np.array([[3, 4], [5, 255]], np.uint8)
    m.acc[1] = [10, 20]
    m.run(make_row(D.OP_MMC, "S", ub=0, acc=1, length=1), make_regs(), tiles=[2])
    assert m.acc[1].tolist() == [10 + 3 - 10, 20 + 4 + 2]
    assert m.active.tolist() == [2, -1]
    m.run(make_row(D.OP_MMC, "OU", ub=0, acc=1, length=1), make_regs())
    assert m.acc[1].tolist() == [3 + 254 * 5, 4 - 254]          # x unsigned: (1, 254)
    m.run(make_row(D.OP_MMC, "OUW", ub=0, acc=1, length=1), make_regs())
    assert m.acc[1].tolist() == [3 + 254 * 5, 4 + 254 * 255]


def test_mmc_16bit_hand_computed():
    """H: x = lo + 256*hi (hi signed); D: w = lo + 256*hi (lo unsigned, hi signed)."""
    m = Machine(1, acc_rows=2)
    m.ub[0, 0], m.ub[1, 0] = 0x34, 0xFF            # x = 0x34 - 256 = -204
    m.weights[0, 0, 0], m.weights[1, 0, 0] = 0x80, 0x01   # w = 128 + 256 = 384
    m.run(make_row(D.OP_MMC, "SOHD", ub=0, acc=0, length=1), make_regs(), tiles=[0, 1])
    assert m.acc[0, 0] == -204 * 384
    assert m.active.tolist() == [0, 1]
    m.run(make_row(D.OP_MMC, "OHDUW", ub=0, acc=0, length=1), make_regs())
    assert m.acc[0, 0] == (0x34 + 256 * 0xFF) * 384


FLAG_COMBOS = ["".join(c) for c in itertools.product(["", "U"], ["", "W"], ["", "H"], ["", "D"])]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", FLAG_COMBOS)
@pytest.mark.parametrize("extra", ["S", "SO", "O", ""])
def test_mmc_all_flag_combinations(path, mode, extra):
    m = Machine(16, ub_rows=80, acc_rows=40, path=path)
    flags = extra + mode
    reps = 3
    row = make_row(D.OP_MMC, flags, repeat=reps, ub=4, acc=2, length=5)
    regs = make_regs(rep_ub_stride=11 if "H" in flags else 6, rep_acc_stride=7)
    m.active[:] = [1, 2] if "D" in flags else [1, -1]
    per = 2 if "D" in flags else 1
    tiles = list(RNG.integers(0, 4, reps * per)) if "S" in flags else []
    want_acc, want_active = mmc_oracle(m, row, regs, flags, tiles)
    m.run(row, regs, tiles)
    assert np.array_equal(m.acc, want_acc)
    assert m.active.tolist() == want_active


@pytest.mark.parametrize("acc_stride", [0, 5, -5])
@pytest.mark.parametrize("ub_stride", [0, 4, -4])
def test_mmc_repeat_strides_and_overwrite_rule(acc_stride, ub_stride):
    m = Machine(8, ub_rows=64, acc_rows=64)
    row = make_row(D.OP_MMC, "SO", repeat=4, ub=30, acc=30, length=4)
    regs = make_regs(rep_ub_stride=ub_stride, rep_acc_stride=acc_stride)
    tiles = [0, 3, 1, 2]
    want, _ = mmc_oracle(m, row, regs, "SO", tiles)
    m.run(row, regs, tiles)
    assert np.array_equal(m.acc, want)


def test_mmc_overwrite_then_accumulate_same_rows():
    """rep_acc_stride = 0: O only on iteration 0, later iterations add (a K reduction)."""
    m = Machine(4, acc_rows=4)
    m.ub[:6] = 1
    m.weights[:] = 1
    m.acc[:] = 1000
    m.run(make_row(D.OP_MMC, "SO", repeat=3, ub=0, acc=0, length=2),
          make_regs(rep_ub_stride=2), tiles=[0, 1, 2])
    assert (m.acc[:2] == 3 * 4).all()
    assert (m.acc[2:] == 1000).all()


def test_mmc_int32_wraparound():
    m = Machine(4, acc_rows=4)
    m.ub[0] = 127
    m.weights[0] = 127                          # out = 4 * 127 * 127 = 64516 per element
    m.acc[0] = 2**31 - 10
    m.acc[1] = -2**31
    m.run(make_row(D.OP_MMC, "S", ub=0, acc=0, length=1), make_regs(), tiles=[0])
    assert (m.acc[0].astype(np.int64) == 2**31 - 10 + 64516 - 2**32).all()
    m.ub[1] = 0x80                              # -128
    m.run(make_row(D.OP_MMC, "", ub=1, acc=1, length=1), make_regs())
    assert (m.acc[1].astype(np.int64) == -2**31 - 4 * 128 * 127 + 2**32).all()


def test_mmc_16x16_product_wraps_to_int32():
    """H+D products exceed int32 even before accumulation: exact, then wrapped."""
    m = Machine(16, acc_rows=2)
    m.ub[0], m.ub[1] = 0xFF, 0x7F               # x = 32767
    m.weights[0], m.weights[1] = 0xFF, 0x7F     # w = 32767
    m.acc[0] = 5
    m.run(make_row(D.OP_MMC, "SHD", ub=0, acc=0, length=1), make_regs(), tiles=[0, 1])
    assert (m.acc[0] == wrap32(5 + 16 * 32767 * 32767)).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("flags", ["CSO", "CS", "CO", "CSOH", "CSOUW", "CSD", "CSOHD"])
@pytest.mark.parametrize("conv", [
    dict(height=3, width=4, reps=9, kw=3, stride=1, pitch=6),
    dict(height=2, width=3, reps=4, kw=2, stride=2, pitch=0),
    dict(height=2, width=2, reps=5, kw=3, stride=2, pitch=7),
    dict(height=1, width=5, reps=3, kw=3, stride=1, pitch=0),
])
def test_mmc_convolve_against_oracle(path, flags, conv):
    m = Machine(16, ub_rows=160, acc_rows=32, tiles=12, path=path)
    row = make_row(D.OP_MMC, flags, repeat=conv["reps"], ub=3, acc=5, height=conv["height"],
                   width=conv["width"])
    regs = make_regs(conv_kw=conv["kw"], conv_stride=conv["stride"], conv_pitch=conv["pitch"],
                     rep_ub_stride=17, rep_acc_stride=9)       # rep strides unused by C
    m.active[:] = [1, 2] if "D" in flags else [1, -1]
    per = 2 if "D" in flags else 1
    tiles = list(RNG.integers(0, 12, conv["reps"] * per)) if "S" in flags else []
    want, want_active = mmc_oracle(m, row, regs, flags, tiles)
    m.run(row, regs, tiles)
    assert np.array_equal(m.acc, want)
    assert m.active.tolist() == want_active


def test_conv_3x3_is_a_convolution():
    """A whole 3x3 valid convolution, checked against a direct sum over the image."""
    n, h, w = 4, 3, 5
    m = Machine(n, ub_rows=64, acc_rows=32, tiles=9)
    img = RNG.integers(-128, 128, (h + 2, w + 2, n))
    m.ub[:(h + 2) * (w + 2)] = (img.reshape(-1, n) % 256).astype(np.uint8)
    kern = RNG.integers(-128, 128, (3, 3, n, n))
    m.weights[:] = (kern.reshape(9, n, n) % 256).astype(np.uint8)
    m.run(make_row(D.OP_MMC, "CSO", repeat=9, ub=0, acc=0, height=h, width=w),
          make_regs(conv_kw=3, conv_pitch=w + 2), tiles=list(range(9)))
    want = np.zeros((h, w, n), np.int64)
    for y, x, dy, dx in itertools.product(range(h), range(w), range(3), range(3)):
        want[y, x] += img[y + dy, x + dx] @ kern[dy, dx]
    assert np.array_equal(m.acc[:h * w], want.reshape(-1, n))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("flags", ["SO", "SOUW", "SOH", "SOD", "S", "SCO"])
def test_mmc_n256_chunked(path, flags):
    """Full-size array, more vectors than a staging chunk, mixed with accumulation."""
    m = Machine(256, ub_rows=1000, acc_rows=340, tiles=3, path=path, chunk_rows=128)
    if "C" in flags:
        row = make_row(D.OP_MMC, flags, repeat=4, ub=1, acc=2, height=10, width=30)
        regs = make_regs(conv_kw=2, conv_pitch=32)
    else:
        row = make_row(D.OP_MMC, flags, repeat=2, ub=1, acc=2, length=300)
        regs = make_regs(rep_ub_stride=(600 if "H" in flags else 300) // 2, rep_acc_stride=0)
    per = 2 if "D" in flags else 1
    tiles = [int(t) for t in RNG.integers(0, 3, int(row[D.COL_REPEAT]) * per)]
    want, _ = mmc_oracle(m, row, regs, flags, tiles)
    m.run(row, regs, tiles)
    assert np.array_equal(m.acc, want)


@pytest.mark.parametrize("path", PATHS)
def test_weight_cache_follows_tile_and_mode(path):
    """Reusing the cached conversion must not leak across tiles, U/W, or images."""
    m = Machine(16, acc_rows=8, path=path)
    for flags, tiles, active in [("SO", [0], None), ("O", [], None), ("SO", [1], None),
                                 ("OW", [], None), ("OU", [], None), ("O", [], None),
                                 ("OUW", [], None), ("SOD", [1, 2], None),
                                 ("SO", [1], None), ("O", [], [3, -1])]:
        if active is not None:
            m.active[:] = active
        row = make_row(D.OP_MMC, flags, ub=0, acc=0, length=3)
        want, _ = mmc_oracle(m, row, make_regs(), flags, tiles)
        m.run(row, make_regs(), tiles)
        assert np.array_equal(m.acc, want), flags
    m.weights[3, 2, 1] ^= 0x11              # modified in place: same address, same tile
    want, _ = mmc_oracle(m, make_row(D.OP_MMC, "O", length=3), make_regs(), "O", [])
    m.run(make_row(D.OP_MMC, "O", length=3), make_regs())
    assert np.array_equal(m.acc, want)
    other = m.weights.copy()                # a new weight image: same tile, other values
    other[1] ^= 0x5A
    m.active[:] = [1, -1]
    m.weights = other
    want, _ = mmc_oracle(m, make_row(D.OP_MMC, "O", length=3), make_regs(), "O", [])
    m.run(make_row(D.OP_MMC, "O", length=3), make_regs())
    assert np.array_equal(m.acc, want)


# ----------------------------------------------------------------------------- Activate

def act_machine(n=4, acc_rows=32):
    m = Machine(n, ub_rows=64, acc_rows=acc_rows)
    return m


def test_act_reset_saturates_and_relu():
    m = act_machine()
    m.acc[0] = [-300, -5, 100, 300]
    m.run(make_row(D.OP_ACT, "", acc=0, ub=0, length=1), make_regs())
    assert m.ub[0].view(np.int8).tolist() == [-128, -5, 100, 127]
    m.run(make_row(D.OP_ACT, "R", acc=0, ub=1, length=1), make_regs())
    assert m.ub[1].view(np.int8).tolist() == [0, 0, 100, 127]


def test_act_requant_rounds_half_up():
    m = act_machine()
    m.acc[0] = [3, -3, 5, -6]
    m.run(make_row(D.OP_ACT, "", acc=0, ub=0, length=1), make_regs(act_shift=1))
    assert m.ub[0].view(np.int8).tolist() == [2, -1, 3, -3]
    m.run(make_row(D.OP_ACT, "", acc=0, ub=1, length=1), make_regs(act_shift=2))
    assert m.ub[1].view(np.int8).tolist() == [1, -1, 1, -1]    # 0.75, -0.75, 1.25, -1.5
    m.run(make_row(D.OP_ACT, "", acc=0, ub=2, length=1),
          make_regs(act_mult=3, act_shift=1, act_zero=-2))
    assert m.ub[2].view(np.int8).tolist() == [3, -6, 6, -11]   # 4.5->5, -4.5->-4, 7.5->8, -9


def test_act_outputs():
    m = act_machine()
    m.acc[0] = [-40000, -129, 256, 40000]
    m.run(make_row(D.OP_ACT, "", acc=0, ub=0, length=1), make_regs(act_out=1))
    assert m.ub[0].tolist() == [0, 0, 255, 255]
    m.run(make_row(D.OP_ACT, "", acc=0, ub=1, length=1), make_regs(act_out=3))
    assert m.ub[1].tolist() == [(-40000) % 256, (-129) % 256, 0, 40000 % 256]
    m.run(make_row(D.OP_ACT, "", acc=0, ub=2, length=1), make_regs(act_out=2))
    int16 = m.ub[2].astype(np.int64) + 256 * m.ub[3].view(np.int8).astype(np.int64)
    assert int16.tolist() == [-32768, -129, 256, 32767]


def test_act_sigmoid_tanh_hand_values():
    m = act_machine()
    m.acc[0] = [0, 1 << 20, -(1 << 20), 256]
    m.run(make_row(D.OP_ACT, "Q", acc=0, ub=0, length=1), make_regs(act_out=2, fn_in_frac=8))
    q = m.ub[0].astype(np.int64) + 256 * m.ub[1].view(np.int8).astype(np.int64)
    assert q[:3].tolist() == [16384, 32767, 0]          # 32768 saturates in int16
    assert q[3] == round(32768 / (1 + np.exp(-1.0)))
    m.run(make_row(D.OP_ACT, "T", acc=0, ub=2, length=1),
          make_regs(act_shift=8, fn_in_frac=8))          # Q15 -> Q7 into int8
    assert m.ub[2].view(np.int8).tolist() == [0, 127, -128, round(128 * np.tanh(1.0))]


@pytest.mark.parametrize("frac", [0, 3, 7, 8, 9, 10, 16, 31])
@pytest.mark.parametrize("fn", ["Q", "T"])
def test_act_fn_in_frac(frac, fn):
    m = act_machine(n=16, acc_rows=8)
    m.acc[:4] = RNG.integers(-5000, 5000, (4, 16))
    m.acc[4, :8] = [2**31 - 1, -2**31, 1, -1, 2**(frac + 3) if frac < 28 else 7, -7, 128, 384]
    m.acc[4, 8:] = [(2 * j + 1) << max(frac - 9, 0) for j in range(-4, 4)]   # ties at f > 8
    row = make_row(D.OP_ACT, fn, acc=0, ub=0, length=5)
    regs = make_regs(fn_in_frac=frac, act_out=2)
    want = act_oracle(m, row, regs, fn)
    m.run(row, regs)
    assert np.array_equal(m.ub, want)


def test_act_pool_hand_computed():
    m = act_machine(n=2)
    m.acc[0:3] = [[-1, 4], [-2, 5], [-2, 7]]
    m.run(make_row(D.OP_ACT, "A", acc=0, ub=0, length=3), make_regs(pool_size=3))
    assert m.ub[0].view(np.int8).tolist() == [-2, 5]       # -5/3 -> -2, 16/3 -> 5
    m.run(make_row(D.OP_ACT, "A", acc=0, ub=1, length=2), make_regs(pool_size=2))
    assert m.ub[1].view(np.int8).tolist() == [-1, 5]       # -3/2 -> -1, 9/2 -> 5
    m.run(make_row(D.OP_ACT, "M", acc=0, ub=2, length=3), make_regs(pool_size=3))
    assert m.ub[2].view(np.int8).tolist() == [-1, 7]


@pytest.mark.parametrize("flags", ["M", "A", "RM", "RA", "QA", "TM"])
@pytest.mark.parametrize("pool", [(2, 0), (4, 0), (2, 4), (3, 6), (1, 0)])
def test_act_pooling_against_oracle(flags, pool):
    k, pw = pool
    m = act_machine(n=8, acc_rows=120)
    m.acc[:] = RNG.integers(-3000, 3000, m.acc.shape)
    length = pw * 2 * k if pw else 12 * k
    row = make_row(D.OP_ACT, flags, repeat=2, acc=1, ub=2, length=length)
    regs = make_regs(pool_size=k, pool_width=pw, rep_acc_stride=length, rep_ub_stride=20,
                     act_shift=4, fn_in_frac=6)
    want = act_oracle(m, row, regs, flags)
    m.run(row, regs)
    assert np.array_equal(m.ub, want)


@pytest.mark.parametrize("act_out", [0, 1, 2, 3])
@pytest.mark.parametrize("flags", ["", "R", "Q", "T"])
def test_act_requant_outputs_against_oracle(act_out, flags):
    m = act_machine(n=16, acc_rows=24)
    m.acc[:] = RNG.integers(-2**31, 2**31, m.acc.shape)
    m.acc[0, :4] = [2**31 - 1, -2**31, 0, -1]
    row = make_row(D.OP_ACT, flags, repeat=3, acc=0, ub=1, length=4)
    for regs in (make_regs(act_out=act_out, act_mult=-7, act_shift=3, act_zero=5,
                           rep_acc_stride=8, rep_ub_stride=-8 if act_out != 2 else 9),
                 make_regs(act_out=act_out, act_mult=2**31 - 1, act_shift=62, act_zero=-2**31,
                           rep_acc_stride=-0, rep_ub_stride=0),
                 make_regs(act_out=act_out, act_mult=-2**31, act_shift=33, fn_in_frac=12,
                           rep_acc_stride=1, rep_ub_stride=10)):
        ub0 = int(row[D.COL_UB])
        row[D.COL_UB] = 30 if regs[D.REG_REP_UB_STRIDE] < 0 else 1
        want = act_oracle(m, row, regs, flags)
        m.run(row, regs)
        assert np.array_equal(m.ub, want)
        row[D.COL_UB] = ub0


def test_act_n256():
    m = Machine(256, ub_rows=200, acc_rows=300)
    row = make_row(D.OP_ACT, "TA", acc=10, ub=3, length=256)
    regs = make_regs(pool_size=2, pool_width=16, act_shift=8, fn_in_frac=10, act_out=2)
    want = act_oracle(m, row, regs, "TA")
    m.run(row, regs)
    assert np.array_equal(m.ub, want)


# ----------------------------------------------------------------------------- checks

def fault_of(row, regs, ub_rows=100, acc_rows=50, host_rows=30, n_tiles=6):
    info = np.zeros(3, np.int64)
    f = K.check_instruction(row, regs, ub_rows, acc_rows, host_rows, n_tiles, info)
    return (f, tuple(int(v) for v in info)) if f else (f, None)


OK = (K.FAULT_NONE, None)


def addr(mem, a, lim):
    return (K.FAULT_ADDRESS, (mem, a, lim))


@pytest.mark.parametrize("op", [D.OP_RHM, D.OP_RHMA])
def test_check_read_host_boundaries(op):
    r = make_regs()
    assert fault_of(make_row(op, host=25, ub=0, length=5), r) == OK
    assert fault_of(make_row(op, host=26, ub=0, length=5), r) == addr(K.MEM_HOST, 30, 30)
    assert fault_of(make_row(op, host=0, ub=95, length=5), r) == OK
    assert fault_of(make_row(op, host=0, ub=96, length=5), r) == addr(K.MEM_UB, 100, 100)
    # host (the source) is reported before the UB in the same iteration
    assert fault_of(make_row(op, host=29, ub=99, length=2), r) == addr(K.MEM_HOST, 30, 30)
    assert fault_of(make_row(op, host=0, ub=0, length=1), r, host_rows=0) == \
        addr(K.MEM_HOST, 0, 0)


@pytest.mark.parametrize("op", [D.OP_WHM, D.OP_WHMA])
def test_check_write_host_boundaries(op):
    r = make_regs()
    assert fault_of(make_row(op, ub=95, host=25, length=5), r) == OK
    assert fault_of(make_row(op, ub=0, host=26, length=5), r) == addr(K.MEM_HOST, 30, 30)
    assert fault_of(make_row(op, ub=96, host=26, length=5), r) == addr(K.MEM_UB, 100, 100)


def test_check_repeat_strides_all_iterations():
    row = make_row(D.OP_RHM, repeat=4, host=0, ub=10, length=2)
    assert fault_of(row, make_regs(rep_ub_stride=29)) == OK            # last: 97..98
    assert fault_of(row, make_regs(rep_ub_stride=30)) == addr(K.MEM_UB, 100, 100)
    assert fault_of(row, make_regs(rep_ub_stride=-3)) == OK           # last: 1..2
    assert fault_of(row, make_regs(rep_ub_stride=-4)) == addr(K.MEM_UB, -2, 100)
    assert fault_of(row, make_regs(rep_host_stride=9)) == OK           # last: 27..28
    assert fault_of(row, make_regs(rep_host_stride=10)) == addr(K.MEM_HOST, 30, 30)


def test_check_strided_dma():
    row = make_row(D.OP_RHMA, host=5, ub=50, length=6)
    assert fault_of(row, make_regs(dma_host_stride=-1)) == OK          # 5..0
    assert fault_of(row, make_regs(dma_host_stride=-2)) == addr(K.MEM_HOST, -1, 30)
    assert fault_of(row, make_regs(dma_host_stride=5)) == addr(K.MEM_HOST, 30, 30)
    assert fault_of(row, make_regs(dma_host_stride=0, dma_ub_stride=-10)) == OK   # 50..0
    assert fault_of(row, make_regs(dma_ub_stride=-11)) == addr(K.MEM_UB, -5, 100)
    assert fault_of(row, make_regs(dma_ub_stride=10)) == addr(K.MEM_UB, 100, 100)
    assert fault_of(row, make_regs(dma_ub_stride=9)) == OK


def test_check_mmc_boundaries():
    r = make_regs()
    assert fault_of(make_row(D.OP_MMC, ub=90, acc=40, length=10), r) == OK
    assert fault_of(make_row(D.OP_MMC, ub=91, acc=0, length=10), r) == addr(K.MEM_UB, 100, 100)
    assert fault_of(make_row(D.OP_MMC, ub=0, acc=41, length=10), r) == addr(K.MEM_ACC, 50, 50)
    assert fault_of(make_row(D.OP_MMC, "H", ub=80, acc=0, length=10), r) == OK
    assert fault_of(make_row(D.OP_MMC, "H", ub=81, acc=0, length=10), r) == \
        addr(K.MEM_UB, 100, 100)
    row = make_row(D.OP_MMC, "S", repeat=3, ub=0, acc=0, length=10)
    assert fault_of(row, make_regs(rep_acc_stride=20)) == OK
    assert fault_of(row, make_regs(rep_acc_stride=21)) == addr(K.MEM_ACC, 50, 50)
    assert fault_of(row, make_regs(rep_ub_stride=45)) == OK                # 90..99
    assert fault_of(row, make_regs(rep_ub_stride=46)) == addr(K.MEM_UB, 100, 100)


def test_check_conv_boundaries():
    # taps up to (dy, dx) = (2, 2); last vector (3-1+2)*10 + (4-1) + 2 = 45
    row = make_row(D.OP_MMC, "CS", repeat=9, ub=54, acc=38, height=3, width=4)
    regs = make_regs(conv_kw=3, conv_pitch=10)
    assert fault_of(row, regs) == OK                                 # 54 + 45 = 99
    row[D.COL_UB] = 55                                              # tap 8, its vector (2, 3)
    assert fault_of(row, regs) == addr(K.MEM_UB, 100, 100)
    row[D.COL_UB] = 60                   # taps 0-5 fit; tap 6 = (2, 0): its row y=2 starts at 100
    assert fault_of(row, regs) == addr(K.MEM_UB, 100, 100)
    gaps = make_row(D.OP_MMC, "C", repeat=1, ub=0, acc=0, height=2, width=3)
    # vectors 0, 3, 6 then 60, 63, 66: the first out of 64 rows is 66
    assert fault_of(gaps, make_regs(conv_stride=3, conv_pitch=20), ub_rows=64) == \
        addr(K.MEM_UB, 66, 64)
    row[D.COL_UB] = 0
    row[D.COL_ACC] = 39
    assert fault_of(row, regs) == addr(K.MEM_ACC, 50, 50)
    wide = make_row(D.OP_MMC, "CH", repeat=1, ub=0, acc=0, height=2, width=5)
    wregs = make_regs(conv_stride=2, conv_pitch=20)
    assert fault_of(wide, wregs) == OK                   # v max 2*20 + 8 = 48 -> rows 96, 97
    wide[D.COL_UB] = 2                                   # rows 98, 99
    assert fault_of(wide, wregs) == OK
    wide[D.COL_UB] = 3                     # vector (1, 4): low row 99 fits, high row 100 does not
    assert fault_of(wide, wregs) == addr(K.MEM_UB, 100, 100)
    wide[D.COL_UB] = 5                     # row y=1 low rows 85, 89, 93, 97, 101
    assert fault_of(wide, wregs) == addr(K.MEM_UB, 101, 100)


def test_check_act_boundaries_and_shapes():
    r = make_regs()
    assert fault_of(make_row(D.OP_ACT, acc=40, ub=90, length=10), r) == OK
    assert fault_of(make_row(D.OP_ACT, acc=41, ub=0, length=10), r) == addr(K.MEM_ACC, 50, 50)
    assert fault_of(make_row(D.OP_ACT, acc=0, ub=91, length=10), r) == addr(K.MEM_UB, 100, 100)
    i16 = make_regs(act_out=2)
    assert fault_of(make_row(D.OP_ACT, acc=0, ub=80, length=10), i16) == OK
    assert fault_of(make_row(D.OP_ACT, acc=0, ub=81, length=10), i16) == addr(K.MEM_UB, 100, 100)
    pool = make_regs(pool_size=4)
    assert fault_of(make_row(D.OP_ACT, "M", acc=0, ub=99, length=8), pool) == \
        addr(K.MEM_UB, 100, 100)
    assert fault_of(make_row(D.OP_ACT, "M", acc=0, ub=98, length=8), pool) == OK
    assert fault_of(make_row(D.OP_ACT, "A", length=10), pool) == (K.FAULT_SHAPE, (10, 4, 0))
    assert fault_of(make_row(D.OP_ACT, "", length=10), pool) == OK     # no pooling flag
    two_d = make_regs(pool_size=2, pool_width=6)
    assert fault_of(make_row(D.OP_ACT, "M", length=24), two_d) == OK
    assert fault_of(make_row(D.OP_ACT, "M", length=18), two_d) == (K.FAULT_SHAPE, (18, 2, 6))
    assert fault_of(make_row(D.OP_ACT, "M", length=20), two_d) == (K.FAULT_SHAPE, (20, 2, 6))
    odd = make_regs(pool_size=4, pool_width=6)
    assert fault_of(make_row(D.OP_ACT, "A", length=24), odd) == (K.FAULT_SHAPE, (24, 4, 6))


def test_check_rw_and_cfg():
    assert fault_of(make_row(D.OP_RW, tile=5), make_regs()) == OK
    assert fault_of(make_row(D.OP_RW, tile=6), make_regs()) == addr(K.MEM_TILE, 6, 6)
    assert fault_of(make_row(D.OP_RW, tile=3, repeat=3), make_regs()) == OK
    assert fault_of(make_row(D.OP_RW, tile=3, repeat=4), make_regs()) == addr(K.MEM_TILE, 6, 6)
    lo, hi = D.register_limits()
    for reg in range(D.NREGS):
        assert fault_of(make_row(D.OP_CFG, reg=reg, value=lo[reg]), make_regs()) == OK
        assert fault_of(make_row(D.OP_CFG, reg=reg, value=hi[reg]), make_regs()) == OK
        if lo[reg] > -2**31:
            assert fault_of(make_row(D.OP_CFG, reg=reg, value=lo[reg] - 1), make_regs()) == \
                (K.FAULT_CONFIG, (reg, int(lo[reg]) - 1, 0))
        if hi[reg] < 2**31 - 1:
            assert fault_of(make_row(D.OP_CFG, reg=reg, value=hi[reg] + 1), make_regs()) == \
                (K.FAULT_CONFIG, (reg, int(hi[reg]) + 1, 0))
    bad = make_regs()
    bad[D.REG_POOL_SIZE] = 0
    assert fault_of(make_row(D.OP_ACT, length=1), bad) == (K.FAULT_CONFIG, (D.REG_POOL_SIZE, 0, 0))


def test_check_ignores_other_instructions():
    for op in (D.OP_NOP, D.OP_SYNC, D.OP_HLT, D.OP_WSYNC, D.OP_INT, D.OP_TAG):
        assert fault_of(make_row(op, ub=10**6, acc=10**6), make_regs()) == OK


# ----------------------------------------------------------------------------- footprints

def touched(row, regs):
    """{(mem, is_write): set of rows} from the spec, by enumeration."""
    op = int(row[D.COL_OP])
    flags = int(row[D.COL_FLAGS])
    reps = int(row[D.COL_REPEAT])
    g = lambda name: int(regs[REG_NAMES[name]])  # noqa: E731
    out = {}

    def add(mem, w, rows):
        out.setdefault((mem, w), set()).update(rows)

    length = int(row[D.COL_LEN])
    if op in (D.OP_RHM, D.OP_RHMA, D.OP_WHM, D.OP_WHMA):
        strided = op in (D.OP_RHMA, D.OP_WHMA)
        su, sh = (g("dma_ub_stride"), g("dma_host_stride")) if strided else (1, 1)
        read_host = op in (D.OP_RHM, D.OP_RHMA)
        for i in range(reps):
            add(K.MEM_HOST, not read_host, [int(row[D.COL_HOST]) + i * g("rep_host_stride")
                                            + k * sh for k in range(length)])
            add(K.MEM_UB, read_host, [int(row[D.COL_UB]) + i * g("rep_ub_stride") + k * su
                                      for k in range(length)])
    elif op == D.OP_MMC:
        per = 2 if flags & D.MMC_WIDE_IN else 1
        for i in range(reps):
            if flags & D.MMC_CONV:
                h, w = int(row[D.COL_HEIGHT]), int(row[D.COL_WIDTH])
                pitch = g("conv_pitch") or w
                dy, dx = divmod(i, g("conv_kw"))
                s = g("conv_stride")
                vs = [(y * s + dy) * pitch + x * s + dx for y in range(h) for x in range(w)]
                accs = [int(row[D.COL_ACC]) + j for j in range(h * w)]
                u0 = int(row[D.COL_UB])
            else:
                vs = list(range(length))
                u0 = int(row[D.COL_UB]) + i * g("rep_ub_stride")
                accs = [int(row[D.COL_ACC]) + i * g("rep_acc_stride") + b for b in range(length)]
            add(K.MEM_UB, False, [u0 + per * v + e for v in vs for e in range(per)])
            add(K.MEM_ACC, True, accs)
    return out


def footprint_of(row, regs):
    out = np.full((8, 4), -99, np.int64)
    n = K.footprint(row, regs, out)
    return {(int(e[0]), bool(e[1])): (int(e[2]), int(e[3])) for e in out[:n]}


@pytest.mark.parametrize("row, regs", [
    (make_row(D.OP_RHM, repeat=3, host=4, ub=10, length=5), make_regs(rep_ub_stride=-7,
                                                                     rep_host_stride=2)),
    (make_row(D.OP_WHM, repeat=2, host=4, ub=10, length=5), make_regs(rep_ub_stride=3)),
    (make_row(D.OP_RHMA, repeat=3, host=40, ub=10, length=5),
     make_regs(dma_host_stride=-3, dma_ub_stride=0, rep_ub_stride=2, rep_host_stride=1)),
    (make_row(D.OP_WHMA, repeat=1, host=40, ub=10, length=4),
     make_regs(dma_host_stride=5, dma_ub_stride=-2)),
    (make_row(D.OP_MMC, "S", repeat=4, ub=20, acc=9, length=6),
     make_regs(rep_ub_stride=-5, rep_acc_stride=6)),
    (make_row(D.OP_MMC, "H", repeat=2, ub=20, acc=9, length=6), make_regs(rep_ub_stride=12)),
])
def test_footprint_is_exact_bounding_range(row, regs):
    fp = footprint_of(row, regs)
    want = touched(row, regs)
    assert set(fp) == set(want)
    for key, rows in want.items():
        assert fp[key] == (min(rows), max(rows) + 1)


@pytest.mark.parametrize("reps, kw, h, w, stride, pitch, flags", [
    (9, 3, 3, 4, 1, 6, "CS"), (4, 2, 2, 3, 2, 0, "C"), (5, 3, 2, 2, 2, 7, "CH"),
    (2, 3, 4, 4, 1, 0, "CSO")])
def test_footprint_conv_covers_every_row(reps, kw, h, w, stride, pitch, flags):
    row = make_row(D.OP_MMC, flags, repeat=reps, ub=7, acc=3, height=h, width=w)
    regs = make_regs(conv_kw=kw, conv_stride=stride, conv_pitch=pitch)
    fp = footprint_of(row, regs)
    for key, rows in touched(row, regs).items():
        start, stop = fp[key]
        assert start <= min(rows) and max(rows) < stop
    assert fp[(K.MEM_ACC, True)] == (3, 3 + h * w)


def test_footprint_act_and_others():
    assert footprint_of(make_row(D.OP_ACT, repeat=2, acc=5, ub=9, length=8),
                        make_regs(rep_acc_stride=8, rep_ub_stride=-4, act_out=2,
                                  pool_size=2)) == {(K.MEM_ACC, False): (5, 21),
                                                    (K.MEM_UB, True): (5, 25)}
    assert footprint_of(make_row(D.OP_ACT, "M", acc=5, ub=9, length=8),
                        make_regs(pool_size=2, pool_width=4)) == {(K.MEM_ACC, False): (5, 13),
                                                                  (K.MEM_UB, True): (9, 11)}
    for op in (D.OP_NOP, D.OP_RW, D.OP_CFG, D.OP_SYNC, D.OP_HLT):
        assert footprint_of(make_row(op, tile=3, length=4), make_regs()) == {}


def test_non_state_instructions_are_noops():
    m = Machine(8)
    before = (m.ub.copy(), m.acc.copy(), m.host.copy())
    for op in (D.OP_NOP, D.OP_RW, D.OP_CFG, D.OP_SYNC, D.OP_HLT, D.OP_TAG):
        m.run(make_row(op, tile=1, reg=1, value=3), make_regs())
    assert all(np.array_equal(a, b) for a, b in zip(before, (m.ub, m.acc, m.host)))


def test_read_only_weight_image():
    """Machine.load maps the weight image read-only (np.load mmap_mode='r')."""
    m = Machine(8)
    m.weights.setflags(write=False)
    row = make_row(D.OP_MMC, "SO", repeat=2, ub=3, acc=4, length=5)
    regs = make_regs(rep_acc_stride=5)
    want, _ = mmc_oracle(m, row, regs, "SO", [2, 3])
    m.run(row, regs, [2, 3])
    assert np.array_equal(m.acc, want)


# ----------------------------------------------------------------------------- randomized

def accesses(row, regs):
    """Every (memory, row) the instruction touches, in the spec's execution order (section 7:
    per iteration the source, then the destination; vectors in order; low row first)."""
    op = int(row[D.COL_OP])
    flags = int(row[D.COL_FLAGS])
    g = lambda name: int(regs[REG_NAMES[name]])  # noqa: E731
    length = int(row[D.COL_LEN])
    for i in range(int(row[D.COL_REPEAT])):
        if op in (D.OP_RHM, D.OP_RHMA, D.OP_WHM, D.OP_WHMA):
            strided = op in (D.OP_RHMA, D.OP_WHMA)
            su, sh = (g("dma_ub_stride"), g("dma_host_stride")) if strided else (1, 1)
            host = [(K.MEM_HOST, int(row[D.COL_HOST]) + i * g("rep_host_stride") + k * sh)
                    for k in range(length)]
            ub = [(K.MEM_UB, int(row[D.COL_UB]) + i * g("rep_ub_stride") + k * su)
                  for k in range(length)]
            yield from (host + ub) if op in (D.OP_RHM, D.OP_RHMA) else (ub + host)
        elif op == D.OP_MMC:
            per = 2 if flags & D.MMC_WIDE_IN else 1
            if flags & D.MMC_CONV:
                h, w = int(row[D.COL_HEIGHT]), int(row[D.COL_WIDTH])
                pitch = g("conv_pitch") or w
                dy, dx = divmod(i, g("conv_kw"))
                s = g("conv_stride")
                vs = [(y * s + dy) * pitch + x * s + dx for y in range(h) for x in range(w)]
                u0, a0, count = int(row[D.COL_UB]), int(row[D.COL_ACC]), h * w
            else:
                vs = range(length)
                u0 = int(row[D.COL_UB]) + i * g("rep_ub_stride")
                a0, count = int(row[D.COL_ACC]) + i * g("rep_acc_stride"), length
            yield from ((K.MEM_UB, u0 + per * v + e) for v in vs for e in range(per))
            yield from ((K.MEM_ACC, a0 + b) for b in range(count))
        elif op == D.OP_ACT:
            k, pw = g("pool_size"), g("pool_width")
            pooled = flags & (D.ACT_MAXPOOL | D.ACT_AVGPOOL)
            out = length if not pooled else (length // k if pw == 0 else length // (k * k))
            per = 2 if g("act_out") == 2 else 1
            yield from ((K.MEM_ACC, int(row[D.COL_ACC]) + i * g("rep_acc_stride") + b)
                        for b in range(length))
            yield from ((K.MEM_UB, int(row[D.COL_UB]) + i * g("rep_ub_stride") + b)
                        for b in range(per * out))


def random_instruction(rng, n_ub, n_acc, n_host):
    kind = rng.choice(["RHM", "RHMA", "WHM", "WHMA", "MMC", "MMC.C", "ACT"])
    regs = make_regs(rep_ub_stride=int(rng.integers(-6, 7)), rep_acc_stride=int(rng.integers(-6, 7)),
                     rep_host_stride=int(rng.integers(-6, 7)),
                     dma_ub_stride=int(rng.integers(-3, 4)), dma_host_stride=int(rng.integers(-3, 4)))
    reps = int(rng.integers(1, 5))
    if kind in ("RHM", "RHMA", "WHM", "WHMA"):
        op = getattr(D, "OP_" + kind)
        return make_row(op, repeat=reps, ub=int(rng.integers(0, n_ub)),
                        host=int(rng.integers(0, n_host)), length=int(rng.integers(1, 8))), regs, ""
    if kind == "MMC":
        flags = "".join(c for c in "SOUWHD" if rng.random() < 0.5)
        return make_row(D.OP_MMC, flags, repeat=reps, ub=int(rng.integers(0, n_ub)),
                        acc=int(rng.integers(0, n_acc)), length=int(rng.integers(1, 8))), regs, flags
    if kind == "MMC.C":
        flags = "C" + "".join(c for c in "SOUWHD" if rng.random() < 0.5)
        regs[D.REG_CONV_KW] = int(rng.integers(1, 4))
        regs[D.REG_CONV_STRIDE] = int(rng.integers(1, 3))
        regs[D.REG_CONV_PITCH] = int(rng.integers(0, 9))
        return make_row(D.OP_MMC, flags, repeat=int(rng.integers(1, 7)),
                        ub=int(rng.integers(0, n_ub)), acc=int(rng.integers(0, n_acc)),
                        height=int(rng.integers(1, 4)), width=int(rng.integers(1, 4))), regs, flags
    flags = str(rng.choice(["", "R", "Q", "T"])) + str(rng.choice(["", "M", "A"]))
    regs[D.REG_POOL_SIZE] = int(rng.integers(1, 4))
    regs[D.REG_POOL_WIDTH] = int(rng.choice([0, 0, 2, 3, 4, 6]))
    regs[D.REG_ACT_OUT] = int(rng.integers(0, 4))
    regs[D.REG_ACT_SHIFT] = int(rng.integers(0, 12))
    regs[D.REG_ACT_MULT] = int(rng.integers(-300, 300))
    regs[D.REG_ACT_ZERO] = int(rng.integers(-50, 50))
    regs[D.REG_FN_IN_FRAC] = int(rng.integers(0, 16))
    return make_row(D.OP_ACT, flags, repeat=reps, ub=int(rng.integers(0, n_ub)),
                    acc=int(rng.integers(0, n_acc)), length=int(rng.integers(1, 13))), regs, flags


def test_random_instructions_against_oracles():
    """Random instructions on a tiny machine: the fault (and its address) equals the first
    out-of-range access of the spec's enumeration; otherwise the state equals the oracle."""
    rng = np.random.default_rng(99)
    seen = {K.FAULT_NONE: 0, K.FAULT_ADDRESS: 0, K.FAULT_SHAPE: 0}
    for _ in range(600):
        m = Machine(4, ub_rows=40, acc_rows=24, host_rows=20, tiles=6)
        m.acc[:] = RNG.integers(-5000, 5000, m.acc.shape)
        row, regs, flags = random_instruction(rng, 40, 24, 20)
        fault, info = m.check(row, regs)
        seen[fault] += 1
        if fault == K.FAULT_SHAPE:
            assert row[D.COL_OP] == D.OP_ACT
            continue
        limits = {K.MEM_UB: 40, K.MEM_ACC: 24, K.MEM_HOST: 20}
        first_bad = next(((mem, a, limits[mem]) for mem, a in accesses(row, regs)
                          if not 0 <= a < limits[mem]), None)
        if first_bad is not None:
            assert (fault, info) == (K.FAULT_ADDRESS, first_bad), (row, regs)
            continue
        assert fault == K.FAULT_NONE
        op = int(row[D.COL_OP])
        if op == D.OP_MMC:
            m.active[:] = [1, 2] if "D" in flags else [1, -1]
            per = 2 if "D" in flags else 1
            tiles = [int(t) for t in rng.integers(0, 6, int(row[D.COL_REPEAT]) * per)] \
                if "S" in flags else []
            want, want_active = mmc_oracle(m, row, regs, flags, tiles)
            m.run(row, regs, tiles)
            assert np.array_equal(m.acc, want) and m.active.tolist() == want_active
        elif op == D.OP_ACT:
            want = act_oracle(m, row, regs, flags)
            m.run(row, regs)
            assert np.array_equal(m.ub, want)
        else:
            want_ub, want_host = dma_oracle(m, row, regs)
            m.run(row, regs)
            assert np.array_equal(m.ub, want_ub) and np.array_equal(m.host, want_host)
        fp = footprint_of(row, regs)
        for mem, a in accesses(row, regs):
            assert any(k[0] == mem and lo <= a < hi for k, (lo, hi) in fp.items())
    assert min(seen.values()) > 20, seen


# ----------------------------------------------------------------------------- OpenTPU profile

def run_opentpu(m, row, regs):
    assert m.check(row, regs)[0] == K.FAULT_NONE
    K.execute_instruction(row, regs, m.ub, m.acc, m.host, m.weights, np.zeros(0, np.int64),
                          m.active, m.scratch, K.PROFILE_OPENTPU)


def test_opentpu_activate_low_8_bits_and_sigmoid():
    """spec/opentpu.md section 4, its worked example and the sigmoid step table."""
    m = Machine(4, ub_rows=8, acc_rows=8)
    m.acc[0] = [200, -2, 6, 0]
    regs = make_regs(act_mult=3, act_shift=2, act_zero=9, act_out=2)     # all ignored
    run_opentpu(m, make_row(D.OP_ACT, "", acc=0, ub=1, length=1), regs)
    run_opentpu(m, make_row(D.OP_ACT, "Q", acc=0, ub=2, length=1), regs)
    run_opentpu(m, make_row(D.OP_ACT, "R", acc=0, ub=3, length=1), regs)
    assert m.ub[1:4].tolist() == [[200, 254, 6, 0], [255, 30, 254, 127], [200, 0, 6, 0]]
    xs = [-2**31, -2**31 + 1, -710, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 36, 37,
          2**31 - 1]
    want = [255, 0, 0, 0, 1, 4, 12, 30, 68, 127, 186, 224, 242, 250, 253, 254, 254, 255, 255]
    m = Machine(len(xs), ub_rows=2, acc_rows=1)
    m.acc[0] = xs
    run_opentpu(m, make_row(D.OP_ACT, "Q", acc=0, ub=0, length=1), make_regs())
    assert m.ub[0].tolist() == want


def test_opentpu_profile_changes_only_activate():
    m = Machine(8)
    twin = Machine(8)
    twin.ub[:], twin.acc[:], twin.host[:], twin.weights[:] = m.ub, m.acc, m.host, m.weights
    row = make_row(D.OP_MMC, "SO", repeat=2, ub=1, acc=2, length=4)
    regs = make_regs(rep_acc_stride=4, act_out=2)
    m.run(row, regs, [1, 2])
    K.execute_instruction(row, regs, twin.ub, twin.acc, twin.host, twin.weights,
                          np.array([1, 2], np.int64), twin.active, twin.scratch, K.PROFILE_OPENTPU)
    assert np.array_equal(m.acc, twin.acc)
    # act_out = 2 writes two rows per vector in the tpu profile only
    act = make_row(D.OP_ACT, "R", acc=0, ub=60, length=4)
    info = np.zeros(3, np.int64)
    assert K.check_instruction(act, regs, 64, 64, 32, 4, info) == K.FAULT_ADDRESS
    assert K.check_instruction(act, regs, 64, 64, 32, 4, info, K.PROFILE_OPENTPU) == K.FAULT_NONE
    out = np.zeros((8, 4), np.int64)
    assert K.footprint(act, regs, out, K.PROFILE_OPENTPU) == 2
    assert out[1].tolist() == [K.MEM_UB, 1, 60, 64]
    assert K.footprint(act, regs, out) == 2 and out[1].tolist() == [K.MEM_UB, 1, 60, 68]


@pytest.mark.parametrize("path", PATHS)
def test_mmc_array_larger_than_256_stays_exact(path):
    """N = 512 unsigned: sums reach 512 * 255 * 255 > 2^24, past float32's exact range."""
    m = Machine(512, ub_rows=4, acc_rows=4, tiles=1, path=path)
    m.ub[:] = 255
    m.ub[1, 0] = 254
    m.weights[0] = 255
    m.weights[0, 3, 1] = 254
    for flags in ("SOUW", "SO", "SOU"):
        row = make_row(D.OP_MMC, flags, ub=0, acc=0, length=3)
        want, _ = mmc_oracle(m, row, make_regs(), flags, [0])
        m.run(row, make_regs(), [0])
        assert np.array_equal(m.acc, want), flags


def test_avg_pool_division_is_exact_at_extremes():
    """Window sums near +-2^31 * count and right at multiples of count (where a float
    quotient could land on the wrong side of an integer)."""
    n = 64
    rng = np.random.default_rng(5)
    for k, pw in ((3, 0), (7, 0), (3, 3), (16, 16), (2, 0)):
        count = k if pw == 0 else k * k
        m = Machine(n, ub_rows=2, acc_rows=count)
        vals = rng.choice([2**31 - 1, -2**31, 2**31 - 2, -2**31 + 1, 0, 1, -1], (count, n))
        vals[:, :8] = np.array([2**31 - 1, -2**31, -1, 1, -2, 2, 12345, -12345])[None, :]
        target = rng.integers(-2**31 // 2, 2**31 // 2, n) * count   # sums at exact multiples
        vals[:, 8:16] = (target[8:16] // count)[None, :]
        vals[0, 16:24] += np.array([count // 2, -(count // 2), count // 2 - 1, 1 - count // 2,
                                    0, 1, -1, count])
        vals = np.clip(vals, -2**31, 2**31 - 1)
        m.acc[:] = vals.astype(np.int32)
        row = make_row(D.OP_ACT, "A", acc=0, ub=0, length=count)
        regs = make_regs(pool_size=k, pool_width=pw, act_out=3, act_mult=1)
        sums = vals.astype(object).sum(axis=0)
        want = [((int(s) + count // 2) // count) % 256 for s in sums]
        m.run(row, regs)
        assert m.ub[0].tolist() == want, (k, pw)

"""Work shared among the int8 kernel's threads (mmc_int8.c's pool): the plain Activate on the
pool (native.act_rows) against a numpy int64 oracle and against the numba Activate
(kernels._execute_act), and whole MatrixMultiply + Activate programs large enough to be
shared giving the same bytes on several threads as on one and on the float path."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.binary import Program
from tpuasm.encoding import Instruction
from tpuasm.isa import ISA_TABLE
from tpuasm.machine import Machine
from tpuasm.machine import decoded as D
from tpuasm.machine import kernels as K
from tpuasm.machine import native

needs_int8 = pytest.mark.skipif(native.cpu_level() == native.LEVEL_NONE,
                                reason="no AVX2 or no C compiler on this machine")
LEVELS = [level for level in (native.LEVEL_AVX2, native.LEVEL_VNNI)
          if level <= native.cpu_level()]
OUT_RANGE = {D.ACT_OUT_INT8: (-128, 127), D.ACT_OUT_UINT8: (0, 255),
             D.ACT_OUT_INT16: (-32768, 32767), D.ACT_OUT_WRAP8: None}


def activate_oracle(acc, relu, mult, shift, zero, out_kind):
    """spec/isa.md 5.5 without pooling or extensions: the UB rows.  numpy int64 is exact
    here: |v * mult| <= 2^62 and the rounding term is below 2^61."""
    v = acc.astype(np.int64)
    if relu:
        v = np.maximum(v, 0)
    rounding = 1 << (shift - 1) if shift > 0 else 0
    y = ((v * np.int64(mult) + rounding) >> shift) + zero     # >>: floor, as the spec's
    bounds = OUT_RANGE[out_kind]
    if bounds is not None:
        y = np.clip(y, *bounds)
    if out_kind == D.ACT_OUT_INT16:
        out = np.empty((2 * len(acc), acc.shape[1]), np.uint8)
        out[0::2], out[1::2] = y & 0xFF, (y >> 8) & 0xFF
        return out
    return (y & 0xFF).astype(np.uint8)


def extreme_acc(rng, m, n):
    acc = rng.integers(-(1 << 31), 1 << 31, (m, n), dtype=np.int64)
    acc[0, :4] = [-(1 << 31), (1 << 31) - 1, 0, -1]
    acc[m // 2] = rng.integers(-300, 300, n)               # values near the output ranges
    return acc.astype(np.int32)


@needs_int8
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("out_kind", sorted(OUT_RANGE))
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("mult, shift, zero", [
    (1, 0, 0), (3, 1, -7), (-(1 << 31), 62, (1 << 31) - 1), ((1 << 31) - 1, 33, -(1 << 31)),
    (12345, 17, 100)])
@pytest.mark.parametrize("m, n, threads", [(1, 16, 1), (65, 48, 1), (700, 256, 3)])
def test_pooled_activate_matches_the_oracle(level, out_kind, relu, mult, shift, zero, m, n,
                                            threads):
    """Every output type, ReLU or none, multipliers, shifts and zero points at their register
    limits, int32 extremes, row counts around the 64-row blocks, on one thread and shared;
    rows outside the instruction's stay untouched."""
    rng = np.random.default_rng(m * 7 + n + shift)
    acc = extreme_acc(rng, m + 3, n)
    per = 2 if out_kind == D.ACT_OUT_INT16 else 1
    ub = rng.integers(0, 256, (per * m + 5, n), dtype=np.uint8)
    before = ub.copy()
    native.act_rows(acc, 2, ub, 3, m, relu, mult, shift, zero, out_kind, level, threads)
    assert np.array_equal(ub[3:3 + per * m],
                          activate_oracle(acc[2:2 + m], relu, mult, shift, zero, out_kind))
    assert np.array_equal(ub[:3], before[:3]) and np.array_equal(ub[3 + per * m:],
                                                                 before[3 + per * m:])


def act_row(length, flags, repeat=1, acc=0, ub=0):
    row = np.zeros(D.NCOLS, np.int64)
    row[D.COL_OP], row[D.COL_FLAGS], row[D.COL_REPEAT], row[D.COL_LEN] = \
        D.OP_ACT, flags, repeat, length
    row[D.COL_ACC], row[D.COL_UB] = acc, ub
    return row


@needs_int8
@pytest.mark.parametrize("profile", [K.PROFILE_TPU, K.PROFILE_OPENTPU])
@pytest.mark.parametrize("flags, out_kind", [(D.ACT_RELU, D.ACT_OUT_INT8), (0, D.ACT_OUT_INT16),
                                             (D.ACT_RELU, D.ACT_OUT_UINT8),
                                             (D.ACT_SIGMOID, D.ACT_OUT_INT8)])
@pytest.mark.parametrize("ub_stride", [0, 100, 300])
def test_pooled_activate_equals_the_numba_activate(profile, flags, out_kind, ub_stride):
    """execute_instruction with the kernel on 3 threads against the same Activate without
    the kernel (_execute_act): repeated iterations whose UB rows coincide (stride 0: the
    last one wins), overlap (100) or not (300); a sigmoid stays on _execute_act."""
    rng = np.random.default_rng(ub_stride + flags)
    n, length, repeat = 256, 150, 3
    acc = extreme_acc(rng, 700, n)
    ub0 = rng.integers(0, 256, (1200, n), dtype=np.uint8)
    regs = D.reset_registers()
    regs[D.REG_ACT_MULT], regs[D.REG_ACT_SHIFT], regs[D.REG_ACT_ZERO] = 77, 9, -3
    regs[D.REG_ACT_OUT] = out_kind
    regs[D.REG_REP_ACC_STRIDE], regs[D.REG_REP_UB_STRIDE] = 200, ub_stride
    row = act_row(length, flags, repeat, acc=50, ub=10)
    results = []
    for scratch in (K.make_scratch(n, int8_level=0),
                    K.make_scratch(n, int8_level=native.cpu_level(), int8_threads=3)):
        ub = ub0.copy()
        K.execute_instruction(row, regs, ub, acc.copy(), ub, np.zeros((1, n, n), np.uint8),
                              np.zeros(0, np.int64), np.array([-1, -1]), scratch, profile)
        results.append(ub)
    assert np.array_equal(results[0], results[1])
    assert not np.array_equal(results[0], ub0)


def I(key, flags="", repeat=1, **operands):
    spec = ISA_TABLE.instructions[key]
    return Instruction(key, spec.flag_bits(flags), repeat, dict(operands))


def cfg(name, value):
    return I("CFG", reg=ISA_TABLE.registers[name].index, value=value)


def wide_mlp(layers, blocks, batch):
    """bench_emulator.py's MLP: `layers` layers of (blocks*256)-wide weights over `batch`
    rows, each output block the sum of `blocks` MatrixMultiplies, then one ReLU Activate
    (requantized by a shift, so the layers stay informative)."""
    out = [cfg("act_mult", 1), cfg("act_shift", 9)]
    region = blocks * batch
    for layer in range(layers):
        src, dst = (0, region) if layer % 2 == 0 else (region, 0)
        for j in range(blocks):
            for k in range(blocks):
                out += [I("RW", tile=(layer * blocks + k) * blocks + j),
                        I("MMC", "SO" if k == 0 else "S", ub=src + k * batch, acc=j * batch,
                          length=batch)]
            out.append(I("ACT", "R", acc=j * batch, ub=dst + j * batch, length=batch))
    return Program(out + [I("HLT")])


def mlp_oracle(x, tiles, layers, blocks):
    a = x.astype(np.float64)       # float64 products are exact (|sum| < 2^53) and fast
    for layer in range(layers):
        w = np.block([[tiles[(layer * blocks + k) * blocks + j].astype(np.float64)
                       for j in range(blocks)] for k in range(blocks)])
        p = (a @ w).astype(np.int64)
        a = np.clip((np.maximum(p, 0) + 256) >> 9, -128, 127).astype(np.float64)
    return a.astype(np.int64), p


def run_mlp(monkeypatch, threads, int8, x, tiles, layers, blocks, batch):
    monkeypatch.setenv("TPUASM_INT8_THREADS", threads)
    monkeypatch.setenv("TPUASM_INT8", int8)
    m = Machine()
    m.load(wide_mlp(layers, blocks, batch), weights=tiles)
    m.ub[:blocks * batch] = np.concatenate(
        [x[:, k * 256:(k + 1) * 256] for k in range(blocks)]).view(np.uint8)
    assert m.run().status == "halted"
    return m


@needs_int8
def test_a_large_mlp_is_the_same_on_several_threads_as_on_one(monkeypatch):
    """Every MatrixMultiply (2,048 rows: one job) and every Activate over the pool's
    thresholds: two and three threads give the bytes one thread gives, and the numpy
    oracle's last layer (the float path's Activate is compared with the pool's in
    test_pooled_activate_equals_the_numba_activate)."""
    layers, blocks, batch = 3, 2, 2048
    rng = np.random.default_rng(11)
    tiles = rng.integers(-128, 128, (layers * blocks * blocks, 256, 256)).astype(np.int8)
    x = rng.integers(-128, 128, (batch, blocks * 256)).astype(np.int8)
    runs = [run_mlp(monkeypatch, t, i, x, tiles, layers, blocks, batch)
            for t, i in (("1", ""), ("2", ""), ("3", ""))]
    assert batch * 256 * 256 >= 1 << 23 and batch * 256 >= 1 << 17     # shared by the pool
    out, products = mlp_oracle(x, tiles, layers, blocks)
    one = runs[0]
    region = (layers % 2) * blocks * batch
    got = np.concatenate([one.ub[region + j * batch:region + (j + 1) * batch]
                          for j in range(blocks)], axis=1)
    assert np.array_equal(got.view(np.int8), out)
    assert np.array_equal(np.concatenate([one.acc[j * batch:(j + 1) * batch]
                                          for j in range(blocks)], axis=1),
                          ((products + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32))
    for m in runs[1:]:
        assert np.array_equal(m.ub, one.ub) and np.array_equal(m.acc, one.acc)
        assert m.cycle == one.cycle and m.counters() == one.counters()

"""Activate's row-at-a-time kernels (kernels._act_fast, _act_dense_float) against the
general element-by-element loop of _execute_act_ext on the same state: random registers
over pooling (1-D, 2-D, strided and padded, rectangular windows with a stride and padding
per axis, counting the padding or not), accumulators
whose last columns are zero (the skip of such columns), P's per-column
parameters in float and in fixed point, the act_mult/act_shift registers, the clip bounds,
the output types (int16's two rows too), L's table, act_ub_pitch and every function; accumulators drawn
with extreme values.  (The general loop itself is held to the spec by test_isa_extensions
and, through the pipeline, to the reference model by test_differential.)"""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.isa import ISA_TABLE
from tpuasm.machine import decoded as D
from tpuasm.machine import kernels as K

N = 48                  # three 16-column blocks: the zero-column skip has room
FNS = {"": K._FN_NONE, "R": K._FN_RELU, "Q": K._FN_SIGMOID, "T": K._FN_TANH}
POOLS = {"": K._POOL_NONE, "M": K._POOL_MAX, "A": K._POOL_AVG}


def _accumulators(rng, rows):
    acc = rng.integers(-2 ** 31, 2 ** 31, (rows, N), dtype=np.int64)
    small = rng.integers(-3000, 3000, (rows, N))
    pick = rng.random((rows, N))
    acc = np.where(pick < 0.6, small, acc)
    acc[pick > 0.95] = rng.choice([-2 ** 31, 2 ** 31 - 1, 0, -1, 1], int((pick > 0.95).sum()))
    if rng.random() < 0.5:              # a layer narrower than the array: zero columns
        acc[:, rng.integers(0, N + 1):] = 0
    return acc.astype(np.int32)


def _params(rng, ub, row, float_p):
    """P's 9 rows at `row`: bias and multiplier int32 (the multiplier a float32's bits with
    act_float), the shift byte."""
    bias = rng.integers(-2 ** 20, 2 ** 20, N)
    bias[rng.random(N) < 0.2] = rng.choice([-2 ** 31, 2 ** 31 - 1], 1)
    if float_p:
        mult = rng.choice([rng.uniform(1e-5, 0.05), rng.uniform(-0.01, 0.01), 0.0], N)
        bits = np.asarray(mult, np.float32).view(np.uint32).astype(np.int64)
    else:
        bits = rng.integers(0, 2 ** 31, N)
        bits[rng.random(N) < 0.3] = rng.integers(-2 ** 31, 0, 1)
    for plane, values in ((0, bias), (4, bits)):
        v = np.asarray(values, np.int64) & 0xFFFFFFFF
        for b in range(4):
            ub[row + plane + b] = (v >> (8 * b)) & 0xFF
    ub[row + 8] = rng.integers(0, 50, N)


def _case(rng):
    """(row, regs, acc, ub, fn, pool) of a valid random Activate."""
    fn_flag = rng.choice(list(FNS))
    pool_flag = rng.choice(list(POOLS))
    per_col = rng.random() < 0.7
    lookup = rng.random() < 0.2
    float_p = rng.random() < 0.5
    regs = D.reset_registers()
    regs[D.REG_ACT_OUT] = rng.choice([D.ACT_OUT_INT8, D.ACT_OUT_UINT8, D.ACT_OUT_WRAP8,
                                      D.ACT_OUT_INT16])
    regs[D.REG_ACT_ZERO] = rng.integers(-20, 20)
    regs[D.REG_ACT_MULT] = rng.choice([0, 1, rng.integers(1, 2 ** 15)])
    regs[D.REG_ACT_SHIFT] = rng.integers(0, 20)
    regs[D.REG_FN_IN_FRAC] = rng.integers(0, 16)
    regs[D.REG_ACT_FLOAT] = int(float_p)
    if rng.random() < 0.5:
        regs[D.REG_ACT_LO], regs[D.REG_ACT_HI] = sorted(rng.integers(-200, 300, 2))
        if rng.random() < 0.1:
            regs[D.REG_ACT_LO], regs[D.REG_ACT_HI] = regs[D.REG_ACT_HI] + 1, regs[D.REG_ACT_LO]
    if pool_flag == "":
        length = int(rng.integers(1, 12))
    elif rng.random() < 0.3:                                     # 1-D
        k = int(rng.integers(1, 5))
        regs[D.REG_POOL_SIZE], regs[D.REG_POOL_WIDTH] = k, 0
        length = k * int(rng.integers(1, 5))
    else:                                                        # 2-D
        k = int(rng.integers(1, 4))
        kw = int(rng.integers(1, 4)) if rng.random() < 0.4 else k   # a rectangular window
        width, height = int(rng.integers(kw, 7)), int(rng.integers(k, 7))
        regs[D.REG_POOL_SIZE], regs[D.REG_POOL_WIDTH] = k, width
        regs[D.REG_POOL_SIZE_X] = kw if kw != k or rng.random() < 0.5 else 0
        if rng.random() < 0.7:
            regs[D.REG_POOL_STRIDE] = rng.integers(1, 3)
            regs[D.REG_POOL_PAD] = rng.integers(0, k)
            regs[D.REG_POOL_PAD_END] = rng.integers(0, k)
            regs[D.REG_POOL_COUNT_PAD] = rng.integers(0, 2)
            if rng.random() < 0.5:                     # the columns' own stride and padding
                regs[D.REG_POOL_STRIDE_X] = rng.integers(0, 3)
                regs[D.REG_POOL_PAD_X] = rng.integers(-1, kw)
                regs[D.REG_POOL_PAD_END_X] = rng.integers(-1, kw)
                for reg, row_reg in ((D.REG_POOL_PAD_X, D.REG_POOL_PAD),
                                     (D.REG_POOL_PAD_END_X, D.REG_POOL_PAD_END)):
                    if regs[reg] < 0 and regs[row_reg] >= kw:     # -1: the rows' padding
                        regs[reg] = 0
            elif kw != k:
                regs[D.REG_POOL_PAD] = rng.integers(0, min(k, kw))
                regs[D.REG_POOL_PAD_END] = rng.integers(0, min(k, kw))
        else:
            width, height = kw * (width // kw), k * (height // k)
            regs[D.REG_POOL_WIDTH] = width
        length = width * height
    reps = int(rng.integers(1, 3))
    regs[D.REG_REP_ACC_STRIDE] = length
    if rng.random() < 0.3:
        regs[D.REG_ACT_UB_PITCH], regs[D.REG_ACT_UB_WIDTH] = 7, rng.integers(1, 4)
    flags = fn_flag + pool_flag + ("P" if per_col else "") + ("L" if lookup else "")
    row = np.zeros(D.NCOLS, np.int64)
    row[D.COL_OP] = D.OP_ACT
    row[D.COL_FLAGS] = ISA_TABLE.instructions["ACT"].flag_bits(flags)
    row[D.COL_REPEAT], row[D.COL_ACC], row[D.COL_UB], row[D.COL_LEN] = reps, 0, 60, length
    ok, out_rows = K._act_shape(row, regs)
    assert ok
    regs[D.REG_REP_UB_STRIDE] = K._act_ub_rows(row, regs, 0)
    acc = _accumulators(rng, reps * length + 1)
    ub = rng.integers(0, 256, (60 + reps * int(regs[D.REG_REP_UB_STRIDE]) + 2, N)).astype(np.uint8)
    _params(rng, ub, 0, float_p)
    regs[D.REG_ACT_PARAMS] = 0
    regs[D.REG_ACT_TABLE] = 20
    return row, regs, acc, ub, FNS[fn_flag], POOLS[pool_flag]


@pytest.mark.parametrize("seed", range(6))
def test_row_kernels_equal_the_general_loop(seed):
    rng = np.random.default_rng(seed)
    taken = 0
    for _ in range(120):
        row, regs, acc, ub, fn, pool = _case(rng)
        fast, general = ub.copy(), ub.copy()
        buf_a, buf_b = np.zeros((2, N), np.int64), np.zeros((2, N), np.int64)
        K._execute_act_ext(row, regs, acc, fast, buf_a, 0, fn, pool, True)
        K._execute_act_ext(row, regs, acc, general, buf_b, 0, fn, pool, False)
        np.testing.assert_array_equal(fast, general, err_msg=f"{row} {regs}")
        taken += not np.array_equal(fast, ub)
    assert taken > 60                       # the Activates wrote something


def test_fixed_point_rounding_by_shifts_is_round_half_to_even():
    """_requantize_row's shift form of P's fixed-point rounding on the ties and their
    neighbours, against Python's exact round-half-even of fractions."""
    from fractions import Fraction
    v = np.array([5, 6, 7, -5, -6, -7, 3, -3, 2 ** 31 - 1, -2 ** 31, 0, 1, -1, 12, 10, 14],
                 np.int64)
    mult = np.array([1, 1, 1, 1, 1, 1, 3, 3, 7, 7, 1, 1, 1, 1, 1, 1], np.int64)
    shifts = np.array([1, 2, 1, 1, 2, 1, 1, 1, 5, 5, 0, 0, 1, 3, 2, 2], np.int64)
    for count in (1, 2, 4):
        ub = np.zeros((1, N), np.uint8)
        K._requantize_row(v.copy(), ub, 0, len(v), 1, count, mult, shifts, np.zeros(N), 0, 0, 0,
                          -2 ** 31, 2 ** 31 - 1, D.ACT_OUT_WRAP8, np.zeros(256, np.int64),
                          False, np.zeros(N, np.int64))
        want = [round(Fraction(int(a) * int(m), count << int(s))) & 0xFF
                for a, m, s in zip(v, mult, shifts)]
        assert list(ub[0, :len(v)]) == want


@pytest.mark.parametrize("seed", range(4))
def test_dense_float_vector_loop_equals_the_general_loop_at_extremes(seed):
    """_act_dense_float's branch-free float32 loop (_act_dense_float32) against the general
    loop on P with act_float, no pooling: multipliers that overflow float32 products, are
    subnormal, zero, negative, infinite or NaN (those fall back to the general rule), zero
    points and bounds up to 2^30 (beyond 2^23 they fall back too), ReLU or no function, every 8-bit
    output type and the clip bounds."""
    rng = np.random.default_rng(100 + seed)
    specials = np.array([3e38, -3e38, 1e-45, -1e-40, 0.0, -0.0, 1.0, 0.5, 2.5, 1e9,
                         np.inf, -np.inf, np.nan], np.float32)
    for _ in range(60):
        regs = D.reset_registers()
        regs[D.REG_ACT_FLOAT] = 1
        regs[D.REG_ACT_OUT] = rng.choice([D.ACT_OUT_INT8, D.ACT_OUT_UINT8, D.ACT_OUT_WRAP8])
        regs[D.REG_ACT_ZERO] = rng.choice([0, rng.integers(-300, 300), 2 ** 24, -2 ** 24,
                                           2 ** 23 + 1, 2 ** 30, -2 ** 30])
        if rng.random() < 0.5:
            regs[D.REG_ACT_LO], regs[D.REG_ACT_HI] = sorted(rng.integers(-200, 300, 2))
        elif rng.random() < 0.5:
            regs[D.REG_ACT_LO], regs[D.REG_ACT_HI] = sorted(rng.choice(
                [-2 ** 23, 2 ** 23, -2 ** 23 - 1, 2 ** 23 + 1, 0, 255], 2))
        length = int(rng.integers(1, 6))
        flags = rng.choice(["", "R"]) + "P"
        row = np.zeros(D.NCOLS, np.int64)
        row[D.COL_OP] = D.OP_ACT
        row[D.COL_FLAGS] = ISA_TABLE.instructions["ACT"].flag_bits(flags)
        row[D.COL_REPEAT], row[D.COL_ACC], row[D.COL_UB], row[D.COL_LEN] = 1, 0, 20, length
        acc = _accumulators(rng, length)
        ub = rng.integers(0, 256, (20 + length, N)).astype(np.uint8)
        _params(rng, ub, 0, True)
        mult = rng.uniform(-0.05, 0.05, N).astype(np.float32)
        if rng.random() < 0.7:
            pick = rng.random(N) < 0.3
            mult[pick] = rng.choice(specials[:10] if rng.random() < 0.6 else specials,
                                    int(pick.sum()))
        bits = mult.view(np.uint32).astype(np.int64)
        for b in range(4):
            ub[4 + b] = (bits >> (8 * b)) & 0xFF
        regs[D.REG_ACT_PARAMS] = 0
        fn = K._FN_RELU if flags.startswith("R") else K._FN_NONE
        fast, general = ub.copy(), ub.copy()
        K._execute_act_ext(row, regs, acc, fast, np.zeros((2, N), np.int64), 0, fn,
                           K._POOL_NONE, True)
        K._execute_act_ext(row, regs, acc, general, np.zeros((2, N), np.int64), 0, fn,
                           K._POOL_NONE, False)
        np.testing.assert_array_equal(fast, general, err_msg=f"{mult} {regs}")


@pytest.mark.parametrize("relu", ["", "R"])
def test_iterations_that_write_the_same_rows_look_them_up_once(relu):
    """A repeated ACT.PL with rep_ub_stride 0 writes its rows twice: the table maps each
    write once (the float32 loop used to map every iteration's rows after all of them, so
    a row written twice was looked up twice; found by a 2,000-program differential run)."""
    rng = np.random.default_rng(7)
    regs = D.reset_registers()
    regs[D.REG_ACT_FLOAT] = 1
    regs[D.REG_ACT_OUT] = D.ACT_OUT_UINT8
    regs[D.REG_ACT_PARAMS], regs[D.REG_ACT_TABLE] = 0, 20
    row = np.zeros(D.NCOLS, np.int64)
    row[D.COL_OP] = D.OP_ACT
    row[D.COL_FLAGS] = ISA_TABLE.instructions["ACT"].flag_bits(relu + "PL")
    row[D.COL_REPEAT], row[D.COL_ACC], row[D.COL_UB], row[D.COL_LEN] = 2, 0, 40, 3
    acc = rng.integers(-3000, 3000, (3, N)).astype(np.int32)
    acc[:, N - 16:] = 0                                  # the zero-column tail as well
    ub = rng.integers(0, 256, (48, N)).astype(np.uint8)
    _params(rng, ub, 0, True)
    bits = np.full(N, 0.03, np.float32).view(np.uint32).astype(np.int64)
    for b in range(4):                                   # one float32 multiplier
        ub[4 + b] = (bits >> (8 * b)) & 0xFF
    fast, general = ub.copy(), ub.copy()
    K._execute_act_ext(row, regs, acc, fast, np.zeros((2, N), np.int64), 0, K._FN_NONE if
                       not relu else K._FN_RELU, K._POOL_NONE, True)
    K._execute_act_ext(row, regs, acc, general, np.zeros((2, N), np.int64), 0, K._FN_NONE if
                       not relu else K._FN_RELU, K._POOL_NONE, False)
    np.testing.assert_array_equal(fast, general)
    # the oracle by hand: one lookup of each output byte
    table = np.concatenate([ub[20 + r] for r in range(-(-256 // N))])[:256]
    bias = sum(ub[b].astype(np.int64) << (8 * b) for b in range(4)).astype(np.uint32)
    values = (acc.astype(np.int64) + bias.view(np.int32) + 2 ** 31) % 2 ** 32 - 2 ** 31
    if relu:
        values = np.maximum(values, 0)
    y = np.clip(np.rint(values.astype(np.float32) * np.float32(0.03)), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(fast[40:43], table[y])

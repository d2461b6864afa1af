"""OpenTPU's Activate functions: the sigmoid table is what OpenTPU's float64 code yields.

Two independent oracles: (1) the formula evaluated the way OpenTPU evaluates it, with
Python floats (`int(255. / (1. + exp(-x)))`) and with numpy float64; (2) a derivation in
exact decimal arithmetic plus the float64 rounding argument of spec/opentpu.md, which
shows no libm can move a step.
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np

from tpuasm.opentpu import SIGMOID_HI, SIGMOID_LO, SIGMOID_STEPS, SIGMOID_TABLE, opentpu_sigmoid

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def opentpu_formula(x: int) -> int:
    """OpenTPU's expression; where math.exp overflows (OpenTPU raises) the limit is 0."""
    try:
        return int(255. / (1. + math.exp(-x)))
    except OverflowError:
        return 0


def test_matches_python_float_formula_over_the_whole_transition():
    xs = np.arange(-2000, 3000)
    assert list(opentpu_sigmoid(xs)) == [opentpu_formula(int(x)) for x in xs]


def test_matches_numpy_float64_on_random_int32():
    rng = np.random.default_rng(2017)
    x = np.concatenate([rng.integers(INT32_MIN + 1, INT32_MAX, 200_000, endpoint=True),
                        np.arange(-50, 50), [INT32_MIN + 1, INT32_MAX, -710, -709, 36, 37]])
    with np.errstate(over="ignore"):
        expected = np.floor(255.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.int64)
    assert np.array_equal(opentpu_sigmoid(x).astype(np.int64), expected)


def test_int32_min_wraps_like_numpy_int32_negation():
    # OpenTPU applies the formula to numpy int32 scalars: -x wraps to INT32_MIN,
    # exp(INT32_MIN) is 0.0, and the quotient is 255.
    with np.errstate(over="ignore"):
        neg = -np.int32(INT32_MIN)
    assert int(255. / (1. + math.exp(neg))) == 255
    assert opentpu_sigmoid(INT32_MIN) == 255
    assert opentpu_sigmoid(INT32_MIN + 1) == 0


def derive_steps() -> list[tuple[int, int]]:
    """The steps from exact arithmetic and float64's rounding, without any libm."""
    two53 = Decimal(2) ** -53
    values = {}
    with localcontext() as ctx:
        ctx.prec = 60
        for x in range(-40, 80):
            e = Decimal(-x).exp()                    # exact to 60 digits
            if e < two53 * Decimal("0.99"):
                # fl(1 + e) is exactly 1.0 (e below half an ulp of 1), so 255.0 exactly.
                values[x] = 255
                continue
            assert e > two53 * Decimal("1.01"), "too close to the rounding boundary of 1 + e"
            exact = Decimal(255) / (1 + e)
            whole = int(exact)
            frac = exact - whole
            if 1 - frac < Decimal("1e-9"):
                # Just below 255: fl(1 + e) >= 1 + 2**-52, and 255 / (1 + 2**-52) is two
                # ulps below 255 in float64, so the quotient stays below 255.
                assert whole == 254
            elif whole > 0:
                # Float64's few rounding errors (< 1e-13 here) cannot cross an integer.
                # (Below 1 the quotient is positive and truncates to 0 however rounded.)
                assert frac == Decimal("0.5") or min(frac, 1 - frac) > Decimal("1e-9")
            values[x] = whole
    steps, previous = [], 0
    for x in sorted(values):
        if values[x] != previous:
            steps.append((x, values[x]))
            previous = values[x]
    assert values[-40] == 0 and values[79] == 255
    return steps


def test_steps_equal_the_exact_derivation():
    assert list(SIGMOID_STEPS) == derive_steps()


def test_lookup_table_form():
    assert SIGMOID_TABLE.dtype == np.uint8 and len(SIGMOID_TABLE) == SIGMOID_HI - SIGMOID_LO + 1
    xs = np.arange(SIGMOID_LO - 5, SIGMOID_HI + 5)
    via_table = SIGMOID_TABLE[np.clip(xs, SIGMOID_LO, SIGMOID_HI) - SIGMOID_LO]
    assert np.array_equal(via_table, opentpu_sigmoid(xs))

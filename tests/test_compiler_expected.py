"""The top-1 agreement expected on new rows (runtime/validate.pair_agreement): each
check row's float scores with each check row's quantization error added.  A count of flips
on 128 rows says little (none of 128 is 97-100 % on new data), so a min-max model is held
to the lower of the two, in the report and in `auto`'s search.  Oracles: a case worked by
hand, a brute-force double loop in plain Python, and the figures of a model compiled with
and without the search."""
from __future__ import annotations

import numpy as np
import pytest

from test_compiler_wide import _mlp
from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.runtime import validate
from tpuasm.compiler.runtime.calibsearch import Score
from tpuasm.compiler.runtime.validate import compare, pair_agreement, spread_rows


def expected_agreement(ref, got, axis):
    pair = pair_agreement(ref, got, axis)
    return None if pair is None else pair[0]


def _brute_force(ref, got, rows=None):
    """Every (row, error) pair in plain Python: the share that keeps the row's arg-max."""
    ref, got = ref.tolist(), got.tolist()
    rows = range(len(ref)) if rows is None else [int(r) for r in rows]
    kept = total = 0
    for i in rows:
        top = max(range(len(ref[i])), key=lambda c: ref[i][c])
        for j in rows:
            moved = [ref[i][c] + got[j][c] - ref[j][c] for c in range(len(ref[i]))]
            kept += max(range(len(moved)), key=lambda c: moved[c]) == top
            total += 1
    return kept / total


def test_a_case_worked_by_hand():
    # row 0 loses 1.1 on its top class and keeps it (2 - 1.1 > 0); the same error on row 1,
    # whose top class leads by 0.5, flips it: 3 of the 4 pairs keep their top-1
    ref = np.array([[2.0, 0.0], [1.0, 0.5]])
    got = np.array([[0.9, 0.0], [1.0, 0.5]])
    assert np.mean(ref.argmax(1) == got.argmax(1)) == 1.0
    assert expected_agreement(ref, got, 1) == 0.75
    (check,) = compare({"y": ref}, {"y": got}, ["y"])
    assert check.agreement == 1.0 and check.expected == 0.75 and check.judged == 0.75
    # row 0 keeps its top-1 under both errors, row 1 under one: per row (1, 0.5); error 0
    # keeps one row, error 1 both: per error (0.5, 1); each sample variance 0.125, so the
    # standard error is sqrt((0.125 + 0.125) / 2)
    assert check.expected_stderr == pytest.approx(0.125 ** 0.5)
    assert check.cautious == pytest.approx(0.75 - 0.125 ** 0.5)
    assert "75.00 ± 35.36 % expected on new rows" in check.text()


def test_it_agrees_with_a_brute_force_count():
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 1, (40, 6))
    got = ref + rng.normal(0, 0.2, ref.shape)
    assert expected_agreement(ref, got, 1) == pytest.approx(_brute_force(ref, got), abs=1e-12)


def test_a_sequence_s_steps_are_rows_and_its_class_axis_is_taken_where_it_is():
    rng = np.random.default_rng(1)
    ref = rng.normal(0, 1, (4, 5, 3))             # classes on axis 1, (N, classes, T)
    got = ref + rng.normal(0, 0.3, ref.shape)
    flat = np.moveaxis(ref, 1, -1).reshape(-1, 5)
    flat_got = np.moveaxis(got, 1, -1).reshape(-1, 5)
    assert expected_agreement(ref, got, 1) == pytest.approx(_brute_force(flat, flat_got))


def test_many_rows_and_classes_are_judged_on_rows_spread_evenly(monkeypatch):
    monkeypatch.setattr(validate, "EXPECTED_ELEMENTS", 50 * 50 * 8)
    rng = np.random.default_rng(2)
    ref = rng.normal(0, 1, (300, 8))
    got = ref + rng.normal(0, 0.3, ref.shape)
    assert expected_agreement(ref, got, 1) == pytest.approx(
        _brute_force(ref, got, spread_rows(300, 50)))


def test_its_standard_error_is_the_spread_of_the_estimate_over_check_sets():
    """The oracle: many check sets of 64 rows drawn from one population of rows (margins and
    errors of a noisy classifier), the spread of their estimates against the standard
    error each set reports."""
    rng = np.random.default_rng(3)
    population = rng.normal(0, 1, (20_000, 5))
    population[:, 0] += 2.5                          # most rows far from a tie, some near
    moved = population + rng.normal(0, 0.2, population.shape)
    estimates, errors = [], []
    for _ in range(300):
        rows = rng.choice(len(population), 64, replace=False)
        mean, stderr = pair_agreement(population[rows], moved[rows], 1)
        estimates.append(mean)
        errors.append(stderr)
    assert 0.95 < np.mean(estimates) < 0.97
    assert np.mean(errors) == pytest.approx(np.std(estimates), rel=0.2)


def test_no_spread_where_every_pair_keeps_its_top_1():
    ref = np.array([[3.0, 0.0], [0.0, 3.0], [2.0, 1.0]])
    assert pair_agreement(ref, ref + 0.1, 1) == (1.0, 0.0)


def test_the_search_holds_the_bar_one_standard_error_below_the_estimate():
    """auto's Score: an estimate of 99.3 % that is 0.5 points uncertain may be below a 99 %
    bar on new rows, so the search goes on; 0.1 points uncertain, it stops."""
    noisy = Score(1.0, 30.0, expected=0.993, stderr=0.005)
    assert noisy.below(0.99, 0.0)
    assert "99.30 ± 0.50 % expected on new rows" in noisy.text()
    assert not Score(1.0, 30.0, expected=0.993, stderr=0.001).below(0.99, 0.0)
    assert not Score(1.0, 30.0).below(0.99, 0.0)


def test_no_figure_for_scores_that_are_not_finite():
    ref = np.array([[1.0, np.inf], [0.0, 1.0]])
    assert expected_agreement(ref, ref, 1) is None
    (check,) = compare({"y": ref}, {"y": ref}, ["y"])
    assert check.expected is None and check.judged == check.agreement


def test_a_clipping_method_s_check_has_no_expected_figure():
    ref = np.array([[2.0, 0.0], [1.0, 0.5]])
    got = np.array([[0.9, 0.0], [1.0, 0.5]])
    (check,) = compare({"y": ref}, {"y": got}, ["y"], expected=False)
    assert check.expected is None and check.judged == 1.0


def test_the_search_goes_on_where_the_rows_agree_but_new_rows_would_not(tmp_path):
    """An MLP with int16 activations agrees with the float model on every check row, but its
    errors against the rows' margins expect fewer than 99 % on new rows: compiled as it is,
    the report warns; `auto` goes on (int16 weights) until the expected figure meets the
    bar too."""
    path, _, x = _mlp(tmp_path)
    fixed = tpu_compile(path, batch=32, calibration=x, calibration_method="minmax",
                        activation_bits=16)
    (check,) = fixed.report.validation.outputs
    assert check.agreement >= 0.99 > check.expected
    assert any("expected on new rows" in w for w in fixed.report.validation.warnings)
    chosen = tpu_compile(path, batch=32, calibration=x)
    (check,) = chosen.report.validation.outputs
    assert check.agreement >= 0.99 and check.expected >= 0.99, check
    assert not chosen.report.validation.warnings
    assert chosen.report.wide_weights and "expected on new rows" in chosen.report.source
    # the two figures in report.json, and read back
    outputs = chosen.report.to_json()["validation"]["outputs"]
    assert outputs[0]["expected_agreement"] == check.expected
    assert outputs[0]["expected_stderr"] == check.expected_stderr
    again = validate.Validation.from_json(chosen.report.to_json()["validation"])
    assert again.outputs[0].expected == check.expected
    assert again.outputs[0].expected_stderr == check.expected_stderr

"""The memory budget of debugger expressions (debugger/expr_budget.py, spec/limits.md).

On a machine of the real shape (N = 256, UB 98,304 x 256 = 25,165,824 bytes) an
expression over a whole memory used to be widened to int64 (`watch ub[0:99999999] - 1 - 1`
peaked at ~480 MB in the debug fuzz target).  What an expression computes is now sized
from shapes before it is computed: tracemalloc (numpy reports its buffers to it) is the
oracle that nothing large was allocated, numpy on the memories the oracle for values.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from debugger import main
from debugger.commands import Engine
from debugger.expr import ExprError
from debugger.session import Session
from tpuasm import limits
from tpuasm.assembler import assemble

MiB = 1 << 20
UB_VALUES = 98_304 * 256


@pytest.fixture(scope="module")
def big():
    """A session at the default shape, its UB and accumulators filled with known values."""
    session = Session(assemble("HLT\n", "big.tasm"), source_name="big.tasm")
    m = session.machine
    rng = np.random.default_rng(24)
    m.ub[:] = rng.integers(0, 256, m.ub.shape, dtype=np.uint8)
    m.acc[:] = rng.integers(-1000, 1000, m.acc.shape, dtype=np.int32)
    return session


def peak_bytes(fn) -> int:
    """Peak bytes allocated while `fn` runs (its error, if any, is swallowed)."""
    tracemalloc.start()
    try:
        fn()
    except ExprError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("text, values", [
    ("ub[0:99999999] + 1", UB_VALUES),
    ("ub[0:99999999] - 1 - 1", UB_VALUES),           # the fuzz finding
    ("ub == 3", UB_VALUES),
    ("-ub", UB_VALUES),
    ("abs(ub)", UB_VALUES),
    ("ubu[0:99999999:1] * 2", UB_VALUES),
    ("[ub, ub]", 2 * UB_VALUES),
    ("ub[True]", UB_VALUES),                          # a bool index copies
    ("ub[acc[0:4096]]", 4096 * 256 * 256),            # rows gathered by an array of rows
    ("ub[0:99999999] + acc[0:2]", None),                # shapes that do not broadcast
])
def test_over_budget_is_refused_before_anything_is_allocated(big, text, values):
    with pytest.raises(ExprError) as e:
        big.eval.value(text)
    message = str(e.value)
    if values is not None:
        assert f"would compute {values:,} values" in message
        assert "limits.MAX_EXPR_ELEMENTS" in message and "spec/limits.md" in message
    assert peak_bytes(lambda: big.eval.value(text)) < 1 * MiB


def test_reading_and_reducing_a_whole_memory_copies_nothing(big):
    m = big.machine
    signed = m.ub.view(np.int8)
    for text, want in [("sum(ub)", int(signed.sum(dtype=np.int64))),
                       ("sum(ubu[0:99999999])", int(m.ub.sum(dtype=np.int64))),
                       ("max(ub) - min(ub)", int(signed.max()) - int(signed.min())),
                       ("count(ub)", int(np.count_nonzero(m.ub))),
                       ("sum(acc * acc)", int((m.acc.astype(np.int64) ** 2).sum()))]:
        assert big.eval.value(text) == want, text
    for text in ("sum(ub)", "count(ub[0:99999999])", "max(ub)", "any(ub)", "ub[0:99999999]"):
        assert peak_bytes(lambda: big.eval.value(text)) < 1 * MiB, text
    assert np.shares_memory(big.eval.value("ub"), m.ub)           # a view, printed summarized


def test_nested_and_strided_slices_match_numpy(big):
    m = big.machine
    signed = m.ub.view(np.int8)
    cases = {
        "ub[0:99999999:3][0:2, 0:4]": signed[::3][0:2, 0:4],
        "ub[::-1][0][0:4]": signed[::-1][0][0:4],
        "ub[5:99999999][0:3][-1]": signed[5:][0:3][-1],
        "ub[[1, 2, 3]][:, 7]": signed[[1, 2, 3]][:, 7],
        "acc[0:8][::2, 1:3] + ub[0:4, 1:3]": m.acc[0:8][::2, 1:3].astype(np.int64)
        + signed[0:4, 1:3],
        "acc * 2": m.acc.astype(np.int64) * 2,         # 1,048,576 values: within the budget
        "ub[0:16384] + 1": signed[0:16384].astype(np.int64) + 1,    # exactly at the budget
    }
    for text, want in cases.items():
        got = big.eval.value(text)
        assert np.array_equal(got, want), text


def test_the_budget_is_the_limit_in_limits_py(big, monkeypatch):
    monkeypatch.setattr(limits, "MAX_EXPR_ELEMENTS", 8 * 256)
    assert big.eval.value("acc[0:8] + 0").shape == (8, 256)
    with pytest.raises(ExprError, match="2,304 values .9 x 256.; an expression computes at most 2,048"):
        big.eval.value("acc[0:9] + 0")
    with pytest.raises(ExprError, match="at most 2,048"):
        big.eval.value("ub[[0, 1, 2, 3, 4, 5, 6, 7, 8]]")


def test_integers_and_text_have_their_own_caps(big):
    assert big.eval.value("2 ** 64 * 3") == 3 << 64
    for text, cap in [("(2 ** 64) ** 64", "limits.MAX_EXPR_INT_BITS"),
                      ("((1 << 64) << 64) ** 60", "limits.MAX_EXPR_INT_BITS"),
                      ("1" + " + 1" * 2500, "limits.MAX_EXPR_CHARS")]:
        with pytest.raises(ExprError, match=cap):
            big.eval.value(text)
    assert peak_bytes(lambda: big.eval.value("1" + "+1" * 500_000)) < 2 * MiB    # not parsed


def test_watch_conditions_and_ranges(big):
    engine = Engine(big)
    r = engine.execute("watch ub == 3")
    assert not r.ok and "limits.MAX_EXPR_ELEMENTS" in r.text()
    r = engine.execute("watch ub[0:99999999]")
    assert not r.ok and "outside 0..98303" in r.text()
    assert engine.execute("watch acc[0:4096] == 5").ok
    assert engine.execute("print acc * acc").ok        # a whole memory in arithmetic
    assert not engine.execute("print tile").ok


def test_batch_mode_reports_each_refusal_and_goes_on(tmp_path, capsys):
    (tmp_path / "big.tasm").write_text("HLT\n")
    script = tmp_path / "s.tdb"
    script.write_text("print ub[0:99999999] - 1 - 1\nwatch ub[0:99999999] * 2 == 0\n"
                      "display abs(ub)\nprint sum(ub[0:99999999])\nexpect count(acc) == 0\n")
    tracemalloc.start()
    try:
        code = main([str(tmp_path / "big.tasm"), "--batch", str(script)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("limits.MAX_EXPR_ELEMENTS") == 2 and "outside 0..98303" in out
    assert "sum(ub[0:99999999]) = 0" in out and "ok count(acc) == 0" in out
    assert "3 command(s) failed" in out and "Traceback" not in out
    assert peak < 100 * MiB          # the machine itself is ~30 MB; no int64 copy of the UB

"""The ahead-of-time run loop (tpuasm/machine/aot.py) and the lazy njit (jit.py).

The ahead-of-time module is numba's compilation of the same core.run_core, so the oracle
for it is the JIT-compiled run_core itself: on random programs (valid and faulting, both
profiles) every array of the machine's state must be identical after a run by either.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).parent))
from program_strategies import programs  # noqa: E402

from tpuasm.binary import Program  # noqa: E402
from tpuasm.encoding import Instruction  # noqa: E402
from tpuasm.machine import Machine, aot, jit  # noqa: E402
from tpuasm.cache import FAILED  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
needs_aot = pytest.mark.skipif(aot.load() is None,
                               reason="no ahead-of-time core here (no C compiler or no BLAS)")


def _run(case, use_aot: bool, monkeypatch):
    with monkeypatch.context() as mp:
        if not use_aot:
            mp.setattr(aot, "runner", lambda args: None)
        m = Machine.for_program(case.program)
        m.load(case.program, host=case.host, weights=case.weights if len(case.weights) else None)
        result = m.run(max_cycles=2_000_000)
    assert (m._entry is aot.load().run_core) == use_aot
    return m, result


@needs_aot
@pytest.mark.parametrize("profile", ["tpu", "opentpu"])
def test_ahead_of_time_core_equals_the_jit_core(profile, monkeypatch):
    count = 0

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(programs(profile=profile))
    def check(case):
        nonlocal count
        ours, r1 = _run(case, True, monkeypatch)
        jits, r2 = _run(case, False, monkeypatch)
        assert (r1.status, r1.cycle, r1.index) == (r2.status, r2.cycle, r2.index)
        assert str(r1.fault) == str(r2.fault)
        for name in Machine._STATE_ARRAYS:
            assert np.array_equal(getattr(ours, name), getattr(jits, name)), name
        count += 1

    check()
    assert count == 40


@needs_aot
def test_the_machine_uses_the_ahead_of_time_core():
    m = Machine()
    m.load(Program([Instruction("NOP"), Instruction("HLT")]))
    assert m.run().status == "halted"
    assert m._entry is aot.load().run_core


@needs_aot
def test_a_fresh_run_imports_no_numba(tmp_path):
    (tmp_path / "p.tasm").write_text("RHM 0, 0, 2\nRW 0\nMMC.SO 0, 0, 2\nACT.R 0, 4, 2\n"
                                     "WHM 4, 2, 2\nHLT\n")
    np.save(tmp_path / "h.npy", np.full((4, 256), 2, np.int8))
    np.save(tmp_path / "w.npy", np.ones((1, 256, 256), np.int8))
    code = ("import sys\nfrom tpuasm.cli import main\n"
            f"rc = main(['run', {str(tmp_path / 'p.tasm')!r}, '--host', "
            f"{str(tmp_path / 'h.npy')!r}, '--weights', {str(tmp_path / 'w.npy')!r}, "
            f"'--out', {str(tmp_path / 'o.npy')!r}, '-q'])\n"
            "print(rc, 'numba' in sys.modules, 'llvmlite' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    assert out.stdout.split() == ["0", "False", "False"], out.stderr
    # 2 * 1 summed over 256 inputs = 512, ReLU, clamped to int8
    assert (np.load(tmp_path / "o.npy")[2:4] == 127).all()


def test_arguments_the_build_did_not_see_go_to_the_jit():
    m = Machine()
    m.load(Program([Instruction("HLT")]))
    expected = aot.layout(m._args)
    assert aot._matches(expected, aot.layout(m._args))
    readonly = m.host.copy()
    readonly.flags.writeable = False            # the core writes host memory
    strided = np.zeros((m.ub.shape[0], 2 * m.ub.shape[1]), np.uint8)[:, ::2]
    wrong_dtype = m.acc.astype(np.int64)
    for index, bad in ((13, readonly), (11, strided), (12, wrong_dtype)):
        args = list(m._args)
        args[index] = bad
        assert not aot._matches(expected, aot.layout(args)), index
    # a writable weight image where the build saw a read-only one is fine
    args = list(m._args)
    args[14] = np.zeros((1, 256, 256), np.uint8)
    assert aot._matches(expected, aot.layout(args))


def test_a_failed_build_leaves_a_note_and_the_jit_serves(tmp_path, monkeypatch):
    where = tmp_path / "aot-x"
    where.mkdir()
    (where / FAILED).write_text("RuntimeError: no compiler\n")
    monkeypatch.setattr(aot, "directory", lambda: where)
    monkeypatch.setattr(aot, "_loaded", None)
    assert aot.load() is None
    m = Machine()
    m.load(Program([Instruction("NOP"), Instruction("HLT")]))
    assert m.run().status == "halted" and m.cycle == 2


def test_an_import_failure_is_noted_once(tmp_path, monkeypatch):
    where = tmp_path / "aot-y"
    where.mkdir()
    aot._library_path(where).write_bytes(b"not a shared library")
    (where / aot._LAYOUT).write_text("[]")
    monkeypatch.setattr(aot, "directory", lambda: where)
    monkeypatch.setattr(aot, "_loaded", None)
    with pytest.warns(RuntimeWarning, match="ahead-of-time core is unavailable"):
        assert aot.load() is None
    assert (where / FAILED).exists()
    assert aot.load() is None                   # decided for this process: no second try


def test_lazy_njit_becomes_numba_and_keeps_old_references_working():
    from tpuasm.machine import kernels
    early = jit.Lazy(kernels._signed8.py_func, {})   # as if taken before materialize()
    jit.materialize()
    from numba.core.registry import CPUDispatcher
    assert isinstance(kernels._signed8, CPUDispatcher)   # module globals are dispatchers
    assert jit.materialized()
    early.dispatcher = kernels._signed8
    assert early(200) == -56 and early(5) == 5           # forwarding

    from numba import njit

    @njit
    def calls_the_early_reference(v):
        return early(v)                                  # typed as the dispatcher

    assert calls_the_early_reference(255) == -1


def test_scipy_lapack_still_works_after_the_core_runs():
    # The module once reached numpy's OpenBLAS through RTLD_GLOBAL: its unprefixed internals
    # then served scipy's own OpenBLAS, and scipy's LAPACK failed later in the same process
    # ("Memory error in scipy.linalg.solve", "Too large work array required").  A fresh
    # process: run a program on the core (the ahead-of-time one when it builds), then
    # scipy's solve and lstsq, first imported after it.
    import subprocess
    import sys
    code = """
import numpy as np
from tpuasm import assemble
from tpuasm.machine import Machine, aot
program = assemble('''
.config array_size=16, ub_rows=64, acc_rows=64
    RW 0
    MMC.SO 0, 0, 8
    HLT
''')
m = Machine.for_program(program)
m.load(program, host=np.ones((8, 16), np.int8), weights=np.ones((1, 16, 16), np.int8))
assert m.run().status == "halted" and int(m.acc[0, 0]) == 0
import scipy.linalg
rng = np.random.default_rng(0)
a, b = rng.random((300, 300)), rng.random(300)
assert np.allclose(a @ scipy.linalg.solve(a, b), b)
x = rng.random((1797, 64))
coef = scipy.linalg.lstsq(x, rng.random(1797))[0]
assert coef.shape == (64,)
print("ok", aot.load() is not None)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]

"""Start-up (issue 23, item 6): nothing heavy is imported before the first frame, and the
one-line key bar that replaced Textual's Footer shows the main keys and runs them on a click."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from test_debugger_support import here, make_session  # noqa: F401 (here: a fixture)
from test_debugger_ui import pilot_test

from debugger.app import DebuggerApp


def test_first_frame_imports_nothing_heavy(here):
    """A fresh process paints the first frame of a program with data without numba, onnx,
    onnxruntime, matplotlib, dask or scipy (each costs 0.1-1 s of start-up)."""
    code = textwrap.dedent("""
        import asyncio, sys
        from test_debugger_support import make_session
        from debugger.app import DebuggerApp
        from pathlib import Path

        async def first_frame():
            app = DebuggerApp(make_session(Path(sys.argv[1])))
            async with app.run_test(size=(80, 24)) as pilot:
                await pilot.pause()
                assert app.query_one("#source").size.height > 0
        asyncio.run(first_frame())
        heavy = ("numba", "onnx", "onnxruntime", "matplotlib", "dask", "scipy", "sklearn")
        print(sorted(m for m in heavy if m in sys.modules))
    """)
    tests = str(__import__("pathlib").Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", code, str(here)], capture_output=True, text=True,
                         cwd=str(here), env={**__import__("os").environ, "PYTHONPATH": tests},
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


@pilot_test
async def test_key_bar_shows_the_main_keys_and_runs_them_on_a_click(here):
    app = DebuggerApp(make_session(here))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        bar = app.query_one("#keys")
        text = bar.render().plain
        assert bar.region.y == 23 and len(text) <= 80
        assert text.startswith(" F1  Help ")                 # help first
        for key, label in (("s", "Step cycle"), ("n", "Next instr"), ("c", "Continue")):
            assert f" {key}  {label} " in text
        x = text.index("Next instr")
        assert bar.action_at(x) == "cmd('next')" and bar.action_at(79) in (None, *(
            a for _, _, a in bar.keys))
        await pilot.click("#keys", offset=(text.index("Step cycle"), 0))
        await pilot.pause()
        assert app.session.machine.cycle == 1


BLAS_CHECK = """
import os, sys
from debugger import blas_start
blas_start.start_single_threaded()
import numpy
from tpuasm.machine.gemm import blas_threads
during = blas_threads()
blas_start.restore()
print(during, blas_threads(), "OPENBLAS_NUM_THREADS" in os.environ)
"""


def test_openblas_starts_on_one_thread_and_gets_its_cores_back():
    """numpy's OpenBLAS starts its worker threads at import (~60 ms of start-up on 2 cores):
    one thread until the screen is up, then one per core; a user's own setting is kept."""
    import os
    import pytest
    from tpuasm.machine.gemm import HAVE_BLAS
    cores = len(os.sched_getaffinity(0))
    if not HAVE_BLAS or cores < 2:
        pytest.skip("needs OpenBLAS and 2 cores")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", BLAS_CHECK], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.stdout.split() == ["1", str(cores), "False"], out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", BLAS_CHECK], capture_output=True, text=True,
                         env={**env, "OPENBLAS_NUM_THREADS": "1"}, timeout=60)
    assert out.stdout.split() == ["1", "1", "True"], out.stderr[-2000:]      # the user's choice

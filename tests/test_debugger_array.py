"""The matrix unit pane (issue 13): the active tile's heat map, downsampled to the pane, and
the wavefront of tpuasm.machine.wavefront (the timing model's claim, checked against a
register-level model by its own tests).  The heat map is checked against a block mean of
the machine's tile computed here; the wavefront overlay against the model's cells."""
from __future__ import annotations

import numpy as np
import pytest

from debugger.array_view import ArrayPane, bins
from test_debugger_support import LINE_MMC1, here, make_session  # noqa: F401
from test_debugger_ui import command, keys, open_app, pilot_test



def test_bins_is_a_block_mean():
    a = np.arange(16 * 16).reshape(16, 16)
    got = bins(a, 4, 2)
    want = a.reshape(4, 4, 2, 8).mean(axis=(1, 3))
    assert np.allclose(got, want)
    assert np.allclose(bins(a, 16, 16), a)


@pilot_test
async def test_array_pane_shows_the_wavefront_of_the_running_mmc(here):
    wavefront = pytest.importorskip("tpuasm.machine.wavefront")   # emulator-fidelity's model
    async with open_app(here) as (app, pilot):
        await command(pilot, f"break {LINE_MMC1}")
        await keys(pilot, "c")
        m = app.session.machine
        for _ in range(5000):                        # until the MMC streams (after its weights)
            if (wavefront.array_view(m).instruction == 4).any():
                break
            app.session.step_cycles(1)
        await keys(pilot, "a")
        pane = app.query_one(ArrayPane)
        assert app.focused is pane
        m = app.session.machine
        view = wavefront.array_view(m)
        assert np.array_equal(pane.view.vector, view.vector)
        text = "\n".join(pane.render_line(y).text for y in range(3))
        assert (view.instruction == 4).any() and "wavefront MMC #4" in text
        active = m.active()
        assert (f"tile {active.tiles[0]}" if active else "tile none") in text
        await keys(pilot, "plus")
        r0, c0, size = pane._window()
        assert size == 4 and (r0, c0) == (2, 2)              # zoomed about the centre
        await keys(pilot, "right")
        assert pane._window() == (2, 3, 4)


DRAW_WITHOUT_NUMBA = """
import asyncio, sys
from pathlib import Path
from debugger.app import DebuggerApp
from test_debugger_support import LINE_MMC1, make_session

async def main():
    app = DebuggerApp(make_session(Path.cwd()))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        app.execute(f"break {LINE_MMC1}")
        app.execute("continue")
        await app.workers.wait_for_complete()
        for _ in range(12):                    # the MMC in the matrix stage: its progress
            app.execute("step", echo=False)
            await pilot.pause()
        await pilot.press("a")                 # the array pane and its wavefront
        await pilot.pause()
        app.execute("info writes hidden")      # the access history
        await pilot.pause()
        assert app.session.machine.pipeline()[1].total == 4, app.session.machine.pipeline()
    print("numba" in sys.modules)

asyncio.run(main())
"""


def test_drawing_the_machine_does_not_import_numba(here):
    """The debugger draws progress, the matrix unit and the access history with the core's
    rules run as plain Python (tpuasm.machine.pure): with the run loop from the
    ahead-of-time module, numba is never imported.  (In a fresh interpreter; the module is
    built first, since building it imports numba.)"""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from tpuasm.machine import aot
    if not aot.enabled():
        pytest.skip("no ahead-of-time core here: the JIT core needs numba anyway")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                      os.environ.get("PYTHONPATH", "")]))
    build = subprocess.run([sys.executable, "-c", "from tpuasm.machine import aot; "
                            "print(aot.load() is not None)"], capture_output=True, text=True,
                           env=env, timeout=600)
    if build.stdout.strip() != "True":
        pytest.skip("the ahead-of-time core could not be built here")
    out = subprocess.run([sys.executable, "-c", DRAW_WITHOUT_NUMBA], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"

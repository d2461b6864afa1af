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
        await command(pilot, "step 8")
        await keys(pilot, "a")
        pane = app.query_one(ArrayPane)
        assert app.focused is pane
        m = app.session.machine
        view = wavefront.array_view(m)
        assert np.array_equal(pane.view.vector, view.vector)
        text = "\n".join(pane.render_line(y).text for y in range(3))
        assert (view.instruction == 4).any() and "wavefront MMC #4" in text
        assert f"tile {m.active().tiles[0]}" in text
        await keys(pilot, "plus")
        r0, c0, size = pane._window()
        assert size == 4 and (r0, c0) == (2, 2)              # zoomed about the centre
        await keys(pilot, "right")
        assert pane._window() == (2, 3, 4)

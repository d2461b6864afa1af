"""SVG snapshots of the main screen (pytest-textual-snapshot): after load, mid-run with
stalls in the pipeline, and after a fault.  Update with `pytest --snapshot-update` after
checking the new pictures by eye."""
from __future__ import annotations

from debugger.app import DebuggerApp
from test_debugger_support import FAULTY, LINE_MMC1, commands, here, make_session  # noqa: F401 (here: a fixture)

SIZE = (160, 48)


def test_after_load(here, snap_compare):
    assert snap_compare(DebuggerApp(make_session(here)), terminal_size=SIZE,
                        run_before=commands())


def test_mid_run_with_a_stall(here, snap_compare):
    app = DebuggerApp(make_session(here))
    assert snap_compare(app, terminal_size=SIZE,
                        run_before=commands(f"break {LINE_MMC1}", "continue", "step 3",
                                            "goto hidden"))
    stalls = [st.stall for st in app.session.machine.pipeline() if st.stall]
    assert stalls, "the picture is meant to show a stall"


def test_after_a_fault(here, snap_compare):
    app = DebuggerApp(make_session(here, FAULTY, "faulty.tasm"))
    assert snap_compare(app, terminal_size=SIZE, run_before=commands("continue"))
    assert app.session.machine.status == "fault"


def test_after_jump_to_the_writer(here, snap_compare):
    """`W` in the UB view on hidden + 1: back at the cycle #7 ACT's write landed, the row
    marked, the source cursor on the writer's line."""
    app = DebuggerApp(make_session(here))

    async def run_before(pilot):
        await commands("continue", "goto hidden + 1")(pilot)
        await pilot.press("W")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
    m = app.session.machine
    assert m.cycle == m.finish_cycle(7)

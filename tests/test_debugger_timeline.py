"""The whole-run timeline (issue 13): tracks drawn from the machine's per-instruction and
per-tile intervals, zoom from 1 cycle per cell to the whole run, a click jumps the machine
there.  Checked against the machine's own issue/finish cycles (m.issue_cycle/finish_cycle)
and against a fresh machine stepped to the clicked cycle."""
from __future__ import annotations

import numpy as np

from debugger.commands import Engine
from debugger.timeline import STAGES, LABEL, TimelinePane, Waveform
from test_debugger_support import (LINE_MMC2, assert_same_state, fresh_state_at, here,  # noqa: F401
                                   machine_state, make_session)
from test_debugger_ui import keys, open_app, pilot_test, settle


def waveform(session):
    pane = TimelinePane(session)
    return Waveform(session, pane._stage_codes, pane._host_ops, pane._mmc)


def test_every_instruction_is_in_its_stage_track_from_start_to_finish(here):
    e = Engine(make_session(here))
    e.execute("continue")
    s = e.session
    m = s.machine
    wave = waveform(s)
    for i, ins in enumerate(s.program.instructions):
        stage = ins.spec.stage
        if stage not in STAGES:
            continue
        start = m.intervals()[i, 1]
        finish = m.finish_cycle(i)
        cells = wave.cells(wave.tracks[stage], int(start), 1, int(finish - start))
        assert [wave.tracks[stage].ids[k] for k in cells] == [i] * int(finish - start), i
        # the cycle before it started it was not in that track
        before = wave.cells(wave.tracks[stage], int(start) - 1, 1, 1)[0]
        assert before < 0 or wave.tracks[stage].ids[before] != i
    # the host path holds the host reads and writes, the weight path both tiles
    assert set(wave.tracks["host"].ids.tolist()) == {0, 8}
    assert sorted(wave.tracks["w.shift"].ids.tolist()) == [0, 1]


def test_a_wait_is_coloured_by_its_cause(here):
    e = Engine(make_session(here))
    e.execute("continue")
    wave = waveform(e.session)
    m = e.session.machine
    causes = {int(i): wave.cause(int(i)) for i in wave.waits["activate"].ids}
    # each ACT waits for the MMC before it to finish writing the accumulators: a RAW hazard
    assert causes and set(causes.values()) == {"raw"}
    for i in causes:
        assert e.session.accesses.blocker(i) == i - 1
        assert m.intervals()[i, 1] == m.finish_cycle(i - 1)


@pilot_test
async def test_zoom_fit_and_click_to_jump(here):
    async with open_app(here, size=(120, 40)) as (app, pilot):
        await keys(pilot, "c")                       # to the halt
        end = app.session.machine.cycle
        await keys(pilot, "t")
        pane = app.query_one(TimelinePane)
        assert app.focused is pane
        await keys(pilot, "0")                       # the whole run in the pane
        assert pane.c0 == 0 and pane.zoom * (pane.columns - 1) >= end
        await keys(pilot, "plus", "plus")
        assert pane.zoom < -(-end // (pane.columns - 1))
        await keys(pilot, "0")
        x = LABEL + (pane.columns // 2)
        target = pane.cycle_at(x)
        await pilot.click(TimelinePane, offset=(x + 1, 3))    # +1: the border
        await settle(pilot)
        m = app.session.machine
        assert m.cycle == target
        assert_same_state(machine_state(m), fresh_state_at(here, target))


@pilot_test
async def test_a_jump_back_keeps_the_whole_recorded_run(here):
    async with open_app(here, size=(120, 40)) as (app, pilot):
        await keys(pilot, "c")                       # to the halt
        m = app.session.machine
        end, times = m.cycle, m.intervals().copy()
        app.execute("jump 100")
        await settle(pilot)
        pane = app.query_one(TimelinePane)
        wave = pane.wave()
        assert m.cycle == 100 and wave.now == 100
        # the matrix track still holds both MatrixMultiplies, which ran long after cycle 100
        mmc = [i for i, ins in enumerate(app.session.program.instructions) if ins.key == "MMC"]
        for i in mmc:
            start, finish = int(times[i, 1]), int(times[i, 2])
            assert start > 100
            cells = wave.cells(wave.tracks["matrix"], start, 1, finish - start)
            assert [wave.tracks["matrix"].ids[k] for k in cells] == [i] * (finish - start)

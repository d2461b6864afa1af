"""`tpuasm debug OUTDIR` (issue 23, item 5): a compiled model opens at its first TPU segment
with that segment's own data, `segment NAME` switches, a `node` breakpoint follows its node
across segments.  The outputs are checked against the compiler's own golden files."""
from __future__ import annotations

import json
import re
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

import float_models
from debugger.cli import load_session, main
from debugger.commands import Engine
from debugger.source_view import SourceView
from test_debugger_support import here, make_session, run  # noqa: F401
from test_debugger_ui import command, log_text, open_app, pilot_test

# two TPU segments around a Softmax that runs on the host
LAYERS = [("gemm", 8), ("softmax",), ("gemm", 4), ("relu",)]


@pytest.fixture(scope="module")
def outdir(tmp_path_factory):
    from tpuasm.compiler.pipeline import compile_model
    d = tmp_path_factory.mktemp("model")
    path = float_models.save(float_models.build(LAYERS, (12,)), d / "two.onnx")
    calib = np.random.default_rng(0).normal(0, 1, (30, 12)).astype(np.float32)
    compile_model(path, batch=2, calibration=calib, config={"array_size": 16}).save(d / "out")
    steps = json.loads((d / "out" / "manifest.json").read_text())["steps"]
    assert [s["kind"] for s in steps if s["kind"] == "tpu"] == ["tpu", "tpu"], steps
    return d / "out"


def open_outdir(outdir, segment=None):
    return load_session(Namespace(program=outdir, host=None, weights=None, config=[],
                                  segment=segment))


def test_outdir_opens_segment0_with_its_data_and_runs_to_the_halt(outdir):
    session = open_outdir(outdir)
    assert session.segment == "segment0" and session.source_name.endswith("segment0.tasm")
    host = np.load(outdir / "segment0.host.npy")
    assert np.array_equal(session.machine.host[:len(host)].view(np.int8), host.view(np.int8))
    engine = Engine(session)
    assert run(engine, "continue").stop.kind == "halted"
    text = run(engine, "segment").text()
    assert "=> segment0" in text and "host1" in text and "host part" in text


def test_segment_switches_and_node_breakpoints_follow_their_node(outdir):
    engine = Engine(open_outdir(outdir))
    run(engine, "segment segment1")
    s = engine.session
    assert s.segment == "segment1" and s.machine.cycle == 0
    host = np.load(outdir / "segment1.host.npy")
    assert np.array_equal(s.machine.host[:len(host)].view(np.int8), host.view(np.int8))
    run(engine, "break node gemm2")
    run(engine, "segment segment0")
    assert "waits: not in this segment" in run(engine, "info breakpoints").text()
    run(engine, "disable 1")
    assert run(engine, "continue").stop.kind == "halted"          # disabled: no move on
    assert s.segment == "segment0"
    run(engine, "enable 1")
    run(engine, "segment segment1")
    stop = run(engine, "continue").stop
    assert stop.kind == "breakpoint" and "node gemm2" in stop.message
    assert "no segment 'segment9'" in run(engine, "segment segment9", ok=False).text()
    assert engine.session.segment == "segment1"                    # a failed switch changes nothing


def test_segment_outside_a_compiled_model_is_refused(here):
    engine = Engine(make_session(here))
    assert "not a compiled model" in run(engine, "segment segment1", ok=False).text()


def test_cli_opens_outdir_and_a_chosen_segment(outdir, tmp_path, capsys):
    script = tmp_path / "s.tdb"
    script.write_text('continue\nexpect status == "halted"\nsegment\n')
    assert main([str(outdir), "--segment", "segment1", "--batch", str(script)]) == 0
    assert "=> segment1" in capsys.readouterr().out
    assert main([str(outdir), "--segment", "nope", "--batch", str(script)]) == 2
    assert "no segment 'nope'" in capsys.readouterr().err
    # a screenshot never replaces a file of the model
    before = (outdir / "manifest.json").read_bytes()
    assert main([str(outdir), "--screenshot", str(outdir / "manifest.json")]) == 2
    assert (outdir / "manifest.json").read_bytes() == before


@pilot_test
async def test_switching_segments_on_the_screen(outdir):
    async with open_app(None, session=open_outdir(outdir), size=(80, 24)) as (app, pilot):
        view = app.query_one(SourceView)
        assert view.listing.name.endswith("segment0.tasm")
        await command(pilot, "segment segment1")
        assert view.listing.name.endswith("segment1.tasm")
        assert "opened segment1" in log_text(app)
        assert view.next_line is not None and \
            int(view.scroll_offset.y) < view.next_line <= int(view.scroll_offset.y) + view.size.height


def test_input_gives_each_segment_the_host_image_of_those_inputs(outdir, tmp_path):
    """The last segment, run in the debugger on `--input` data, ends with what `tpuasm
    infer` computes for the same rows (the host part after it applied)."""
    from tpuasm.compiler.runtime.model import load
    from tpuasm.compiler.runtime.steps import HostStep, TpuStep
    x = np.random.default_rng(5).normal(0, 1, (3, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    session = load_session(Namespace(program=outdir, host=None, weights=None, config=[],
                                     segment="segment1", input=tmp_path / "x.npy"))
    engine = Engine(session)
    assert run(engine, "continue").stop.kind == "halted"
    model = load(outdir)
    last_tpu = [s for s in model.steps if isinstance(s, TpuStep)][-1]
    tail = model.steps[model.steps.index(last_tpu) + 1:]
    values = dict(last_tpu.program.read_outputs(session.machine.host))
    values = {k: np.asarray(v).reshape((model.batch,) + tuple(last_tpu.onnx_shapes[k]))
              for k, v in values.items()}
    for step in tail:
        assert isinstance(step, HostStep)
        step.run(values, model.batch, "emulator", dict(model.config))
    want = model.run(x[:model.batch])
    for name, y in want.items():
        np.testing.assert_array_equal(values[name][:len(y)], y)
    # not the sample batch saved in OUTDIR: the image of these inputs
    first = load_session(Namespace(program=outdir, host=None, weights=None, config=[],
                                   segment=None, input=tmp_path / "x.npy"))
    saved = np.load(outdir / "segment0.host.npy").view(np.uint8)
    assert first.machine.host.shape == saved.shape
    assert not np.array_equal(first.machine.host, saved)
    # a wrong input file: one clear error
    np.save(tmp_path / "bad.npy", np.zeros((2, 5), np.float32))
    with pytest.raises(Exception, match="--input"):
        load_session(Namespace(program=outdir, host=None, weights=None, config=[],
                               segment=None, input=tmp_path / "bad.npy"))


@pilot_test
async def test_the_source_pane_widens_for_compiled_code(outdir):
    async with open_app(None, session=open_outdir(outdir), size=(120, 40)) as (app, pilot):
        view = app.query_one(SourceView)
        pipeline = app.query_one("#pipeline-box")
        # the node column and the instruction fit, and the pipeline keeps its columns
        assert view.outer_size.width >= min(view.wanted_width(), 120 - 56)
        assert view.outer_size.width > 0.42 * 120 + 1
        assert pipeline.outer_size.width >= 56
        await pilot.resize_terminal(80, 24)                 # narrow: halves again
        await pilot.pause()
        assert abs(view.outer_size.width - pipeline.outer_size.width) <= 2


def test_continue_goes_on_to_the_segment_a_node_breakpoint_waits_in(outdir, tmp_path):
    """`break node gemm2` in segment0 waits; `continue` runs segment0 to its end, shows
    host part host1's tensors and goes on in segment1 (its data: the image of --input) to
    gemm2's first instruction.  host1's input is what segment0 computed on the emulator."""
    x = np.random.default_rng(7).normal(0, 1, (2, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    session = load_session(Namespace(program=outdir, host=None, weights=None, config=[],
                                     segment=None, input=tmp_path / "x.npy"))
    engine = Engine(session)
    r = run(engine, "break node gemm2")
    assert "waits: the node is in segment1" in r.text()
    from tpuasm.compiler.runtime.model import load
    from tpuasm.compiler.runtime.steps import TpuStep
    first = next(st for st in load(outdir).steps if isinstance(st, TpuStep))
    r = run(engine, "continue")
    text = r.text()
    assert session.segment == "segment1" and r.ui == ("reload", None)
    assert r.stop.kind == "breakpoint" and r.stop.index == session.program.node_runs("gemm2")[0].start
    assert text.index("halted") < text.index("host part host1:") < text.index("opened segment1")
    image = np.asarray(session.segment_hosts["segment1"])
    assert np.array_equal(session.machine.host[:len(image)].view(np.int8), image.view(np.int8))
    # host1's input, as the listing prints it, is segment0's output on the emulator
    fresh = load_session(Namespace(program=outdir, host=None, weights=None, config=[],
                                   segment=None, input=tmp_path / "x.npy"))
    assert run(Engine(fresh), "continue").stop.kind == "halted"
    (name, computed), = first.program.read_outputs(fresh.machine.host).items()
    recorded = session.host_parts["host1"]["inputs"][name]
    assert np.array_equal(np.asarray(computed).reshape(recorded.shape), recorded)
    from debugger.model_steps import tensor_text
    assert f"in  {tensor_text(name, recorded)}" in text and str(recorded.shape) in text
    listing = run(engine, "segment").text()
    assert "=> segment1" in listing and f"in  {tensor_text(name, recorded)}" in listing
    out_name, out = next(iter(session.host_parts["host1"]["outputs"].items()))
    assert f"out {tensor_text(out_name, out)}" in listing
    assert run(engine, "continue").stop.kind == "halted" and session.segment == "segment1"


def test_segment_listing_without_input_names_the_host_tensors_and_shapes(outdir):
    text = run(Engine(open_outdir(outdir)), "segment").text()
    assert "in  t0_QuantizeLinear_Output (2, 8)" in text.replace("[", "(").replace("]", ")") or \
        re.search(r"in  \S+ \(2, 8\)", text)
    assert "--input X.npy" in text


@pilot_test
async def test_continue_key_moves_the_screen_on_to_the_waiting_node(outdir):
    async with open_app(None, session=open_outdir(outdir), size=(80, 24)) as (app, pilot):
        view = app.query_one(SourceView)
        await command(pilot, "break node gemm2")
        await pilot.press("c")
        await app.workers.wait_for_complete()
        for _ in range(20):
            await pilot.pause(0.05)
            if view.listing.name.endswith("segment1.tasm"):
                break
        assert view.listing.name.endswith("segment1.tasm") and app.session.segment == "segment1"
        assert "host part host1:" in log_text(app) and "opened segment1" in log_text(app)
        runs = app.session.program.node_runs("gemm2")
        assert app.session.next_to_issue() == runs[0].start
        assert "internal error" not in log_text(app)

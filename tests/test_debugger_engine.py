"""The command engine, expressions, breakpoints, reverse execution and --batch, without a screen.

Values are checked against the numpy oracle in test_debugger_support (written from
spec/isa.md), and reverse execution against a fresh machine run to the same cycle.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from debugger import main
from debugger.commands import Engine
from debugger.expr import ExprError
from test_debugger_support import (engine, run,  # noqa: F401
                                   FAULTY, LINE_ACT1, LINE_ACT2, LINE_MMC1, LINE_MMC2, LONG, SMALL,
                                   assert_same_state, fresh_state_at, here, machine_state,  # noqa: F401
                                   make_session, oracle, small_data, write_program)


# -- running and stopping ----------------------------------------------------------------------
def test_results_match_the_numpy_oracle(engine):
    host, weights = small_data()
    want = oracle(host, weights)
    r = run(engine, "continue")
    assert r.stop.kind == "halted"
    m = engine.session.machine
    assert np.array_equal(m.host[4:8].view(np.int8), want["hidden2"])
    assert np.array_equal(m.acc[0:4], want["acc2"])
    rows = ", ".join(str(list(map(int, row))) for row in want["hidden2"])
    run(engine, f"expect host[4:8] == [{rows}]")


def test_breakpoint_on_a_line_stops_before_its_instruction_issues(engine):
    r = run(engine, f"break {LINE_MMC1}")
    assert "breakpoint 1 at small.tasm:14 (instruction #4)" in r.text()
    r = run(engine, "continue")
    assert r.stop.kind == "breakpoint" and r.stop.index == 4
    m = engine.session.machine
    assert m.issue_cycle(4) == -1 and m.issue_cycle(3) >= 0
    assert engine.session.next_to_issue() == 4
    assert not m.acc.any()                      # the multiply has not run
    assert engine.session.breakpoints[1].hits == 1
    r = run(engine, "continue")                 # a run started at a breakpoint issues it
    assert r.stop.kind == "halted"


def test_conditional_breakpoint(engine):
    host, weights = small_data()
    acc1 = oracle(host, weights)["acc1"]
    # true once the first multiply has completed.  The second multiply issues while the first
    # one still drains out of the array (spec/timing.md section 6), so the first place where
    # its result is visible is the second Activate (index 7), which issues while the second
    # multiply drains in turn.
    run(engine, f"break {LINE_ACT1} if acc[0][0] == {acc1[0][0] + 1}")     # never true
    run(engine, f"break {LINE_ACT2} if acc[0][0] == {acc1[0][0]}")
    r = run(engine, "continue")
    assert r.stop.kind == "breakpoint" and r.stop.number == 2 and r.stop.index == 7
    assert engine.session.breakpoints[1].hits == 0


def test_condition_on_cycle_and_ignore_count(here):
    engine = Engine(make_session(here, LONG, "long.tasm"))
    run(engine, "break 5 if cycle > 3000")
    r = run(engine, "continue")
    m = engine.session.machine
    assert r.stop.kind == "breakpoint" and m.cycle > 3000
    first = r.stop.index
    assert first > 0 and m.issue_cycle(first - 1) <= 3000     # the crossing before did not hold
    run(engine, "ignore 1 3")
    r = run(engine, "continue")
    assert r.stop.index == first + 4            # three crossings passed, the fourth stops
    run(engine, "condition 1")
    r = run(engine, "continue")
    assert r.stop.index == first + 5
    assert "hit 3x" in run(engine, "info breakpoints").text()


def test_continue_from_a_breakpoint_location_does_not_stop_there_again(engine):
    run(engine, f"until line {LINE_MMC1}")
    assert engine.session.next_to_issue() == 4
    run(engine, f"break {LINE_MMC1}")
    assert run(engine, "continue").stop.kind == "halted"
    run(engine, "restart")
    run(engine, "break *0")                      # at cycle 0 the first instruction still stops
    r = run(engine, "continue")
    assert r.stop.kind == "breakpoint" and r.stop.index == 0 and engine.session.machine.cycle == 0


def test_tbreak_until_delete_disable(engine):
    run(engine, f"tbreak {LINE_MMC1}")
    assert run(engine, "continue").stop.index == 4
    assert not engine.session.breakpoints                   # temporary: gone
    r = run(engine, f"until line {LINE_MMC2}")
    assert r.stop.index == 6 and engine.session.next_to_issue() == 6
    run(engine, "break 18")
    run(engine, "disable 2")
    assert run(engine, "continue").stop.kind == "halted"
    run(engine, "enable 2")
    run(engine, "delete 2")
    assert run(engine, "info breakpoints").text() == "no breakpoints or watchpoints"
    run(engine, "delete 9", ok=False)


def test_watchpoint_stops_after_a_write_that_changes_the_rows(engine):
    host, weights = small_data()
    want = oracle(host, weights)
    r = run(engine, "watch hidden")
    assert "ub rows 4..7" in r.text()
    r = run(engine, "continue")
    assert r.stop.kind == "watchpoint" and r.stop.index == 5        # ACT.R wrote them
    ub = engine.session.machine.ub
    assert np.array_equal(ub[4:8].view(np.int8), want["hidden1"])
    r = run(engine, "continue")
    if not np.array_equal(want["hidden1"], want["hidden2"]):
        assert r.stop.kind == "watchpoint" and r.stop.index == 7
        assert np.array_equal(ub[4:8].view(np.int8), want["hidden2"])
    assert run(engine, "continue").stop.kind == "halted"


def test_catch_tag_and_interrupt(engine):
    run(engine, "catch tag")
    run(engine, "catch interrupt")
    r = run(engine, "continue")
    assert r.stop.kind == "tag" and "Debug_Tag 7" in r.text()
    r = run(engine, "continue")
    assert r.stop.kind == "interrupt" and "Interrupt_Host 3" in r.text()
    assert run(engine, "continue").stop.kind == "halted"
    events = run(engine, "info events").text()
    assert "Debug_Tag 7" in events and "Interrupt_Host 3" in events


def test_fault_is_a_stop_not_an_exception(here):
    engine = Engine(make_session(here, FAULTY, "faulty.tasm"))
    r = run(engine, "continue")
    assert r.stop.kind == "fault"
    assert "no weight tile" in r.text() and "faulty.tasm:5" in r.text()
    assert run(engine, "step").stop.kind == "fault"        # stays stopped, no traceback
    run(engine, "expect status == 'fault'")
    run(engine, "expect fault == 'no_tile'")
    r = run(engine, "reverse-step")                         # time travel out of a fault
    assert engine.session.machine.status == "paused"


def test_run_n_and_step_counts(engine):
    run(engine, "step 5")
    assert engine.session.machine.cycle == 5
    run(engine, "run 100")
    assert engine.session.machine.cycle == 105
    run(engine, "next 2")
    assert engine.session.machine.retired(0) and engine.session.machine.retired(1)
    run(engine, "step 0", ok=False)


# -- reverse execution ---------------------------------------------------------------------------
@pytest.mark.parametrize("target", [1, 300, 707, 760])
def test_reverse_step_restores_exactly_the_state_of_a_fresh_run(engine, here, target):
    run(engine, f"run {target + 37}")
    run(engine, "reverse-step 37")
    assert engine.session.machine.cycle == target
    assert_same_state(machine_state(engine.session.machine), fresh_state_at(here, target))
    run(engine, "reverse-step")
    assert_same_state(machine_state(engine.session.machine), fresh_state_at(here, target - 1))


def test_reverse_next_and_reverse_continue(engine, here):
    run(engine, f"break {LINE_MMC2}")
    run(engine, "continue")
    stop_cycle = engine.session.machine.cycle
    run(engine, "continue")
    assert engine.session.machine.status == "halted"
    r = run(engine, "reverse-continue")
    assert r.stop.kind == "breakpoint" and engine.session.machine.cycle == stop_cycle
    # the same state as a fresh run stepped there (status aside: "breakpoint" vs "paused")
    ignore_status = {"status": None}
    assert_same_state(machine_state(engine.session.machine) | ignore_status,
                      fresh_state_at(here, stop_cycle) | ignore_status)
    before = engine.session.machine.cycle
    run(engine, "reverse-next")
    m = engine.session.machine
    assert m.cycle < before
    assert_same_state(machine_state(m), fresh_state_at(here, m.cycle))
    run(engine, "restart")
    assert m.cycle == 0 and not m.acc.any()


# -- looking at things ---------------------------------------------------------------------------
def test_x_and_print_formats(engine):
    host, _ = small_data()
    run(engine, "next")                     # the host read has finished
    r = run(engine, "x/8d ub[0]")
    assert r.text() == "ub[0][0]:       " + " ".join(str(v) for v in host[0])
    r = run(engine, "x/4x input + 1")
    assert r.text().split(":")[-1].split() == [f"{int(v) & 0xff:02x}" for v in host[1][:4]]
    r = run(engine, "x/3u ub[2][5]")
    assert r.text().split(":")[-1].split() == [str(int(v) & 0xff) for v in host[2][5:8]]
    r = run(engine, "x/2xw ub[0]")           # two little-endian int32 words from four bytes each
    words = host[0].view("<i4")
    assert r.text().split(":")[-1].split() == [f"{int(w) & 0xffffffff:08x}" for w in words[:2]]
    assert run(engine, "print ub[1][2] + 1").text() == f"ub[1][2] + 1 = {host[1][2] + 1}"
    assert run(engine, "print sum(ub[0])").text().endswith(f"= {int(host[0].astype(int).sum())}")
    assert run(engine, "print acc.sums + 8").text() == "acc.sums + 8 = 8"
    assert run(engine, "print hidden").text() == "hidden = 4"
    assert run(engine, "print act_mult").text() == "act_mult = 1"
    w = small_data()[1]
    r = run(engine, "x/8d tile[1]")
    assert r.text() == "tile[1][0][0]:  " + " ".join(str(v) for v in w[1][0])
    run(engine, "print nosuch", ok=False)
    run(engine, "print __import__('os')", ok=False)
    run(engine, "x/4q ub[0]", ok=False)
    run(engine, "x/4d ub[9999]", ok=False)


def test_info_commands(engine):
    run(engine, f"break {LINE_MMC1}")
    run(engine, "continue")
    run(engine, "step 3")
    pipe = run(engine, "info pipeline").text()
    assert re.search(r"^matrix\s+#4 MMC\.SO input, sums, 4", pipe, re.M)    # as the source writes it
    assert "STALL:" in pipe
    counters = run(engine, "info counters").text()
    assert "instructions retired" in counters and "weight shift" in counters
    assert "act_shift" in run(engine, "info registers").text()
    assert "FIFO" in run(engine, "info weights").text()
    assert "hidden" in run(engine, "info symbols").text()
    listing = run(engine, "list").text()
    assert "MMC.SO input, sums, 4" in listing
    assert "help" in run(engine, "help").text() and "x/NFU" in run(engine, "help x").text()
    run(engine, "info nothing", ok=False)


def test_goto_and_radix_results(engine):
    r = run(engine, "goto acc.sums + 2")
    assert (r.goto.memory, r.goto.row) == ("acc", 2)
    r = run(engine, "goto hidden")
    assert (r.goto.memory, r.goto.row) == ("ub", 4)
    r = run(engine, "goto 12")
    assert (r.goto.memory, r.goto.row) == ("ub", 12)
    run(engine, "goto ub[64]", ok=False)
    assert run(engine, "radix signed int32").ui == ("radix", "signed", "int32")
    run(engine, "radix octal", ok=False)


def test_expressions(engine):
    ev = engine.session.eval
    assert ev.value("1 + 2 * 3") == 7 and ev.value("7 / 2") == 3 and ev.value("-7 / 2") == -4
    assert ev.truth("cycle == 0 and not retired")
    assert ev.location("acc[3][7]").memory == "acc"
    loc = ev.location("ub[4:8]")
    assert (loc.memory, loc.row, loc.rows) == ("ub", 4, 4)
    loc = ev.location("hidden")
    assert (loc.memory, loc.row, loc.rows) == ("ub", 4, 4)
    assert ev.location("ub.hidden + 1").row == 5
    for bad in ("", "1 +", "open('x')", "cycle.__class__", "lambda: 1", "[x for x in ub]",
                "2 ** 10 ** 9", "1 << 100000000", "1 / 0"):
        with pytest.raises(ExprError):
            ev.value(bad)


def test_bad_commands_fail_with_a_message(engine):
    for line in ("frobnicate", "break 3", "break nowhere", "break 14 if (", "watch ub[60:70]",
                 "ignore 5 1", "condition 7 cycle", "catch dogs", "continue 3", "run"):
        r = engine.execute(line)
        assert not r.ok and r.lines, line


# -- batch mode --------------------------------------------------------------------------------
def test_batch_output_and_exit_code(here, capsys):
    args = write_program(here)
    want = oracle(args.host_array, args.weights_array)
    script = here / "check.tdb"
    script.write_text(f"""\
# comments and blank lines are skipped

break {LINE_MMC1}
continue
expect retired == 3
next
print acc[0][0:4]
continue
expect host[4][0] == {want['hidden2'][0][0]}
expect status == "halted"
""")
    code = main([str(args.program), "--host", str(args.host), "--weights", str(args.weights),
                 "--batch", str(script)])
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    expected = [
        r"breakpoint 1 at .*small\.tasm:14 \(instruction #4\)",
        r"cycle \d+: Debug_Tag 7 from #3 `TAG 7` \(.*small\.tasm:13\)",
        r"breakpoint 1 at #4 `MMC\.SO input, sums, 4` \(.*small\.tasm:14\), cycle \d+",
        r"ok retired == 3",             # RW, RW, TAG: the RHM retires during `next`
        r"cycle \d+: #4 `MMC\.SO input, sums, 4` \(.*\) finished its stage; 2 instruction\(s\) retired; "
        r"#\d `.*` \(.*\) next",
        re.escape(f"acc[0][0:4] = {np.array2string(want['acc1'][0][:4])}"),
        r"cycle \d+: Interrupt_Host 3 from #9 `INT 3` \(.*small\.tasm:19\)",
        r"halted at cycle \d+",
        re.escape(f"ok host[4][0] == {want['hidden2'][0][0]}"),
        r'ok status == "halted"',
    ]
    assert len(out) == len(expected), out
    for line, pattern in zip(out, expected):
        assert re.fullmatch(pattern, line), (line, pattern)


def test_batch_failures_exit_1(here, capsys):
    args = write_program(here)
    script = here / "bad.tdb"
    script.write_text("continue\nexpect acc[0][0] == 123456\nbogus\nprint 1\n")
    code = main([str(args.program), "--host", str(args.host), "--weights", str(args.weights),
                 "--batch", str(script)])
    out = capsys.readouterr().out
    assert code == 1
    assert "expect failed: acc[0][0] == 123456  (acc[0][0] is" in out
    assert "bad.tdb:2: command failed" in out and "bad.tdb:3: command failed: bogus" in out
    assert "1 = 1" in out                   # later commands still run
    assert "2 command(s) failed" in out


def test_input_errors_exit_2_without_traceback(here, capsys):
    args = write_program(here)
    (here / "script.tdb").write_text("continue\n")
    base = ["--batch", "script.tdb"]
    cases = {
        "missing program": (["nothere.tasm", *base], "nothere.tasm: no such file"),
        "missing host": ([str(args.program), "--host", "nope.npy", *base], "--host nope.npy: no such file"),
        "missing script": ([str(args.program), "--batch", "nope.tdb"], "nope.tdb"),
        "bad option": ([str(args.program), "--frobnicate"], "unrecognized arguments"),
    }
    (here / "broken.tasm").write_text(".config array_size=8\n    MMC.SO 1, 2\n    HLT\n")
    cases["assembly error"] = (["broken.tasm", *base], "^")
    np.save(here / "wrong.npy", np.zeros((3, 5), np.int8))
    cases["bad data file"] = ([str(args.program), "--host", "wrong.npy", *base], "wrong.npy")
    (here / "junk.tbin").write_bytes(b"TBIN" + b"\x00" * 10)
    cases["corrupt binary"] = (["junk.tbin", *base], "junk.tbin")
    for name, (argv, message) in cases.items():
        code = main(argv)
        captured = capsys.readouterr()
        assert code == 2, name
        assert message in captured.err, (name, captured.err)
        assert "Traceback" not in captured.err + captured.out, name


def test_batch_from_stdin_and_through_tpuasm_debug(here, capsys, monkeypatch):
    import io

    from tpuasm.cli import main as tpuasm_main
    args = write_program(here)
    data = ["--host", str(args.host), "--weights", str(args.weights)]
    monkeypatch.setattr("sys.stdin", io.StringIO("continue\nexpect status == \"halted\"\n"))
    assert main([str(args.program), *data, "--batch", "-"]) == 0
    assert 'ok status == "halted"' in capsys.readouterr().out
    (here / "s.tdb").write_text("print 6 * 7\n")
    assert tpuasm_main(["debug", str(args.program), *data, "--batch", "s.tdb"]) == 0
    assert "6 * 7 = 42" in capsys.readouterr().out


def test_python_m_debugger_help():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "debugger", "--help"], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert "--batch" in out.stdout and "--weights" in out.stdout


def test_missing_weights_and_a_script_that_is_not_utf8(here, capsys):
    args = write_program(here)
    (here / "s.tdb").write_text("continue\n")
    assert main([str(args.program), "--weights", "nope.npy", "--batch", "s.tdb"]) == 2
    err = capsys.readouterr().err
    assert "--weights nope.npy: no such file" in err and "Traceback" not in err
    (here / "latin1.tdb").write_bytes("echo caf\xe9\n".encode("latin-1"))
    assert main([str(args.program), "--batch", "latin1.tdb"]) == 2
    err = capsys.readouterr().err
    assert "error: --batch latin1.tdb: not UTF-8 text" in err and "Traceback" not in err


def test_tbin_with_debug_info_debugs_at_source_level(here, capsys):
    from tpuasm.assembler import assemble_file
    args = write_program(here)
    assemble_file(args.program).save(here / "small.tbin")
    assemble_file(args.program).stripped().save(here / "bare.tbin")
    (here / "s.tdb").write_text(f"break {LINE_MMC1}\ncontinue\nbreak *6\ncontinue\nlist\n")
    assert main(["small.tbin", "--host", "host.npy", "--weights", "w.npy", "--batch", "s.tdb"]) == 0
    assert "small.tasm:14" in capsys.readouterr().out
    (here / "b.tdb").write_text("break *4\ncontinue\nlist\n")
    assert main(["bare.tbin", "--host", "host.npy", "--weights", "w.npy", "--batch", "b.tdb"]) == 0
    out = capsys.readouterr().out
    assert "breakpoint 1 at #4 `MMC.SO 0, 0, 4`" in out and "=>    5  MMC.SO 0, 0, 4" in out


def test_config_overrides(here, capsys):
    args = write_program(here)
    (here / "s.tdb").write_text("expect ub_rows == 128 and array_size == 8\ncontinue\nexpect fault == 'hazard'\n")
    data = ["--host", str(args.host), "--weights", str(args.weights)]
    # strict hazard checking is a machine setting: this program has no SYNC between MMC and ACT
    assert main([str(args.program), *data, "--config", "hazards=error,ub_rows=128",
                 "--batch", "s.tdb"]) == 0, capsys.readouterr().out
    assert main([str(args.program), "--config", "array_size", "--batch", "s.tdb"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    assert main([str(args.program), "--config", "bogus=1", "--batch", "s.tdb"]) == 2
    assert "--config bogus: unknown setting (choose from array_size" in capsys.readouterr().err


# -- the lexer -----------------------------------------------------------------------------------
def test_lexer_names_come_from_the_isa_table():
    from pygments.token import Comment, Keyword, Name
    from tpuasm.isa import ISA_TABLE
    from debugger.lexer import TasmLexer
    tokens = [(t, v) for t, v in TasmLexer().get_tokens(
        "loop: MMC.SO input, acc.sums, 4, repeat=2 ; c\n    CFG act_shift, 8\n") if v.strip()]
    assert (Keyword, "MMC") in tokens and (Keyword.Type, ".SO") in tokens
    assert (Name.Builtin, "act_shift") in tokens and (Name.Attribute, "repeat") in tokens
    assert (Name.Label, "loop:") in tokens and (Comment.Single, "; c") in tokens
    for spec in ISA_TABLE.instructions.values():
        for name in spec.names:
            assert next(TasmLexer().get_tokens(name + "\n"))[0] is Keyword, name


def test_lexer_is_registered_as_a_pygments_plugin():
    import tomllib
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["pygments.lexers"]["tasm"] == "debugger.lexer:TasmLexer"
    from importlib.metadata import entry_points
    if not any(ep.name == "tasm" for ep in entry_points(group="pygments.lexers")):
        pytest.skip("package metadata predates the entry point: reinstall (make) to register it")
    from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
    assert get_lexer_by_name("tpuasm").name == "TPU assembly"
    assert get_lexer_for_filename("x.tasm").name == "TPU assembly"
    assert get_lexer_for_filename("x.tasm", code=SMALL).name == "TPU assembly"


# -- the real machine shape ------------------------------------------------------------------
def test_matmul_tiled_at_n256(tmp_path):
    from test_debugger_support import MATMUL_TILED_MMC2, matmul_tiled_session
    session, y = matmul_tiled_session(tmp_path)
    m = session.machine
    assert m.config.array_size == 256 and m.ub.shape == (98_304, 256)
    engine = Engine(session)
    run(engine, f"break {MATMUL_TILED_MMC2}")
    r = run(engine, "continue")
    assert r.stop.kind == "breakpoint" and m.issue_cycle(r.stop.index) == -1
    at_break = machine_state(m)
    run(engine, "run 700")
    run(engine, "reverse-step 700")                     # History at full size, exactly
    assert_same_state(machine_state(m), at_break | {"status": m.status})
    run(engine, "delete")
    assert run(engine, "continue").stop.kind == "halted"
    base = session.symbols["host.y"][1]
    assert np.array_equal(m.host[base:base + len(y)].view(np.int8), y.view(np.int8))
    assert "array active" in run(engine, "info counters").text()


def test_screenshot_option_runs_the_script_on_the_screen_and_saves_an_svg(here, capsys):
    args = write_program(here)
    (here / "s.tdb").write_text(f"break {LINE_MMC1}\ncontinue\nstep 3\n")
    code = main([str(args.program), "--host", str(args.host), "--weights", str(args.weights),
                 "--batch", "s.tdb", "--screenshot", "shot.svg", "--size", "150x45"])
    assert code == 0, capsys.readouterr()
    svg = (here / "shot.svg").read_text()
    assert svg.startswith("<svg") and "pipeline" in svg and "weight&#160;shift" in svg
    assert main([str(args.program), "--screenshot", "x.svg", "--size", "big"]) == 2


def test_regions_that_do_not_broadcast_are_an_expression_error(engine):
    # found by the debug fuzz target: `next acc[4][0:8] * ub[0:99999999]` was a numpy
    # ValueError traceback
    r = run(engine, "print acc[4][0:3] * ub[0:2]", ok=False)      # (3,) and (2, 8)
    assert "broadcast" in r.text()
    assert run(engine, "print acc[4][0:8] * 2").ok

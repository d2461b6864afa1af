"""The command line as a user meets it: exit codes, messages, files written or not,
and never a traceback."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tpuasm.cli import main

GOOD = """\
.config array_size=8, ub_rows=64, acc_rows=32
.host x, 4
.host y, 4
.ub   x, 4
.ub   y, 4
.acc  s, 4
        RW      0
        RHM     host.x, ub.x, 4
        MMC.SO  ub.x, acc.s, 4
        ACT.R   acc.s, ub.y, 4
        WHM     ub.y, host.y, 4
        HLT
"""


@pytest.fixture
def project(tmp_path):
    """A small program with its data, and the numpy answer: relu(x @ w) saturated to int8."""
    rng = np.random.default_rng(7)
    host = np.zeros((8, 8), np.int8)
    host[:4] = rng.integers(-5, 6, (4, 8))
    weights = rng.integers(-5, 6, (1, 8, 8)).astype(np.int8)
    (tmp_path / "prog.tasm").write_text(GOOD)
    np.save(tmp_path / "host.npy", host)
    np.save(tmp_path / "w.npy", weights)
    acc = host[:4].astype(np.int64) @ weights[0].astype(np.int64)
    expected = np.clip(np.maximum(acc, 0), -128, 127).astype(np.int8)
    return tmp_path, expected


def run_cli(*args):
    return main([str(a) for a in args])


def test_asm_writes_a_binary_listing_and_symbols(project, capsys):
    d, _ = project
    assert run_cli("asm", d / "prog.tasm", "--listing", d / "prog.lst", "--symbols", d / "prog.sym") == 0
    assert (d / "prog.tbin").read_bytes()[:4] == b"TBIN"
    assert "RHM" in (d / "prog.lst").read_text().upper()
    assert "x" in (d / "prog.sym").read_text()
    assert "6 instructions" in capsys.readouterr().err


def test_asm_errors_point_at_every_mistake_and_write_nothing(tmp_path, capsys):
    src = tmp_path / "bad.tasm"
    src.write_text("RHM 0, 0, 4\nMMX 0, 0, 4\nACT.Z 0, 0, 1\nRHM 0, undefined_thing, 1\n")
    assert run_cli("asm", src) == 2
    err = capsys.readouterr().err
    for line in (2, 3, 4):
        assert f"bad.tasm:{line}:" in err
    assert "^" in err and "Traceback" not in err
    assert not (tmp_path / "bad.tbin").exists()


def test_disasm_round_trips_to_the_same_code(project, capsys):
    d, _ = project
    run_cli("asm", d / "prog.tasm", "-o", d / "a.tbin")
    assert run_cli("disasm", d / "a.tbin", "-o", d / "back.tasm") == 0
    run_cli("asm", d / "back.tasm", "-o", d / "b.tbin")
    from tpuasm.binary import load_binary
    a, b = load_binary(d / "a.tbin"), load_binary(d / "b.tbin")
    assert a.stripped().to_bytes() == b.stripped().to_bytes()


def test_run_computes_the_numpy_answer_and_writes_outputs(project, capsys):
    d, expected = project
    code = run_cli("run", d / "prog.tasm", "--host", d / "host.npy", "--weights", d / "w.npy",
                   "--out", d / "out.npy", "--stats", d / "stats.json", "--trace", d / "trace.json")
    assert code == 0
    out = np.load(d / "out.npy")
    assert out.dtype == np.int8 and out.shape == (8, 8)
    assert np.array_equal(out[4:], expected)
    stats = json.loads((d / "stats.json").read_text())
    parts = ("array_active_cycles", "weight_stall_cycles", "weight_shift_cycles", "non_matrix_cycles")
    assert sum(stats[k] for k in parts) == stats["cycles"] > 0
    assert stats["useful_macs"] == 4 * 8 * 8
    trace = json.loads((d / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("ph") == "X" for e in events)
    assert "cycles" in capsys.readouterr().out


def test_run_a_binary_gives_the_same_result(project):
    d, expected = project
    run_cli("asm", d / "prog.tasm", "-o", d / "p.tbin", "--no-debug")
    assert run_cli("run", d / "p.tbin", "--host", d / "host.npy", "--weights", d / "w.npy",
                   "--out", d / "out.npy", "-q") == 0
    assert np.array_equal(np.load(d / "out.npy")[4:], expected)


def test_machine_fault_exits_1_with_the_instruction_and_line(project, capsys):
    d, _ = project
    (d / "oob.tasm").write_text(".config array_size=8, ub_rows=64\nRHM 0, 0, 4\nRHM 6, 0, 4\nHLT\n")
    assert run_cli("run", d / "oob.tasm", "--host", d / "host.npy", "-q") == 1
    err = capsys.readouterr().err
    assert "oob.tasm:3" in err and "host" in err.lower() and "Traceback" not in err


def test_max_cycles_is_a_fault(project, capsys):
    d, _ = project
    assert run_cli("run", d / "prog.tasm", "--host", d / "host.npy", "--weights", d / "w.npy",
                   "--max-cycles", "5", "-q") == 1
    assert "max" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("args, message", [
    (["run", "{d}/prog.tasm", "--host", "{d}/missing.npy"], "missing.npy"),
    (["run", "{d}/prog.tasm", "--host", "{d}/w.npy"], "shape"),
    (["run", "{d}/missing.tasm"], "missing.tasm"),
    (["run", "{d}/junk.tbin"], "junk.tbin"),
    (["asm", "{d}/prog.tasm", "--config", "array_size"], "KEY=VALUE"),
    (["asm", "{d}/prog.tasm", "--config", "colour=red"], "colour"),
    (["asm", "{d}/prog.tasm", "--config", "array_size=big"], "not an integer"),
    (["disasm", "{d}/junk.tbin"], "junk.tbin"),
])
def test_input_errors_exit_2_with_a_message(project, capsys, args, message):
    d, _ = project
    (d / "junk.tbin").write_bytes(b"TBIN\x01\x00\x04\x00garbage")
    assert run_cli(*[a.format(d=d) for a in args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as e:
        main(["run"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["run", "x.tasm", "--max-cycles", "0"])
    assert e.value.code == 2


def test_python_dash_m_and_version():
    done = subprocess.run([sys.executable, "-m", "tpuasm", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("tpuasm ")


@pytest.mark.parametrize("setting, value", [
    ("ub_rows=064", 64), ("UB_ROWS=64", 64), ("ub_rows=0x4_0", 64), ("Profile=opentpu", "opentpu"),
])
def test_config_settings_read_alike_everywhere(setting, value):
    """`--config`, the debugger's --config and `.config` agree on keys and numbers."""
    from debugger.cli import split_config
    from tpuasm.assembler import assemble
    from tpuasm.cli import parse_config
    key = setting.partition("=")[0].lower()
    assert parse_config([setting]) == {key: value}
    assert split_config([setting]) == ({key: value}, {})
    assert getattr(assemble(f".config {setting}\nHLT\n").shape, key) == value
    given, _, text = setting.partition("=")
    assert getattr(assemble("HLT\n", config={given: text}).shape, key) == value


def test_a_bad_config_value_is_named_the_same_way_everywhere():
    from debugger.cli import InputError, split_config
    from tpuasm.assembler import assemble
    from tpuasm.cli import parse_config
    from tpuasm.errors import AssemblyError, TpuasmError
    with pytest.raises(TpuasmError, match=r"--config ub_rows: not an integer: 'abc'"):
        parse_config(["ub_rows=abc"])
    with pytest.raises(InputError, match=r"--config ub_rows: not an integer: 'abc'"):
        split_config(["ub_rows=abc"])
    with pytest.raises(AssemblyError) as e:
        assemble("HLT\n", config={"ub_rows": "abc"})
    assert [d.message for d in e.value.diagnostics] == [
        "bad machine configuration: ub_rows: not an integer: 'abc' (from the command line)"]


@pytest.mark.parametrize("args", [["asm", "{d}/x.tasm"], ["--help"]])
def test_asm_and_help_do_not_load_the_machine(tmp_path, args):
    """`tpuasm asm` and `--help` start fast: no numba, no machine, no numpy."""
    (tmp_path / "x.tasm").write_text("NOP\nHLT\n")
    argv = [a.format(d=tmp_path) for a in args]
    code = ("import sys\nfrom tpuasm.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numba', 'numpy', 'tpuasm.machine') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_program_file_is_read_once(project, monkeypatch, capsys):
    import pathlib
    import tpuasm.files
    d, _ = project
    reads = []
    real = tpuasm.files.read_input
    monkeypatch.setattr(tpuasm.files, "read_input",
                        lambda path, **kw: reads.append(pathlib.Path(path).name) or real(path, **kw))
    run_cli("lint", d / "prog.tasm")
    assert reads.count("prog.tasm") == 1


def test_includes_resolve_next_to_the_program_file(tmp_path, capsys):
    from tpuasm.program import load_program
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inc.tasm").write_text("NOP\n")
    (tmp_path / "sub" / "main.tasm").write_text('.include "inc.tasm"\nHLT\n')
    program = load_program(tmp_path / "sub" / "main.tasm")
    assert [i.key for i in program.instructions] == ["NOP", "HLT"]
    assert program.locations[0].file == str(tmp_path / "sub" / "inc.tasm")


def test_disasm_annotate_puts_each_source_line_beside_its_instruction(project, capsys):
    d, _ = project
    run_cli("asm", d / "prog.tasm", "-o", d / "a.tbin")
    capsys.readouterr()
    assert run_cli("disasm", d / "a.tbin", "--annotate") == 0
    out = capsys.readouterr().out
    assert f"; {d / 'prog.tasm'}:8:9: RHM     host.x, ub.x, 4" in out
    assert out.startswith(".config ")


def test_no_debug_leaves_out_symbols_and_sources(project, capsys):
    from tpuasm.binary import load_binary
    d, _ = project
    assert run_cli("asm", d / "prog.tasm", "-o", d / "p.tbin", "--no-debug") == 0
    p = load_binary(d / "p.tbin")
    assert p.symbols == [] and p.sources == {} and set(p.locations) == {None}
    assert len(p) == 6


def test_quiet_run_prints_nothing_on_stdout(project, capsys):
    d, _ = project
    assert run_cli("run", d / "prog.tasm", "--host", d / "host.npy", "--weights", d / "w.npy", "-q") == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("args", [
    ["asm", "{d}/prog.tasm", "-o", "{d}/nodir/p.tbin"],
    ["asm", "{d}/prog.tasm", "--listing", "{d}/nodir/p.lst"],
    ["asm", "{d}/prog.tasm", "--symbols", "{d}/nodir/p.sym"],
    ["run", "{d}/prog.tasm", "--host", "{d}/host.npy", "--weights", "{d}/w.npy", "-q",
     "--stats", "{d}/nodir/s.json"],
    ["run", "{d}/prog.tasm", "--host", "{d}/host.npy", "--weights", "{d}/w.npy", "-q",
     "--out", "{d}/nodir/o.npy"],
])
def test_write_errors_exit_2_naming_the_file(project, capsys, args):
    d, _ = project
    assert run_cli(*[a.format(d=d) for a in args]) == 2
    err = capsys.readouterr().err
    assert f"{d / 'nodir'}" in err and "cannot write" in err and "Traceback" not in err


def test_config_on_a_binary_overrides_its_shape(project, capsys):
    from tpuasm.program import load_program
    d, _ = project
    run_cli("asm", d / "prog.tasm", "-o", d / "p.tbin")
    assert load_program(d / "p.tbin", {"ub_rows": 128}).shape.ub_rows == 128
    assert run_cli("run", d / "p.tbin", "--config", "ub_rows=0", "-q") == 2
    err = capsys.readouterr().err
    assert "--config: ub_rows 0 out of range 1..16777216" in err and "Traceback" not in err


def test_config_ub_rows_0_on_a_source_is_an_assembly_error(project, capsys):
    d, _ = project
    assert run_cli("asm", d / "prog.tasm", "--config", "ub_rows=0") == 2
    err = capsys.readouterr().err
    assert "bad machine configuration: ub_rows 0 out of range 1..16777216 (from the command line)" in err
    assert not (d / "prog.tbin").exists()


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: tpuasm" in capsys.readouterr().out


def test_demo_without_the_programs_folder_says_so(monkeypatch, tmp_path, capsys):
    import tpuasm.demo
    from tpuasm.errors import TpuasmError
    monkeypatch.setattr(tpuasm.demo, "__file__", str(tmp_path / "tpuasm" / "demo.py"))
    with pytest.raises(TpuasmError, match="the demo needs the repository's programs/ folder"):
        tpuasm.demo.find_program()
    monkeypatch.setattr(tpuasm.demo, "find_program", lambda: (_ for _ in ()).throw(
        TpuasmError("the demo needs the repository's programs/ folder")))
    assert main(["demo"]) == 2
    assert "error: the demo needs the repository's programs/ folder" in capsys.readouterr().err


def test_demo_runs_and_checks_its_answer():
    done = subprocess.run([sys.executable, "-m", "tpuasm", "demo"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "identical to the independent numpy model" in " ".join(done.stdout.split())


def test_parse_arguments_returns_argparse_exit_status_instead_of_exiting(capsys):
    import argparse
    from tpuasm.cli import parse_arguments
    p = argparse.ArgumentParser(prog="tpuasm x")
    p.add_argument("--n", type=int)
    args, code = parse_arguments(p, ["--n", "3"])
    assert code is None and args.n == 3
    assert parse_arguments(p, ["--help"]) == (None, 0)
    assert parse_arguments(p, ["--n", "three"]) == (None, 2)
    assert "invalid int value: 'three'" in capsys.readouterr().err

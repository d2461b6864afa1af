"""The regression runner: manifests, discovery, -k, running, reports, golden, exit codes,
and the pytest plugin.  Programs here are tiny (4 vectors) so the file runs in seconds."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tpuasm.regression import main
from tpuasm.regression.cli import KeywordError, keyword_matcher
from tpuasm.regression.golden import replace_golden
from tpuasm.regression.manifest import ManifestError, discover, load_manifest
from tpuasm.regression.runner import compare_rows, run_manifest

PROGRAM = """\
; y = clip((x @ w + 128) >> 8): four vectors through one tile
.equ B, 4
.host x, B
.host y, B
.ub   x, B
.ub   y, B
.acc  s, B
.tile w, 1
        RW      tile.w
        RHM     host.x, ub.x, B
        MMC.SO  ub.x, acc.s, B
        CFG     act_shift, 8
        ACT     acc.s, ub.y, B
        WHM     ub.y, host.y, B
        HLT
"""

# An independent model of the program in plain numpy; `BREAK` corrupts one element.
GENERATOR = """\
import numpy as np
BREAK = {broken}

def generate(out_dir):
    g = np.random.default_rng(5)
    x = g.integers(-128, 128, size=(4, 256)).astype(np.int8)
    w = g.integers(-128, 128, size=(256, 256)).astype(np.int8)
    acc = x.astype(np.int64) @ w.astype(np.int64)
    y = np.clip((acc + 128) >> 8, -128, 127).astype(np.int8)
    if BREAK:
        y[2, 5] = y[2, 5] + (1 if y[2, 5] < 127 else -1)
    host = np.zeros((8, 256), np.int8)
    host[:4] = x
    np.save(out_dir / "host.npy", host)
    np.save(out_dir / "weights.npy", w[None])
    np.save(out_dir / "y.npy", y)
    np.save(out_dir / "acc.npy", acc.astype(np.int32))
"""

MANIFEST = """\
[test]
program = "prog.tasm"
description = "a tiny test program"
tags = ["tiny"]

[data]
generator = "gen.py"

[expect]
cycles = {{ min = 1, max = 1_000_000 }}
counters = {{ instructions = 7 }}

[[expect.rows]]
region = "y"
expected = "y.npy"

[[expect.rows]]
memory = "acc"
region = "acc.s"
expected = "acc.npy"
{extra}"""


def make_program(root: Path, name: str, broken=False, extra="", manifest=None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "prog.tasm").write_text(PROGRAM)
    (d / "gen.py").write_text(GENERATOR.format(broken=broken))
    (d / "test.toml").write_text(manifest if manifest is not None else MANIFEST.format(extra=extra))
    return d


def write_manifest(tmp_path: Path, text: str) -> Path:
    (tmp_path / "prog.tasm").write_text(PROGRAM)
    path = tmp_path / "test.toml"
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- manifests

def test_full_manifest_parses(tmp_path):
    path = write_manifest(tmp_path, """
        [test]
        program = "prog.tasm"
        name = "demo"
        tags = ["slow", "x"]
        max_cycles = 5000
        [machine]
        hazards = "error"
        [data]
        host_rows = 8
        weight_tiles = 1
        [expect]
        cycles = 100
        counters = { instructions = { min = 3 }, array_active_cycles = { max = 9 } }
        [[expect.rows]]
        start = 4
        memory = "ub"
        expected = "y.npy"
        tolerance = 1
        [golden]
        cycles = 120
        tolerance = 0.5
        [golden.counters]
        instructions = 7
        """)
    m = load_manifest(path)
    assert m.name == "demo" and m.tags == ("slow", "x") and m.max_cycles == 5000
    assert m.machine == {"hazards": "error"}
    assert (m.host_rows, m.weight_tiles) == (8, 1)
    assert m.cycles.contains(100) and not m.cycles.contains(101)
    assert m.counters["instructions"].min == 3 and m.counters["instructions"].max is None
    assert m.rows[0].start == 4 and m.rows[0].memory == "ub" and m.rows[0].tolerance == 1
    assert m.golden.cycles == 120 and m.golden.counters == {"instructions": 7}
    assert m.status == "halted"


def test_fault_expectation_implies_fault_status(tmp_path):
    m = load_manifest(write_manifest(tmp_path, """
        [test]
        program = "prog.tasm"
        [expect.fault]
        kind = "deadlock"
        line = 3
        """))
    assert m.status == "fault" and m.fault.kind == "deadlock" and m.fault.line == 3


@pytest.mark.parametrize("body, key, words", [
    ("[data]\nhost_rows = 4\n", "test", "is required"),
    ("[test]\nname = 'x'\n", "test.program", "is required"),
    ("[test]\nprogram = 'prog.tasm'\nprogramme = 1\n", "test.programme", "unknown key"),
    ("[test]\nprogram = 'prog.tasm'\nmax_cycles = 'lots'\n", "test.max_cycles",
     "must be an integer, not a string"),
    ("[test]\nprogram = 'prog.tasm'\nmax_cycles = true\n", "test.max_cycles", "not a boolean"),
    ("[test]\nprogram = 'nope.tasm'\n", "test.program", "file not found"),
    ("[test]\nprogram = 'prog.tasm'\n[expect]\ncycles = { min = 9, max = 1 }\n",
     "expect.cycles", "greater than max"),
    ("[test]\nprogram = 'prog.tasm'\n[expect]\ncycles = {}\n", "expect.cycles", "needs min"),
    ("[test]\nprogram = 'prog.tasm'\n[[expect.rows]]\nexpected = 'y.npy'\n",
     "expect.rows[0]", "exactly one of region or start"),
    ("[test]\nprogram = 'prog.tasm'\n[[expect.rows]]\nexpected = 'y.npy'\nstart = 0\n"
     "memory = 'disk'\n", "expect.rows[0].memory", "must be one of host, ub, acc"),
    ("[test]\nprogram = 'prog.tasm'\n[expect.fault]\nkind = 'oops'\n", "expect.fault.kind",
     "must be one of"),
    ("[test]\nprogram = 'prog.tasm'\n[expect]\nstatus = 'halted'\n[expect.fault]\n"
     "kind = 'address'\n", "expect.status", 'must be "fault"'),
    ("[test]\nprogram = 'prog.tasm'\n[expect]\nstatus = 'fault'\n", "expect.status",
     "needs an [expect.fault]"),
    ("[test]\nprogram = 'prog.tasm'\n[expect.fault]\nkind = 'address'\n"
     "[expect.assembly_error]\nmessage = 'x'\n", "expect", "both a fault and"),
    ("[test]\nprogram = 'prog.tasm'\n[data]\nhost = 'h.npy'\nhost_rows = 3\n",
     "data.host_rows", "cannot be combined"),
    ("[test]\nprogram = 'prog.tasm'\n[golden]\ntolerance = -1\n", "golden.tolerance", ">= 0"),
])
def test_manifest_errors_name_file_and_key(tmp_path, body, key, words):
    path = write_manifest(tmp_path, body)
    with pytest.raises(ManifestError) as e:
        load_manifest(path)
    assert str(e.value).startswith(f"{path}: {key}: "), str(e.value)
    assert words in str(e.value)
    assert e.value.key == key


def test_invalid_toml_is_a_manifest_error(tmp_path):
    path = write_manifest(tmp_path, "[test\nprogram = 1\n")
    with pytest.raises(ManifestError, match="invalid TOML"):
        load_manifest(path)


# ---------------------------------------------------------------- discovery and -k

def test_discovery_recurses_and_skips_data(tmp_path):
    make_program(tmp_path, "b")
    make_program(tmp_path / "group", "a")
    (tmp_path / "b" / "data").mkdir()
    (tmp_path / "b" / "data" / "test.toml").write_text("not a manifest")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "test.toml").write_text("not a manifest")
    found = discover([tmp_path, tmp_path / "b" / "test.toml"])
    assert [p.parent.name for p in found] == ["b", "a"]       # sorted by path, no duplicates
    with pytest.raises(ManifestError, match="no such file"):
        discover([tmp_path / "missing"])
    with pytest.raises(ManifestError, match="not a test.toml"):
        discover([tmp_path / "b" / "prog.tasm"])


@pytest.mark.parametrize("expr, selected", [
    ("mlp", {"mlp0", "mlp3_relu"}),
    ("mlp and not mlp0", {"mlp3_relu"}),
    ("conv or MATMUL", {"conv2d", "matmul"}),
    ("not (mlp or conv)", {"matmul"}),
    ("slow", {"mlp0"}),                       # tags match too
])
def test_keyword_expressions(expr, selected):
    class M:
        def __init__(self, name, tags=()):
            self.name, self.tags, self.directory = name, tags, Path("programs") / name
    programs = [M("mlp0", ("slow",)), M("mlp3_relu"), M("conv2d"), M("matmul")]
    match = keyword_matcher(expr)
    assert {m.name for m in programs if match(m)} == selected


@pytest.mark.parametrize("expr", ["", "a and", "(a or b", "a b", "or a", "a )"])
def test_bad_keyword_expressions(expr):
    with pytest.raises(KeywordError):
        keyword_matcher(expr)


# ---------------------------------------------------------------- row comparison

def test_compare_rows_shows_rows_side_by_side():
    expected = np.zeros((5, 256), np.int8)
    actual = expected.copy()
    actual[3, 7] = 4
    actual[3, 9] = -2
    text = compare_rows(expected, actual, tolerance=0, first_row=100)
    assert "2 of 1,280 elements differ, max |difference| 4" in text
    assert "row 103 (+3): 2 columns differ" in text
    lines = text.splitlines()
    exp_line = next(line for line in lines if line.strip().startswith("expected"))
    act_line = next(line for line in lines if line.strip().startswith("actual"))
    assert exp_line.split()[1:4] == ["0", "0", "0"] and act_line.split()[1:4] == ["4", "0", "-2"]
    assert compare_rows(expected, actual, tolerance=4) == ""


# ---------------------------------------------------------------- running

def test_passing_program(tmp_path, capsys):
    make_program(tmp_path, "good")
    assert main([str(tmp_path), "-j", "1", "-q"]) == 0
    out = capsys.readouterr().out
    assert "good" in out and "pass" in out and "1 passed" in out


def test_failing_program_shows_mismatched_rows(tmp_path, capsys):
    make_program(tmp_path, "bad", broken=True)
    assert main([str(tmp_path), "-j", "1", "-q"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out
    assert "host region y (rows 4..7) differ from y.npy: 1 of 1,024 elements differ" in out
    assert "row 6 (+2): 1 columns differ, columns 5..16 shown" in out
    assert "expected" in out and "actual" in out and "1 failed" in out


def test_failure_reasons(tmp_path):
    extra = "[expect.fault]\nkind = 'address'\n"
    d = make_program(tmp_path, "nofault", extra=extra)
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "fail"
    assert "expected a address fault, but the program ended with status 'halted'" in result.failures[0]

    d = make_program(tmp_path, "slowprog", manifest=MANIFEST.format(extra="").replace(
        "max = 1_000_000", "max = 10"))
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "fail"
    assert any(f.startswith(f"cycles {result.cycles:,} outside the bound [1, 10]")
               for f in result.failures)


def test_fault_instead_of_halt_and_wrong_fault(tmp_path):
    d = tmp_path / "oob"
    d.mkdir()
    (d / "prog.tasm").write_text("        RHM 0, 0, 4\n        RHM 6, 0, 4\n        HLT\n")
    (d / "test.toml").write_text('[test]\nprogram = "prog.tasm"\n[data]\nhost_rows = 8\n')
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "fail"
    assert result.failures[0].startswith("expected the program to halt, but it faulted: fault at cycle")
    assert "host address 8 out of range 0..7" in result.failures[0]
    (d / "test.toml").write_text('[test]\nprogram = "prog.tasm"\n[data]\nhost_rows = 8\n'
                                 '[expect.fault]\nkind = "deadlock"\nindex = 0\nline = 1\n')
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "fail"
    assert ("wrong fault (kind 'address' instead of 'deadlock'; instruction 1 instead of 0; "
            "line 2 instead of 1)") in result.failures[0]
    (d / "test.toml").write_text('[test]\nprogram = "prog.tasm"\n[data]\nhost_rows = 8\n'
                                 '[expect.fault]\nkind = "address"\nmessage = "HOST ADDRESS 8"'
                                 '\nindex = 1\nline = 2\n')
    assert run_manifest(load_manifest(d / "test.toml")).passed


def test_missing_expected_file_is_an_error(tmp_path):
    d = make_program(tmp_path, "nofile", manifest=MANIFEST.format(extra="").replace(
        '"y.npy"', '"z.npy"'))
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "error" and "file not found" in result.failures[0]


def test_region_qualified_by_its_kind(tmp_path):
    qualified = MANIFEST.format(extra="").replace('region = "y"', 'region = "host.y"')
    d = make_program(tmp_path, "qualified", manifest=qualified)
    assert run_manifest(load_manifest(d / "test.toml")).passed
    # a prefix that disagrees with `memory` is a clear error, not a silent switch of memory
    clash = MANIFEST.format(extra="").replace('region = "y"', 'memory = "ub"\nregion = "host.y"')
    d = make_program(tmp_path, "clash", manifest=clash)
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "error"
    assert ("expect.rows[0].region: region 'host.y' is a host symbol but the rows are "
            "compared in memory 'ub'") in result.failures[0]
    missing = MANIFEST.format(extra="").replace('region = "y"', 'region = "nowhere"')
    d = make_program(tmp_path, "missing", manifest=missing)
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "error"
    assert "the program has no host region 'nowhere'" in result.failures[0]


def test_generator_failure_is_an_error(tmp_path):
    d = make_program(tmp_path, "gen_bug")
    (d / "gen.py").write_text("def generate(out_dir):\n    raise ValueError('no data today')\n")
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "error"
    assert "gen.py: the data generator failed: ValueError: no data today" in result.failures[0]


def test_expected_assembly_error(tmp_path):
    d = tmp_path / "asm"
    d.mkdir()
    (d / "prog.tasm").write_text("        RHM 0, 0, 4\n        FROB 1\n        HLT\n")
    (d / "test.toml").write_text('[test]\nprogram = "prog.tasm"\n[expect.assembly_error]\n'
                                 'message = "unknown instruction"\nline = 2\n')
    assert run_manifest(load_manifest(d / "test.toml")).passed
    (d / "test.toml").write_text('[test]\nprogram = "prog.tasm"\n[expect.assembly_error]\n'
                                 'message = "unknown instruction"\nline = 3\n')
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "fail" and "at line 3" in result.failures[0]
    assert "prog.tasm:2:" in result.failures[0]          # the diagnostics that did come


def test_parallel_run_and_junit_xml(tmp_path, capsys):
    make_program(tmp_path, "good")
    make_program(tmp_path, "bad", broken=True)
    report = tmp_path / "junit.xml"
    assert main([str(tmp_path), "-j", "2", "-q", "--junit-xml", str(report)]) == 1
    suite = ET.parse(report).getroot()                  # well-formed, or this raises
    assert suite.tag == "testsuite"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"good", "bad"}
    assert cases["good"].find("failure") is None
    failure = cases["bad"].find("failure")
    assert "differ from y.npy" in failure.get("message") and "row 6 (+2)" in failure.text
    assert "cycles=" in cases["good"].find("system-out").text
    capsys.readouterr()


# ---------------------------------------------------------------- golden values

def test_update_golden_rewrites_only_the_golden_table(tmp_path, capsys):
    d = make_program(tmp_path, "good", extra="\n# a comment that must survive\n\n"
                                             "[golden]\ncycles = 3\ntolerance = 0.001\n")
    before = (d / "test.toml").read_text()
    expected_before = (d / "gen.py").read_text()
    assert main([str(tmp_path), "-j", "1", "-q"]) == 1             # 3 cycles: stale
    assert "differ from the recorded 3" in capsys.readouterr().out
    assert main([str(tmp_path), "-j", "1", "-q", "--update-golden"]) == 0
    after = (d / "test.toml").read_text()
    head = before.split("[golden]")[0]
    assert after.startswith(head)                     # everything before [golden] untouched
    assert "# a comment that must survive" in after
    m = load_manifest(d / "test.toml")
    assert m.golden.cycles > 3 and m.golden.tolerance == 0.001
    assert m.golden.counters["instructions"] == 7
    assert m.rows[0].expected == "y.npy" and (d / "gen.py").read_text() == expected_before
    assert main([str(tmp_path), "-j", "1", "-q"]) == 0             # now it matches
    capsys.readouterr()


def test_replace_golden_appends_when_missing():
    text = "[test]\nprogram = 'p.tasm'\n"
    assert replace_golden(text, "[golden]\ncycles = 5\n") == text + "\n[golden]\ncycles = 5\n"
    text2 = "[golden]\ncycles = 1\n[golden.counters]\na = 1\n\n[expect]\ncycles = 3\n"
    out = replace_golden(text2, "[golden]\ncycles = 9\n")
    assert out == "[golden]\ncycles = 9\n\n[expect]\ncycles = 3\n"


# ---------------------------------------------------------------- exit codes

def test_exit_codes_for_usage_errors(tmp_path, capsys):
    assert main([str(tmp_path / "nothing-here")]) == 2
    assert main([str(tmp_path)]) == 2                                  # no manifests
    make_program(tmp_path, "good")
    assert main([str(tmp_path), "-k", "and"]) == 2
    assert main([str(tmp_path), "-k", "nomatch"]) == 2
    assert main([str(tmp_path), "-j", "0"]) == 2
    assert main(["--no-such-option"]) == 2
    assert main([str(tmp_path), "--list"]) == 0
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "test.toml").write_text("[test]\n")
    assert main([str(tmp_path)]) == 2
    assert "broken/test.toml: test.program: is required" in capsys.readouterr().err


# ---------------------------------------------------------------- pytest plugin

def test_pytest_plugin_collects_manifests(tmp_path):
    make_program(tmp_path, "good")
    make_program(tmp_path, "bad", broken=True)
    (tmp_path / "test_plain.py").write_text("def test_ordinary():\n    assert True\n")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert "1 failed, 2 passed" in run.stdout, run.stdout + run.stderr
    assert "row 6 (+2)" in run.stdout                    # the runner's failure text
    run = subprocess.run(cmd + ["-k", "good or ordinary"], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert "2 passed" in run.stdout and "failed" not in run.stdout, run.stdout
    (tmp_path / "bad" / "test.toml").write_text("[test]\nprogram = 'prog.tasm'\ncycles = 3\n")
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert "bad/test.toml: test.cycles: unknown key" in run.stdout, run.stdout
    assert "1 error during collection" in run.stdout, run.stdout     # pytest's usual stop


def test_plugin_import_is_cheap():
    code = ("import sys, tpuasm.pytest_plugin; "
            "print(any(m in sys.modules for m in ('numpy', 'numba', 'tpuasm.machine', "
            "'tpuasm.assembler', 'tpuasm.regression.runner')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


# ---------------------------------------------------------------- the program library

PROGRAMS = Path(__file__).resolve().parent.parent / "programs"
LIBRARY = ["matmul_single", "matmul_tiled", "mlp3_relu", "sigmoid_tanh", "conv2d_pool",
           "conv2d_pool_fifo8", "strided_dma", "double_buffer", "double_buffer_serial",
           "lstm1_600x600", "mlp0", "wide_wrap", "repeat_strides"]


@pytest.mark.parametrize("name", LIBRARY)
def test_library_program_is_complete(name):
    folder = PROGRAMS / name
    for f in (f"{name}.tasm", "gen.py", "test.toml", "README.md"):
        assert (folder / f).is_file(), f"{name}: missing {f}"
    m = load_manifest(folder / "test.toml")
    assert m.generator is not None and m.rows and m.cycles is not None, name


def test_oracles_never_use_the_emulator():
    """Expected data must come from independent numpy models: the only tpuasm module a
    generator may import is tpuasm.functions (its tables define sigmoid and tanh)."""
    import ast
    for path in [PROGRAMS / "tpu_oracle.py", *PROGRAMS.glob("*/gen.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for mod in modules:
                assert not mod.startswith("tpuasm") or mod == "tpuasm.functions", \
                    f"{path}: imports {mod}"


def test_double_buffer_bounds_prove_the_overlap():
    overlapped = load_manifest(PROGRAMS / "double_buffer" / "test.toml").cycles
    serial = load_manifest(PROGRAMS / "double_buffer_serial" / "test.toml").cycles
    assert overlapped.max < serial.min


# ---------------------------------------------------------------- options and overrides

def test_keep_data_leaves_the_generated_images_next_to_the_manifest(tmp_path, capsys):
    d = make_program(tmp_path, "good")
    assert main([str(tmp_path), "-j", "1", "-q", "--keep-data"]) == 0
    assert {"host.npy", "weights.npy", "y.npy", "acc.npy"} <= {p.name for p in (d / "data").iterdir()}
    capsys.readouterr()


def test_junit_xml_to_an_unwritable_path_is_a_usage_error(tmp_path, capsys):
    make_program(tmp_path, "good")
    report = tmp_path / "no-such-dir" / "junit.xml"
    assert main([str(tmp_path), "-j", "1", "-q", "--junit-xml", str(report)]) == 2
    err = capsys.readouterr().err
    assert f"error: {report}: cannot write:" in err and "Traceback" not in err


def test_machine_overrides_in_a_manifest(tmp_path):
    d = make_program(tmp_path, "slow", extra="\n[machine]\nhost_latency_cycles = 5000\n")
    slow = run_manifest(load_manifest(d / "test.toml"))
    d = make_program(tmp_path, "plain")
    plain = run_manifest(load_manifest(d / "test.toml"))
    assert slow.passed and plain.passed and slow.cycles > plain.cycles
    d = make_program(tmp_path, "badcfg", extra="\n[machine]\nfrobnicate = 1\n")
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "error"
    assert "test.toml: machine: bad configuration override:" in result.failures[0]
    assert "frobnicate" in result.failures[0]
    # a bad shape reaches the assembler, which names it
    d = make_program(tmp_path, "badshape", extra="\n[machine]\nub_rows = 0\n")
    result = run_manifest(load_manifest(d / "test.toml"))
    assert not result.passed and "bad machine configuration: ub_rows 0" in result.failures[0]


def test_generator_without_generate_is_an_error(tmp_path):
    d = make_program(tmp_path, "nogen")
    (d / "gen.py").write_text("import numpy as np\n")
    result = run_manifest(load_manifest(d / "test.toml"))
    assert result.outcome == "error"
    assert "gen.py defines no generate(out_dir) function" in result.failures[0]

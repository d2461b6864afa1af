"""Issue 14: one regression test per reproduced row (the row's exact case), plus the classes
the fixes close (tpuasm/files.py, tpuasm/limits.py; spec/limits.md).

Every command-line case checks the documented exit status (0 after Halt, 1 machine fault,
2 usage/assembly/data errors) and that no traceback or "internal error" reaches the user.
"""
from __future__ import annotations

import os
import struct
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tpuasm.assembler import assemble
from tpuasm.cli import main as tpuasm
from tpuasm.errors import AssemblyError

TINY = "RHM 0, 0, 1\nRW 0\nMMC.S 0, 0, 1\nACT 0, 1, 1\nWHM 1, 1, 1\nHLT\n"


def run(capsys, *args) -> tuple[int, str]:
    try:
        code = tpuasm([str(a) for a in args])
    except SystemExit as e:              # argparse's usage errors (exit status 2)
        code = e.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text and "internal error" not in text, text
    return code, text


def npy_with_header(path: Path, header: str, data: bytes = b"") -> Path:
    """A .npy file whose header says exactly `header` (numpy would refuse to write it)."""
    text = header + " " * (64 - (10 + len(header) + 1) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()
                     + data)
    return path


def assembly_message(text: str) -> str:
    with pytest.raises(AssemblyError) as e:
        assemble(text, "p.tasm")
    rendered = e.value.render()
    assert "internal error" not in rendered
    return rendered


@pytest.fixture
def tiny(tmp_path):
    """An 8 x 8 program and good data images for it."""
    prog = tmp_path / "tiny.tasm"
    prog.write_text(".config array_size=8\n" + TINY)
    np.save(tmp_path / "host.npy", np.ones((4, 8), np.int8))
    np.save(tmp_path / "w.npy", np.ones((2, 8, 8), np.int8))
    return prog


# ------------------------------------------------------------------ row 1
def test_row01_equ_squaring_chain_stops_at_the_value_cap():
    lines = [".equ A0, 1<<256"] + [f".equ A{i + 1}, A{i}*A{i}" for i in range(40)]
    text = "\n".join(lines) + "\nINT A40 & 0xff\nHLT\n"
    message = assembly_message(text)
    assert "p.tasm:2:" in message and "value too large: more than 512 bits" in message


def test_value_cap_holds_for_every_operator_and_literals():
    assert "value too large" in assembly_message(".equ A, (1<<256) << 256\nINT A & 1\n")
    assert "value too large" in assembly_message(".equ A, -(1<<256)*(1<<256)*4\nINT A & 1\n")
    assert "integer literal too large" in assembly_message("INT " + "9" * 180 + "\n")
    assert "longer than 200 characters" in assembly_message("INT " + "9" * 300 + "\n")
    # right at the cap is still a value: (1<<511) has 512 bits
    p = assemble(".equ A, ((1<<256) << 255) >> 250 >> 250\nINT A\nHLT\n")
    assert p.instructions[0]["code"] == 1 << 11


# ------------------------------------------------------------------ row 2
def test_row02_special_files_are_refused_not_read(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)          # nobody ever writes: opening it must not block
    code, text = run(capsys, "asm", "/dev/zero")
    assert code == 2 and "/dev/zero: source file is a character device" in text \
        or "program is a character device" in text
    code, text = run(capsys, "run", "/dev/zero")
    assert code == 2 and "/dev/zero: program is a character device, not a regular file" in text
    for target, kind in (("/dev/zero", "a character device"), (fifo, "a FIFO"),
                         (tmp_path, "a directory")):
        src = tmp_path / "inc.tasm"
        src.write_text(f'.include "{target}"\nHLT\n')
        code, text = run(capsys, "asm", src, "-o", tmp_path / "o.tbin")
        assert code == 2 and "inc.tasm:1:10: error:" in text and kind in text, text
    big = tmp_path / "big.tasm"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)           # sparse: one byte over the source limit
    src.write_text(f'.include "{big}"\n')
    code, text = run(capsys, "asm", src)
    assert code == 2 and "larger than the 64.0 MiB limit" in text


# ------------------------------------------------------------------ row 3
def test_row03_nested_rept_is_refused_before_it_expands(monkeypatch):
    import tpuasm.assembler.expand as expand
    made = []

    class CountingFrame(expand.Frame):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(expand, "Frame", CountingFrame)
    text = ".rept 1000\n.rept 1000\n.rept 1000\nNOP\n.endr\n.endr\n.endr\nHLT\n"
    message = assembly_message(text)
    assert "p.tasm:1:7: error: .rept would expand to about 2,002,002,000 statements" in message
    assert len(made) == 0                   # refused before a single iteration was built


def test_empty_rept_bodies_cost_budget_too():
    text = ".rept 1000000\n.rept 1000000\n.endr\n.endr\nHLT\n"
    assert ".rept would expand to about" in assembly_message(text)


def test_rept_budget_does_not_evaluate_counts_early():
    # K's value needs L, defined inside the outer block: the estimate must not fail K early
    p = assemble(".equ K, L\n.rept 1\n.equ L, 3\n.rept K\nNOP\n.endr\n.endr\nHLT\n")
    assert [i.key for i in p.instructions] == ["NOP"] * 3 + ["HLT"]


# ------------------------------------------------------------------ rows 4 and 5
def test_row04_twenty_thousand_bad_lines_render_each_source_once():
    from tpuasm.diagnostics import render_all
    text = "FROB 1\n" * 20000
    with pytest.raises(AssemblyError) as e:
        assemble(text, "bad.tasm")
    splits = []

    class CountingText(str):
        def splitlines(self, *args):
            splits.append(1)
            return super().splitlines(*args)

    rendered = render_all(e.value.diagnostics, {"bad.tasm": CountingText(text)},
                          total=e.value.total)
    assert len(splits) == 1                         # not once per diagnostic
    assert e.value.total == 20000
    assert rendered.count("unknown instruction 'FROB'") == 100
    assert "... and 19,900 more errors not shown" in rendered and "20,000 errors" in rendered


def test_row05_one_two_megabyte_line_gives_a_short_report(tmp_path, capsys):
    src = tmp_path / "long.tasm"
    src.write_text("MMC " + "(" * 2_000_000 + "\n")
    code, text = run(capsys, "asm", src)
    assert code == 2 and len(text) < 2000, len(text)
    src.write_text("X" * 2_000_000 + " 1\n")
    code, text = run(capsys, "asm", src)
    assert code == 2 and len(text) < 2000 and "..." in text


def test_excerpt_window_keeps_the_caret_under_the_column():
    from tpuasm.diagnostics import Diagnostic
    line = "a" * 5000 + "BAD" + "b" * 5000
    d = Diagnostic("bad", "f", 1, 5001, 5004)
    shown = d.render({"f": line + "\n"}).splitlines()
    src, caret = shown[1].split("| ", 1)[1], shown[2].split("| ", 1)[1]
    assert src[caret.index("^"):caret.index("^") + 3] == "BAD" and caret.count("^") == 3
    assert len(src) < 200


# ------------------------------------------------------------------ row 6
def test_row06_a_machine_too_large_to_allocate_is_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TPUASM_MEMORY_LIMIT", "4G")
    prog = tmp_path / "big.tasm"
    prog.write_text(".config array_size=4096, ub_rows=16777216\nHLT\n")
    code, text = run(capsys, "run", prog)
    assert code == 2
    assert "the machine (Unified Buffer 16,777,216 x 4,096 bytes" in text and "more than" in text
    from debugger.cli import main as debug
    script = tmp_path / "s.tdb"
    script.write_text("step\n")
    assert debug([str(prog), "--batch", str(script)]) == 2
    err = capsys.readouterr().err
    assert "Unified Buffer" in err and "Traceback" not in err


# ------------------------------------------------------------------ row 7
def test_row07_cycle_limits_out_of_range(tmp_path, capsys, tiny):
    code, text = run(capsys, "run", tiny, "--max-cycles", str(2 ** 70))
    assert code == 2 and "--max-cycles: at most 4611686018427387904 (2**62)" in text
    from tpuasm.regression.manifest import ManifestError, load_manifest
    (tmp_path / "test.toml").write_text('[test]\nprogram = "tiny.tasm"\n'
                                        "max_cycles = 100000000000000000000\n")
    with pytest.raises(ManifestError, match="test.max_cycles: must be <= 4,611,686,018,427,"):
        load_manifest(tmp_path / "test.toml")


# ------------------------------------------------------------------ rows 8 and 9
def test_row08_header_claiming_2_to_the_40_rows(tmp_path, capsys, tiny):
    h = npy_with_header(tmp_path / "h.npy", "{'descr': '|i1', 'fortran_order': False, "
                                            "'shape': (1099511627776, 256), }", b"\0" * 100)
    prog = tmp_path / "p.tasm"
    prog.write_text(TINY)
    code, text = run(capsys, "run", prog, "--host", h)
    assert code == 2 and "h.npy: host memory file declares shape (1099511627776, 256)" in text
    assert "but holds only 100 bytes" in text
    from debugger.cli import main as debug
    script = tmp_path / "s.tdb"
    script.write_text("step\n")
    assert debug([str(prog), "--host", str(h), "--batch", str(script)]) == 2
    assert "holds only 100 bytes" in capsys.readouterr().err


def test_row09_negative_shape_everywhere(tmp_path, capsys):
    w = npy_with_header(tmp_path / "w.npy", "{'descr': '|i1', 'fortran_order': False, "
                                            "'shape': (-1, 256), }")
    prog = tmp_path / "p.tasm"
    prog.write_text(TINY)
    code, text = run(capsys, "run", prog, "--weights", w)
    assert code == 2 and "w.npy: weight file declares an impossible shape (-1, 256)" in text
    code, text = run(capsys, "run", prog, "--profile", "opentpu", "--weights", w)
    assert code == 2 and "impossible shape (-1, 256)" in text
    from debugger.cli import main as debug
    script = tmp_path / "s.tdb"
    script.write_text("step\n")
    assert debug([str(prog), "--weights", str(w), "--batch", str(script)]) == 2
    assert "impossible shape" in capsys.readouterr().err


# ------------------------------------------------------------------ row 10
def test_row10_npz_and_empty_files_under_opentpu(tmp_path, capsys):
    prog = tmp_path / "p.tasm"
    prog.write_text("HLT\n")
    z = tmp_path / "x.npz"
    np.savez(z, w=np.zeros((1, 8, 8), np.int8))
    empty = tmp_path / "e.npy"
    empty.write_bytes(b"")
    binary = tmp_path / "p.out"
    binary.write_bytes((7 << 104).to_bytes(14, "big"))         # OpenTPU's HLT
    for program in (prog, binary):
        code, text = run(capsys, "run", program, "--profile", "opentpu", "--weights", z)
        assert code == 2 and "x.npz: weight image is a .npz archive" in text
        code, text = run(capsys, "run", program, "--profile", "opentpu", "--weights", empty)
        assert code == 2 and "e.npy: weight image is an empty file" in text


# ------------------------------------------------------------------ row 11
def test_row11_random_bytes_are_not_called_pickled(tmp_path, capsys):
    prog = tmp_path / "p.tasm"
    prog.write_text(TINY)
    junk = tmp_path / "junk.npy"
    junk.write_bytes(bytes(range(256)) * 3)
    for host in (junk, "/dev/zero"):
        code, text = run(capsys, "run", prog, "--host", host)
        assert code == 2 and "pickle" not in text
    assert "junk.npy: host memory file is not a .npy file" in run(capsys, "run", prog,
                                                                  "--host", junk)[1]
    assert "/dev/zero: host memory file is a character device" in run(
        capsys, "run", prog, "--host", "/dev/zero")[1]
    w = tmp_path / "w.npy"
    np.save(w, np.zeros((0, 5000, 5000), np.int8))
    code, text = run(capsys, "run", prog, "--profile", "opentpu", "--weights", w)
    assert code == 2 and "from the command line" not in text
    assert "w.npy: its shape implies an array size N = 5000, but OpenTPU's is 8 or 16" in text


# ------------------------------------------------------------------ row 12
def test_row12_out_is_written_exactly_where_asked(tmp_path, capsys, tiny):
    d = tiny.parent
    code, text = run(capsys, "run", tiny, "--host", d / "host.npy", "--weights", d / "w.npy",
                     "-q", "--out", tmp_path)
    assert code == 2 and "it is a directory" in text
    assert not Path(str(tmp_path) + ".npy").exists()
    y = tmp_path / "y.bin"
    code, _ = run(capsys, "run", tiny, "--host", d / "host.npy", "--weights", d / "w.npy",
                  "-q", "--out", y)
    assert code == 0 and y.is_file() and not (tmp_path / "y.bin.npy").exists()
    assert np.load(y).shape == (4, 8)


# ------------------------------------------------------------------ row 13
def test_row13_an_output_that_is_the_input_is_refused(tmp_path, capsys):
    src = tmp_path / "p.tasm"
    src.write_text(TINY)
    inc = tmp_path / "inc.tasm"
    inc.write_text("NOP\n")
    main = tmp_path / "m.tasm"
    main.write_text('.include "inc.tasm"\nHLT\n')
    for args in (["-o", src], ["--listing", src], ["--symbols", src]):
        code, text = run(capsys, "asm", src, *args)
        assert code == 2 and "it is the input" in text
        assert src.read_text() == TINY
    code, text = run(capsys, "asm", main, "--listing", inc)      # an include is an input too
    assert code == 2 and "it is the input" in text and inc.read_text() == "NOP\n"


# ------------------------------------------------------------------ row 14
def test_row14_nothing_is_written_when_one_output_is_bad(tmp_path, capsys, tiny):
    d = tiny.parent
    new = tmp_path / "new.tbin"
    code, text = run(capsys, "asm", tiny, "-o", new, "--listing", "/nonexistent/l")
    assert code == 2 and "/nonexistent does not exist" in text and not new.exists()
    o = tmp_path / "o.npy"
    code, text = run(capsys, "run", tiny, "--host", d / "host.npy", "--weights", d / "w.npy",
                     "--out", o, "--stats", "/nonexistent/s")
    assert code == 2 and not o.exists()


# ------------------------------------------------------------------ row 15
MANIFEST = '[test]\nprogram = "p.tasm"\n{data}'


def _program(root: Path, name: str, gen: str | None) -> None:
    d = root / name
    d.mkdir()
    (d / "p.tasm").write_text(".config array_size=8\n.host h, 4\n" + TINY)
    data = "[data]\nhost_rows = 4\nweight_tiles = 2\n" + ('generator = "gen.py"\n' if gen else "")
    (d / "test.toml").write_text(MANIFEST.format(data=data))
    if gen:
        (d / "gen.py").write_text(textwrap.dedent(gen))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_row15_generators_that_end_the_process(tmp_path, capsys, jobs):
    from tpuasm.regression import main as test_main
    _program(tmp_path, "exits3", "import sys\ndef generate(out):\n    sys.exit(3)\n")
    _program(tmp_path, "osexit", "import os\ndef generate(out):\n    os._exit(0)\n")
    _program(tmp_path, "healthy", None)
    code = test_main([str(tmp_path), "-j", jobs, "-q"])
    out = capsys.readouterr().out
    assert code == 1
    assert "called sys.exit(3) instead of returning" in out
    assert "before generate() returned (os._exit?)" in out
    lines = [line for line in out.splitlines() if line.startswith("│") or "healthy" in line]
    assert any("healthy" in line and "pass" in line for line in lines), out
    assert "Traceback" not in out


# ------------------------------------------------------------------ row 16
def test_row16_manifest_sizes_and_corrupt_expected_data(tmp_path, monkeypatch):
    from tpuasm.regression.manifest import ManifestError, load_manifest
    from tpuasm.regression.runner import run_manifest
    monkeypatch.setenv("TPUASM_MEMORY_LIMIT", "4G")
    d = tmp_path / "m"
    d.mkdir()
    (d / "p.tasm").write_text(".host h, 4\n" + TINY)

    def manifest(extra: str):
        (d / "test.toml").write_text('[test]\nprogram = "p.tasm"\n' + extra)
        return load_manifest(d / "test.toml")

    with pytest.raises(ManifestError, match=r"data.host_rows: must be <= 4,294,967,296"):
        manifest("[data]\nhost_rows = 100000000000\n")
    r = run_manifest(manifest("[data]\nweight_tiles = 1000000\n"))
    assert r.outcome == "error" and "data.weight_tiles = 1,000,000" in r.failures[0]
    assert "more than the 4.0 GiB" in r.failures[0] and "internal error" not in r.failures[0]
    r = run_manifest(manifest("[machine]\narray_size = 4096\nub_rows = 16777216\n"))
    assert r.outcome == "error" and "Unified Buffer 16,777,216 x 4,096" in r.failures[0]
    r = run_manifest(manifest("[machine]\nhost_latency_cycles = inf\n"))
    assert r.outcome == "error" and "host_latency_cycles must be a non-negative integer" in r.failures[0]
    (d / "e.npy").write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': '|i1'")
    r = run_manifest(manifest('[data]\nhost_rows = 4\nweight_tiles = 2\n[[expect.rows]]\n'
                              'expected = "e.npy"\nstart = 0\n'))
    assert r.outcome == "error" and len(r.failures) == 1, r.failures
    assert "expect.rows[0].expected:" in r.failures[0]
    assert "corrupt .npy header" in r.failures[0] and "pickle" not in r.failures[0]


# ------------------------------------------------------------------ row 18
def test_row18_reference_checks_act_bounds_before_building_pool_groups(tmp_path):
    from tpuasm.binary import Program
    from tpuasm.encoding import Instruction
    from tpuasm.isa import ISA_TABLE
    from tpuasm.machine import Machine
    from tpuasm.machine.reference import run_reference
    flags = ISA_TABLE.instructions["ACT"].flag_bits("A")
    act = Instruction("ACT", flags, 1, {"acc": 0, "ub": 0, "length": 2 ** 32 - 1})
    program = Program([act, Instruction("HLT", 0, 1, {})])
    path = tmp_path / "act.tbin"
    path.write_bytes(program.to_bytes())                  # the hand-made binary of the row
    loaded = Program.from_bytes(path.read_bytes())
    ref = run_reference(loaded)
    m = Machine.for_program(loaded)
    m.load(loaded)
    emu = m.run()
    assert (ref.fault_kind, ref.fault_index) == (emu.fault.kind, emu.fault.index) == ("address", 0)


def test_reference_host_transfers_are_checked_without_listing_rows():
    from tpuasm.binary import Program
    from tpuasm.encoding import Instruction
    from tpuasm.machine.reference import run_reference
    rhm = Instruction("RHM", 0, 1, {"host": 0, "ub": 0, "length": 2 ** 16 - 1})
    ref = run_reference(Program([rhm]), host=np.zeros((4, 256), np.int8))
    assert ref.fault_kind == "address" and "host memory address 4 out of range" \
        in ref.fault_message


# ------------------------------------------------------------------ the classes
def test_binary_header_shapes_go_through_the_same_allocation_check(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setenv("TPUASM_MEMORY_LIMIT", "4G")
    from tpuasm.binary import MachineShape, Program
    from tpuasm.encoding import Instruction
    p = Program([Instruction("HLT", 0, 1, {})], MachineShape(array_size=4096, ub_rows=1 << 24))
    path = tmp_path / "big.tbin"
    path.write_bytes(p.to_bytes())
    code, text = run(capsys, "run", path)
    assert code == 2 and "Unified Buffer 16,777,216 x 4,096 bytes" in text


def test_exit_codes_as_documented(tmp_path, capsys, tiny):
    d = tiny.parent
    assert run(capsys, "run", tiny, "--host", d / "host.npy", "--weights", d / "w.npy")[0] == 0
    fault = tmp_path / "fault.tasm"
    fault.write_text(".config array_size=8\nRHM 99, 0, 1\nHLT\n")
    assert run(capsys, "run", fault)[0] == 1
    bad = tmp_path / "bad.tasm"
    bad.write_text("FROB\n")
    assert run(capsys, "run", bad)[0] == 2
    assert run(capsys, "run", tmp_path / "missing.tasm")[0] == 2

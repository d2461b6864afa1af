"""tpuasm.program: the one loader of program files, in the library (issue 24 item 1): the
command line and the debugger use it, nothing else defines one."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import tpuasm
from tpuasm.errors import BinaryFormatError
from tpuasm.program import load_program, program_format

ROOT = Path(tpuasm.__file__).resolve().parent.parent
SOURCE = ".config array_size=16\n.ub a, 4\n.acc s, 4\n  RW 0\n  MMC.SO ub.a, acc.s, 4\n  HLT\n"


def test_one_loader_in_the_library():
    defined = [p for p in [*ROOT.joinpath("tpuasm").rglob("*.py"),
                           *ROOT.joinpath("debugger").rglob("*.py")]
               if re.search(r"^def load_program\(", p.read_text(), re.M)]
    assert [p.relative_to(ROOT).as_posix() for p in defined] == ["tpuasm/program.py"]
    for face in ("debugger/cli.py", "debugger/session.py", "tpuasm/cli.py"):
        text = ROOT.joinpath(face).read_text()
        assert "load_program" in text and "from tpuasm.cli import load_program" not in text


def test_source_and_binary_load_to_the_same_program(tmp_path):
    src = tmp_path / "p.tasm"
    src.write_text(SOURCE)
    program = load_program(src)
    binary = tmp_path / "p.tbin"
    binary.write_bytes(program.to_bytes())
    again = load_program(binary)
    assert program_format(binary, binary.read_bytes(), None) == "tbin"
    assert again.to_bytes() == program.to_bytes()
    assert load_program(binary, {"ub_rows": 128}).shape.ub_rows == 128


def test_a_damaged_binary_is_named(tmp_path):
    bad = tmp_path / "bad.tbin"
    bad.write_bytes(b"TBIN" + b"\xff" * 7)     # the magic, then nothing valid
    with pytest.raises(BinaryFormatError, match=r"bad\.tbin"):
        load_program(bad)

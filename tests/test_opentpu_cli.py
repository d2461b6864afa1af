"""The OpenTPU faces of the command line: asm --format opentpu, run/disasm of OpenTPU
binaries, --profile/--matsize/--timing, lint, --strip-nops.

Values are checked against an independent numpy model of OpenTPU's semantics
(programs/opentpu/opentpu_model.py), never against the emulator's own output.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tpuasm.cli import main
from tpuasm.opentpu import WORD_BYTES, from_opentpu_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs" / "opentpu"))
import opentpu_model as model  # noqa: E402

# An OpenTPU program as OpenTPU's users write it: Boston-housing shape, NOP padding,
# `#` comments; every layer through ReLU, and a sigmoid of layer 1 on the side.
BOSTON = """\
# Host mem: N x 13 input matrix
# Weight mem: three 16 x 16 tiles
RHM 0, 0, 10   # read from host mem addr 0, to UB addr 0, for length N = 10
RW  0         # read weights from dram addr 0 to FIFO
NOP
NOP
NOP
MMC.SO 0, 0, 10   # UB 0 -> accumulator 0, length 10
NOP
NOP
ACT.Q 0, 20, 10   # sigmoid of layer 1 -> UB 20
ACT.R 0, 0, 10 # ReLU -> UB 0
RW 1
NOP
MMC.SO 0, 0, 10
ACT.R 0, 0, 10
RW 2
MMC.SO 0, 0, 10
ACT.R 0, 0, 10
NOP
WHM 0, 0, 10   # write result from UB addr 0, to host mem addr 0, for length 10
WHM 20, 10, 10
NOP
HLT
"""


@pytest.fixture
def boston(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    g = np.random.default_rng(506)
    host = np.zeros((20, 16), np.int8)
    host[:10, :13] = g.integers(0, 16, (10, 13))
    weights = g.integers(-4, 5, (3, 16, 16)).astype(np.int8)
    np.save("boston_input.npy", host)
    np.save("boston_weights.npy", weights)
    Path("boston.a").write_text(BOSTON)
    return host, weights


def expected_sim8(host, weights) -> np.ndarray:
    x = host[:10]
    h1 = model.mmc(x, weights[0])
    side = model.act(h1, "sigmoid")
    h = model.act(h1, "relu")
    for t in (1, 2):
        h = model.act(model.mmc(h, weights[t]), "relu")
    out = host.copy()
    out[:10], out[10:20] = h, side
    return out


RUN = ["--host", "boston_input.npy", "--weights", "boston_weights.npy", "-q"]


def test_run_boston_as_opentpu_users_do(boston, capsys):
    host, weights = boston
    assert main(["run", "boston.a", "--profile", "opentpu", "--matsize", "16",
                 "--host", "boston_input.npy", "--weights", "boston_weights.npy",
                 "--out", "sim8.npy"]) == 0
    sim8 = np.load("sim8.npy", allow_pickle=False)
    assert sim8.dtype == np.int8 and sim8.shape == host.shape
    assert np.array_equal(sim8, expected_sim8(host, weights))
    assert "halted after" in capsys.readouterr().out


def test_matsize_comes_from_the_data(boston):
    host, weights = boston
    assert main(["run", "boston.a", "--profile", "opentpu", *RUN, "--out", "a.npy"]) == 0
    assert np.array_equal(np.load("a.npy"), expected_sim8(host, weights))


def test_wrong_matsize_is_a_data_error(boston, capsys):
    assert main(["run", "boston.a", "--profile", "opentpu", "--matsize", "8", *RUN]) == 2
    err = capsys.readouterr().err
    assert "boston_input.npy" in err or "boston_weights.npy" in err


def test_asm_opentpu_then_run_and_disasm(boston, capsys):
    host, weights = boston
    assert main(["asm", "boston.a", "--format", "opentpu", "-o", "boston.out"]) == 0
    data = Path("boston.out").read_bytes()
    assert len(data) == 22 * WORD_BYTES
    assert data[:WORD_BYTES].hex() == "06000a" + "00" * 8 + "000000"      # RHM 0, 0, 10
    # run: detected by extension and content, profile and N implied
    assert main(["run", "boston.out", *RUN, "--out", "b.npy"]) == 0
    assert np.array_equal(np.load("b.npy"), expected_sim8(host, weights))
    Path("boston.bin").write_bytes(data)
    assert main(["run", "boston.bin", *RUN, "--out", "c.npy"]) == 0
    assert np.array_equal(np.load("c.npy"), expected_sim8(host, weights))
    # disasm prints OpenTPU assembly that assembles back to the same bytes
    capsys.readouterr()
    assert main(["disasm", "boston.out"]) == 0
    text = capsys.readouterr().out
    assert "MMC.SO 0, 0, 10\n" in text and ".config" not in text
    Path("again.a").write_text(text)
    assert main(["asm", "again.a", "-o", "again.out"]) == 0        # .out implies the format
    assert Path("again.out").read_bytes() == data


def test_asm_default_output_name_is_dot_out(boston):
    assert main(["asm", "boston.a", "--format", "opentpu"]) == 0
    assert from_opentpu_bytes(Path("boston.out").read_bytes()).instructions[0].key == "RHM"


def test_width_error_names_the_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("wide.a").write_text("RHM 0, 0, 10\nRHM 0, 0, 300\nHLT\n")
    assert main(["asm", "wide.a", "--format", "opentpu"]) == 2
    err = capsys.readouterr().err
    assert "wide.a:2:1: error: cannot write in OpenTPU format: length 300" in err
    assert not Path("wide.out").exists()


def test_corrupt_binary_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("bad.out").write_bytes(bytes(20))
    assert main(["run", "bad.out"]) == 2
    assert "bad.out: 20 bytes is not a whole number of 14-byte OpenTPU instructions" \
        in capsys.readouterr().err
    Path("op.out").write_bytes(bytes([9]) + bytes(13))
    assert main(["disasm", "op.out"]) == 2
    assert "invalid opcode 0x09" in capsys.readouterr().err


def test_lint_and_strip_nops(boston, capsys):
    host, weights = boston
    assert main(["lint", "boston.a"]) == 1
    out = capsys.readouterr().out
    assert "boston.a:5:1: warning: 3 NOPs (lines 5-7) are unnecessary" in out
    assert "boston.a: 8 unnecessary NOPs in 5 runs" in out
    assert main(["asm", "boston.a", "--strip-nops", "--format", "opentpu", "-o", "lean.out"]) == 0
    lean = from_opentpu_bytes(Path("lean.out").read_bytes())
    assert len(lean) == 14 and all(i.key != "NOP" for i in lean.instructions)
    assert main(["lint", "lean.out"]) == 0
    assert main(["run", "lean.out", *RUN, "--out", "lean.npy"]) == 0
    assert np.array_equal(np.load("lean.npy"), expected_sim8(host, weights))


def test_lint_format_reads_the_named_binary_format(boston, capsys):
    assert main(["asm", "boston.a", "--format", "opentpu", "-o", "boston.bin"]) == 0
    capsys.readouterr()
    assert main(["lint", "--format", "opentpu", "boston.bin"]) == 1
    out = capsys.readouterr().out
    assert "boston.bin: instructions 2-4: warning: 3 NOPs are unnecessary" in out
    assert "boston.bin: 8 unnecessary NOPs in 5 runs" in out
    assert main(["lint", "--format", "tbin", "boston.bin"]) == 2
    assert "boston.bin: not a .tbin file" in capsys.readouterr().err


def test_timing_option(boston, capsys):
    assert main(["run", "boston.a", "--profile", "opentpu", *RUN, "--timing", "tpu",
                 "--stats", "tpu.json"]) == 0
    assert main(["run", "boston.a", "--profile", "opentpu", *RUN, "--stats", "otpu.json"]) == 0
    import json
    tpu = json.loads(Path("tpu.json").read_text())
    otpu = json.loads(Path("otpu.json").read_text())
    cycles = lambda s: s["counters"]["cycles"] if "counters" in s else s["cycles"]  # noqa: E731
    assert cycles(otpu) < cycles(tpu)          # no 700-cycle host round trips


def test_lint_opentpu_checks_the_padding_for_opentpus_hardware(boston, capsys):
    assert main(["lint", "--opentpu", "--matsize", "16", "boston.a"]) == 1
    out = capsys.readouterr().out
    assert ("boston.a:8:1: warning: on OpenTPU's hardware (no interlocks) this issues at cycle 5, "
            "5 cycles too early: `RHM 0, 0, 10` (line 3) writes rows this uses until cycle 10") in out
    assert "places where OpenTPU's hardware needs more NOPs" in out
    Path("wide.a").write_text("RHM 0, 0, 300\nHLT\n")
    assert main(["lint", "--opentpu", "wide.a"]) == 2
    assert "cannot write in OpenTPU format: length 300" in capsys.readouterr().err


def test_asm_opentpu_listing_shows_the_14_byte_words(boston):
    assert main(["asm", "boston.a", "--format", "opentpu", "--listing", "boston.lst"]) == 0
    lines = Path("boston.lst").read_text().splitlines()
    assert len(lines) == 1 + 22
    assert lines[1].startswith("     0  00000000  06 00 0a" + " 00" * 11 + "  boston.a:3  RHM 0, 0, 10")
    assert lines[6].startswith("     5  00000046  03 05 0a") and "boston.a:8  MMC.SO 0, 0, 10" in lines[6]

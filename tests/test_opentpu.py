"""OpenTPU's 14-byte binary format: encoding, decoding, detection, width errors.

Expected bytes are written out by hand from the documented layout (TPU_FACTS.md:
big-endian, opcode | flags | length | addr(8) | ub_addr(3)), and compared against a
small model of OpenTPU's own assembler as read in its source (`_opentpu_assembler`
below: per-line `#` comments, `OP.FLAGS a, b, c`, `int(x, 0)` operands, flag letters
found anywhere in the suffix, each field written big-endian in that order).
"""
from __future__ import annotations

import random

import pytest

from tpuasm.assembler import assemble
from tpuasm.binary import MachineShape, Program
from tpuasm.encoding import Instruction
from tpuasm.errors import AssemblyError, BinaryFormatError, DataFileError, EncodingError
from tpuasm.opentpu import (WORD_BYTES, from_opentpu_bytes, is_opentpu_file, load_opentpu,
                            looks_like_opentpu, matsize_from_data, to_opentpu_bytes,
                            to_opentpu_source)

OPENTPU = {"profile": "opentpu", "array_size": 8, "ub_rows": 1 << 24}


def asm(text: str) -> Program:
    return assemble(text, "prog.a", config=OPENTPU)


def words(data: bytes) -> list[str]:
    return [data[i:i + WORD_BYTES].hex(" ") for i in range(0, len(data), WORD_BYTES)]


# --------------------------------------------------------------- hand-derived bytes
HAND = [
    # RHM host, ub, n: addr = host (source), ub_addr = destination
    ("RHM 1, 2, 3", "06 00 03 00 00 00 00 00 00 00 01 00 00 02"),
    # WHM ub, host, n: ub_addr = source, addr = destination
    ("WHM 5, 7, 9", "01 00 09 00 00 00 00 00 00 00 07 00 00 05"),
    ("RW 0x1234", "02 00 00 00 00 00 00 00 00 12 34 00 00 00"),
    # MMC ub, acc, n: S = 0x01, O = 0x04
    ("MMC.SO 0x10, 0x20, 255", "03 05 ff 00 00 00 00 00 00 00 20 00 00 10"),
    ("MMC 0xabcdef, 0x0fff, 1", "03 00 01 00 00 00 00 00 00 0f ff ab cd ef"),
    ("MMC.S 0, 0, 8", "03 01 08 00 00 00 00 00 00 00 00 00 00 00"),
    # ACT acc, ub, n: addr = accumulator (source), ub_addr = destination; R 0x08, Q 0x10
    ("ACT.R 0, 0, 10", "04 08 0a 00 00 00 00 00 00 00 00 00 00 00"),
    ("ACT.Q 3, 0x123456, 1", "04 10 01 00 00 00 00 00 00 00 03 12 34 56"),
    ("ACT 7, 9, 2", "04 00 02 00 00 00 00 00 00 00 07 00 00 09"),
    ("NOP", "00 00 00 00 00 00 00 00 00 00 00 00 00 00"),
    ("SYNC", "05 00 00 00 00 00 00 00 00 00 00 00 00 00"),
    ("HLT", "07 00 00 00 00 00 00 00 00 00 00 00 00 00"),
    ("RHM 0xfffffffe, 0xffffff, 255", "06 00 ff 00 00 00 00 ff ff ff fe ff ff ff"),
]


@pytest.mark.parametrize("source, expected", HAND)
def test_hand_derived_encoding(source, expected):
    assert words(to_opentpu_bytes(asm(source))) == [expected]


@pytest.mark.parametrize("source, expected", HAND)
def test_decoding_inverts_encoding(source, expected):
    program = asm(source)
    decoded = from_opentpu_bytes(bytes.fromhex(expected.replace(" ", "")))
    assert decoded.instructions == program.instructions
    assert decoded.shape == MachineShape(array_size=8, profile="opentpu")


def test_nop_repeat_is_written_out_as_nops():
    data = to_opentpu_bytes(asm("NOP repeat=3\nHLT"))
    assert words(data) == ["00" + " 00" * 13] * 3 + ["07" + " 00" * 13]


# --------------------------------------------------------------- OpenTPU's assembler
_OPCODES = {"NOP": 0, "WHM": 1, "RW": 2, "MMC": 3, "ACT": 4, "SYNC": 5, "RHM": 6, "HLT": 7}
_FLAGS = {"S": 0x01, "C": 0x02, "O": 0x04, "R": 0x08, "Q": 0x10}


def _opentpu_assembler(text: str) -> bytes:
    """What OpenTPU's assembler does with a source, as read in its source (our model)."""
    out = b""
    for line in text.splitlines():
        line = line.partition("#")[0]
        if not line.strip():
            continue
        mnemonic, _, rest = line.strip().partition(" ")
        op, _, letters = mnemonic.partition(".")
        flags = sum(bit for letter, bit in _FLAGS.items() if letter in letters)
        ops = [int(x.strip(), 0) for x in rest.split(",")] if rest.strip() else []
        length = addr = ub = 0
        if op in ("RHM", "ACT"):          # addr = source, ub_addr = destination
            addr, ub, length = ops
        elif op in ("WHM", "MMC"):        # ub_addr = source, addr = destination
            ub, addr, length = ops
        elif op == "RW":
            (addr,) = ops
        out += (_OPCODES[op].to_bytes(1, "big") + flags.to_bytes(1, "big")
                + length.to_bytes(1, "big") + addr.to_bytes(8, "big") + ub.to_bytes(3, "big"))
    return out


BOSTON_LIKE = """\
# Host mem: N x 13 input matrix
# Weight mem: three 16 x 16 tiles
RHM 0, 0, 10   # read from host mem addr 0, to UB addr 0, for length N = 10
RW  0         # read weights from dram addr 0 to FIFO
NOP
NOP
MMC.SO 0, 0, 10   # UB 0 -> accumulator 0, length 10
ACT.R 0, 0, 10 # ReLU, accumulator 0 -> UB 0
RW 1
MMC.SO 0, 0, 10
ACT.R 0, 0, 10
RW 2
MMC.SO 0, 0, 10
ACT.Q 0, 0x20, 10
ACT 0, 0x21, 0x0a
WHM 0x20, 0, 10   # write result from UB addr 0, to host mem addr 0, for length 10
SYNC
HLT
"""


def test_matches_opentpu_assembler_on_a_whole_program():
    ours = to_opentpu_bytes(assemble(BOSTON_LIKE, "boston.a", config={"profile": "opentpu",
                                                                      "array_size": 16}))
    assert ours == _opentpu_assembler(BOSTON_LIKE)
    assert len(ours) == 16 * WORD_BYTES


def test_matches_opentpu_assembler_on_random_programs():
    rng = random.Random(6)
    for _ in range(30):
        lines = []
        for _ in range(rng.randint(1, 25)):
            op = rng.choice(["RHM", "WHM", "RW", "MMC", "ACT", "NOP", "SYNC", "HLT"])
            n = rng.randint(1, 255)
            if op in ("RHM", "WHM"):
                lines.append(f"{op} {rng.randrange(1 << 20)}, {rng.randrange(1 << 16)}, {n}")
            elif op == "RW":
                lines.append(f"RW {hex(rng.randrange(1 << 20))}")
            elif op == "MMC":
                flags = rng.choice(["", ".S", ".O", ".SO", ".OS"])
                lines.append(f"MMC{flags} {rng.randrange(1 << 16)}, {rng.randrange(4096)}, {n}")
            elif op == "ACT":
                flags = rng.choice(["", ".R", ".Q"])
                lines.append(f"ACT{flags} {rng.randrange(4096)}, {rng.randrange(1 << 16)}, {n}")
            else:
                lines.append(op)
        text = "\n".join(lines) + "\n"
        program = assemble(text, "r.a", config=OPENTPU)
        data = to_opentpu_bytes(program)
        assert data == _opentpu_assembler(text), text
        assert from_opentpu_bytes(data).instructions == program.instructions


# --------------------------------------------------------------- width errors
@pytest.mark.parametrize("source, words_in_message", [
    ("RHM 0, 0, 256", ["length 256", "1-byte length field", "at most 255"]),
    ("MMC.S 0, 0, 1000", ["length 1000", "at most 255"]),
    ("CFG act_shift, 8", ["no Set_Configuration (CFG)"]),
    ("RHMA 0, 0, 4", ["no Read_Host_Memory_Alt (RHMA)"]),
    ("TAG 3", ["no Debug_Tag"]),
    ("WSYNC", ["no Sync_Weights"]),
    ("MMC.SU 0, 0, 4", ["MMC has no flag U", "S, O"]),
    ("MMC.SWD 0, 0, 4", ["MMC has no flag W, D"]),
    ("MMC.C 0, 0, 2, 2", ["MMC has no flag C"]),
    ("ACT.T 0, 0, 4", ["ACT has no flag T", "R, Q"]),
    ("ACT.RM 0, 0, 4", ["ACT has no flag M"]),
    ("RW 3, repeat=2", ["no repeat field", "repeat=2"]),
])
def test_fields_too_wide_are_assembly_errors(source, words_in_message):
    with pytest.raises(AssemblyError) as err:
        to_opentpu_bytes(asm(source))
    text = str(err.value)
    assert "prog.a:1:" in text and "cannot write in OpenTPU format" in text
    for w in words_in_message:
        assert w in text


def test_every_width_error_is_reported_with_its_line():
    src = "RHM 0, 0, 10\nRHM 0, 0, 300\nNOP\nCFG act_shift, 1\nHLT\n"
    with pytest.raises(AssemblyError) as err:
        to_opentpu_bytes(asm(src))
    lines = sorted(d.line for d in err.value.diagnostics)
    assert lines == [2, 4]


def test_width_error_without_source_positions_is_an_encoding_error():
    program = Program([Instruction("RHM", 0, 1, {"host": 0, "ub": 0, "length": 300})])
    with pytest.raises(EncodingError, match="instruction 0: length 300"):
        to_opentpu_bytes(program)


# --------------------------------------------------------------- decode errors
def word(hexbytes: str) -> bytes:
    data = bytes.fromhex(hexbytes.replace(" ", ""))
    assert len(data) == WORD_BYTES
    return data


HLT_WORD = word("07 00 00 00 00 00 00 00 00 00 00 00 00 00")


@pytest.mark.parametrize("data, message", [
    (b"", "empty file"),
    (HLT_WORD[:13], "13 bytes is not a whole number of 14-byte OpenTPU instructions: "
                    "instruction 0 is truncated (13 of 14 bytes)"),
    (HLT_WORD * 2 + HLT_WORD[:5], "instruction 2 is truncated (5 of 14 bytes)"),
    (HLT_WORD + word("08 00 00 00 00 00 00 00 00 00 00 00 00 00"),
     "instruction 1 (byte 14): invalid opcode 0x08"),
    (word("ff 00 00 00 00 00 00 00 00 00 00 00 00 00"), "invalid opcode 0xff"),
    (word("06 01 01 00 00 00 00 00 00 00 00 00 00 00"), "RHM: flag bits 0x01 are not defined"),
    (word("03 02 01 00 00 00 00 00 00 00 00 00 00 00"), "no convolution"),
    (word("03 20 01 00 00 00 00 00 00 00 00 00 00 00"), "MMC: flag bits 0x20"),
    (word("04 01 01 00 00 00 00 00 00 00 00 00 00 00"), "ACT: flag bits 0x01"),
    (word("04 18 01 00 00 00 00 00 00 00 00 00 00 00"), "both ReLU (R) and sigmoid (Q)"),
    (word("00 00 05 00 00 00 00 00 00 00 00 00 00 00"), "NOP: its unused length field is 5"),
    (word("02 00 00 00 00 00 00 00 00 00 00 00 00 01"), "RW: its unused ub field is 1"),
    (word("06 00 00 00 00 00 00 00 00 00 00 00 00 00"), "RHM: length 0 (an OpenTPU length is 1..255)"),
    (word("06 00 01 00 00 00 01 00 00 00 00 00 00 00"), "RHM: host 4294967296 out of range"),
    (word("03 00 01 00 00 00 00 00 01 00 00 00 00 00"), "MMC: acc 65536 out of range"),
])
def test_decode_errors_name_what_and_where(data, message):
    with pytest.raises(BinaryFormatError) as err:
        from_opentpu_bytes(data)
    assert message in str(err.value)


def test_load_names_the_file(tmp_path):
    bad = tmp_path / "bad.out"
    bad.write_bytes(HLT_WORD[:7])
    with pytest.raises(BinaryFormatError, match=r"bad\.out: 7 bytes"):
        load_opentpu(bad)
    with pytest.raises(BinaryFormatError, match="cannot read"):
        load_opentpu(tmp_path / "missing.out")


# --------------------------------------------------------------- detection
def test_detection_by_content_and_extension(tmp_path):
    program = asm(BOSTON_LIKE)
    data = to_opentpu_bytes(program)
    assert looks_like_opentpu(data)
    assert not looks_like_opentpu(program.to_bytes())           # a .tbin
    assert not looks_like_opentpu(BOSTON_LIKE.encode())          # a source
    assert not looks_like_opentpu(data[:-1])
    assert not looks_like_opentpu(b"")
    raw = tmp_path / "prog.bin"
    raw.write_bytes(data)
    assert is_opentpu_file(raw)                                  # by content
    named = tmp_path / "prog.out"
    named.write_bytes(b"whatever")
    assert is_opentpu_file(named)                                # by extension
    text = tmp_path / "prog.a"
    text.write_text(BOSTON_LIKE)
    assert not is_opentpu_file(text)


def test_opentpu_source_reassembles_to_the_same_bytes():
    program = asm(BOSTON_LIKE)
    text = to_opentpu_source(program)
    assert _opentpu_assembler(text) == to_opentpu_bytes(program)
    assert to_opentpu_bytes(asm(text)) == to_opentpu_bytes(program)


# --------------------------------------------------------------- data images
def test_matsize_from_data(tmp_path):
    import numpy as np
    np.save(tmp_path / "w.npy", np.zeros((3, 16, 16), np.int8))
    np.save(tmp_path / "h.npy", np.zeros((10, 16), np.int8))
    np.save(tmp_path / "h8.npy", np.zeros((10, 8), np.int8))
    np.save(tmp_path / "bad.npy", np.zeros((3, 16, 8), np.int8))
    assert matsize_from_data(tmp_path / "h.npy", tmp_path / "w.npy") == 16
    assert matsize_from_data(host=tmp_path / "h8.npy") == 8
    assert matsize_from_data() is None
    with pytest.raises(DataFileError, match="disagree"):
        matsize_from_data(tmp_path / "h8.npy", tmp_path / "w.npy")
    with pytest.raises(DataFileError, match=r"expected \(tiles, N, N\)"):
        matsize_from_data(weights=tmp_path / "bad.npy")
    with pytest.raises(DataFileError, match=r"h3d.npy: host image has shape \(2, 3, 8\), "
                                            r"expected \(rows, N\)"):
        np.save(tmp_path / "h3d.npy", np.zeros((2, 3, 8), np.int8))
        matsize_from_data(host=tmp_path / "h3d.npy")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(DataFileError, match="text.npy: weight image is not a .npy file"):
        matsize_from_data(weights=tmp_path / "text.npy")
    with pytest.raises(DataFileError, match="missing.npy: cannot read host image: No such file"):
        matsize_from_data(host=tmp_path / "missing.npy")

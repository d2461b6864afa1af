"""The .tbin container: round trips, and every kind of damage is a BinaryFormatError."""
import struct
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from tpuasm.binary import MachineShape, Program, SourceLoc, Symbol, load_binary
from tpuasm.encoding import Instruction
from tpuasm.errors import BinaryFormatError


def sample_program() -> Program:
    instructions = [
        Instruction("RHM", 0, 1, {"host": 0, "ub": 4, "length": 8}),
        Instruction("RW", 0, 2, {"tile": 3}),
        Instruction("MMC", 0x05, 1, {"ub": 4, "acc": 0, "length": 8}),
        Instruction("ACT", 0x08, 1, {"acc": 0, "ub": 100, "length": 8}),
        Instruction("HLT"),
    ]
    locations = [SourceLoc("prog.tasm", i + 1, 5) for i in range(4)] + [None]
    symbols = [Symbol("input", "ub", 4, 8), Symbol("BATCH", "const", -8), Symbol("w", "tile", 3, 2)]
    return Program(instructions, MachineShape(array_size=16, ub_rows=512), locations, symbols,
                   {"prog.tasm": "RHM 0, 4, 8\nRW 3, repeat=2\n", "inc.tasm": "; héllo\n"})


def test_round_trip_keeps_everything():
    p = sample_program()
    q = Program.from_bytes(p.to_bytes())
    assert q.instructions == p.instructions
    assert q.shape == p.shape
    assert q.locations == p.locations
    assert q.symbols == p.symbols
    assert q.sources == p.sources


def test_header_fields_are_where_the_spec_says():
    data = sample_program().to_bytes()
    assert data[:4] == b"TBIN"
    assert struct.unpack_from("<H", data, 4)[0] == 1
    assert struct.unpack_from("<I", data, 8)[0] == zlib.crc32(data[12:])
    assert struct.unpack_from("<IIIHH", data, 12) == (16, 512, 4096, 4, 0)


def test_stripped_drops_debug_information_only():
    p = sample_program()
    s = p.stripped()
    assert s.code() == p.code() and s.shape == p.shape
    assert s.symbols == [] and s.sources == {} and all(loc is None for loc in s.locations)


def _resealed(data: bytes) -> bytes:
    """Fix the checksum so that the reader gets past it to the damage under test."""
    return data[:8] + struct.pack("<I", zlib.crc32(data[12:])) + data[12:]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[:10], "too short"),
    (lambda d: b"XBIN" + d[4:], "not a .tbin file"),
    (lambda d: _resealed(d[:4] + struct.pack("<H", 9) + d[6:]), "unsupported .tbin version 9"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum mismatch"),
    (lambda d: d[:-3], "checksum mismatch"),
    (lambda d: _resealed(d[:12] + struct.pack("<I", 0) + d[16:]), "array_size 0 out of range"),
    (lambda d: _resealed(d[:26] + struct.pack("<H", 7) + d[28:]), "unknown machine profile 7"),
    (lambda d: _resealed(d[:6] + struct.pack("<H", 200) + d[8:]), "section table (200 entries)"),
])
def test_damaged_files_are_named(mutate, message):
    with pytest.raises(BinaryFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Program.from_bytes(mutate(sample_program().to_bytes()))


def _patch_code(data: bytes, index: int, word: bytes) -> bytes:
    code_offset = struct.unpack_from("<I", data, 28 + 4)[0]
    start = code_offset + 12 * index
    return _resealed(data[:start] + word + data[start + 12:])


@pytest.mark.parametrize("word, message", [
    (bytes([0x3F]) + bytes(11), "instruction 1: invalid opcode 0x3f"),
    (bytes([0x03, 0x80]) + bytes(10), "instruction 1: MMC: undefined flag bits 0x80"),
    (bytes([0x05, 0, 3]) + bytes(9), "instruction 1: SYNC does not take a repeat count"),
    (bytes([0x07]) + bytes(10) + b"\x01", "instruction 1: HLT: reserved bits are not zero"),
    (bytes([0x06]) + bytes(11), "instruction 1: RHM: length is 0"),
    (bytes([0x0A, 0, 0, 99]) + bytes(8), "instruction 1: CFG: no configuration register 99"),
])
def test_corrupt_instruction_words_name_the_instruction(word, message):
    with pytest.raises(BinaryFormatError, match=message):
        Program.from_bytes(_patch_code(sample_program().to_bytes(), 1, word))


def test_load_binary_names_the_file(tmp_path):
    path = tmp_path / "bad.tbin"
    path.write_bytes(b"TBIN\x01\x00")
    with pytest.raises(BinaryFormatError, match="bad.tbin: too short"):
        load_binary(path)
    with pytest.raises(BinaryFormatError, match="missing.tbin: cannot read"):
        load_binary(tmp_path / "missing.tbin")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_format_errors(data):
    with pytest.raises(BinaryFormatError):
        Program.from_bytes(data)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_truncated_or_flipped_files_raise_only_format_errors(data):
    raw = sample_program().to_bytes()
    cut = data.draw(st.integers(0, len(raw) - 1))
    damaged = raw[:cut]
    if data.draw(st.booleans()):
        pos = data.draw(st.integers(0, len(raw) - 1))
        damaged = _resealed(raw[:pos] + bytes([raw[pos] ^ data.draw(st.integers(1, 255))]) + raw[pos + 1:])
    try:
        Program.from_bytes(damaged)
    except BinaryFormatError:
        pass


def test_source_line_gives_the_stripped_line_or_nothing():
    from tpuasm.assembler import assemble
    p = assemble("  NOP\n\tHLT   \n", "s.tasm")
    assert p.source_line(p.locations[0]) == "NOP"
    assert p.source_line(p.locations[1]) == "HLT"
    assert p.source_line(None) == ""
    assert p.source_line(SourceLoc("s.tasm", 99, 1)) == ""
    assert p.source_line(SourceLoc("other.tasm", 1, 1)) == ""
    assert p.stripped().source_line(p.locations[0]) == ""


def test_machine_shape_problems_names_each_bad_setting():
    assert MachineShape.problems({"array_size": 16, "profile": "tpu"}) == {}
    assert MachineShape.problems({"array_size": 0, "ub_rows": "x", "acc_rows": (1 << 16) + 1,
                                  "profile": "gpu"}) == {
        "array_size": "array_size 0 out of range 1..4096",
        "ub_rows": "ub_rows: not an integer: 'x'",
        "acc_rows": "acc_rows 65537 out of range 1..65536",     # the acc field is 16 bits
        "profile": "unknown profile 'gpu' (choose from tpu, opentpu)"}
    with pytest.raises(ValueError, match="array_size 0 out of range 1..4096; fifo_depth 0"):
        MachineShape(array_size=0, fifo_depth=0)

"""Encodings against bytes worked out by hand from the bit layout in spec/isa.toml.

Layout reminder (little-endian 96-bit word, byte k = bits 8k..8k+7):
byte 0 opcode, byte 1 flags, byte 2 repeat-1, operand fields from bit 24 (byte 3) on.
Each expected word below was written down from that table, not produced by `encode`.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings

from strategies import instructions
from tpuasm.assembler import assemble
from tpuasm.encoding import Instruction, decode, encode
from tpuasm.errors import EncodingError
from tpuasm.isa import ISA_TABLE

I = Instruction

# (instruction, its source text, the 12 bytes as hex, spaced per byte)
CASES = {
    "NOP": (I("NOP", 0, 3, {}), "NOP repeat=3",
            "00 00 02 00 00 00 00 00 00 00 00 00"),
    # ub 0x012345 -> bytes 3..5; host 0x89abcdef -> bytes 6..9; length 0x0102 -> bytes 10..11
    "WHM": (I("WHM", 0, 1, {"ub": 0x012345, "host": 0x89ABCDEF, "length": 0x0102}),
            "WHM 0x012345, 0x89abcdef, 0x0102",
            "01 00 00 45 23 01 ef cd ab 89 02 01"),
    # tile (bits 24..55) 0x01020304, repeat 9 -> field 8
    "RW": (I("RW", 0, 9, {"tile": 0x01020304}), "RW 0x01020304, repeat=9",
           "02 00 08 04 03 02 01 00 00 00 00 00"),
    # S|O = 0x05; ub bytes 3..5; acc (bits 48..63) bytes 6..7; length (64..95) bytes 8..11
    "MMC": (I("MMC", 0x05, 2, {"ub": 5, "acc": 0x0A0B, "length": 0x00010002}),
            "MMC.SO 5, 0x0a0b, 0x10002, repeat=2",
            "03 05 01 05 00 00 0b 0a 02 00 01 00"),
    # C = 0x02; height (64..79) bytes 8..9, width (80..95) bytes 10..11
    "MMC.C": (I("MMC", 0x02, 1, {"ub": 1, "acc": 2, "height": 3, "width": 0x0405}),
              "MMC.C 1, 2, 3, 0x405",
              "03 02 00 01 00 00 02 00 03 00 05 04"),
    # R|M = 0x08|0x40; ub bytes 3..5, acc bytes 6..7, length bytes 8..11 (source order: acc, ub, length)
    "ACT": (I("ACT", 0x48, 1, {"acc": 0x0102, "ub": 0x00BEEF, "length": 7}),
            "ACT.RM 0x0102, 0xbeef, 7",
            "04 48 00 ef be 00 02 01 07 00 00 00"),
    "SYNC": (I("SYNC"), "SYNC", "05 00 00 00 00 00 00 00 00 00 00 00"),
    # source order host, ub, length; ub bytes 3..5, host bytes 6..9, length bytes 10..11
    "RHM": (I("RHM", 0, 1, {"host": 0x10, "ub": 0x20, "length": 0x30}), "RHM 0x10, 0x20, 0x30",
            "06 00 00 20 00 00 10 00 00 00 30 00"),
    "HLT": (I("HLT"), "HALT", "07 00 00 00 00 00 00 00 00 00 00 00"),
    # every field at its maximum, repeat 256 (field 255)
    "RHMA": (I("RHMA", 0, 256, {"host": 0xFFFFFFFF, "ub": 0x017FFF, "length": 0xFFFF}),
             "RHMA 0xffffffff, 98303, 65535, repeat=256",
             "08 00 ff ff 7f 01 ff ff ff ff ff ff"),
    "WHMA": (I("WHMA", 0, 1, {"ub": 1, "host": 2, "length": 3}), "WHMA 1, 2, 3",
             "09 00 00 01 00 00 02 00 00 00 03 00"),
    # reg act_mult = index 0 (byte 3); value -2 = 0xfffffffe two's complement (bytes 4..7)
    "CFG": (I("CFG", 0, 1, {"reg": 0, "value": -2}), "CFG act_mult, -2",
            "0a 00 00 00 fe ff ff ff 00 00 00 00"),
    "WSYNC": (I("WSYNC"), "WSYNC", "0b 00 00 00 00 00 00 00 00 00 00 00"),
    "INT": (I("INT", 0, 1, {"code": 0xDEADBEEF}), "INT 0xdeadbeef",
            "0c 00 00 ef be ad de 00 00 00 00 00"),
    "TAG": (I("TAG", 0, 1, {"tag": 42}), "TAG 42", "0d 00 00 2a 00 00 00 00 00 00 00 00"),
    # U|B = 0x03, repeat 2; a (bits 24..43) 0x12345: bytes 3, 4 and the low nibble of 5;
    # b (44..63) 0x0bcde: the high nibble of byte 5 (e), bytes 6..7 (cd, 0b); c (64..83)
    # 0x14321: bytes 8, 9 and the low nibble of 10; length (84..95) 0xfed: the high nibble
    # of byte 10 (d) and byte 11 (fe)
    "VADD": (I("VADD", 0x03, 2, {"a": 0x12345, "b": 0x0BCDE, "c": 0x14321, "length": 0xFED}),
             "VADD.UB 0x12345, 0xbcde, 0x14321, 0xfed, repeat=2",
             "0e 03 01 45 23 e1 cd 0b 21 43 d1 fe"),
    # L = 0x04; a 1, b 2 (high nibble of byte 5), c 3, length 1 (high nibble of byte 10)
    "VMUL": (I("VMUL", 0x04, 1, {"a": 1, "b": 2, "c": 3, "length": 1}), "VMUL.L 1, 2, 3, 1",
             "0f 04 00 01 00 20 00 00 03 00 10 00"),
}


def test_every_instruction_has_a_hand_computed_case():
    covered = {ins.key for ins, _, _ in CASES.values()}
    assert covered == set(ISA_TABLE.instructions)


@pytest.mark.parametrize("name", sorted(CASES))
def test_encode_matches_hand_computed_bytes(name):
    ins, _text, hexbytes = CASES[name]
    assert encode(ins).hex(" ") == hexbytes


@pytest.mark.parametrize("name", sorted(CASES))
def test_decode_hand_computed_bytes(name):
    ins, _text, hexbytes = CASES[name]
    assert decode(bytes.fromhex(hexbytes)) == ins


@pytest.mark.parametrize("name", sorted(CASES))
def test_assembler_produces_hand_computed_bytes(name):
    _ins, text, hexbytes = CASES[name]
    assert assemble(text).code().hex(" ") == hexbytes


@settings(max_examples=400, deadline=None)
@given(instructions(raw=True))
def test_decode_inverts_encode(ins):
    assert decode(encode(ins)) == ins


def _word(hexbytes: str) -> bytes:
    return bytes.fromhex(hexbytes)


@pytest.mark.parametrize("hexbytes, message", [
    ("10 00 00 00 00 00 00 00 00 00 00 00", "invalid opcode 0x10"),
    ("0e 00 00 00 00 00 00 00 00 00 00 00", "length is 0"),                   # VADD length 0
    ("ff 00 00 00 00 00 00 00 00 00 00 00", "invalid opcode 0xff"),
    ("03 80 00 00 00 00 00 00 01 00 00 00", "undefined flag bits 0x80"),      # MMC has no 0x80
    ("06 01 00 00 00 00 00 00 00 00 01 00", "undefined flag bits 0x01"),      # RHM has no flags
    ("05 00 01 00 00 00 00 00 00 00 00 00", "does not take a repeat count"),  # SYNC, repeat 2
    ("07 00 00 00 00 01 00 00 00 00 00 00", "reserved bits"),                 # HLT with operand bits
    ("02 00 00 00 00 00 00 00 01 00 00 00", "reserved bits"),                 # RW above its field
    ("0a 00 00 01 00 00 00 00 00 00 00 80", "reserved bits"),                 # CFG bits 64..95
    ("06 00 00 00 00 00 00 00 00 00 00 00", "length is 0"),                   # RHM length 0
    ("03 02 00 00 00 00 00 00 01 00 00 00", "width is 0"),                    # MMC.C width 0
    ("0a 00 00 ff 00 00 00 00 00 00 00 00", "no configuration register 255"),
])
def test_decoder_rejects(hexbytes, message):
    with pytest.raises(EncodingError, match=message):
        decode(_word(hexbytes))


def test_decoder_rejects_wrong_word_length():
    with pytest.raises(EncodingError, match="12 bytes"):
        decode(b"\x00" * 11)

"""Encode and decode single instructions to and from 12-byte little-endian words.

Driven entirely by the ISA table: field positions, widths, flag bits and which
instructions take a repeat count all come from spec/isa.toml.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import EncodingError
from .isa import ISA_TABLE, WORD_BYTES, InstructionSpec

_HEADER = ISA_TABLE.table["format"]["header"]
OPCODE_LSB, OPCODE_WIDTH = _HEADER["opcode"]["lsb"], _HEADER["opcode"]["width"]
FLAGS_LSB, FLAGS_WIDTH = _HEADER["flags"]["lsb"], _HEADER["flags"]["width"]
REPEAT_LSB, REPEAT_WIDTH = _HEADER["repeat"]["lsb"], _HEADER["repeat"]["width"]
_HEADER_MASK = ((1 << OPCODE_WIDTH) - 1) << OPCODE_LSB | ((1 << FLAGS_WIDTH) - 1) << FLAGS_LSB \
    | ((1 << REPEAT_WIDTH) - 1) << REPEAT_LSB        # the bits every word's header uses
MAX_REPEAT = 1 << REPEAT_WIDTH          # executions, so the field holds repeat - 1


@dataclass(frozen=True)
class Instruction:
    """One decoded instruction.

    `key` is the canonical mnemonic (``"MMC"``), `flags` the flag bits, `repeat`
    the number of executions (1 = no repeat), `operands` the field values by name.
    """
    key: str
    flags: int = 0
    repeat: int = 1
    operands: dict[str, int] = field(default_factory=dict)

    @property
    def spec(self) -> InstructionSpec:
        return ISA_TABLE.instructions[self.key]

    @property
    def flag_letters(self) -> str:
        return self.spec.flag_letters(self.flags)

    def __getitem__(self, name: str) -> int:
        return self.operands[name]

    def __hash__(self):
        return hash((self.key, self.flags, self.repeat, tuple(sorted(self.operands.items()))))


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise EncodingError(message)


def encode(ins: Instruction) -> bytes:
    """The 12-byte word of `ins`; EncodingError if anything does not fit."""
    spec = ISA_TABLE.instructions.get(ins.key)
    _check(spec is not None, f"unknown instruction {ins.key!r}")
    _check(ins.flags & ~spec.flag_mask == 0,
           f"{spec.key}: illegal flag bits 0x{ins.flags & ~spec.flag_mask:02x}")
    _check(1 <= ins.repeat <= MAX_REPEAT, f"{spec.key}: repeat {ins.repeat} out of range 1..{MAX_REPEAT}")
    _check(spec.repeat or ins.repeat == 1, f"{spec.key} does not take a repeat count")
    names, fields = spec.layout(ins.flags)
    _check(set(ins.operands) == set(names),
           f"{spec.key}: operands {sorted(ins.operands)} do not match {sorted(names)}")
    word = (spec.opcode << OPCODE_LSB) | (ins.flags << FLAGS_LSB) | ((ins.repeat - 1) << REPEAT_LSB)
    for f in fields:
        value = ins.operands[f.name]
        _check(f.min <= value <= f.max, f"{spec.key}: {f.name} {value} out of range {f.min}..{f.max}")
        _check(f.kind != "reg" or value in ISA_TABLE.register_by_index,
               f"{spec.key}: no configuration register {value}")
        word |= (value & ((1 << f.width) - 1)) << f.lsb
    return word.to_bytes(WORD_BYTES, "little")


def decode(word: bytes, index: int | None = None) -> Instruction:
    """The instruction in a 12-byte word; EncodingError names what is wrong."""
    where = "" if index is None else f"instruction {index}: "
    if len(word) != WORD_BYTES:
        raise EncodingError(f"{where}a word is {WORD_BYTES} bytes, got {len(word)}")
    value = int.from_bytes(word, "little")
    opcode = (value >> OPCODE_LSB) & ((1 << OPCODE_WIDTH) - 1)
    spec = ISA_TABLE.by_opcode.get(opcode)
    if spec is None:
        raise EncodingError(f"{where}invalid opcode 0x{opcode:02x}")
    flags = (value >> FLAGS_LSB) & ((1 << FLAGS_WIDTH) - 1)
    if flags & ~spec.flag_mask:
        raise EncodingError(f"{where}{spec.key}: undefined flag bits 0x{flags & ~spec.flag_mask:02x}")
    repeat = ((value >> REPEAT_LSB) & ((1 << REPEAT_WIDTH) - 1)) + 1
    if repeat > 1 and not spec.repeat:
        raise EncodingError(f"{where}{spec.key} does not take a repeat count (field holds {repeat - 1})")
    _names, fields = spec.layout(flags)
    used = _HEADER_MASK
    operands = {}
    for f in fields:
        raw = (value >> f.lsb) & ((1 << f.width) - 1)
        used |= ((1 << f.width) - 1) << f.lsb
        if f.signed and raw >> (f.width - 1):
            raw -= 1 << f.width
        if f.kind == "reg" and raw not in ISA_TABLE.register_by_index:
            raise EncodingError(f"{where}{spec.key}: no configuration register {raw}")
        if f.kind == "count" and raw == 0:
            raise EncodingError(f"{where}{spec.key}: {f.name} is 0 (must be at least 1)")
        operands[f.name] = raw
    if value & ~used:
        raise EncodingError(f"{where}{spec.key}: reserved bits are not zero")
    return Instruction(spec.key, flags, repeat, operands)

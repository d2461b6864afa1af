"""The instruction set, as read from spec/isa.toml (the single source of truth).

Everything that needs to know an opcode, a field position or a flag bit asks
this module; nothing else in the code base spells out encodings.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources

WORD_BYTES = 12


@dataclass(frozen=True)
class Field:
    name: str
    lsb: int
    width: int
    kind: str
    aliases: tuple[str, ...] = ()

    @property
    def signed(self) -> bool:
        return self.kind == "imm"

    @property
    def min(self) -> int:
        if self.signed:
            return -(1 << (self.width - 1))
        return 1 if self.kind == "count" else 0

    @property
    def max(self) -> int:
        return (1 << (self.width - (1 if self.signed else 0))) - 1


@dataclass(frozen=True)
class Flag:
    letter: str
    bit: int
    name: str
    doc: str
    wide: str = ""                # the operand this flag makes 16-bit (two UB rows a vector)


@dataclass(frozen=True)
class ForbiddenFlags:
    letters: str                  # given all together, these flags are no instruction
    why: str


@dataclass(frozen=True)
class InstructionSpec:
    key: str                      # canonical short mnemonic, e.g. "MMC"
    opcode: int
    names: tuple[str, ...]        # every accepted mnemonic, canonical first
    stage: str
    repeat: bool
    summary: str
    operands: tuple[str, ...]
    fields: tuple[Field, ...]
    flags: dict[str, Flag] = field(default_factory=dict)
    exclusive: tuple[tuple[str, ...], ...] = ()
    conv_operands: tuple[str, ...] = ()
    conv_fields: tuple[Field, ...] = ()
    timing: str = ""              # duration in short (spec/timing.md section 4)
    # pairs of UB operands (destination, source) that must be the same rows or disjoint
    same_or_disjoint: tuple[tuple[str, str], ...] = ()
    forbidden: tuple[ForbiddenFlags, ...] = ()

    @property
    def long_name(self) -> str:
        return self.names[1] if len(self.names) > 1 else self.key

    @property
    def flag_mask(self) -> int:
        return sum(f.bit for f in self.flags.values())

    def layout(self, flag_bits: int) -> tuple[tuple[str, ...], tuple[Field, ...]]:
        """Operand order and fields for the given flags (Convolve changes them)."""
        conv = self.flags.get("C")
        if conv is not None and flag_bits & conv.bit:
            return self.conv_operands, self.conv_fields
        return self.operands, self.fields

    def flag_letters(self, flag_bits: int) -> str:
        return "".join(f.letter for f in self.flags.values() if flag_bits & f.bit)

    def flag_bits(self, letters: str) -> int:
        return sum(self.flags[c].bit for c in letters)

    def rows_per_vector(self, flag_bits: int, operand: str) -> int:
        """UB rows one vector of `operand` takes: 2 when a given flag makes it 16-bit."""
        return 2 if any(f.wide == operand and flag_bits & f.bit
                        for f in self.flags.values()) else 1

    def flag_conflict(self, flag_bits: int) -> str | None:
        """Why these flags are no instruction (two of an exclusive group, or a forbidden
        set), or None: what the assembler rejects and a binary faults on."""
        for group in self.exclusive:
            given = [c for c in group if flag_bits & self.flags[c].bit]
            if len(given) > 1:
                return (f"flags {' and '.join(given)} cannot be combined ({self.key} takes "
                        f"at most one of {', '.join(group)})")
        for rule in self.forbidden:
            if all(flag_bits & self.flags[c].bit for c in rule.letters):
                return f"flags {rule.letters} cannot be combined: {rule.why}"
        return None


@dataclass(frozen=True)
class Register:
    name: str
    index: int
    reset: int
    min: int
    max: int
    doc: str


@dataclass(frozen=True)
class MachineDefaults:
    array_size: int
    ub_rows: int
    acc_rows: int
    fifo_depth: int


class ISA:
    """The parsed table with the look-ups every consumer needs."""

    def __init__(self, table: dict):
        self.table = table
        fmt = table["format"]
        assert fmt["word_bytes"] == WORD_BYTES and fmt["byte_order"] == "little"
        self.instructions: dict[str, InstructionSpec] = {}
        for key, t in table["instructions"].items():
            flags = {letter: Flag(letter, f["bit"], f["name"], f["doc"], f.get("wide", ""))
                     for letter, f in t.get("flags", {}).items()}
            self.instructions[key] = InstructionSpec(
                key=key, opcode=t["opcode"], names=tuple(t["names"]), stage=t["stage"],
                repeat=t["repeat"], summary=t["summary"], operands=tuple(t["operands"]),
                fields=_fields(t["fields"]), flags=flags,
                exclusive=tuple(tuple(g) for g in t.get("exclusive", ())),
                conv_operands=tuple(t.get("conv_operands", ())),
                conv_fields=_fields(t.get("conv_fields", ())), timing=t.get("timing", ""),
                same_or_disjoint=tuple(tuple(p) for p in t.get("same_or_disjoint", ())),
                forbidden=tuple(ForbiddenFlags(r["flags"], r["why"])
                                for r in t.get("forbidden", ())))
        self.registers: dict[str, Register] = {
            name: Register(name, r["index"], r["reset"], r["min"], r["max"], r["doc"])
            for name, r in table["registers"].items()}
        self.machine = MachineDefaults(**table["machine"])
        self.kinds: dict[str, str] = dict(table["kinds"])

    @cached_property
    def by_opcode(self) -> dict[int, InstructionSpec]:
        return {s.opcode: s for s in self.instructions.values()}

    @cached_property
    def by_name(self) -> dict[str, InstructionSpec]:
        """Every accepted mnemonic, upper-cased, to its instruction."""
        return {n.upper(): s for s in self.instructions.values() for n in s.names}

    @cached_property
    def register_by_index(self) -> dict[int, Register]:
        return {r.index: r for r in self.registers.values()}

    def kind_limit(self, kind: str) -> int:
        """One past the largest value an operand of `kind` can encode (for `ub`: the most
        Unified Buffer rows any program can address)."""
        return max(f.max for s in self.instructions.values()
                   for f in s.fields + s.conv_fields if f.kind == kind) + 1

    def lookup(self, mnemonic: str) -> InstructionSpec | None:
        return self.by_name.get(mnemonic.upper())


def _fields(rows) -> tuple[Field, ...]:
    return tuple(Field(r["name"], r["lsb"], r["width"], r["kind"], tuple(r.get("aliases", ())))
                 for r in rows)


def _load() -> ISA:
    text = resources.files("tpuasm").joinpath("isa.toml").read_text(encoding="utf-8")
    return ISA(tomllib.loads(text))


ISA_TABLE = _load()

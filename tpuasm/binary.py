"""The .tbin container: code, the machine configuration it targets, debug lines,
symbols and (optionally) the source text, so a bare binary can still be debugged
at source level.  Layout: spec/binary-format.md.  Every length and offset is
checked on load; anything wrong raises BinaryFormatError naming what and where.
"""
from __future__ import annotations

import bisect
import struct
import zlib
from dataclasses import dataclass, field, fields
from pathlib import Path

from .encoding import Instruction, decode, encode
from .errors import BinaryFormatError, EncodingError
from .isa import ISA_TABLE, WORD_BYTES
from .limits import BYTES_PER_INSTRUCTION, check_allocation
from .literals import parse_int

MAGIC = b"TBIN"
VERSION = 1
PROFILES = ("tpu", "opentpu")
_PREFIX = struct.Struct("<4sHHI")                  # magic, version, nsections, crc32
_CONFIG = struct.Struct("<IIIHH")                  # the machine shape (checksummed with the rest)
_HEADER = struct.Struct(_PREFIX.format + _CONFIG.format.lstrip("<"))
_SYMBOL = struct.Struct("<BqQ")                    # kind, value, size; then the name
_U32 = struct.Struct("<I")
_SECTION = struct.Struct("<4sII")                  # tag, offset, length
_LINE = struct.Struct("<III")                      # file index, line, column
NO_FILE = 0xFFFFFFFF
SYMBOL_KINDS = ("const", "ub", "acc", "host", "tile", "label", "node")


@dataclass(frozen=True)
class MachineShape:
    """The machine a program is assembled for (what `.config` chooses)."""
    array_size: int = ISA_TABLE.machine.array_size
    ub_rows: int = ISA_TABLE.machine.ub_rows
    acc_rows: int = ISA_TABLE.machine.acc_rows
    fifo_depth: int = ISA_TABLE.machine.fifo_depth
    profile: str = "tpu"

    def __post_init__(self):
        problems = self.problems({f.name: getattr(self, f.name) for f in fields(self)})
        if problems:
            raise ValueError("; ".join(problems.values()))

    @staticmethod
    def problems(values: dict) -> dict[str, str]:
        """What is wrong with each of some settings, by key (nothing: all are fine)."""
        out = {}
        for key, value in values.items():
            if key == "profile":
                if value not in PROFILES:
                    out[key] = f"unknown profile {value!r} (choose from {', '.join(PROFILES)})"
            elif key not in _LIMITS:
                out[key] = f"unknown setting {key!r}"
            elif not isinstance(value, int) or isinstance(value, bool):
                out[key] = f"{key}: not an integer: {value!r}"
            else:
                lo, hi = _LIMITS[key]
                if not lo <= value <= hi:
                    out[key] = f"{key} {value} out of range {lo}..{hi}"
        return out


MAX_ARRAY_SIZE = 4096
MAX_FIFO_DEPTH = 64
_LIMITS = {"array_size": (1, MAX_ARRAY_SIZE),
           "ub_rows": (1, ISA_TABLE.kind_limit("ub")),      # every row must be addressable
           "acc_rows": (1, ISA_TABLE.kind_limit("acc")),
           "fifo_depth": (1, MAX_FIFO_DEPTH)}

CONFIG_KEYS = tuple(f.name for f in fields(MachineShape))

# What bounds the rows of each memory a program addresses (the docs' wording); the
# host image and the weight tiles are known only at run time, so for them the
# operand field's width is the limit at assembly time.
MEMORY_BOUNDS = {"ub": "ub_rows", "acc": "acc_rows", "host": "host rows", "tile": "weight tiles"}


def memory_limits(shape: MachineShape) -> dict[str, int]:
    """Rows (tiles) of each memory a program for `shape` can address."""
    return {"ub": shape.ub_rows, "acc": shape.acc_rows,
            "host": ISA_TABLE.kind_limit("host"), "tile": ISA_TABLE.kind_limit("tile")}


def config_key(key: str) -> str | None:
    """The setting `key` names (case-insensitive), or None."""
    name = key.strip().lower()
    return name if name in CONFIG_KEYS else None


def parse_setting(key: str, text: str):
    """The value of one machine setting written as text (`--config KEY=VALUE`, a `config`
    override): integers in the assembler's syntax, the profile as a name.  ValueError
    says what is wrong; whether the value is in range is MachineShape's business."""
    name = config_key(key)
    if name is None:
        raise ValueError(f"unknown setting {key.strip()!r} (keys: {', '.join(CONFIG_KEYS)})")
    text = text.strip()
    if name == "profile":
        return text
    value = parse_int(text)
    if value is None:
        raise ValueError(f"{name}: not an integer: {text!r}")
    return value


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    col: int

    def __str__(self):
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: str          # one of SYMBOL_KINDS
    value: int
    size: int = 0      # rows reserved, for regions; instructions, for a node's run


@dataclass
class Program:
    """An assembled program: what the assembler produces and the machine loads."""
    instructions: list[Instruction]
    shape: MachineShape = field(default_factory=MachineShape)
    locations: list[SourceLoc | None] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    _lines: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _node_index: tuple = field(default=(), init=False, repr=False, compare=False)
    # the machine's decoded table of these instructions (tpuasm.machine.machine._decoded)
    _machine_table: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.locations:
            self.locations = [None] * len(self.instructions)
        if len(self.locations) != len(self.instructions):
            raise ValueError("one location per instruction")

    def __len__(self):
        return len(self.instructions)

    def __eq__(self, other):
        return isinstance(other, Program) and self.to_bytes() == other.to_bytes()

    def code(self) -> bytes:
        return b"".join(encode(i) for i in self.instructions)

    def source_line(self, loc: SourceLoc | None) -> str:
        """The text of `loc`'s source line, stripped; '' when the program does not carry it."""
        if loc is None:
            return ""
        text = self.sources.get(loc.file)
        if text is None:
            return ""
        cached = self._lines.get(loc.file)
        if cached is None or cached[0] is not text:      # sources may be replaced
            cached = self._lines[loc.file] = (text, text.splitlines())
        lines = cached[1]
        return lines[loc.line - 1].strip() if 1 <= loc.line <= len(lines) else ""

    def symbol(self, name: str, kind: str | None = None) -> Symbol | None:
        """Look a symbol up by name, optionally qualified by its kind: `host.y`, `ub.y`."""
        prefix, dot, rest = name.partition(".")
        if dot and prefix in SYMBOL_KINDS and kind is None:
            kind, name = prefix, rest
        return next((s for s in self.symbols
                     if s.name == name and (kind is None or s.kind == kind)), None)

    # -- graph nodes (`.node`: which node of a compiled model each instruction computes) --
    def node_runs(self, name: str | None = None) -> list[range]:
        """The instruction index ranges of graph node `name` (of every node when None), in
        program order."""
        return [range(s.value, s.value + s.size) for s in self._node_symbols()
                if name is None or s.name == name]

    def node_of(self, index: int) -> str | None:
        """The graph node instruction `index` belongs to, or None."""
        runs = self._node_symbols()
        starts = self._node_index[2]
        k = bisect.bisect_right(starts, index) - 1
        if k >= 0 and index < runs[k].value + runs[k].size:
            return runs[k].name
        return None

    def nodes(self) -> list[str]:
        """Every graph node named in the program, in order of first instruction."""
        return list(dict.fromkeys(s.name for s in self._node_symbols()))

    def _node_symbols(self) -> list[Symbol]:
        key = (id(self.symbols), len(self.symbols))
        if not self._node_index or self._node_index[0] != key:
            runs = sorted((s for s in self.symbols if s.kind == "node"), key=lambda s: s.value)
            self._node_index = (key, runs, [s.value for s in runs])
        return self._node_index[1]

    def to_bytes(self) -> bytes:
        files = list(dict.fromkeys([loc.file for loc in self.locations if loc] + list(self.sources)))
        index = {f: i for i, f in enumerate(files)}
        sections = [
            (b"CODE", self.code()),
            (b"FILE", _u32(len(files)) + b"".join(_str(f) + _str(self.sources.get(f, ""))
                                                 for f in files)),
            (b"LINE", b"".join(_LINE.pack(index[loc.file], loc.line, loc.col) if loc
                               else _LINE.pack(NO_FILE, 0, 0) for loc in self.locations)),
            (b"SYMB", _u32(len(self.symbols)) + b"".join(
                _SYMBOL.pack(SYMBOL_KINDS.index(s.kind), s.value, s.size) + _str(s.name)
                for s in self.symbols)),
        ]
        offset = _HEADER.size + _SECTION.size * len(sections)
        table, body = b"", b""
        for tag, data in sections:
            table += _SECTION.pack(tag, offset + len(body), len(data))
            body += data
        rest = table + body
        s = self.shape
        head = _CONFIG.pack(s.array_size, s.ub_rows, s.acc_rows, s.fifo_depth,
                            PROFILES.index(s.profile))
        crc = zlib.crc32(head + rest)
        return _PREFIX.pack(MAGIC, VERSION, len(sections), crc) + head + rest

    @classmethod
    def from_bytes(cls, data: bytes) -> "Program":
        return _Reader(bytes(data)).program()

    def stripped(self) -> "Program":
        """The same code and machine shape without debug lines, symbols or sources."""
        return Program(list(self.instructions), self.shape)

    def save(self, path) -> None:
        from .files import atomic_write
        atomic_write(path, self.to_bytes())


def load_binary(path) -> Program:
    """Read a .tbin file; BinaryFormatError (with the file name) if it is not a valid one."""
    from .files import read_input
    from .limits import MAX_BINARY_BYTES
    data = read_input(path, what="binary", limit=MAX_BINARY_BYTES, error=BinaryFormatError)
    try:
        return Program.from_bytes(data)
    except BinaryFormatError as e:
        raise BinaryFormatError(f"{path}: {e}") from None


def _u32(n: int) -> bytes:
    return _U32.pack(n)


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _u32(len(raw)) + raw


class _Reader:
    """Bounds-checked parsing of the container."""

    def __init__(self, data: bytes):
        self.data = data

    def fail(self, message: str):
        raise BinaryFormatError(message)

    def program(self) -> Program:
        d = self.data
        if len(d) < _HEADER.size:
            self.fail(f"too short for a .tbin header ({len(d)} bytes, need {_HEADER.size})")
        magic, version, nsections, crc, *shape = _HEADER.unpack_from(d)
        if magic != MAGIC:
            self.fail(f"not a .tbin file (magic {magic!r}, expected {MAGIC!r})")
        if version != VERSION:
            self.fail(f"unsupported .tbin version {version} (this tpuasm reads version {VERSION})")
        if zlib.crc32(d[_PREFIX.size:]) != crc:
            self.fail("checksum mismatch: the file is corrupt or truncated")
        array_size, ub_rows, acc_rows, fifo_depth, profile = shape
        if profile >= len(PROFILES):
            self.fail(f"unknown machine profile {profile}")
        try:
            machine = MachineShape(array_size, ub_rows, acc_rows, fifo_depth, PROFILES[profile])
        except ValueError as e:
            self.fail(f"bad machine configuration: {e}")
        sections = {}
        table_end = _HEADER.size + _SECTION.size * nsections
        if table_end > len(d):
            self.fail(f"section table ({nsections} entries) runs past the end of the file")
        for k in range(nsections):
            tag, off, length = _SECTION.unpack_from(d, _HEADER.size + _SECTION.size * k)
            if off < table_end or off + length > len(d):
                self.fail(f"section {tag!r} at offset {off} length {length} is outside the file")
            if tag in sections:  # unknown tags are skipped: later versions may add sections
                self.fail(f"section {tag!r} appears twice")
            sections[tag] = (off, off + length)
        for tag in (b"CODE", b"FILE", b"LINE", b"SYMB"):
            if tag not in sections:
                self.fail(f"missing section {tag.decode()}")
        instructions = self.code(*sections[b"CODE"])
        files = self.files(*sections[b"FILE"])
        locations = self.lines(*sections[b"LINE"], len(instructions), [f for f, _ in files])
        symbols = self.symbols(*sections[b"SYMB"])
        sources = {name: text for name, text in files if text}
        return Program(instructions, machine, locations, symbols, sources)

    def code(self, start, end):
        if (end - start) % WORD_BYTES:
            self.fail(f"code section is {end - start} bytes, not a multiple of {WORD_BYTES}")
        count = (end - start) // WORD_BYTES
        check_allocation(f"a code section of {count:,} instructions",
                         count * BYTES_PER_INSTRUCTION)
        out = []
        for i, pos in enumerate(range(start, end, WORD_BYTES)):
            try:
                out.append(decode(self.data[pos:pos + WORD_BYTES], index=i))
            except EncodingError as e:
                self.fail(str(e))
        return out

    def u32(self, pos, end):
        if pos + _U32.size > end:
            self.fail(f"truncated field at offset {pos}")
        return _U32.unpack_from(self.data, pos)[0], pos + _U32.size

    def string(self, pos, end):
        n, pos = self.u32(pos, end)
        if pos + n > end:
            self.fail(f"string of {n} bytes at offset {pos} runs past its section")
        try:
            return self.data[pos:pos + n].decode("utf-8"), pos + n
        except UnicodeDecodeError:
            self.fail(f"string at offset {pos} is not valid UTF-8")

    def files(self, pos, end):
        count, pos = self.u32(pos, end)
        out = []
        for _ in range(count):
            name, pos = self.string(pos, end)
            text, pos = self.string(pos, end)
            out.append((name, text))
        if pos != end:
            self.fail("trailing bytes in the FILE section")
        return out

    def lines(self, start, end, count, files):
        if end - start != count * _LINE.size:
            self.fail(f"line table has {(end - start) // _LINE.size} entries for {count} instructions")
        out = []
        for pos in range(start, end, _LINE.size):
            f, line, col = _LINE.unpack_from(self.data, pos)
            if f == NO_FILE:
                out.append(None)
            elif f >= len(files):
                self.fail(f"line table names file {f}, but there are {len(files)} files")
            else:
                out.append(SourceLoc(files[f], line, col))
        return out

    def symbols(self, pos, end):
        count, pos = self.u32(pos, end)
        out = []
        for _ in range(count):
            if pos + _SYMBOL.size > end:
                self.fail("truncated symbol table")
            kind, value, size = _SYMBOL.unpack_from(self.data, pos)
            if kind >= len(SYMBOL_KINDS):
                self.fail(f"unknown symbol kind {kind}")
            name, pos = self.string(pos + _SYMBOL.size, end)
            out.append(Symbol(name, SYMBOL_KINDS[kind], value, size))
        if pos != end:
            self.fail("trailing bytes in the SYMB section")
        return out

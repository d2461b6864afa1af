"""Programs from files: the one loader of a program file (a .tasm source, a .tbin binary or
an OpenTPU binary) for every face, the command line and the debugger alike.  The file is read
once, through tpuasm.files' bounded reader; its kind is decided by `--format`, else by
content, then extension (spec/opentpu.md)."""
from __future__ import annotations

from pathlib import Path

from .errors import TpuasmError


def read_program(path: Path) -> bytes:
    """The bytes of a program file (source or binary), read once: a regular file of at
    most limits.MAX_BINARY_BYTES (tpuasm.files.read_input)."""
    from .files import read_input
    from .limits import MAX_BINARY_BYTES
    return read_input(path, what="program", limit=MAX_BINARY_BYTES)


def is_opentpu(path: Path, data: bytes, fmt: str | None) -> bool:
    """An OpenTPU binary: --format opentpu, else by content and extension (spec/opentpu.md)."""
    if fmt is not None or path.suffix == ".tbin":
        return fmt == "opentpu"
    from .opentpu import EXTENSION, looks_like_opentpu
    return path.suffix == EXTENSION or looks_like_opentpu(data)


def named(path: Path, read, *args):
    """read(*args), with the file name in front of a BinaryFormatError's message."""
    from .errors import BinaryFormatError
    try:
        return read(*args)
    except BinaryFormatError as e:
        raise BinaryFormatError(f"{path}: {e}") from None


def program_format(path: Path, data: bytes, fmt: str | None) -> str:
    """"opentpu", "tbin" or "source": `fmt` if given, else by content, then extension
    (spec/opentpu.md).  A file starting with the .tbin magic is always a .tbin."""
    from .binary import MAGIC
    if data[:len(MAGIC)] == MAGIC or fmt == "tbin":
        return "tbin"
    if is_opentpu(path, data, fmt):
        return "opentpu"
    return "tbin" if path.suffix == ".tbin" else "source"


def load_program(path: Path, config: dict | None = None, fmt: str | None = None, *,
                 data: bytes | None = None):
    """A Program from a .tasm source, a .tbin binary or an OpenTPU binary (decided by
    `fmt`, else by content, then extension).  `data`: the file's bytes, if already read."""
    from .binary import MachineShape, Program
    if data is None:
        data = read_program(path)
    kind = program_format(path, data, fmt)
    if kind == "opentpu":
        from .opentpu import MATSIZES, from_opentpu_bytes
        try:   # the command line's shape_config has set N; the debugger's config may not
            shape = MachineShape(**{"profile": "opentpu", "array_size": MATSIZES[0], **(config or {})})
        except ValueError as e:
            raise TpuasmError(f"--config: {e}") from None
        return named(path, from_opentpu_bytes, data, shape)
    if kind == "tbin":
        program = named(path, Program.from_bytes, data)
        if config:
            from dataclasses import replace
            try:
                program.shape = replace(program.shape, **config)
            except ValueError as e:
                raise TpuasmError(f"--config: {e}") from None
        return program
    from .assembler import assemble, decode_source
    return assemble(decode_source(data, str(path)), str(path), config=config or None)

"""The assembler: .tasm source -> Program.

Passes (one module each): parse (parser.py, lark LALR) -> expand (expand.py:
include, macro, rept) -> resolve (symbols.py: .equ, regions, expressions) ->
check & encode (encoder.py, driven by spec/isa.toml).  Every diagnostic of
the run is collected and raised together as one AssemblyError.
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

from ..binary import (CONFIG_KEYS, PROFILES, MachineShape, Program, Symbol, config_key,
                      memory_limits, parse_setting)
from ..diagnostics import Diagnostic
from ..errors import AssemblyError
from ..limits import MAX_SOURCE_BYTES
from .encoder import Encoder
from .expand import ConfigEntry, Expander
from .listing import listing, symbol_map
from .reporter import Reporter, did_you_mean
from .symbols import MEMORIES, Symbols

__all__ = ["assemble", "assemble_file", "decode_source", "listing", "symbol_map"]

def assemble(source: str | os.PathLike, filename: str = "<input>", *,
             config: dict | None = None) -> Program:
    """Assemble source text (a str) or a file (a PathLike); AssemblyError lists every mistake.

    `config` holds `.config` settings from the command line; they win over the source's.
    """
    reporter = Reporter()
    sources: dict[str, str] = {}
    # The run allocates several objects per instruction and frees none of
    # them until the end: the cyclic collector only burns time here.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        if isinstance(source, os.PathLike):
            filename = os.fspath(source)
            text = decode_source(read_source(filename), filename)
        else:
            text = source
        program = _run(text, filename, config or {}, reporter, sources)
    except AssemblyError:
        raise
    except RecursionError:
        reporter.diagnostics.append(Diagnostic("input nested too deeply to assemble", filename, 1, 1))
        program = None
    except MemoryError:
        reporter.diagnostics.append(Diagnostic(
            "out of memory: the program is too large to assemble (spec/limits.md)", filename, 1, 1))
        program = None
    except Exception as e:          # never let a bug surface as a traceback to the user
        reporter.diagnostics.append(Diagnostic(
            f"internal error in the assembler: {type(e).__name__}: {e} (please report this)",
            filename, 1, 1))
        program = None
    finally:
        if gc_was_on:
            gc.enable()
    if reporter.diagnostics or program is None:
        raise AssemblyError(reporter.diagnostics, sources,
                            total=len(reporter.diagnostics) + reporter.dropped)
    return program


def read_source(path: str, span=None) -> bytes:
    """The bytes of a source file (the program or an include): a regular file of at most
    limits.MAX_SOURCE_BYTES; otherwise an AssemblyError at `span` (an include's file name)
    or at the top of `path`."""
    from ..errors import InputFileError
    from ..files import read_input
    try:
        return read_input(path, what="source file", limit=MAX_SOURCE_BYTES)
    except InputFileError as e:
        where = (span.file, span.line, span.col, span.end_col) if span else (path, 0, 0, None)
        raise AssemblyError([Diagnostic(str(e), *where)]) from None


def decode_source(data: bytes, filename: str) -> str:
    """The text of a source file's bytes as `assemble(path)` reads it: UTF-8 (a BOM
    allowed), universal newlines; AssemblyError if it is not UTF-8."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise AssemblyError([Diagnostic(f"cannot read '{filename}': not valid UTF-8",
                                        filename, 0, 0)]) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def assemble_file(path, *, config: dict | None = None) -> Program:
    return assemble(Path(path), config=config)


def _run(text: str, filename: str, config: dict, reporter: Reporter, sources: dict,
         state: dict | None = None) -> Program | None:
    """The passes; `state` (analysis.analyze) receives the expander, symbol table and shape."""
    symbols = Symbols(reporter)
    expander = Expander(reporter, symbols)
    expander.sources = sources
    if state is not None:
        state.update(expander=expander, symbols=symbols)
        expander.read_file = state.get("read_file")
    expander.run_text(text, filename)
    symbols.frozen = True
    shape = _shape(expander.config, config, symbols, reporter, filename)
    if state is not None:
        state["shape"] = shape
    symbols.limits = memory_limits(shape)
    for kind in MEMORIES:
        _layout(symbols, kind)
    encoder = Encoder(reporter, symbols, shape, symbols.limits)
    instructions, locations = encoder.encode_all(expander.items, expander.macros)
    table = _symbol_table(symbols) + _node_symbols(expander.node_marks, len(instructions))
    if reporter.diagnostics:
        return None
    return Program(instructions, shape, locations, table, dict(sources))


def _layout(symbols: Symbols, kind: str) -> None:
    from .symbols import EvalError
    try:
        symbols.layout(kind)
    except EvalError as e:
        if not e.reported:
            symbols.reporter.error(e.span, e.message, e.notes)


def _shape(entries: list[ConfigEntry], overrides: dict, symbols: Symbols, reporter: Reporter,
           filename: str) -> MachineShape:
    values: dict = {}
    where: dict = {}
    for e in entries:
        key = config_key(e.key)
        if key is None:
            reporter.error(e.span, f"unknown .config key '{e.key}'" + did_you_mean(e.key, CONFIG_KEYS)
                           + f" (keys: {', '.join(CONFIG_KEYS)})")
            continue
        if key == "profile":
            v = e.value.value if hasattr(e.value, "value") and isinstance(e.value.value, str) else \
                getattr(e.value, "text", None)
            if v not in PROFILES:
                reporter.error(e.value.span, f"unknown profile '{v}' (choose from {', '.join(PROFILES)})")
                continue
        else:
            v = symbols.try_eval(e.value, e.frame)
            if v is None:
                continue
        values[key] = v
        where[key] = e
    for given, v in overrides.items():
        key = config_key(given)
        if key is None:
            reporter.diagnostics.append(Diagnostic(
                f"unknown configuration key '{given}' (from the command line)"
                + did_you_mean(given, CONFIG_KEYS) + f" (keys: {', '.join(CONFIG_KEYS)})", filename, 0, 0))
            continue
        if isinstance(v, str):                  # `--config ub_rows=0x100` from a command line
            try:
                v = parse_setting(key, v)
            except ValueError as err:
                reporter.diagnostics.append(Diagnostic(
                    f"bad machine configuration: {err} (from the command line)", filename, 0, 0))
                continue
        values[key] = v
        where.pop(key, None)
    for key, problem in MachineShape.problems(values).items():   # each at its own place
        message = f"bad machine configuration: {problem}"
        e = where.get(key)
        if e is not None:
            reporter.error(e.value.span, message)
        else:
            reporter.diagnostics.append(Diagnostic(message + " (from the command line)", filename, 0, 0))
        del values[key]                 # keep going with what is valid
    return MachineShape(**values)


def _node_symbols(marks: list[tuple[int, str | None]], count: int) -> list[Symbol]:
    """One `node` symbol per run of consecutive instructions of one graph node: value = the
    first instruction's index, size = how many (a node may have several runs)."""
    table = []
    for (start, name), (stop, _) in zip(marks, marks[1:] + [(count, None)]):
        if name is not None and stop > start:
            if table and table[-1].name == name and table[-1].value + table[-1].size == start:
                table[-1] = Symbol(name, "node", table[-1].value, table[-1].size + stop - start)
            else:
                table.append(Symbol(name, "node", start, stop - start))
    return table


def _symbol_table(symbols: Symbols) -> list[Symbol]:
    table = []
    for c in symbols.consts.values():
        if c.state == "new":
            symbols.try_eval_const(c)
        if c.state == "done" and -(1 << 63) <= c.value < (1 << 63):   # the .tbin slot is int64
            table.append(Symbol(c.name, "const", c.value))
    for name, (_span, index) in symbols.labels.items():
        table.append(Symbol(name, "label", index))
    for kind in MEMORIES:
        for r in symbols.regions[kind].values():
            if r.base is not None and r.size is not None:
                table.append(Symbol(r.name, kind, r.base, r.size))
    return table

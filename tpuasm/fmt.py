"""`tpuasm fmt`: the one canonical layout of .tasm source.

    label:
    .equ   BATCH, 96                ; directives at the block's indentation
            MMC.SO  input, sums, BATCH, repeat=2    ; mnemonic column, operands
    .rept  9, t
                RW      tile.w1 + t ; a .rept or .macro body one level deeper
    .endr

Rules: directives start at the block's indentation (4 columns per open `.macro` or
`.rept`), instructions 8 columns further; a mnemonic or directive name is padded to its
column (8 and 7 characters); operands are separated by `, `, binary operators have a
space on each side, unary operators, `name=value` and parentheses none.  Trailing comments
of a paragraph (lines between blank lines) line up at one column (at least 32).  A
full-line comment keeps column 0 if it had it, else takes the instruction column.  Runs of
blank lines become one; none at the start or end (in a file the assembler reports errors
in, every line stays where it is, so no error moves: spec/limits.md).

Only whitespace between tokens changes, and only on lines the assembler's parser reads
without a syntax error (a line with one is kept exactly as it is), so the
assembled program is the same: tests/test_fmt.py assembles every program of the library
and random programs before and after and compares the code byte for byte.  Comments,
literals, names and their case are kept exactly as written.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from .command import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .errors import InputFileError, OutputFileError
from .files import atomic_write, read_input, read_stream
from .limits import MAX_SOURCE_BYTES
from .tokens import WORDS, line_tokens

INSTRUCTION_INDENT = 8
BLOCK_INDENT = 4
MNEMONIC_WIDTH = 8
DIRECTIVE_WIDTH = 7
COMMENT_COLUMN = 32          # the least column of an aligned trailing comment
LINE_LIMIT = 100_000        # longer lines are kept as they are
COMMENT_REACH = 72           # code longer than this does not push a paragraph's comments

_OPENERS = ("macro", "rept")
_CLOSERS = ("endm", "endr")


def format_source(text: str, path: str | None = None) -> str:
    """`text` in the canonical layout (idempotent: formatting the result changes nothing).

    `path`: the file's name (`tpuasm fmt FILE`): then every line the assembler reports an
    error at (its `.include`s resolved beside it) is kept as written, so the error's line
    and column, which a negative test's manifest pins, stay where they were."""
    from .assembler.parser import parse
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    # overlong lines are kept as written and left out of the parse (the parser's time
    # grows faster than linearly on some of them)
    long_lines = {i + 1 for i, line in enumerate(lines) if len(line) > LINE_LIMIT}
    if long_lines:
        text = "\n".join("" if i + 1 in long_lines else line for i, line in enumerate(lines))
    _, diags = parse(text, "<fmt>")
    errors = {d.line for d in diags}
    if path is not None:     # a file (`tpuasm fmt`), not a snippet: with syntax errors too,
        errors |= _error_lines(text, path)       # as `tpuasm asm` reports the others then
    broken = errors | long_lines
    level = 0
    rows: list[tuple[str, str | None] | None] = []      # (code, trailing comment) or None = blank
    if lines and lines[-1] == "":
        lines.pop()                  # what follows the last line break is not a line
    for number, line in enumerate(lines, 1):
        if not line.strip(" \t\f"):
            rows.append(None)
            continue
        tokens = None if number in broken else [t[:2] for t in line_tokens(line) or ()] or None
        if tokens is None:      # kept as written (an error at its end stays in its column)
            rows.append((line if number in errors else line.rstrip(), None))
            continue
        comment = tokens.pop()[1] if tokens and tokens[-1][0] == "comment" else None
        if not tokens:
            indent = 0 if line[0] in ";#" else INSTRUCTION_INDENT + BLOCK_INDENT * level
            rows.append((" " * indent + comment, None))
            continue
        code, level = _statement(tokens, level)
        rows.append((code, comment))
    # a file with errors keeps its blank lines: folding them would move the errors' lines
    return _assemble_rows(rows, keep_lines=bool(errors))


def _error_lines(text: str, path: str | None) -> set[int]:
    """The lines of this file the assembler reports an error at (an undefined symbol, an
    overlap, a value out of range: errors the parser alone does not see)."""
    from .assembler.analysis import analyze
    name = path
    try:
        analysis = analyze(text, name, lint=False)
    except Exception:        # analyze guards itself; formatting never depends on it
        return set()
    return {d.line for d in analysis.diagnostics
            if d.severity == "error" and d.file == name}


def _statement(tokens, level: int) -> tuple[str, int]:
    """The canonical text of one line's label and statement, and the block level after it."""
    label = ""
    if len(tokens) >= 2 and tokens[0][0] == "name" and tokens[1] == ("punct", ":"):
        label = tokens[0][1] + ":"
        tokens = tokens[2:]
    if not tokens:
        return " " * (BLOCK_INDENT * level) + label, level
    kind, head = tokens[0]
    args = _args(tokens[1:])
    if kind == "directive":
        word = head[1:].lower()
        if word in _CLOSERS:
            level = max(0, level - 1)
        indent, width = BLOCK_INDENT * level, DIRECTIVE_WIDTH
        after = level + 1 if word in _OPENERS else level
    else:
        indent, width = INSTRUCTION_INDENT + BLOCK_INDENT * level, MNEMONIC_WIDTH
        after = level
    body = head.ljust(width - 1) + " " + args if args else head
    if label:
        lead = BLOCK_INDENT * level + len(label)
        return " " * (BLOCK_INDENT * level) + label + " " * max(1, indent - lead) + body, after
    return " " * indent + body, after


def _args(tokens) -> str:
    out: list[str] = []
    prev = None
    for kind, text in tokens:
        if kind == "punct" and text == ",":
            out.append(", ")
        elif kind == "punct" and text in "=()":
            out.append(text)
        elif kind == "punct":                      # ':' here: a syntax error, kept apart
            out.append(" " + text)
        elif kind == "op":
            unary = prev is None or prev[0] == "op" or prev[1] in (",", "=", "(")
            out.append(text if unary else f" {text} ")
        else:
            if prev is not None and (prev[0] in WORDS or prev[1] == ")"):
                out.append(" ")
            out.append(text)
        prev = (kind, text)
    return "".join(out)


def _assemble_rows(rows, keep_lines: bool = False) -> str:
    """Lines from (code, comment) rows: blank runs folded (unless `keep_lines`: every line
    stays where it was), each paragraph's comments aligned."""
    lines: list[str] = []
    paragraph: list[tuple[str, str | None]] = []

    def flush():
        if not paragraph:
            return
        reach = [len(c) + 2 for c, k in paragraph if k is not None and len(c) <= COMMENT_REACH]
        column = max([COMMENT_COLUMN] + reach)
        for code, comment in paragraph:
            if comment is None:
                lines.append(code)
            else:
                lines.append(code + " " * max(2, column - len(code)) + comment)
        paragraph.clear()

    for row in rows:
        if row is None:
            flush()
            if keep_lines or (lines and lines[-1] != ""):
                lines.append("")
            continue
        paragraph.append(row)
    flush()
    while lines and lines[-1] == "" and not keep_lines:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


# ------------------------------------------------------------------ the file's conventions
BOM = "\ufeff"


def line_ending(data: bytes) -> str:
    """The file's line ending: that of its first line break ("\r\n", "\r" or "\n"); a
    file without one gets "\n"."""
    for i, byte in enumerate(data):
        if byte == 0x0A:
            return "\n"
        if byte == 0x0D:
            return "\r\n" if data[i + 1:i + 2] == b"\n" else "\r"
    return "\n"


def in_file_convention(text: str, data: bytes) -> str:
    """Formatted `text` (lines ending in "\n") with the line ending and the byte-order mark
    of the file it came from (`data`): fmt changes layout, not the file's conventions.  A
    file mixing line endings gets its first one throughout."""
    ending = line_ending(data)
    if ending != "\n":
        text = text.replace("\n", ending)
    return BOM + text if data.startswith(b"\xef\xbb\xbf") else text


# ------------------------------------------------------------------ the command
def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tpuasm fmt", description=(
        "Rewrite .tasm files in the canonical layout (in place).  --check: exit 1 when a "
        "file would change; --diff: print how.  Exit 2 on a file that cannot be read."))
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="'-' reads stdin, writes stdout")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    p.add_argument("--diff", action="store_true", help="change nothing; print a unified diff")
    args = p.parse_args(argv)
    status = EXIT_OK
    for path in args.files:
        try:       # regular files of bounded size only: a FIFO or /dev/zero is refused
            if str(path) == "-":
                data = read_stream(sys.stdin.buffer, limit=MAX_SOURCE_BYTES)
            else:
                data = read_input(path, what="source file", limit=MAX_SOURCE_BYTES)
        except InputFileError as e:
            print(f"tpuasm fmt: {e}", file=sys.stderr)
            status = EXIT_USAGE
            continue
        try:
            before = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            print(f"tpuasm fmt: {path}: not valid UTF-8", file=sys.stderr)
            status = EXIT_USAGE
            continue
        after = format_source(before, None if str(path) == "-" else str(path))
        written = in_file_convention(after, data)
        if str(path) == "-" and not (args.check or args.diff):
            sys.stdout.write(written)
            continue
        if written.encode("utf-8") == data:
            continue
        if args.diff:
            plain = before.replace("\r\n", "\n").replace("\r", "\n")   # endings kept anyway
            sys.stdout.writelines(difflib.unified_diff(
                plain.splitlines(keepends=True), after.splitlines(keepends=True),
                f"{path}", f"{path} (formatted)"))
        if args.check or args.diff:
            if args.check:
                print(f"would reformat {path}", file=sys.stderr)
            status = max(status, EXIT_FAILED)
            continue
        try:
            atomic_write(path, written)     # a crash leaves the old file or the new one
        except OutputFileError as e:
            print(f"tpuasm fmt: {e}", file=sys.stderr)
            status = EXIT_USAGE
    return status


if __name__ == "__main__":
    from .command import exit_with
    exit_with(main)

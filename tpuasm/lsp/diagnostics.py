"""An analysis's diagnostics as LSP diagnostics of the file that was checked.

A mistake inside an included file or a macro body is reported where it is (with the
assembler's text) and also at its use site in the checked file - the `.include` line or
the macro call - with the other place as related information, so the editor shows it in
the file being edited and links to the definition.  The use sites come from the notes the
assembler attaches ("included from f:3", "in macro 'M' called at f:7:5").
"""
from __future__ import annotations

import re

from lsprotocol import types as T
from pygls.uris import from_fs_path

from ..assembler.expand import _display, _file_key as _key
from ..diagnostics import Diagnostic
from .positions import Lines

SOURCE = "tpuasm"
_PLACE = re.compile(r"(?:included from|called at|\() ?(?P<file>[^\s():]+|<[^>]+>):(?P<line>\d+)(?::(?P<col>\d+))?")
_SEVERITY = {"error": T.DiagnosticSeverity.Error, "warning": T.DiagnosticSeverity.Warning}


def uri_of(file: str) -> str:
    return from_fs_path(file) or file if not file.startswith("<") else file


def note_places(d: Diagnostic) -> list[tuple[str, str, int, int | None]]:
    """(note, file, line, col) of each note that names a place, innermost first."""
    out = []
    for note in d.notes:
        m = _PLACE.search(note)
        if m:
            out.append((note, m.group("file"), int(m.group("line")),
                        int(m.group("col")) if m.group("col") else None))
    return out


def to_lsp(diagnostics: list[Diagnostic], root: str, lines: Lines) -> list[T.Diagnostic]:
    """The diagnostics to show in `root`, the file that was checked."""
    out = []
    root_key = _key(root)
    for d in diagnostics:
        here = _key(d.file) == root_key
        places = note_places(d)
        related = [T.DiagnosticRelatedInformation(
            location=T.Location(uri=uri_of(f), range=_place_range(lines, f, line, col)),
            message=note) for note, f, line, col in places]
        severity = _SEVERITY.get(d.severity, T.DiagnosticSeverity.Error)
        message = d.message
        if here:
            out.append(T.Diagnostic(range=_range(lines, d), message=message, severity=severity,
                                    source=SOURCE, related_information=related or None))
        # the outermost place in this file that led to it: a use site
        use = next(((note, f, line, col) for note, f, line, col in reversed(places)
                    if _key(f) == root_key and not (here and line == d.line)), None)
        if use is None:
            continue
        note, f, line, col = use
        where = f"{_display(d.file)}:{d.line}:{d.col}" if d.line else _display(d.file)
        definition = T.DiagnosticRelatedInformation(
            location=T.Location(uri=uri_of(d.file), range=_range(lines, d)),
            message=f"{d.severity}: {message}")
        out.append(T.Diagnostic(range=_place_range(lines, f, line, col),
                                message=f"{message} (at {where}; {note})", severity=severity,
                                source=SOURCE, related_information=[definition]))
    return out


def _range(lines: Lines, d: Diagnostic) -> T.Range:
    if d.line <= 0:                      # about the whole file (cannot read it, ...)
        return T.Range(start=T.Position(line=0, character=0), end=T.Position(line=0, character=0))
    return lines.range(d.file, d.line, d.col, d.end_col)


def _place_range(lines: Lines, file: str, line: int, col: int | None) -> T.Range:
    if col is None:
        return lines.line_range(file, line)
    text = lines.of(file)[line - 1] if 1 <= line <= len(lines.of(file)) else ""
    m = re.match(r"[A-Za-z0-9_.]*", text[col - 1:])
    return lines.range(file, line, col, col + max(1, len(m.group()) if m else 1))

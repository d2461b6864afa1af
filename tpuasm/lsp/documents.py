"""The server's model of the open files: each one checked by the assembler (through
`analyze`, reading included files from the editor's unsaved buffers first), the result
kept until the file or a file it includes changes."""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types as T
from pygls.uris import from_fs_path, to_fs_path

from ..assembler.analysis import Analysis, analyze
from ..diagnostics import Diagnostic
from .diagnostics import to_lsp
from .positions import Lines, column_at
from .stats import RunStats, find_stats


@dataclass
class Checked:
    """One check of one open file."""
    uri: str
    path: str                    # the file name the assembler saw
    text: str
    version: int | None
    analysis: Analysis
    lines: Lines
    stats: RunStats | None = None
    skipped: bool = False        # lines left out of the check (LINE_LIMIT): no inlay hints
    _diagnostics: list | None = field(default=None, repr=False)

    def diagnostics(self) -> list[T.Diagnostic]:
        if self._diagnostics is None:
            self._diagnostics = to_lsp(self.analysis.diagnostics, self.path, self.lines)
        return self._diagnostics

    def text_lines(self) -> list[str]:
        return self.lines.of(self.path)

    def name_of(self, path: str) -> str | None:
        """The name this check read the file `path` under (an include's path as the
        assembler resolved it), or None if it did not read it."""
        key = os.path.abspath(path)
        return next((f for f in self.analysis.sources
                     if not f.startswith("<") and os.path.abspath(f) == key), None)

    def where(self, position: T.Position) -> tuple[int, int]:
        """1-based (line, col) in characters of an LSP position in this file."""
        return column_at(self.text_lines(), position, self.lines.codec)


# The assembler's time grows faster than linearly on some pathological lines (a 2 MB
# expression takes minutes); a language server must answer while the user types, so it
# leaves such lines out of its checks and says so.
LINE_LIMIT = 100_000


def without_long_lines(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` with each line longer than LINE_LIMIT emptied, and those (line, length)."""
    if len(text) <= LINE_LIMIT:
        return text, []
    lines = text.split("\n")
    skipped = [(i + 1, len(t)) for i, t in enumerate(lines) if len(t) > LINE_LIMIT]
    for line, _ in skipped:
        lines[line - 1] = ""
    return "\n".join(lines), skipped


class Documents:
    def __init__(self, server):
        self.server = server
        self.checked: dict[str, Checked] = {}

    def current(self, uri: str) -> Checked | None:
        """The check of the file as it is now (re-checked if it changed since)."""
        doc = self.server.workspace.text_documents.get(uri)
        if doc is None:
            return None
        done = self.checked.get(uri)
        if done is not None and done.version == doc.version and done.text == doc.source:
            return done
        return self.check(uri)

    def check(self, uri: str) -> Checked | None:
        doc = self.server.workspace.text_documents.get(uri)
        if doc is None:
            return None
        text = doc.source
        path = to_fs_path(uri) or uri
        checkable, skipped = without_long_lines(text)
        try:
            analysis = analyze(checkable, path, read_file=self.read_file)
        except Exception as e:           # analyze guards itself; this is the last resort
            analysis = Analysis(path, None, [Diagnostic(
                f"internal error in the language server: {type(e).__name__}: {e}", path, 1, 1)],
                {path: text})
        analysis.sources[path] = text
        for line, length in skipped:
            analysis.diagnostics.append(Diagnostic(
                f"line {line} is {length:,} characters long; the language server checks lines of up "
                f"to {LINE_LIMIT:,} (`tpuasm asm` checks it all)", path, line, 1, 2, severity="warning"))
        if skipped:
            analysis.program = None      # instructions are missing: no per-instruction hints
        checked = Checked(uri, path, text, doc.version, analysis,
                          Lines(analysis.sources, self.server.workspace.position_codec),
                          skipped=bool(skipped))
        if analysis.program is not None:
            checked.stats = find_stats(path, len(analysis.program))
        self.checked[uri] = checked
        return checked

    def read_file(self, path: str) -> str:
        """An included file: the editor's buffer if it is open, else the disk."""
        uri = from_fs_path(path)
        doc = self.server.workspace.text_documents.get(uri) if uri else None
        if doc is not None:
            return doc.source
        from ..errors import InputFileError
        from ..files import read_text
        from ..limits import MAX_SOURCE_BYTES
        try:       # a FIFO or /dev/zero as an include must not hang or fill the server
            text = read_text(path, what="included file", limit=MAX_SOURCE_BYTES)
        except InputFileError as e:      # the assembler reports an OSError at the .include
            reason = str(e).removeprefix(f"{path}: ")
            raise OSError(errno.EINVAL, reason) from None
        return text.replace("\r\n", "\n").replace("\r", "\n")

    def dependents(self, uri: str) -> list[str]:
        """The other open files whose last check read `uri`."""
        path = to_fs_path(uri)
        if path is None:
            return []
        key = os.path.abspath(path)
        return [u for u, c in self.checked.items()
                if u != uri and any(not f.startswith("<") and os.path.abspath(f) == key
                                    for f in c.analysis.sources)]

    def includers(self, uri: str) -> list[Checked]:
        """The checks of the other open files that include `uri`, each re-checked first if
        it read another text of `uri` than the editor's (a change not yet re-published)."""
        doc = self.server.workspace.text_documents.get(uri)
        path = to_fs_path(uri)
        out = []
        for other in self.dependents(uri):
            checked = self.current(other)
            if checked is None or path is None:
                continue
            name = checked.name_of(path)
            if doc is not None and name is not None and checked.analysis.sources.get(name) != doc.source:
                checked = self.check(other)
            if checked is not None and checked.name_of(path) is not None:
                out.append(checked)
        return out

    def forget(self, uri: str) -> None:
        self.checked.pop(uri, None)

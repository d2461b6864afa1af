"""Assembler positions (1-based line, 1-based column in characters) to LSP ranges
(0-based, in the client's position encoding, UTF-16 unless it asked for another)."""
from __future__ import annotations

from lsprotocol import types as T
from pygls.workspace.position_codec import PositionCodec

from ..assembler.ast import Span


class Lines:
    """The lines of every file a check read, split once, for position conversions."""

    def __init__(self, sources: dict[str, str], codec: PositionCodec):
        self.sources = sources
        self.codec = codec
        self._lines: dict[str, list[str]] = {}

    def of(self, file: str) -> list[str]:
        lines = self._lines.get(file)
        if lines is None:
            lines = self._lines[file] = self.sources.get(file, "").split("\n")
        return lines

    def position(self, file: str, line: int, col: int) -> T.Position:
        """The LSP position of 1-based (line, col); col 0 means the line's start."""
        lines = self.of(file)
        row = max(line - 1, 0)
        if row >= len(lines):
            return T.Position(line=row, character=0)
        text = lines[row]
        char = min(max(col - 1, 0), len(text))
        prefix = text[:char]
        # ASCII counts the same in UTF-8, UTF-16 and UTF-32 (and the codec counts per char)
        units = char if prefix.isascii() else self.codec.client_num_units(prefix)
        return T.Position(line=row, character=units)

    def range(self, file: str, line: int, col: int, end_col: int | None) -> T.Range:
        start = self.position(file, line, col)
        end = self.position(file, line, end_col if end_col and end_col > col else col + 1)
        return T.Range(start=start, end=end)

    def span(self, span: Span) -> T.Range:
        end_col = span.end_col if span.end_line == span.line else None
        return self.range(span.file, span.line, span.col, end_col)

    def line_range(self, file: str, line: int) -> T.Range:
        """The non-blank text of a whole line."""
        lines = self.of(file)
        text = lines[line - 1] if 1 <= line <= len(lines) else ""
        start = len(text) - len(text.lstrip())
        return self.range(file, line, start + 1, len(text.rstrip()) + 1)


def column_at(lines: list[str], position: T.Position, codec: PositionCodec) -> tuple[int, int]:
    """1-based (line, col) in characters of an LSP position."""
    server = codec.position_from_client_units(lines, T.Position(line=position.line,
                                                                character=position.character))
    return server.line + 1, server.character + 1

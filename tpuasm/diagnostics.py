"""Compiler-style diagnostics: `file:line:col: error: message`, the source line and
a caret underline, plus notes (customasm / clang style).

Rendering is linear in the output: each source is split into lines once for all of its
diagnostics (not once per diagnostic), at most limits.MAX_DIAGNOSTICS are shown (the rest
are counted), a long source line is shown as a window of limits.MAX_EXCERPT_CHARS columns
around the caret and a long message is shortened, so a 2 MB line or 200,000 bad lines
give a short report quickly.
"""
from __future__ import annotations

from dataclasses import dataclass

from .limits import MAX_DIAGNOSTICS, MAX_EXCERPT_CHARS, MAX_MESSAGE_CHARS


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text`, or its start and end around an ellipsis when longer than `limit`."""
    if len(text) <= limit:
        return text
    keep = max(limit - 5, 2)
    return f"{text[:keep - keep // 4]} ... {text[len(text) - keep // 4:]}"


@dataclass(frozen=True)
class Diagnostic:
    message: str
    file: str
    line: int                 # 1-based
    col: int                  # 1-based
    end_col: int | None = None    # exclusive, same line; None = one caret
    severity: str = "error"
    notes: tuple[str, ...] = ()

    def sort_key(self):
        return (self.file, self.line, self.col)

    def render(self, sources: dict[str, str] | None = None, color: bool = False,
               _lines: dict | None = None) -> str:
        red, blue, bold, reset = ("\x1b[31m", "\x1b[34m", "\x1b[1m", "\x1b[0m") if color else ("",) * 4
        head = (f"{bold}{self.file}:{self.line}:{self.col}: {red}{self.severity}:{reset}{bold} "
                f"{shorten(self.message)}{reset}")
        out = [head]
        lines = _source_lines(self.file, sources, _lines)
        if 1 <= self.line <= len(lines):
            src, col, width = _excerpt(lines[self.line - 1], self.col, self.end_col)
            gutter = f"{self.line:>5} | "
            out.append(f"{gutter}{src}")
            out.append(" " * (len(gutter) - 2) + "| " + " " * (col - 1) + red + "^" * width + reset)
        for note in self.notes[:20]:
            out.append(f"      = {blue}note:{reset} {shorten(note)}")
        if len(self.notes) > 20:
            out.append(f"      = {blue}note:{reset} ... {len(self.notes) - 20} more notes")
        return "\n".join(out)


def _source_lines(file: str, sources, cache: dict | None) -> list[str]:
    """The lines of one source, split once per render_all call."""
    if cache is not None and file in cache:
        return cache[file]
    text = (sources or {}).get(file)
    lines = text.splitlines() if text is not None else []
    if cache is not None:
        cache[file] = lines
    return lines


def _excerpt(line: str, col: int, end_col: int | None) -> tuple[str, int, int]:
    """(text shown, caret column in it, caret width): a window of at most
    MAX_EXCERPT_CHARS columns around the caret, `...` marking what is cut."""
    width = max(1, (end_col or col + 1) - col)
    if len(line) <= MAX_EXCERPT_CHARS:
        src = line.expandtabs(1)
        return src, col, min(width, max(1, len(src) - col + 1))
    half = MAX_EXCERPT_CHARS // 2
    start = max(0, min(col - 1 - half // 2, len(line) - MAX_EXCERPT_CHARS))
    window = line[start:start + MAX_EXCERPT_CHARS].expandtabs(1)
    prefix = "..." if start > 0 else ""
    suffix = "..." if start + MAX_EXCERPT_CHARS < len(line) else ""
    caret_col = col - start + len(prefix)
    width = min(width, max(1, len(window) - (col - start) + 1))
    return prefix + window + suffix, caret_col, width


def render_all(diagnostics, sources=None, color: bool = False, total: int | None = None) -> str:
    """Every diagnostic (the first MAX_DIAGNOSTICS by position), then the error count.
    `total`: how many errors there were in all, when some were not kept."""
    diags = sorted(diagnostics, key=Diagnostic.sort_key)
    shown = diags[:MAX_DIAGNOSTICS]
    cache: dict = {}
    body = "\n\n".join(d.render(sources, color, cache) for d in shown)
    errors = sum(d.severity == "error" for d in diags)
    total = max(total or 0, errors)
    hidden = total - sum(d.severity == "error" for d in shown)
    if hidden > 0:
        body += f"\n\n... and {hidden:,} more error{'s' if hidden != 1 else ''} not shown"
    if total > 1:
        body += f"\n\n{total:,} errors"
    return body

"""Compiler-style diagnostics: `file:line:col: error: message`, the source line and
a caret underline, plus notes (customasm / clang style)."""
from __future__ import annotations

from dataclasses import dataclass


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

    def render(self, sources: dict[str, str] | None = None, color: bool = False) -> str:
        red, blue, bold, reset = ("\x1b[31m", "\x1b[34m", "\x1b[1m", "\x1b[0m") if color else ("",) * 4
        head = f"{bold}{self.file}:{self.line}:{self.col}: {red}{self.severity}:{reset}{bold} {self.message}{reset}"
        out = [head]
        text = (sources or {}).get(self.file)
        lines = text.splitlines() if text is not None else []
        if 1 <= self.line <= len(lines):
            src = lines[self.line - 1].expandtabs(1)
            width = max(1, (self.end_col or self.col + 1) - self.col)
            width = min(width, max(1, len(src) - self.col + 1))
            gutter = f"{self.line:>5} | "
            out.append(f"{gutter}{src}")
            out.append(" " * (len(gutter) - 2) + "| " + " " * (self.col - 1) + red + "^" * width + reset)
        for note in self.notes:
            out.append(f"      = {blue}note:{reset} {note}")
        return "\n".join(out)


def render_all(diagnostics, sources=None, color: bool = False) -> str:
    diags = sorted(diagnostics, key=Diagnostic.sort_key)
    body = "\n\n".join(d.render(sources, color) for d in diags)
    errors = sum(d.severity == "error" for d in diags)
    if errors > 1:
        body += f"\n\n{errors} errors"
    return body

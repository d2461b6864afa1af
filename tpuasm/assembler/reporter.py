"""Collects every diagnostic of a run (customasm style: report all, stop at the end)."""
from __future__ import annotations

import difflib

from ..diagnostics import Diagnostic
from .ast import Span


class Reporter:
    def __init__(self):
        self.diagnostics: list[Diagnostic] = []
        self._seen: set = set()

    def error(self, span: Span, message: str, notes=()) -> None:
        # A mistake inside a .rept body or a macro is met once per expansion;
        # say it once (with the first expansion's notes).
        key = (span.file, span.line, span.col, message)
        if key in self._seen:
            return
        self._seen.add(key)
        end = span.end_col if span.end_line == span.line and span.end_col > span.col else None
        self.diagnostics.append(Diagnostic(message, span.file, span.line, span.col, end,
                                           notes=tuple(notes)))

    def add(self, diag: Diagnostic) -> None:
        key = (diag.file, diag.line, diag.col, diag.message)
        if key not in self._seen:
            self._seen.add(key)
            self.diagnostics.append(diag)


def did_you_mean(word: str, candidates) -> str:
    """`; did you mean 'X'?` for the closest candidate, or ''."""
    pool = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(word.lower(), list(pool), n=1, cutoff=0.6)
    return f"; did you mean '{pool[match[0]]}'?" if match else ""

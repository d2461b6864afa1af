"""Collects every diagnostic of a run (customasm style: report all, stop at the end)."""
from __future__ import annotations

import difflib

from ..diagnostics import Diagnostic
from ..limits import MAX_DIAGNOSTICS
from .ast import Span


# Diagnostics kept; the rest are only counted (`dropped`), so a file of 200,000 bad
# lines costs memory and time for the first KEEP only.
KEEP = 10 * MAX_DIAGNOSTICS


class Reporter:
    def __init__(self):
        self.diagnostics: list[Diagnostic] = []
        self._seen: set = set()
        self.dropped = 0

    @property
    def full(self) -> bool:
        return len(self.diagnostics) >= KEEP

    def error(self, span: Span, message: str, notes=()) -> None:
        # A mistake inside a .rept body or a macro is met once per expansion;
        # say it once (with the first expansion's notes).
        key = (span.file, span.line, span.col, message)
        if key in self._seen:
            return
        if self.full:
            self.dropped += 1
            return
        self._seen.add(key)
        end = span.end_col if span.end_line == span.line and span.end_col > span.col else None
        self.diagnostics.append(Diagnostic(message, span.file, span.line, span.col, end,
                                           notes=tuple(notes)))

    def add(self, diag: Diagnostic) -> None:
        key = (diag.file, diag.line, diag.col, diag.message)
        if key not in self._seen and self.full:
            self.dropped += 1
        elif key not in self._seen:
            self._seen.add(key)
            self.diagnostics.append(diag)


def did_you_mean(word: str, candidates) -> str:
    """`; did you mean 'X'?` for the closest candidate, or ''."""
    if len(word) > 64:               # no name is that long; difflib is quadratic in it
        return ""
    pool = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(word.lower(), list(pool), n=1, cutoff=0.6)
    return f"; did you mean '{pool[match[0]]}'?" if match else ""

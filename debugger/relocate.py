"""Where an edited file's lines went: breakpoints follow their line across a `reload`."""
from __future__ import annotations

from difflib import SequenceMatcher


def line_map(old: str, new: str) -> dict[int, int]:
    """1-based old line -> 1-based new line, for every line whose text survived unchanged in
    a block of unchanged lines (difflib's matching blocks); edited or deleted lines are
    absent: a breakpoint on them no longer fits."""
    a, b = old.splitlines(), new.splitlines()
    out: dict[int, int] = {}
    for block in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            out[block.a + k + 1] = block.b + k + 1
    return out

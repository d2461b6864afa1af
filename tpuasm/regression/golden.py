"""--update-golden: rewrite the `[golden]` table of a manifest, and nothing else.

Python has no TOML writer in the standard library, and a manifest's comments matter,
so the file is edited as text: the `[golden]` table (its header down to the next
table header) is replaced by a freshly rendered one, or appended when missing.
Expected data never lives in this table, so this can never overwrite an oracle.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from ..files import atomic_write
from . import toml
from .manifest import DEFAULT_GOLDEN_TOLERANCE, load_manifest, parse_manifest

_TABLE_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def render_golden(cycles: int, counters: dict[str, int], tolerance: float) -> str:
    lines = ["[golden]",
             "# Recorded by `tpuasm test --update-golden`: the measured cycle count and",
             "# counters.  A later run fails if it moves by more than `tolerance` (relative).",
             f"cycles = {cycles}",
             f"tolerance = {tolerance}"]
    if counters:
        lines.append("")
        lines.append(toml.table("golden.counters", counters).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _is_golden(header: str) -> bool:
    return header == "golden" or header.startswith("golden.")


def replace_golden(text: str, block: str) -> str:
    """`text` with its [golden] / [golden.*] tables replaced by `block`."""
    lines = text.splitlines(keepends=True)
    kept, in_golden, insert_at = [], False, None
    for line in lines:
        m = _TABLE_HEADER.match(line)
        if m:
            in_golden = _is_golden(m.group(1))
            if in_golden and insert_at is None:
                insert_at = len(kept)
        if not in_golden:
            kept.append(line)
    if insert_at is None:
        body = "".join(kept).rstrip("\n")
        return body + "\n\n" + block
    before = "".join(kept[:insert_at]).rstrip("\n")
    after = "".join(kept[insert_at:]).lstrip("\n")
    out = (before + "\n\n" if before else "") + block
    return out + ("\n" + after if after else "")


def update_manifest(path: Path, cycles: int, counters: dict[str, int]) -> bool:
    """Record new golden values in `path`; True if the file changed.

    The previous tolerance is kept.  The result is parsed again before it is
    written, so a bad edit can never leave a broken manifest behind.
    """
    path = Path(path)
    old = load_manifest(path)
    tolerance = old.golden.tolerance if old.golden else DEFAULT_GOLDEN_TOLERANCE
    text = path.read_text(encoding="utf-8")
    new = replace_golden(text, render_golden(cycles, counters, tolerance))
    if new == text:
        return False
    parse_manifest(path, tomllib.loads(new))      # never write a manifest that does not parse
    atomic_write(path, new)                       # temp file + rename: never half written
    return True

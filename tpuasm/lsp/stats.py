"""Per-instruction cycles of a run, for inlay hints: the `instruction_cycles` table of a
`tpuasm run --stats FILE` document (issue, start and finish cycle of each instruction).

The server looks for `PROG.tasm.stats.json` or `PROG.stats.json` next to the program and
uses it only while it has one row per instruction of the program as it assembles now.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class RunStats:
    path: str
    issue: dict[int, int]          # instruction index -> issue cycle
    stall: dict[int, int]          # instruction index -> cycles between issue and start

    def hint(self, index: int) -> str | None:
        if index not in self.issue:
            return None
        return f"issue {self.issue[index]}, stall {self.stall[index]}"


_cache: dict[str, tuple[float, int, RunStats | None]] = {}


def find_stats(program_path: str, count: int) -> RunStats | None:
    stem, _ = os.path.splitext(program_path)
    for candidate in (program_path + ".stats.json", stem + ".stats.json"):
        try:
            mtime = os.stat(candidate).st_mtime
        except OSError:
            continue
        cached = _cache.get(candidate)
        if cached is not None and cached[0] == mtime and cached[1] == count:
            return cached[2]
        stats = _load(candidate, count)
        _cache[candidate] = (mtime, count, stats)
        return stats
    return None


def _load(path: str, count: int) -> RunStats | None:
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f).get("instruction_cycles")
        issue = {int(r["index"]): int(r["issue"]) for r in rows}
        stall = {int(r["index"]): int(r["start"]) - int(r["issue"]) for r in rows}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None                 # not a stats file of this kind: no hints, no error
    if not issue or max(issue) >= count:
        return None                 # from another version of the program
    return RunStats(path, issue, stall)

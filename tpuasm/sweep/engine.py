"""The sweep itself: expand targets x grid into points, answer what the cache knows, run
the rest on an executor, hand every row to the caller as it arrives."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cluster import code_digest
from .cache import ResultCache, point_key
from .grid import Grid
from .targets import Target


@dataclass
class Summary:
    total: int = 0
    cached: int = 0
    by_status: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)      # (target, settings, error), first 50

    def count(self, row: dict) -> None:
        status = row.get("status", "error")
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if status in ("error", "fault", "skipped") and len(self.failures) < 50:
            self.failures.append(row)

    @property
    def failed(self) -> int:
        return self.by_status.get("error", 0) + self.by_status.get("fault", 0)


def tasks(targets: list[Target], grid: Grid, *, timing_only=False, max_cycles=None):
    """Every point as a task dict, lazily (targets outer, grid inner)."""
    code = code_digest()
    seq = 0
    for target in targets:
        for settings, config in grid.points(target.base_config()):
            key = point_key(target.digest(config), config, timing_only, max_cycles, code)
            yield {"seq": seq, "target": target, "settings": settings, "config": config,
                   "key": key, "timing_only": timing_only, "max_cycles": max_cycles,
                   "code": code}
            seq += 1


def run_sweep(targets: list[Target], grid: Grid, on_row, *, cache: ResultCache | None = None,
              client=None, timing_only=False, max_cycles=None, window=None) -> Summary:
    """Run every point; on_row(row) for each (cached ones first as met).  `client`: a
    dask.distributed Client, or None to run in this process."""
    from .executor import run_tasks, run_tasks_here
    summary = Summary()
    cache = cache or ResultCache(None)

    def deliver(row):
        summary.count(row)
        on_row(row)

    def fresh(row):
        cache.put(row.get("key", ""), row)
        deliver(row)

    def uncached():
        for task in tasks(targets, grid, timing_only=timing_only, max_cycles=max_cycles):
            summary.total += 1
            row = cache.get(task["key"])
            if row is not None:
                summary.cached += 1
                deliver({**row, "target": task["target"].label, **task["settings"],
                         "cached": 1})
                continue
            yield task

    try:
        if client is None:
            run_tasks_here(uncached(), fresh)
        else:
            run_tasks(uncached(), client, fresh, window=window)
    finally:
        cache.flush()              # every finished row on disk, even after a Ctrl-C
    return summary

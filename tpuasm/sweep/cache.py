"""The result cache that makes sweeps resumable: finished points keyed by a digest of the
program, its data, the configuration, the run mode and tpuasm's own code
(tpuasm.cluster.code_digest: the code every worker must run too).  Nothing else enters a
key, so `tpuasm sweep apps` and figure11 share the points they have in common.

One SQLite file (stdlib, one writer: the client).  A point's key changes when anything
that could change its numbers changes, so a cached row is always one a fresh run would
give; rows of failed points are not stored, so a rerun retries them.

Rows are committed at most every COMMIT_SECONDS (and on close), not one by one: each
commit syncs the file to disk, 25 ms apiece on this shared machine, which made a
144-point figure11 of 10 ms points spend 3.6 s committing.  A sweep killed outright
loses at most the last COMMIT_SECONDS of rows, which a rerun recomputes.
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from .grid import SweepError


def point_key(target_digest: str, config: dict, timing_only: bool, max_cycles,
              code: str) -> str:
    from ..cache import key
    return key({"t": target_digest, "c": machine_settings(config), "timing_only": timing_only,
                "max": max_cycles, "code": code}, length=24)


def default_path() -> Path:
    from ..cache import root
    return root() / "sweep-results.sqlite"


def machine_settings(config: dict) -> dict:
    """Every MachineConfig field in force under `config`: one machine, one key, however it
    was asked for (`sweep MLP0 --set memory=0.5` gives {weight_bytes_per_cycle: ...}, and
    figure11's memory knob the same plus clock_hz=700e6 from its clock knob at 1)."""
    from dataclasses import fields

    from ..machine.config import MachineConfig
    try:
        machine = MachineConfig(**config)
    except (TypeError, ValueError):      # the point will fail; its key need not be canonical
        return config
    # a timing constant left unset (None) is the value its `timing` gives it
    return {f.name: machine._in_force(f.name) if getattr(machine, f.name) is None
            and f.name in machine._timing_defaults() else getattr(machine, f.name)
            for f in fields(machine)}


COMMIT_SECONDS = 1.0


class ResultCache:
    def __init__(self, path: Path | None):
        self.path = path
        self.db = None
        self._last_commit = time.monotonic()
        if path is None:
            return
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(str(path))
            self.db.execute("CREATE TABLE IF NOT EXISTS points (key TEXT PRIMARY KEY, row TEXT)")
            self.db.commit()
        except (OSError, sqlite3.Error) as e:
            raise SweepError(f"{path}: cannot open the result cache: {e}") from None

    def get(self, key: str) -> dict | None:
        if self.db is None:
            return None
        found = self.db.execute("SELECT row FROM points WHERE key = ?", (key,)).fetchone()
        return json.loads(found[0]) if found else None

    def put(self, key: str, row: dict) -> None:
        if self.db is None or row.get("status") not in ("ok", "fault", "skipped"):
            return
        self.db.execute("INSERT OR REPLACE INTO points VALUES (?, ?)", (key, json.dumps(row)))
        now = time.monotonic()
        if now - self._last_commit >= COMMIT_SECONDS:
            self.db.commit()
            self._last_commit = now

    def flush(self) -> None:
        """Commit the rows put so far (run_sweep does at its end)."""
        if self.db is not None:
            self.db.commit()
            self._last_commit = time.monotonic()

    def close(self) -> None:
        if self.db is not None:
            self.db.commit()
            self.db.close()
            self.db = None

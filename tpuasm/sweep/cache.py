"""The result cache that makes sweeps resumable: finished points keyed by a digest of the
program, its data, the configuration, the run mode and the emulator's own sources.

One SQLite file (stdlib, one writer: the client).  A point's key changes when anything
that could change its numbers changes, so a cached row is always one a fresh run would
give; rows of failed points are not stored, so a rerun retries them.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

from .grid import SweepError


def point_key(target_digest: str, config: dict, timing_only: bool, max_cycles,
              machine_digest: str) -> str:
    text = json.dumps({"t": target_digest, "c": config, "timing_only": timing_only,
                       "max": max_cycles, "m": machine_digest}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def machine_digest() -> str:
    from ..machine.jitcache import source_digest
    return source_digest()


def default_path() -> Path:
    from ..machine.jitcache import cache_root
    return cache_root() / "sweep-results.sqlite"


class ResultCache:
    def __init__(self, path: Path | None):
        self.path = path
        self.db = None
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
        self.db.commit()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()

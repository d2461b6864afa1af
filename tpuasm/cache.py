"""The one on-disk cache of tpuasm: one root, content-addressed entries, atomic writes.

Every cache lives under `root()` (`$XDG_CACHE_HOME/tpuasm`, else `~/.cache/tpuasm`) in an
entry named `<kind>-<key>`, where the key is a digest of everything that could change the
entry's content (`key(...)`): a changed input is a new entry, never a stale one.  Users:

| cache | entry | written by |
|---|---|---|
| numba's compiled run loop (machine/jitcache.py) | `numba-<sources>/` | numba, pruned here |
| ahead-of-time run loop (machine/aot.py) | `aot-<build key>/` | `build_once` + `install` |
| the int8 C kernel (machine/native.py) | `native-<source, CPU, compiler>/` | `build_once` + `install` |
| compiled apps (apps/programs.py) | `apps/<app>-<model key>/` and `program-<key>.json` in it | `install`-like rename, `write_file` |
| the sweep's results (sweep/cache.py) | `sweep-results.sqlite` | SQLite (one writer: the client) |

`key()` makes the sweep's point keys; the build caches hash what their entries are built
from themselves (source files, CPU, compiler, toolchain versions) and name the entry with
`entry()`.

A directory entry is built in a temporary folder beside it and renamed into place
(`install`), under a file lock so that parallel processes build it once (`build_once`);
a failed build leaves a FAILED note so that later processes fall back at once.  A file
entry is written to a temporary file renamed over it (`write_file`): readers see the old
entry or the new one, never a part.  Old generations of a kind are pruned (`prune`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

FAILED = "FAILED"          # the note a failed build leaves in its entry
KEEP = 4                   # generations of one kind kept ...
GRACE_SECONDS = 3600       # ... and any used this recently


def root() -> Path:
    """Where every tpuasm cache lives: $XDG_CACHE_HOME/tpuasm, else ~/.cache/tpuasm."""
    from .environment import raw
    base = raw("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpuasm"


def key(*parts, length: int = 16) -> str:
    """A content key: the first `length` hex digits of the sha256 of `parts` as JSON."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def entry(kind: str, digest: str) -> Path:
    """The path of one entry: root()/<kind>-<digest>."""
    return root() / f"{kind}-{digest}"


def write_file(path: Path, data: bytes | str) -> None:
    """Write a file entry atomically (a temporary file beside it, renamed over it); OSError
    on failure, with nothing left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def staging_directory(where: Path) -> Path:
    """A new temporary folder beside the directory entry `where`, to build it in."""
    where.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="building-", dir=where.parent))


def prune(current: Path, prefix: str) -> None:
    """Drop all but the KEEP most recently used generations of `prefix` beside `current`,
    sparing any used within GRACE_SECONDS: another process (another checkout, another
    branch) may be using it now."""
    generations = sorted(current.parent.glob(prefix + "*"), key=lambda p: p.stat().st_mtime,
                         reverse=True)
    recent = time.time() - GRACE_SECONDS
    for old in generations[KEEP:]:
        if old != current and old.stat().st_mtime < recent:
            shutil.rmtree(old, ignore_errors=True)


def ensure_built(where: Path, product: Path, build) -> bool:
    """Whether `product` exists, building it once (build_once) unless an earlier build
    failed (its FAILED note).  Errors of the build propagate: the caller notes them."""
    if not product.exists():
        if (where / FAILED).exists():
            return False
        build_once(where, product, build)
    return product.exists()


def build_once(where: Path, product: Path, build) -> None:
    """Run `build(where)` unless `product` or a FAILED note exists, under a lock."""
    where.parent.mkdir(parents=True, exist_ok=True)
    lock_path = where.parent / ("lock-" + where.name)
    try:
        with open(lock_path, "w") as lock:
            try:
                import fcntl
                fcntl.flock(lock, fcntl.LOCK_EX)      # another process may be building it
            except ImportError:
                pass
            if not product.exists() and not (where / FAILED).exists():
                build(where)
    finally:                                          # a failed build leaves no lock file
        try:
            lock_path.unlink()
        except OSError:
            pass


def install(tmp: Path, where: Path, prefix: str) -> None:
    """Move a finished build from `tmp` to `where` (replacing an earlier failure's note)
    and prune old generations of `prefix`."""
    if where.exists():
        shutil.rmtree(where, ignore_errors=True)
    tmp.replace(where)
    try:
        os.utime(where)
        prune(where, prefix)
    except OSError:
        pass


def note_failure(where: Path, error: Exception, consequence: str) -> None:
    """Say once (a RuntimeWarning) that a build or load failed and what happens instead,
    and leave the FAILED note."""
    warnings.warn(f"tpuasm: {consequence} ({error})", RuntimeWarning, stacklevel=4)
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / FAILED).write_text(f"{type(error).__name__}: {error}\n")
    except OSError:
        pass

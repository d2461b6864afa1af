"""Keep numba's on-disk cache in step with every source the compiled core depends on.

numba invalidates a cached function only when *its own* file changes.  The run loop in
core.py inlines kernels from kernels.py and gemm.py and freezes module-level tables
(ISA constants, the sigmoid/tanh tables, OpenTPU's sigmoid steps) into its machine code,
so after an edit to any of those a plain `cache=True` would keep serving the old code.
Instead, the machine's modules are compiled into a cache directory named by a hash of all
of those sources (and of the C kernel's, mmc_int8.c, which the compiled code calls by
name): any edit starts a fresh cache, an unchanged tree starts warm.

`NUMBA_CACHE_DIR`, when the user sets it, wins.  The directory is chosen only while this
package's modules are being imported (their `@njit(cache=True)` decorators read it), then
numba's global setting is restored, so other numba code in the process is unaffected.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent          # tpuasm/
_DEPENDENCIES = ("machine/*.py", "machine/*.c", "functions.py", "function_tables.npz",
                 "opentpu.py", "isa.py", "isa.toml")
_KEEP = 4                                                   # cache generations kept
_GRACE_SECONDS = 3600                                       # ... and any used this recently


def toolchain_version(package: str) -> bytes:
    """The version file of an installed package (numba, llvmlite), read without importing
    it: importing numba costs ~0.35 s, which a run served by the ahead-of-time module
    (aot.py) must not pay."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return b"none"
    try:
        return (Path(spec.origin).parent / "_version.py").read_bytes()
    except OSError:
        return spec.origin.encode()


def source_digest() -> str:
    h = hashlib.sha256()
    for package in ("numba", "llvmlite"):
        h.update(toolchain_version(package))
    for pattern in _DEPENDENCIES:
        for path in sorted(_PACKAGE.glob(pattern)):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tpuasm"


@contextmanager
def keyed_cache_dir():
    """While importing the numba modules, point numba's cache at the keyed directory."""
    from numba.core import config
    if os.environ.get("NUMBA_CACHE_DIR"):
        yield
        return
    target = cache_root() / f"numba-{source_digest()}"
    try:
        target.mkdir(parents=True, exist_ok=True)
        os.utime(target)                       # mark as recently used for pruning
        _prune(target)
    except OSError:
        yield                                  # unwritable home: numba's own locators decide
        return
    previous = config.CACHE_DIR
    config.CACHE_DIR = str(target)
    try:
        yield
    finally:
        config.CACHE_DIR = previous


def _prune(current: Path, prefix: str = "numba-") -> None:
    """Drop all but the most recently used cache generations, sparing any used within the
    last hour: another process (another checkout, another branch) may be using it now."""
    generations = sorted(current.parent.glob(prefix + "*"), key=lambda p: p.stat().st_mtime,
                         reverse=True)
    recent = time.time() - _GRACE_SECONDS
    for old in generations[_KEEP:]:
        if old != current and old.stat().st_mtime < recent:
            shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------ built artefacts
# The ahead-of-time core (aot.py) and the C kernels (native.py) are built once per key into
# cache_root()/<prefix><key>/: under a file lock so that parallel processes build once, into
# a temporary directory renamed into place, and a failure leaves a FAILED note so that
# later processes fall back at once instead of retrying a build that cannot work.
FAILED = "FAILED"


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
        _prune(where, prefix)
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

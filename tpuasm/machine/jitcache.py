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
from contextlib import contextmanager
from pathlib import Path

from .. import cache as _cache
from ..environment import raw

_PACKAGE = Path(__file__).resolve().parent.parent          # tpuasm/
_DEPENDENCIES = ("machine/*.py", "machine/*.c", "functions.py", "function_tables.npz",
                 "opentpu.py", "isa.py", "isa.toml")
_KEEP = _cache.KEEP                                         # cache generations kept


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
    """tpuasm.cache.root(), the one cache root."""
    return _cache.root()


@contextmanager
def keyed_cache_dir():
    """While importing the numba modules, point numba's cache at the keyed directory."""
    from numba.core import config
    if raw("NUMBA_CACHE_DIR"):
        yield
        return
    target = cache_root() / f"numba-{source_digest()}"
    try:
        target.mkdir(parents=True, exist_ok=True)
        os.utime(target)                       # mark as recently used for pruning
        _cache.prune(target, "numba-")
    except OSError:
        yield                                  # unwritable home: numba's own locators decide
        return
    previous = config.CACHE_DIR
    config.CACHE_DIR = str(target)
    try:
        yield
    finally:
        config.CACHE_DIR = previous

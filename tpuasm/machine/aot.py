"""The run loop (core.run_core) and the data path (dataonly.run_sequential, run_batches,
lanes.run_lanes) compiled ahead of time into a small extension module.

Why.  A warm `tpuasm run` of a tiny program spent ~1.3 s, nearly all of it in numba:
importing it (~0.35 s) and loading the cached run loop (~0.5 s, most of it numba refreshing
every typing registry, which imports scipy).  numba's own ahead-of-time compiler (pycc)
turns the very same njit functions into a CPython extension that needs only numpy at run
time; importing it takes milliseconds.  It is the same engine -- the same source, the same
numba compiler, host CPU and optimisation as the JIT -- not a second implementation.

How.  The module is built the first time a machine runs after any change to the sources
the core depends on (the jitcache digest, plus the CPU, Python, numpy and the toolchain),
into ~/.cache/tpuasm/aot-<key>/, under a file lock so parallel processes build it once.
The build imports numba and compiles the core like the JIT would (tens of seconds), then
links it with the C compiler.  Without a working C compiler, or if anything about the
build or the import fails, a FAILED note is left in that directory and the machine keeps
using the JIT (with numba's cache), as before; TPUASM_AOT=0 chooses the JIT outright.

The exported function takes run_core's arguments with fixed types (C-contiguous arrays of
the dtypes the Machine makes, the weight image read-only).  `runner(args)` checks a
machine's arguments against the layout recorded at build time and returns None when they
do not match, so odd inputs fall back to the JIT rather than being misread.

The compiled code calls OpenBLAS's sgemm/dgemm by name (gemm.py): the module is linked
against the library numpy ships (a needed library found through an rpath), so the dynamic
linker resolves them in the module's own scope and nothing of that library becomes global.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import sys
import sysconfig
import warnings
from pathlib import Path

import numpy as np

from . import gemm
from . import native
from ..cache import ensure_built, entry, install, note_failure, staging_directory
from ..environment import raw
from .jitcache import source_digest, toolchain_version

MODULE = "tpuasm_core_aot"
_LAYOUT = "layout.json"
_loaded = None             # the module, False after a failure in this process, None untried


def enabled() -> bool:
    # The compiled code calls OpenBLAS and the C kernels by name: both must be loadable.
    return (raw("TPUASM_AOT") or "1") != "0" and gemm.HAVE_BLAS \
        and native.library() is not None


def _cpu_fingerprint() -> bytes:
    """What the host-tuned machine code depends on, read cheaply (no llvmlite)."""
    text = platform.machine()             # (platform.processor() would spawn `uname -p`)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    text += line
                if line.strip() == "":
                    break                     # the first processor describes them all
    except OSError:
        pass
    return text.encode()


def build_key() -> str:
    h = hashlib.sha256(source_digest().encode())
    h.update(_cpu_fingerprint())
    h.update(sys.version.encode())
    h.update(np.__version__.encode())
    h.update(toolchain_version("setuptools"))
    h.update(str(gemm.BLAS_PATH).encode())    # linked by path (build): one build per numpy
    return h.hexdigest()[:16]


def directory() -> Path:
    return entry("aot", build_key())


def _library_path(where: Path) -> Path:
    return where / (MODULE + sysconfig.get_config_var("EXT_SUFFIX"))


# ------------------------------------------------------------------ argument layout
def layout(args) -> list:
    """(dtype, ndim, writeable) of every array argument, the scratch tuple's flattened;
    None for a non-contiguous array (never served by the ahead-of-time code)."""
    out = []
    for a in args:
        if isinstance(a, tuple):
            out.extend(layout(a))
        elif not a.flags.c_contiguous:
            out.append(None)
        else:
            out.append([a.dtype.str, a.ndim, bool(a.flags.writeable)])
    return out


def _matches(expected, actual) -> bool:
    if len(expected) != len(actual):
        return False
    for e, a in zip(expected, actual):
        if a is None or e[0] != a[0] or e[1] != a[1] or (e[2] and not a[2]):
            return False
    return True


# ------------------------------------------------------------------ loading
def load():
    """The compiled module (building it if needed), or None: then use the JIT."""
    global _loaded
    if _loaded is not None:
        return _loaded or None
    _loaded = False
    if not enabled():
        return None
    where = directory()
    try:
        if not ensure_built(where, _library_path(where), build):
            return None
        module = _import(where)
    except Exception as e:              # any doubt: the JIT serves, and we say why once
        note_failure(where, e, "the ahead-of-time core is unavailable; using numba's JIT "
                               "(slower start-up)")
        return None
    try:
        os.utime(where)                 # recently used: spared by other processes' pruning
    except OSError:
        pass
    _loaded = module
    return module


def runner(args, name: str = "run_core"):
    """The ahead-of-time `name` (run_core, dataonly's run_sequential or run_batches, or
    lanes.run_lanes) if it can take these arguments, else None."""
    module = load()
    if module is None or name not in module.LAYOUT \
            or not _matches(module.LAYOUT[name], layout(args)):
        return None
    return getattr(module, name)


def _import(where: Path):
    # numpy's OpenBLAS is a dependency the module was linked against (build): never loaded
    # RTLD_GLOBAL, which put its unprefixed internals (blas_memory_alloc, exec_blas, ...)
    # before scipy's own OpenBLAS's and broke scipy's LAPACK later in the same process
    native.library()                    # loaded RTLD_GLOBAL: the int8 kernel for the linker
    spec = importlib.util.spec_from_file_location(MODULE, _library_path(where))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.LAYOUT = json.loads((where / _LAYOUT).read_text())
    return module


# ------------------------------------------------------------------ building
def build(where: Path) -> None:
    """Compile core.run_core, dataonly.run_sequential, dataonly.run_batches and
    lanes.run_lanes into `where` (atomically: a temporary directory renamed)."""
    from . import core, dataonly, jit, lanes
    from .machine import Machine
    jit.materialize()
    sample = Machine()._args                 # the argument types every Machine passes
    sequential = dataonly.arguments(sample)
    batches = dataonly.batch_arguments(sample, np.zeros((1,) + sample[13].shape, np.uint8))
    laned = lanes.arguments(sample, np.zeros((1,) + sample[13].shape, np.uint8),
                            np.zeros((1,) + sample[11].shape, sample[11].dtype),
                            np.zeros((1,) + sample[12].shape, sample[12].dtype))
    import numba
    from numba.core import codegen
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # pycc's pending-deprecation notice
        from numba.pycc import CC
    signature = numba.types.void(*(numba.typeof(a) for a in sample))
    sequential_signature = numba.types.int64(*(numba.typeof(a) for a in sequential),
                                             numba.types.int64)      # + the profile
    batches_signature = numba.types.int64(*(numba.typeof(a) for a in batches),
                                          numba.types.int64)
    lanes_signature = numba.types.int64(*(numba.typeof(a) for a in laned), numba.types.int64)
    tmp = staging_directory(where)
    try:
        cc = CC(MODULE)
        # numpy's OpenBLAS as a needed library found by its directory (rpath): the module's
        # sgemm/dgemm resolve in its own scope, no global symbols (_import)
        blas = Path(gemm.BLAS_PATH)
        cc._extra_ldflags = {"linux": ["-Wl,--no-as-needed", str(blas),
                                       f"-Wl,-rpath,{blas.parent}"]}
        cc.output_dir = str(tmp)
        cc.output_file = _library_path(tmp).name
        cc.target_cpu = "host"
        cc.export("run_core", signature)(core.run_core.py_func)
        cc.export("run_sequential", sequential_signature)(dataonly.run_sequential.py_func)
        cc.export("run_batches", batches_signature)(dataonly.run_batches.py_func)
        cc.export("run_lanes", lanes_signature)(lanes.run_lanes.py_func)
        # pycc tunes for the host CPU *model*; give it the host's actual feature list too,
        # as the JIT does (a virtual machine may hide features its CPU model implies).
        original = codegen.AOTCPUCodegen._customize_tm_features
        codegen.AOTCPUCodegen._customize_tm_features = \
            lambda self: self._get_host_cpu_features()
        try:
            cc.compile()
        finally:
            codegen.AOTCPUCodegen._customize_tm_features = original
        (tmp / _LAYOUT).write_text(json.dumps({"run_core": layout(sample),
                                                "run_sequential": layout(sequential),
                                                "run_batches": layout(batches),
                                                "run_lanes": layout(laned)}))
        install(tmp, where, "aot-")
        tmp = None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

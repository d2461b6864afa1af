"""OpenBLAS starts one worker thread per core as numpy is imported: on the 2-core machine
that was ~60 ms of CPU time (and as much wall time under load) of the debugger's start-up,
for threads nothing uses before the first frame.  The debugger imports numpy with
OpenBLAS on one thread and gives OpenBLAS back its own count (one per core it may run on)
once the first frame is painted (in batch mode, once the program is loaded).

Nothing changes when the user chose a thread count (OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS,
OMP_NUM_THREADS) or numpy is already imported (the debugger run inside another program)."""
from __future__ import annotations

import os
import sys

from tpuasm import environment

_ENV = "OPENBLAS_NUM_THREADS"
_USER_SETTINGS = (_ENV, "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_restore_to: int | None = None       # OpenBLAS's own count, to set once the screen is up


def start_single_threaded() -> None:
    """Call before numpy is imported."""
    global _restore_to
    if "numpy" in sys.modules or any(environment.raw(name) is not None
                                     for name in _USER_SETTINGS):
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if cores <= 1:
        return
    environment.put(_ENV, "1")
    _restore_to = cores


def restore() -> None:
    """OpenBLAS back to one thread per core (it starts the missing ones); the variable
    is removed so that nothing started from here inherits it."""
    global _restore_to
    if _restore_to is None:
        return
    cores, _restore_to = _restore_to, None
    if environment.raw(_ENV) == "1":
        environment.put(_ENV, None)
    if "numpy" not in sys.modules:
        return                      # never imported: it will read no variable now
    from tpuasm.machine.gemm import set_blas_threads
    set_blas_threads(cores)

"""The TPU v1 machine: state, numba core, pipeline timing and the reference model.

Public API (spec/machine-api.md): Machine, MachineConfig, MachineFault, RunResult, Watch,
History, Snapshot and the view records.
"""
from .jitcache import keyed_cache_dir

with keyed_cache_dir():            # before any @njit(cache=True) decorator runs
    from . import gemm, kernels, core  # noqa: F401  (compiled modules, in dependency order)
    from .config import MachineConfig
    from .faults import FAULT_KINDS, MachineFault
    from .history import History
    from .machine import (ActiveWeights, Event, FifoEntry, Machine, RunResult, Snapshot,
                          StageState, TileState, Watch)
from ..errors import DataFileError

__all__ = ["ActiveWeights", "DataFileError", "Event", "FAULT_KINDS", "FifoEntry", "History",
           "Machine", "MachineConfig", "MachineFault", "RunResult", "Snapshot", "StageState",
           "TileState", "Watch"]

"""The TPU v1 machine: state, numba core, pipeline timing and the reference model.

Public API (spec/machine-api.md): Machine, MachineConfig, MachineFault, RunResult, Watch,
History, Snapshot and the view records.

Importing this package does not import numba: the compiled functions are created when
first needed (jit.py), and a run whose core comes from the ahead-of-time module (aot.py)
never needs them.
"""
from .config import MachineConfig
from .faults import FAULT_KINDS, MachineFault
from .history import History
from .machine import (ActiveWeights, Event, FifoEntry, Machine, RunResult, Snapshot,
                      StageState, TileState, Watch)
from ..errors import DataFileError

__all__ = ["ActiveWeights", "DataFileError", "Event", "FAULT_KINDS", "FifoEntry", "History",
           "Machine", "MachineConfig", "MachineFault", "RunResult", "Snapshot", "StageState",
           "TileState", "Watch"]

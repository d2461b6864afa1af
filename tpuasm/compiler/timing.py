"""Cycles of each compiled segment, measured when compiling.

A segment's program runs timing-only (spec/timing.md 9.1: cycles and counters without the
arithmetic, exactly a full run's) on the machine it was compiled for, on a zero host image
and its own weight image: data never changes the timing, so one run gives the cycles of
every batch.  The report turns them into time at the machine's clock and the array's
utilisation for the network's own MACs (the paper's Table 3 row 2).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SegmentTiming:
    cycles: int
    array_active_cycles: int
    clock_hz: float
    fault: str | None = None          # the run did not halt (a back-end bug): why

    @property
    def seconds(self) -> float:
        return self.cycles / self.clock_hz


def time_segment(step, machine_config) -> SegmentTiming:
    """Run one TpuStep's program timing-only on `machine_config` (a MachineConfig)."""
    from tpuasm.machine import Machine
    program = step.program
    machine = Machine(machine_config, timing_only=True)
    host = np.zeros((max(program.host_rows, 1), program.array_size), np.int8)
    machine.load(step.binary(), host=host, weights=program.weights)
    result = machine.run()
    c = machine.counters()
    fault = None if result.fault is None else str(result.fault)
    return SegmentTiming(int(c["cycles"]), int(c["array_active_cycles"]),
                         float(machine_config.clock_hz), fault)

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


def time_segments(steps, machine_config) -> dict:
    """{segment name: SegmentTiming} for each TpuStep with a program, run timing-only on
    `machine_config` (a MachineConfig), one machine reloaded for each."""
    from tpuasm.compiler.runtime.steps import TpuStep
    from tpuasm.machine import Machine
    machine = None
    out = {}
    for step in steps:
        if not isinstance(step, TpuStep) or step.program is None:
            continue
        if machine is None:
            machine = Machine(machine_config, timing_only=True)
        program = step.program
        host = np.zeros((max(program.host_rows, 1), program.array_size), np.int8)
        machine.load(step.binary(), host=host, weights=program.weights)
        result = machine.run()
        c = machine.counters()
        fault = None if result.fault is None else str(result.fault)
        out[step.name] = SegmentTiming(int(c["cycles"]), int(c["array_active_cycles"]),
                                       float(machine_config.clock_hz), fault)
    return out

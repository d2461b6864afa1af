"""Differential test: the cycle-level emulator against the reference model.

Random valid programs (tests/program_strategies.py) run through both
`tpuasm.machine.Machine` and `tpuasm.machine.reference.run_reference`; the final UB,
accumulators, host memory, configuration registers, interrupt/tag events and the fault
(kind and instruction index) must be identical.  The reference model is written from
spec/isa.md alone, so a disagreement means one of the two misreads the spec.

    .venv/bin/python -m pytest tests/test_differential.py -q
"""
from __future__ import annotations

import collections
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).parent))
from program_strategies import FAULT_KINDS, SHAPE, programs  # noqa: E402

from tpuasm.disassembler import format_instruction  # noqa: E402
from tpuasm.isa import ISA_TABLE  # noqa: E402
from tpuasm.machine import Machine  # noqa: E402
from tpuasm.machine.reference import run_reference  # noqa: E402

# random programs, about a fifth of them built to fault (`make differential` runs more:
# two disagreements of the fast Activate paths showed only past 300)
EXAMPLES = int(os.environ.get("DIFFERENTIAL_EXAMPLES", 300))
FAULT_EXAMPLES = 15             # and this many more per fault kind
OPENTPU_EXAMPLES = 60           # and this many under the OpenTPU profile
VECTOR_EXAMPLES = 60            # and this many with half their instructions VADD/VMUL
MAX_CYCLES = 2_000_000


def listing(program) -> str:
    return "\n".join(f"  {i:3d}: {format_instruction(ins)}"
                     for i, ins in enumerate(program.instructions))


def first_difference(name, ours, theirs) -> str | None:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    if ours.shape != theirs.shape:
        return f"{name}: shape {theirs.shape} (emulator) != {ours.shape} (reference)"
    bad = np.argwhere(ours != theirs)
    if len(bad) == 0:
        return None
    rows = sorted({int(b[0]) for b in bad})
    r = rows[0]
    return (f"{name}: {len(rows)} rows differ, first row {r}:\n"
            f"    reference {ours[r].tolist()}\n    emulator  {theirs[r].tolist()}")


def named_address(message: str):
    """(memory, row) named by an address fault's message (after the instruction's text)."""
    message = message.rsplit(": ", 1)[-1]
    memory = re.search(r"\b(UB|accumulator|host|weight tile)", message)
    row = re.search(r"(-?\d+) out of range", message)
    return (memory and memory.group(1), row and int(row.group(1)))


# Timing constants change when things happen, never what the program computes, so every case
# also runs under one of these (chosen by the case's size): slow weights, fast host and
# weights, zero latencies, OpenTPU's timing.  Other interleavings, same results.
TIMINGS = [
    {},
    {"weight_bytes_per_cycle": 1.0, "shift_cycles": 100},
    {"weight_bytes_per_cycle": 1e6, "host_bytes_per_cycle": 1e6, "host_latency_cycles": 0},
    {"host_latency_cycles": 0, "act_latency_cycles": 0, "mmc_latency_cycles": 0,
     "shift_cycles": 0},
    {"timing": "opentpu"},
]


def run_emulator(program, host, weights, **timing):
    m = Machine.for_program(program, **timing)
    m.load(program, host=host, weights=weights)
    m.run(max_cycles=MAX_CYCLES)
    return m


def compare(case):
    """(every difference between the two models on one case as readable lines, reference result)"""
    program, host, weights = case.program, case.host, case.weights
    weights = weights if len(weights) else None
    ref = run_reference(program, host, weights)
    timing = TIMINGS[len(program) % len(TIMINGS)]
    m = run_emulator(program, host, weights, **timing)
    problems = [f"(emulator timing overrides: {timing})"] if timing else []
    clean = len(problems)
    fault = m.fault
    emu_fault = (fault.kind, fault.index) if fault is not None else (None, None)
    if emu_fault != (ref.fault_kind, ref.fault_index):
        problems.append(f"fault: emulator {emu_fault}, reference "
                        f"{(ref.fault_kind, ref.fault_index)} ({ref.fault_message})"
                        + (f"\n    emulator says: {fault}" if fault is not None else ""))
    elif ref.fault_kind == "address":
        # spec/isa.md section 7 fixes which address an address fault names.
        ours, theirs = named_address(ref.fault_message), named_address(str(fault))
        if ours != theirs:
            problems.append(f"address fault names {theirs} (emulator: {fault}), reference "
                            f"{ours} ({ref.fault_message})")
    for name, ours, theirs in (("ub", ref.ub, m.ub), ("acc", ref.acc, m.acc),
                               ("host", ref.host, m.host)):
        d = first_difference(name, ours, theirs)
        if d:
            problems.append(d)
    regs = m.registers()
    if regs != ref.registers:
        diff = {k: (ref.registers.get(k), regs.get(k)) for k in set(regs) | set(ref.registers)
                if ref.registers.get(k) != regs.get(k)}
        problems.append(f"registers (reference, emulator): {diff}")
    events = [(e.kind, e.index, e.value) for e in m.events if e.kind in ("interrupt", "tag")]
    if events != ref.events:
        problems.append(f"events: emulator {events}, reference {ref.events}")
    return (problems if len(problems) > clean else []), ref


def test_emulator_matches_reference_on_random_programs():
    seen = collections.Counter()
    count = 0

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs())
    def check(case):
        nonlocal count
        count += 1
        for ins in case.program.instructions:
            seen[ins.key] += 1
            seen.update(f"{ins.key}.{c}" for c in ins.flag_letters)
            if ins.key == "CFG":
                seen[f"reg{ins['reg']}"] += 1
        problems, ref = compare(case)
        seen[f"fault:{ref.fault_kind}"] += 1
        assert not problems, ("emulator and reference disagree on\n" + listing(case.program)
                              + "\n" + "\n".join(problems))

    check()
    assert count >= EXAMPLES
    # The generator reaches every instruction, flag, register and planned fault kind.
    missing = [k for k in ISA_TABLE.instructions if not seen[k]]
    missing += [f"{k}.{c}" for k in ("MMC", "ACT", "VADD", "VMUL")
                for c in ISA_TABLE.instructions[k].flags
                if not seen[f"{k}.{c}"]]
    missing += [f"reg{r.index}" for r in ISA_TABLE.registers.values() if not seen[f"reg{r.index}"]]
    missing += [f"fault:{k}" for k in ("None", "address") if not seen[f"fault:{k}"]]
    assert not missing, f"not covered: {missing}"
    print(f"\n{count} programs; faults: "
          + ", ".join(f"{k[6:]} {v}" for k, v in sorted(seen.items()) if k.startswith("fault:")))


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_emulator_matches_reference_on_faulting_programs(kind):
    faults = collections.Counter()

    @settings(max_examples=FAULT_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(fault_kind=kind))
    def check(case):
        problems, ref = compare(case)
        faults[ref.fault_kind] += 1
        assert not problems, ("emulator and reference disagree on\n" + listing(case.program)
                              + "\n" + "\n".join(problems))

    check()
    assert faults[kind] > 0, f"no program faulted with {kind}: {dict(faults)}"


def test_emulator_matches_reference_on_vector_heavy_programs():
    # half the instructions VADD/VMUL (spec/isa.md 5.11), between the layers that feed them
    vectors = collections.Counter()

    @settings(max_examples=VECTOR_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(vector_share=0.5, fault_share=0.1))
    def check(case):
        vectors.update(i.key for i in case.program.instructions if i.key in ("VADD", "VMUL"))
        problems, _ref = compare(case)
        assert not problems, ("emulator and reference disagree on\n" + listing(case.program)
                              + "\n" + "\n".join(problems))

    check()
    assert vectors["VADD"] > VECTOR_EXAMPLES and vectors["VMUL"] > VECTOR_EXAMPLES


def test_emulator_matches_reference_under_the_opentpu_profile():
    # spec/opentpu.md: only Activate changes (OpenTPU's sigmoid, then the low 8 bits).
    count = 0

    @settings(max_examples=OPENTPU_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs(profile="opentpu"))
    def check(case):
        nonlocal count
        count += 1
        assert case.program.shape.profile == "opentpu"
        problems, _ref = compare(case)
        assert not problems, ("emulator and reference disagree on (opentpu profile)\n"
                              + listing(case.program) + "\n" + "\n".join(problems))

    check()
    assert count >= OPENTPU_EXAMPLES


def test_opentpu_activate_minimal():
    # The smallest program of the disagreement found first (spec/opentpu.md section 4):
    #   .config array_size=4, profile=opentpu
    #   RHM 0, 0, 1       ; x = [100, -1, 3, 0]
    #   RW 0              ; tile 0 = 2I
    #   MMC.SO 0, 0, 1    ; acc 0 = [200, -2, 6, 0]
    #   ACT 0, 1, 1       ; low 8 bits, no saturation: [200, 254, 6, 0]
    #   ACT.Q 0, 2, 1     ; int(255 / (1 + e^-x)): [255, 30, 254, 127]
    from program_strategies import Case, ins
    from tpuasm.binary import MachineShape, Program
    shape = MachineShape(array_size=4, ub_rows=8, acc_rows=8, fifo_depth=2, profile="opentpu")
    program = Program([ins("RHM", host=0, ub=0, length=1), ins("RW", tile=0),
                       ins("MMC", "SO", ub=0, acc=0, length=1),
                       ins("ACT", acc=0, ub=1, length=1), ins("ACT", "Q", acc=0, ub=2, length=1)],
                      shape)
    host = np.array([[100, -1, 3, 0]], dtype=np.int8)
    weights = (2 * np.eye(4, dtype=np.int8))[None]
    ref = run_reference(program, host, weights)
    assert ref.ub[1:3].tolist() == [[200, 254, 6, 0], [255, 30, 254, 127]]
    problems, _ = compare(Case(program, host, weights, None))
    assert not problems, "\n".join(problems)


def test_shape_is_small():
    # The machine the random programs run on (keeps the test fast).
    assert (SHAPE.array_size, SHAPE.ub_rows, SHAPE.acc_rows, SHAPE.fifo_depth) == (8, 64, 32, 4)

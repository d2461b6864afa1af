"""`tpuasm run`: load, run, and report what happened (rich summary, --out, --stats, --trace)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from .errors import TpuasmError

from .command import EXIT_FAILED as EXIT_FAULT, EXIT_OK

# The paper's Table 3 rows, in the order the paper lists them: the first four sum to 100 %.
BREAKDOWN = (("array active", "array_active_cycles"), ("weight stall", "weight_stall_cycles"),
             ("weight shift", "weight_shift_cycles"), ("non-matrix", "non_matrix_cycles"))
OVERLAPPING = (("RAW stalls", "raw_stall_cycles"), ("input (host) stalls", "input_stall_cycles"))


def make_machine(program, *, hazards: str = "interlock", trace: bool = False,
                 timing_only: bool = False, **overrides):
    from .machine import Machine, MachineConfig
    config = MachineConfig.from_shape(program.shape, hazards=hazards, **overrides)
    return Machine(config, trace=trace, timing_only=timing_only)


def split_machine_settings(items: list[str]) -> tuple[list[str], dict]:
    """`--config` items -> (shape items for the assembler, other MachineConfig fields):
    tpuasm.settings, the one parser every command shares."""
    from .settings import split_settings
    return split_settings(items)


def run_and_report(program, args) -> int:
    timing = {"timing": args.timing} if getattr(args, "timing", None) else {}
    overrides = dict(getattr(args, "machine_config", None) or {})
    if "hazards" in overrides:
        args.hazards = overrides.pop("hazards")
    timing.update(overrides)
    machine = make_machine(program, hazards=args.hazards, trace=bool(args.trace),
                           timing_only=bool(getattr(args, "timing_only", False)), **timing)
    machine.load(program, host=args.host, weights=args.weights)
    result = machine.run(max_cycles=args.max_cycles)
    if not args.quiet:
        print_summary(machine, name=str(args.program))
    if result.fault is not None:
        print(f"error: {result.fault}", file=sys.stderr)
    if args.out:
        save_host(machine, args.out, like=args.host)
    if args.stats:
        _write_text(args.stats, json.dumps(stats_document(machine), indent=2) + "\n")
    if args.trace:
        machine.write_trace(args.trace)
    return EXIT_FAULT if result.fault is not None else EXIT_OK


def stats_document(machine) -> dict:
    """The --stats file: every counter at the top level (cycles, the four Table-3 parts
    that sum to it, ...), then the rest of the machine's statistics (status, fault,
    events, configuration)."""
    stats = dict(machine.stats_json())
    return {**stats.pop("counters", {}), **stats, "instruction_cycles": instruction_cycles(machine)}


def instruction_cycles(machine) -> list[dict]:
    """Issue, start and finish cycle of every instruction that issued (the language
    server's per-line hints read them), from the trace's instruction slices."""
    from .machine.trace import trace_events
    return [{k: e["args"][k] for k in ("index", "issue", "start", "finish")}
            for e in trace_events(machine) if e.get("cat") == "instruction"]


def save_host(machine, path: Path, like: Path | None) -> None:
    """Final host memory, in the dtype of the --host image (raw bytes either way), written
    to exactly `path` (np.save would add `.npy`), atomically."""
    from .files import atomic_write, npy_header
    dtype = np.uint8
    if like is not None:
        dtype = npy_header(like, what="host image").dtype
    host = np.ascontiguousarray(machine.host).view(dtype)
    atomic_write(path, lambda fh: np.save(fh, host, allow_pickle=False))


def print_summary(machine, name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False, highlight=False)
    c = machine.counters()
    cycles = max(int(c["cycles"]), 1)
    clock = machine.config.clock_hz
    state = "fault" if machine.fault is not None else "halted"
    console.print(f"[bold]{name}[/]: {state} after {c['cycles']:,} cycles "
                  f"({c['cycles'] / clock * 1e6:,.2f} us at {clock / 1e6:,.0f} MHz), "
                  f"{c['instructions']:,} instructions retired", soft_wrap=True)
    # useful MACs: inside each tile's real K x N (its non-zero extent); the array-active
    # MAC slots count every input vector against the whole N x N tile, padding included
    # (spec/timing.md section 8)
    console.print(f"  matrix unit: {c['useful_macs']:,} useful MACs (each tile's real K x N; "
                  f"{c['array_mac_slots']:,} array-active MAC slots), utilisation "
                  f"{100 * c['mxu_utilization']:.1f} % of peak, {c['tops']:.2f} TOPS",
                  soft_wrap=True)
    table = Table(title="where the cycles went (as in the paper's Table 3)", title_justify="left")
    table.add_column("cycles spent on")
    table.add_column("cycles", justify="right")
    table.add_column("share", justify="right")
    for label, key in BREAKDOWN:
        table.add_row(label, f"{c[key]:,}", f"{100 * c[key] / cycles:.1f} %")
    for label, key in OVERLAPPING:
        table.add_row(f"[dim]{label} (overlapping)[/]", f"[dim]{c[key]:,}[/]",
                      f"[dim]{100 * c[key] / cycles:.1f} %[/]")
    console.print(table)
    for event in machine.events:
        if event.kind != "fault":
            console.print(f"  cycle {event.cycle:,}: {event.kind} {event.value} "
                          f"(instruction {event.index})")


def _write_text(path: Path, text: str) -> None:
    from .files import atomic_write
    atomic_write(path, text)

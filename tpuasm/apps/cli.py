"""`tpuasm profile`: run the six apps and print Table 3 next to the paper's, with the gap.

Exit status: 0 every app ran, 1 some app faulted or failed, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys

from ..cli import parse_arguments
from .paper import APPS, ROWS, TABLE3, measured_row

from ..command import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm profile",
        description="Run the paper's six applications (Table 1 shapes, docs/apps.md) on the "
                    "emulator and print every Table 3 row next to the paper's, with the gap.")
    p.add_argument("--apps", default=",".join(APPS), metavar="A,B,...",
                   help=f"which apps (default: all six: {','.join(APPS)})")
    p.add_argument("--timing-only", action="store_true", default=True,
                   help="skip the arithmetic, keep the cycle counts (the default: the profiled "
                        "data are zeros, and values never change the timing)")
    p.add_argument("--full", dest="timing_only", action="store_false",
                   help="compute the arithmetic too (same cycle counts, slower)")
    p.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                   help="a MachineConfig setting for every app (repeatable)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON instead of a table")
    fmt.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    return p


def profile_main(argv: list[str] | None = None) -> int:
    args, code = parse_arguments(build_parser(), argv)
    if args is None:
        return code
    from ..sweep.grid import SweepError, config_for, parse_value
    apps = [a.strip().upper() for a in args.apps.split(",") if a.strip()]
    bad = [a for a in apps if a not in APPS]
    if bad or not apps:
        print(f"error: --apps: unknown app(s) {', '.join(bad) or '(none given)'}; choose from "
              f"{', '.join(APPS)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        choice = {}
        for item in args.config:
            name, sep, value = item.partition("=")
            if not sep:
                raise SweepError(f"--config {item!r}: expected NAME=VALUE")
            choice[name.strip()] = parse_value(name.strip(), value)[0]
        config = config_for(choice, {})
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    timing_only = args.timing_only and timing_only_supported()
    results = {app: profile_app(app, config, timing_only) for app in apps}
    if args.json:
        print(json.dumps(results, indent=2))
    elif args.csv:
        write_csv(results, sys.stdout)
        for app, r in results.items():           # the CSV has rows for what ran only
            if r["status"] != "ok":
                print(f"{app}: {r['status']}: {r['error']}", file=sys.stderr)
    else:
        print_table(results)
    return EXIT_FAILED if any(r["status"] != "ok" for r in results.values()) else EXIT_OK


def timing_only_supported() -> bool:
    import inspect

    from ..machine import Machine
    return "timing_only" in inspect.signature(Machine.__init__).parameters


def profile_app(app: str, config: dict, timing_only: bool = True) -> dict:
    """Run one app; {"status", "cycles", "rows": {key: {"measured", "paper", "gap"}}}."""
    from ..errors import TpuasmError
    from ..machine import Machine, MachineConfig
    from .programs import CodegenError, app_program, shape_of
    out = {"status": "ok", "error": None, "cycles": None, "time_us": None, "rows": {}}
    try:
        machine_config = MachineConfig(**config)
        ap = app_program(app, **shape_of(machine_config))
        host, weights = ap.data()
        machine = (Machine(machine_config, timing_only=True) if timing_only
                   else Machine(machine_config))
        machine.load(ap.program(), host=host, weights=weights)
        result = machine.run()
    except CodegenError as e:
        return {**out, "status": "skipped", "error": str(e)}
    except (TpuasmError, ValueError, OSError) as e:
        return {**out, "status": "error", "error": f"{type(e).__name__}: {e}"}
    if result.fault is not None:
        return {**out, "status": "fault", "error": str(result.fault)}
    counters = machine.counters(useful_macs=False)      # the MACs: ap.macs, below
    cycles = int(counters["cycles"])
    seconds = cycles / machine_config.clock_hz
    # row 2 and TOPS count the network's own MACs, not the padding the array also multiplies
    counters = dict(counters, tops=2.0 * ap.macs / max(seconds, 1e-30) / 1e12,
                    mxu_utilization=ap.macs / max(cycles * ap.array_size ** 2, 1))
    out.update(cycles=cycles, time_us=round(seconds * 1e6, 3), segments=ap.segments)
    for key, _, _, _ in ROWS:
        measured = measured_row(key, counters)
        paper = TABLE3[key][app]
        out["rows"][key] = {"measured": round(measured, 2), "paper": paper,
                            "gap": round(measured - paper, 2)}
    return out


def print_table(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    apps = list(results)
    t = Table(title="Table 3 (paper) next to this emulator: measured / paper (gap)",
              title_justify="left")
    t.add_column("row")
    for app in apps:
        t.add_column(app, justify="right")
    for key, label, _, unit in ROWS:
        cells = []
        for app in apps:
            r = results[app]["rows"].get(key)
            if r is None:
                cells.append(f"[red]{results[app]['status']}[/]")
                continue
            unit_text = "" if unit == "%" else ""
            cells.append(f"{r['measured']:.1f} / {r['paper']:.1f}{unit_text} "
                         f"([{'green' if abs(r['gap']) <= 5 else 'yellow'}]{r['gap']:+.1f}[/])")
        t.add_row(label, *cells)
    t.add_row("cycles", *(f"{results[a]['cycles']:,}" if results[a]["cycles"] else "-"
                          for a in apps))
    console = Console(highlight=False)
    console.print(t)
    for app in apps:
        if results[app]["status"] != "ok":
            console.print(f"[red]{app}[/]: {results[app]['status']}: {results[app]['error']}")
    console.print("Rows 1-8 in % of cycles (row 2: the network's own MACs in % of peak); gap "
                  "= measured - paper, in points (TOPS: in TOPS).  Shapes: docs/apps.md.")


def write_csv(results: dict, stream) -> None:
    w = csv.writer(stream)
    w.writerow(["app", "row", "measured", "paper", "gap"])
    for app, r in results.items():
        for key, label, _, _ in ROWS:
            v = r["rows"].get(key)
            if v is not None:
                w.writerow([app, label, v["measured"], v["paper"], v["gap"]])


if __name__ == "__main__":
    sys.exit(profile_main())

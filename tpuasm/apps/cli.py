"""`tpuasm profile`: run the six apps and print Table 3 next to the paper's, with the gap.

Exit status: 0 every app ran, 1 some app faulted or failed, 2 bad arguments.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys

from .paper import APPS, ROWS, TABLE3, measured_row

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm profile",
        description="Run the paper's six applications (Table 1 shapes, docs/apps.md) on the "
                    "emulator and print every Table 3 row next to the paper's, with the gap.")
    p.add_argument("--apps", default=",".join(APPS), metavar="A,B,...",
                   help=f"which apps (default: all six: {','.join(APPS)})")
    p.add_argument("--timing-only", action="store_true",
                   help="skip the arithmetic, keep the cycle counts (when the emulator has it)")
    p.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                   help="a MachineConfig setting for every app (repeatable)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print JSON instead of a table")
    fmt.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    return p


def profile_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
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
    from ..sweep.point import timing_only_supported
    timing_only = args.timing_only and timing_only_supported()
    if args.timing_only and not timing_only:
        print("note: this emulator has no timing-only mode yet; running in full", file=sys.stderr)
    results = {app: profile_app(app, config, timing_only) for app in apps}
    if args.json:
        print(json.dumps(results, indent=2))
    elif args.csv:
        write_csv(results, sys.stdout)
    else:
        print_table(results)
    return EXIT_FAILED if any(r["status"] != "ok" for r in results.values()) else EXIT_OK


def profile_app(app: str, config: dict, timing_only: bool = False) -> dict:
    """Run one app; {"status", "cycles", "rows": {key: {"measured", "paper", "gap"}}}."""
    from ..sweep.point import run_point
    from ..sweep.targets import Target
    row = run_point({"target": Target("app", app), "settings": {}, "config": config,
                     "key": "", "timing_only": timing_only})
    out = {"status": row["status"], "error": row.get("error"), "cycles": row.get("cycles"),
           "time_us": row.get("time_us"), "rows": {}}
    if row["status"] != "ok":
        return out
    counters = {k: row[k] for k in ("cycles", "tops", "mxu_utilization", "array_active_cycles",
                                    "weight_stall_cycles", "weight_shift_cycles",
                                    "non_matrix_cycles", "raw_stall_cycles",
                                    "input_stall_cycles")}
    for key, _, _, _ in ROWS:
        measured = row["useful_pct"] if key == "useful" else measured_row(key, counters)
        # row 2 and TOPS count the network's own MACs (run_point), not the padding
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

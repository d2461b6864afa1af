"""`tpuasm sweep`: a grid of machine configurations over programs, on Dask.

Exit status: 0 every point ran (skipped points included), 1 some point faulted or failed,
2 bad input (unknown parameter, a value out of range, an empty grid, bad TOML, ...).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cli import parse_arguments

from ..command import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    from ..cluster import SCHEDULER_ENV
    p = argparse.ArgumentParser(
        prog="tpuasm sweep",
        description="Run TARGET(s) over a grid of MachineConfig settings and collect one "
                    "row per target x configuration (cycles, time, TOPS, every Table 3 "
                    "counter).  NAME is a MachineConfig field or a Figure 11 knob "
                    "(memory, clock, clock+, matrix, matrix+).",
        epilog="Examples:  tpuasm sweep MLP0 --set memory=0.25,0.5,1,2,4 -o mem.csv\n"
               "           tpuasm sweep programs/mlp0/mlp0.tasm --host H.npy --weights W.npy "
               "--set weight_bytes_per_cycle=x0.5,x1,x2 -o r.csv",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="a .tasm/.tbin (with --host/--weights), a test.toml or a folder of "
                        "them, a compiled-model folder (tpuasm compile -o OUTDIR; recompiled "
                        "for other shapes), an app name (MLP0 ... CNN1) or 'apps' for all six")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="values of one parameter (repeatable); x0.5 = half the baseline")
    p.add_argument("--grid", type=Path, metavar="GRID.toml", help="the grid from a TOML file")
    p.add_argument("--each", action="store_true",
                   help="vary one parameter at a time, the others at their baseline "
                        "(default: every combination)")
    p.add_argument("--host", type=Path, help="host image for .tasm/.tbin targets")
    p.add_argument("--weights", type=Path, help="weight image for .tasm/.tbin targets")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="RESULTS.csv",
                   help="write the results here, row by row as they finish")
    p.add_argument("--scheduler", metavar="ADDR",
                   help=f"a running Dask scheduler (default: ${SCHEDULER_ENV}, else a local "
                        "cluster on this machine's cores)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="local cluster workers (default: all cores; 0 = run here, no Dask)")
    p.add_argument("--timing-only", action="store_true",
                   help="skip the arithmetic: the same cycles, counters and faults, faster "
                        "(results never hold data, so only the run time differs)")
    p.add_argument("--max-cycles", type=int, metavar="N", help="fault a point after N cycles")
    p.add_argument("--cache", type=Path, metavar="FILE",
                   help="result cache (default: ~/.cache/tpuasm/sweep-results.sqlite)")
    p.add_argument("--no-cache", action="store_true", help="run every point, store nothing")
    p.add_argument("--plot", type=Path, action="append", default=[], metavar="FILE.png|.svg",
                   help="save the Figure-11-style plot (repeatable)")
    p.add_argument("--no-table", action="store_true", help="no results table, no terminal plot")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args, code = parse_arguments(build_parser(), argv)
    if args is None:
        return code
    from rich.console import Console
    from rich.markup import escape

    from ..errors import TpuasmError
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return _run(args, err)
    except TpuasmError as e:       # SweepError, a file that cannot be read or written
        err.print(f"[red]error:[/] {escape(str(e))}", highlight=False)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("interrupted (finished points are cached; rerun to resume)")
        return EXIT_INTERRUPTED


def _run(args, err) -> int:
    from ..files import check_outputs
    from .cache import ResultCache, default_path
    from .grid import SweepError
    from .engine import run_sweep
    from .grid import Grid, load_toml, parse_set
    from .report import CsvStream
    from .targets import resolve

    grid = load_toml(args.grid) if args.grid else Grid([], {})
    grid.axes += [parse_set(s) for s in args.sets]
    grid.each = grid.each or args.each
    names = list(grid.targets) + list(args.targets)
    if not names:
        raise SweepError("no TARGET given (a program, a folder, an app name or 'apps')")
    targets = resolve(names, args.host, args.weights)
    size = grid.size() * len(targets)
    for target in targets:                  # every point's configuration, before any runs
        grid.validate(target.base_config())
    if args.workers is not None and args.workers < 0:
        raise SweepError("--workers must be 0 or more")
    cache_path = None if args.no_cache else (args.cache or default_path())
    # every output checked before anything runs: none may be an input (the program, its
    # data, the grid, the cache), none a folder, every folder writable
    check_outputs({"-o": args.output, **{f"--plot {p}": p for p in args.plot}},
                  [*(t for t in names if Path(t).exists()), args.host, args.weights,
                   args.grid, cache_path, *_target_files(targets)])
    cache = ResultCache(cache_path)

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=err, transient=True,
                   disable=args.quiet or not err.is_terminal)
    axes = [a.name for a in grid.axes]
    out = None
    with bar:
        job = bar.add_task("sweep", total=size)

        def on_row(row):
            out.write(row)
            bar.update(job, advance=1, description=f"{row.get('target', '')}: {row.get('status')}")

        # -o is written to a temporary file and replaces RESULTS.csv only when the sweep
        # ends (tpuasm.files.StagedFile): an unreachable scheduler, Ctrl-C or a full disk
        # leave an old RESULTS.csv as it was
        try:
            if args.workers == 0:
                out = CsvStream(args.output, axes)
                summary = run_sweep(targets, grid, on_row, cache=cache,
                                    timing_only=args.timing_only, max_cycles=args.max_cycles)
            else:
                from ..cluster import dask_client
                with dask_client(args.scheduler, args.workers) as client:
                    out = CsvStream(args.output, axes)     # connected first
                    summary = run_sweep(targets, grid, on_row, cache=cache, client=client,
                                        timing_only=args.timing_only,
                                        max_cycles=args.max_cycles)
            out.close()
        except BaseException:
            if out is not None:
                out.discard()
            raise
        finally:
            cache.close()
    _report(args, grid, summary, err)
    return EXIT_FAILED if summary.failed else EXIT_OK


def _target_files(targets) -> list:
    """The files the targets read (programs, manifests' folders' files, data images)."""
    out = []
    for t in targets:
        for p in (getattr(t, "path", None), getattr(t, "host", None), getattr(t, "weights", None)):
            if p and Path(p).is_file():
                out.append(p)
        if getattr(t, "path", None) and Path(t.path).is_dir():
            out.extend(q for q in Path(t.path).iterdir() if q.is_file())
        elif getattr(t, "path", None) and Path(t.path).name == "test.toml":
            out.extend(q for q in Path(t.path).parent.iterdir() if q.is_file())
    return out


def _report(args, grid, summary, err) -> None:
    from rich.console import Console

    from .report import (geometric_mean, means_table, read_rows, relative, rich_table,
                         save_figure, terminal_plot, weighted_mean)
    console = Console(highlight=False)
    axes = [a.name for a in grid.axes]
    rows = read_rows(args.output)
    if not args.no_table:
        console.print(rich_table(rows, axes))
    rel = relative(rows, axes)
    mean = weighted_mean(rel, axes)
    geo = geometric_mean(rel, axes)
    if not args.no_table and rel:
        text = terminal_plot(rel, mean, axes)
        if text:
            console.print(text, markup=False, highlight=False)
        if mean:
            console.print(means_table(mean, geo, axes))
    for path in args.plot:
        try:
            save_figure(rel, mean, axes, path, geo=geo)
        except (OSError, ValueError) as e:
            from .grid import SweepError
            raise SweepError(f"{path}: cannot write the plot: {e}") from None
        err.print(f"plot: {path}")
    statuses = ", ".join(f"{n} {s}" for s, n in sorted(summary.by_status.items()))
    for row in summary.failures[:10]:
        where = ", ".join(f"{a}={row.get(a)}" for a in axes)
        err.print(f"[{'yellow' if row.get('status') == 'skipped' else 'red'}]"
                  f"{row.get('status')}[/] {row.get('target')} ({where}): {row.get('error')}",
                  highlight=False, markup=True)
    err.print(f"{summary.total:,} points ({summary.cached:,} from the cache): {statuses}; "
              f"results in {args.output}", highlight=False)


if __name__ == "__main__":
    from ..command import exit_with
    exit_with(main)

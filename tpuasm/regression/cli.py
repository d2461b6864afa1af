"""`tpuasm test`: discover manifests, run them in parallel, report.

Exit status: 0 every program passed, 1 some failed, 2 usage or manifest errors.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from ..cli import parse_arguments, positive_int
from ..environment import raw
from .manifest import Manifest, ManifestError, discover, load_manifest

from ..command import EXIT_FAILED, EXIT_OK, EXIT_USAGE


class KeywordError(ValueError):
    pass


def keyword_matcher(expr: str):
    """A pytest-style -k expression: words, and, or, not, parentheses.

    A word matches when it is a case-insensitive substring of the program's name,
    its directory path or one of its tags.
    """
    tokens = re.findall(r"\(|\)|[^\s()]+", expr)
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else None

    def take():
        nonlocal pos
        pos += 1
        return tokens[pos - 1]

    def parse_or():
        terms = [parse_and()]
        while peek() == "or":
            take()
            terms.append(parse_and())
        return lambda s: any(t(s) for t in terms)

    def parse_and():
        terms = [parse_not()]
        while peek() == "and":
            take()
            terms.append(parse_not())
        return lambda s: all(t(s) for t in terms)

    def parse_not():
        tok = peek()
        if tok is None:
            raise KeywordError(f"-k {expr!r}: unexpected end of expression")
        if tok == "not":
            take()
            inner = parse_not()
            return lambda s: not inner(s)
        if tok == "(":
            take()
            inner = parse_or()
            if peek() != ")":
                raise KeywordError(f"-k {expr!r}: missing ')'")
            take()
            return inner
        if tok in (")", "and", "or"):
            raise KeywordError(f"-k {expr!r}: unexpected {tok!r}")
        word = take().lower()
        return lambda s: word in s

    if not tokens:
        raise KeywordError("-k: empty expression")
    matcher = parse_or()
    if pos != len(tokens):
        raise KeywordError(f"-k {expr!r}: unexpected {tokens[pos]!r}")
    return lambda m: matcher(_keywords(m))


def _keywords(m: Manifest) -> str:
    return " ".join([m.name, str(m.directory), *m.tags]).lower()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm test",
        description="Run regression programs described by test.toml manifests (spec/regression.md).")
    p.add_argument("paths", nargs="*", type=Path,
                   help="manifests or directories to search (default: programs/)")
    p.add_argument("-k", dest="keyword", metavar="EXPR",
                   help="only programs matching EXPR (words, and, or, not, parentheses)")
    p.add_argument("-j", "--jobs", type=positive_int, default=os.cpu_count() or 1, metavar="N",
                   help="parallel processes (default: all cores)")
    p.add_argument("--junit-xml", type=Path, metavar="FILE", help="also write a JUnit XML report")
    p.add_argument("--update-golden", action="store_true",
                   help="record measured cycles and counters in each manifest's [golden] table")
    p.add_argument("--keep-data", action="store_true",
                   help="generate data into each program's data/ directory and keep it")
    p.add_argument("--list", action="store_true", help="list the selected programs and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--scheduler", metavar="ADDR",
                   help="run the programs on this Dask cluster (the sweep's executor; "
                        "also $TPUASM_SCHEDULER) instead of local processes")
    return p


def main(argv: list[str] | None = None) -> int:
    args, code = parse_arguments(build_parser(), argv)
    if args is None:
        return code
    from rich.console import Console
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)

    try:
        manifests = select(args.paths or [Path("programs")], args.keyword)
    except (ManifestError, KeywordError) as e:
        err.print(f"[red]error:[/] {e}", markup=True, highlight=False)
        return EXIT_USAGE
    if not manifests:
        err.print("error: no test.toml manifests selected")
        return EXIT_USAGE
    from ..errors import TpuasmError
    from ..files import atomic_write, check_outputs
    try:                 # before anything runs: a bad report path must not cost a whole run
        check_outputs({"--junit-xml": args.junit_xml}, [m.path for m in manifests])
    except TpuasmError as e:
        err.print(f"error: {e}", markup=False)
        return EXIT_USAGE
    if args.list:
        for m in manifests:
            out.print(f"{m.name}  {m.path}", markup=False)
        return EXIT_OK

    started = time.perf_counter()
    try:
        results = run_all(manifests, jobs=args.jobs, check_golden=not args.update_golden,
                          keep_data=args.keep_data, console=err, progress=not args.quiet,
                          scheduler=args.scheduler or raw("TPUASM_SCHEDULER"))
    except ManifestError as e:            # the cluster could not be reached
        err.print(f"[red]error:[/] {e}", markup=True, highlight=False)
        return EXIT_USAGE
    seconds = time.perf_counter() - started

    from .report import failure_text, junit_xml, summary_table, totals_line
    for r in results:
        if not r.passed:
            out.print(failure_text(r), markup=False, highlight=False, soft_wrap=True)
            out.print()
    out.print(summary_table(results))
    out.print(totals_line(results, seconds), markup=False)
    if args.update_golden:
        _update_golden(manifests, results, out)
    if args.junit_xml:
        try:
            atomic_write(args.junit_xml, junit_xml(results, seconds))
        except TpuasmError as e:
            err.print(f"error: {e}", markup=False)
            return EXIT_USAGE
    return EXIT_OK if all(r.passed for r in results) else EXIT_FAILED


def select(paths, keyword: str | None) -> list[Manifest]:
    """Load every manifest under `paths` (all errors at once), then filter by -k."""
    manifests, errors = [], []
    for path in discover(paths):
        try:
            manifests.append(load_manifest(path))
        except ManifestError as e:
            errors.append(str(e))
    if errors:
        raise ManifestError("manifests", None, "\n  " + "\n  ".join(errors))
    names = {}
    for m in manifests:
        if m.name in names:
            raise ManifestError(m.path, "test.name", f"{m.name!r} is also the name of {names[m.name]}")
        names[m.name] = m.path
    if keyword:
        match = keyword_matcher(keyword)
        manifests = [m for m in manifests if match(m)]
    return manifests


def _work(manifest: Manifest, check_golden: bool, keep_data: bool):
    from .runner import run_manifest
    return run_manifest(manifest, check_golden=check_golden,
                        keep_data=manifest.directory / "data" if keep_data else None)


def _expected_cost(m: Manifest) -> int:
    """Long programs first, so a parallel run does not end waiting on one of them."""
    return m.golden.cycles if m.golden and m.golden.cycles else 0


def run_all(manifests, *, jobs: int, check_golden=True, keep_data=False, console=None,
            progress=True, scheduler: str | None = None):
    """Results in the manifests' order."""
    order = sorted(range(len(manifests)), key=lambda i: -_expected_cost(manifests[i]))
    results = [None] * len(manifests)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    show = progress and console is not None and console.is_terminal
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=console, transient=True, disable=not show)
    with bar:
        task = bar.add_task("running", total=len(manifests))

        def done(i, r):
            results[i] = r
            bar.update(task, advance=1, description=f"{r.name}: {r.outcome}")
            if not show and console is not None and progress:
                console.print(f"{r.outcome.upper():5} {r.name}", markup=False, highlight=False)

        if scheduler:
            _run_on_dask(manifests, order, scheduler, check_golden, keep_data, done)
        elif jobs == 1 or len(manifests) == 1:
            for i in order:
                bar.update(task, description=f"running {manifests[i].name}")
                done(i, _work(manifests[i], check_golden, keep_data))
        else:
            suspects = _run_pool(manifests, order, min(jobs, len(manifests)), check_golden,
                                 keep_data, done)
            # A worker that dies breaks the whole pool: every program it had not finished
            # is re-run alone, so only the one that kills its worker is an ERROR.
            for i in suspects:
                again = _run_pool(manifests, [i], 1, check_golden, keep_data, done)
                for j in again:
                    from .runner import Result
                    r = Result(manifests[j].name, str(manifests[j].path))
                    r.error("its worker process died while running it (killed by the "
                            "operating system, or code that ended the process)")
                    done(j, r)
    return results


def _run_pool(manifests, order, workers, check_golden, keep_data, done) -> list[int]:
    """Run manifests[i] for i in order on a process pool; the indices whose worker died
    (BrokenProcessPool) are returned, not reported."""
    from concurrent.futures.process import BrokenProcessPool
    broken = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_work, manifests[i], check_golden, keep_data): i for i in order}
        for f in as_completed(futures):
            i = futures[f]
            try:
                r = f.result()
            except BrokenProcessPool:
                broken.append(i)
                continue
            except Exception as e:      # the result could not come back (pickling, ...)
                from .runner import Result
                r = Result(manifests[i].name, str(manifests[i].path))
                r.error(f"worker process failed: {type(e).__name__}: {e}")
            done(i, r)
    return sorted(broken, key=order.index)

def _run_on_dask(manifests, order, scheduler, check_golden, keep_data, done) -> None:
    """The same work on a Dask cluster (tpuasm.sweep's executor); a lost worker is an
    error Result for its program, the others complete."""
    from dask.distributed import as_completed

    from ..cluster import ClusterError, dask_client
    try:
        with dask_client(scheduler) as client:
            futures = {client.submit(_work, manifests[i], check_golden, keep_data,
                                     pure=False): i for i in order}
            for f in as_completed(futures):
                i = futures[f]
                try:
                    r = f.result()
                except Exception as e:
                    from .runner import Result
                    r = Result(manifests[i].name, str(manifests[i].path))
                    r.error(f"Dask worker failed: {type(e).__name__}: {e}")
                done(i, r)
    except ClusterError as e:
        raise ManifestError("--scheduler", None, str(e)) from None


def _update_golden(manifests, results, console) -> None:
    """Record cycles and counters of every program that passed its other expectations
    and is expected to halt
    (the golden check is off during --update-golden); a failing program keeps its old
    values, since its timing is not one to trust."""
    from .golden import update_manifest
    from .runner import golden_values
    changed = skipped = 0
    for m, r in zip(manifests, results):
        values = golden_values(r)
        if values is None or m.fault is not None:   # when a fault strikes is not a figure
            continue
        if not r.passed:
            skipped += 1
            continue
        if update_manifest(m.path, r.cycles, values):
            changed += 1
    note = f", {skipped} failing program(s) left alone" if skipped else ""
    console.print(f"--update-golden: rewrote {changed} manifest(s){note}", markup=False)


if __name__ == "__main__":
    sys.exit(main())

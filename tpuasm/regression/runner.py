"""Run one manifest: generate data, assemble, run the machine, check expectations.

`run_manifest` never raises: whatever goes wrong becomes a Result whose `failures`
say why, so a parallel run always gets one Result per manifest.  The assembler and
the machine are imported only here, inside the worker that runs a program.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..binary import SYMBOL_KINDS
from ..errors import TpuasmError
from ..files import load_npy
from ..limits import check_allocation
from .generator_process import DONE
from .manifest import GOLDEN_COUNTERS, Manifest, RowsExpectation

SHAPE_KEYS = ("array_size", "ub_rows", "acc_rows", "fifo_depth", "profile")
MAX_ROWS_SHOWN = 3          # mismatching rows printed in a failure
MAX_COLS_SHOWN = 12         # columns of each mismatching row printed


@dataclass
class Result:
    name: str
    path: str                       # the manifest
    outcome: str = "pass"           # "pass", "fail" or "error" (could not run at all)
    failures: list[str] = field(default_factory=list)
    cycles: int | None = None
    bound: str = ""                 # the manifest's cycle bound, for the summary
    counters: dict[str, int] = field(default_factory=dict)
    status: str | None = None       # machine status, or "assembly_error"
    fault: str | None = None        # str(MachineFault) when one happened
    wall: float = 0.0               # seconds, generation + assembly + run + checks

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def fail(self, message: str) -> None:
        self.failures.append(message)
        if self.outcome == "pass":
            self.outcome = "fail"

    def error(self, message: str) -> None:
        self.failures.append(message)
        self.outcome = "error"


class _Stop(Exception):
    """Ends a run early (the reason is already recorded in the Result)."""


def run_manifest(manifest: Manifest, *, check_golden: bool = True,
                 keep_data: Path | None = None) -> Result:
    """Run one regression program.  `keep_data`: generate into this directory and keep it."""
    result = Result(manifest.name, str(manifest.path))
    result.bound = str(manifest.cycles) if manifest.cycles is not None else ""
    start = time.perf_counter()
    tmp = None
    try:
        if keep_data is None and manifest.generator is not None:
            tmp = Path(tempfile.mkdtemp(prefix=f"tpuasm-{manifest.name}-"))
        _run(manifest, result, check_golden, keep_data or tmp)
    except _Stop:
        pass
    except Exception as e:           # a bug somewhere: report it, keep the other tests going
        result.error(f"internal error: {type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        result.wall = time.perf_counter() - start
    return result


def _run(m: Manifest, result: Result, check_golden: bool, data_dir: Path | None) -> None:
    shape = {k: v for k, v in m.machine.items() if k in SHAPE_KEYS}
    overrides = {k: v for k, v in m.machine.items() if k not in SHAPE_KEYS}

    program = _assemble(m, result, shape)
    if program is None:
        return
    if m.generator is not None:
        try:
            generate(m.generator, data_dir)
        except GeneratorError as e:      # the generator's own bug: show what it printed
            result.error(f"{m.generator}: the data generator failed: {e}")
            raise _Stop from None
    try:
        host, weights = _data_images(m, program, data_dir, result)
    except TpuasmError as e:             # a zero image too large for this machine
        result.error(f"{m.path}: data: {e}")
        raise _Stop from None

    from ..machine import Machine
    try:
        machine = Machine.for_program(program, **overrides)
    except (TypeError, ValueError, TpuasmError) as e:
        result.error(f"{m.path}: machine: bad configuration override: {e}")
        raise _Stop from None
    try:
        machine.load(program, host=host, weights=weights)
    except TpuasmError as e:             # a bad or oversized data image
        result.error(f"cannot load the data images: {e}")
        raise _Stop from None
    run = machine.run(max_cycles=m.max_cycles)

    counters = dict(machine.counters())
    result.counters = {k: _plain(v) for k, v in counters.items()}
    result.cycles = int(counters.get("cycles", machine.cycle))
    result.status = run.status
    if run.fault is not None:
        result.fault = str(run.fault)
    _check_run(m, result, program, machine, run, data_dir, check_golden)


def _plain(v):
    """numpy scalars -> Python numbers, so results pickle and print cleanly."""
    return v.item() if hasattr(v, "item") else v


# ---------------------------------------------------------------- assembly

def _assemble(m: Manifest, result: Result, shape: dict):
    from ..assembler import assemble_file
    from ..errors import AssemblyError
    try:
        program = assemble_file(m.program, config=shape or None)
    except AssemblyError as e:       # bad [machine] shape values are reported here too
        result.status = "assembly_error"
        _check_assembly_error(m, result, e)
        return None
    if m.assembly_error is not None:
        want = m.assembly_error
        result.fail(f"expected an assembly error containing {want.message!r}"
                    f"{_at_line(want.line)}, but {m.program.name} assembled "
                    f"({len(program)} instructions)")
        return None
    return program


def _at_line(line) -> str:
    return f" at line {line}" if line is not None else ""


def _check_assembly_error(m: Manifest, result: Result, error) -> None:
    want = m.assembly_error
    text = error.render(color=False)
    if want is None:
        result.fail(f"{m.program.name} did not assemble:\n{text}")
        return
    for d in error.diagnostics:
        if (want.message.lower() in d.message.lower()
                and (want.line is None or d.line == want.line)
                and (want.col is None or d.col == want.col)
                and (want.file is None or Path(d.file).name == want.file)):
            return
    where = "" if want.file is None else f" in {want.file}"
    if want.line is not None:
        where += f" at line {want.line}" + ("" if want.col is None else f", column {want.col}")
    result.fail(f"expected an assembly error containing {want.message!r}{where}; got:\n{text}")


# ---------------------------------------------------------------- data

GENERATOR_TIMEOUT = 600          # seconds


class GeneratorError(Exception):
    """A data generator that did not return normally; the message says how it ended."""


def generate(generator: Path, out_dir: Path, timeout: float = GENERATOR_TIMEOUT) -> None:
    """Run a program's gen.py in a child process (generator_process.py): its
    `generate(out_dir)` writes the .npy images.  A generator is the user's code, and one
    that calls sys.exit or os._exit, or crashes the interpreter, must cost its own
    program (an ERROR with the reason) and nothing else: not the runner, not a worker
    that other programs share.  GeneratorError (with the end of what it printed) unless
    generate() returned."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run([sys.executable, "-m", "tpuasm.regression.generator_process",
                               str(generator), str(out_dir)],
                              capture_output=True, text=True, errors="replace",
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GeneratorError(f"did not finish within {timeout:.0f} s") from None
    if proc.returncode == 0 and proc.stdout.rstrip().endswith(DONE):
        return
    tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
    last = tail.splitlines()[-1] if tail else ""
    if proc.returncode < 0:
        why = f"its process was killed by signal {-proc.returncode}"
    elif proc.returncode == 0:
        why = "its process ended (exit status 0) before generate() returned (os._exit?)"
    else:
        why = last or f"its process ended with exit status {proc.returncode}"
    raise GeneratorError(why + (f"\n{tail}" if tail and tail != why else ""))


def _data_path(m: Manifest, name: str, data_dir: Path | None) -> Path:
    """Data files come from the generator's output when there is one, else sit next to
    the manifest."""
    return (data_dir if m.generator is not None else m.directory) / name


def _data_images(m: Manifest, program, data_dir, result: Result):
    n = program.shape.array_size
    host = weights = None
    if m.host is not None:
        host = _existing(m, _data_path(m, m.host, data_dir), "data.host", result)
    elif m.host_rows is not None:
        check_allocation(f"data.host_rows = {m.host_rows:,} (a host image of "
                         f"{m.host_rows:,} x {n} bytes)", m.host_rows * n)
        host = np.zeros((m.host_rows, n), dtype=np.int8)
    elif m.generator is not None and (data_dir / "host.npy").is_file():
        host = data_dir / "host.npy"
    if m.weights is not None:
        weights = _existing(m, _data_path(m, m.weights, data_dir), "data.weights", result)
    elif m.weight_tiles is not None:
        check_allocation(f"data.weight_tiles = {m.weight_tiles:,} (weights of "
                         f"{m.weight_tiles:,} x {n} x {n} bytes)", m.weight_tiles * n * n)
        weights = np.zeros((m.weight_tiles, n, n), dtype=np.int8)
    elif m.generator is not None and (data_dir / "weights.npy").is_file():
        weights = data_dir / "weights.npy"
    return host, weights


def _existing(m: Manifest, path: Path, key: str, result: Result) -> Path:
    if not path.is_file():
        result.error(f"{m.path}: {key}: file not found: {path}")
        raise _Stop
    return path


# ---------------------------------------------------------------- checks

def _check_run(m: Manifest, result: Result, program, machine, run, data_dir, check_golden):
    if m.status == "halted" and run.status != "halted":
        what = f"faulted: {run.fault}" if run.fault is not None else f"stopped with status {run.status!r}"
        result.fail(f"expected the program to halt, but it {what}")
    elif m.status == "fault":
        _check_fault(m, result, program, run)

    if m.cycles is not None and not m.cycles.contains(result.cycles):
        result.fail(f"cycles {result.cycles:,} outside the bound {m.cycles}")
    for name, bound in m.counters.items():
        if name not in result.counters:
            result.fail(f"counter {name!r} does not exist (the machine has: "
                        f"{', '.join(sorted(result.counters))})")
        elif not bound.contains(result.counters[name]):
            result.fail(f"counter {name} = {result.counters[name]:,} outside the bound {bound}")
    for rows in m.rows:
        _check_rows(m, result, program, machine, rows, data_dir)
    if check_golden and m.golden is not None:
        _check_golden(m, result)


def _fault_line(program, index):
    if index is None or not 0 <= index < len(program.locations):
        return None
    loc = program.locations[index]
    return loc.line if loc is not None else None


def _check_fault(m: Manifest, result: Result, program, run) -> None:
    want, got = m.fault, run.fault
    if got is None:
        result.fail(f"expected a {want.kind} fault, but the program ended with status {run.status!r}")
        return
    problems = []
    if got.kind != want.kind:
        problems.append(f"kind {got.kind!r} instead of {want.kind!r}")
    if want.message is not None and want.message.lower() not in got.message.lower():
        problems.append(f"message does not contain {want.message!r}")
    if want.index is not None and got.index != want.index:
        problems.append(f"instruction {got.index} instead of {want.index}")
    line = _fault_line(program, got.index)
    if want.line is not None and line != want.line:
        problems.append(f"line {line} instead of {want.line}")
    if problems:
        result.fail("wrong fault (" + "; ".join(problems) + f"):\n  {got}")


def _memory(machine, name: str):
    return {"host": machine.host, "ub": machine.ub, "acc": machine.acc}[name]


def _region_start(program, rows: RowsExpectation) -> tuple[int | None, str | None]:
    """The first row of a region given by symbol, "y" or "host.y" style, and what is wrong
    with it if it cannot be used: (start, None) or (None, problem)."""
    prefix, dot, _ = rows.region.partition(".")
    if dot and prefix in SYMBOL_KINDS:
        if prefix != rows.memory:
            return None, (f"region {rows.region!r} is a {prefix} symbol but the rows are "
                          f"compared in memory {rows.memory!r}")
        sym = program.symbol(rows.region)
    else:
        sym = program.symbol(rows.region, rows.memory)
    if sym is None:
        return None, f"the program has no {rows.memory} region {rows.region!r}"
    return sym.value, None


def _check_rows(m: Manifest, result: Result, program, machine, rows: RowsExpectation, data_dir):
    path = _data_path(m, rows.expected, data_dir)
    if not path.is_file():
        result.error(f"{m.path}: {rows.key}.expected: file not found: {path}")
        return
    try:
        expected = load_npy(path, what="expected array")
    except TpuasmError as e:
        result.error(f"{m.path}: {rows.key}.expected: {e}")
        return
    if rows.start is not None:
        start, label = rows.start, f"{rows.memory} rows"
    else:
        start, problem = _region_start(program, rows)
        if problem is not None:
            result.error(f"{m.path}: {rows.key}.region: {problem}")
            return
        label = f"{rows.memory} region {rows.region}"
    memory = _memory(machine, rows.memory)
    if expected.ndim == 1:
        expected = expected[None, :]
    if expected.ndim != 2 or expected.shape[1] != memory.shape[1]:
        result.error(f"{path.name}: expected shape (rows, {memory.shape[1]}), found {expected.shape}")
        return
    stop = start + expected.shape[0]
    if stop > memory.shape[0]:
        result.fail(f"{label}: expected rows {start}..{stop - 1} but {rows.memory} memory has "
                    f"{memory.shape[0]} rows")
        return
    actual = memory[start:stop]
    if expected.dtype.itemsize == actual.dtype.itemsize and expected.dtype != actual.dtype:
        actual = actual.view(expected.dtype)       # reinterpret bytes as the expected type
    text = compare_rows(expected, actual, rows.tolerance, first_row=start)
    if text:
        result.fail(f"{label} (rows {start}..{stop - 1}) differ from {rows.expected}: {text}")


def compare_rows(expected: np.ndarray, actual: np.ndarray, tolerance: int, first_row: int = 0) -> str:
    """'' when equal within tolerance, else a report of the first mismatching rows."""
    diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    bad = diff > tolerance
    count = int(bad.sum())
    if not count:
        return ""
    lines = [f"{count:,} of {bad.size:,} elements differ, max |difference| {int(diff.max())} "
             f"(tolerance {tolerance})"]
    bad_rows = np.flatnonzero(bad.any(axis=1))
    lines.append(f"{len(bad_rows):,} mismatching rows; the first {min(len(bad_rows), MAX_ROWS_SHOWN)}:")
    for r in bad_rows[:MAX_ROWS_SHOWN]:
        cols = np.flatnonzero(bad[r])
        c0 = int(cols[0])
        c1 = min(c0 + MAX_COLS_SHOWN, expected.shape[1])
        lines.append(f"  row {first_row + r} (+{r}): {len(cols)} columns differ, "
                     f"columns {c0}..{c1 - 1} shown")
        lines.append("    column   " + " ".join(f"{c:>6}" for c in range(c0, c1)))
        lines.append("    expected " + " ".join(f"{int(v):>6}" for v in expected[r, c0:c1]))
        lines.append("    actual   " + " ".join(f"{int(v):>6}" for v in actual[r, c0:c1]))
        marks = ("     ^" if bad[r, c] else "      " for c in range(c0, c1))
        lines.append("             " + " ".join(marks))
    return "\n".join(lines)


def _check_golden(m: Manifest, result: Result) -> None:
    g = m.golden
    if g.cycles is None or result.cycles is None:
        return
    slack = g.tolerance * g.cycles
    if abs(result.cycles - g.cycles) > slack:
        result.fail(f"cycles {result.cycles:,} differ from the recorded {g.cycles:,} by more than "
                    f"{g.tolerance:.1%} (if the timing change is intended: tpuasm test "
                    f"--update-golden)")
    for name, recorded in g.counters.items():
        now = result.counters.get(name)
        if now is not None and abs(now - recorded) > slack:
            result.fail(f"counter {name} = {now:,} differs from the recorded {recorded:,} by more "
                        f"than {g.tolerance:.1%} of the recorded cycles")


def golden_values(result: Result) -> dict[str, int] | None:
    """What --update-golden records for a finished run (None: nothing to record)."""
    if result.cycles is None:
        return None
    return {k: int(result.counters[k]) for k in GOLDEN_COUNTERS if k in result.counters}

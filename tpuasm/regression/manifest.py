"""Regression manifests (`test.toml`): parsing, validation and discovery.

The format is documented in spec/regression.md.  Parsing is strict: an unknown key
or a value of the wrong type is a ManifestError naming the file and the key, so a
typo never silently turns an expectation off.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FAULT_KINDS
from ..limits import MAX_CYCLES

MANIFEST_NAME = "test.toml"
DEFAULT_MAX_CYCLES = 20_000_000
DEFAULT_GOLDEN_TOLERANCE = 0.02
MEMORIES = ("host", "ub", "acc")
STATUSES = ("halted", "fault")
# Counters that --update-golden records (the paper's Table 3 rows and friends).
GOLDEN_COUNTERS = ("instructions", "array_active_cycles", "weight_stall_cycles",
                   "weight_shift_cycles", "non_matrix_cycles", "raw_stall_cycles",
                   "input_stall_cycles")


class ManifestError(Exception):
    """A manifest that cannot be used; the message names the file and the key."""

    def __init__(self, path, key: str | None, message: str):
        self.path, self.key = Path(path), key
        where = f"{path}: {key}: " if key else f"{path}: "
        super().__init__(where + message)


@dataclass(frozen=True)
class Bound:
    """An inclusive range; either side may be open."""
    min: float | None = None
    max: float | None = None

    def contains(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def __str__(self):
        if self.min is not None and self.min == self.max:
            return f"== {self.min:,}"
        lo = "-inf" if self.min is None else f"{self.min:,}"
        hi = "inf" if self.max is None else f"{self.max:,}"
        return f"[{lo}, {hi}]"


@dataclass(frozen=True)
class RowsExpectation:
    """Rows of a memory after the run must equal an expected array (within tolerance)."""
    expected: str                 # .npy file: in the generator's output, else next to the manifest
    memory: str = "host"
    region: str | None = None     # a program symbol (e.g. "y" or "host.y") giving the start row
    start: int | None = None      # or an explicit first row
    tolerance: int = 0            # max |difference|, in the expected array's element values
    key: str = ""                 # "expect.rows[2]", for messages


@dataclass(frozen=True)
class FaultExpectation:
    kind: str
    message: str | None = None    # substring of the fault message
    index: int | None = None      # instruction index
    line: int | None = None       # source line of the faulting instruction


@dataclass(frozen=True)
class AssemblyErrorExpectation:
    message: str                  # substring of one diagnostic's message
    line: int | None = None
    col: int | None = None
    file: str | None = None       # the diagnostic's file name (default: any file)


@dataclass(frozen=True)
class Golden:
    """Recorded measurements (written by --update-golden, never hand-derived data)."""
    cycles: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    tolerance: float = DEFAULT_GOLDEN_TOLERANCE   # relative to the recorded cycle count


@dataclass(frozen=True)
class Manifest:
    path: Path                    # the test.toml
    name: str
    program: Path
    description: str = ""
    tags: tuple[str, ...] = ()
    max_cycles: int = DEFAULT_MAX_CYCLES
    machine: dict[str, Any] = field(default_factory=dict)
    generator: Path | None = None
    host: str | None = None       # data file names (see RowsExpectation.expected)
    weights: str | None = None
    host_rows: int | None = None  # or a zero image of this many rows / tiles
    weight_tiles: int | None = None
    status: str = "halted"
    cycles: Bound | None = None
    counters: dict[str, Bound] = field(default_factory=dict)
    rows: tuple[RowsExpectation, ...] = ()
    fault: FaultExpectation | None = None
    assembly_error: AssemblyErrorExpectation | None = None
    golden: Golden | None = None

    @property
    def directory(self) -> Path:
        return self.path.parent


# ---------------------------------------------------------------- parsing helpers

class _Table:
    """A TOML table being consumed: every key must be read, leftovers are errors."""

    def __init__(self, path: Path, prefix: str, data: Any):
        self.path, self.prefix = path, prefix
        if not isinstance(data, dict):
            self.fail(None, f"must be a table, not {_type_name(data)}")
        self.data = dict(data)

    def key(self, name: str | None) -> str:
        if name is None:
            return self.prefix or "(top level)"
        return f"{self.prefix}.{name}" if self.prefix else name

    def fail(self, name: str | None, message: str):
        raise ManifestError(self.path, self.key(name), message)

    def get(self, name: str, types, default=None, required=False):
        if name not in self.data:
            if required:
                self.fail(name, "is required")
            return default
        value = self.data.pop(name)
        types = types if isinstance(types, tuple) else (types,)
        # bool is an int subclass in Python: never accept it as a number.
        if isinstance(value, bool) and bool not in types:
            self.fail(name, f"must be {_names(types)}, not a boolean")
        if not isinstance(value, types):
            self.fail(name, f"must be {_names(types)}, not {_type_name(value)}")
        return value

    def get_int(self, name: str, default=None, required=False, minimum=None, maximum=None):
        value = self.get(name, int, default, required)
        if value is not None and minimum is not None and value < minimum:
            self.fail(name, f"must be >= {minimum}, not {value}")
        if value is not None and maximum is not None and value > maximum:
            self.fail(name, f"must be <= {maximum:,}, not {value:,}")
        return value

    def get_choice(self, name: str, choices, default=None, required=False):
        value = self.get(name, str, default, required)
        if value is not None and value not in choices:
            self.fail(name, f"must be one of {', '.join(choices)}, not {value!r}")
        return value

    def sub(self, name: str) -> "_Table | None":
        if name not in self.data:
            return None
        return _Table(self.path, self.key(name), self.data.pop(name))

    def done(self):
        for name in self.data:
            self.fail(name, "unknown key")


def _type_name(value) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a float"}.get(type(value), type(value).__name__)


def _names(types) -> str:
    words = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "an array", dict: "a table"}
    return " or ".join(words.get(t, t.__name__) for t in types)


def _bound(table: _Table, name: str) -> Bound | None:
    """`name = 123` (exact) or `name = {min = .., max = ..}`."""
    if name not in table.data:
        return None
    value = table.data[name]
    if isinstance(value, dict):
        t = _Table(table.path, table.key(name), table.data.pop(name))
        lo = t.get("min", (int, float))
        hi = t.get("max", (int, float))
        t.done()
        if lo is None and hi is None:
            table.fail(name, "needs min, max or both")
        if lo is not None and hi is not None and lo > hi:
            table.fail(name, f"min {lo} is greater than max {hi}")
        return Bound(lo, hi)
    exact = table.get(name, (int, float))
    return Bound(exact, exact)


def _limit(kind: str) -> int:
    from ..isa import ISA_TABLE
    return ISA_TABLE.kind_limit(kind)


# ---------------------------------------------------------------- the loader

def load_manifest(path) -> Manifest:
    """Parse and validate one test.toml; ManifestError on anything wrong."""
    from ..errors import InputFileError
    from ..files import read_input
    from ..limits import MAX_MANIFEST_BYTES
    path = Path(path)
    try:
        text = read_input(path, what="manifest", limit=MAX_MANIFEST_BYTES).decode("utf-8")
    except InputFileError as e:
        raise ManifestError(path, None, str(e).removeprefix(f"{path}: ")) from None
    except UnicodeDecodeError:
        raise ManifestError(path, None, "is not valid UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(path, None, f"invalid TOML: {e}") from None
    return parse_manifest(path, data)


def parse_manifest(path: Path, data: dict) -> Manifest:
    path = Path(path)
    top = _Table(path, "", data)
    base = path.parent
    out: dict[str, Any] = {}

    test = top.sub("test") or top.fail("test", "is required (a [test] table naming the program)")
    out["name"] = test.get("name", str, default=base.name)
    program = test.get("program", str, required=True)
    out["program"] = base / program
    out["description"] = test.get("description", str, default="")
    tags = test.get("tags", list, default=[])
    if not all(isinstance(t, str) for t in tags):
        test.fail("tags", "must be an array of strings")
    out["tags"] = tuple(tags)
    out["max_cycles"] = test.get_int("max_cycles", default=DEFAULT_MAX_CYCLES, minimum=1,
                                     maximum=MAX_CYCLES)
    test.done()

    machine = top.sub("machine")
    if machine is not None:
        out["machine"] = dict(machine.data)
        machine.data.clear()

    data_t = top.sub("data")
    if data_t is not None:
        gen = data_t.get("generator", str)
        out["generator"] = base / gen if gen else None
        out["host"] = data_t.get("host", str)
        out["weights"] = data_t.get("weights", str)
        # no more rows / tiles than an instruction can address (memory: checked when run)
        out["host_rows"] = data_t.get_int("host_rows", minimum=1, maximum=_limit("host"))
        out["weight_tiles"] = data_t.get_int("weight_tiles", minimum=1, maximum=_limit("tile"))
        if out["host"] and out["host_rows"]:
            data_t.fail("host_rows", "cannot be combined with data.host")
        if out["weights"] and out["weight_tiles"]:
            data_t.fail("weight_tiles", "cannot be combined with data.weights")
        data_t.done()

    expect = top.sub("expect")
    if expect is not None:
        _parse_expect(expect, out)

    golden = top.sub("golden")
    if golden is not None:
        cycles = golden.get_int("cycles", minimum=0)
        tolerance = golden.get("tolerance", (int, float), default=DEFAULT_GOLDEN_TOLERANCE)
        if tolerance < 0:
            golden.fail("tolerance", f"must be >= 0, not {tolerance}")
        counters_t = golden.sub("counters")
        counters = {}
        if counters_t is not None:
            for name in list(counters_t.data):
                counters[name] = counters_t.get_int(name, minimum=0)
        golden.done()
        out["golden"] = Golden(cycles, counters, float(tolerance))
    top.done()

    m = Manifest(path=path, **out)
    _check_consistency(m, path)
    return m


def _parse_expect(expect: _Table, out: dict) -> None:
    status = expect.get_choice("status", STATUSES)
    out["cycles"] = _bound(expect, "cycles")
    counters_t = expect.sub("counters")
    if counters_t is not None:
        out["counters"] = {name: _bound(counters_t, name) for name in list(counters_t.data)}
    rows = expect.get("rows", list, default=[])
    parsed = []
    for i, item in enumerate(rows):
        t = _Table(expect.path, f"expect.rows[{i}]", item)
        r = RowsExpectation(
            expected=t.get("expected", str, required=True),
            memory=t.get_choice("memory", MEMORIES, default="host"),
            region=t.get("region", str),
            start=t.get_int("start", minimum=0),
            tolerance=t.get_int("tolerance", default=0, minimum=0),
            key=t.key(None))
        if (r.region is None) == (r.start is None):
            t.fail(None, "needs exactly one of region or start")
        t.done()
        parsed.append(r)
    out["rows"] = tuple(parsed)
    fault = expect.sub("fault")
    if fault is not None:
        out["fault"] = FaultExpectation(
            kind=fault.get_choice("kind", FAULT_KINDS, required=True),
            message=fault.get("message", str),
            index=fault.get_int("index", minimum=0),
            line=fault.get_int("line", minimum=1))
        fault.done()
    # An [expect.fault] table implies status = "fault" unless the status says otherwise.
    out["status"] = status or ("fault" if "fault" in out else "halted")
    asm = expect.sub("assembly_error")
    if asm is not None:
        out["assembly_error"] = AssemblyErrorExpectation(
            message=asm.get("message", str, required=True),
            line=asm.get_int("line", minimum=1),
            col=asm.get_int("col", minimum=1),
            file=asm.get("file", str))
        asm.done()
    expect.done()


def _check_consistency(m: Manifest, path: Path) -> None:
    if m.fault is not None and m.assembly_error is not None:
        raise ManifestError(path, "expect", "cannot expect both a fault and an assembly error")
    if m.assembly_error is not None and (m.rows or m.cycles or m.counters):
        raise ManifestError(path, "expect", "a program expected not to assemble cannot "
                                            "also expect rows, cycles or counters")
    if m.fault is not None and m.status != "fault":
        raise ManifestError(path, "expect.status", 'must be "fault" (or left out) with [expect.fault]')
    if m.status == "fault" and m.fault is None:
        raise ManifestError(path, "expect.status", '"fault" needs an [expect.fault] table')
    if m.generator is not None and not m.generator.is_file():
        raise ManifestError(path, "data.generator", f"file not found: {m.generator}")
    if not m.program.is_file():
        raise ManifestError(path, "test.program", f"file not found: {m.program}")


# ---------------------------------------------------------------- discovery

def discover(paths) -> list[Path]:
    """Every test.toml under the given files or directories, sorted, without duplicates.

    A directory is searched recursively; hidden directories and generated data
    (`data/`, `out/`) are skipped.  A path that does not exist is a ManifestError.
    """
    found: dict[Path, None] = {}
    for p in map(Path, paths):
        if p.is_file():
            if p.name != MANIFEST_NAME:
                raise ManifestError(p, None, f"is not a {MANIFEST_NAME} manifest")
            found[p.resolve()] = None
        elif p.is_dir():
            for m in sorted(p.rglob(MANIFEST_NAME)):
                rel = m.relative_to(p).parts[:-1]
                if any(part.startswith(".") or part in ("data", "out") for part in rel):
                    continue
                found[m.resolve()] = None
        else:
            raise ManifestError(p, None, "no such file or directory")
    return list(found)

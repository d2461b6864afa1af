"""`compare RANGE FILE.npy` and `dump RANGE FILE.npy`: a memory range against an expected
array, and a memory range into a file.  Files go through the library (tpuasm.files): a
.npy is read with its header checked first; a dump is written atomically and never onto
one of the session's inputs.  Nothing here knows about screens."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .expr import ExprError, Location

MISMATCH_LINES = 20        # differences a compare lists (all are counted and highlighted)
# how each memory is shown and saved: the int8 memories signed, like their input images
_VIEW = {"ub": np.int8, "host": np.int8, "acc": np.int32, "tile": np.int8}


@dataclass
class Comparison:
    location: Location              # the first row and column compared
    shape: tuple[int, int]          # rows x columns compared
    mismatches: np.ndarray          # (k, 2) row, column (absolute) of each difference
    actual: np.ndarray
    expected: np.ndarray

    @property
    def total(self) -> int:
        return self.shape[0] * self.shape[1]


def memory_values(session, loc: Location) -> np.ndarray:
    """The whole memory `loc` names, as signed values (ub, host int8; acc int32; a tile)."""
    m = session.machine
    if loc.memory == "tile":
        tiles = 0 if m.weights is None else m.weights.shape[0]
        if not 0 <= loc.row < tiles:
            raise ExprError(f"tile {loc.row} out of range 0..{tiles - 1}")
        return np.asarray(m.tile_values(loc.row)).view(np.int8)
    array = getattr(m, loc.memory, None)
    if array is None or loc.memory not in _VIEW:
        raise ExprError(f"no {loc.memory} memory")
    return array.view(_VIEW[loc.memory])


def _region(session, loc: Location, rows: int, cols: int) -> tuple[np.ndarray, int]:
    """(values rows x cols from `loc`, first row) checked against the memory's bounds."""
    values = memory_values(session, loc)
    first = 0 if loc.memory == "tile" else loc.row
    if values.ndim != 2 or not (0 <= first and first + rows <= values.shape[0]
                                and 0 <= loc.col and loc.col + cols <= values.shape[1]):
        shape = "x".join(str(n) for n in values.shape)
        raise ExprError(f"{loc.memory}: rows {first}..{first + rows - 1}, columns "
                        f"{loc.col}..{loc.col + cols - 1} are outside its {shape}")
    return values[first:first + rows, loc.col:loc.col + cols], first


def load_expected(path: Path) -> np.ndarray:
    from tpuasm.errors import TpuasmError
    from tpuasm.files import load_npy
    try:
        array = load_npy(path, what="expected array")
    except TpuasmError as e:
        raise ExprError(str(e)) from None
    if array.dtype.kind not in "iub" or array.ndim not in (1, 2):
        raise ExprError(f"{path}: expected a 1-D or 2-D integer array, got {array.ndim}-D "
                        f"{array.dtype}")
    return array


def compare(session, loc: Location, path: Path) -> Comparison:
    """The memory from `loc` against the array in `path`: its shape says how many rows and
    columns (a 1-D array: one row from the column `loc` names).  A row range in `loc`
    must agree with the array's rows."""
    expected = load_expected(path)
    if expected.ndim == 1:
        expected = expected.reshape(1, -1)
    rows, cols = expected.shape
    if loc.rows > 1 and loc.rows != rows:
        raise ExprError(f"{path} has {rows} rows but the range has {loc.rows}")
    actual, first = _region(session, loc, rows, cols)
    diff = np.argwhere(actual.astype(np.int64) != expected.astype(np.int64))
    diff[:, 0] += first
    diff[:, 1] += loc.col
    return Comparison(loc, (rows, cols), diff, actual, expected)


def comparison_lines(c: Comparison) -> list[str]:
    name = c.location.memory
    if not len(c.mismatches):
        return [f"{name}: all {c.total} values match"]
    out = [f"{name}: {len(c.mismatches)} of {c.total} values differ"
           + (f" (the first {MISMATCH_LINES}):" if len(c.mismatches) > MISMATCH_LINES else ":")]
    first = 0 if name == "tile" else c.location.row
    for r, col in c.mismatches[:MISMATCH_LINES]:
        got = int(c.actual[r - first, col - c.location.col])
        want = int(c.expected[r - first, col - c.location.col])
        out.append(f"  {name}[{r}][{col}] = {got}, expected {want} ({got - want:+d})")
    return out


def dump(session, loc: Location, path: Path, inputs) -> tuple[int, int]:
    """Write the rows `loc` covers (whole rows from its column on) to `path` as .npy,
    atomically; refused if `path` is one of `inputs`.  Returns the array's shape."""
    from tpuasm.errors import TpuasmError
    from tpuasm.files import atomic_write, check_outputs
    values = memory_values(session, loc)
    rows = loc.rows if loc.memory != "tile" else values.shape[0]
    cols = values.shape[1] - loc.col
    data, _ = _region(session, loc, rows, cols)
    data = np.ascontiguousarray(data)
    try:
        check_outputs([("dump", path)], inputs=inputs)
        atomic_write(path, lambda fh: np.save(fh, data, allow_pickle=False), what="the dump")
    except TpuasmError as e:
        raise ExprError(str(e)) from None
    return data.shape

"""The apps' decoded instruction tables, cached on disk: a sweep point runs without the
assembler.

Why.  The machine runs a program as its decoded int64 table (machine/decoded.py); the
instructions themselves are only needed to describe one (a fault's text and location).
For the apps' large programs assembling dominated every sweep point: CNN1 compiled for a
64 x 64 array is 533,888 instructions, 16-22 s to assemble against 0.7 s to run
timing-only.  So the table is assembled and decoded once per program source and decoder
version and kept next to the compiled program (`table-<compiled key>-<decoder
digest>.npz`: the table as int32 when its values fit, the indices of invalid
instructions and the machine shape), and `table_program` gives the machine a Program
that carries it (`Program._machine_table` with no instruction key:
machine._decoded trusts it).  Its `instructions` and `locations` are lazy sequences that
assemble the source the first time an item is asked for.

The key covers the compiled program (its record's key: model, shape, compiler; the file
sits in the model's folder) and every module that turns source into a table: the
assembler, the encoding, the ISA table and the decoder, so a changed assembler is a new
entry, never a stale one.
"""
from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

import numpy as np

_PACKAGE = Path(__file__).resolve().parent.parent
# what the table of a source depends on (the assembler's imports and the decoder)
_DECODER_SOURCES = ("assembler", "binary.py", "encoding.py", "isa.py", "isa.toml",
                    "literals.py", "limits.py", "grammar.lark", "machine/decoded.py",
                    "machine/machine.py")


@lru_cache(maxsize=1)
def decoder_digest() -> str:
    h = hashlib.sha256()
    for name in _DECODER_SOURCES:
        path = _PACKAGE / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f.relative_to(_PACKAGE).as_posix().encode() + b"\0")
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def table_path(ap, kind: str = "table", suffix: str = ".npz") -> Path:
    """`<kind>-<compiled key>-<decoder digest><suffix>` beside the compiled program."""
    return Path(ap.record).parent / f"{kind}-{ap.key}-{decoder_digest()}{suffix}"


def _prune(path: Path) -> None:
    """Drop tables of the same program made by other decoder versions (other checkouts
    share the cache): all but the newest few, and none written within the last hour."""
    import time

    from ..cache import GRACE_SECONDS, KEEP
    stem = path.name.rsplit("-", 1)[0]
    try:
        others = sorted(path.parent.glob(f"{stem}-*{path.suffix}"),
                        key=lambda p: p.stat().st_mtime, reverse=True)
        for old in others[KEEP:]:
            if old != path and old.stat().st_mtime < time.time() - GRACE_SECONDS:
                old.unlink(missing_ok=True)
    except OSError:
        pass


def derived(ap, kind: str, compute):
    """A number computed from the app's program alone (figure11's Table 8 UB use: 19 s
    over the six apps' access maps), cached beside its table under the same key."""
    path = table_path(ap, kind, ".json")
    try:
        return json.loads(path.read_text())["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    from ..cache import write_file
    try:
        write_file(path, json.dumps({"value": value}))
    except OSError:
        pass
    return value


class _Assembly:
    """The app's source assembled once, when first needed."""

    def __init__(self, ap):
        self._ap = ap
        self._program = None

    def get(self):
        if self._program is None:
            self._program = self._ap.assemble()
        return self._program


class _Lazy(Sequence):
    """A Program's `instructions` or `locations`: the length from the table, the items
    from the assembled source (on first use)."""

    def __init__(self, count: int, assembly: _Assembly, field: str):
        self._count = count
        self._assembly = assembly
        self._field = field

    def __len__(self):
        return self._count

    def __getitem__(self, index):
        return getattr(self._assembly.get(), self._field)[index]


def decoded(ap):
    """(table, invalid indices, MachineShape) of the app's program, from the cache or
    assembled now (and cached)."""
    from ..binary import MachineShape
    path = table_path(ap)
    try:
        with np.load(path, allow_pickle=False) as z:
            shape = MachineShape(**json.loads(str(z["shape"])))
            return z["table"].astype(np.int64), z["invalid"].astype(np.int64), shape
    except (OSError, ValueError, KeyError, TypeError):
        pass                        # absent or unreadable: build it again
    from ..cache import write_file
    from ..machine.machine import _decoded
    program = ap.assemble()
    table, invalid = _decoded(program)
    narrow = table.astype(np.int32)
    stored = narrow if np.array_equal(narrow, table) else table
    buf = io.BytesIO()
    np.savez(buf, table=stored, invalid=invalid,
             shape=np.array(json.dumps(asdict(program.shape))))
    try:
        write_file(path, buf.getvalue())
        _prune(path)
    except OSError:
        pass                        # a read-only cache: it still runs, assembled each time
    return np.array(table), np.array(invalid), program.shape


def table_program(ap):
    """A Program for `ap` carrying its decoded table (see the module's docstring)."""
    from ..binary import Program
    table, invalid, shape = decoded(ap)
    table.flags.writeable = False
    assembly = _Assembly(ap)
    count = len(table)
    program = Program(_Lazy(count, assembly, "instructions"), shape,
                      _Lazy(count, assembly, "locations"))
    program._machine_table = (None, table, invalid)
    return program

"""The six apps as runnable programs for a given machine: source, Program and data images.

The programs come from the compiler, the same path as any user's model: each app's QDQ
ONNX model (onnx_models.py, Table 1 shapes) compiled by `tpuasm.compile` for the machine
shape, its TPU segments joined into one program with the host parts as round trips
(tpuasm/compiler/codegen/whole.py).  There is no second code generator.

Both steps are cached on disk under ~/.cache/tpuasm/apps/ (XDG_CACHE_HOME respected):
the model file by a digest of the model builders' sources, name, seed and batch; each
compiled program by that digest, the machine shape and a digest of the compiler's sources.
A sweep's many configurations of one shape compile once, in any process.

A third cache holds what the machine runs: the program's decoded instruction table
(`AppProgram.program()`), keyed by the source and a digest of the assembler and decoder.
Assembling CNN1's 534k-line program for a 64 x 64 array took 16-22 s, 20-30x its
timing-only run; with the table a sweep point loads it in milliseconds, and the source
is assembled again only if something asks for an instruction's text or location (a
fault's report).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..cache import write_file
from ..limits import MAX_STATEMENTS
from .catalog import PAPER_ORDER, build

SHAPE_FIELDS = ("array_size", "ub_rows", "acc_rows", "fifo_depth")
SEED = 0
_PACKAGE = Path(__file__).resolve().parent.parent


class CodegenError(ValueError):
    """The app cannot be compiled for this machine shape (a sweep reports the point as
    skipped, with this message)."""


def app_names() -> tuple[str, ...]:
    return PAPER_ORDER


def is_app(name: str) -> bool:
    return name.upper() in PAPER_ORDER


@dataclass(frozen=True)
class AppProgram:
    name: str
    host_rows: int
    weight_tiles: int
    array_size: int
    macs: int                 # the network's own MACs per batch (padding not counted)
    segments: int = 1         # TPU segments joined (host parts between them)
    record: str = ""          # the cached compiled program (program-<key>.json)

    @property
    def source(self) -> str:
        """The program's .tasm text, read from its record when asked for (CNN1's are tens
        of MB; a sweep point that runs the cached table never reads it)."""
        return _record_source(self.record)

    @property
    def key(self) -> str:
        """Names the compiled program: its model, shape, compiler (the record's key)."""
        return Path(self.record).stem.removeprefix("program-")

    def assemble(self):
        from ..assembler import assemble
        return assemble(self.source, f"{self.name.lower()}.tasm")

    def program(self):
        """The program to run: a Program carrying its decoded table from the table cache
        (assembled and decoded once per source and decoder version, in any process); its
        instructions and source locations are assembled on first use only."""
        from .tables import table_program
        return table_program(self)

    def data(self):
        """Zero host and weight images (values do not change timing); np.zeros maps
        untouched pages lazily, so CNN1's thousands of tiles cost no memory until read."""
        n = self.array_size
        return (np.zeros((self.host_rows, n), np.int8),
                np.zeros((self.weight_tiles, n, n), np.int8))


@lru_cache(maxsize=32)
def app_program(name: str, array_size: int = 256, ub_rows: int = 98304, acc_rows: int = 4096,
                fifo_depth: int = 4) -> AppProgram:
    """The app's program for this machine shape; CodegenError when it does not fit."""
    app = build(name)
    macs = app.batch * app.macs_per_sample
    shape = dict(array_size=array_size, ub_rows=ub_rows, acc_rows=acc_rows,
                 fifo_depth=fifo_depth)
    key = _compiled_key(shape)
    folder = model_file(app.name).parent
    cached = folder / f"program-{key}.json"
    summary = folder / f"meta-{key}.json"      # the record without its source: read fast
    try:
        meta = json.loads(summary.read_text())
    except (OSError, ValueError):
        try:
            record = json.loads(cached.read_text())
        except (OSError, ValueError):
            record = _compile(app, shape)
            write_file(cached, json.dumps(record))
        meta = {k: v for k, v in record.items() if k != "source"}
        write_file(summary, json.dumps(meta))
    if "error" in meta:
        raise CodegenError(meta["error"])
    return AppProgram(app.name, meta["host_rows"], meta["weight_tiles"], array_size, macs,
                      meta["segments"], str(cached))


@lru_cache(maxsize=2)
def _record_source(path: str) -> str:
    return json.loads(Path(path).read_text())["source"]


def program_key(name: str, array_size: int = 256, ub_rows: int = 98304, acc_rows: int = 4096,
                fifo_depth: int = 4) -> str:
    """Identifies what app_program returns for these arguments without compiling anything:
    the model's and the compiler's sources and the shape.  A sweep's client keys its
    result cache by it, so only the workers that run a point compile."""
    app = build(name)
    shape = dict(array_size=array_size, ub_rows=ub_rows, acc_rows=acc_rows,
                 fifo_depth=fifo_depth)
    parts = ["compiler", _model_key(app), _compiled_key(shape)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def _compiled_key(shape: dict) -> str:
    """A compiled program's name in its model's cache folder."""
    return hashlib.sha256(json.dumps([shape, compiler_digest(), MAX_STATEMENTS]).encode()
                          ).hexdigest()[:16]


def _compile(app, shape: dict) -> dict:
    from ..compiler.errors import CompileError
    from ..compiler.pipeline import compile_model
    from ..compiler.codegen.backend import CANNOT_HOLD
    from ..compiler.codegen.whole import whole_program
    try:
        compiled = compile_model(model_file(app.name), batch=app.batch, config=shape,
                                 time_segments=False)     # whole_program is timed instead
        # the compiler puts a layer this shape cannot hold on the host; a design point of
        # the paper's sweep runs the whole app on the chip, so that shape does not fit
        unfit = next((r for r in compiled.report.rows
                      if r.reason and CANNOT_HOLD in r.reason), None)
        if unfit is not None:
            return {"error": f"{app.name}: {unfit.node}: {unfit.reason}"}
        whole = whole_program(compiled, f"{app.name}, batch {app.batch}")
    except CompileError as e:
        return {"error": f"{app.name}: {e}"}
    if whole.instructions > MAX_STATEMENTS:     # e.g. a tiny array: every tile an MMC
        return {"error": f"{app.name}: {whole.instructions:,} instructions on a "
                         f"{shape['array_size']} x {shape['array_size']} array, more than the "
                         f"assembler's {MAX_STATEMENTS:,}"}
    return {"source": whole.source, "host_rows": whole.host_rows,
            "weight_tiles": whole.weight_tiles, "segments": whole.segments}


def cache_dir() -> Path:
    from ..cache import root
    return root() / "apps"


def _digest(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.relative_to(_PACKAGE)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def compiler_digest() -> str:
    """The compiler's and the ISA's sources: a compiled program is stale when they change."""
    return _digest([*(_PACKAGE / "compiler").rglob("*.py"), _PACKAGE / "isa.toml"])


def _model_key(app) -> str:
    """The app's model file: its builders' sources, name, seed and batch."""
    here = Path(__file__).resolve().parent
    builders = _digest([here / "onnx_models.py", here / "catalog.py", here / "layers.py"])
    return hashlib.sha256(f"{builders}:{app.name}:{SEED}:{app.batch}".encode()).hexdigest()[:16]


@lru_cache(maxsize=8)
def model_file(name: str) -> Path:
    """The app's QDQ model (weights as external data), written once into the cache."""
    app = build(name)
    target = cache_dir() / f"{app.name.lower()}-{_model_key(app)}"
    path = target / "model.onnx"
    if path.exists():
        return path
    from .onnx_models import save
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save(app.name, tmp / "model.onnx", seed=SEED, batch=app.batch, quantized=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not path.exists():          # not a concurrent writer that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def shape_of(config) -> dict:
    return {k: getattr(config, k) for k in SHAPE_FIELDS}


__all__ = ["AppProgram", "CodegenError", "app_names", "app_program", "is_app", "shape_of"]

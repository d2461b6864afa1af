"""What a sweep runs: programs named on the command line, rebuilt for each machine shape.

A target is a small picklable record; `digest(shape)` (client side, for the result cache)
and `build(config)` (worker side) do the work.  Kinds:
- `app`: one of the paper's six apps (tpuasm.apps), regenerated for every shape;
- `source`: a .tasm file, reassembled for every shape (its data files are used as they
  are: a shape they do not fit is reported as a skipped point);
- `binary`: a .tbin file, its recorded shape replaced by the point's;
- `manifest`: a regression program (a folder with test.toml), its data generated once per
  worker;
- `compiled`: one TPU segment of a compiled-model folder (`tpuasm compile -o OUTDIR`),
  recompiled for every shape (sweep/compiled.py).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .grid import SweepError

SHAPE_KEYS = ("array_size", "ub_rows", "acc_rows", "fifo_depth", "profile")
_BIG = 16 << 20                 # files larger than this are identified by size and mtime


class Skip(Exception):
    """This target cannot run on this machine shape (reported, not an error)."""


@dataclass(frozen=True)
class Target:
    kind: str                   # app | source | binary | manifest | compiled
    path: str                   # the app's name for apps, OUTDIR for compiled models
    host: str | None = None
    weights: str | None = None
    segment: str | None = None  # compiled models: the TPU segment

    @property
    def label(self) -> str:
        if self.kind == "app":
            return self.path
        if self.kind == "manifest":
            return Path(self.path).parent.name
        if self.kind == "compiled":
            return f"{Path(self.path).name}/{self.segment}"
        return Path(self.path).name

    def base_config(self) -> dict:
        """The MachineConfig settings the target brings: its program's shape (and a
        manifest's [machine] table, the machine a model was compiled for); apps bring
        none (TPU v1)."""
        if self.kind == "app":
            return {}
        if self.kind == "compiled":
            from . import compiled
            return compiled.base_config(self.path)
        return dict(_base_config(self.kind, self.path))

    def digest(self, config: dict) -> str:
        """Identifies the program and data this target runs under `config`."""
        h = hashlib.sha256(self.kind.encode())
        if self.kind == "app":                # by its inputs: only workers compile
            from ..apps.programs import program_key
            h.update(program_key(self.path, **_app_shape(config)).encode())
        elif self.kind == "compiled":
            from . import compiled
            h.update(compiled.digest(self.path, self.segment).encode())
        else:
            h.update(file_digest(self.path).encode())
            for extra in (self.host, self.weights):
                if extra:
                    h.update(file_digest(extra).encode())
            if self.kind == "manifest":
                for p in sorted(Path(self.path).parent.glob("*")):
                    if p.is_file():
                        h.update(file_digest(str(p)).encode())
        return h.hexdigest()[:20]


@lru_cache(maxsize=256)
def _base_config(kind: str, path: str) -> tuple:
    from ..errors import TpuasmError
    try:
        if kind == "binary":
            from ..binary import load_binary
            shape = load_binary(path).shape
            extra = {}
        elif kind == "source":
            shape = assembled_file(path, ()).shape
            extra = {}
        else:
            from ..regression.manifest import ManifestError, load_manifest
            try:
                m = load_manifest(Path(path))
            except ManifestError as e:
                raise SweepError(str(e)) from None
            shape = assembled_file(str(m.program), ()).shape
            extra = {k: v for k, v in m.machine.items()}
    except TpuasmError as e:
        raise SweepError(f"{path}: {e}") from None
    out = {k: getattr(shape, k) for k in SHAPE_KEYS}
    out.update(extra)
    return tuple(sorted(out.items()))


def file_digest(path: str) -> str:
    p = Path(path)
    st = p.stat()
    if st.st_size > _BIG:
        return f"{p.name}:{st.st_size}:{st.st_mtime_ns}"
    return hashlib.sha256(p.read_bytes()).hexdigest()


def resolve(items, host=None, weights=None) -> list[Target]:
    """TARGET strings -> targets (SweepError for one that is none of the kinds)."""
    from ..apps.programs import app_names, is_app
    out: list[Target] = []
    for item in items:
        text = str(item)
        if text.lower() in ("apps", "all-apps"):
            out += [Target("app", name) for name in app_names()]
            continue
        if is_app(text) and not Path(text).exists():
            out.append(Target("app", text.upper()))
            continue
        p = Path(text)
        if p.is_dir():
            out += _folder_targets(p)
        elif p.is_file() and p.name == "test.toml":
            out.append(Target("manifest", str(p)))
        elif p.is_file() and p.suffix in (".tasm", ".tbin"):
            for extra in (host, weights):
                if extra is not None and not Path(extra).is_file():
                    raise SweepError(f"{extra}: file not found")
            out.append(Target("source" if p.suffix == ".tasm" else "binary", str(p),
                              str(host) if host else None, str(weights) if weights else None))
        elif p.exists():
            raise SweepError(f"{p}: not a .tasm, .tbin, test.toml or folder")
        else:
            raise SweepError(f"{text}: no such file, folder or app (apps: "
                             f"{', '.join(app_names())})")
    if not out:
        raise SweepError("no targets")
    return out


def _folder_targets(folder: Path) -> list[Target]:
    """A compiled model's segments, or the regression manifests of a folder (compiled
    models inside it count as models, their own regression/ manifests not again)."""
    from . import compiled
    models = sorted({m.parent for m in folder.rglob("manifest.json")
                     if compiled.is_compiled_model(m.parent)})
    out = [Target("compiled", str(m), segment=s) for m in models
           for s in compiled.segments(str(m))]
    for m in sorted(folder.rglob("test.toml")):
        if not any(d == m.parent or d in m.parents for d in models):
            out.append(Target("manifest", str(m)))
    if not out:
        raise SweepError(f"{folder}: a folder without test.toml manifests or compiled "
                         "models (manifest.json from `tpuasm compile`)")
    return out


def _app_shape(config: dict) -> dict:
    from ..machine.config import MachineConfig
    c = MachineConfig(**config)
    return {"array_size": c.array_size, "ub_rows": c.ub_rows, "acc_rows": c.acc_rows,
            "fifo_depth": c.fifo_depth}


def _shape(config: dict) -> dict:
    from ..machine.config import MachineConfig
    c = MachineConfig(**config)
    return {k: getattr(c, k) for k in SHAPE_KEYS}


# ---------------------------------------------------------------- worker side

def build(target: Target, config: dict):
    """(program, host, weights, macs) for this point; Skip when it cannot be built for
    this shape.  `macs`: the network's own MACs when known (apps), else None."""
    if target.kind == "app":
        from ..apps.programs import CodegenError, app_program
        try:
            ap = app_program(target.path, **_app_shape(config))
        except CodegenError as e:
            raise Skip(str(e)) from None
        host, weights = ap.data()
        return _assembled_app(ap), host, weights, ap.macs
    if target.kind == "source":
        _data_fits(target, _shape(config)["array_size"])
        return assembled_file(target.path, tuple(sorted(_shape(config).items()))), \
            target.host, target.weights, None
    if target.kind == "compiled":
        from . import compiled
        return compiled.build(target.path, target.segment, config)
    if target.kind == "binary":
        from dataclasses import replace

        from ..binary import load_binary
        _data_fits(target, _shape(config)["array_size"])
        program = load_binary(target.path)
        program.shape = replace(program.shape, **_shape(config))
        return program, target.host, target.weights, None
    return _manifest_point(target.path, config)


def _data_fits(target: Target, n: int) -> None:
    """Skip a point whose array size the target's data images were not made for (their
    rows are N wide); the machine's own load check stays the judge of everything else."""
    for role, path, axes in (("host", target.host, 1), ("weight", target.weights, 2)):
        width = _npy_shape(path)[-axes:] if path else ()
        if width and any(w != n for w in width):
            raise Skip(f"the {role} image {Path(path).name} is for a "
                       f"{width[-1]}-wide array, not {n}")


@lru_cache(maxsize=64)
def _npy_shape(path: str) -> tuple:
    """An .npy file's shape from its header (() when it is not one: load reports it)."""
    import numpy as np
    try:
        return tuple(getattr(np.load(path, mmap_mode="r", allow_pickle=False), "shape", ()))
    except (OSError, ValueError):
        return ()


@lru_cache(maxsize=8)
def _assembled_app(ap):
    # its decoded table from the apps' table cache: no assembler on a sweep point
    return ap.program()


@lru_cache(maxsize=32)
def assembled_file(path: str, shape: tuple):
    from ..assembler import assemble_file
    return assemble_file(Path(path), config=dict(shape))


def _manifest_point(path: str, config: dict):
    from ..regression.manifest import load_manifest
    m = load_manifest(Path(path))
    shape = _shape(config)
    program = assembled_file(str(m.program), tuple(sorted(shape.items())))
    data_dir = _manifest_data(path)
    host = weights = None
    n = shape["array_size"]
    import numpy as np
    if m.host is not None:
        host = str((data_dir if m.generator else m.directory) / m.host)
    elif m.host_rows is not None:
        host = np.zeros((m.host_rows, n), np.int8)
    elif m.generator is not None and (data_dir / "host.npy").is_file():
        host = str(data_dir / "host.npy")
    if m.weights is not None:
        weights = str((data_dir if m.generator else m.directory) / m.weights)
    elif m.weight_tiles is not None:
        weights = np.zeros((m.weight_tiles, n, n), np.int8)
    elif m.generator is not None and (data_dir / "weights.npy").is_file():
        weights = str(data_dir / "weights.npy")
    return program, host, weights, None


@lru_cache(maxsize=64)
def _manifest_data(path: str) -> Path:
    """The manifest's generated data, once per worker process (a temporary folder)."""
    from ..regression.manifest import load_manifest
    from ..regression.runner import generate
    m = load_manifest(Path(path))
    out = Path(tempfile.mkdtemp(prefix=f"tpuasm-sweep-{os.getpid()}-"))
    if m.generator is not None:
        generate(m.generator, out)
    return out

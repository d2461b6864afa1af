"""Compiled-model folders (`tpuasm compile MODEL -o OUTDIR`) as sweep targets.

One target per TPU segment of OUTDIR.  At the machine shape the model was compiled for, a
point runs exactly the files `tpuasm run OUTDIR/segmentN.tasm --host segmentN.host.npy
--weights segmentN.weights.npy` runs.  At another shape (array size, UB or accumulator
rows, FIFO depth) the segment is recompiled for it: the back end regenerates the program
and weight image from the segment's saved IR (segmentN.ir.npz, the quantized operators,
the same path `tpuasm.compiler.load` takes), and the host image is the same batch of sample
inputs (compiler/codegen/golden.py's seeded `sample_inputs`, what segmentN.host.npy holds) packed
in the new layout.  A shape the back end cannot fit the segment into is a skipped point
with the back end's reason.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from .grid import SweepError

SHAPE_FIELDS = ("array_size", "ub_rows", "acc_rows", "fifo_depth")
FORMAT = "tpuasm-compiled-model"        # compiler/outdir.py's manifest format


def is_compiled_model(folder: Path) -> bool:
    try:
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def segments(folder: str) -> list[str]:
    """The TPU segments of OUTDIR that have a program (SweepError when none)."""
    tpu = [s for s in _manifest(folder)["steps"] if s.get("kind") == "tpu" and s.get("program")]
    if not tpu:
        raise SweepError(f"{folder}: the compiled model holds no TPU program")
    return [s["name"] for s in tpu]


def base_config(folder: str) -> dict:
    """The MachineConfig settings the model was compiled for."""
    return dict(_manifest(folder).get("config") or {})


def digest(folder: str, segment: str) -> str:
    """Identifies the program and data of one segment (its files and the manifest)."""
    step = _step(folder, segment)
    h = hashlib.sha256((Path(folder) / "manifest.json").read_bytes())
    for key in ("ir", "program", "host", "weights"):
        h.update(_file_hash(str(Path(folder) / step[key])).encode())
    return h.hexdigest()


def build(folder: str, segment: str, config: dict):
    """(program, host, weights, macs) of the segment for the machine `config`."""
    from ..machine.config import MachineConfig
    machine = MachineConfig(**config)
    compiled = MachineConfig(**base_config(folder))
    step = _step(folder, segment)
    macs = _macs(folder, segment)
    if all(getattr(machine, k) == getattr(compiled, k) for k in SHAPE_FIELDS):
        from .targets import assembled_file
        shape = tuple(sorted({k: getattr(machine, k) for k in SHAPE_FIELDS}.items()))
        return (assembled_file(str(Path(folder) / step["program"]), shape),
                str(Path(folder) / step["host"]), str(Path(folder) / step["weights"]), macs)
    program, host, weights = _recompiled(folder, segment,
                                         tuple(getattr(machine, k) for k in SHAPE_FIELDS))
    return program, host, weights, macs


@lru_cache(maxsize=8)
def _recompiled(folder: str, segment: str, shape: tuple):
    from ..compiler.codegen import CodegenError, generate
    from ..compiler.codegen.golden import sample_inputs
    from .targets import Skip
    model = _loaded(folder)
    step = next(s for s in model.steps if getattr(s, "name", None) == segment)
    array_size, ub_rows, acc_rows, fifo_depth = shape
    try:
        program = generate(step.segment, step.segment.program_rows(model.batch),
                           array_size=array_size, ub_rows=ub_rows, acc_rows=acc_rows,
                           fifo_depth=fifo_depth)
    except CodegenError as e:
        raise Skip(f"{segment} cannot be recompiled for a {array_size}x{array_size} array "
                   f"({ub_rows} UB rows, {acc_rows} accumulator rows): {e}") from None
    from ..assembler import assemble
    binary = assemble(program.source, f"{segment}.tasm")
    host = program.host_image(sample_inputs(step, program.batch))
    return binary, host, program.weights


@lru_cache(maxsize=4)
def _loaded(folder: str):
    from ..compiler import load
    from ..compiler.errors import CompileError
    try:
        return load(folder)
    except CompileError as e:
        raise SweepError(str(e)) from None


@lru_cache(maxsize=32)
def _macs(folder: str, segment: str) -> int:
    """The segment's own MACs per batch (per run of its rows; Dense K x N, Conv O x C x kh x kw per output
    pixel), from the manifest and the IR arrays' shapes; padding is not counted."""
    import numpy as np
    manifest = _manifest(folder)
    step = _step(folder, segment)
    shapes = {t["name"]: t["shape"] for t in step["tensors"]}
    total = 0
    with np.load(Path(folder) / step["ir"], allow_pickle=False) as ir:
        for i, op in enumerate(step["operators"]):
            if op["type"] == "Dense":
                total += int(np.prod(ir[f"op{i}.weight"].shape))
            elif op["type"] == "Conv":
                out = shapes[op["output"]]
                total += int(np.prod(ir[f"op{i}.weight"].shape)) * int(np.prod(out[1:]))
    rows = step.get("rows")                 # a segment's own fixed rows (Segment.rows)
    return total * int(manifest["batch"] if rows is None else rows)


@lru_cache(maxsize=32)
def _manifest(folder: str) -> dict:
    path = Path(folder) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("format") != FORMAT or not isinstance(manifest.get("steps"), list):
            raise ValueError("not a compiled-model manifest")
    except (OSError, ValueError, AttributeError) as e:
        raise SweepError(f"{path}: unreadable compiled model: {e}") from None
    return manifest


def _step(folder: str, segment: str) -> dict:
    for s in _manifest(folder)["steps"]:
        if s.get("kind") == "tpu" and s.get("name") == segment:
            missing = [k for k in ("ir", "program", "host", "weights")
                       if not (Path(folder) / str(s.get(k))).is_file()]
            if missing:
                raise SweepError(f"{folder}: {segment} lacks its "
                                 f"{', '.join(missing)} file(s)")
            return s
    raise SweepError(f"{folder}: no TPU segment '{segment}'")


def _file_hash(path: str) -> str:
    from .targets import file_digest
    return file_digest(path)

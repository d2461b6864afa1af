"""A compiled model's steps as the debugger shows them (`tpuasm debug OUTDIR`): the order of
TPU segments and host parts from its manifest, which segment holds a graph node, and a
host part's tensors (names and shapes from the manifest; with `--input`, the shapes and
first values of what the part read and wrote when the model ran on those inputs)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

VALUES_SHOWN = 6          # values of a tensor printed after its shape


class ModelStepsError(Exception):
    """The OUTDIR's manifest or a segment's program cannot be read."""


def manifest_steps(outdir: Path) -> list[dict]:
    """The steps of the compiled model in OUTDIR, in the order they run."""
    from tpuasm import limits
    from tpuasm.errors import TpuasmError
    from tpuasm.files import read_input
    path = Path(outdir) / "manifest.json"
    try:
        return json.loads(read_input(path, what="compiled model manifest",
                                     limit=limits.MAX_SOURCE_BYTES))["steps"]
    except TpuasmError as e:
        raise ModelStepsError(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise ModelStepsError(f"{path}: unreadable manifest: {e}") from None


def segment_names_node(outdir: Path, step: dict, name: str) -> bool:
    """Whether the TPU segment `step` has instructions of graph node `name` (`.node`)."""
    from tpuasm import limits
    from tpuasm.errors import TpuasmError
    from tpuasm.files import read_input
    if step.get("kind") != "tpu" or not step.get("program"):
        return False
    try:
        text = read_input(Path(outdir) / step["program"], what="segment program",
                          limit=limits.MAX_SOURCE_BYTES).decode("utf-8", "replace")
    except TpuasmError:
        return False
    return re.search(rf"^\s*\.node\s+\"?{re.escape(name)}\"?\s*(;|$)", text, re.M) is not None


def tensor_text(name: str, value) -> str:
    """`x (2, 8) float32: 0.125 -1.5 3 ...`: shape, type and the first few values."""
    if value is None:
        return f"{name}: not computed"
    if not isinstance(value, np.ndarray):
        return f"{name}: {type(value).__name__}"
    flat = value.reshape(-1)[:VALUES_SHOWN]
    if flat.dtype.kind == "f":
        shown = " ".join(f"{float(v):.4g}" for v in flat)
    else:
        shown = " ".join(str(v) for v in flat.tolist())
    more = " ..." if value.size > VALUES_SHOWN else ""
    return f"{name} {tuple(value.shape)} {value.dtype}: {shown}{more}"


def host_part_lines(step: dict, run: dict | None) -> list[str]:
    """A host part's inputs and outputs, one line each: from the model run on --input
    (`run`: {"inputs": {...}, "outputs": {...}}) when there was one, else the manifest's
    names and input shapes."""
    if run is not None:
        return ([f"in  {tensor_text(t, v)}" for t, v in run.get("inputs", {}).items()] +
                [f"out {tensor_text(t, v)}" for t, v in run.get("outputs", {}).items()])
    shapes = step.get("input_shapes") or {}
    lines = [f"in  {t}" + (f" {tuple(shapes[t])}" if t in shapes else "")
             for t in step.get("inputs", [])]
    return lines + [f"out {t}" for t in step.get("outputs", [])]

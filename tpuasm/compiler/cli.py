"""`tpuasm compile` and `tpuasm infer`: thin faces over tpuasm.compiler.

Exit status: 0 success, 1 the emulator faulted while running a model, 2 bad input (a model,
calibration set, data file or OUTDIR the compiler cannot use, or bad arguments)."""
from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

from ..cli import EXIT_FAULT, EXIT_OK, EXIT_USAGE, parse_arguments, positive_int


def _parser_compile() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm compile",
        description="Compile an ONNX model into TPU programs (quantized int8; operators the "
                    "TPU cannot run stay on the host).  Writes OUTDIR atomically.")
    p.add_argument("model", help="the ONNX model (float with --calibrate, or QDQ/QOperator)")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR",
                   help="output directory (replaced if it holds an earlier compile)")
    p.add_argument("--batch", type=positive_int, metavar="B",
                   help="batch size of the TPU programs (default: the model's fixed batch)")
    p.add_argument("--calibrate", metavar="DATA", help="calibration inputs for a float model: "
                   ".npy (one input) or .npz keyed by input name, in the model's "
                   "layout and element types (rows along each input's batch axis)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="machine configuration, e.g. array_size=16 (repeatable)")
    p.add_argument("--batch-axis", action="append", default=[], metavar="NAME=AXIS",
                   help="the batch axis of input NAME, or 'none' for an input passed whole "
                        "to every batch (default: inferred; repeatable)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the report")
    return p


def _parser_infer() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm infer",
        description="Run a compiled model on the emulator: inputs in the model's own "
                    "layout and element types, any number of rows along each input's batch "
                    "axis, in batches of the compiled size.")
    p.add_argument("outdir", help="a directory written by `tpuasm compile`")
    p.add_argument("inputs", help="X.npy (one input) or X.npz keyed by input name")
    p.add_argument("-o", "--output", required=True, metavar="Y",
                   help="Y.npy (one output) or Y.npz (keyed by output name)")
    p.add_argument("--engine", choices=("emulator", "reference"), default=None,
                   help="run segments on the emulator (default) or with reference.py")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


@contextmanager
def _errors():
    """Turn the compiler's errors into a message and exit status 2 (1 for machine faults)."""
    from tpuasm.compiler.runtime import InferenceFault
    from tpuasm.errors import TpuasmError
    state = {"code": EXIT_OK}
    try:
        yield state
    except InferenceFault as e:
        print(f"error: {e}", file=sys.stderr)
        state["code"] = EXIT_FAULT
    except TpuasmError as e:
        print(f"error: {e}", file=sys.stderr)
        state["code"] = EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        state["code"] = 130


def compile_main(argv: list[str] | None = None) -> int:
    args, code = parse_arguments(_parser_compile(), argv)
    if args is None:
        return code
    with _errors() as state:
        from tpuasm.compiler.pipeline import compile_model
        model = compile_model(args.model, batch=args.batch, calibration=args.calibrate,
                              config=args.config, batch_axes=args.batch_axis)
        model.save(args.output)
        if not args.quiet:
            sys.stdout.write(model.report.text())
        print(f"\nwrote {args.output}"
              + ("" if model.has_programs else " (no TPU programs: the back end is missing)"))
    return state["code"]


def infer_main(argv: list[str] | None = None) -> int:
    args, code = parse_arguments(_parser_infer(), argv)
    if args is None:
        return code
    with _errors() as state:
        from tpuasm.compiler.outdir import load
        model = load(args.outdir)
        data = read_inputs(Path(args.inputs), [i.name for i in model.inputs])
        out = Path(args.output)
        if out.suffix not in (".npy", ".npz"):
            raise _error(f"{out}: the output must be a .npy or .npz file")
        if out.suffix == ".npy" and len(model.outputs) != 1:
            raise _error(f"{out}: the model has {len(model.outputs)} outputs "
                         f"({', '.join(o.name for o in model.outputs)}): write an .npz")
        with _progress(args.quiet) as progress:
            results = model.run(data, progress=progress, engine=args.engine)
        for note in write_outputs(out, results):
            print(f"note: {note}", file=sys.stderr)
        if not args.quiet:
            rows = _rows(model, results)
            print(f"wrote {out} ({rows} rows)", file=sys.stderr)
    return state["code"]


def _rows(model, results: dict) -> int:
    """Rows of the first output with a batch axis (1 for a model without one)."""
    for o in model.outputs:
        value = results.get(o.name)
        if o.batch_axis is not None and value is not None:
            return len(value) if isinstance(value, list) else value.shape[o.batch_axis]
    return 1


def _error(message: str):
    from tpuasm.compiler.errors import CompileError
    return CompileError(message)


def read_inputs(path: Path, names: list[str]) -> dict:
    from tpuasm.compiler.arrays import read_named_arrays
    return read_named_arrays(path, names)


def write_outputs(path: Path, results: dict) -> list[str]:
    """Write Y.npy / Y.npz (never pickles); the notes to show.  A sequence of maps (ZipMap's
    {class: probability} per row) becomes a (rows, classes) array in key order, with its
    keys beside it as NAME.keys."""
    import numpy as np
    arrays, notes = {}, []
    for name, value in results.items():
        if isinstance(value, dict):
            value = [value]
        if isinstance(value, list):
            table, keys = _sequence_table(name, value)
            arrays[name] = table
            if keys is not None:
                arrays[f"{name}.keys"] = keys
                notes.append(f"output '{name}' (a sequence of maps) written as a "
                             f"{table.shape} array, one column per key ({name}.keys)")
        else:
            arrays[name] = np.asarray(value)
    try:
        if path.suffix == ".npy":
            np.save(path, next(iter(arrays.values())))
        else:
            np.savez(path, **arrays)
    except OSError as e:
        raise _error(f"{path}: cannot write: {e.strerror}") from None
    return notes


def _sequence_table(name: str, rows: list):
    """(array, keys or None) of a sequence of maps (or of equal-shaped tensors)."""
    import numpy as np
    if not rows:
        return np.zeros((0, 0), np.float32), None
    if not all(isinstance(r, dict) for r in rows):
        try:
            return np.stack([np.asarray(r) for r in rows]), None
        except ValueError:
            raise _error(f"output '{name}' is a sequence of tensors of different shapes: "
                         f"take it from the Python API (CompiledModel.run)") from None
    keys = list(rows[0])
    if any(list(r) != keys for r in rows):
        raise _error(f"output '{name}': its maps have different keys; take them from "
                     f"the Python API (CompiledModel.run)")
    return np.array([[r[k] for k in keys] for r in rows]), np.array(keys)


@contextmanager
def _progress(quiet: bool):
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    bar = Progress(TextColumn("inference"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    task = bar.add_task("rows", total=None)
    with bar:
        yield lambda done, total: bar.update(task, completed=done, total=total)

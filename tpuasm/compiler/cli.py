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
                   ".npy (one input, rows first) or .npz keyed by input name")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="machine configuration, e.g. array_size=16 (repeatable)")
    q = p.add_argument_group("quantization of a float model")
    q.add_argument("--per-tensor", action="store_true",
                   help="one weight scale per tensor (default: per output channel)")
    q.add_argument("--symmetric-activations", action="store_true",
                   help="int8 activations with zero point 0 (default: uint8, asymmetric)")
    q.add_argument("--calibration-method", choices=("minmax", "entropy", "percentile"),
                   default="minmax", help="how activation ranges are chosen (default minmax)")
    q.add_argument("--percentile", type=float, default=None, metavar="P",
                   help="the share of values the range covers with --calibration-method "
                        "percentile, in [50, 100] (default 99.999)")
    q.add_argument("--keep-float", default="", metavar="NAME_OR_OPTYPE,...",
                   help="nodes or operator types left in float on the host")
    v = p.add_argument_group("checking the compiled model against the float model")
    v.add_argument("--validate", metavar="DATA", default=None,
                   help="inputs to compare on (.npy/.npz; default: the calibration data)")
    v.add_argument("--no-validate", action="store_true", help="skip the comparison")
    v.add_argument("--min-agreement", type=float, default=0.99, metavar="A",
                   help="warn when top-1 agreement with the float model falls below A "
                        "(a share in [0, 1], default 0.99)")
    v.add_argument("--min-snr", type=float, default=20.0, metavar="DB",
                   help="warn when an output's SNR against the float model falls below DB "
                        "(default 20)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the report")
    return p


def _quantization(args):
    """QuantOptions from the flags, or None when none was given and nothing is quantized."""
    from tpuasm.compiler.errors import CompileError
    from tpuasm.compiler.quantize import QuantOptions
    if args.percentile is not None and args.calibration_method != "percentile":
        raise CompileError("--percentile applies with --calibration-method percentile")
    custom = (args.per_tensor or args.symmetric_activations or args.percentile is not None
              or args.calibration_method != "minmax" or args.keep_float)
    if args.calibrate is None and not custom:
        return None
    return QuantOptions(not args.per_tensor, args.symmetric_activations,
                        args.calibration_method,
                        99.999 if args.percentile is None else args.percentile,
                        args.keep_float)


def _parser_infer() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm infer",
        description="Run a compiled model on the emulator: float32 inputs in the model's own "
                    "layout, any number of rows, in batches of the compiled size.")
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
        if args.no_validate and args.validate:
            raise _error("--validate and --no-validate: choose one")
        model = compile_model(args.model, batch=args.batch, calibration=args.calibrate,
                              config=args.config, quantization=_quantization(args),
                              validate=False if args.no_validate else args.validate,
                              min_agreement=args.min_agreement, min_snr=args.min_snr)
        model.save(args.output)
        if not args.quiet:
            sys.stdout.write(model.report.text())
        validation = getattr(model.report, "validation", None)
        for warning in validation.warnings if validation is not None else ():
            print(f"warning: {warning}", file=sys.stderr)
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
        write_outputs(out, results)
        if not args.quiet:
            rows = len(next(iter(results.values()))) if results else 0
            print(f"wrote {out} ({rows} rows)", file=sys.stderr)
    return state["code"]


def _error(message: str):
    from tpuasm.compiler.errors import CompileError
    return CompileError(message)


def read_inputs(path: Path, names: list[str]) -> dict:
    from tpuasm.compiler.arrays import read_named_arrays
    return read_named_arrays(path, names)


def write_outputs(path: Path, results: dict) -> None:
    import numpy as np
    try:
        if path.suffix == ".npy":
            np.save(path, next(iter(results.values())))
        else:
            np.savez(path, **results)
    except OSError as e:
        raise _error(f"{path}: cannot write: {e.strerror}") from None


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

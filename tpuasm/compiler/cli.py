"""`tpuasm compile` and `tpuasm infer`: thin faces over tpuasm.compiler.

Exit status: 0 success, 1 the emulator faulted while running a model, 2 bad input (a model,
calibration set, data file or OUTDIR the compiler cannot use, or bad arguments)."""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from ..cli import parse_arguments, positive_int
from ..command import EXIT_FAILED as EXIT_FAULT, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE


def _parser_compile() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm compile",
        description="Compile an ONNX model into TPU programs (quantized int8; operators the "
                    "TPU cannot run stay on the host).  Writes OUTDIR atomically.")
    p.add_argument("model", help="the ONNX model (float with --calibrate, or QDQ/QOperator)")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR",
                   help="output directory (replaced if it holds an earlier compile)")
    p.add_argument("--batch", type=_batch, metavar="B",
                   help="batch size of the TPU programs (default: the model's fixed batch, "
                        "else 64)")
    p.add_argument("--calibrate", metavar="DATA", help="calibration inputs for a float model: "
                   ".npy (one input) or .npz keyed by input name, in the model's "
                   "layout and element types (rows along each input's batch axis)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="machine configuration, e.g. array_size=16 (repeatable)")
    p.add_argument("--batch-axis", action="append", default=[], metavar="NAME=AXIS",
                   help="the batch axis of input NAME, or 'none' for an input passed whole "
                        "to every batch (default: inferred; repeatable)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="the dimensions of input NAME, each a size or a name such as N for "
                        "the batch: fixes a dynamic one no data fixes (a quantized model's "
                        "sequence length; repeatable)")
    p.add_argument("--input-range", action="append", default=[], metavar="NAME=LO,HI",
                   help="the range of a quantized model's float input NAME, so that the "
                        "float nodes over it the model leaves (an LSTM's, an Einsum's) are "
                        "quantized without data; values beyond it are clipped (repeatable)")
    p.add_argument("--input-value", action="append", default=[], metavar="NAME=VALUE",
                   help="fix input NAME to VALUE (a number, or numbers separated by commas "
                        "for a fixed-shape input) when compiling: it becomes a constant of "
                        "the model, an If on it is folded and its taken branch compiled "
                        "(e.g. sr=16000 for a model that branches on its sample rate); the "
                        "compiled model then takes no such input (repeatable)")
    q = p.add_argument_group("quantization of a float model")
    q.add_argument("--per-tensor", action="store_true",
                   help="one weight scale per tensor (default: per output channel)")
    q.add_argument("--symmetric-activations", action="store_true",
                   help="int8 activations with zero point 0 (default: uint8, asymmetric)")
    q.add_argument("--calibration-method", choices=("auto", "minmax", "entropy", "percentile"),
                   default="auto", help="how activation ranges are chosen (default auto: "
                                        "minmax, or the method that keeps the float model's "
                                        "answers when minmax falls below --min-agreement)")
    q.add_argument("--percentile", type=float, default=None, metavar="P",
                   help="the share of values the range covers with --calibration-method "
                        "percentile, in [50, 100] (default 99.999)")
    q.add_argument("--keep-float", default="", metavar="NAME_OR_OPTYPE,...",
                   help="nodes or operator types left in float on the host")
    q.add_argument("--activation-bits", default="8", metavar="8|16",
                   help="16: every activation tensor between TPU matrix operators is int16 "
                        "(the TPU's 16-bit activations, at half the multiply rate); lookup "
                        "tables, pooling and VADD/VMUL keep 8-bit tensors (default 8)")
    q.add_argument("--wide-tensor", action="append", default=[], metavar="NAME",
                   help="quantize tensor NAME to int16 (a matrix operator's input on the TPU; "
                        "repeatable, or names separated by commas)")
    q.add_argument("--weight-bits", default="8", metavar="8|16",
                   help="16: every matrix operator on the TPU (Conv, Gemm, MatMul, the "
                        "unrolled LSTM/GRU gates) gets int16 weights (the TPU's 16-bit "
                        "weights: MatrixMultiply's D flag, at half the multiply rate, a "
                        "quarter with int16 inputs); default 8")
    q.add_argument("--wide-weight", action="append", default=[], metavar="NODE",
                   help="give node NODE int16 weights (a Conv, Gemm or MatMul, by its name "
                        "in the report; an LSTM/GRU's name means its gate products; "
                        "repeatable, or names separated by commas)")
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
    v.add_argument("--class-axis", action="append", default=[], metavar="OUTPUT=AXIS",
                   help="the axis of OUTPUT's class scores, judged by top-1 agreement at "
                        "every other position, or 'none' (SNR only); by default a Softmax, "
                        "an ArgMax or a classifier head in the graph says (repeatable)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the report")
    return p


def _quantization(args):
    """QuantOptions from the flags, or None when none was given and nothing is quantized."""
    from tpuasm.compiler.errors import CompileError
    from tpuasm.compiler.front.quantize import QuantOptions
    if args.percentile is not None and args.calibration_method != "percentile":
        raise CompileError("--percentile applies with --calibration-method percentile")
    custom = (args.per_tensor or args.symmetric_activations or args.percentile is not None
              or args.calibration_method != "auto" or args.keep_float
              or str(args.activation_bits).strip() != "8" or args.wide_tensor
              or str(args.weight_bits).strip() != "8" or args.wide_weight)
    if args.calibrate is None and not custom:
        return None
    return QuantOptions(not args.per_tensor, args.symmetric_activations,
                        args.calibration_method,
                        99.999 if args.percentile is None else args.percentile,
                        args.keep_float, activation_bits=args.activation_bits,
                        wide_tensors=tuple(args.wide_tensor), weight_bits=args.weight_bits,
                        wide_weights=tuple(args.wide_weight))


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
    p.add_argument("--engine", choices=("emulator", "pipeline", "reference"), default=None,
                   help="run segments on the emulator's data path (default), on its timed "
                        "four-stage pipeline, or with reference.py")
    cluster = p.add_argument_group("data-parallel inference on Dask")
    cluster.add_argument("--workers", type=_worker_count, metavar="N",
                         help="spread the rows over a local cluster of N worker processes")
    cluster.add_argument("--scheduler", metavar="ADDR",
                         help="spread the rows over the Dask cluster at ADDR "
                              "(e.g. tcp://host:8786)")
    cluster.add_argument("--chunk-rows", type=positive_int, metavar="R",
                         help="rows per task (default: whole batches, ~4 tasks per worker)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    return p


def _worker_count(text: str) -> int:
    from tpuasm.limits import MAX_INFER_WORKERS
    n = positive_int(text)
    if n > MAX_INFER_WORKERS:
        raise argparse.ArgumentTypeError(f"at most {MAX_INFER_WORKERS}: {n}")
    return n


@contextmanager
def _errors():
    """Turn the compiler's errors into a message and exit status 2 (1 for machine faults)."""
    from tpuasm.compiler.runtime.steps import InferenceFault
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
        state["code"] = EXIT_INTERRUPTED


def _batch(text: str) -> int:
    """--batch: a whole number 1..limits.MAX_BATCH, checked before anything is sized by it."""
    import argparse

    from tpuasm.limits import MAX_BATCH
    value = positive_int(text)
    if value > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"at most {MAX_BATCH:,}: {value:,}")
    return value


def _check_data_file(path, what: str) -> None:
    """An input array file (.npy/.npz) checked before numpy opens it: a regular file (a
    FIFO or /dev/zero is refused at once, by name), a .npy header validated (never called
    "pickled" unless it holds objects) and its size within the memory budget."""
    from tpuasm import limits
    from tpuasm.files import check_input, npy_header
    if not os.path.lexists(path):        # the compiler names a missing file in its order
        return
    check_input(path, what=what)
    if Path(path).suffix == ".npz":
        limits.check_allocation(f"{path}: {what}", os.stat(path).st_size)
    else:
        h = npy_header(path, what=what)
        limits.check_allocation(f"{path}: {what} of shape {h.shape}", h.nbytes)


def _check_model_file(path, batch) -> None:
    """The model a regular file whose compile fits the memory budget (limits.compile_bytes:
    its weights, their float copies and the golden check), checked before it is read."""
    from tpuasm import limits
    from tpuasm.files import check_input
    if not os.path.lexists(path):        # "no such file": the compiler's own message
        return
    check_input(path, what="ONNX model")
    size = os.stat(path).st_size
    limits.check_allocation(f"{path}: compiling this {limits.human_bytes(size)} model "
                            "(its weights, their float copies and the golden check)",
                            limits.compile_bytes(size))


def compile_main(argv: list[str] | None = None) -> int:
    args, code = parse_arguments(_parser_compile(), argv)
    if args is None:
        return code
    with _errors() as state:
        from tpuasm.compiler.pipeline import compile_model
        if args.no_validate and args.validate:
            raise _error("--validate and --no-validate: choose one")
        _check_model_file(args.model, args.batch)
        if args.calibrate is not None:
            _check_data_file(args.calibrate, "calibration data")
        model = compile_model(args.model, batch=args.batch, calibration=args.calibrate,
                              config=args.config, batch_axes=args.batch_axis,
                              quantization=_quantization(args),
                              validate=False if args.no_validate else args.validate,
                              min_agreement=args.min_agreement, min_snr=args.min_snr,
                              input_values=args.input_value, class_axes=args.class_axis,
                              input_shapes=args.input_shape,
                              input_ranges=args.input_range)
        model.save(args.output)
        if not args.quiet:
            sys.stdout.write(model.report.text() + "\n")
        for warning in model.report.all_warnings():     # even with -q: they need acting on
            print(f"warning: {warning}", file=sys.stderr)
        print(f"wrote {args.output}")
    return state["code"]


def infer_main(argv: list[str] | None = None) -> int:
    args, code = parse_arguments(_parser_infer(), argv)
    if args is None:
        return code
    with _errors() as state:
        from tpuasm.files import check_outputs
        out = Path(args.output)
        if out.suffix not in (".npy", ".npz"):
            raise _error(f"{out}: the output must be a .npy or .npz file")
        from tpuasm.compiler.runtime.model import load
        from tpuasm.compiler.outdir import check as check_outdir
        outdir_files = check_outdir(Path(args.outdir))
        # before anything is read or run: -o must not be X.npy or a file of OUTDIR
        check_outputs({"-o": out}, [args.inputs, *outdir_files])
        _check_data_file(args.inputs, "input data")
        model = load(args.outdir)
        data = read_inputs(Path(args.inputs), [i.name for i in model.inputs])
        if out.suffix == ".npy" and len(model.outputs) != 1:
            raise _error(f"{out}: the model has {len(model.outputs)} outputs "
                         f"({', '.join(o.name for o in model.outputs)}): write an .npz")
        with _progress(args.quiet) as progress:
            if args.workers or args.scheduler:
                results = _run_on_cluster(args, model, data, progress)
            else:
                results = model.run(data, progress=progress, engine=args.engine)
        for note in write_outputs(out, results):
            print(f"note: {note}", file=sys.stderr)
        if not args.quiet:
            rows = _rows(model, results)
            print(f"wrote {out} ({rows} rows)", file=sys.stderr)
    return state["code"]


def _run_on_cluster(args, model, data, progress) -> dict:
    """The rows over Dask workers (tpuasm.compiler.runtime.distributed); the scheduler is reached
    before anything is written."""
    from tpuasm.cluster import ClusterError, dask_client
    from tpuasm.compiler.runtime.distributed import run_on_cluster
    if args.workers and args.scheduler:
        raise _error("give --workers (a local cluster) or --scheduler (a running one), "
                     "not both")
    try:
        with dask_client(args.scheduler, args.workers) as client:
            return run_on_cluster(args.outdir, model, data, client, args.chunk_rows,
                                  args.engine, progress)
    except ClusterError as e:              # no scheduler there, workers on other code
        raise _error(str(e)) from None


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
    from tpuasm.compiler.front.arrays import read_named_arrays
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
        if isinstance(value, np.ndarray) and value.dtype == object:
            value = list(value)        # never pickled: the maps become a table below
        if isinstance(value, list):
            table, keys = _sequence_table(name, value)
            arrays[name] = table
            if keys is not None:
                arrays[f"{name}.keys"] = keys
                notes.append(f"output '{name}' (a sequence of maps) written as a "
                             f"{table.shape} array, one column per key ({name}.keys)")
        else:
            arrays[name] = np.asarray(value)
    from tpuasm.files import atomic_write
    if path.suffix == ".npy":          # exactly this path, through a temporary file
        atomic_write(path, lambda fh: np.save(fh, next(iter(arrays.values()))))
    else:
        atomic_write(path, lambda fh: np.savez(fh, **arrays))
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

"""The paper's section 7 (Figure 11): alternative TPU designs, reproduced on the emulator.

    python -m tpuasm.apps.figure11 [--apps A,B] [--out docs/figure11] [--full]
                                   [--apps-from compiler|generator]
                                   [--scheduler ADDR] [--workers N] [--factors ...]

Scales one parameter at a time from 0.25x to 4x over the six apps (tpuasm.sweep knobs:
memory, clock, clock+, matrix, matrix+; their formulas are in tpuasm/sweep/grid.py), writes
OUT.csv, OUT.png and OUT.svg, and prints the findings next to the paper's, plus the LSTM1
600 x 600 example at 256 x 256 and 512 x 512.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..command import EXIT_OK, EXIT_USAGE
from .paper import APPS, FIGURE11

KNOB_ORDER = ("memory", "clock+", "clock", "matrix+", "matrix")
FACTORS = (0.25, 0.5, 1, 2, 4)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tpuasm.apps.figure11", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--apps", default=",".join(APPS))
    p.add_argument("--knobs", default=",".join(KNOB_ORDER))
    p.add_argument("--factors", default=",".join(f"{f:g}" for f in FACTORS))
    p.add_argument("--out", type=Path, default=Path("docs/figure11"),
                   help="OUT.csv, OUT.png and OUT.svg (default: docs/figure11)")
    p.add_argument("--scheduler", metavar="ADDR")
    p.add_argument("--workers", type=int, help="local workers (0: in this process)")
    p.add_argument("--full", action="store_true",
                   help="run the arithmetic too (default: timing-only; the apps' data are "
                        "zeros and data never change the cycles)")
    p.add_argument("--apps-from", choices=("compiler", "generator"), default="compiler",
                   help="the apps' programs: compiled from their ONNX models (default) or "
                        "from the hand-written generator (tpuasm/apps/codegen.py)")
    p.add_argument("--cache", type=Path, help="result cache (default: the sweep's)")
    p.add_argument("--from-csv", type=Path, metavar="CSV",
                   help="no runs: the plot and findings from a `tpuasm sweep` CSV of the "
                        "knobs (e.g. from a TOML grid with a factor list per knob)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ..sweep.cache import ResultCache, default_path
    from ..sweep.engine import run_sweep
    from ..sweep.grid import Grid, SweepError, parse_set
    from ..sweep.report import CsvStream, read_rows, relative, save_figure, weighted_mean
    from ..sweep.targets import Target
    apps = [a.strip().upper() for a in args.apps.split(",") if a.strip()]
    knobs = [k.strip() for k in args.knobs.split(",") if k.strip()]
    try:
        if any(a not in APPS for a in apps):
            raise SweepError(f"--apps: choose from {', '.join(APPS)}")
        grid = Grid([parse_set(f"{k}={args.factors}") for k in knobs], {}, each=True)
        grid.validate()
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    from ..errors import OutputFileError
    from ..files import check_outputs
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputFileError(f"{args.out.parent}: cannot create: {e.strerror or e}") from None
    check_outputs({f"--out ({suffix})": args.out.with_suffix(suffix)
                   for suffix in (".csv", ".png", ".svg")},
                  [args.from_csv, args.cache or default_path()])
    if args.from_csv:
        return report(args.from_csv, [k for k in knobs if k in _header(args.from_csv)],
                      args.out)
    timing_only = not args.full
    csv_path = args.out.with_suffix(".csv")
    cache = ResultCache(args.cache or default_path())
    targets = [Target("app", a, origin=args.apps_from) for a in apps]
    done = 0

    def on_row(row):
        nonlocal done
        done += 1
        out.write(row)
        setting = ", ".join(f"{k}={row.get(k)}" for k in knobs if row.get(k) not in ("1",))
        print(f"[{done}] {row.get('target')} {setting or 'baseline'}: {row.get('status')} "
              f"{row.get('cycles', '')} cycles {row.get('error') or ''}", file=sys.stderr,
              flush=True)

    out = None
    try:
        if args.workers == 0:
            out = CsvStream(csv_path, knobs)
            run_sweep(targets, grid, on_row, cache=cache, timing_only=timing_only)
        else:
            from ..sweep.executor import dask_client
            with dask_client(args.scheduler, args.workers) as client:
                out = CsvStream(csv_path, knobs)      # after connecting: see tpuasm sweep
                run_sweep(targets, grid, on_row, cache=cache, client=client,
                          timing_only=timing_only)
        out.close()                # the CSV appears only now, complete
    except BaseException:          # Ctrl-C, a full disk: the old CSV stays as it was
        if out is not None:
            out.discard()
        raise
    finally:
        cache.close()
    return report(csv_path, knobs, args.out)


def _header(path: Path) -> list[str]:
    from ..files import read_text
    from ..limits import MAX_RESULTS_BYTES
    text = read_text(path, what="results CSV", limit=MAX_RESULTS_BYTES)
    return text.split("\n", 1)[0].strip().split(",")


def report(csv_path: Path, knobs, out: Path) -> int:
    from ..sweep.report import read_rows, relative, save_figure, weighted_mean
    rows = read_rows(csv_path)
    rel = relative(rows, knobs)
    # a point some app could not run (skipped) still gets the mean of the apps it has,
    # marked in the table, rather than leaving the knob's most telling factors blank
    mean = weighted_mean(rel, knobs, partial=True)
    for suffix in (".png", ".svg"):
        save_figure(rel, mean, knobs, out.with_suffix(suffix),
                    title="Figure 11 on the emulator: performance vs. scale factor",
                    mean_label="weighted mean (of the apps run)")
    print(findings_text(rel, mean, knobs))
    skipped = skipped_text(rows, knobs)
    if skipped:
        print(skipped)
    print(lstm1_example_text())
    return EXIT_OK


def skipped_text(rows, knobs) -> str:
    """The points an app could not be built for, with the generator's reason."""
    lines = []
    for r in rows:
        if r.get("status") in ("skipped", "error", "fault"):
            setting = ", ".join(f"{k} x{r.get(k)}" for k in knobs if r.get(k) not in ("1", None))
            lines.append(f"- {r.get('target')} {setting or 'baseline'}: {r.get('status')}, "
                         f"{r.get('error')}")
    return "\n".join(["Points not run:", *lines]) if lines else ""


def at(line, x):
    for xx, y in line or []:
        if abs(xx - x) < 1e-9:
            return y
    return None


def findings_text(rel: dict, mean: dict, knobs) -> str:
    lines = ["| parameter | factor | weighted mean (emulator) | paper | per app |",
             "|---|---|---|---|---|"]
    paper = {("memory", 4): FIGURE11["memory x4 (weighted mean)"],
             ("clock", 4): FIGURE11["clock x4 (weighted mean)"],
             ("clock+", 4): FIGURE11["clock x4 (weighted mean)"],
             ("matrix", 2): FIGURE11["matrix 512x512 (weighted mean)"],
             ("matrix+", 2): FIGURE11["matrix 512x512 (weighted mean)"]}
    from ..sweep.report import present
    apps = sorted({t for t, _ in rel}, key=lambda a: APPS.index(a) if a in APPS else 99)
    for knob in knobs:
        for x in (0.25, 0.5, 2, 4):
            m = at(mean.get(knob), x)
            per = ", ".join(f"{a} {at(rel.get((a, knob)), x):.2f}" for a in apps
                            if at(rel.get((a, knob)), x) is not None)
            if m is None and not per:
                continue
            missing = [a for a in apps if a not in present(rel, knob, x)]
            text = "" if m is None else f"{m:.2f}x"
            if m is not None and missing:
                text += f" (without {', '.join(missing)})"
            lines.append(f"| {knob} | x{x:g} | {text} | {paper.get((knob, x), '')} | {per} |")
    return "\n".join(lines)


def lstm1_example(array_size: int, source: str = "generator") -> dict:
    """LSTM1's 600 x 600 matrix times a batch of 96 on an N x N array (sigmoid gate), from
    the hand-written generator or compiled from a one-layer QDQ ONNX model."""
    import numpy as np

    from ..machine import Machine, MachineConfig
    from ..sweep.grid import config_for
    config = config_for({"matrix": ("x", array_size / 256)}, {})
    c = MachineConfig(**config)
    shape = dict(array_size=c.array_size, ub_rows=c.ub_rows, acc_rows=c.acc_rows,
                 fifo_depth=c.fifo_depth)
    if source == "generator":
        from .codegen import generate
        from .layers import FC, App, Tensor
        app = App("LSTM1-600x600", 96, {"x": Tensor("x", 600), "g": Tensor("g", 600)},
                  [FC("gate", ("x",), "g", "sigmoid")], ("x",), ())
        g = generate(app, **shape)
        text, host_rows, tiles = g.source, g.host_rows, g.weight_tiles
    else:
        text, host_rows, tiles = _compiled_gate(shape)
    from ..assembler import assemble
    m = Machine(c, timing_only=True)
    m.load(assemble(text, "lstm1_600x600.tasm"),
           host=np.zeros((host_rows, c.array_size), np.int8),
           weights=np.zeros((tiles, c.array_size, c.array_size), np.int8))
    m.run()
    cycles = int(m.counters()["cycles"])
    return {"array": c.array_size, "steps": tiles, "cycles": cycles,
            "us": cycles / c.clock_hz * 1e6, "fetch_cycles": c.fetch_cycles}


def _compiled_gate(shape: dict):
    """(source, host rows, weight tiles) of y = sigmoid(x @ W), x (96, 600) uint8, W 600 x
    600 int8, as a QDQ model through tpuasm.compile (Dense + its sigmoid lookup)."""
    import tempfile

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from ..compiler import compile as compile_model
    w = np.random.default_rng(0).integers(-127, 128, (600, 600)).astype(np.int8)
    inits = [numpy_helper.from_array(v, n) for n, v in (
        ("s_in", np.float32(1 / 255)), ("z_u8", np.uint8(0)), ("s_mid", np.float32(8 / 127)),
        ("z_i8", np.int8(0)), ("w", w), ("w_s", np.full(600, 1 / 1800, np.float32)),
        ("w_z", np.zeros(600, np.int8)))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_in", "z_u8"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s_in", "z_u8"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "w_s", "w_z"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["h"]),
             helper.make_node("QuantizeLinear", ["h", "s_mid", "z_i8"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "s_mid", "z_i8"], ["hd"]),
             helper.make_node("Sigmoid", ["hd"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "s_in", "z_u8"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "s_in", "z_u8"], ["y"])]
    graph = helper.make_graph(
        nodes, "lstm1_gate", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [96, 600])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [96, 600])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/gate.onnx"
        onnx.save(model, path)
        compiled = compile_model(path, batch=96, config=shape)
    (program,) = [s.program for s in compiled.steps if getattr(s, "program", None)]
    return program.source, program.host_rows, int(program.weights.shape[0])


def lstm1_example_text() -> str:
    rows = ["| program | array | tile steps | fetch per tile | cycles | us at 700 MHz | paper |",
            "|---|---|---|---|---|---|---|"]
    paper = {256: FIGURE11["LSTM1 600x600 at 256x256"], 512: FIGURE11["LSTM1 600x600 at 512x512"]}
    for source in ("generator", "compiler"):
        for n in (256, 512):
            r = lstm1_example(n, source)
            rows.append(f"| {source} | {n} x {n} | {r['steps']} | {r['fetch_cycles']:,} | "
                        f"{r['cycles']:,} | {r['us']:.1f} | {paper[n]} |")
    return "\n".join(rows)


if __name__ == "__main__":         # Ctrl-C, a full disk, ...: the one command layer
    from ..command import exit_with
    exit_with(main)

"""The paper's section 7 (Figure 11): alternative TPU designs, reproduced on the emulator.

    python -m tpuasm.apps.figure11 [--apps A,B] [--out docs/figure11] [--full]
                                   [--scheduler ADDR] [--workers N] [--factors ...]
                                   [--no-tpu-prime] [--from-csv CSV]

Scales one parameter at a time from 0.25x to 4x over the six apps (tpuasm.sweep knobs:
memory, clock, clock+, matrix, matrix+; their formulas are in tpuasm/sweep/grid.py), and
runs the paper's TPU' design point (GDDR5 Weight Memory, x5.4, and a 1050 MHz clock, alone
and together: section7.TPU_PRIME).  Writes OUT.csv, OUT.png and OUT.svg, and prints every
point's weighted and geometric means, section 7's claims one by one with the emulator's
figure (section7.py), and the LSTM1 600 x 600 example at 256 x 256 and 512 x 512 for the
hand-written program (programs/lstm1_600x600) and the compiler.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..command import EXIT_OK, EXIT_USAGE
from .paper import APPS, FIGURE11
from .section7 import TPU_PRIME, TPU_PRIME_TEXT

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
    p.add_argument("--no-tpu-prime", action="store_true",
                   help="skip the TPU' points (run when both memory and clock are swept)")
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
    from ..sweep.report import CsvStream
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
    targets = [Target("app", a) for a in apps]
    grids = [grid]
    if not args.no_tpu_prime and all(k in knobs for k in TPU_PRIME):
        grids += tpu_prime_grids()
    done = 0

    def on_row(row):
        nonlocal done
        done += 1
        out.write({k: "1" for k in knobs} | row)     # TPU' points set two knobs only
        setting = ", ".join(f"{k}={row.get(k)}" for k in knobs if row.get(k) not in ("1",))
        print(f"[{done}] {row.get('target')} {setting or 'baseline'}: {row.get('status')} "
              f"{row.get('cycles', '')} cycles {row.get('error') or ''}", file=sys.stderr,
              flush=True)

    out = None
    try:
        if args.workers == 0:
            out = CsvStream(csv_path, knobs)
            for g in grids:
                run_sweep(targets, g, on_row, cache=cache, timing_only=timing_only)
        else:
            from ..cluster import dask_client
            with dask_client(args.scheduler, args.workers) as client:
                out = CsvStream(csv_path, knobs)      # after connecting: see tpuasm sweep
                for g in grids:
                    run_sweep(targets, g, on_row, cache=cache, client=client,
                              timing_only=timing_only)
        # the figure and the findings are drawn from the staged rows, and the CSV replaces
        # the old one only after them: Ctrl-C at any point leaves the previous CSV
        code = report(Path(out.file.tmp), knobs, args.out)
        out.close()
    except BaseException:          # Ctrl-C, a full disk: the old CSV stays as it was
        if out is not None:
            out.discard()
        raise
    finally:
        cache.close()
    return code


def _header(path: Path) -> list[str]:
    from ..files import read_text
    from ..limits import MAX_RESULTS_BYTES
    text = read_text(path, what="results CSV", limit=MAX_RESULTS_BYTES)
    return text.split("\n", 1)[0].strip().split(",")


def tpu_prime_grids():
    """TPU' (section 7): the clock at 1050 MHz alone, GDDR5 alone (each one knob), and
    both together (one point of a two-knob product)."""
    from ..sweep.grid import Grid, parse_set
    clock = parse_set(f"clock={TPU_PRIME_TEXT['clock']}")
    memory = parse_set(f"memory={TPU_PRIME_TEXT['memory']}")
    return [Grid([clock, memory], {}, each=True), Grid([clock, memory], {}, each=False)]


def report(csv_path: Path, knobs, out: Path) -> int:
    from ..sweep.report import geometric_mean, read_rows, relative, save_figure, weighted_mean
    from .section7 import claims_text, evaluate, is_tpu_prime_row, tpu_prime
    rows = read_rows(csv_path)
    figure_rows = [r for r in rows if not is_tpu_prime_row(r, knobs)]
    rel = relative(figure_rows, knobs)
    # a point some app could not run (skipped) still gets the mean of the apps it has,
    # marked in the table, rather than leaving the knob's most telling factors blank
    mean = weighted_mean(rel, knobs, partial=True)
    geo = geometric_mean(rel, knobs, partial=True)
    save_figure(rel, mean, knobs, [out.with_suffix(".png"), out.with_suffix(".svg")],
                title="Figure 11 on the emulator: performance vs. scale factor",
                mean_label="weighted mean (of the apps run)", geo=geo)
    print(findings_text(rel, mean, knobs, geo))
    skipped = skipped_text(rows, knobs)
    if skipped:
        print(skipped)
    prime = tpu_prime(rows, knobs)
    if prime:
        print()
        print(tpu_prime_text(prime))
    example = lstm1_examples()
    print()
    print(lstm1_example_text(example))
    apps = sorted({t for t, _ in rel if t in APPS}, key=APPS.index)
    ub = {a: ub_mib(a) for a in apps}
    print()
    print(claims_text(evaluate(rel, mean, geo, example, prime, ub)))
    return EXIT_OK


def ub_mib(app: str) -> float:
    """MiB of the Unified Buffer the app's TPU v1 program touches, for Table 8."""
    from ..machine import Machine, MachineConfig
    from .programs import app_program
    from .tables import derived
    ap = app_program(app)

    def compute():
        machine = Machine(MachineConfig(), timing_only=True)
        machine.load(ap.program(), *ap.data())
        return ub_bytes_touched(machine)
    return derived(ap, "ub-bytes", compute) / 2 ** 20


def ub_bytes_touched(machine) -> int:
    """Bytes of the Unified Buffer the loaded program reads or writes: the union of every
    instruction's UB rows (exact for strided accesses), known from the program alone
    (tpuasm.machine.access), times the row width."""
    import numpy as np

    from ..machine.access import MEMORY_CODES, AccessMap
    access = AccessMap(machine)
    ub = access.mem == MEMORY_CODES["ub"]
    lo, hi = access.lo[ub], access.hi[ub]
    used = np.zeros(int(hi.max(initial=0)), bool)
    for a, b in zip(lo, hi):
        used[a:b] = True
    return int(used.sum()) * machine.config.array_size


def tpu_prime_text(prime: dict) -> str:
    lines = ["| TPU' design point | weighted mean | geometric mean | paper | per app |",
             "|---|---|---|---|---|"]
    paper = {"clock": "almost no change", "memory": "GM 2.6, WM 3.9",
             "both": "GM 2.9, WM not raised"}
    names = {"clock": "clock 1050 MHz (x1.5), DDR3", "memory": "GDDR5 (x5.4), 700 MHz",
             "both": "GDDR5 and 1050 MHz"}
    for which in ("clock", "memory", "both"):
        p = prime.get(which)
        if p:
            per = ", ".join(f"{a} {y:.2f}" for a, y in sorted(
                p["apps"].items(), key=lambda i: APPS.index(i[0]) if i[0] in APPS else 99))
            lines.append(f"| {names[which]} | {p['weighted']:.2f}x | {p['geometric']:.2f}x | "
                         f"{paper[which]} | {per} |")
    return "\n".join(lines)


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


def findings_text(rel: dict, mean: dict, knobs, geo: dict | None = None) -> str:
    lines = ["| parameter | factor | weighted mean | geometric mean | paper | per app |",
             "|---|---|---|---|---|---|"]
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
            g = at((geo or {}).get(knob), x)
            per = ", ".join(f"{a} {at(rel.get((a, knob)), x):.2f}" for a in apps
                            if at(rel.get((a, knob)), x) is not None)
            if m is None and not per:
                continue
            missing = [a for a in apps if a not in present(rel, knob, x)]
            text = "" if m is None else f"{m:.2f}x"
            gtext = "" if g is None else f"{g:.2f}x"
            if m is not None and missing:
                text += f" (without {', '.join(missing)})"
            lines.append(f"| {knob} | x{x:g} | {text} | {gtext} | {paper.get((knob, x), '')} "
                         f"| {per} |")
    return "\n".join(lines)


def lstm1_example(array_size: int, source: str = "hand") -> dict:
    """LSTM1's 600 x 600 matrix times a batch of 96 on an N x N array (sigmoid gate): the
    hand-written program (programs/lstm1_600x600, one .tasm per array size) or compiled
    from a one-layer QDQ ONNX model.  Timing-only on zero data."""
    import numpy as np

    from ..machine import Machine, MachineConfig
    from ..sweep.grid import config_for
    config = config_for({"matrix": ("x", array_size / 256)}, {})
    c = MachineConfig(**config)
    shape = dict(array_size=c.array_size, ub_rows=c.ub_rows, acc_rows=c.acc_rows,
                 fifo_depth=c.fifo_depth)
    if source == "hand":
        from ..assembler import assemble_file
        program = assemble_file(hand_written_example(array_size), config=shape)
        host_rows, tiles = _declared(program, "host"), _declared(program, "tile")
    elif source == "compiler":
        from ..assembler import assemble
        text, host_rows, tiles = _compiled_gate(shape)
        program = assemble(text, "lstm1_600x600.tasm")
    else:
        raise ValueError(f"source must be hand or compiler, not {source!r}")
    m = Machine(c, timing_only=True)
    m.load(program, host=np.zeros((host_rows, c.array_size), np.int8),
           weights=np.zeros((tiles, c.array_size, c.array_size), np.int8))
    m.run()
    cycles = int(m.counters()["cycles"])
    return {"array": c.array_size, "steps": tiles, "cycles": cycles,
            "us": cycles / c.clock_hz * 1e6, "fetch_cycles": c.fetch_cycles}


def hand_written_example(array_size: int) -> Path:
    """programs/lstm1_600x600's program for this array (256: the regression program;
    512: its 2 x 2-tile twin)."""
    from ..errors import InputFileError
    folder = Path(__file__).resolve().parents[2] / "programs" / "lstm1_600x600"
    name = "lstm1_600x600.tasm" if array_size == 256 else f"lstm1_600x600_{array_size}.tasm"
    if not (folder / name).is_file():
        raise InputFileError(f"{folder / name}: no hand-written LSTM1 example for a "
                             f"{array_size} x {array_size} array (256 and 512 exist)")
    return folder / name


def _declared(program, kind: str) -> int:
    """Rows (host) or tiles (weights) the program's regions of that kind reach."""
    return max((s.value + s.size for s in program.symbols if s.kind == kind), default=1)


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


def lstm1_examples() -> dict:
    """{(program, array): lstm1_example(...)} for both programs at 256 and 512."""
    return {(source, n): lstm1_example(n, source)
            for source in ("hand", "compiler") for n in (256, 512)}


def lstm1_example_text(example: dict | None = None) -> str:
    example = example or lstm1_examples()
    rows = ["| program | array | tile steps | fetch per tile | cycles | us at 700 MHz | paper |",
            "|---|---|---|---|---|---|---|"]
    paper = {256: FIGURE11["LSTM1 600x600 at 256x256"], 512: FIGURE11["LSTM1 600x600 at 512x512"]}
    names = {"hand": "hand-written (programs/lstm1_600x600)", "compiler": "compiled app layer"}
    for (source, n), r in example.items():
        rows.append(f"| {names[source]} | {n} x {n} | {r['steps']} | {r['fetch_cycles']:,} | "
                    f"{r['cycles']:,} | {r['us']:.1f} | {paper[n]} |")
    return "\n".join(rows)


if __name__ == "__main__":         # Ctrl-C, a full disk, ...: the one command layer
    from ..command import exit_with
    exit_with(main)

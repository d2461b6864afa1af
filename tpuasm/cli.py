"""The `tpuasm` command line: thin faces over the library.

Exit status (tpuasm/command.py, the one place they are defined): 0 success, 1 the
machine faulted (or tests failed), 2 usage, assembly, binary-format or data-file errors,
130 interrupted.  Every command, the delegated ones too, ends through command.run_face.  Heavy modules (numba, the machine) are imported
only by the commands that need them, so `tpuasm asm` and `--help` start fast.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .command import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run_face
from .errors import TpuasmError
from .program import is_opentpu, load_program, named, read_program

EXIT_FAULT = EXIT_FAILED     # the name the compiler's faces import


def main(argv: list[str] | None = None) -> int:
    """The `tpuasm` command: every subcommand through the one command layer."""
    return run_face(_main, sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    # Faces with their own argument parsers take the rest of the command line as is.
    if argv and argv[0] in _DELEGATES:
        return _delegate(argv[0], argv[1:])
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_USAGE
    return args.handler(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tpuasm", description=(
        "Assembler, cycle-level emulator and debugger for Google's TPU v1.  "
        "`tpuasm COMMAND --help` explains each command."))
    p.add_argument("--version", action="version", version=f"tpuasm {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    a = sub.add_parser("asm", help="assemble a .tasm program into a .tbin binary",
                       description="Assemble PROG.tasm.  On any error every mistake is reported "
                                   "with its position and nothing is written.")
    a.add_argument("source", type=Path, help="the .tasm file")
    a.add_argument("-o", "--output", type=Path, help="output binary (default: PROG.tbin)")
    a.add_argument("--listing", type=Path, metavar="FILE",
                   help="write a listing: index, byte address, hex bytes, source line")
    a.add_argument("--symbols", type=Path, metavar="FILE", help="write the symbol map")
    a.add_argument("--no-debug", action="store_true",
                   help="omit source text, line table and symbols from the binary")
    a.add_argument("--format", choices=("tbin", "opentpu"),
                   help="output format: tbin (default) or OpenTPU's 14-byte binary "
                        "(the default when -o ends in .out); spec/opentpu.md")
    a.add_argument("--strip-nops", action="store_true",
                   help="drop every NOP (the pipeline interlocks; the output is the same)")
    _config_option(a)
    _profile_options(a)
    a.set_defaults(handler=cmd_asm)

    d = sub.add_parser("disasm", help="disassemble a binary into .tasm source",
                       description="Print .tasm that assembles back to the same code.")
    d.add_argument("binary", type=Path, help="the .tbin file or OpenTPU binary (.out)")
    d.add_argument("--format", choices=("tbin", "opentpu"),
                   help="the binary's format (default: by content, then extension)")
    d.add_argument("--annotate", action="store_true",
                   help="add the original source line of each instruction as a comment")
    d.add_argument("-o", "--output", type=Path, help="write to a file instead of stdout")
    d.set_defaults(handler=cmd_disasm)

    r = sub.add_parser("run", help="run a program on the emulator",
                       description="Run PROG.tasm or PROG.tbin and print cycles and statistics.  "
                                   "Exit 0 after Halt, 1 on a machine fault, 2 on input errors.")
    r.add_argument("program", type=Path, help="a .tasm source or .tbin binary")
    r.add_argument("--host", type=Path, help="host memory image: .npy of shape (rows, N), int8/uint8")
    r.add_argument("--weights", type=Path, help="weight image: .npy of shape (tiles, N, N), int8/uint8")
    r.add_argument("--out", type=Path, help="write the final host memory here (.npy, same dtype as --host)")
    r.add_argument("--stats", type=Path, metavar="STATS.json", help="write statistics as JSON")
    r.add_argument("--trace", type=Path, metavar="TRACE.json",
                   help="write a Chrome trace (open in Perfetto or chrome://tracing)")
    r.add_argument("--max-cycles", type=_cycle_count, metavar="N", help="fault after N cycles")
    r.add_argument("--hazards", choices=("interlock", "error"), default="interlock",
                   help="'error': a dependency left to the interlocks without a sync is a fault")
    r.add_argument("-q", "--quiet", action="store_true", help="print only faults")
    r.add_argument("--format", choices=("tbin", "opentpu"),
                   help="read PROG as this binary format (default: by content, then extension)")
    r.add_argument("--timing", choices=("tpu", "opentpu"),
                   help="latencies: TPU v1's, or OpenTPU's documented ones "
                        "(default: the program's profile)")
    r.add_argument("--timing-only", action="store_true",
                   help="cycles, counters and faults without the data path (for sweeps; "
                        "no memory contents, so not with --out)")
    _config_option(r, machine=True)
    _profile_options(r)
    r.set_defaults(handler=cmd_run)

    lint = sub.add_parser("lint", help="report NOPs the interlocked pipeline makes unnecessary",
                          description="List every run of NOPs with its position and the "
                                      "dependency it pads.  Exit 0 when there are none, 1 when "
                                      "there are, 2 on errors.")
    lint.add_argument("program", type=Path, help="a .tasm/.a source or a binary")
    lint.add_argument("--format", choices=("tbin", "opentpu"),
                      help="read PROG as this binary format (default: by content, then extension)")
    lint.add_argument("--opentpu", action="store_true",
                      help="also check that the NOP padding is enough for OpenTPU's hardware, "
                           "which has no interlocks")
    _config_option(lint)
    _profile_options(lint)
    lint.set_defaults(handler=cmd_lint)

    for name, (_, _, text) in _DELEGATES.items():
        sub.add_parser(name, help=f"{text} (see `tpuasm {name} --help`)", add_help=False)

    m = sub.add_parser("demo", help="run a real multi-layer program and show what happened")
    m.set_defaults(handler=cmd_demo)
    return p


def parse_arguments(parser: argparse.ArgumentParser, argv) -> tuple:
    """(args, None), or (None, exit status) where argparse would exit the process: 0 after
    --help, 2 after a usage error (argparse has printed its message).  The delegated commands
    return their status instead of exiting, so they can be called as functions."""
    try:
        return parser.parse_args(argv), None
    except SystemExit as e:
        return None, int(e.code or 0)


def positive_int(text: str) -> int:
    """An argparse type for counts (--batch, --jobs): a whole number, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {n}")
    return n


def _config_option(p: argparse.ArgumentParser, machine: bool = False) -> None:
    from .binary import CONFIG_KEYS
    more = ("; and any other MachineConfig field, e.g. clock_hz=1.4e9, "
            "weight_bytes_per_cycle=97.1, host_latency_cycles=0") if machine else ""
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="machine shape, overriding the source's .config: "
                        f"{', '.join(CONFIG_KEYS)} (repeatable or comma-separated){more}")


def _profile_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", choices=("tpu", "opentpu"),
                   help="machine profile; opentpu: OpenTPU's Activate (spec/opentpu.md)")
    p.add_argument("--matsize", type=int, choices=(8, 16),
                   help="OpenTPU's array size N (default under --profile opentpu: from the "
                        "data files, else 8)")


def _shape_config(args, opentpu_file: bool = False) -> dict:
    """--config, --profile and --matsize as one `.config` dict (an OpenTPU binary implies
    --profile opentpu)."""
    config = parse_config(args.config)
    profile = args.profile
    if profile is None and opentpu_file:
        profile = "opentpu"
    if profile is None and args.matsize is None and config.get("profile") != "opentpu":
        return config           # nothing OpenTPU's: keep numpy out of `tpuasm asm`
    from .opentpu import shape_config
    return shape_config(config, profile, args.matsize,
                        getattr(args, "host", None), getattr(args, "weights", None))


def _positive_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _cycle_count(text: str) -> int:
    from .limits import MAX_CYCLES
    value = _positive_int(text)
    if value > MAX_CYCLES:
        raise argparse.ArgumentTypeError(f"at most {MAX_CYCLES} (2**62): {value}")
    return value


def parse_config(items: list[str]) -> dict:
    """`--config array_size=16,ub_rows=1024` -> {"array_size": 16, "ub_rows": 1024}
    (tpuasm.settings, the one parser every command shares)."""
    from .settings import parse_shape
    return parse_shape(items)


def cmd_asm(args) -> int:
    from .assembler import assemble_file, listing, symbol_map
    from .files import check_input, check_outputs
    check_input(args.source, what="source file")     # `tpuasm asm .`: a clear error first
    opentpu_out = args.format == "opentpu" or (args.format is None and args.output is not None
                                               and args.output.suffix == ".out")
    out = args.output or args.source.with_suffix(".out" if opentpu_out else ".tbin")
    outputs = {"-o": out, "--listing": args.listing, "--symbols": args.symbols}
    check_outputs(outputs, [args.source])              # before the work: fail fast
    program = assemble_file(args.source, config=_shape_config(args) or None)
    check_outputs(outputs, [args.source, *program.sources])   # includes are inputs too
    if args.strip_nops:
        from .lint import strip_nops
        program = strip_nops(program)
    if opentpu_out:
        from .opentpu import WORD_BYTES, opentpu_listing, to_opentpu_bytes
        data = to_opentpu_bytes(program)
        count = len(data) // WORD_BYTES
        make_listing = opentpu_listing          # the listing of the bytes written
    else:
        data = (program.stripped() if args.no_debug else program).to_bytes()
        count = len(program)
        make_listing = listing
    from .files import write_together
    # every output is rendered and checked first, then all are committed or none
    write_together([(out, data),
                    (args.listing, make_listing(program) if args.listing else None),
                    (args.symbols, symbol_map(program) if args.symbols else None)])
    print(f"{out}: {count} instructions, {len(data)} bytes", file=sys.stderr)
    return EXIT_OK


def cmd_disasm(args) -> int:
    from .files import check_outputs
    check_outputs({"-o": args.output}, [args.binary])
    data = read_program(args.binary)
    if is_opentpu(args.binary, data, args.format):
        from .opentpu import from_opentpu_bytes, to_opentpu_source
        text = to_opentpu_source(named(args.binary, from_opentpu_bytes, data))
    else:
        from .binary import Program
        from .disassembler import disassemble
        text = disassemble(named(args.binary, Program.from_bytes, data), annotate=args.annotate)
    if args.output:
        _write(args.output, text.encode())
    else:
        sys.stdout.write(text)
    return EXIT_OK


def cmd_run(args) -> int:
    from .files import check_outputs
    from .runreport import run_and_report, split_machine_settings
    if args.timing_only and args.out:
        raise TpuasmError("--timing-only computes no memory contents: there is no host "
                          "memory to write with --out (drop one of the two)")
    check_outputs({"--out": args.out, "--stats": args.stats, "--trace": args.trace},
                  [args.program, args.host, args.weights])
    # --config also takes every other MachineConfig field (clock_hz=1.4e9, ...): the
    # machine gets those, the assembler the shape keys
    args.config, args.machine_config = split_machine_settings(args.config)
    data = read_program(args.program)
    opentpu_file = is_opentpu(args.program, data, args.format)
    program = load_program(args.program, _shape_config(args, opentpu_file), args.format, data=data)
    if args.timing is None and program.shape.profile == "opentpu":
        args.timing = "opentpu"            # OpenTPU's programs get OpenTPU's latencies
    return run_and_report(program, args)


def cmd_lint(args) -> int:
    from .lint import lint, render
    if args.opentpu and args.profile is None:
        args.profile = "opentpu"           # OpenTPU's latencies depend on its array size
    data = read_program(args.program)
    opentpu_file = is_opentpu(args.program, data, args.format)
    program = load_program(args.program, _shape_config(args, opentpu_file), args.format, data=data)
    findings = lint(program)
    sys.stdout.write(render(findings, program, str(args.program), color=_color(sys.stdout)))
    if args.opentpu:
        from .lint import opentpu_hazards, render_hazards
        from .opentpu import check_opentpu
        check_opentpu(program)             # an OpenTPU program at all? (errors with positions)
        hazards = opentpu_hazards(program)
        sys.stdout.write("\n" + render_hazards(hazards, program, str(args.program),
                                                color=_color(sys.stdout)))
        findings = findings + hazards
    return EXIT_FAULT if findings else EXIT_OK


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo()


def _write(path: Path, data: bytes) -> None:
    from .files import atomic_write
    atomic_write(path, data)


def _color(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


# Faces with their own argument parsers: COMMAND -> (module, function, one-line help).
# Each gets the rest of the command line as is; its module is imported only when used.
_DELEGATES = {
    "test": ("tpuasm.regression", "main", "run regression manifests"),
    "debug": ("debugger", "main", "the terminal debugger"),
    "compile": ("tpuasm.compiler.cli", "compile_main", "compile an ONNX model into TPU programs"),
    "infer": ("tpuasm.compiler.cli", "infer_main", "run a compiled model on the emulator"),
    "profile": ("tpuasm.apps.cli", "profile_main",
                "the paper's six applications: Table 3 next to the paper's"),
    "sweep": ("tpuasm.sweep.cli", "main", "design-space sweeps over machine configurations"),
    "fmt": ("tpuasm.fmt", "main", "format .tasm sources in one canonical layout"),
    "lsp": ("tpuasm.lsp", "main", "the .tasm language server (stdio)"),
}


def _delegate(command: str, argv: list[str]) -> int:
    import importlib
    module, function, _ = _DELEGATES[command]
    return getattr(importlib.import_module(module), function)(argv)

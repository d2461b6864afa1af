"""Command line of the debugger: load a program and its data, then the screen or a batch script.

Exit codes: 0 ok, 1 a batch command failed or an `expect` did not hold, 2 usage or input
errors (missing file, assembly error, bad data file).  No user error prints a traceback.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

USAGE_ERROR, COMMAND_FAILED = 2, 1


class InputError(Exception):
    """A problem with what the user gave us: reported in one message, exit code 2.
    `rendered`: the message is already an assembler diagnostic ("FILE:L:C: error: ...")."""

    def __init__(self, message: str, rendered: bool = False):
        super().__init__(message)
        self.rendered = rendered


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm debug",
        description="Step-debug a TPU program: source, pipeline, timeline, memories, counters.  "
                    "With --batch, run a script of debugger commands without a screen.")
    p.add_argument("program", type=Path, help="PROG.tasm, PROG.tbin, or OUTDIR (a compiled model: "
                   "its first TPU segment with that segment's data; `segment NAME` switches)")
    p.add_argument("--segment", metavar="NAME", help="with OUTDIR: the segment to open first")
    p.add_argument("--input", type=Path, metavar="X.npy|X.npz",
                   help="with OUTDIR: the model's inputs (float, rows first; the first batch is "
                        "used): each segment gets the host image it sees when the model runs "
                        "on them, instead of the sample batch saved in OUTDIR")
    p.add_argument("--host", type=Path, metavar="HOST.npy", help="host memory image (rows, N) int8/uint8")
    p.add_argument("--weights", type=Path, metavar="W.npy", help="weight image (tiles, N, N) int8/uint8")
    p.add_argument("--batch", type=Path, metavar="SCRIPT",
                   help="run the debugger commands in SCRIPT ('-' for stdin) and exit")
    p.add_argument("--screenshot", type=Path, metavar="OUT.svg",
                   help="draw the screen without a terminal, after running the --batch script "
                        "in it if given, save it as an SVG and exit")
    p.add_argument("--size", default="170x50", metavar="COLSxROWS",
                   help="terminal size for --screenshot (default 170x50)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="machine shape or setting: array_size, ub_rows, acc_rows, fifo_depth, "
                        "profile, hazards, timing, ... (repeatable or comma-separated)")
    return p


def split_config(items: list[str]) -> tuple[dict, dict]:
    """--config items -> (program shape overrides, other machine settings).  The shape's
    keys and values are read as `tpuasm --config` and `.config` read them."""
    from tpuasm.binary import config_key, parse_setting
    from tpuasm.literals import parse_int
    shape, machine = {}, {}
    for item in items:
        for part in filter(None, (s.strip() for s in item.split(","))):
            key, sep, value = (x.strip() for x in part.partition("="))
            if not sep or not key:
                raise InputError(f"--config {part!r}: expected KEY=VALUE")
            name = config_key(key)
            if name is not None:
                try:
                    shape[name] = parse_setting(name, value)
                except ValueError as e:
                    raise InputError(f"--config {e}") from None
                continue
            known = _machine_settings()
            if key not in known:
                raise InputError(f"--config {key}: unknown setting (choose from {', '.join(known)})")
            parsed = parse_int(value)
            machine[key] = value if parsed is None else parsed
    return shape, machine


def _machine_settings() -> list[str]:
    """Every --config key: the program shape's and the machine's (MachineConfig) fields."""
    from dataclasses import fields
    from tpuasm.binary import MachineShape
    from tpuasm.machine import MachineConfig
    names = [f.name for f in fields(MachineShape)]
    return names + [f.name for f in fields(MachineConfig) if f.name not in names]


def load_session(args):
    """Program + data -> Session, turning every library error into an InputError."""
    from tpuasm.errors import AssemblyError, TpuasmError
    from tpuasm.program import load_program
    from .session import Session

    shape, overrides = split_config(args.config)
    if not args.program.exists():
        raise InputError(f"{args.program}: no such file")
    segment = None
    if args.program.is_dir() or getattr(args, "segment", None):
        # a compiled model: a segment's program, with its own data unless given
        from tpuasm.compiler.outdir import segment_files
        try:
            segment = segment_files(args.program, getattr(args, "segment", None))
        except TpuasmError as e:
            raise InputError(str(e)) from None
        args.program = segment.program
        args.weights = args.weights or segment.weights
        images, parts = None, {}
        if getattr(args, "input", None) is not None:
            from .model_inputs import model_run
            try:
                images, parts = model_run(segment.program.parent, args.input)
            except TpuasmError as e:
                raise InputError(f"--input {e}") from None
            except (ValueError, KeyError) as e:
                raise InputError(f"--input {args.input}: {e}") from None
            args.host = images[segment.name]
        else:
            args.host = args.host or segment.host
    for label, path in (("--host", args.host), ("--weights", args.weights)):
        if isinstance(path, Path) and not path.exists():
            raise InputError(f"{label} {path}: no such file")
    try:
        program = load_program(args.program, shape or None)
    except AssemblyError as e:
        raise InputError(e.render(color=sys.stderr.isatty()), rendered=True) from None
    except TpuasmError as e:
        raise InputError(str(e)) from None
    try:
        session = Session(program, host=args.host, weights=args.weights, overrides=overrides,
                          source_name=str(args.program), reload_from=(args.program, shape))
        if segment is not None:
            session.outdir, session.segment = segment.program.parent, segment.name
            session.segment_hosts = images or {}
            session.host_parts = parts
        return session
    except TpuasmError as e:
        raise InputError(str(e)) from None
    except TypeError as e:          # an unknown --config key reaches MachineConfig
        raise InputError(f"--config: {e}") from None
    except (ValueError, OSError) as e:
        raise InputError(f"cannot load: {e}") from None


def main(argv: list[str] | None = None) -> int:
    from . import blas_start
    blas_start.start_single_threaded()      # before numpy: its threads wait for the screen
    try:
        return _main(argv)
    finally:
        blas_start.restore()


def _main(argv: list[str] | None) -> int:
    from . import blas_start
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:            # argparse printed the usage message already
        return 0 if e.code == 0 else USAGE_ERROR
    try:
        size, script = check_arguments(args)
        session = load_session(args)
    except InputError as e:
        print(str(e) if e.rendered or "\n" in str(e) else f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    if args.screenshot is not None:
        return screenshot(session, script or "", args.screenshot, size)
    if script is not None:
        blas_start.restore()
        from .batch import run_batch
        return run_batch(session, script, name=str(args.batch))
    from .app import DebuggerApp
    app = DebuggerApp(session)
    app.run()
    return app.return_code or 0


def check_arguments(args) -> tuple[tuple[int, int] | None, str | None]:
    """Everything that can be refused, refused before any work: the screen size, the
    script (a regular file of bounded size: /dev/zero is refused, not read forever) and
    the screenshot's path (never one of the session's inputs).  (size, script text)."""
    from tpuasm.errors import TpuasmError
    from tpuasm.files import check_outputs
    size = parse_size(args.size) if args.screenshot is not None else None
    script = read_script(args.batch) if args.batch is not None else None
    if args.screenshot is not None:
        try:
            check_outputs([("--screenshot", args.screenshot)], inputs=session_inputs(args))
        except TpuasmError as e:
            raise InputError(str(e)) from None
    return size, script


MIN_SIZE, MAX_SIZE = (40, 10), (1000, 400)     # --size: columns x rows a screenshot may have


def parse_size(text: str) -> tuple[int, int]:
    """`120x40` -> (120, 40), range-checked (a 100000x100000 screen would take gigabytes)."""
    m = re.fullmatch(r"\s*(\d{1,7})\s*[xX]\s*(\d{1,7})\s*", text)
    if not m:
        raise InputError(f"--size {text!r}: expected COLSxROWS, e.g. 120x40")
    cols, rows = int(m.group(1)), int(m.group(2))
    if not (MIN_SIZE[0] <= cols <= MAX_SIZE[0] and MIN_SIZE[1] <= rows <= MAX_SIZE[1]):
        raise InputError(f"--size {text}: columns must be {MIN_SIZE[0]}..{MAX_SIZE[0]} and rows "
                         f"{MIN_SIZE[1]}..{MAX_SIZE[1]}")
    return cols, rows


def read_script(path: Path) -> str:
    """The --batch script ('-': stdin), through the library's bounded reader."""
    from tpuasm import limits
    from tpuasm.errors import TpuasmError
    from tpuasm.files import read_input
    if str(path) == "-":
        stream = getattr(sys.stdin, "buffer", sys.stdin)      # a text stream in tests
        data = stream.read(limits.MAX_SCRIPT_BYTES + 1)
        data = data.encode("utf-8") if isinstance(data, str) else data
        if len(data) > limits.MAX_SCRIPT_BYTES:
            raise InputError(f"--batch -: the script is larger than the "
                             f"{limits.human_bytes(limits.MAX_SCRIPT_BYTES)} limit")
    else:
        try:
            data = read_input(path, what="batch script", limit=limits.MAX_SCRIPT_BYTES)
        except TpuasmError as e:
            raise InputError(f"--batch {e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"--batch {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def session_inputs(args) -> list[Path]:
    """Every file the session reads: no output may replace one of them."""
    paths = [args.program, args.host, args.weights, getattr(args, "input", None)]
    if args.program.is_dir():                   # a compiled model: every file in it
        paths += [p for p in args.program.iterdir() if p.is_file()]
    if args.batch is not None and str(args.batch) != "-":
        paths.append(args.batch)
    return [p for p in paths if p is not None]


def screenshot(session, script: str, out: Path, size: tuple[int, int]) -> int:
    """Run `script` on the screen without a terminal and save what it shows (docs/debugger.svg
    is made this way), written atomically: a failure leaves no half-written file."""
    from tpuasm.errors import TpuasmError
    from tpuasm.files import atomic_write
    from .app import DebuggerApp
    from .commands import split_script
    cols, rows = size
    svg: list[str] = []
    app = DebuggerApp(session)
    failed = []

    async def drive(pilot):
        await pilot.pause()
        for lineno, line in split_script(script):
            app.execute(line)
            await app.workers.wait_for_complete()
            await pilot.pause()
            if session.last_stop is not None and session.last_stop.kind == "error":
                failed.append(lineno)
        app.query_one("#source").focus()
        await pilot.pause()
        svg.append(app.export_screenshot(title=out.stem))
        app.exit()

    app.run(headless=True, size=(cols, rows), auto_pilot=drive)
    if not svg:
        print(f"error: --screenshot {out}: the screen was not drawn", file=sys.stderr)
        return USAGE_ERROR
    try:
        atomic_write(out, svg[0], what="the screenshot")
    except TpuasmError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    print(f"saved {out}")
    return COMMAND_FAILED if failed else 0

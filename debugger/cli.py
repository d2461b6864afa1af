"""Command line of the debugger: load a program and its data, then the screen or a batch script.

Exit codes: 0 ok, 1 a batch command failed or an `expect` did not hold, 2 usage or input
errors (missing file, assembly error, bad data file).  No user error prints a traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

USAGE_ERROR, COMMAND_FAILED = 2, 1


class InputError(Exception):
    """A problem with what the user gave us: reported in one message, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuasm debug",
        description="Step-debug a TPU program: source, pipeline, timeline, memories, counters.  "
                    "With --batch, run a script of debugger commands without a screen.")
    p.add_argument("program", type=Path, help="PROG.tasm or PROG.tbin")
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
    from tpuasm.cli import load_program
    from .session import Session

    shape, overrides = split_config(args.config)
    if not args.program.exists():
        raise InputError(f"{args.program}: no such file")
    for label, path in (("--host", args.host), ("--weights", args.weights)):
        if path is not None and not path.exists():
            raise InputError(f"{label} {path}: no such file")
    try:
        program = load_program(args.program, shape or None)
    except AssemblyError as e:
        raise InputError(e.render(color=sys.stderr.isatty())) from None
    except TpuasmError as e:
        raise InputError(str(e)) from None
    try:
        return Session(program, host=args.host, weights=args.weights, overrides=overrides,
                       source_name=str(args.program), reload_from=(args.program, shape))
    except TpuasmError as e:
        raise InputError(str(e)) from None
    except TypeError as e:          # an unknown --config key reaches MachineConfig
        raise InputError(f"--config: {e}") from None
    except (ValueError, OSError) as e:
        raise InputError(f"cannot load: {e}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:            # argparse printed the usage message already
        return 0 if e.code == 0 else USAGE_ERROR
    script = None
    if args.batch is not None:
        try:
            script = sys.stdin.read() if str(args.batch) == "-" else args.batch.read_text()
        except (OSError, UnicodeDecodeError) as e:
            print(f"error: --batch {args.batch}: cannot read: {e}", file=sys.stderr)
            return USAGE_ERROR
    problem = _unwritable(args.screenshot) if args.screenshot is not None else None
    if problem:
        print(f"error: --screenshot {args.screenshot}: {problem}", file=sys.stderr)
        return USAGE_ERROR
    try:
        session = load_session(args)
    except InputError as e:
        print(f"error: {e}" if "\n" not in str(e) else str(e), file=sys.stderr)
        return USAGE_ERROR
    if args.screenshot is not None:
        return screenshot(session, script or "", args.screenshot, args.size)
    if script is not None:
        from .batch import run_batch
        return run_batch(session, script, name=str(args.batch))
    from .app import DebuggerApp
    app = DebuggerApp(session)
    app.run()
    return app.return_code or 0


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written, checked before any work is done (None if it can)."""
    import os
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        return "is a directory"
    if not parent.is_dir():
        return f"no such directory {parent}"
    if not os.access(parent, os.W_OK):
        return f"directory {parent} is not writable"
    return None


def screenshot(session, script: str, out: Path, size: str) -> int:
    """Run `script` on the screen without a terminal and save what it shows (docs/debugger.svg
    is made this way)."""
    from .app import DebuggerApp
    from .commands import split_script
    try:
        cols, rows = (int(x) for x in size.lower().split("x"))
    except ValueError:
        print(f"error: --size {size!r}: expected COLSxROWS, e.g. 170x50", file=sys.stderr)
        return USAGE_ERROR
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
        app.save_screenshot(out.name, path=str(out.parent.resolve()))
        app.exit()

    app.run(headless=True, size=(cols, rows), auto_pilot=drive)
    print(f"saved {out}")
    return COMMAND_FAILED if failed else 0

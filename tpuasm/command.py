"""The one command layer: exit statuses, and how every face ends.

Every face (`tpuasm COMMAND`, `python -m tpuasm.apps.figure11`, ...) is a function
`face(argv) -> int` run through `run_face`, which owns what no face should handle on its
own: a TpuasmError is one message and exit 2, a MemoryError "out of memory" and exit 2,
Ctrl-C "interrupted" and exit 130, a closed stdout (`tpuasm fmt --diff F | head -3`) a
quiet exit 141, and nothing ever reaches the user as a Python traceback except a real bug.

The statuses are defined here and nowhere else (spec/limits.md, "The promises").
"""
from __future__ import annotations

import os
import sys

EXIT_OK = 0              # success (a program halted, every test passed, ...)
EXIT_FAILED = 1          # a machine fault, failed tests, failed points
EXIT_USAGE = 2           # usage, input, output and resource-limit errors
EXIT_INTERRUPTED = 130   # Ctrl-C (128 + SIGINT, what a shell reports)
EXIT_BROKEN_PIPE = 141   # the reader of stdout went away (128 + SIGPIPE)


def run_face(face, argv=None) -> int:
    """face(argv)'s exit status, with every way a face can end turned into a message and
    one of the statuses above."""
    from .errors import AssemblyError, TpuasmError
    try:
        code = face(argv)
        _flush_stdout()
        return EXIT_OK if code is None else int(code)
    except AssemblyError as e:
        print(e.render(color=_tty(sys.stderr)), file=sys.stderr)
        return EXIT_USAGE
    except TpuasmError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError:     # the last line of defence: tpuasm.limits should have said so
        print("error: out of memory (an input too large for this machine; "
              "spec/limits.md)", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE


def _flush_stdout() -> None:
    """Flush now, inside the handlers: a broken pipe found at interpreter exit would print
    "Exception ignored ... BrokenPipeError".  (The language server closes stdout itself.)"""
    if sys.stdout is not None and not sys.stdout.closed:
        sys.stdout.flush()


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _tty(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


def exit_with(face, argv=None) -> None:
    """`if __name__ == "__main__": exit_with(main)`: run_face, then exit with its status."""
    sys.exit(run_face(face, sys.argv[1:] if argv is None else argv))

"""`tpuasm lsp`: a language server for .tasm (Language Server Protocol over stdio).

A thin face over the assembler library: every answer comes from
`tpuasm.assembler.analysis.analyze` (the assembler's own passes), the ISA table and
`tpuasm.fmt`.  Editors launch `tpuasm lsp`; docs/editors/ has the set-up for VS Code,
Neovim, Helix and Emacs.
"""
from __future__ import annotations

import argparse


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tpuasm lsp", description=(
        "Serve the Language Server Protocol for .tasm files on stdin/stdout: diagnostics "
        "as you type, hover, completion, go to definition, references, rename, outline, "
        "semantic tokens, formatting and per-instruction hints."))
    p.add_argument("--stdio", action="store_true", help="talk over stdin/stdout (the default)")
    p.add_argument("--debounce", type=float, default=0.15, metavar="SECONDS",
                   help="wait this long after the last edit before re-checking (default 0.15)")
    args = p.parse_args(argv)
    import sys

    from ..command import EXIT_OK
    from . import logs
    from .frames import BoundedInput
    from .server import make_server
    logs.configure()                                          # one line per event, no traceback
    server = make_server(debounce=max(0.0, args.debounce))
    server.start_io(stdin=BoundedInput(sys.stdin.buffer))     # frames of bounded size
    return EXIT_OK

"""The Textual step-debugger for TPU programs (interactive and `--batch`).

`main(argv)` is what `python -m debugger` and `tpuasm debug` run.
"""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from .cli import main as _main
    return _main(argv)

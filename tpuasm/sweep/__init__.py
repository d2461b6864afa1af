"""Design-space sweeps: grids of machine configurations over programs, on Dask.

    run_sweep(targets, grid, on_row, ...) -> Summary     the library entry point
    main(argv)                                            the `tpuasm sweep` command

Faces: tpuasm/sweep/cli.py (terminal), tpuasm/apps/figure11.py (the paper's study).
"""
from __future__ import annotations

from .engine import Summary, run_sweep  # noqa: F401
from .grid import Grid, SweepError, parse_set  # noqa: F401
from .targets import Target, resolve  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    from .cli import main as _main
    return _main(argv)

"""The six apps as runnable programs for a given machine: source, Program and data images.

Today the programs come from the hand-written generator (codegen.py); the compiler's
output can replace it behind `app_program` without changing profile or sweep.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .catalog import PAPER_ORDER, build
from .codegen import CodegenError, generate

SHAPE_FIELDS = ("array_size", "ub_rows", "acc_rows", "fifo_depth")
GENERATOR_VERSION = "codegen-1"


def app_names() -> tuple[str, ...]:
    return PAPER_ORDER


def is_app(name: str) -> bool:
    return name.upper() in PAPER_ORDER


@dataclass(frozen=True)
class AppProgram:
    name: str
    source: str
    host_rows: int
    weight_tiles: int
    array_size: int
    macs: int                 # the network's own MACs per batch (padding not counted)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    def assemble(self):
        from ..assembler import assemble
        return assemble(self.source, f"{self.name.lower()}.tasm")

    def data(self):
        """Zero host and weight images (values do not change timing); np.zeros maps
        untouched pages lazily, so CNN1's 4,296 tiles cost no memory until read."""
        n = self.array_size
        return (np.zeros((self.host_rows, n), np.int8),
                np.zeros((self.weight_tiles, n, n), np.int8))


@lru_cache(maxsize=16)
def app_program(name: str, array_size: int = 256, ub_rows: int = 98304, acc_rows: int = 4096,
                fifo_depth: int = 4) -> AppProgram:
    """The app's program for this machine shape; CodegenError when it does not fit."""
    app = build(name)
    g = generate(app, array_size, ub_rows, acc_rows, fifo_depth)
    return AppProgram(app.name, g.source, g.host_rows, g.weight_tiles, array_size,
                      app.batch * app.macs_per_sample)


def shape_of(config) -> dict:
    return {k: getattr(config, k) for k in SHAPE_FIELDS}


__all__ = ["AppProgram", "CodegenError", "app_names", "app_program", "is_app", "shape_of"]

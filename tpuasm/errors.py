"""Error types a user can meet.  The CLI turns each into a message, never a traceback."""
from __future__ import annotations

# The kinds of MachineFault (spec/isa.md section 7).  Defined here, free of numba, so that
# tpuasm.regression can validate manifests without importing the machine.
FAULT_KINDS = ("address", "no_tile", "deadlock", "weight_width", "config", "shape",
               "invalid_instruction", "max_cycles", "hazard")


class TpuasmError(Exception):
    """Base class of every error tpuasm reports to a user."""


class EncodingError(TpuasmError):
    """An instruction that cannot be encoded or decoded (bad opcode, field out of range)."""


class BinaryFormatError(TpuasmError):
    """A .tbin (or OpenTPU) binary that is truncated, corrupt or of an unknown version."""


class DataFileError(TpuasmError):
    """A host-memory or weight image (.npy) of the wrong shape, dtype or content."""


class AssemblyError(TpuasmError):
    """One or more diagnostics from the assembler; `diagnostics` holds all of them."""

    def __init__(self, diagnostics, sources=None, total: int | None = None):
        self.diagnostics = list(diagnostics)
        self.sources = sources or {}
        self.total = max(total or 0, len(self.diagnostics))   # some may not have been kept
        super().__init__(self.render(color=False))

    def render(self, color: bool = False) -> str:
        from .diagnostics import render_all
        return render_all(self.diagnostics, self.sources, color=color, total=self.total)


class InputFileError(TpuasmError):
    """An input file that cannot be used: missing, not a regular file, too large, unreadable."""


class OutputFileError(TpuasmError):
    """An output path that cannot be written (checked before anything is written)."""


class ResourceLimitError(TpuasmError):
    """An input that would need more memory, time or size than tpuasm allows
    (tpuasm.limits; spec/limits.md)."""

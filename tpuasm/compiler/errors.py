"""The compiler's user-facing error: one message naming the file (and node) at fault."""
from __future__ import annotations

from tpuasm.errors import TpuasmError


class CompileError(TpuasmError):
    """A model, calibration set, input file or output directory the compiler cannot use."""

"""MachineFault and the messages for the fault codes the numba core reports."""
from __future__ import annotations

from dataclasses import dataclass

from ..binary import SourceLoc
from . import core
from .decoded import register_limits
from .kernels import MEM_ACC, MEM_HOST, MEM_TILE, MEM_UB
from ..errors import FAULT_KINDS  # noqa: F401  (re-exported by tpuasm.machine)
from ..isa import ISA_TABLE

MEMORY_NAMES = {MEM_UB: "UB", MEM_ACC: "accumulator", MEM_HOST: "host", MEM_TILE: "weight tile"}
_REG_MIN, _REG_MAX = register_limits()


@dataclass(frozen=True)
class MachineFault:
    kind: str
    message: str
    cycle: int
    index: int | None
    text: str
    location: SourceLoc | None

    def __str__(self):
        where = f"fault at cycle {self.cycle}"
        if self.index is not None:
            where += f" in instruction {self.index}"
            if self.text:
                where += f" `{self.text}`"
            if self.location is not None:
                where += f" ({self.location.file}:{self.location.line})"
        return f"{where}: {self.message}"


def _memory_limit_text(mem: int, addr: int, limit: int) -> str:
    name = MEMORY_NAMES.get(mem, f"memory {mem}")
    if mem == MEM_TILE:
        if limit == 0:
            return f"weight tile {addr} out of range (no weight image loaded)"
        return f"weight tile {addr} out of range 0..{limit - 1}"
    if limit == 0:
        return f"{name} address {addr} out of range ({name} memory is empty)"
    return f"{name} address {addr} out of range 0..{limit - 1}"


def describe(code: int, info, depth: int) -> tuple[str, str]:
    """(kind, message) of a core fault code with its info words."""
    a, b, c, d, e = (int(x) for x in info[:5])
    if code == core.F_ADDRESS:
        return "address", _memory_limit_text(a, b, c)
    if code == core.F_CONFIG:
        reg = ISA_TABLE.register_by_index.get(a)
        if reg is None:
            return "config", f"no configuration register {a}"
        if c == 1:      # in range, but not for this instruction (kernels._check_vector)
            return "config", (f"configuration register {reg.name} = {b} computes 8-bit "
                              f"operands only, and this instruction has a 16-bit one "
                              f"(flag X, Y or Z)")
        return "config", (f"configuration register {reg.name} = {b} out of range "
                          f"{_REG_MIN[a]}..{_REG_MAX[a]}")
    if code == core.F_SHAPE:
        if e:
            return "shape", ("pooling: pool_stride_x needs pool_stride > 0 (windows that tile "
                             "the image have no stride)")
        columns = f", pool_size_x {d}" if d else ""
        return "shape", (f"pooling shape does not divide: length {a}, pool_size {b}, "
                         f"pool_width {c}{columns}")
    if code == core.F_NO_TILE:
        return "no_tile", "no weight tile resident (MatrixMultiply without S and no active weights)"
    if code == core.F_DEADLOCK_RW:
        return "deadlock", (f"Read_Weights would leave {a} tiles fetched but not switched in by "
                            f"an earlier instruction; the Weight FIFO ({depth}) and the shadow "
                            f"buffer hold {b}, so it could never proceed")
    if code == core.F_DEADLOCK_SWITCH:
        return "deadlock", (f"switch with an empty Weight FIFO and no Read_Weights in flight "
                            f"(needs {a} tile{'s' if a != 1 else ''}, {b} fetched and not yet "
                            f"switched in)")
    if code == core.F_WEIGHT_WIDTH:
        have = "16-bit" if a == 1 else "8-bit"
        want = "has" if a == 0 else "does not have"
        return "weight_width", (f"weight width mismatch: the active weights are {have}, the "
                                f"instruction {want} D")
    if code == core.F_HAZARD:
        kinds = {1: "RAW", 2: "WAR", 3: "WAW"}
        name = MEMORY_NAMES.get(b, "memory")
        return "hazard", (f"{kinds.get(a, 'data')} hazard on {name} rows {c}..{d - 1} with "
                          f"instruction {e} and no SYNC, WSYNC or INT between them "
                          f"(strict mode, --hazards=error)")
    if code == core.F_INVALID:
        return "invalid_instruction", "invalid instruction (does not round-trip through its encoding, or its flags cannot be combined)"
    return "invalid_instruction", f"unknown fault code {code}"

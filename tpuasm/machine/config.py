"""MachineConfig: the machine's shape and every timing constant (spec/timing.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ..binary import PROFILES, MachineShape
from ..isa import ISA_TABLE
from ..limits import MAX_RATE, MAX_TIMING_CYCLES

_M = ISA_TABLE.machine
TPU_CLOCK_HZ = 700e6
WEIGHT_MEMORY_BYTES_PER_S = 34e9           # DDR3 Weight Memory (paper)
HOST_BYTES_PER_S = 10 * 2 ** 30            # host -> UB path, ~10 GiB/s (paper)


@dataclass(frozen=True)
class MachineConfig:
    """Everything the machine needs besides the program and its data.

    Timing constants are in cycles or bytes per cycle; spec/timing.md gives every formula.
    The fields hold what the caller set; a timing constant left at None takes the value of
    `timing` ("tpu" or "opentpu"), so an explicit setting always wins and
    `replace(config, timing=...)` re-derives the rest.  Read the values in force through
    the properties: `weight_bandwidth`, `host_bandwidth`, `host_latency`, `shift`,
    `mmc_latency`, `act_latency`.
    """
    array_size: int = _M.array_size
    ub_rows: int = _M.ub_rows
    acc_rows: int = _M.acc_rows
    fifo_depth: int = _M.fifo_depth
    profile: str = "tpu"
    clock_hz: float = TPU_CLOCK_HZ
    # None = not set: the value of `timing` (see _timing_defaults) is in force
    weight_bytes_per_cycle: float | None = None   # TPU v1: 34 GB/s at 700 MHz
    host_bytes_per_cycle: float | None = None     # TPU v1: ~10 GiB/s at 700 MHz
    host_latency_cycles: int | None = None        # TPU v1: one PCIe round trip, ~1 us
    shift_cycles: int | None = None               # shadow shift: N cycles (TPU v1)
    mmc_latency_cycles: int | None = None         # systolic fill + drain: 2N cycles
    act_latency_cycles: int | None = None         # TPU v1: function table + requantization
    hazards: str = "interlock"                # or "error" (strict mode)
    timing: str = "tpu"                       # or "opentpu" (same model, OpenTPU shape)

    def __post_init__(self):
        if self.timing not in ("tpu", "opentpu"):
            raise ValueError(f"timing must be 'tpu' or 'opentpu', not {self.timing!r}")
        MachineShape(self.array_size, self.ub_rows, self.acc_rows, self.fifo_depth,
                     self.profile)  # validates the shape, raises ValueError
        if self.hazards not in ("interlock", "error"):
            raise ValueError(f"hazards must be 'interlock' or 'error', not {self.hazards!r}")
        for name in ("clock_hz", "weight_bytes_per_cycle", "host_bytes_per_cycle"):
            v = getattr(self, name)
            # finite and bounded: the core turns these into int64 cycle counts
            if v is not None and not 0 < v <= MAX_RATE:
                raise ValueError(f"{name} must be positive and at most {MAX_RATE:g}")
        for name in ("host_latency_cycles", "shift_cycles", "mmc_latency_cycles",
                     "act_latency_cycles"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)
                                  or not math.isfinite(v) or int(v) != v
                                  or not 0 <= v <= MAX_TIMING_CYCLES):
                raise ValueError(f"{name} must be a non-negative integer, at most "
                                 f"{MAX_TIMING_CYCLES} (2**40)")

    def _timing_defaults(self) -> dict:
        """The timing constants of `timing` (TPU v1: spec/timing.md; OpenTPU: spec/opentpu.md
        section 6, constants from tpuasm/opentpu.py)."""
        n = self.array_size
        if self.timing == "opentpu":
            from .. import opentpu as o
            return {"weight_bytes_per_cycle": float(o.WEIGHT_BYTES_PER_CYCLE),
                    "host_bytes_per_cycle": float(o.HOST_VECTORS_PER_CYCLE * n),
                    "host_latency_cycles": 0,
                    "shift_cycles": o.FIFO_CYCLES,
                    "mmc_latency_cycles": o.MMC_CYCLES_PER_N * n,
                    "act_latency_cycles": o.ACT_LATENCY_CYCLES}
        return {"weight_bytes_per_cycle": WEIGHT_MEMORY_BYTES_PER_S / TPU_CLOCK_HZ,
                "host_bytes_per_cycle": HOST_BYTES_PER_S / TPU_CLOCK_HZ,
                "host_latency_cycles": 700,          # one PCIe round trip, ~1 us
                "shift_cycles": n,                   # shift a tile in: N cycles (paper)
                "mmc_latency_cycles": 2 * n,         # systolic fill + drain
                "act_latency_cycles": 16}            # function table + requantization

    def _in_force(self, name: str):
        value = getattr(self, name)
        return self._timing_defaults()[name] if value is None else value

    # -- the timing constants in force -----------------------------------------------------
    @property
    def weight_bandwidth(self) -> float:
        """Weight Memory bytes per cycle."""
        return self._in_force("weight_bytes_per_cycle")

    @property
    def host_bandwidth(self) -> float:
        """Host link bytes per cycle."""
        return self._in_force("host_bytes_per_cycle")

    @property
    def host_latency(self) -> int:
        return int(self._in_force("host_latency_cycles"))

    @property
    def shift(self) -> int:
        return int(self._in_force("shift_cycles"))

    @property
    def mmc_latency(self) -> int:
        return int(self._in_force("mmc_latency_cycles"))

    @property
    def act_latency(self) -> int:
        return int(self._in_force("act_latency_cycles"))

    # -- derived constants -------------------------------------------------------------
    @property
    def tile_bytes(self) -> int:
        return self.array_size * self.array_size

    @property
    def fetch_cycles(self) -> int:
        """Cycles to fetch one N x N tile from Weight Memory (1350 on TPU v1)."""
        return max(1, math.ceil(self.tile_bytes / self.weight_bandwidth))

    @property
    def host_milli_bytes_per_cycle(self) -> int:
        """Host link rate in thousandths of a byte per cycle (integer arithmetic in the core)."""
        return max(1, round(self.host_bandwidth * 1000))

    def host_cycles(self, rows: int) -> int:
        """Cycles a host DMA of `rows` rows takes (spec/timing.md): the core's formula."""
        from .core import host_dma_cycles
        return int(host_dma_cycles(self.host_latency, self.array_size,
                                   self.host_milli_bytes_per_cycle, int(rows)))

    @property
    def shape(self) -> MachineShape:
        return MachineShape(self.array_size, self.ub_rows, self.acc_rows, self.fifo_depth,
                            self.profile)

    # -- constructors --------------------------------------------------------------------
    @classmethod
    def from_shape(cls, shape: MachineShape, **overrides) -> "MachineConfig":
        base = dict(array_size=shape.array_size, ub_rows=shape.ub_rows, acc_rows=shape.acc_rows,
                    fifo_depth=shape.fifo_depth, profile=shape.profile)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def opentpu(cls, matsize: int = 8, **overrides) -> "MachineConfig":
        """OpenTPU's shape: a matsize x matsize array with OpenTPU's Activate semantics."""
        if matsize not in (8, 16):
            raise ValueError(f"OpenTPU matsize is 8 or 16, not {matsize}")
        base = dict(array_size=matsize, profile="opentpu", timing="opentpu")
        base.update(overrides)
        return cls(**base)

    def replace(self, **changes) -> "MachineConfig":
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


assert "tpu" in PROFILES

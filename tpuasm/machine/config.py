"""MachineConfig: the machine's shape and every timing constant (spec/timing.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ..binary import PROFILES, MachineShape
from ..isa import ISA_TABLE

_M = ISA_TABLE.machine
TPU_CLOCK_HZ = 700e6
WEIGHT_MEMORY_BYTES_PER_S = 34e9           # DDR3 Weight Memory (paper)
HOST_BYTES_PER_S = 10 * 2 ** 30            # host -> UB path, ~10 GiB/s (paper)


class _DefaultInt(int):
    """An int timing constant that MachineConfig filled in (the caller did not set it)."""
    __slots__ = ()


class _DefaultFloat(float):
    """A float timing constant that MachineConfig filled in (the caller did not set it)."""
    __slots__ = ()


_DEFAULTS = (_DefaultInt, _DefaultFloat)


@dataclass(frozen=True)
class MachineConfig:
    """Everything the machine needs besides the program and its data.

    Timing constants are in cycles or bytes per cycle; spec/timing.md gives every formula.
    A timing constant left at None takes the value of `timing` ("tpu" or "opentpu"); an
    explicit setting always wins.  `shift_cycles` and `mmc_latency_cycles` may stay None:
    "derive it from the array size" (see `shift` and `mmc_latency`).
    """
    array_size: int = _M.array_size
    ub_rows: int = _M.ub_rows
    acc_rows: int = _M.acc_rows
    fifo_depth: int = _M.fifo_depth
    profile: str = "tpu"
    clock_hz: float = TPU_CLOCK_HZ
    # None = not set: the value of `timing` (see _timing_defaults) fills it in
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
        self._fill_timing_defaults()
        MachineShape(self.array_size, self.ub_rows, self.acc_rows, self.fifo_depth,
                     self.profile)  # validates the shape, raises ValueError
        if self.hazards not in ("interlock", "error"):
            raise ValueError(f"hazards must be 'interlock' or 'error', not {self.hazards!r}")
        for name in ("clock_hz", "weight_bytes_per_cycle", "host_bytes_per_cycle"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        for name in ("host_latency_cycles", "shift_cycles", "mmc_latency_cycles",
                     "act_latency_cycles"):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 0):
                raise ValueError(f"{name} must be a non-negative integer")

    def _timing_defaults(self) -> dict:
        """The timing constants of `timing` (TPU v1: spec/timing.md; OpenTPU: spec/opentpu.md
        section 6).  None: derived from the array size (see `shift`, `mmc_latency`)."""
        if self.timing == "opentpu":
            return {"weight_bytes_per_cycle": 64.0,          # 64-byte DRAM chunks: N*N/64
                    "host_bytes_per_cycle": float(self.array_size),   # one vector per cycle
                    "host_latency_cycles": 0,
                    "shift_cycles": 3,                        # the FIFO's 3 cycles
                    "mmc_latency_cycles": None,
                    "act_latency_cycles": 1}                  # L + 1
        return {"weight_bytes_per_cycle": WEIGHT_MEMORY_BYTES_PER_S / TPU_CLOCK_HZ,
                "host_bytes_per_cycle": HOST_BYTES_PER_S / TPU_CLOCK_HZ,
                "host_latency_cycles": 700,
                "shift_cycles": None,
                "mmc_latency_cycles": None,
                "act_latency_cycles": 16}

    def _fill_timing_defaults(self):
        """Every timing constant not set (None) takes the value of `timing`; explicit
        settings win.  A filled-in value is stored as a _Default (an int or float that
        remembers it was not set), so that `dataclasses.replace(config, timing=...)`, which
        passes every field on, fills it in again for the new timing instead of keeping it."""
        for name, value in self._timing_defaults().items():
            if getattr(self, name) is None or isinstance(getattr(self, name), _DEFAULTS):
                if value is not None:
                    value = (_DefaultFloat if isinstance(value, float) else _DefaultInt)(value)
                object.__setattr__(self, name, value)

    # -- derived constants -------------------------------------------------------------
    @property
    def tile_bytes(self) -> int:
        return self.array_size * self.array_size

    @property
    def fetch_cycles(self) -> int:
        """Cycles to fetch one N x N tile from Weight Memory (1350 on TPU v1)."""
        return max(1, math.ceil(self.tile_bytes / self.weight_bytes_per_cycle))

    @property
    def shift(self) -> int:
        return self.array_size if self.shift_cycles is None else int(self.shift_cycles)

    @property
    def mmc_latency(self) -> int:
        return 2 * self.array_size if self.mmc_latency_cycles is None else int(self.mmc_latency_cycles)

    @property
    def host_milli_bytes_per_cycle(self) -> int:
        """Host link rate in thousandths of a byte per cycle (integer arithmetic in the core)."""
        return max(1, round(self.host_bytes_per_cycle * 1000))

    def host_cycles(self, rows: int) -> int:
        """Cycles a host DMA of `rows` rows takes (spec/timing.md): the core's formula."""
        from .core import host_dma_cycles
        return int(host_dma_cycles(int(self.host_latency_cycles), self.array_size,
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

"""Sweep grids: which machine configurations to run, from `--set` options or a TOML file.

A NAME is a `MachineConfig` field (`weight_bytes_per_cycle`, `clock_hz`, `array_size`,
`acc_rows`, ...) or one of the design knobs of the paper's Figure 11 (KNOBS), which scale
several fields together.  A field's value is a number (`1.5e9`, `0x100`), a name for the
text fields, or a scale factor of the baseline value in force (`x0.25`, `x4`).  A knob's
values are scale factors (`0.25`, or `x0.25`).

Points are the cartesian product of the swept values, or with `each=True` one parameter at
a time with the others at their baseline (the paper's Figure 11 varies one at a time).
"""
from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import TpuasmError
from ..machine.config import TPU_CLOCK_HZ, MachineConfig

BASE_UB_BYTES = 98304 * 256
BASE_ACC_ROWS = 4096
BASE_ARRAY = 256


class SweepError(TpuasmError, ValueError):
    """Bad sweep input: one message naming what is wrong (exit status 2)."""


_FIELDS = {f.name: f for f in fields(MachineConfig)}
TEXT_CHOICES = {"profile": ("tpu", "opentpu"), "hazards": ("interlock", "error"),
                "timing": ("tpu", "opentpu")}
INT_FIELDS = {"array_size", "ub_rows", "acc_rows", "fifo_depth", "host_latency_cycles",
              "shift_cycles", "mmc_latency_cycles", "act_latency_cycles"}
# the value in force when a field is not set (for x-factors)
IN_FORCE = {"weight_bytes_per_cycle": "weight_bandwidth", "host_bytes_per_cycle": "host_bandwidth",
            "host_latency_cycles": "host_latency", "shift_cycles": "shift",
            "mmc_latency_cycles": "mmc_latency", "act_latency_cycles": "act_latency"}


def knob_memory(s: float, base: MachineConfig) -> dict:
    """Weight Memory bandwidth x s."""
    return {"weight_bytes_per_cycle": base.weight_bandwidth * s}


def knob_clock(s: float, base: MachineConfig) -> dict:
    """Clock x s; memories keep their bytes per second and the host its latency in
    seconds, so per cycle they deliver 1/s as much."""
    return {"clock_hz": base.clock_hz * s,
            "weight_bytes_per_cycle": base.weight_bandwidth / s,
            "host_bytes_per_cycle": base.host_bandwidth / s,
            "host_latency_cycles": max(1, round(base.host_latency * s))}


def knob_matrix(s: float, base: MachineConfig) -> dict:
    """Array dimension x s (256 -> 512 at 2); UB and accumulator bytes unchanged, so
    their rows scale by 1/s; the shift and the systolic latency follow N."""
    n = max(1, round(base.array_size * s))
    return {"array_size": n, "ub_rows": min(BASE_UB_BYTES // n, 2 ** 24),
            "acc_rows": max(1, base.acc_rows * base.array_size // n)}


def _more_accumulators(knob, power: int):
    """`knob`, and the accumulator storage (its 32-bit accumulators) x s**power as well."""
    def scaled(s: float, base: MachineConfig) -> dict:
        out = knob(s, base)
        acc = out.get("acc_rows", base.acc_rows)
        out["acc_rows"] = max(1, min(65535, round(acc * s ** power)))
        return out
    scaled.__doc__ = ((knob.__doc__ or "") +
                      f"  Accumulator storage x s{'' if power == 1 else '^' + str(power)} "
                      "as well.")
    return scaled


# Section 7: clock+ scales "the number of accumulators correspondingly" (x s, so the
# compiler keeps more memory references in flight); matrix+ increases them "with the
# square of the rise in one dimension, since the number of multipliers in the matrix
# grows in both dimensions" (x s^2: 16 32-bit accumulators per multiplier at every size,
# e.g. 8,192 rows of 512 at s = 2 where matrix alone keeps the bytes, 2,048 rows).
KNOBS = {"memory": knob_memory, "clock": knob_clock,
         "clock+": _more_accumulators(knob_clock, 1),
         "matrix": knob_matrix, "matrix+": _more_accumulators(knob_matrix, 2)}


def parameter_names() -> list[str]:
    return sorted(_FIELDS) + list(KNOBS)


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple            # as given: numbers, names, or ("x", factor)
    texts: tuple[str, ...]   # how each value is written in results

    @property
    def is_knob(self) -> bool:
        return self.name in KNOBS


def parse_value(name: str, text) -> tuple:
    """(value, text): a number, a name, or ("x", factor)."""
    if name not in _FIELDS and name not in KNOBS:
        raise SweepError(f"unknown parameter {name!r}; choose a MachineConfig field or a "
                         f"knob: {', '.join(parameter_names())}")
    raw = str(text).strip()
    if name in TEXT_CHOICES:
        if raw not in TEXT_CHOICES[name]:
            raise SweepError(f"{name}={raw}: choose from {', '.join(TEXT_CHOICES[name])}")
        return raw, raw
    factor = raw[1:] if raw[:1] in ("x", "X", "*") else None
    try:
        if factor is not None or name in KNOBS:
            f = float(factor if factor is not None else raw)
            if not (math.isfinite(f) and f > 0):
                raise ValueError
            return ("x", f), f"x{f:g}" if name not in KNOBS else f"{f:g}"
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            v = text
        else:
            v = int(raw, 0) if _looks_int(raw) else float(raw)
    except ValueError:
        want = "a positive scale factor" if (factor is not None or name in KNOBS) else "a number"
        raise SweepError(f"{name}={raw}: not {want}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise SweepError(f"{name}={raw}: not a finite number")
    if name in INT_FIELDS:
        if v != int(v):
            raise SweepError(f"{name}={raw}: must be an integer")
        v = int(v)
    return v, raw


def _looks_int(raw: str) -> bool:
    try:
        int(raw, 0)
        return True
    except ValueError:
        return False


def parse_set(option: str) -> Axis:
    """`NAME=V1,V2,...` -> Axis."""
    name, sep, rest = option.partition("=")
    name = name.strip()
    if not sep or not name:
        raise SweepError(f"--set {option!r}: expected NAME=V1,V2,...")
    items = [v for v in (s.strip() for s in rest.split(",")) if v]
    if not items:
        raise SweepError(f"--set {option!r}: no values")
    return _axis(name, items)


def _axis(name: str, items) -> Axis:
    parsed = [parse_value(name, v) for v in items]
    return Axis(name, tuple(p[0] for p in parsed), tuple(p[1] for p in parsed))


@dataclass
class Grid:
    axes: list[Axis]
    base: dict                   # fixed MachineConfig settings under every point
    each: bool = False
    targets: tuple[str, ...] = ()

    def points(self, base: dict | None = None):
        """Yield (settings {name: text}, config kwargs) for every point, lazily.  `base`:
        the target's own settings (its program's shape), under the grid's [base]."""
        fixed = {**(base or {}), **self.base}
        if not self.axes:
            raise SweepError("empty grid: give at least one --set NAME=V1,... (or a [grid] "
                             "table in the TOML file)")
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names):
            raise SweepError(f"parameter given twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
        if self.each:
            seen = set()
            for i, axis in enumerate(self.axes):
                for value, text in zip(axis.values, axis.texts):
                    settings = {a.name: _baseline_text(a) for a in self.axes}
                    settings[axis.name] = text
                    choice = {a.name: _baseline_value(a) for a in self.axes}
                    choice[axis.name] = value
                    config = config_for(choice, fixed)
                    key = in_force_key(config)     # x1 of one axis = the baseline
                    if key in seen:
                        continue
                    seen.add(key)
                    yield settings, config
        else:
            for combo in itertools.product(*(range(len(a.values)) for a in self.axes)):
                settings = {a.name: a.texts[i] for a, i in zip(self.axes, combo)}
                choice = {a.name: a.values[i] for a, i in zip(self.axes, combo)}
                yield settings, config_for(choice, fixed)

    def size(self) -> int:
        if self.each:
            return sum(1 for _ in self.points())
        return math.prod(len(a.values) for a in self.axes)

    def validate(self, base: dict | None = None) -> None:
        """Every point builds a valid MachineConfig (raises SweepError on the first bad one)."""
        for _ in self.points(base):
            pass


def in_force_key(config: dict) -> tuple:
    """What the machine will actually use (a setting equal to its default is no change)."""
    c = MachineConfig(**config)
    return (c.shape, c.clock_hz, c.weight_bandwidth, c.host_bandwidth, c.host_latency,
            c.shift, c.mmc_latency, c.act_latency, c.hazards, c.timing)


def _baseline_value(axis: Axis):
    return ("x", 1.0) if axis.is_knob else None


def _baseline_text(axis: Axis) -> str:
    return "1" if axis.is_knob else "base"


def config_for(choice: dict, base: dict) -> dict:
    """MachineConfig keyword arguments for one point (validated: SweepError if not)."""
    try:
        base_config = MachineConfig(**base)
    except (TypeError, ValueError) as e:
        raise SweepError(f"base configuration: {e}") from None
    try:        # a factor can be finite and its product not (clock=x1e308): one message
        return _scaled(choice, base, base_config)
    except OverflowError:
        shown = ", ".join(f"{k}={_show(v)}" for k, v in choice.items() if v is not None)
        raise SweepError(f"invalid configuration ({shown}): a value out of range") from None


def _scaled(choice: dict, base: dict, base_config: MachineConfig) -> dict:
    kwargs = dict(base)
    knobs = [(n, v) for n, v in choice.items() if n in KNOBS and v is not None]
    for name, value in choice.items():
        if name in KNOBS or value is None:
            continue
        if isinstance(value, tuple):          # ("x", factor) of the value in force
            now = getattr(base_config, IN_FORCE.get(name, name))
            value = now * value[1]
            if not math.isfinite(value):
                raise OverflowError
            if name in INT_FIELDS:
                value = max(1, round(value))
        kwargs[name] = value
    current = _config(kwargs, choice)
    for name, (_, factor) in knobs:
        kwargs.update(KNOBS[name](factor, current))
        current = _config(kwargs, choice)
    return kwargs


def _config(kwargs: dict, choice: dict) -> MachineConfig:
    try:
        return MachineConfig(**kwargs)
    except (TypeError, ValueError) as e:
        shown = ", ".join(f"{k}={_show(v)}" for k, v in choice.items() if v is not None)
        raise SweepError(f"invalid configuration ({shown}): {e}") from None


def _show(v) -> str:
    return f"x{v[1]:g}" if isinstance(v, tuple) else str(v)


def load_toml(path: Path) -> Grid:
    """A grid file:

        targets = ["MLP0", "programs/mlp0"]      # optional, added to the command line's
        each = true                              # optional: one parameter at a time
        [base]                                   # optional fixed settings
        fifo_depth = 8
        [grid]                                   # the swept parameters
        weight_bytes_per_cycle = ["x0.25", "x1", "x4"]
        memory = [0.5, 1, 2]
    """
    from ..files import read_text
    from ..limits import MAX_GRID_BYTES
    # a regular file of bounded size: a FIFO or /dev/zero is refused at once
    text = read_text(path, what="grid file", limit=MAX_GRID_BYTES, error=SweepError)
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SweepError(f"{path}: not valid TOML: {e}") from None
    unknown = set(data) - {"targets", "each", "base", "grid"}
    if unknown:
        raise SweepError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (expected "
                         "targets, each, [base], [grid])")
    grid = data.get("grid", {})
    if not isinstance(grid, dict):
        raise SweepError(f"{path}: [grid] must be a table of NAME = [values]")
    axes = []
    for name, values in grid.items():
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise SweepError(f"{path}: grid.{name}: no values")
        try:
            axes.append(_axis(name, values))
        except SweepError as e:
            raise SweepError(f"{path}: grid.{e}") from None
    base = data.get("base", {})
    if not isinstance(base, dict):
        raise SweepError(f"{path}: [base] must be a table of NAME = value")
    fixed = {}
    for name, value in base.items():
        if name not in _FIELDS:
            raise SweepError(f"{path}: base.{name}: not a MachineConfig field")
        v, _ = parse_value(name, value)
        if isinstance(v, tuple):
            raise SweepError(f"{path}: base.{name}: give a value, not a factor")
        fixed[name] = v
    targets = data.get("targets", [])
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise SweepError(f"{path}: targets must be a list of strings")
    each = data.get("each", False)
    if not isinstance(each, bool):
        raise SweepError(f"{path}: each must be true or false")
    return Grid(axes, fixed, each=each, targets=tuple(targets))


def baseline_clock(config_kwargs: dict) -> float:
    return config_kwargs.get("clock_hz", TPU_CLOCK_HZ)

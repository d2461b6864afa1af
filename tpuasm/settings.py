"""The one parser of `--config KEY=VALUE[,KEY=VALUE...]` machine settings, for every command
(`tpuasm run`, `lint`, `asm`, `compile`, the sweep).  Two kinds of key: the machine's shape
(binary.CONFIG_KEYS: what a program's `.config` may set and the assembler checks against) and
every other MachineConfig field (clock, bandwidths, latencies, hazards, timing)."""
from __future__ import annotations

from .errors import TpuasmError

_FLOAT_FIELDS = ("clock_hz", "weight_bytes_per_cycle", "host_bytes_per_cycle")
_TEXT_FIELDS = ("hazards", "timing")


def _parts(items):
    for item in items:
        yield from filter(None, (s.strip() for s in item.split(",")))


def parse_shape(items: list[str]) -> dict:
    """`["array_size=16,ub_rows=1024"]` -> {"array_size": 16, "ub_rows": 1024}: keys and
    numbers as `.config` reads them (binary.parse_setting)."""
    from .binary import CONFIG_KEYS, config_key, parse_setting
    out: dict = {}
    for part in _parts(items):
        key, sep, value = part.partition("=")
        name = config_key(key)
        if not sep or name is None:
            raise TpuasmError(f"--config {part!r}: expected KEY=VALUE with KEY one of "
                              f"{', '.join(CONFIG_KEYS)}")
        try:
            out[name] = parse_setting(name, value)
        except ValueError as e:
            raise TpuasmError(f"--config {e}") from None
    return out


def split_settings(items: list[str]) -> tuple[list[str], dict]:
    """`--config` items -> (the shape items, as given, for the assembler; the other
    MachineConfig fields, parsed and checked)."""
    from dataclasses import fields

    from .binary import CONFIG_KEYS
    from .machine import MachineConfig
    names = {f.name for f in fields(MachineConfig)}
    shape, machine = [], {}
    for part in _parts(items):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if key in CONFIG_KEYS or not sep:
            shape.append(part)          # the assembler's keys (and its KEY=VALUE error)
            continue
        if key not in names:
            raise TpuasmError(f"--config {part!r}: unknown setting {key!r} (MachineConfig "
                              f"fields: {', '.join(sorted(names))})")
        machine[key] = _machine_value(key, value.strip(), part)
    try:
        MachineConfig(**machine)
    except ValueError as e:
        raise TpuasmError(f"--config: {e}") from None
    return shape, machine


def parse_settings(items: list[str]) -> dict:
    """Shape keys and MachineConfig fields together, parsed: what `compile` takes."""
    shape, machine = split_settings(items)
    return {**parse_shape(shape), **machine}


def _machine_value(key: str, text: str, part: str):
    if key in _TEXT_FIELDS:
        return text
    try:
        if key in _FLOAT_FIELDS:
            return float(text)
        return int(text, 0)
    except ValueError:
        kind = "a number" if key in _FLOAT_FIELDS else "an integer"
        raise TpuasmError(f"--config {part!r}: {key} must be {kind}") from None

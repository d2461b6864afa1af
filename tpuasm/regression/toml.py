"""The one TOML writer for regression manifests (Python's standard library only reads TOML).

Manifests are small and flat: tables of keys with strings, numbers and booleans, and arrays of
tables.  Every value is rendered so that `tomllib` reads back exactly what was given; a string
may hold any character (a model named `we"ird.onnx`, a newline, a control character).
"""
from __future__ import annotations

import math
import re

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def value(v) -> str:
    """A TOML value for a str, bool, int or finite float."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"TOML manifests hold finite numbers only, not {v!r}")
        return repr(v)
    if isinstance(v, str):
        return '"' + "".join(_escape(c) for c in v) + '"'
    raise TypeError(f"no TOML form for {type(v).__name__}")


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\u{ord(c):04X}"
    return c


def _comment(line: str) -> str:
    """A comment line: control characters (TOML forbids them there) written escaped."""
    return "".join(c if c == "\t" or not (ord(c) < 0x20 or ord(c) == 0x7F) else _escape(c)
                   for c in line)


def key(name: str) -> str:
    return name if _BARE_KEY.match(name) else value(name)


def table(header: str, items: dict, comment: str | None = None,
          array: bool = False) -> str:
    """`[header]` (or `[[header]]`) with an optional `# comment` line and `key = value` lines."""
    brackets = ("[[", "]]") if array else ("[", "]")
    lines = [f"{brackets[0]}{header}{brackets[1]}"]
    if comment:
        lines.extend("# " + _comment(line) for line in comment.splitlines())
    lines.extend(f"{key(k)} = {value(v)}" for k, v in items.items())
    return "\n".join(lines) + "\n"

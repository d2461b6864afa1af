"""Text for machine state: values, memory dumps (gdb's x/), counters, weights, events.

Shared by the command engine (and so by batch mode) and by the screen's panes.
"""
from __future__ import annotations

import numpy as np
from rich.text import Text
from tpuasm.runreport import BREAKDOWN, OVERLAPPING

from .expr import ExprError, Location


def format_value(v) -> str:
    if isinstance(v, np.ndarray):
        return np.array2string(v, max_line_width=100, threshold=64, edgeitems=8)
    return repr(v) if isinstance(v, str) else str(v)


def memory_array(machine, memory: str) -> np.ndarray:
    array = getattr(machine, memory, None)
    if array is None:
        raise ExprError(f"no {memory} memory loaded")
    return array


def cell_width(radix: str, bits: int) -> int:
    """Characters per value, without the separating space."""
    if radix == "hex":
        return bits // 4
    if radix == "unsigned":
        return len(str((1 << bits) - 1))
    return len(str(-(1 << (bits - 1))))


def format_row(values: np.ndarray, radix: str, bits: int, width: int) -> list[str]:
    """Values of one row as fixed-width strings (vectorised enough for ~100 cells)."""
    mask = (1 << bits) - 1
    if radix == "hex":
        return [f"{v & mask:0{width}x}" for v in values.tolist()]
    if radix == "unsigned":
        return [f"{v & mask:>{width}}" for v in values.tolist()]
    half = 1 << (bits - 1)
    return [f"{(v & mask) - ((v & mask) >= half) * (mask + 1):>{width}}" for v in values.tolist()]


def examine(array: np.ndarray, loc: Location, count: int, radix: str, unit: str) -> list[str]:
    """gdb's x/: `count` elements from row loc.row, element loc.col, eight or sixteen a line."""
    rows, width = array.shape
    if not 0 <= loc.row < rows:
        raise ExprError(f"{loc.memory} row {loc.row} outside 0..{rows - 1}")
    if unit == "w" and array.dtype == np.uint8:
        if width % 4:
            raise ExprError("int32 view needs a row width divisible by 4")
        array = np.ascontiguousarray(array).view("<i4")
        width //= 4
    elif unit == "b" and array.dtype != np.uint8:
        array = array.astype(np.int64)      # accumulators shown per int32 element anyway
    flat_start = loc.row * width + loc.col
    end = min(flat_start + count, rows * width)
    per_line = 16 if array.dtype == np.uint8 else 8
    bits = 8 if array.dtype == np.uint8 else 32
    width_hex = cell_width("hex", bits) if radix == "hex" else 0     # unpadded but for hex
    out = []
    pos = flat_start
    while pos < end:
        r, c = divmod(pos, width)
        n = min(per_line, width - c, end - pos)
        values = array[r, c:c + n]
        cells = " ".join(format_row(values, radix, bits, width_hex))
        out.append(f"{loc.memory}[{r}][{c}]:".ljust(16) + cells)
        pos += n
    return out


def counter_lines(c: dict) -> list[str]:
    cycles = max(int(c.get("cycles", 0)), 1)
    out = [f"cycles                {c.get('cycles', 0)}",
           f"instructions retired  {c.get('instructions', 0)}",
           f"MXU utilisation       {100 * float(c.get('mxu_utilization', 0)):.1f} %",
           f"useful MACs           {c.get('useful_macs', 0)}",     # tiles' real K x N
           f"array-active MAC slots {c.get('array_mac_slots', 0)}",  # padding included
           f"TOPS                  {float(c.get('tops', 0)):.2f}",
           "cycle breakdown (Table 3):"]
    for label, key in BREAKDOWN:
        v = int(c.get(key, 0))
        out.append(f"  {label:<20}{v:>10}  {100 * v / cycles:5.1f} %")
    for label, (_, key) in zip(("RAW stalls", "input stalls"), OVERLAPPING):   # shorter labels
        out.append(f"  {label:<20}{int(c.get(key, 0)):>10}")
    return out


def event_text(session, e) -> str:
    name = {"interrupt": "Interrupt_Host", "tag": "Debug_Tag", "fault": "fault"}.get(e.kind, e.kind)
    return f"cycle {e.cycle}: {name} {e.value} from {session.where(e.index)}"


def weights_text(m) -> Text:
    """Weight FIFO fill level, the shadow tile being shifted in, the active tile(s)."""
    fifo = m.fifo()
    depth = m.config.fifo_depth
    text = Text("\n")
    text.append("weight FIFO ", style="bold yellow")
    text.append("▮" * len(fifo) + "▯" * max(depth - len(fifo), 0) + f" {len(fifo)}/{depth}  ",
                style="yellow")
    for e in fifo:
        pct = 100 * e.done // e.total if e.total else 100
        text.append(f"[tile {e.tile} {e.state} {pct}%] ", style="yellow" if e.state == "ready" else "grey70")
    sh = m.shadow()
    text.append("\nshadow ", style="bold yellow")
    text.append("empty" if sh is None else f"tile {sh.tile} {sh.state} {sh.done}/{sh.total} cycles")
    act = m.active()
    text.append("   active ", style="bold yellow")
    text.append("none" if act is None else
                "tile " + ", ".join(str(t) for t in act.tiles) + (" (16-bit)" if act.wide else ""))
    return text

"""Text for machine state: values, memory dumps (gdb's x/), counters, weights, events.

Shared by the command engine (and so by batch mode) and by the screen's panes.
"""
from __future__ import annotations

import numpy as np

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
    out = []
    pos = flat_start
    while pos < end:
        r, c = divmod(pos, width)
        n = min(per_line, width - c, end - pos)
        values = array[r, c:c + n]
        cells = " ".join(format_cell(v, radix, array.dtype) for v in values)
        out.append(f"{loc.memory}[{r}][{c}]:".ljust(16) + cells)
        pos += n
    return out


def format_cell(v, radix: str, dtype) -> str:
    v = int(v)
    bits = 8 if dtype == np.uint8 else 32
    if radix == "hex":
        return f"{v & ((1 << bits) - 1):0{bits // 4}x}"
    if radix == "unsigned":
        return str(v & ((1 << bits) - 1))
    if v >= 1 << (bits - 1):
        v -= 1 << bits
    return str(v)


def counter_lines(c: dict) -> list[str]:
    cycles = max(int(c.get("cycles", 0)), 1)
    out = [f"cycles                {c.get('cycles', 0)}",
           f"instructions retired  {c.get('instructions', 0)}",
           f"MXU utilisation       {100 * float(c.get('mxu_utilization', 0)):.1f} %",
           f"useful MACs           {c.get('useful_macs', 0)}",
           f"TOPS                  {float(c.get('tops', 0)):.2f}",
           "cycle breakdown (Table 3):"]
    for key, label in (("array_active_cycles", "array active"), ("weight_stall_cycles", "weight stall"),
                       ("weight_shift_cycles", "weight shift"), ("non_matrix_cycles", "non-matrix")):
        v = int(c.get(key, 0))
        out.append(f"  {label:<20}{v:>10}  {100 * v / cycles:5.1f} %")
    out.append(f"  {'RAW stalls':<20}{int(c.get('raw_stall_cycles', 0)):>10}")
    out.append(f"  {'input stalls':<20}{int(c.get('input_stall_cycles', 0)):>10}")
    return out


def weight_lines(m) -> list[str]:
    out = []
    fifo = m.fifo()
    out.append(f"FIFO ({len(fifo)}/{m.config.fifo_depth}):" + ("" if fifo else " empty"))
    for e in fifo:
        pct = 100 * e.done / e.total if e.total else 100
        out.append(f"  tile {e.tile:<5} {e.state:<9} {e.done}/{e.total} bytes ({pct:.0f} %)")
    sh = m.shadow()
    out.append("shadow: " + ("empty" if sh is None else
                             f"tile {sh.tile} {sh.state} {sh.done}/{sh.total} cycles"))
    act = m.active()
    out.append("active: " + ("none" if act is None else
                             f"tile(s) {', '.join(str(t) for t in act.tiles)}"
                             + (" (16-bit)" if act.wide else "")))
    return out


def event_text(session, e) -> str:
    name = {"interrupt": "Interrupt_Host", "tag": "Debug_Tag", "fault": "fault"}.get(e.kind, e.kind)
    return f"cycle {e.cycle}: {name} {e.value} from {session.where(e.index)}"


def instruction_text_at(session, i: int) -> str:
    from .session import instruction_text
    return instruction_text(session.program.instructions[i])

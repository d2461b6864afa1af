"""Unified Buffer allocation with reuse: each tensor lives from the operator that produces it
(or the start, for segment inputs) to its last reader (or the end, for segment outputs), and
takes a free *slot* -- a fixed block of rows -- left by a tensor that died before it.  Slots
become `.ub` regions (act0, act1, ...), so every reuse is visible in the source."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Slot:
    name: str
    base: int
    rows: int
    tensors: list[str] = field(default_factory=list)
    free_after: int = -1            # operator index after which the slot is free


@dataclass
class Allocation:
    slots: list[Slot]
    of: dict[str, Slot]             # tensor name -> slot
    rows: int                       # UB rows the slots take (from `base`)


def lifetimes(order: list[tuple[list[str], list[str]]], inputs, outputs) -> dict[str, tuple[int, int]]:
    """(first, last) operator index of every tensor; order[i] = (reads, writes) of operator i.
    Inputs live from their first reader (they are loaded just before it; an input nobody
    reads from -1).  Outputs are written to the host right after their producer: they live
    through the next operator too (the WHM overlaps it), then their slot is free; an output
    that is also a segment input (never produced here) lives to the end."""
    life: dict[str, list[int]] = {}
    for i, (reads, writes) in enumerate(order):
        for t in writes:
            life.setdefault(t, [i, i])
        for t in reads:
            life.setdefault(t, [i, i])[1] = i
    for t in inputs:
        life.setdefault(t, [-1, -1])
    for t in outputs:
        first, last = life[t]
        life[t][1] = len(order) if first < 0 else min(len(order), max(last, first + 1))
    return {t: (a, b) for t, (a, b) in life.items()}


def allocate(order, sizes: dict[str, int], inputs, outputs, base: int = 0,
             keys: dict | None = None) -> Allocation:
    """Best-fit slot reuse in operator order; a slot grows only while it is the last one.
    `keys` (tensor -> padding key, codegen/layout.py): among the free slots that fit, one
    whose last tenant had the same key is preferred, so its padding rows need no refill."""
    life = lifetimes(order, inputs, outputs)
    keys = keys or {}
    slots: list[Slot] = []
    of: dict[str, Slot] = {}
    top = base
    events = sorted(life, key=lambda t: (life[t][0], t not in inputs))
    for t in events:
        first, last = life[t]
        need = sizes[t]
        free = [s for s in slots if s.free_after < first]
        fit = [s for s in free if s.rows >= need]
        key = keys.get(t)
        if key is not None and any(keys.get(s.tensors[-1]) == key for s in fit):
            fit = [s for s in fit if keys.get(s.tensors[-1]) == key]
        if fit:
            slot = min(fit, key=lambda s: s.rows)
        elif free and free[-1] is slots[-1]:
            slot = slots[-1]                 # the last slot may grow in place
            top += need - slot.rows
            slot.rows = need
        else:
            slot = Slot(f"act{len(slots)}", top, need)
            slots.append(slot)
            top += need
        slot.tensors.append(t)
        slot.free_after = last
        of[t] = slot
    return Allocation(slots, of, top - base)

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


def load_points(order, inputs, lead: int | None = None) -> dict[str, int]:
    """Before which operator each segment input is loaded.  The input stage is one queue
    and the front end issues in order, so an engineer loads the inputs in the order they
    are needed, each as soon as the previous one's first reader has issued its work: the
    DMA then overlaps every operator up to its own first reader.  (Loading all of them up
    front would hold the first multiply behind every load.)  `lead`: at most that many
    operators before the first reader (less UB: the input lives through fewer operators;
    0 = just in time)."""
    first = {}
    for i, (reads, _) in enumerate(order):
        for t in reads:
            first.setdefault(t, i)
    points, previous = {}, -1
    for t in sorted((t for t in inputs if t in first), key=lambda t: first[t]):
        points[t] = min(first[t], previous + 1)
        if lead is not None:
            points[t] = max(points[t], first[t] - lead)
        previous = first[t]
    for t in inputs:
        points.setdefault(t, 0)
    return points


def lifetimes(order: list[tuple[list[str], list[str]]], inputs, outputs,
              load_at: dict[str, int] | None = None) -> dict[str, tuple[int, int]]:
    """(first, last) operator index of every tensor; order[i] = (reads, writes) of operator i.
    An input lives from the operator before its load point (load_points: its RHM must not
    overwrite what that operator still reads).  Outputs are written to the host right after
    their producer: they live through the next operator too (the WHM overlaps it), then
    their slot is free; an output that is also a segment input lives to the end."""
    life: dict[str, list[int]] = {}
    for i, (reads, writes) in enumerate(order):
        for t in writes:
            life.setdefault(t, [i, i])
        for t in reads:
            life.setdefault(t, [i, i])[1] = i
    for t, at in (load_at if load_at is not None else load_points(order, inputs)).items():
        life.setdefault(t, [at, -1])[0] = at - 1
    for t in outputs:
        first, last = life[t]
        life[t][1] = len(order) if first < 0 else min(len(order), max(last, first + 1))
    return {t: (a, b) for t, (a, b) in life.items()}


def allocate(order, sizes: dict[str, int], inputs, outputs, base: int = 0,
             keys: dict | None = None, load_at: dict | None = None) -> Allocation:
    """Best-fit slot reuse in operator order; a slot grows only while it is the last one.
    `keys` (tensor -> padding key, codegen/layout.py): among the free slots that fit, one
    whose last tenant had the same key is preferred, so its padding rows need no refill."""
    life = lifetimes(order, inputs, outputs, load_at)
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

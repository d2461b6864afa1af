"""How many Unified Buffer rows a segment needs: the one capacity rule of the back end.

`generate()` uses it to choose how far ahead inputs are loaded and how many samples a pass
holds, and raises its "one sample needs ... UB rows" error from it; the front end asks the
same question (`fits`) before it cuts a convolution's image into bands of rows
(front/banding.py), so the two never disagree about what the machine holds."""
from __future__ import annotations

from .alloc import allocate, load_points
from .fuse import Fusion, plan_fusion
from .layout import plan_layouts
from .pack import pack_segment

# how far ahead of its first reader a segment input is loaded, most overlap first: less
# lead is less UB (the input lives through fewer operators), down to just in time (0)
LEADS = (None, 16, 8, 4, 2, 1, 0)


class Footprint:
    """The UB rows of one (packed, fused, laid out) segment per pass: its slots as
    alloc.py reuses them, plus the per-column parameters and tables of its layers."""

    def __init__(self, segment, fusion: Fusion, layouts: dict, n: int):
        self.order = [(s.reads, [s.writes]) for s in fusion.steps]
        self.inputs = [t.name for t in segment.inputs]
        self.outputs = [t.name for t in segment.outputs]
        self.layouts = layouts
        self.keys = {name: lay.padding_key for name, lay in layouts.items()}
        self.const = sum(s.constant_rows(n) for s in fusion.steps)

    def allocation(self, p: int, lead):
        """(allocation, load points) for passes of `p` samples with inputs `lead` ahead."""
        load_at = load_points(self.order, self.inputs, lead)
        sizes = {name: lay.rows(p) for name, lay in self.layouts.items()}
        return allocate(self.order, sizes, self.inputs, self.outputs, keys=self.keys,
                        load_at=load_at), load_at

    def rows(self, p: int, lead) -> int:
        return self.allocation(p, lead)[0].rows + self.const

    def one_sample(self) -> tuple[int, object]:
        """(fewest UB rows a pass of one sample needs, the lead that gets them)."""
        return min(((self.rows(1, lead), k, lead) for k, lead in enumerate(LEADS)))[::2]

    def lead_for(self, p: int, ub_rows: int):
        """The most overlapping lead at which `p` samples fit, else the one that makes one
        sample smallest (the batch is then split into passes)."""
        for lead in LEADS:
            if self.rows(p, lead) <= ub_rows:
                return lead
        return self.one_sample()[1]


def footprint(segment, n: int, acc_rows: int) -> Footprint:
    """The footprint of an IR segment as generate() lays it out on an n x n array."""
    packed, _ = pack_segment(segment, n)
    return Footprint(packed, plan_fusion(packed, acc_rows // 2), plan_layouts(packed, n), n)


def ub_rows_needed(segment, n: int, acc_rows: int) -> int:
    """The fewest UB rows one sample of `segment` needs (generate() raises a CodegenError
    when the machine has fewer)."""
    return footprint(segment, n, acc_rows).one_sample()[0]


def fits(segment, *, array_size: int, ub_rows: int, acc_rows: int) -> bool:
    """Whether the back end can place one sample of `segment` in a Unified Buffer of
    `ub_rows` rows (shapes alone: the weights and scales may be placeholders)."""
    return ub_rows_needed(segment, array_size, acc_rows) <= ub_rows


class Room:
    """The back end's capacity questions for one machine shape, as the front end's banding
    (front/banding.py) asks them: front/ does not import codegen/, so the pipeline hands it
    this object (`room(machine)` in backend.py)."""

    def __init__(self, array_size: int, ub_rows: int, acc_rows: int):
        self.array_size, self.ub_rows, self.acc_rows = array_size, ub_rows, acc_rows

    @property
    def cannot_hold(self) -> str:
        """The reason the pipeline gives a node too large for the machine."""
        from .backend import CANNOT_HOLD
        return CANNOT_HOLD

    def fits(self, segment) -> bool:
        return fits(segment, array_size=self.array_size, ub_rows=self.ub_rows,
                    acc_rows=self.acc_rows)

    def parameter_rows(self, segment) -> int:
        """UB rows of the segment's per-column parameters and tables."""
        return footprint(segment, self.array_size, self.acc_rows).const

    def refuses(self, op) -> str | None:
        """Why the back end does not map `op` (None when it does)."""
        from . import supports
        return supports(op)

    @property
    def errors(self) -> tuple[type, ...]:
        """The back end's errors about a segment it cannot place."""
        from .lower import CodegenError
        return (CodegenError,)

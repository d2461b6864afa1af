"""A virtualised memory view (Textual Line API): only the visible rows and columns are
formatted, so a 98,304 x 256 Unified Buffer scrolls and repaints as fast as a small one.

Per view: radix (hex, signed, unsigned), unit for byte memories (int8, or int32 from four
little-endian bytes), values changed by the last step highlighted, a target row marked
after `goto` and moved with up/down; `W` / `U` go back in time to the last write / read of
that row (the debugger's `jump writer|reader`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .formatting import cell_width, format_row

RADIXES = ("hex", "signed", "unsigned")
_ADDRESS = Style(color="bright_black")
_TARGET_ADDRESS = Style(color="black", bgcolor="yellow", bold=True)
_ZERO = Style(color="grey42")
_VALUE = Style()
_CHANGED = Style(color="black", bgcolor="bright_yellow", bold=True)
_HEADER = Style(color="cyan", bold=True)
_MISMATCH = Style(color="white", bgcolor="red", bold=True)
_TARGET_CELL = Style(color="black", bgcolor="yellow", bold=True)


class MemoryView(ScrollView, can_focus=True):
    """Rows of a 2-D array: address gutter fixed on the left, values scrolling right."""

    BINDINGS = [
        Binding("x", "cycle_radix", "Radix", tooltip="hex / signed / unsigned"),
        Binding("w", "toggle_unit", "int8/32", tooltip="bytes as int8 or as int32 words"),
        Binding("up", "select(-1)", "Row up", show=False),
        Binding("down", "select(1)", "Row down", show=False),
        Binding("W", "jump_to_access(True)", "Writer", tooltip="back to the last write of the row"),
        Binding("U", "jump_to_access(False)", "Reader", tooltip="back to the last read of the row"),
    ]

    DEFAULT_CSS = """
    MemoryView { height: 1fr; }
    MemoryView:focus { background: $boost; }
    """

    radix: reactive[str] = reactive("hex")
    unit: reactive[str] = reactive("int8")

    def __init__(self, memory: str, source: Callable[[], np.ndarray | None], **kwargs):
        super().__init__(**kwargs)
        self.memory = memory
        self.source = source
        self.target_row: int | None = None
        self.target_col: int | None = None          # `goto ub[r][c]`: that cell is marked
        self._before: tuple[int, np.ndarray] | None = None   # rows captured before a step
        self._shape: tuple[int, int] = (0, 0)
        self._drawn = None               # what the last repaint showed (skip identical ones)
        self.mismatches: dict[int, set[int]] = {}   # row -> columns `compare` found different

    # -- data --------------------------------------------------------------------------------
    def array(self) -> np.ndarray | None:
        """The memory as the view shows it: uint8/int8 bytes, or int32 elements."""
        a = self.source()
        if a is None:
            return None
        if a.dtype.itemsize == 1 and self.unit == "int32" and a.shape[1] % 4 == 0:
            return a.view("<i4") if a.flags.c_contiguous else np.ascontiguousarray(a).view("<i4")
        return a

    @property
    def bits(self) -> int:
        a = self.source()
        return 8 if a is not None and a.dtype.itemsize == 1 and self.unit == "int8" else 32

    def capture(self) -> None:
        """Remember the visible rows, so that the next repaint can mark what changed."""
        a = self.array()
        if a is None:
            self._before = None
            return
        top = int(self.scroll_offset.y)
        height = max(self.size.height, 1)
        self._before = (top, a[top:top + height].copy())

    def update_data(self) -> None:
        """The machine moved (or a new tile is shown): resize and repaint, but only if what
        is on screen can have changed: repainting is the expensive part of a step."""
        a = self.array()
        rows, cols = (0, 0) if a is None else a.shape
        self._shape = (rows, cols)
        cw = cell_width(self.radix, self.bits) + 1
        size = Size(self._gutter_width() + cols * cw, rows + 1)
        if size != self.virtual_size:           # a new size means a relayout: only when needed
            self.virtual_size = size
        top = int(self.scroll_offset.y)
        window = None if a is None else a[top:top + max(self.size.height, 1)]
        view = (None if a is None else a.shape, a.dtype if a is not None else None, top,
                int(self.scroll_offset.x), self.radix, self.unit, self.target_row, self.size)
        marked = set()                  # rows on screen that changed in the last step
        if self._before is not None and window is not None and self._before[0] == top \
                and self._before[1].shape == window.shape:
            marked = _changed_rows(self._before[1], window)
        old, self._drawn = self._drawn, (view, None if window is None else window.copy(), marked)
        if old is None or old[0] != view or old[1] is None or window is None:
            self.refresh()
            return
        # the same view: repaint the rows whose values or highlight changed (line 0 is the
        # column header)
        changed = _changed_rows(old[1], window)
        for row in changed | marked | old[2]:
            self.refresh(Region(0, 1 + row, self.size.width, 1))

    def mark_cells(self, cells) -> None:
        """Highlight (row, column) cells: the differences the last `compare` found."""
        self.mismatches = {}
        for r, c in cells:
            self.mismatches.setdefault(r, set()).add(c)
        self._drawn = None
        self.refresh()

    def _gutter_width(self) -> int:
        return max(len(str(max(self._shape[0] - 1, 0))), 4) + 2

    class FormatChanged(Message):
        """Radix or unit changed: the app shows them under the pane."""

    class JumpToAccess(Message):
        """`W` / `U`: go back to the last write (read) of the selected row."""

        def __init__(self, memory: str, row: int, write: bool):
            super().__init__()
            self.memory, self.row, self.write = memory, row, write

    def selected_row(self) -> int:
        """The marked row (`goto`, up/down), else the first one on screen."""
        return self.target_row if self.target_row is not None else int(self.scroll_offset.y)

    def action_select(self, delta: int) -> None:
        """Move the marked row, scrolling to keep it on screen."""
        rows = self._shape[0]
        if not rows:
            return
        row = min(max(self.selected_row() + delta, 0), rows - 1)
        self.target_row = row
        top, height = int(self.scroll_offset.y), max(self.size.height - 1, 1)   # - the header
        if not top <= row < top + height:
            self.scroll_to(y=row if row < top else row - height + 1, animate=False, immediate=True)
        self.update_data()

    def action_jump_to_access(self, write: bool) -> None:
        if self.memory not in ("ub", "acc", "host"):
            self.notify("access history covers ub, acc and host rows", timeout=2)
            return
        self.post_message(self.JumpToAccess(self.memory, self.selected_row(), write))

    def describe(self) -> str:
        a = self.source()
        unit = "int32" if a is None or a.dtype.itemsize != 1 else self.unit
        return f"{self.radix} {unit}"

    def watch_radix(self) -> None:
        self.update_data()
        self.post_message(self.FormatChanged())

    def watch_unit(self) -> None:
        self._before = None
        self.update_data()
        self.post_message(self.FormatChanged())

    def action_cycle_radix(self) -> None:
        self.radix = RADIXES[(RADIXES.index(self.radix) + 1) % len(RADIXES)]
        self.notify(f"{self.memory}: {self.radix}", timeout=1.5)

    def action_toggle_unit(self) -> None:
        a = self.source()
        if a is None or a.dtype.itemsize != 1:
            self.notify(f"{self.memory} holds int32 values", timeout=1.5)
            return
        self.unit = "int32" if self.unit == "int8" else "int8"

    def go_to(self, row: int, col: int = 0) -> None:
        """Scroll so that `row` is near the top and mark it."""
        self.target_row = row
        self.target_col = col or None           # a column was asked for: mark its cell
        cw = cell_width(self.radix, self.bits) + 1
        if self.unit == "int32" and self.bits == 32 and (self.source() is not None
                                                         and self.source().dtype.itemsize == 1):
            col //= 4
        self.scroll_to(x=max(col - 2, 0) * cw, y=max(row - 2, 0), animate=False, immediate=True)
        self.refresh()

    # -- Line API ----------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.size.width
        a = self.array()
        if a is None:
            return Strip([Segment(f" no {self.memory} memory loaded".ljust(width), _ZERO)]) \
                if y == 0 else Strip.blank(width)
        rows, cols = a.shape
        bits = 8 if a.dtype.itemsize == 1 else 32
        cw = cell_width(self.radix, bits)
        gutter = self._gutter_width()
        scroll_x, scroll_y = int(self.scroll_offset.x), int(self.scroll_offset.y)
        first = scroll_x // (cw + 1)
        count = max(0, min(cols - first, (width - gutter) // (cw + 1) + 1))
        if y == 0:                       # column header, stays put while scrolling down
            head = " " * gutter + "".join(_column_label(c, cw) for c in range(first, first + count))
            return Strip([Segment(head[:width].ljust(width), _HEADER)])
        row = scroll_y + y - 1
        if row >= rows:
            return Strip.blank(width)
        values = a[row, first:first + count]
        texts = format_row(values, self.radix, bits, cw)
        changed = None
        if self._before is not None:
            top, before = self._before
            if top <= row < top + len(before) and before.shape[1:] == a.shape[1:]:
                changed = (before[row - top, first:first + count] != values).tolist()
        zero = (values == 0).tolist()
        wrong = self.mismatches.get(row, ())
        target_col = self.target_col
        if target_col is not None and a.dtype.itemsize == 4 and self.source().dtype.itemsize == 1:
            target_col //= 4                  # bytes shown as int32 words
        addr_style = _TARGET_ADDRESS if row == self.target_row else _ADDRESS
        segments = [Segment(f"{row:>{gutter - 2}}: ", addr_style)]
        # one segment per run of equally styled cells: a 256-wide row is a handful of
        # segments, not hundreds, which is what keeps the repaint cheap
        run_style, run = None, []
        for k, text in enumerate(texts):
            style = (_MISMATCH if first + k in wrong else
                     _TARGET_CELL if row == self.target_row and first + k == target_col else
                     _CHANGED if changed and changed[k] else (_ZERO if zero[k] else _VALUE))
            if style is not run_style and run:
                segments.append(Segment(" ".join(run), run_style))
                segments.append(Segment(" "))
                run = []
            run_style = style
            run.append(text)
        if run:
            segments.append(Segment(" ".join(run), run_style))
        return Strip(segments).crop(0, width).extend_cell_length(width)


def _column_label(c: int, cw: int) -> str:
    """A column number in a cell `cw` wide (and its space).  A hex byte cell is 2 wide:
    its columns are numbered in hex (column 200 is `c8`, not a cut-off `00`)."""
    text = f"{c:02x}" if cw < 3 else str(c)
    return f"{text[-cw:]:>{cw}} "


def _changed_rows(before: np.ndarray, after: np.ndarray) -> set[int]:
    """Rows (of two same-shaped 2-D windows) that differ.  A memory may have no columns
    (no host image given): no rows differ then, and nothing is reshaped."""
    if before.size == 0:
        return set()
    return set(np.flatnonzero((before != after).any(axis=1)).tolist())

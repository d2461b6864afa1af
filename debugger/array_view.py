"""The matrix unit: the active weight tile as a heat map, the current MatrixMultiply's
wavefront (which input vector is in which cell at this cycle) and the shadow tile's shift.

The wavefront is the timing model's claim, from tpuasm.machine.wavefront (vector v enters
at its cycle and reaches cell (k, n) k + n cycles later); this pane only draws it.  An N x N
array larger than the pane is downsampled: each character shows two rows of bins (upper
and lower half block), each bin the mean of its cells; `+`/`-` zoom into the array and the
arrow keys pan, so a 256 x 256 array can be looked at cell by cell.
"""
from __future__ import annotations

import numpy as np
from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.strip import Strip
from textual.widget import Widget

HEADER = 3          # lines above the map: what is shown, the wavefront, the shadow


def _wavefront():
    """The timing model's array view (tpuasm.machine.wavefront), None if this build lacks it."""
    try:
        from tpuasm.machine import wavefront
    except ImportError:
        return None
    return wavefront


def bins(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Mean of `a` over a rows x cols grid of nearly equal blocks (no block empty)."""
    r_edges = np.linspace(0, a.shape[0], rows + 1).astype(int)
    c_edges = np.linspace(0, a.shape[1], cols + 1).astype(int)
    sums = np.add.reduceat(np.add.reduceat(a.astype(np.float64), r_edges[:-1], axis=0),
                           c_edges[:-1], axis=1)
    counts = np.diff(r_edges)[:, None] * np.diff(c_edges)[None, :]
    return sums / np.maximum(counts, 1)


def _weight_colour(v: float) -> Color:
    """int8 weight (mean) -> blue (negative) .. black .. red (positive)."""
    t = min(abs(v) / 128.0, 1.0) ** 0.6
    level = int(40 + 215 * t) if t > 0.01 else 20
    return Color.from_rgb(level, 30, 40) if v > 0 else Color.from_rgb(30, 40, level)


def _wave_colour(fraction: float, weight: float) -> Color:
    """A bin the wavefront covers: green, brighter the more of its cells hold a vector."""
    if fraction <= 0:
        return _weight_colour(weight * 0.35)          # the tile, dimmed, under the wavefront
    g = int(90 + 165 * min(fraction, 1.0))
    return Color.from_rgb(30, g, 60)


_STYLES: dict = {}


def _style(top, bottom) -> Style:
    key = (top, bottom)
    style = _STYLES.get(key)
    if style is None:
        colour = lambda q: _wave_colour(q[0] / 8, q[1] * 8)   # noqa: E731
        style = _STYLES[key] = Style(color=colour(top), bgcolor=colour(bottom) if bottom else None)
    return style


class ArrayPane(Widget, can_focus=True):
    BINDINGS = [
        Binding("plus,equals_sign", "zoom(0.5)", "Zoom in", show=False),
        Binding("minus", "zoom(2)", "Zoom out", show=False),
        Binding("left", "pan(0, -1)", show=False),
        Binding("right", "pan(0, 1)", show=False),
        Binding("up", "pan(-1, 0)", show=False),
        Binding("down", "pan(1, 0)", show=False),
    ]
    DEFAULT_CSS = "ArrayPane { height: 1fr; } ArrayPane:focus { background: $boost; }"

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self.window = None            # (row0, col0, size) of the array shown; None: all of it
        self._strips: list[Strip] = []
        self.view = None              # the last wavefront.ArrayView drawn (for tests)

    def on_resize(self) -> None:
        self.update_state()

    def _window(self) -> tuple[int, int, int]:
        n = self.session.machine.config.array_size
        if self.window is None:
            return 0, 0, n
        r0, c0, size = self.window
        size = max(1, min(size, n))
        return min(max(r0, 0), n - size), min(max(c0, 0), n - size), size

    def action_zoom(self, factor: float) -> None:
        n = self.session.machine.config.array_size
        r0, c0, size = self._window()
        new = int(min(n, max(4, round(size * factor))))
        centre_r, centre_c = r0 + size // 2, c0 + size // 2
        self.window = (centre_r - new // 2, centre_c - new // 2, new)
        self.window = self._window()
        self.update_state()

    def action_pan(self, dr: int, dc: int) -> None:
        r0, c0, size = self._window()
        step = max(1, size // 4)
        self.window = (r0 + dr * step, c0 + dc * step, size)
        self.window = self._window()
        self.update_state()

    def update_state(self) -> None:
        if not self.display or not self.size.width:
            return
        m = self.session.machine
        width, height = self.size.width, self.size.height
        lines: list[Text] = []
        active = m.active()
        tile = None
        if active is not None and m.weights is not None and m.weights.shape[0]:
            tile = m.tile_values(active.tiles[0]).astype(np.int64)
        n = m.config.array_size
        r0, c0, size = self._window()
        wave = _wavefront()
        occupied = None
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(f"array {n}x{n}", style="bold")
        head.append(f"  rows {r0}..{r0 + size - 1}, cols {c0}..{c0 + size - 1}", style="grey62")
        head.append("  tile " + (", ".join(map(str, active.tiles)) if active else "none"),
                    style="bold yellow")
        lines.append(head)
        front = Text(no_wrap=True, overflow="ellipsis")
        if wave is None:
            front.append("wavefront: this build has no tpuasm.machine.wavefront", style="grey50")
        else:
            view = wave.array_view(m)
            self.view = view
            inside = view.instruction >= 0
            occupied = inside.astype(np.float64)
            if inside.any():
                mmcs = sorted(set(view.instruction[inside].tolist()))
                vecs = view.vector[inside]
                front.append("wavefront ", style="bold green")
                front.append(f"MMC #{', #'.join(map(str, mmcs))}: vectors {int(vecs.min())}.."
                             f"{int(vecs.max())} in {int(inside.sum()):,} cells; "
                             f"vector v is in cell (k, n) from its entry + k + n", style="green")
            else:
                front.append("wavefront: no MatrixMultiply in the array this cycle", style="grey50")
        lines.append(front)
        sh = m.shadow()
        shadow = Text(no_wrap=True, overflow="ellipsis")
        shadow.append("shadow ", style="bold yellow")
        if sh is None:
            shadow.append("empty", style="grey50")
        else:
            full = int(20 * sh.done / sh.total) if sh.total else 20
            shadow.append(f"tile {sh.tile} {sh.state} {sh.done}/{sh.total} cycles "
                          + "█" * full + "░" * (20 - full), style="yellow")
        lines.append(shadow)
        console = self.app.console
        self._strips = [Strip(list(t.render(console))).crop(0, width) for t in lines]
        rows_avail = max(1, height - HEADER)
        grid_cols = max(1, min(width, size))
        grid_rows = max(1, min(2 * rows_avail, size))
        if tile is None:
            self._strips.append(Strip([Segment("no active weight tile", Style(color="grey50"))]))
        else:
            w = bins(tile[r0:r0 + size, c0:c0 + size], grid_rows, grid_cols)
            occ = (bins(occupied[r0:r0 + size, c0:c0 + size], grid_rows, grid_cols)
                   if occupied is not None else np.zeros_like(w))
            # quantised colours, one Style object per (top, bottom) pair: a 256-wide map
            # is thousands of cells per step
            rep = max(1, min(4, width // grid_cols))        # a small array: wider cells
            wq = np.clip(np.round(w / 8), -16, 16).astype(int)
            oq = np.clip(np.round(occ * 8), 0, 8).astype(int)
            for y in range(0, grid_rows, 2):
                segs = []
                for x in range(grid_cols):
                    top = (int(oq[y, x]), int(wq[y, x]))
                    bottom = (int(oq[y + 1, x]), int(wq[y + 1, x])) if y + 1 < grid_rows else None
                    segs.append(Segment("▀" * rep, _style(top, bottom)))
                self._strips.append(Strip(segs))
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y >= len(self._strips):
            return Strip.blank(width, self.rich_style)
        return self._strips[y].crop(0, width).extend_cell_length(width, self.rich_style)

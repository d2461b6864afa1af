"""Panes drawn on Textual's Line API from rich Text: segments go straight to strips, which
costs far less per step than a Static's update (that converts the whole Text into Textual's
content model every time).

After a step most lines of a pane are what they were: `StripLines.show` repaints only the
lines that differ, and keeps the pane's scrollable size unchanged while its text fits in
the pane, because a new virtual size makes Textual lay out the whole screen again.
"""
from __future__ import annotations

from rich.text import Text
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip


def text_strips(console, text: Text) -> list[Strip]:
    return [Strip(list(line.render(console))) for line in text.split("\n", allow_blank=True)]


class StripLines:
    """Mixin for a Widget (or ScrollView) that shows `self._strips`, one per line."""

    _strips: list[Strip]
    _paint_style = None

    def render_lines(self, crop):
        # the widget's style, looked up once per paint (it walks the CSS ancestry: per line
        # it cost more than the lines themselves)
        self._paint_style = self.rich_style
        try:
            return super().render_lines(crop)
        finally:
            self._paint_style = None

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self._paint_style or self.rich_style
        row = int(self.scroll_offset.y) + y
        if row >= len(self._strips):
            return Strip.blank(width, style)
        return self._strips[row].crop(0, width).extend_cell_length(width, style)

    def show(self, strips: list[Strip]) -> None:
        """Show `strips`, repainting only the lines that changed.  (A ScrollView's on_resize
        should reset its virtual_size to Size(0, 0) before showing again.)"""
        old, self._strips = getattr(self, "_strips", []), strips
        if isinstance(self, ScrollView):
            # at least the pane's height, and it only grows (a resize starts again): the
            # pane becomes scrollable once and stays so, instead of relaying out the
            # screen whenever a stall text wraps onto one more line or one fewer
            height = max(len(strips), self.scrollable_content_region.height,
                         self.virtual_size.height)
            if Size(0, height) != self.virtual_size:
                self.virtual_size = Size(0, height)
                return                          # the relayout repaints everything
        top, width = int(self.scroll_offset.y), self.size.width
        changed = [y for y in range(max(len(old), len(strips)))
                   if y >= len(old) or y >= len(strips) or old[y] != strips[y]]
        if len(changed) > len(strips) // 2:
            self.refresh()
            return
        for y in changed:
            if top <= y < top + self.size.height:
                self.refresh(Region(0, y - top, width, 1))

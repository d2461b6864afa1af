"""Panes drawn on Textual's Line API from rich Text: segments go straight to strips, which
costs far less per step than a Static's update (that converts the whole Text into Textual's
content model every time)."""
from __future__ import annotations

from rich.text import Text
from textual.strip import Strip


def text_strips(console, text: Text) -> list[Strip]:
    return [Strip(list(line.render(console))) for line in text.split("\n", allow_blank=True)]


class StripLines:
    """Mixin for a Widget (or ScrollView) that shows `self._strips`, one per line."""

    _strips: list[Strip]

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        row = int(self.scroll_offset.y) + y
        if row >= len(self._strips):
            return Strip.blank(width, self.rich_style)
        return self._strips[row].crop(0, width).extend_cell_length(width, self.rich_style)

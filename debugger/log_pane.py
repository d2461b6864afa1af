"""The command output log: Textual's RichLog that re-wraps its text to its current width,
minus a whole-screen relayout per line.

RichLog renders each line once, at the width the pane had then: output written while the
log was hidden or narrow stayed wrapped at 16-46 columns for good (issue 23).  Here every
entry is kept (as many as the pane keeps lines) and rendered again whenever the pane's
width changes; until the pane has a width, entries are only kept.

RichLog.write sets the widget's virtual size, and Textual declares that reactive as one that
needs a layout of the whole screen, although a Line-API view only needs its scrollbars
updated when that size changes.  A step that logs a line (a tag, a halt) then cost a full
relayout and repaint (~10 ms more, bench_debugger.py).  Here a new size updates the
scrollbars in place; when one has to appear or go, Textual still relays out (its
show_*_scrollbar reactives ask for it themselves).
"""
from __future__ import annotations

from collections import deque

from textual.geometry import Size
from textual.widgets import RichLog


class LogPane(RichLog):
    _writing = False

    def __init__(self, *args, max_lines: int = 2000, **kwargs):
        super().__init__(*args, max_lines=max_lines, **kwargs)
        self._entries: deque = deque(maxlen=max_lines)
        self._wrapped_at = 0            # the width the shown lines were rendered at

    def write(self, content, *args, **kwargs):
        self._entries.append(content)
        width = self.size.width
        if not width:
            return self                 # rendered when the pane gets a width
        if width != self._wrapped_at:
            self._rewrap()
            return self
        return self._render_entry(content, *args, **kwargs)

    def _render_entry(self, content, *args, **kwargs):
        # wrapped at the pane's width, given explicitly: RichLog's own measure is capped
        # by the console's width, which is not the pane's
        width = self.scrollable_content_region.width
        if width > 0 and "width" not in kwargs and not args:
            kwargs["width"] = max(width, self.min_width)
        self._writing = True
        try:
            return super().write(content, *args, **kwargs)
        finally:
            self._writing = False

    def entries(self) -> list:
        """What was written (oldest first), whatever the width (for tests)."""
        return list(self._entries)

    def on_resize(self, event) -> None:
        self._size_known = bool(event.size.width)
        if event.size.width and event.size.width != self._wrapped_at:
            # after the layout: the scrollable region (the wrap width) is not yet updated
            self.call_after_refresh(self._rewrap_if_resized)

    def _rewrap_if_resized(self) -> None:
        if self.size.width and self.size.width != self._wrapped_at:
            self._rewrap()

    def _rewrap(self) -> None:
        """Render every kept entry again at the pane's width, scrolled to the end."""
        self._size_known = True
        self._wrapped_at = self.size.width
        self.lines.clear()
        self._line_cache.clear()
        self._start_line = 0
        self._widest_line_width = 0
        self._deferred_renders.clear()
        for entry in self._entries:
            self._render_entry(entry, scroll_end=False)
        self.virtual_size = Size(self._widest_line_width, len(self.lines))
        self.scroll_end(animate=False, immediate=False, x_axis=False)
        self.refresh()

    def refresh(self, *regions, repaint=True, layout=False, recompose=False):
        if layout and self._writing and not recompose and self.is_mounted:
            # Widget._scroll_update: scrollbar visibility (which relays out if it changes),
            # their window sizes, the scroll offsets clamped to the new size
            self._scroll_update(self.virtual_size)
            layout = False
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

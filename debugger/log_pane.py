"""The command output log: Textual's RichLog, minus a whole-screen relayout per line.

RichLog.write sets the widget's virtual size, and Textual declares that reactive as one that
needs a layout of the whole screen, although a Line-API view only needs its scrollbars
updated when that size changes.  A step that logs a line (a tag, a halt) then cost a full
relayout and repaint (~10 ms more, bench_debugger.py).  Here a new size updates the
scrollbars in place; when one has to appear or go, Textual still relays out (its
show_*_scrollbar reactives ask for it themselves).
"""
from __future__ import annotations

from textual.widgets import RichLog


class LogPane(RichLog):
    _writing = False

    def write(self, *args, **kwargs):
        self._writing = True
        try:
            return super().write(*args, **kwargs)
        finally:
            self._writing = False

    def refresh(self, *regions, repaint=True, layout=False, recompose=False):
        if layout and self._writing and not recompose and self.is_mounted:
            # Widget._scroll_update: scrollbar visibility (which relays out if it changes),
            # their window sizes, the scroll offsets clamped to the new size
            self._scroll_update(self.virtual_size)
            layout = False
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

"""The bottom line of the screen: the main keys and what they do, one line, clickable.

It replaces Textual's Footer, which mounts one widget per binding and recomposes all of
them whenever the focus or the bindings change: at start-up that alone cost about as much
as everything else on the first frame (0.2 s of 0.4 s at 80 x 24).  This line is one
widget drawn from a fixed list of (key, label, action), cut to the screen's width.
"""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class KeyBar(Widget):
    """`keys`: (key as shown, label, action run on a click).  A click on a key's label runs
    its action, as a click on Textual's Footer does."""

    DEFAULT_CSS = """
    KeyBar { height: 1; dock: bottom; background: $panel; color: $text-muted; }
    """

    def __init__(self, keys: list[tuple[str, str, str]], **kwargs):
        super().__init__(**kwargs)
        self.keys = keys
        self._spans: list[tuple[int, int, str]] = []     # (start, end, action) on the line

    def render(self) -> Text:
        text, spans = Text(no_wrap=True, overflow="crop"), []
        width = self.size.width or 10_000
        for key, label, action in self.keys:
            entry = Text.assemble((f" {key} ", "bold reverse"), f" {label} ")
            if text.cell_len + entry.cell_len > width:
                break                       # whole entries only: no half label at the edge
            spans.append((text.cell_len, text.cell_len + entry.cell_len, action))
            text.append_text(entry)
        self._spans = spans
        return text

    def action_at(self, x: int) -> str | None:
        """The action of the entry drawn at column x (None between or past them)."""
        return next((action for start, end, action in self._spans if start <= x < end), None)

    async def on_click(self, event) -> None:
        action = self.action_at(event.x)
        if action:
            await self.app.run_action(action)

"""The source pane (Line API): highlighted .tasm with a gutter of breakpoints and of the
pipeline stages that hold each line's instructions right now.

A program without source text (a stripped .tbin) is shown as its disassembly, one line
per instruction.
"""
from __future__ import annotations

from dataclasses import dataclass

from pygments.token import Comment, Keyword, Name, Number, Operator, String
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .lexer import TasmLexer

# One letter per stage in the gutter; the front end's "next to issue" is an arrow.
STAGE_LETTERS = {"input": "I", "matrix": "M", "activate": "A", "output": "O", "weights": "W"}
STAGE_STYLES = {"I": Style(color="black", bgcolor="green"), "M": Style(color="black", bgcolor="magenta"),
                "A": Style(color="black", bgcolor="cyan"), "O": Style(color="black", bgcolor="blue"),
                "W": Style(color="black", bgcolor="yellow")}
_TOKEN_STYLES = [
    (Comment, Style(color="grey50", italic=True)),
    (Keyword.Type, Style(color="bright_magenta")),
    (Keyword.Pseudo, Style(color="bright_blue", bold=True)),
    (Keyword, Style(color="bright_cyan", bold=True)),
    (Name.Label, Style(color="bright_yellow", bold=True)),
    (Name.Builtin, Style(color="green")),
    (Name.Attribute, Style(color="yellow")),
    (Name.Variable, Style(color="bright_green")),
    (Number, Style(color="bright_red")),
    (String, Style(color="yellow")),
    (Operator, Style(color="white")),
]
GUTTER_MARKS = 7         # " ● IMA▶ " after the line number: breakpoint, stages, next arrow
_LINE_NO = Style(color="grey50")
_BREAK = Style(color="bright_red", bold=True)
_BREAK_OFF = Style(color="grey50")
_NEXT = Style(color="bright_yellow", bold=True)
_CURSOR = Style(bgcolor="grey23")
_NEXT_LINE = Style(bgcolor="dark_blue")
_FAULT = Style(color="bright_red", bold=True)
_FAULT_LINE = Style(bgcolor="dark_red")
_NODE = Style(color="cyan", italic=True)
_EXPANSION = Style(color="black", bgcolor="bright_yellow")


def _style_for(token) -> Style:
    for kind, style in _TOKEN_STYLES:
        if token in kind:
            return style
    return Style()


def highlight(text: str) -> list[list[Segment]]:
    """Per line, the styled segments of `text` (tokenised once, when a program loads)."""
    lines: list[list[Segment]] = [[]]
    for token, value in TasmLexer().get_tokens(text):
        parts = value.split("\n")
        for k, part in enumerate(parts):
            if k:
                lines.append([])
            if part:
                lines[-1].append(Segment(part.expandtabs(4), _style_for(token)))
    if text.endswith("\n") or (lines and not lines[-1]):
        lines.pop()
    return lines


@dataclass
class Listing:
    """What the source pane shows: lines, and which instructions each line holds."""
    name: str
    lines: list[list[Segment]]
    line_of: dict[int, int]                 # instruction index -> 1-based line
    indices_of: dict[int, list[int]]        # 1-based line -> instruction indices
    node_of: dict[int, str]                 # 1-based line -> graph node (`.node`) of its first
                                            # instruction; empty when the program names none

    @property
    def plain(self) -> list[str]:
        """The lines as plain text (search)."""
        return ["".join(seg.text for seg in line) for line in self.lines]


def build_listing(session, file: str | None = None) -> Listing:
    program = session.program
    file = file or session.main_file()
    text = program.sources.get(file) if file else None
    if text is not None:
        line_of = {i: loc.line for i, loc in enumerate(program.locations)
                   if loc is not None and loc.file == file}
        lines = highlight(text)
    else:
        from tpuasm.disassembler import format_instruction
        file = "(disassembly)"
        line_of = {i: i + 1 for i in range(len(program))}
        lines = highlight("\n".join(format_instruction(ins) for ins in program.instructions))
    indices_of: dict[int, list[int]] = {}
    for i, line in line_of.items():
        indices_of.setdefault(line, []).append(i)
    node_of = {}
    if program.nodes():
        for line, indices in indices_of.items():
            node = program.node_of(min(indices))
            if node:
                node_of[line] = node
    return Listing(file, lines, line_of, indices_of, node_of)


class SourceView(ScrollView, can_focus=True):
    """Source lines with gutter: line number, breakpoint dot, stage letters, next arrow."""

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "cursor(-20)", show=False),
        Binding("pagedown", "cursor(20)", show=False),
        Binding("space", "toggle_break", "Break", tooltip="toggle a breakpoint on the cursor line"),
        # while a search (`/text`, `?text`) is on: n / N go to the next / previous match (the app's
        # n, next instruction, again once Escape has ended the search)
        Binding("n", "search(1)", "Next match", show=False),
        Binding("N", "search(-1)", "Previous match", show=False),
        Binding("escape", "end_search", "End search", show=False),
        Binding("left", "pan(-8)", show=False),
        Binding("right", "pan(8)", show=False),
        Binding("home", "pan(-10000)", show=False),
    ]
    DEFAULT_CSS = """
    SourceView { height: 1fr; scrollbar-size-horizontal: 0; scrollbar-size-vertical: 1; }
    SourceView:focus { background: $boost; }
    """

    class ToggleBreakpoint(Message):
        def __init__(self, line: int):
            super().__init__()
            self.line = line

    def __init__(self, session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self.listing = build_listing(session)
        self.cursor_line = 1
        self.stages: dict[int, str] = {}         # line -> stage letters now
        self.next_line: int | None = None
        self.break_lines: dict[int, bool] = {}   # line -> enabled
        self._drawn = None
        self.fault_line: int | None = None        # the line of the instruction that faulted
        self.expansions: dict[int, list[str]] = {}  # line -> "▶ 3/4000": which expansion
        self.search_term: str | None = None       # `/text`, `?text`: n / N find it again
        self.search_direction = 1                 # 1: `/` (down), -1: `?` (up)
        self._resize_virtual()

    @property
    def node_width(self) -> int:
        """The graph-node column (compiled programs): narrower on a narrow pane."""
        if not self.listing.node_of:
            return 0
        longest = max(len(n) for n in self.listing.node_of.values())
        return min(longest, 8 if (self.size.width or 80) < 60 else 16) + 1

    def wanted_width(self) -> int:
        """Columns that show every instruction line whole (its code, not a trailing comment)
        with the full node column, the border and the scrollbar."""
        plain = self.listing.plain
        code = max((len(plain[line - 1].split(";", 1)[0].rstrip())
                    for line in self.listing.indices_of if 0 < line <= len(plain)), default=40)
        nodes = self.listing.node_of
        node = min(max((len(n) for n in nodes.values()), default=0), 16) + 1 if nodes else 0
        return max(3, len(str(len(self.listing.lines)))) + GUTTER_MARKS + node + code + 3

    @property
    def gutter_width(self) -> int:
        return max(3, len(str(len(self.listing.lines)))) + GUTTER_MARKS + self.node_width

    def _resize_virtual(self) -> None:
        """Long lines scroll sideways (left/right) under a fixed gutter."""
        longest = max((sum(seg.cell_length for seg in line) for line in self.listing.lines), default=0)
        self.virtual_size = Size(self.gutter_width + longest + 1, len(self.listing.lines))

    def reload(self) -> None:
        """A new program (`reload`): its lines, from the top."""
        self.listing = build_listing(self.session)
        self._resize_virtual()
        self._drawn = None
        self.border_title = f"source  {self.listing.name}"
        self.update_state(follow=True)
        self.refresh()

    def on_resize(self) -> None:
        self._resize_virtual()          # the node column narrows with the pane
        # the first follow ran before the pane had a size (scrolling then does nothing);
        # a new height must keep the cursor's line in view too
        self.call_after_refresh(self._keep_visible, self.cursor_line)

    def action_pan(self, delta: int) -> None:
        self.scroll_to(x=max(0, int(self.scroll_offset.x) + delta), animate=False)

    def show_file(self, file: str) -> None:
        if file != self.listing.name:
            self.listing = build_listing(self.session, file)
            self._resize_virtual()
            self.border_title = f"source  {file}"

    def on_mount(self) -> None:
        self.border_title = f"source  {self.listing.name}"

    def update_state(self, follow: bool = True) -> None:
        """Read the pipeline and breakpoints; scroll to the next instruction if asked."""
        s = self.session
        program = s.program
        pipeline = s.pipeline()
        nxt = next((st.index for st in pipeline if st.name == "front"), None)
        if nxt is not None and nxt < len(program):
            loc = program.locations[nxt]
            if loc is not None and loc.file != self.listing.name and loc.file in program.sources:
                self.show_file(loc.file)
        line_of = self.listing.line_of
        self.stages = {}
        for st in pipeline:
            letter = STAGE_LETTERS.get(st.name)
            if letter and st.index is not None and st.index in line_of:
                line = line_of[st.index]
                self.stages[line] = self.stages.get(line, "") + letter
        self.next_line = line_of.get(nxt) if nxt is not None else None
        # a line that stands for several instructions (a macro body, a .rept): which
        # expansion each stage and the front end hold, e.g. `▶ 3/4000`
        self.expansions = {}
        for st in pipeline:
            if st.index is None or st.index not in line_of:
                continue
            line = line_of[st.index]
            indices = self.listing.indices_of.get(line, ())
            if len(indices) > 1:
                mark = "▶" if st.name == "front" else STAGE_LETTERS.get(st.name, "?")
                pos = indices.index(st.index) + 1 if st.index in indices else 0
                self.expansions.setdefault(line, []).append(f"{mark} {pos}/{len(indices)}")
        node = program.node_of(nxt) if nxt is not None and nxt < len(program) else None
        title = f"source  {self.listing.name}" + (f"  node {node}" if node else "")
        if title != self.border_title:
            self.border_title = title
        fault = s.machine.fault
        self.fault_line = line_of.get(fault.index) if fault is not None and fault.index is not None else None
        if follow and self.fault_line is not None:
            self.cursor_line = self.fault_line
            self._keep_visible(self.fault_line)
        self.break_lines = {}
        for bp in s.breakpoints.values():
            for i in bp.indices:
                if i in line_of:
                    line = line_of[i]
                    self.break_lines[line] = self.break_lines.get(line, False) or bp.enabled
        if follow and self.next_line is not None:
            self.cursor_line = self.next_line
            self._keep_visible(self.next_line)
        self._repaint_marks()

    def _marks(self) -> dict[int, tuple]:
        """Everything drawn on a line besides its text, for the lines that carry any."""
        out: dict[int, list] = {}
        for field, values in ((0, self.stages), (1, self.expansions), (2, self.break_lines),
                              (3, {self.next_line: True}), (4, {self.fault_line: True}),
                              (5, {self.cursor_line: True})):
            for line, value in values.items():
                if line is not None:
                    out.setdefault(line, [None] * 6)[field] = \
                        tuple(value) if isinstance(value, list) else value
        return {line: tuple(v) for line, v in out.items()}

    def _repaint_marks(self) -> None:
        """Repaint the lines whose marks changed (most cycle steps change none): a whole
        repaint of the pane costs several milliseconds."""
        marks = self._marks()
        view = (self.listing.name, int(self.scroll_offset.x), int(self.scroll_offset.y),
                self.size, self.has_focus)
        old = self._drawn
        self._drawn = (view, marks)
        if old is None or old[0] != view:
            self.refresh()
            return
        top = view[2]
        for line in {*marks, *old[1]}:
            if marks.get(line) != old[1].get(line) and top < line <= top + self.size.height:
                self.refresh(Region(0, line - 1 - top, self.size.width, 1))

    def show_instruction(self, index: int) -> None:
        """Put the cursor on instruction `index`'s line (a jump to its writer, say)."""
        program = self.session.program
        loc = program.locations[index] if 0 <= index < len(program) else None
        if loc is not None and loc.file != self.listing.name and loc.file in program.sources:
            self.show_file(loc.file)
        line = self.listing.line_of.get(index)
        if line is None:
            return
        self.cursor_line = line
        self._keep_visible(line)
        self._repaint_marks()

    def _keep_visible(self, line: int) -> None:
        """Scroll so that `line` is in view with a few lines after it (the instructions
        that issue next); when it is not, it goes a third of the way down."""
        top, height = int(self.scroll_offset.y), max(self.size.height, 1)
        after = min(3, height // 3)                 # lines kept visible below it
        before = min(1, height // 4)
        if not top + before <= line - 1 < top + height - after:
            self.scroll_to(y=max(line - 1 - height // 3, 0), animate=False, immediate=True)

    def action_cursor(self, delta: int) -> None:
        self.cursor_line = min(max(self.cursor_line + delta, 1), max(len(self.listing.lines), 1))
        self._keep_visible(self.cursor_line)
        self.refresh()

    def check_action(self, action: str, parameters) -> bool | None:
        if action in ("search", "end_search"):
            return self.search_term is not None      # otherwise the key goes to the app
        return True

    def start_search(self, term: str, direction: int = 1) -> int | None:
        """Search for `term` (case-insensitive) from the line after the cursor (direction 1,
        `/`) or before it (-1, `?`), wrapping; n repeats it the same way, N the other way,
        until Escape (as in vi and less).  The line found, or None."""
        self.search_term = term
        self.search_direction = 1 if direction >= 0 else -1
        return self.action_search(1)

    def action_search(self, direction: int) -> int | None:
        """direction 1: n (the way the search went), -1: N."""
        term = (self.search_term or "").lower()
        direction *= self.search_direction
        prompt = "/" if self.search_direction > 0 else "?"
        lines = self.listing.plain
        count = len(lines)
        for step in range(1, count + 1):
            line = (self.cursor_line - 1 + direction * step) % count + 1
            if term in lines[line - 1].lower():
                self.cursor_line = line
                self._keep_visible(line)
                self._drawn = None
                self._repaint_marks()
                self.border_subtitle = f"{prompt}{self.search_term}  n next, N previous, Esc ends"
                return line
        self.border_subtitle = f"{prompt}{self.search_term}: not found (Esc ends)"
        return None

    def action_end_search(self) -> None:
        self.search_term = None
        self.border_subtitle = ""

    def action_toggle_break(self) -> None:
        self.post_message(self.ToggleBreakpoint(self.cursor_line))

    def on_click(self, event) -> None:
        offset = event.get_content_offset(self)
        if offset is None:                      # on the border
            return
        line = int(self.scroll_offset.y) + offset.y + 1
        if 1 <= line <= len(self.listing.lines):
            self.cursor_line = line
            if offset.x < self.gutter_width:         # a click in the gutter toggles a breakpoint
                self.post_message(self.ToggleBreakpoint(line))
            self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        line = int(self.scroll_offset.y) + y + 1
        if line > len(self.listing.lines):
            return Strip.blank(width)
        enabled = self.break_lines.get(line)
        dot = Segment("●" if enabled else ("○" if enabled is False else " "),
                      _BREAK if enabled else _BREAK_OFF)
        letters = self.stages.get(line, "")
        stage_segments = [Segment(ch, STAGE_STYLES.get(ch, Style())) for ch in letters[:3]]
        pad = Segment(" " * (3 - min(len(letters), 3)))
        if line == self.fault_line:
            arrow = Segment("✖", _FAULT)
        else:
            arrow = Segment("▶" if line == self.next_line else " ", _NEXT)
        node_width = self.node_width
        digits = self.gutter_width - GUTTER_MARKS - node_width
        node = []
        if node_width:
            name = self.listing.node_of.get(line, "")
            name = name if len(name) < node_width else name[:node_width - 2] + "…"
            node = [Segment(f"{name:<{node_width - 1}} ", _NODE)]
        gutter = Strip([Segment(f"{line:>{digits}} ", _LINE_NO), dot, Segment(" "), *stage_segments,
                        pad, arrow, Segment(" "), *node])
        body_width = max(width - gutter.cell_length, 0)
        scroll_x = int(self.scroll_offset.x)
        segments = list(self.listing.lines[line - 1])
        if line in self.expansions:
            segments.append(Segment("  " + "  ".join(self.expansions[line]), _EXPANSION))
        body = Strip(segments).crop(scroll_x, scroll_x + body_width)
        strip = Strip.join([gutter, body]).crop(0, width).extend_cell_length(width)
        if line == self.fault_line:
            strip = strip.apply_style(_FAULT_LINE)
        elif line == self.next_line:
            strip = strip.apply_style(_NEXT_LINE)
        if line == self.cursor_line and self.has_focus:
            strip = strip.apply_style(_CURSOR)
        return strip

"""The Textual face of the debugger: a thin layer over `commands.Engine`.

Every key and every palette entry becomes a command line for the engine, so the screen,
the command line and `--batch` do exactly the same thing.  Commands that move the machine
run in a thread worker (chunked in the session), so a long `continue` never freezes the
screen and `p`/Escape interrupts it.
"""
from __future__ import annotations

import ast
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.geometry import Region
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from .commands import COMMANDS, Engine, Result, lookup
from .formatting import event_text
from .idle_gc import IdleCollector
from .key_bar import KeyBar
from .log_pane import LogPane
from .memory_view import MemoryView
from .panes import CountersPane, PipelinePane, StatusLine
from . import blas_start
from .array_view import ArrayPane
from .timeline import TimelinePane
from .session import Session
from .source_view import SourceView

MEMORY_TABS = (("ub", "UB"), ("acc", "Accumulators"), ("host", "Host"), ("tile", "Weights"))
WATCH_INTERVAL = 1.0   # seconds between looks at the source file under `reload --watch`
QUICK_LIMIT = 64       # single steps run on the UI thread: a worker's hand-off costs more
STATUS_SHRINK_DELAY = 1.0   # seconds without a key step before the status line shrinks back
PIPELINE_MIN = 56      # columns the pipeline pane keeps when the source pane widens
LOG_READABLE = (40, 5)  # columns x lines below which typed output takes the whole bottom row


@dataclass(frozen=True)
class Key:
    """One row of the key table: the app's bindings, the help screen's key list and the
    command palette are all generated from KEYS."""
    key: str                # as the help screen and the palette name it ("" = palette only)
    help: str = ""          # the help screen's text
    bind: str = ""          # Textual key(s) bound on the app ("" = a pane binds it, or none)
    action: str = ""        # the app action the binding and the palette entry run
    footer: str = ""        # the footer's label
    title: str = ""         # the palette's title ("" = not in the palette)
    detail: str = ""        # the palette's help line
    show: bool = True       # whether the footer shows the binding


KEYS = [
    Key("s", "step one cycle", "s", "cmd('step')", "Step cycle",
        "Step one cycle", "advance the machine one clock"),
    Key("n", "next: issue the next instruction, run until it has finished its stage", "n",
        "cmd('next')", "Next instr", "Next instruction",
        "issue the next instruction and run until it has finished its stage"),
    Key("i", "run until the next instruction has issued", "i", "cmd('issue')", "Issue",
        "Next issue", "run until the next instruction has issued", show=False),
    Key("c", "continue to a breakpoint, watchpoint, caught event, halt or fault", "c",
        "cmd('continue')", "Continue", "Continue", "run to a breakpoint, watchpoint, halt or fault"),
    Key("r", "run N cycles (asks for N)", "r", "prompt('run ')", "Run N", "Run N cycles", "asks for N"),
    Key("u", "run to the cursor line in the source", "u", "run_to_cursor", "To cursor",
        "Run to cursor", "run until the cursor line's instruction is about to issue"),
    Key("p / Escape", "interrupt a run (the screen stays live while running)", "p,escape",
        "interrupt", "Pause", "Interrupt", "stop a running continue"),
    Key("b", "reverse: back one cycle", "b", "cmd('reverse-step')", "Back cycle",
        "Reverse step cycle", "back one clock (the library's History)"),
    Key("B", "reverse: back one instruction", "B", "cmd('reverse-next')", "Back instr",
        "Reverse step instruction", "back one instruction"),
    Key("C", "reverse-continue to the previous breakpoint / watchpoint hit", "C",
        "cmd('reverse-continue')", "Rev cont", "Reverse continue",
        "back to the previous breakpoint or watchpoint hit"),
    Key("space (source) / F9", "toggle a breakpoint on the cursor line; click the gutter too",
        "f9", "toggle_break", "Break", "Toggle breakpoint", "on the source cursor line", show=False),
    Key("up / down / j / k", "move the source cursor"),
    Key("pageup / pagedown", "move the source cursor by 20 lines"),
    Key("left / right / home", "scroll the source sideways (long lines), home back to column 0"),
    Key("x (memory)", "cycle the radix: hex, signed, unsigned", action="radix_next",
        title="Cycle radix", detail="hex / signed / unsigned in the memory view"),
    Key("w (memory)", "bytes as int8 or as int32 words", action="unit_toggle",
        title="Toggle int8 / int32", detail="unit of the memory view"),
    Key("up / down (memory)", "move the marked row (g marks one too)"),
    Key("W (memory)", "back to where the last write of the marked row completed (again: the "
        "write before it); the source shows the writer", action="jump_writer",
        title="Jump to last writer", detail="of the marked memory row (reverse execution)"),
    Key("U (memory)", "the same for the last read of the marked row", action="jump_reader",
        title="Jump to last reader", detail="of the marked memory row (reverse execution)"),
    Key("a", "the matrix unit: active tile heat map, the MMC's wavefront, shadow shift "
        "(+/- zoom, arrows pan)", "a", "show_array", "Array", "Systolic array",
        "the matrix unit's heat map and wavefront"),
    Key("g", "go to an address or symbol: `input`, `acc.sums + 8`, `ub[100]`, `tile[3]`", "g",
        "prompt('goto ')", "Go to", "Go to address or symbol", "in the memory views"),
    Key("l", "log in the bottom row, or back to the memories (typed commands bring it up)", "l",
        "toggle_log", "Log", "Toggle log", "show the command output in the bottom row"),
    Key("t", "whole-run timeline in the top row, or back to source and pipeline", "t",
        "toggle_timeline", "Timeline", "Toggle timeline", "the waveform of the whole run"),
    Key(":", "command line (`help` lists the commands); up/down recall history", "colon",
        "prompt('')", "Command", "Command line", "type a debugger command"),
    Key("/", "search the source; then n / N: next / previous match, escape ends the search",
        "slash", "prompt('/')", "Search", "Search the source", "find text in the source",
        show=False),
    Key("?", "search the source backwards (up from the cursor); n goes on up, N down", "question_mark",
        "prompt('?')", "Search back", "Search the source backwards", "find text above the cursor",
        show=False),
    Key("tab", "move focus between panes", "tab", "app.focus_next", "Focus", show=False),
    Key("ctrl+p", "command palette: every action"),
    Key("", action="cmd('info counters')", title="Info counters",
        detail="counters and the Table-3 breakdown in the log"),
    Key("", action="cmd('info breakpoints')", title="Info breakpoints",
        detail="list breakpoints and watchpoints"),
    Key("R", "reload: re-assemble the edited source, keep breakpoints, restart", "R",
        "cmd('reload')", "Reload", "Reload", "re-assemble the edited source and restart at cycle 0"),
    Key("", action="cmd('restart')", title="Restart",
        detail="the program as loaded, at cycle 0 (Reload re-reads an edited file)"),
    Key("", action="screenshot", title="Save screenshot (SVG)", detail="writes tpuasm-debugger.svg"),
    Key("F1 / h", "this help (`:help` lists the commands)", "f1,h", "help", "Help", "Help",
        "every key and command"),
    Key("q", "quit", "q", "quit", "Quit"),
]


def _quick(cmd, arg: str) -> bool:
    """Steps of a few cycles or instructions (forward or back) take a millisecond or two;
    everything else (continue, run, until, reverse-continue) runs in a worker."""
    if cmd.names[0] not in ("step", "next", "reverse-step", "reverse-next", "issue"):
        return False
    arg = arg.strip()
    return not arg or (arg.isdigit() and int(arg) <= QUICK_LIMIT)


class HelpScreen(ModalScreen):
    """F1 or `h`: every key and every command."""

    BINDINGS = [Binding("escape,q,f1,h", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100%; max-width: 110; height: 90%; border: thick $accent;
                                  background: $surface; padding: 0 1; }
    """

    def __init__(self, keys: list[tuple[str, str]]):
        super().__init__()
        self.keys = keys

    def plain_text(self) -> str:
        """Everything the help shows, as plain text (for tests)."""
        return "\n".join([*(f"{k}  {w}" for k, w in self.keys),
                          *(f"{c.usage}  {c.summary}" for c in COMMANDS)])

    def compose(self) -> ComposeResult:
        keys = Table(box=None, show_header=False, padding=(0, 2, 0, 1))
        keys.add_column(style="bold cyan", no_wrap=True)
        keys.add_column()
        for key, what in self.keys:
            keys.add_row(Text(key), Text(what))
        commands = Table(box=None, show_header=False, padding=(0, 2, 0, 1))
        commands.add_column(style="bold green", max_width=34, overflow="fold")
        commands.add_column()
        for c in COMMANDS:
            commands.add_row(Text(c.usage), Text(c.summary))     # Text: `[if COND]` is not markup
        with VerticalScroll():
            yield Static(Text("Keys", style="bold underline"))
            yield Static(keys)
            yield Static(Text("\nCommands (after `:`; the same language runs in --batch)",
                              style="bold underline"))
            yield Static(commands)
            yield Static(Text(
                "\nExpressions: cycle, retired, status, fault, counters and registers by name, "
                "the program's symbols (input, ub.input, acc.sums + 8), ub[r][c] and host[r] (int8; "
                "ubu, hostu: uint8), acc[r][c] (int32), tile[t], slices, lists, "
                "sum/min/max/abs/any/all/count.  E.g. `break 12 if acc[3][7] < 0`.\n"
                "Escape, q, F1 or h closes this help.", style="grey70"))


class MemoriesPane(TabbedContent):
    """The memory tabs, whose caption (border subtitle) changes as writes come and go."""

    _caption_only = False

    def set_subtitle(self, subtitle: str) -> None:
        """Change the caption, repainting only the bottom border it sits on (Textual repaints
        the whole pane when a border title changes)."""
        if self.border_subtitle == subtitle:
            return
        self._caption_only = True
        try:
            self.border_subtitle = subtitle
        finally:
            self._caption_only = False

    def refresh(self, *regions, **kwargs):
        if self._caption_only and not regions and not kwargs and self.size.height:
            # regions are relative to the content: the border line is below it
            off = self.content_offset
            height, width = self.outer_size.height, self.outer_size.width
            return super().refresh(Region(-off.x, height - 1 - off.y, width, 1))
        return super().refresh(*regions, **kwargs)


class DebuggerApp(App):
    TITLE = "tpuasm debugger"
    # Wide screens (>= 120 x 36) show every pane at once (the timeline from 48 rows on);
    # narrower ones (80 x 24 and up) keep source and pipeline on top and one of memories /
    # log below (`l` toggles, typed commands bring the log up, `goto` the memories); `t`
    # gives the timeline the top row.
    CSS = """
    Screen { layout: vertical; }
    #status { height: auto; max-height: 3; background: $primary-background; color: $text;
              padding: 0 1; }
    #top { height: 3fr; }
    #bottom { height: 2fr; }
    #source { width: 42%; border: round $primary; }
    #right { width: 58%; }
    #pipeline-box { height: 1fr; min-height: 9; border: round $primary; }
    #timeline { height: 14; border: round $primary; }
    #memories { width: 60%; border: round $primary; }
    #side { width: 40%; }
    #counters { height: 9; border: round $primary; }
    #log { height: 1fr; border: round $primary; scrollbar-gutter: stable; }
    #command { height: 3; border: round $secondary; }
    .pane-title { border-title-align: left; }
    Screen.show-timeline #source, Screen.show-timeline #pipeline-box { display: none; }
    Screen.show-timeline #right { width: 100%; }
    Screen.show-timeline #timeline { height: 1fr; }
    Screen.show-log #memories { display: none; }
    Screen.show-log #side { width: 100%; }
    Screen.show-log #counters { display: none; }
    Screen.narrow #top { height: 1fr; }
    Screen.narrow #bottom { height: 1fr; }
    Screen.narrow #source { width: 1fr; }
    Screen.narrow #right { width: 1fr; }
    Screen.narrow #pipeline-box { min-height: 3; }
    Screen.short #timeline { display: none; }
    Screen.short.show-timeline #timeline { display: block; }
    Screen.narrow #memories { width: 100%; }
    Screen.narrow #side { display: none; }
    Screen.narrow.show-log #side { display: block; }
    Screen.narrow #counters { display: none; }
    Screen.narrow #command { height: 1; border: none; background: $boost; }
    """
    NARROW = (120, 36)          # below either: the narrow layout
    TALL = 48                   # from this height on, the timeline is always shown

    BINDINGS = [Binding(k.bind, k.action, k.footer, show=k.show) for k in KEYS if k.bind]
    # What each key does, for the help screen (bindings of the panes included).
    KEY_HELP = [(k.key, k.help) for k in KEYS if k.key]

    def __init__(self, session: Session, **kwargs):
        super().__init__(**kwargs)
        self.session = session
        self.engine = Engine(session)
        self.running = False
        self.run_started = 0.0
        self.history: list[str] = []
        self.history_pos = 0
        self.tile_shown: int | None = None
        self._before_prompt = None          # the pane to refocus after a command line
        self._echo = True                   # whether the running worker's command was typed
        self._watcher = None                # the timer of `reload --watch`
        self._watched_mtime: float | None = None
        session.on_progress = self._progress_from_worker
        self._collector = IdleCollector()
        self._status_lines = 0              # the status line's height (0: not set yet)
        self._keys_only = False             # the last command came from a key, not typed
        self._shrink_timer = None           # shrinks the status line when keys pause

    # -- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        s = self.session
        # the layout classes before any pane is mounted: set afterwards, they restyle every
        # widget on the screen (70-90 ms of the first frame)
        self._layout_classes(self.size)
        yield StatusLine(id="status")
        with Horizontal(id="top"):
            yield SourceView(s, id="source", classes="pane-title")
            with Vertical(id="right"):
                yield PipelinePane(s, id="pipeline-box", classes="pane-title")
                yield TimelinePane(s, id="timeline", classes="pane-title")
        with Horizontal(id="bottom"):
            with MemoriesPane(id="memories", classes="pane-title"):
                for memory, title in MEMORY_TABS:
                    with TabPane(title, id=f"tab-{memory}"):
                        yield MemoryView(memory, self._memory_source(memory), id=f"mem-{memory}")
                with TabPane("Array", id="tab-array"):
                    yield ArrayPane(s, id="array")
            with Vertical(id="side"):
                yield CountersPane(s, id="counters", classes="pane-title")
                yield LogPane(id="log", markup=True, wrap=True, min_width=20, max_lines=2000,
                              classes="pane-title")
        yield Input(placeholder="command (help, break 12, x/16d ub[0], print acc[0][0:8], ...)",
                    id="command", select_on_focus=False)
        shown = [(k.key.split()[0], k.footer, k.action) for k in KEYS
                 if k.bind and k.show and k.footer]
        # help first: at 80 columns the bar has room for six keys
        yield KeyBar(sorted(shown, key=lambda k: k[2] != "help"), id="keys")

    def _memory_source(self, memory: str):
        # the machine is looked up on every call: a reload may bring a new one (a new shape)
        if memory == "tile":
            def tile():
                m = self.session.machine
                if m.weights is None or m.weights.shape[0] == 0:
                    return None
                t = self.tile_shown
                if t is None:
                    active = m.active()
                    t = active.tiles[0] if active is not None else 0
                return m.tile_values(min(t, m.weights.shape[0] - 1))
            return tile
        return lambda: getattr(self.session.machine, memory)

    def on_mount(self) -> None:
        titles = {"pipeline-box": "pipeline and weights",
                  "timeline": "timeline", "log": "log", "memories": "memories",
                  "counters": "counters"}
        for wid, title in titles.items():
            self.query_one(f"#{wid}").border_title = title
        self.query_one(SourceView).focus()
        self.log_line(f"loaded {escape(self.session.source_name or 'program')}: "
                      f"{len(self.session.program)} instructions, N = {self.session.machine.config.array_size}. "
                      "Press [b]F1[/] or [b]h[/] for help, [b]:[/] for commands.")
        self._apply_layout()
        self.refresh_all(follow=True)
        self._collector.start(self)     # full garbage collections only while idle
        self.call_after_refresh(blas_start.restore)     # OpenBLAS's threads, after the first paint

    def on_resize(self, event) -> None:
        self._status_lines = 0              # wrapped anew at the new width
        self._apply_layout(event.size)

    def _apply_layout(self, size=None) -> None:
        self._layout_classes(size or self.size)
        self._balance_panes((size or self.size).width)

    def _layout_classes(self, size) -> None:
        width, height = size
        self.screen.set_class(width < self.NARROW[0] or height < self.NARROW[1], "narrow")
        self.screen.set_class(height < self.TALL, "short")

    def _balance_panes(self, width: int | None = None) -> None:
        """On a wide screen the source pane takes what its instruction lines need (a
        compiled program's node column too) between 42 % and 60 % of the width, leaving
        the pipeline at least PIPELINE_MIN columns; elsewhere the stylesheet decides."""
        source, right = self.query_one(SourceView), self.query_one("#right")
        width = width or self.size.width
        if self.narrow or self.screen.has_class("show-timeline") or not width:
            source.styles.width = None
            right.styles.width = None
            return
        cols = max(int(width * 0.42), min(source.wanted_width(), int(width * 0.6),
                                          width - PIPELINE_MIN))
        if source.styles.width is None or source.styles.width.value != cols:
            source.styles.width = cols
            right.styles.width = "1fr"

    @property
    def narrow(self) -> bool:
        return self.screen.has_class("narrow")

    def _log_too_small(self) -> bool:
        """Whether the log is hidden or too small to read command output in (the narrow
        layout, or 120 x 40 where it shares a corner with the counters)."""
        if self.narrow:
            return True
        log = self.query_one("#log", LogPane)
        return not self.screen.has_class("show-log") and (log.size.height < LOG_READABLE[1]
                                                          or log.size.width < LOG_READABLE[0])

    def show_bottom(self, what: str) -> None:
        """The bottom row shows the memories or the log."""
        self.screen.set_class(what == "log", "show-log")

    def action_show_array(self) -> None:
        self.show_bottom("memories")
        self.query_one(TabbedContent).active = "tab-array"
        self.query_one(ArrayPane).focus()
        self.call_after_refresh(self._update_array)

    def action_toggle_log(self) -> None:
        self.show_bottom("memories" if self.screen.has_class("show-log") else "log")

    def action_toggle_timeline(self) -> None:
        self.screen.toggle_class("show-timeline")
        self._balance_panes()
        timeline = self.query_one(TimelinePane)
        if self.screen.has_class("show-timeline"):
            timeline.focus()                # its keys: scroll, zoom, jump
        elif self.focused is None or self.focused is timeline:
            self.query_one(SourceView).focus()
        self.call_after_refresh(timeline.update_state)

    def on_unmount(self) -> None:
        self._collector.stop()

    # -- running commands ----------------------------------------------------------------------
    def execute(self, line: str, echo: bool = True) -> None:
        """Run a command line; `echo` logs it (typed commands), keys do not, so stepping
        with keys does not flood the log: their plain "paused" results show in the status."""
        line = line.strip()
        if not line:
            return
        self._collector.activity()
        if echo:
            self.log_line(f"[bold]> {escape(line)}[/]")
        word, _, arg = line.partition(" ")
        cmd = lookup("x" if word.startswith("x/") else word)
        if self.running and (cmd is None or cmd.names[0] != "help"):
            # the worker owns the machine and the breakpoint tables until it stops
            self.log_line("[yellow]the machine is running: press p to interrupt[/]")
            return
        if cmd is not None and cmd.runs and not _quick(cmd, arg):
            self.session.cancel.clear()
            self.running = True
            self.run_started = time.perf_counter()
            for view in self.memory_views():
                view.capture()
            self._show_status(running=True)
            self._echo = echo
            self.run_worker(lambda: self._guarded(line), thread=True, group="machine",
                            exclusive=True, exit_on_error=False, name=line)
        else:
            if cmd is not None and cmd.runs:
                for view in self.memory_views():
                    view.capture()
            self.show_result(self._guarded(line), echo)

    def _guarded(self, line: str) -> Result:
        """A bug anywhere below must show up in the log, not take the app down."""
        try:
            return self.engine.execute(line)
        except Exception as e:          # noqa: BLE001 - the app must survive anything
            return Result([f"[bold red]internal error in `{escape(line)}`: "
                           f"{escape(type(e).__name__)}: {escape(str(e))}[/]"], ok=False)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "machine":
            return
        if event.state == WorkerState.SUCCESS:
            self.running = False
            self.show_result(event.worker.result, self._echo)
        elif event.state in (WorkerState.ERROR, WorkerState.CANCELLED):
            self.running = False
            self.log_line(f"[red]run ended: {escape(str(event.worker.error or 'cancelled'))}[/]")
            self.refresh_all()

    def show_result(self, result: Result, echo: bool = True) -> None:
        for event in self.session.new_events():
            if event.kind != "fault":           # a fault is reported by the stop itself
                self.log_line(f"[cyan]{escape(event_text(self.session, event))}[/]")
        # a reload's notes (a breakpoint moved or deleted) are logged even from a key
        notes = bool(result.ui and result.ui[0] == "reload" and len(result.lines) > 1)
        quiet = not echo and result.ok and result.stop is not None and \
            result.stop.kind == "paused" and not notes
        self._keys_only = not echo
        if quiet and self.session.displays:
            # `display` expressions after every stop, a key's step too
            for line in result.lines[-len(self.session.displays):]:
                self.log_line(line)
        if not quiet:
            for line in result.lines:
                self.log_line(line)
            if result.lines and result.goto is None and (echo or not result.ok or notes) \
                    and self._log_too_small():
                self.show_bottom("log")         # a typed command's output must be seen
        if result.goto is not None:
            self.go_to(result.goto)
        if result.ui and result.ui[0] in ("reload", "reload-watch"):
            self._after_reload(result.ui)
        if result.ui and result.ui[0] == "search":
            view = self.query_one(SourceView)
            view.start_search(result.ui[1], result.ui[2])
            view.focus()
        if result.ui and result.ui[0] == "mismatches":
            _, memory, cells = result.ui
            for view in self.memory_views():
                view.mark_cells(cells if view.memory == memory else ())
        if result.ui and result.ui[0] == "radix":
            view = self.current_memory_view()
            view.radix = result.ui[1]
            if len(result.ui) > 2:
                view.unit = result.ui[2]
        self.refresh_all(follow=result.stop is not None)
        if result.ui and result.ui[0] == "show-instruction":     # after the follow above
            self.query_one(SourceView).show_instruction(result.ui[1])

    def _after_reload(self, ui: tuple) -> None:
        if ui[0] == "reload":
            self.query_one(SourceView).reload()
            self._balance_panes()
            self.query_one(TimelinePane).reload()
            self.session.new_events()
        watch = ui[1]
        if watch is True and self._watcher is None:
            self._watched_mtime = self._source_mtime()
            self._watcher = self.set_interval(WATCH_INTERVAL, self._check_source)
            self.log_line("watching the source: it reloads when saved")
        elif watch is False and self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
            self.log_line("no longer watching the source")

    def _source_mtime(self) -> float | None:
        where = self.session.reload_from
        try:
            return where[0].stat().st_mtime if where else None
        except OSError:
            return None

    def _check_source(self) -> None:
        mtime = self._source_mtime()
        if mtime is not None and mtime != self._watched_mtime and not self.running:
            self._watched_mtime = mtime
            self.execute("reload")

    def log_line(self, markup: str) -> None:
        self.query_one("#log", LogPane).write(Text.from_markup(markup))

    def _progress_from_worker(self, cycle: int, elapsed: float) -> None:
        self.call_from_thread(self._show_status, True, cycle)

    # -- redraw ----------------------------------------------------------------------------------
    def refresh_all(self, follow: bool = False) -> None:
        if self.running:
            return
        updates = [partial(self.query_one(SourceView).update_state, follow=follow),
                   self.query_one(PipelinePane).update_state,
                   self.query_one(TimelinePane).update_state,
                   self.query_one(CountersPane).update_state,
                   *(view.update_data for view in self.memory_views()),
                   self._update_array,
                   self._memory_subtitle, self._show_status]
        for update in updates:
            try:
                update()
            except Exception as e:      # noqa: BLE001 - one broken pane must not end the session
                self.log_line(f"[bold red]internal error drawing {escape(str(update))}: "
                              f"{escape(type(e).__name__)}: {escape(str(e))}[/]")

    @on(TabbedContent.TabActivated)
    def _tab_shown(self) -> None:
        self._memory_subtitle()
        self.call_after_refresh(self._update_array)

    @on(MemoryView.FormatChanged)
    def _memory_subtitle(self) -> None:
        """Under the memories pane: what the shown view holds and how it is formatted."""
        view = self.current_memory_view()
        what = view.memory
        if what == "tile":
            m = self.session.machine
            active = m.active()
            t = self.tile_shown if self.tile_shown is not None else (active.tiles[0] if active else 0)
            what = f"weight tile {t}" + (" (active)" if active and t in active.tiles else "")
        pending = self.session.pending_writes(view.memory) if not self.running else []
        note = ""
        if pending:
            # the memory shows effects at completion (problem 5): say which rows are coming
            i, lo, hi, finish = pending[0]
            note = (f"#{i} writes {view.memory}[{lo}..{hi - 1}] at cycle {finish:,}"
                    + (f" (+{len(pending) - 1})" if len(pending) > 1 else "") + "  ")
        subtitle = f"{note}{what}  {view.describe()}  (x radix, w unit, g go to)"
        self.query_one("#memories", MemoriesPane).set_subtitle(subtitle)

    def _show_status(self, running: bool = False, cycle: int | None = None) -> None:
        m = self.session.machine
        text = Text()
        text.append(f" {self.session.source_name or 'program'} ", style="bold")
        if running:
            elapsed = time.perf_counter() - self.run_started
            text.append(f" RUNNING  cycle {cycle if cycle is not None else '...'}  "
                        f"{elapsed:.1f} s  (p to interrupt)", style="bold yellow")
        else:
            colour = {"halted": "green", "fault": "bold red"}.get(m.status, "white")
            text.append(f" cycle {m.cycle:,}  ", style="bold")
            text.append(f"{m.status}", style=colour)
            stop = self.session.last_stop
            if stop is not None:
                # a fault's cause in full (the status wraps to 3 lines), no toast over panes
                text.append(f"  — {stop.message}",
                            style="bold red" if stop.kind == "fault" else "grey70")
        status = self.query_one("#status", StatusLine)
        wrapped = text.wrap(self.console, max(self.size.width - 2, 10))
        lines = min(3, len(wrapped))
        if self._keys_only and lines < self._status_lines:
            # while stepping with keys it only grows: a new height relays out the whole
            # screen and moves every pane, and `next` messages wrap onto one line more or
            # less from step to step.  It shrinks back once the keys pause.
            lines = self._status_lines
            if self._shrink_timer is not None:
                self._shrink_timer.stop()
            self._shrink_timer = self.set_timer(STATUS_SHRINK_DELAY, self._shrink_status)
        if lines != self._status_lines:
            status.styles.height = lines
            self._status_lines = lines
        status.update(text, wrapped)

    def _shrink_status(self) -> None:
        """The status line back to the height its text needs (keys have paused)."""
        self._shrink_timer = None
        if self.running:
            return
        keys, self._keys_only = self._keys_only, False
        try:
            self._show_status()
        finally:
            self._keys_only = keys

    def memory_views(self) -> list:
        """The memory views (looked up once: a query per step costs a few ms)."""
        views = getattr(self, "_memory_views", None)
        if views is None:
            views = self._memory_views = list(self.query(MemoryView))
        return views

    def _update_array(self) -> None:
        if self.query_one(TabbedContent).active == "tab-array":     # drawn only when shown
            self.query_one(ArrayPane).update_state()

    def current_memory_view(self) -> MemoryView:
        tabs = self.query_one(TabbedContent)
        memory = (tabs.active or "tab-ub").removeprefix("tab-")
        if memory == "array":
            memory = "ub"
        return self.query_one(f"#mem-{memory}", MemoryView)

    def go_to(self, loc) -> None:
        """Show `loc` in its memory view, switching tabs if needed."""
        self.show_bottom("memories")
        tile = loc.memory == "tile"
        if tile:
            self.tile_shown = loc.row
        row = 0 if tile else loc.row
        tabs = self.query_one(TabbedContent)
        view = self.query_one(f"#mem-{loc.memory}", MemoryView)
        view.target_row = row
        switching = tabs.active != f"tab-{loc.memory}"
        tabs.active = f"tab-{loc.memory}"
        view.update_data()
        if switching:
            # a view that was hidden has no size yet: scroll once the layout has given it one
            view.call_after_refresh(view.go_to, row, loc.col)
        else:
            view.go_to(row, loc.col)
        view.focus()

    # -- actions ----------------------------------------------------------------------------
    def action_cmd(self, line: str) -> None:
        self.execute(line, echo=False)

    def action_prompt(self, prefix: str) -> None:
        box = self.query_one("#command", Input)
        if self.focused is not box:
            self._before_prompt = self.focused
        box.value = prefix
        box.cursor_position = len(prefix)
        box.focus()

    def action_interrupt(self) -> None:
        if self.running:
            self.session.cancel.set()
            self.log_line("[yellow]interrupting...[/]")
        elif self.focused is self.query_one("#command", Input):
            (self._before_prompt or self.query_one(SourceView)).focus()

    def action_run_to_cursor(self) -> None:
        view = self.query_one(SourceView)
        indices = view.listing.indices_of.get(view.cursor_line)
        if not indices:
            self.log_line(f"[red]no instruction on line {view.cursor_line}[/]")
            return
        self.execute(f"until *{min(indices)}")

    def action_toggle_break(self) -> None:
        view = self.query_one(SourceView)
        self.toggle_breakpoint(view.cursor_line)

    async def action_quit(self) -> None:
        self.session.cancel.set()           # a running worker stops at its next chunk
        self.exit()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.KEY_HELP))

    @on(MemoryView.JumpToAccess)
    def _jump_to_access(self, message: MemoryView.JumpToAccess) -> None:
        kind = "writer" if message.write else "reader"
        self.execute(f"jump {kind} {message.memory}[{message.row}]")

    @on(TimelinePane.Jump)
    def _jump_from_timeline(self, message: TimelinePane.Jump) -> None:
        self.execute(f"jump {message.cycle}")

    @on(SourceView.ToggleBreakpoint)
    def _toggle_from_source(self, message: SourceView.ToggleBreakpoint) -> None:
        self.toggle_breakpoint(message.line)

    def toggle_breakpoint(self, line: int) -> None:
        view = self.query_one(SourceView)
        indices = set(view.listing.indices_of.get(line, ()))
        if not indices:
            self.log_line(f"[red]no instruction on line {line}[/]")
            return
        existing = [bp for bp in self.session.breakpoints.values() if indices & set(bp.indices)]
        if existing:
            self.execute("delete " + " ".join(str(bp.number) for bp in existing))
        elif view.listing.name == "(disassembly)":
            self.execute(f"break *{min(indices)}")
        else:
            self.execute(f"break {view.listing.name}:{line}")

    @on(Input.Submitted, "#command")
    def _submitted(self, event: Input.Submitted) -> None:
        line = event.value.strip()
        event.input.value = ""
        # back to the pane the user came from, so that single keys work again
        (self._before_prompt or self.query_one(SourceView)).focus()
        if line:
            self.history.append(line)
            self.history_pos = len(self.history)
            self.execute(line)

    def on_key(self, event) -> None:
        box = self.query_one("#command", Input)
        if self.focused is not box or event.key not in ("up", "down") or not self.history:
            return
        step = -1 if event.key == "up" else 1
        self.history_pos = min(max(self.history_pos + step, 0), len(self.history))
        box.value = self.history[self.history_pos] if self.history_pos < len(self.history) else ""
        box.cursor_position = len(box.value)
        event.stop()

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for k in KEYS:
            if not k.title:
                continue
            name, _, arg = k.action.partition("(")
            if arg:
                arg = ast.literal_eval(arg[:-1])
                # a command from the palette is echoed in the log, like a typed one
                callback = partial(self.execute if name == "cmd" else getattr(self, f"action_{name}"), arg)
            else:
                callback = getattr(self, f"action_{name}")
            key = k.key.split()[0] if k.key else ""
            label = f"{k.title}  [{key}]" if key else k.title
            yield SystemCommand(label, k.detail, callback)

    def action_radix_next(self) -> None:
        self.current_memory_view().action_cycle_radix()

    def action_jump_writer(self) -> None:
        self.current_memory_view().action_jump_to_access(True)

    def action_jump_reader(self) -> None:
        self.current_memory_view().action_jump_to_access(False)

    def action_unit_toggle(self) -> None:
        self.current_memory_view().action_toggle_unit()

    def action_screenshot(self) -> None:
        path = self.save_screenshot("tpuasm-debugger.svg", path=str(Path.cwd()))
        self.log_line(f"screenshot saved to {escape(path)}")

"""The debugger's command language, shared by the screen and by `--batch`.

A small gdb: `break prog.tasm:12 if acc[3][7] < 0`, `watch ub[0:16]`, `step 10`,
`next`, `continue`, `reverse-step`, `x/16d ub[0]`, `print acc[4][0:8]`,
`info pipeline`, `expect cycle == 42`.  Every command returns a `Result`: lines of
text (rich markup allowed), whether it succeeded, and why the machine stopped if it ran.
Faces decide how to show it; nothing here knows about screens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape
from tpuasm.disassembler import format_instruction

from .expr import ExprError, Location
from .formatting import (counter_lines, event_text, examine, format_value, memory_array,
                         weights_text)
from .session import ANYWHERE, ReloadError, Session, Stop, rows_text


HISTORY_LINES = 20      # accesses `info writes/reads` lists (the latest)
X_LIMIT = 4096          # elements one x/ prints: a bigger dump belongs in a file, not a log


class CommandError(Exception):
    """A command that cannot be done; the message says why."""


@dataclass
class Result:
    lines: list[str] = field(default_factory=list)
    ok: bool = True
    stop: Stop | None = None
    goto: Location | None = None        # the UI scrolls a memory view here
    ui: tuple | None = None             # a request only a screen can honour (radix, ...)

    def text(self) -> str:
        from rich.text import Text
        return "\n".join(Text.from_markup(line).plain for line in self.lines)


@dataclass(frozen=True)
class Command:
    names: tuple[str, ...]
    usage: str
    summary: str
    method: str
    runs: bool = False                  # moves the machine (the UI runs it in a worker)


COMMANDS = [
    Command(("step", "s"), "step [N]", "advance N clock cycles (default 1; a step passes breakpoints)",
            "do_step", True),
    Command(("next", "n", "stepi", "si"), "next [N]", "issue the next instruction and run until it "
            "has finished its stage (N times; earlier ones may retire meanwhile)", "do_next", True),
    Command(("issue",), "issue", "run until the next instruction has issued (however long the "
            "front end waits for it)", "do_issue", True),
    Command(("finish", "fin"), "finish", "run until every instruction issued so far has finished",
            "do_finish", True),
    Command(("continue", "c", "cont"), "continue", "run until a breakpoint, watchpoint, caught "
            "event, halt or fault", "do_continue", True),
    Command(("run",), "run N", "run N cycles (stops early at breakpoints)", "do_run", True),
    Command(("until", "u", "advance"), "until N | until LOCATION", "run to cycle N (`until 5000`, "
            "`until cycle 5000`), or until a line (`until line 26`, `until :26`, `until prog.tasm:26`), "
            "label, *index or `node NAME` is about to issue (run to cursor; refused if it already "
            "issued)", "do_until", True),
    Command(("reverse-step", "rs"), "reverse-step [N]", "go back N cycles", "do_reverse_step", True),
    Command(("reverse-next", "reverse-stepi", "rn"), "reverse-next [N]", "go back N instructions",
            "do_reverse_next", True),
    Command(("reverse-continue", "rc"), "reverse-continue", "go back to the previous breakpoint or "
            "watchpoint hit", "do_reverse_continue", True),
    Command(("restart",), "restart", "start again at cycle 0 (the program as loaded; `reload` "
            "re-reads an edited file)", "do_restart", True),
    Command(("reload",), "reload [--watch|--nowatch]", "re-assemble the edited file and restart, "
            "keeping breakpoints and watchpoints; --watch reloads whenever the file changes",
            "do_reload"),
    Command(("break", "b"), "break LOCATION [if COND]", "stop before the instruction(s) of a line "
            "(`12`, `prog.tasm:12`), a label, `*INDEX` or `node NAME` (its first instruction) "
            "issue; `cycle N`: at that cycle; `break if COND` alone: wherever COND holds",
            "do_break"),
    Command(("tbreak",), "tbreak LOCATION [if COND]", "a breakpoint that deletes itself when hit",
            "do_tbreak"),
    Command(("condition",), "condition N [COND]", "set or clear breakpoint N's condition",
            "do_condition"),
    Command(("ignore",), "ignore N COUNT", "let breakpoint N pass COUNT times", "do_ignore"),
    Command(("watch",), "watch [-w] RANGE | watch COND", "stop when a write changes rows: "
            "`ub[0:16]`, `acc[4]`, `input`; -w: after any write, even of the same values; "
            "`watch acc[3][7] < 0`: when a write changes whether COND holds", "do_watch"),
    Command(("rwatch",), "rwatch RANGE", "stop after an instruction that reads the rows finishes",
            "do_rwatch"),
    Command(("awatch",), "awatch RANGE", "stop after an instruction that reads or writes them "
            "finishes", "do_awatch"),
    Command(("catch",), "catch fault|interrupt|tag|unwritten", "stop before Interrupt_Host / "
            "Debug_Tag / an instruction reading rows nothing wrote since load (faults always stop)",
            "do_catch"),
    Command(("uncatch",), "uncatch interrupt|tag|unwritten", "stop catching an event", "do_uncatch"),
    Command(("delete", "d"), "delete [N...]", "delete breakpoints/watchpoints (all without N)",
            "do_delete"),
    Command(("disable",), "disable N...", "disable breakpoints/watchpoints", "do_disable"),
    Command(("enable",), "enable N...", "enable breakpoints/watchpoints", "do_enable"),
    Command(("print", "p"), "print EXPR", "evaluate: `acc[4][0:8]`, `cycle`, `act_shift`",
            "do_print"),
    Command(("x",), "x/NFU ADDR", "examine memory: N count, F x|d|u, U b (byte) or w (int32): "
            "`x/16d ub[0]`, `x/8x acc.sums`", "do_x"),
    Command(("expect",), "expect EXPR", "fail (batch exit 1) unless EXPR holds", "do_expect"),
    Command(("compare",), "compare RANGE FILE.npy", "compare memory from RANGE with an expected "
            "array (its shape says how much): differences listed and marked in the memory view",
            "do_compare"),
    Command(("dump",), "dump RANGE FILE.npy", "save the rows of RANGE (`ub.y`, `acc[0:16]`, "
            "`tile[3]`) as .npy: ub/host int8, acc int32", "do_dump"),
    Command(("display",), "display [EXPR]", "print EXPR after every stop (no EXPR: list them)",
            "do_display"),
    Command(("undisplay",), "undisplay [N...]", "stop displaying (all without N)", "do_undisplay"),
    Command(("info", "i"), "info pipeline|counters|breakpoints|registers|weights|events|symbols",
            "show machine state; `info writes ub[8]`, `info reads acc.sums`: who wrote / read "
            "those rows so far", "do_info"),
    Command(("jump",), "jump CYCLE | jump writer|reader ADDR", "put the machine at a cycle, "
            "back (reverse execution) or forward (breakpoints do not stop it); `jump writer ub[8]`: "
            "back to where the last write of the row before now completed (reader: the last read)",
            "do_jump", True),
    Command(("list", "l"), "list [LINE]", "source lines around the next instruction", "do_list"),
    Command(("goto", "g"), "goto ADDR", "show an address or symbol in the memory view", "do_goto"),
    Command(("radix",), "radix hex|signed|unsigned [int8|int32]", "number format of the focused "
            "memory view", "do_radix"),
    Command(("search", "/"), "search TEXT (/TEXT)", "find TEXT in the source (case-insensitive); "
            "on the screen the cursor goes there and n / N find the next / previous until Escape",
            "do_search"),
    Command(("reverse-search", "rsearch"), "reverse-search TEXT (?TEXT)", "the same backwards: "
            "on the screen from the cursor up (n goes on up, N down); in batch the lines last "
            "first", "do_reverse_search"),
    Command(("segment",), "segment [NAME]", "a compiled model (`tpuasm debug OUTDIR`): list its "
            "segments, or open segment NAME with its data at cycle 0", "do_segment"),
    Command(("echo",), "echo TEXT", "print TEXT", "do_echo"),
    Command(("help", "h", "?"), "help [COMMAND]", "list commands", "do_help"),
]
_BY_NAME = {name: c for c in COMMANDS for name in c.names}


def lookup(word: str) -> Command | None:
    return _BY_NAME.get(word.lower())


class Engine:
    """Parses and executes command lines against one Session."""

    def __init__(self, session: Session):
        self.session = session

    def execute(self, line: str) -> Result:
        line = line.strip()
        if not line or line.startswith("#"):
            return Result()
        if line.startswith("/") and len(line) > 1:         # `/text`: search, as in less and vi
            line = "search " + line[1:]
        elif line.startswith("?") and len(line) > 1 and not line[1].isspace():
            line = "reverse-search " + line[1:]             # `?text`: backwards (`?` alone: help)
        word, _, rest = line.partition(" ")
        fmt = ""
        if word.startswith("x/"):
            word, fmt = "x", word[2:]
        cmd = lookup(word)
        if cmd is None:
            return Result([f"[red]unknown command {escape(word)!r}[/] (try `help`)"], ok=False)
        try:
            if cmd.method == "do_x":
                return self.do_x(fmt, rest.strip())
            return getattr(self, cmd.method)(rest.strip())
        except (CommandError, ExprError) as e:
            return Result([f"[red]{escape(str(e))}[/]"], ok=False)

    # -- helpers ----------------------------------------------------------------------------
    def _count(self, arg: str, default: int = 1) -> int:
        if not arg:
            return default
        n = self.session.eval.integer(arg)
        if n < 1:
            raise CommandError(f"count must be at least 1, got {n}")
        return n

    def display_lines(self) -> list[str]:
        """`display` expressions, evaluated now (after a stop)."""
        out = []
        for number, text in self.session.displays.items():
            try:
                value = format_value(self.session.eval.value(text))
            except ExprError as e:
                value = f"<{e}>"
            out.append(escape(f"{number}: {text} = {value}"))
        return out

    def _stopped(self, stop: Stop) -> Result:
        style = {"fault": "bold red", "error": "red", "breakpoint": "yellow",
                 "watchpoint": "yellow", "tag": "cyan", "interrupt": "cyan", "unwritten": "yellow",
                 "halted": "green"}.get(stop.kind, "")
        lines = [f"[{style}]{escape(m)}[/]" if style else escape(m)
                 for m in stop.message.splitlines()]
        return Result(lines + self.display_lines(), ok=stop.kind != "error", stop=stop)

    def _numbers(self, arg: str) -> list[int]:
        try:
            return [int(x) for x in arg.split()]
        except ValueError:
            raise CommandError(f"expected breakpoint numbers, got {arg!r}") from None

    def resolve_location(self, text: str) -> tuple[list[int], str]:
        """`12`, `prog.tasm:12`, `*7`, `loop` -> (instruction indices, description)."""
        s = self.session
        text = text.strip()
        if not text:
            nxt = s.next_to_issue()
            if nxt is None:
                raise CommandError("no instruction to break at")
            return [nxt], s.where(nxt)
        if text.startswith("node ") or text == "node":
            name = text[5:].strip()
            runs = s.program.node_runs(name) if name else []
            if not runs and name and s.outdir is not None:
                elsewhere = _segment_with_node(s.outdir, name)
                if elsewhere:
                    raise CommandError(f"node {name} is in {elsewhere}: `segment {elsewhere}` "
                                       "opens it (a `node` breakpoint set there stays across "
                                       "segments)")
            if not runs:
                known = s.program.nodes()
                hint = (f"; nodes: {', '.join(known[:8])}" + (" ..." if len(known) > 8 else "")
                        if known else "; the program names no nodes (.node)")
                raise CommandError(f"no graph node {name!r}{hint}")
            return [r.start for r in runs], f"node {name}"
        if text.startswith("*"):
            i = s.eval.integer(text[1:])
            if not 0 <= i < len(s.program):
                raise CommandError(f"instruction {i} out of range 0..{len(s.program) - 1}")
            return [i], f"*{i}"
        m = re.fullmatch(r"(?:(.+):)?(\d+)", text)
        if m:
            file, line = m.group(1), int(m.group(2))
            indices = s.indices_for_line(file, line)
            if not indices:
                name = file or s.main_file() or "the program"
                raise CommandError(f"no instruction on line {line} of {name}")
            return indices, f"{file or s.main_file()}:{line}"
        entry = s.symbols.get(text)
        if entry is not None and entry[0] == "label":
            return [entry[1]], text
        raise CommandError(f"no line, label or *index {text!r}")

    # -- running ----------------------------------------------------------------------------
    def do_step(self, arg):
        return self._stopped(self.session.step_cycles(self._count(arg)))

    def do_next(self, arg):
        return self._stopped(self.session.step_instructions(self._count(arg)))

    def do_continue(self, arg):
        if arg:
            raise CommandError("continue takes no argument (use `ignore` to skip hits)")
        result = self._stopped(self.session.run())
        if result.stop.kind == "halted" and self.session.outdir is not None:
            result = self._next_segments(result)
        return result

    def _waiting_nodes(self) -> list[str]:
        """Graph nodes of enabled `node` breakpoints that wait (their node is in no
        instruction of the segment open now)."""
        return [bp.where[5:] for bp in self.session.breakpoints.values()
                if bp.enabled and bp.where.startswith("node ") and not bp.indices]

    def _next_segments(self, result: Result) -> Result:
        """`continue` at the end of a segment while a `node` breakpoint waits for a later
        one: on through the host parts (shown with their tensors) to the next segment,
        opened with its data, and on running there; segment after segment until a stop
        that is not the end of one, or no waiting node lies ahead."""
        from tpuasm.compiler.outdir import segment_files
        from tpuasm.errors import TpuasmError
        from .model_steps import ModelStepsError, host_part_lines, manifest_steps, segment_names_node
        s = self.session
        try:
            steps = manifest_steps(s.outdir)
        except ModelStepsError as e:
            result.lines.append(f"[red]{escape(str(e))}[/]")
            return result
        lines, opened = list(result.lines), False
        while result.stop.kind == "halted" and not s.cancel.is_set():
            waiting = self._waiting_nodes()
            here = next((i for i, st in enumerate(steps) if st.get("name") == s.segment), None)
            if not waiting or here is None:
                break
            ahead = steps[here + 1:]
            if not any(segment_names_node(s.outdir, st, n) for st in ahead for n in waiting):
                break
            nxt = next(i for i, st in enumerate(ahead) if st.get("kind") == "tpu" and st.get("program"))
            for part in ahead[:nxt]:
                if part.get("kind") == "host":
                    lines.append(escape(f"host part {part.get('name', '?')}:"))
                    lines += [escape(f"  {x}") for x in host_part_lines(part, s.host_parts.get(part.get("name")))]
            try:
                stop, notes = s.open_segment(segment_files(s.outdir, ahead[nxt]["name"]))
            except (TpuasmError, ReloadError) as e:
                lines.append(f"[red]{escape(str(e))}[/]")
                break
            opened = True
            lines += [escape(stop.message)] + [f"[yellow]{escape(n)}[/]" for n in notes
                                               if "waits" not in n]
            result = self._stopped(s.run())
            lines += result.lines
        result.lines = lines
        if opened:
            result.ui = ("reload", None)        # the screen shows the new segment's source
        return result

    def do_run(self, arg):
        if not arg:
            raise CommandError("run N: how many cycles?")
        return self._stopped(self.session.run(max_cycles=self._count(arg)))

    def do_issue(self, arg):
        if arg:
            raise CommandError("issue takes no argument")
        return self._stopped(self.session.step_issue())

    def do_finish(self, arg):
        if arg:
            raise CommandError("finish takes no argument")
        return self._stopped(self.session.finish_in_flight())

    def do_until(self, arg):
        """`until N` runs to cycle N (issue 23: a cycle, as `break cycle N` stops at one);
        `until line N`, `until :N` or `until FILE:N` to a line, and labels, `*I`, `node X`
        as `break` takes them."""
        text = arg.strip()
        line = re.fullmatch(r"(?:line\s+|:)\s*(\d+)", text, re.I)
        if line:
            text = line.group(1)
        elif re.fullmatch(r"\d[\d_]*", text):
            return self._until_cycle(text)
        cycle = self._cycle_location(text)
        if cycle is not None:
            return self._stopped(self.session.run_to((), f"cycle {cycle}", cycle=cycle))
        indices, where = self.resolve_location(text)
        cycle = self.session.issued_already(indices)
        if cycle is not None:
            raise CommandError(f"{where} already issued (cycle {cycle}); a program runs straight "
                               "through, so it is not reached again: nothing to run to")
        return self._stopped(self.session.run_to(indices, where))

    def _until_cycle(self, number: str) -> Result:
        """`until N`: to cycle N.  Before scripts of the first debugger (where `until N`
        meant line N) run on silently to a cycle, a number that is also a line with
        instructions gets a note, and one that is not ahead says what to type instead."""
        s = self.session
        file = s.main_file()
        is_line = bool(file and s.indices_for_line(None, int(number.replace("_", ""))))
        hint = f" (line {number}: `until line {number}`)" if is_line else ""
        try:
            cycle = self._cycle_location(f"cycle {number}")
        except CommandError as e:
            raise CommandError(f"until {number}: {e}{hint}") from None
        result = self._stopped(s.run_to((), f"cycle {cycle}", cycle=cycle))
        if is_line:
            result.lines.append(f"[yellow]`until {number}` ran to cycle {cycle:,}; "
                                f"`until line {number}` runs to line {number}[/]")
        return result

    def do_reverse_step(self, arg):
        return self._stopped(self.session.reverse_cycles(self._count(arg)))

    def do_reverse_next(self, arg):
        return self._stopped(self.session.reverse_instructions(self._count(arg)))

    def do_reverse_continue(self, arg):
        return self._stopped(self.session.reverse_continue())

    def do_reload(self, arg):
        watch = {"": None, "--watch": True, "--nowatch": False}.get(arg.strip(), "bad")
        if watch == "bad":
            raise CommandError("usage: reload [--watch|--nowatch]")
        try:
            stop, notes = self.session.reload()
        except ReloadError as e:
            lines = str(e).splitlines()
            # the status line says so too (not the stop before the reload)
            first = next((x for x in lines if x.strip()), "")
            self.session.last_stop = Stop("error", f"reload failed, the program runs as it was: "
                                                   f"{first}", cycle=self.session.machine.cycle)
            return Result(["[bold red]reload failed; the session goes on with the program "
                           "as it was:[/]", *(escape(x) for x in lines)], ok=False,
                          ui=("reload-watch", watch) if watch is not None else None)
        result = self._stopped(stop)
        result.lines += [f"[yellow]{escape(n)}[/]" for n in notes]
        result.ui = ("reload", watch)
        return result

    def do_restart(self, arg):
        return self._stopped(self.session.restart())

    # -- breakpoints --------------------------------------------------------------------------
    def _cycle_location(self, text: str) -> int | None:
        """`cycle N` -> N (a cycle still ahead), else None (not a cycle location)."""
        word, _, rest = text.strip().partition(" ")
        if word.lower() != "cycle":
            return None
        if not rest.strip():
            raise CommandError("cycle N: which cycle?")
        cycle = self.session.eval.integer(rest)
        now = self.session.machine.cycle
        from tpuasm.limits import MAX_CYCLES
        if not 0 <= cycle <= MAX_CYCLES:
            raise CommandError(f"cycle {cycle} out of range 0..{MAX_CYCLES}")
        if cycle <= now:
            raise CommandError(f"cycle {cycle} is not ahead (now cycle {now}); "
                               f"`jump {cycle}` goes there")
        return cycle

    def _break(self, arg, temporary):
        where, _, cond = arg.partition(" if ")
        if arg.startswith("if "):
            where, cond = "", arg[3:]
        cond = cond.strip()
        kind = "temporary breakpoint" if temporary else "breakpoint"
        extra = f" if {cond}" if cond else ""
        cycle = self._cycle_location(where)
        if cycle is None and not where.strip() and cond:
            # `break if COND`: wherever the condition holds.  `cycle >= N` (or > N, == N)
            # alone is a cycle breakpoint, exact to the cycle; anything else is checked
            # before every instruction issues.
            m = re.fullmatch(r"cycle\s*(>=|==|>)\s*(\d{1,18})", cond)
            if m and int(m.group(2)) + (m.group(1) == ">") > self.session.machine.cycle:
                cycle = int(m.group(2)) + (m.group(1) == ">")
            else:
                bp = self.session.add_breakpoint((), ANYWHERE, cond, temporary)
                return Result([f"{kind} {bp.number} before any instruction issues{escape(extra)}"])
        if cycle is not None:
            bp = self.session.add_breakpoint((), f"cycle {cycle}", cond or None, temporary,
                                             cycle=cycle)
            return Result([f"{kind} {bp.number} at cycle {cycle}{escape(extra)}"])
        waiting = self._node_elsewhere(where)
        if waiting is not None:
            name, segment = waiting
            bp = self.session.add_breakpoint((), f"node {name}", cond or None, temporary)
            return Result([f"{kind} {bp.number} at node {escape(name)}{escape(extra)} waits: the "
                           f"node is in {segment} (`continue` at the end of this segment goes "
                           f"on there; `segment {segment}` opens it now)"])
        indices, desc = self.resolve_location(where)
        bp = self.session.add_breakpoint(indices, desc, cond or None, temporary)
        return Result([f"{kind} {bp.number} at {escape(desc)} "
                       f"(instruction {', '.join(f'#{i}' for i in bp.indices)}){escape(extra)}"])

    def _node_elsewhere(self, where: str) -> tuple[str, str] | None:
        """`node NAME` of a compiled model whose node is not in the segment open now but in
        another one: (NAME, that segment); else None."""
        where = where.strip()
        s = self.session
        if s.outdir is None or not where.startswith("node "):
            return None
        name = where[5:].strip()
        if not name or s.program.node_runs(name):
            return None
        segment = _segment_with_node(s.outdir, name)
        return (name, segment) if segment else None

    def do_break(self, arg):
        return self._break(arg, False)

    def do_tbreak(self, arg):
        return self._break(arg, True)

    def _bp(self, number_text: str):
        bp = self.session.breakpoints.get(self._numbers(number_text)[0] if number_text else -1)
        if bp is None:
            raise CommandError(f"no breakpoint {number_text}")
        return bp

    def do_condition(self, arg):
        num, _, cond = arg.partition(" ")
        bp = self._bp(num)
        if cond.strip():
            self.session.eval.check(cond)
            bp.condition = cond.strip()
            return Result([f"breakpoint {bp.number} stops only if {escape(bp.condition)}"])
        bp.condition = None
        return Result([f"breakpoint {bp.number} is now unconditional"])

    def do_ignore(self, arg):
        parts = arg.split()
        if len(parts) != 2:
            raise CommandError("usage: ignore N COUNT")
        bp = self._bp(parts[0])
        count = self.session.eval.integer(parts[1])
        if count < 0:
            raise CommandError(f"ignore: COUNT must be 0 or more, got {count}")
        bp.ignore = count
        return Result([f"will ignore the next {bp.ignore} crossings of breakpoint {bp.number}"])

    def _watch(self, arg: str, access: str, name: str):
        if not arg:
            raise CommandError(f"{name} what? e.g. `{name} ub[0:16]`")
        if access == "change" and _is_condition(arg):
            wp = self.session.add_condition_watch(arg)
            spans = ", ".join(f"{m}[{a}:{b}]" for m, a, b in wp.spans)
            return Result([f"watchpoint {wp.number}: {escape(arg)} (now "
                           f"{'true' if wp.truth else 'false'}; stops when a write to "
                           f"{escape(spans)} changes that)"])
        loc = self.session.eval.location(arg)
        wp = self.session.add_watchpoint(loc, arg, access)
        what = {"change": "a change", "write": "any write", "read": "any read",
                "access": "any read or write"}[access]
        return Result([f"watchpoint {wp.number}: {escape(arg)} = {wp.memory} rows "
                       f"{wp.start}..{wp.stop - 1} (stops after {what})"])

    def do_watch(self, arg):
        if arg.startswith("-w ") or arg == "-w":
            return self._watch(arg[2:].strip(), "write", "watch -w")
        return self._watch(arg, "change", "watch")

    def do_rwatch(self, arg):
        return self._watch(arg, "read", "rwatch")

    def do_awatch(self, arg):
        return self._watch(arg, "access", "awatch")

    def do_catch(self, arg):
        kind = arg.strip().lower()
        if kind not in ("fault", "interrupt", "tag", "unwritten"):
            raise CommandError("catch fault, catch interrupt, catch tag or catch unwritten")
        self.session.catch.add(kind)
        if kind == "fault":
            return Result(["faults always stop the machine"])
        if kind == "unwritten":
            n = len(self.session.unwritten_reads())
            return Result([f"will stop before each instruction that reads rows nothing wrote since "
                           f"load ({n} in this program)"])
        return Result([f"will stop before each {'Interrupt_Host' if kind == 'interrupt' else 'Debug_Tag'}"])

    def do_uncatch(self, arg):
        kind = arg.strip().lower()
        if kind not in ("interrupt", "tag", "unwritten"):
            raise CommandError("uncatch interrupt, tag or unwritten (faults always stop)")
        self.session.catch.discard(kind)
        return Result([f"no longer catching {kind}"])

    def do_delete(self, arg):
        s = self.session
        if not arg:
            n = len(s.breakpoints) + len(s.watchpoints)
            s.breakpoints.clear()
            s.watchpoints.clear()
            return Result([f"deleted {n} breakpoint(s) and watchpoint(s)"])
        for n in self._numbers(arg):
            try:
                s.delete(n)
            except KeyError:
                raise CommandError(f"no breakpoint or watchpoint {n}") from None
        return Result([f"deleted {arg}"])

    def _enable(self, arg, value):
        s = self.session
        for n in self._numbers(arg) or list(s.breakpoints) + list(s.watchpoints):
            item = s.breakpoints.get(n) or s.watchpoints.get(n)
            if item is None:
                raise CommandError(f"no breakpoint or watchpoint {n}")
            item.enabled = value
        return Result([("enabled " if value else "disabled ") + (arg or "all")])

    def do_disable(self, arg):
        return self._enable(arg, False)

    def do_enable(self, arg):
        return self._enable(arg, True)

    # -- inspecting ---------------------------------------------------------------------------
    def do_print(self, arg):
        if not arg:
            raise CommandError("print what?")
        return Result([escape(f"{arg} = {format_value(self.session.eval.value(arg))}")])

    def do_expect(self, arg):
        if not arg:
            raise CommandError("expect what?")
        if self.session.eval.truth(arg):
            return Result([f"[green]ok[/] {escape(arg)}"])
        detail = self._explain(arg)
        return Result([f"[bold red]expect failed:[/] {escape(arg)}{escape(detail)}"], ok=False)

    def _range_and_file(self, arg: str, usage: str) -> tuple[Location, Path]:
        expr, _, file = arg.strip().rpartition(" ")
        if not expr.strip() or not file.endswith(".npy"):
            raise CommandError(f"usage: {usage}, e.g. `{usage.split()[0]} ub.y expected.npy`")
        return self.session.eval.location(expr.strip(), default_memory="ub"), Path(file)

    def do_compare(self, arg):
        from .data_files import compare, comparison_lines
        loc, path = self._range_and_file(arg, "compare RANGE FILE.npy")
        c = compare(self.session, loc, path)
        ok = not len(c.mismatches)
        lines = [escape(x) for x in comparison_lines(c)]
        if not ok:
            lines[0] = f"[bold red]{lines[0]}[/]"
            r, col = (int(x) for x in c.mismatches[0])
            goto = Location(loc.memory, r if loc.memory != "tile" else loc.row, col)
        else:
            lines[0] = f"[green]{lines[0]}[/]"
            goto = None
        cells = [(int(r), int(col)) for r, col in c.mismatches]
        return Result(lines, ok=ok, goto=goto, ui=("mismatches", loc.memory, cells))

    def do_dump(self, arg):
        from .data_files import dump
        loc, path = self._range_and_file(arg, "dump RANGE FILE.npy")
        shape = dump(self.session, loc, path, self.session.inputs())
        what = (f"tile {loc.row}" if loc.memory == "tile" else
                f"{loc.memory} rows {loc.row}..{loc.row + shape[0] - 1}")
        return Result([escape(f"saved {what} ({shape[0]} x {shape[1]}) to {path}")])

    def do_display(self, arg):
        s = self.session
        if not arg:
            return Result(self.display_lines() or ["no display expressions"])
        s.eval.check(arg)
        s.eval.value(arg)                   # fails now if it cannot be evaluated
        number = max(s.displays, default=0) + 1
        s.displays[number] = arg.strip()
        return Result(self.display_lines()[-1:])

    def do_undisplay(self, arg):
        s = self.session
        if not arg:
            n = len(s.displays)
            s.displays.clear()
            return Result([f"deleted {n} display expression(s)"])
        for n in self._numbers(arg):
            if s.displays.pop(n, None) is None:
                raise CommandError(f"no display {n}")
        return Result([f"undisplay {arg}"])

    def _explain(self, arg: str) -> str:
        """For `a == b`, the value of each side, like pytest's assertion rewriting."""
        m = re.fullmatch(r"(.+?)\s*(==|!=|<=|>=|<|>)\s*(.+)", arg)
        if not m:
            return ""
        try:
            left = format_value(self.session.eval.value(m.group(1)))
            right = format_value(self.session.eval.value(m.group(3)))
        except ExprError:
            return ""
        return f"  ({m.group(1).strip()} is {left}; {m.group(3).strip()} is {right})"

    def do_x(self, fmt: str, arg: str):
        m = re.fullmatch(r"(\d*)([xdu]?)([bw]?)", fmt)
        if not m:
            raise CommandError(f"x/{fmt}: expected x/NFU with F one of x d u and U one of b w")
        count = int(m.group(1) or 16)
        if not 1 <= count <= X_LIMIT:
            raise CommandError(f"x/{fmt}: count must be 1..{X_LIMIT}, got {count}")
        radix = {"x": "hex", "d": "signed", "u": "unsigned", "": "signed"}[m.group(2)]
        if not arg:
            raise CommandError("x/NFU ADDR: which address?")
        loc = self.session.eval.location(arg)
        if loc.memory == "tile":                 # x/8d tile[3]: that weight tile, as int8
            tile = self.session.eval.value(f"tile[{loc.row}]")
            loc = Location(f"tile[{loc.row}]", 0, loc.col)
            array = tile.view("u1")
        else:
            array = memory_array(self.session.machine, loc.memory)
        unit = m.group(3) or ("w" if loc.memory == "acc" else "b")
        return Result(examine(array, loc, count, radix, unit))

    def _access_location(self, arg: str, usage: str) -> Location:
        """The rows `info writes|reads` and `jump writer|reader` ask about."""
        if not arg:
            raise CommandError(f"{usage}, e.g. `ub[8]`, `acc.sums + 2`")
        loc = self.session.eval.location(arg)
        if loc.memory not in ("ub", "acc", "host"):
            raise CommandError("access history covers ub, acc and host rows")
        self.session._check_range(loc)
        return loc

    def _history(self, arg: str, write: bool) -> Result:
        """`info writes ub[8]` / `info reads acc.sums`: who wrote (read) those rows, up to now."""
        s = self.session
        loc = self._access_location(arg, f"info {'writes' if write else 'reads'} ADDR")
        events = s.accesses.history(loc.memory, loc.row, loc.row + loc.rows, write=write)
        rows = rows_text(loc)
        verb = "written" if write else "read"
        if not events:
            return Result([escape(f"{rows}: not {verb} by any instruction issued so far "
                                  f"(cycle {s.machine.cycle})")])
        out = [f"{rows}: {verb} by {len(events)} instruction(s) so far, latest last "
               f"(`jump CYCLE` goes there):"]
        shown = events[-HISTORY_LINES:]
        if len(events) > len(shown):
            out.append(f"  ... {len(events) - len(shown)} earlier")
        for a in shown:
            when = (f"finished cycle {a.finish}" if a.finish >= 0 else "in flight")
            out.append(f"  {s.where(a.index)}  {a.memory} rows {a.start}..{a.stop - 1}  "
                       f"issued cycle {a.issue}, {when}")
        return Result([escape(x) for x in out])

    def do_jump(self, arg):
        if not arg:
            raise CommandError("jump CYCLE: which cycle?")
        word, _, rest = arg.strip().partition(" ")
        if word.lower() in ("writer", "reader"):
            return self._jump_to_access(rest.strip(), word.lower() == "writer")
        cycle = self.session.eval.integer(arg)
        if cycle < 0:
            raise CommandError(f"jump: cycle must be 0 or more, got {cycle}")
        return self._stopped(self.session.goto_cycle(cycle))

    def _jump_to_access(self, arg: str, write: bool) -> Result:
        """`jump writer ub[8]`: back to the last write of the row before now; the memory
        view shows the row and the source its writer (a screen's `W` / `U` keys)."""
        s = self.session
        loc = self._access_location(arg, f"jump {'writer' if write else 'reader'} ADDR")
        found = s.jump_to_access(loc, write)
        if found is None:
            verb = "written" if write else "read"
            raise CommandError(f"{arg}: not {verb} by any instruction that finished before cycle "
                               f"{s.machine.cycle}")
        stop, index = found
        result = self._stopped(stop)
        result.goto = loc
        result.ui = ("show-instruction", index)
        return result

    def do_info(self, arg):
        what, _, rest = arg.strip().partition(" ")
        what = what.lower()
        if what in ("writes", "reads"):
            return self._history(rest.strip(), what == "writes")
        table = {"pipeline": self.info_pipeline, "p": self.info_pipeline,
                 "counters": self.info_counters, "c": self.info_counters,
                 "breakpoints": self.info_breakpoints, "b": self.info_breakpoints,
                 "watchpoints": self.info_breakpoints,
                 "registers": self.info_registers, "r": self.info_registers,
                 "weights": self.info_weights, "w": self.info_weights,
                 "events": self.info_events, "e": self.info_events,
                 "symbols": self.info_symbols, "s": self.info_symbols}
        if what not in table:
            raise CommandError("info pipeline|counters|breakpoints|registers|weights|events|symbols|"
                               "writes ADDR|reads ADDR")
        return Result([escape(line) for line in table[what]()])

    def info_pipeline(self) -> list[str]:
        m = self.session.machine
        out = [f"cycle {m.cycle}  status {m.status}"]
        for st in self.session.pipeline():
            if st.index is None and not st.text:
                body = "idle"
            else:
                loc = f" ({st.location})" if st.location else ""
                body = (f"#{st.index} {self.session.symbolic(st.index) or st.text}{loc}"
                        if st.index is not None else st.text)
                if st.total:
                    body += f"  {st.progress}/{st.total} {st.unit}"
                body += f"  {st.cycles_in_stage} cycles in stage"
            if st.stall:
                body += f"  STALL: {st.stall}"
            out.append(f"{st.name:<9}{body}")
        return out

    def info_counters(self) -> list[str]:
        return counter_lines(self.session.machine.counters())

    def info_breakpoints(self) -> list[str]:
        s = self.session
        items = sorted([b for b in s.breakpoints.values() if b.number] + list(s.watchpoints.values()),
                       key=lambda b: b.number)
        out = [b.describe() for b in items] or ["no breakpoints or watchpoints"]
        caught = sorted(s.catch - {"fault"})
        if caught:
            out.append("catching: " + ", ".join(caught))
        return out

    def info_registers(self) -> list[str]:
        return [f"{k:<16}{v}" for k, v in self.session.machine.registers().items()]

    def info_weights(self) -> list[str]:
        return [line.rstrip() for line in weights_text(self.session.machine).plain.strip("\n").splitlines()]

    def info_events(self) -> list[str]:
        events = self.session.machine.events
        return [event_text(self.session, e) for e in events] or ["no events"]

    def info_symbols(self) -> list[str]:
        s = self.session
        out = [f"{sym.kind:<6}{sym.name:<24}{sym.value:>8}" + (f"  ({sym.size} rows)" if sym.size else "")
               for sym in s.program.symbols]
        return out or ["no symbols (a stripped binary?)"]

    def do_list(self, arg):
        s = self.session
        file = s.main_file()
        center = None
        if arg:
            indices, _ = self.resolve_location(arg)
            loc = s.program.locations[indices[0]]
            center = loc.line if loc else None
            file = loc.file if loc else file
        else:
            nxt = s.next_to_issue()
            loc = s.program.locations[nxt] if nxt is not None else None
            if loc is not None:
                file, center = loc.file, loc.line
        text = s.program.sources.get(file) if file else None
        if text is None:
            lines = [format_instruction(ins) for ins in s.program.instructions]
            center = (s.next_to_issue() or 0) + 1 if center is None else center
            file = "(disassembly)"
        else:
            lines = text.splitlines()
            center = center or 1
        lo, hi = max(1, center - 5), min(len(lines), center + 5)
        return Result([escape(f"{'=>' if n == center else '  '}{n:>5}  {lines[n - 1]}")
                       for n in range(lo, hi + 1)] or [f"{file}: empty"])

    def do_goto(self, arg):
        if not arg:
            raise CommandError("goto ADDR: e.g. `goto input`, `goto acc.sums + 8`, `goto ub[100]`")
        loc = self.session.eval.location(arg, default_memory="ub")
        limit = self.session._rows(loc.memory) if loc.memory != "tile" else self.session.machine.weights.shape[0]
        if not 0 <= loc.row < max(limit, 1):
            raise CommandError(f"{loc.memory} row {loc.row} outside 0..{limit - 1}")
        return Result([f"{loc.memory}[{loc.row}]"], goto=loc)

    def do_radix(self, arg):
        parts = arg.lower().split()
        radixes, units = ("hex", "signed", "unsigned"), ("int8", "int32")
        if not parts or parts[0] not in radixes or (len(parts) > 1 and parts[1] not in units):
            raise CommandError("radix hex|signed|unsigned [int8|int32]")
        return Result([f"radix {' '.join(parts)}"], ui=("radix", *parts))

    def do_reverse_search(self, arg):
        return self.do_search(arg, direction=-1)

    def do_search(self, arg, direction: int = 1):
        if not arg:
            raise CommandError(f"{'search' if direction > 0 else 'reverse-search'} TEXT: what?")
        s = self.session
        file = s.main_file()
        text = s.program.sources.get(file) if file else None
        if text is None:
            file = "(disassembly)"
            lines = [format_instruction(ins) for ins in s.program.instructions]
        else:
            lines = text.splitlines()
        hits = [(n, line) for n, line in enumerate(lines, 1) if arg.lower() in line.lower()]
        if not hits:
            raise CommandError(f"{arg!r} not found in {file}")
        hits = hits[::direction]
        out = [escape(f"{file}:{n}: {line.strip()}") for n, line in hits[:10]]
        if len(hits) > 10:
            out.append(f"... {len(hits) - 10} more")
        return Result(out, ui=("search", arg, direction))

    def do_segment(self, arg):
        from tpuasm.errors import TpuasmError
        s = self.session
        if s.outdir is None and not arg:
            return Result(["one program, not a compiled model (`tpuasm debug OUTDIR` opens one)"])
        if s.outdir is None:
            raise CommandError("not a compiled model: open one with `tpuasm debug OUTDIR`")
        if not arg:
            from .model_steps import ModelStepsError, host_part_lines, manifest_steps
            try:
                steps = manifest_steps(s.outdir)
            except ModelStepsError as e:
                raise CommandError(str(e)) from None
            out = []
            for step in steps:
                mark = "=>" if step.get("name") == s.segment else "  "
                if step.get("kind") == "tpu":
                    what = step.get("program") or "(no program)"
                else:
                    what = (f"host part: {', '.join(step.get('inputs', []))} -> "
                            f"{', '.join(step.get('outputs', []))}")
                out.append(escape(f"{mark} {step.get('name', '?'):<10} {what}"))
                if step.get("kind") == "host":
                    out += [escape(f"{'':<14}{x}")
                            for x in host_part_lines(step, s.host_parts.get(step.get("name")))]
            if not s.host_parts:
                out.append("(the host parts' values: `tpuasm debug OUTDIR --input X.npy`)")
            return Result(out)
        from tpuasm.compiler.outdir import segment_files
        try:
            files = segment_files(s.outdir, arg.strip())
            stop, notes = s.open_segment(files)
        except (TpuasmError, ReloadError) as e:
            raise CommandError(str(e)) from None
        result = self._stopped(stop)
        result.lines += [f"[yellow]{escape(n)}[/]" for n in notes]
        result.ui = ("reload", None)
        return result

    def do_echo(self, arg):
        return Result([escape(arg)])

    def do_help(self, arg):
        if arg:
            cmd = lookup(arg.split()[0])
            if cmd is None:
                raise CommandError(f"no command {arg!r}")
            return Result([escape(f"{cmd.usage}: {cmd.summary}"),
                           escape(f"  aliases: {', '.join(cmd.names)}")])
        return Result([escape(f"{c.usage:<34}{c.summary}") for c in COMMANDS])


def _segment_with_node(outdir, name: str) -> str | None:
    """The segment of a compiled model whose program names graph node `name` (`.node`)."""
    from tpuasm.errors import TpuasmError
    from tpuasm.files import read_text
    from tpuasm.limits import MAX_SOURCE_BYTES
    for path in sorted(outdir.glob("segment*.tasm")):
        try:     # the bounded reader: a FIFO or /dev/zero in OUTDIR is skipped, not read
            text = read_text(path, what="segment program", limit=MAX_SOURCE_BYTES)
        except TpuasmError:
            continue
        if re.search(rf"^\s*\.node\s+\"?{re.escape(name)}\"?\s*(;|$)", text, re.M):
            return path.stem
    return None


def _is_condition(text: str) -> bool:
    """`acc[3][7] < 0`, `sum(ub[0]) == 0`: not a plain range (a comparison or a call)."""
    import ast
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return False
    return isinstance(body, (ast.Compare, ast.BoolOp, ast.Call)) or \
        (isinstance(body, ast.UnaryOp) and isinstance(body.op, ast.Not))


def split_script(text: str) -> list[tuple[int, str]]:
    """(line number, command) for every non-blank, non-comment line of a batch script."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.strip().startswith("#")]


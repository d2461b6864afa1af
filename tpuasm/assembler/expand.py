"""Pass 2: expansion.  `.include`, `.macro` calls and `.rept` blocks become one
flat list of instruction statements, each with the Frame it was expanded in;
`.equ`, regions and `.config` are handed to the symbol table as they are met.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .. import limits
from ..binary import CONFIG_KEYS
from ..errors import AssemblyError
from ..isa import ISA_TABLE
from .ast import Binary, Directive, Instr, Label, Name, Named, Node, Num, Param, Span, Str
from .parser import parse
from .reporter import Reporter, did_you_mean
from .symbols import MEMORIES, EvalError, Frame, Symbols, frame_notes

DIRECTIVES = ("include", "equ", "ub", "acc", "host", "tile", "config", "rept", "endr", "macro", "endm",
              "node")
OPENERS = {"rept": "endr", "macro": "endm"}
MAX_REPT = 1_000_000
# Expansion budget: every statement expanded and every .rept iteration costs one, and a
# .rept whose whole expansion would overrun what is left is refused before it starts (so
# `.rept 1000` three deep fails at once instead of after gigabytes).
MAX_STATEMENTS = limits.MAX_STATEMENTS
MAX_MACRO_DEPTH = 64


@dataclass
class Macro:
    name: str
    params: list[str]
    body: list
    span: Span


@dataclass
class ConfigEntry:
    key: str
    value: Node
    frame: Frame | None
    span: Span


class Expander:
    def __init__(self, reporter: Reporter, symbols: Symbols):
        self.reporter = reporter
        self.symbols = symbols
        self.sources: dict[str, str] = {}
        self.items: list[tuple[Instr, Frame | None]] = []
        self.config: list[ConfigEntry] = []
        self.macros: dict[str, Macro] = {}
        # `.node NAME`: (index of the next instruction, the graph node it starts, or None)
        self.node_marks: list[tuple[int, str | None]] = []
        self.budget = MAX_STATEMENTS
        self.stopped = False
        # For tools (tpuasm.assembler.analysis, the language server): each file's parsed
        # statements, every `.include` met (its string node and the path it names), and
        # a hook that reads an included file (an editor's unsaved buffer instead of the disk).
        self.statements: dict[str, list] = {}
        self.includes: list[tuple[Str, str]] = []
        self.read_file = None

    # ----------------------------------------------------------- files
    def run_text(self, text: str, filename: str, chain: tuple[str, ...] = (),
                 frame: Frame | None = None) -> None:
        if text.startswith("\ufeff"):      # a byte-order mark is not source
            text = text[1:]
        self.sources[filename] = text
        statements, diags = parse(text, filename)
        self.statements.setdefault(filename, statements)
        for d in diags:
            self.reporter.add(d)
        key = _file_key(filename)
        self.expand(statements, frame, chain + (key,), depth=0)

    def include(self, d: Directive, frame, chain) -> None:
        if len(d.args) != 1 or not isinstance(d.args[0], Str):
            self._error(d.span, '.include takes one quoted file name: .include "file.tasm"', frame)
            return
        arg = d.args[0]
        base = os.path.dirname(d.span.file) if not d.span.file.startswith("<") else ""
        path = os.path.normpath(os.path.join(base, arg.value)) if arg.value else ""
        key = _file_key(path)
        self.includes.append((arg, path))
        if key in chain:
            names = [_display(c) for c in chain[chain.index(key):]] + [path]
            self._error(arg.span, "include cycle: " + " -> ".join(names), frame)
            return
        from . import decode_source, read_source
        try:
            if self.read_file is not None:          # an editor's unsaved buffers
                text = self.read_file(path)
            else:
                text = decode_source(read_source(path, arg.span), path)
        except AssemblyError as e:        # not a regular file, too large, not UTF-8, ...
            self._error(arg.span, e.diagnostics[0].message, frame)
            return
        except (OSError, UnicodeDecodeError, ValueError) as e:   # from read_file
            why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            if isinstance(e, UnicodeDecodeError):
                why = "not valid UTF-8"
            self._error(arg.span, f"cannot read '{path}': {why}", frame)
            return
        note = f"included from {d.span.file}:{d.span.line}"
        self.run_text(text, path, chain, Frame(frame, None, None, note))

    # ----------------------------------------------------------- statements
    def expand(self, statements: list, frame: Frame | None, chain, depth: int) -> None:
        i = 0
        n = len(statements)
        items = self.items
        while i < n:
            if self.stopped:
                return
            st = statements[i]
            i += 1
            self.budget -= 1
            if self.budget < 0:
                self._stop(st.span)
                return
            if type(st) is Instr:
                macro = self.macros.get(st.name.upper()) if self.macros else None
                if macro is not None:
                    self.call_macro(macro, st, frame, chain, depth)
                else:
                    items.append((st, frame))
                continue
            if type(st) is Label:
                self.symbols.define_label(st, len(items), frame)
                continue
            name = st.name
            if name in OPENERS:
                end = self._block_end(statements, i - 1)
                if end is None:
                    # report, then read on as if the opener were not there: the
                    # lines after it may hold more mistakes worth reporting
                    self._error(st.span, f"unterminated .{name} (no matching .{OPENERS[name]})", frame)
                    continue
                body = statements[i:end]
                i = end + 1
                if name == "rept":
                    self.rept(st, body, frame, chain, depth)
                else:
                    self.define_macro(st, body, frame)
            elif name in ("endr", "endm"):
                opener = "rept" if name == "endr" else "macro"
                self._error(st.span, f".{name} without a matching .{opener}", frame)
            else:
                self.directive(st, frame, chain)

    def _block_end(self, statements, start) -> int | None:
        """Index of the .endr/.endm closing statements[start] (blocks nest)."""
        stack = []
        for j in range(start, len(statements)):
            st = statements[j]
            if type(st) is Directive:
                if st.name in OPENERS:
                    stack.append(OPENERS[st.name])
                elif st.name in ("endr", "endm"):
                    if stack and stack[-1] == st.name:
                        stack.pop()
                        if not stack:
                            return j
                    elif st.name not in stack:
                        continue                    # stray closer: reported when expanded
                    else:
                        while stack and stack[-1] != st.name:   # mismatched nesting
                            stack.pop()
                        stack.pop()
                        if not stack:
                            return j
        return None

    def directive(self, d: Directive, frame, chain) -> None:
        name = d.name
        if d.headed and name in DIRECTIVES:      # `.equ X 3`: only .macro has a bare head name
            self._error(d.args[1].span, f"missing ',' after '{d.args[0].text}'", frame)
            return
        if name == "equ":
            if len(d.args) != 2 or not isinstance(d.args[0], Name) or "." in d.args[0].text:
                self._error(d.span, ".equ takes a name and a value: .equ NAME, expression", frame)
                return
            self.symbols.define_const(d.args[0], d.args[1], frame)
        elif name in MEMORIES:
            args = d.args
            if not 2 <= len(args) <= 3 or not isinstance(args[0], Name) or "." in args[0].text \
                    or any(isinstance(a, (Str, Named)) for a in args):
                self._error(d.span, f".{name} takes a name, a row count and an optional base: "
                            f".{name} NAME, rows[, base]", frame)
                return
            self.symbols.define_region(name, args[0], args[1], args[2] if len(args) == 3 else None, frame)
        elif name == "config":
            self.config_directive(d, frame)
        elif name == "include":
            self.include(d, frame, chain)
        elif name == "node":
            self.node_directive(d, frame)
        else:
            self._error(d.span, f"unknown directive '.{name}'"
                        + did_you_mean(name, DIRECTIVES).replace("'", "'.", 1), frame)

    def config_directive(self, d: Directive, frame) -> None:
        if self.items:
            first = self.items[0][0].span
            self._error(d.span, ".config must come before the first instruction", frame,
                        [f"the first instruction is at {first.file}:{first.line}:{first.col}"])
            return
        if not d.args:
            self._error(d.span, ".config takes key=value settings, e.g. .config array_size=16", frame)
        for a in d.args:
            if not isinstance(a, Named):
                self._error(a.span, f"expected key=value ({', '.join(CONFIG_KEYS)})", frame)
                continue
            self.config.append(ConfigEntry(a.name, a.value, frame, a.name_span))

    def node_directive(self, d: Directive, frame) -> None:
        """`.node "name"` (or a plain name): the following instructions compute that node of
        the source graph (an ONNX node, for compiled models); `.node` alone ends it."""
        args = [_macro_argument(a, frame) for a in d.args]
        if len(args) > 1 or (args and not isinstance(args[0], (Str, Name))):
            self._error(d.span, '.node takes one graph node name: .node "conv1" (or .node alone '
                        'to end the current node)', frame)
            return
        name = (args[0].value if isinstance(args[0], Str) else args[0].text) if args else None
        if name == "":
            self._error(args[0].span, ".node: the node name is empty", frame)
            return
        self.node_marks.append((len(self.items), name))

    def rept(self, d: Directive, body, frame, chain, depth) -> None:
        args = d.args
        if d.headed:
            self._error(d.args[1].span, f"missing ',' after '{d.args[0].text}'", frame)
            return
        if not 1 <= len(args) <= 2 or (len(args) == 2 and not (isinstance(args[1], Name) and "." not in args[1].text)) \
                or isinstance(args[0], (Str, Named)):
            self._error(d.span, ".rept takes a count and an optional variable: .rept N[, var]", frame)
            return
        try:
            count = self.symbols.eval(args[0], frame)
        except EvalError as e:
            if not e.reported:
                notes = list(e.notes) + ["a .rept count must be known when the block expands: "
                                         "define its symbols above it"] + frame_notes(frame)
                self.reporter.error(e.span, e.message, notes)
            return
        if not 0 <= count <= MAX_REPT:
            self._error(args[0].span, f".rept count {count} out of range 0..{MAX_REPT}", frame)
            return
        var = args[1].text if len(args) == 2 else None
        need = count * self._static_size(body, frame, var)
        if need > self.budget:
            self._error(args[0].span, f".rept would expand to about {need:,} statements, more "
                        f"than the {MAX_STATEMENTS:,} an assembly may produce (counting nested "
                        ".rept blocks)", frame)
            self.stopped = True
            return
        where = f"{d.span.file}:{d.span.line}"
        for k in range(count):
            self.budget -= 1                 # an iteration costs one even with an empty body
            if self.stopped or self.budget < 0:
                if not self.stopped:
                    self._stop(d.span)
                return
            note = f"in .rept iteration {var}={k} ({where})" if var else f"in .rept iteration {k} ({where})"
            self.expand(body, Frame(frame, {var: k} if var else None, None, note), chain, depth)

    def _static_size(self, body, frame, var) -> int:
        """A lower bound of the statements one expansion of `body` produces: 1 per
        statement, nested .rept blocks multiplied by their counts when those are known
        before expansion (a macro call counts 1: it is charged as it expands)."""
        size, i, n = 1, 0, len(body)
        while i < n:
            st = body[i]
            i += 1
            size += 1
            if type(st) is Directive and st.name in OPENERS:
                end = self._block_end(body, i - 1)
                if end is None:
                    continue
                if st.name == "rept" and st.args and not st.headed:
                    count = self._known_count(st.args[0], frame, var)
                    size += count * self._static_size(body[i:end], frame, var)
                i = end + 1
        return size

    def _known_count(self, node, frame, var) -> int:
        """A nested .rept count already known (literals, constants already evaluated,
        outer variables other than this .rept's own), else 1.  No side effects: nothing
        is evaluated early that expansion would evaluate later."""
        count = self._peek(node, frame, var, 8)
        return count if count is not None and 0 <= count <= MAX_REPT else 1

    def _peek(self, node, frame, var, depth):
        if depth < 0:
            return None
        if type(node) is Num:
            return node.value
        if type(node) is Name and node.text != var:
            f = frame
            while f is not None:
                if node.text in f.vars:
                    return f.vars[node.text]
                f = f.parent
            const = self.symbols.consts.get(node.text)
            return const.value if const is not None and const.state == "done" else None
        if type(node) is Binary and node.op in ("+", "*"):
            a = self._peek(node.left, frame, var, depth - 1)
            b = self._peek(node.right, frame, var, depth - 1)
            if a is None or b is None or a.bit_length() + b.bit_length() > 64:
                return None
            return a + b if node.op == "+" else a * b
        return None

    def define_macro(self, d: Directive, body, frame) -> None:
        args = d.args
        names = []
        for a in args:
            if isinstance(a, (Name, Param)) and "." not in a.text:
                names.append(a.text)
            else:
                self._error(a.span, "a macro name and its parameters must be plain names", frame)
                return
        if not names:
            self._error(d.span, ".macro needs a name: .macro NAME p1, p2", frame)
            return
        name, params = names[0], names[1:]
        key = name.upper()
        if ISA_TABLE.lookup(name) is not None:
            self._error(args[0].span, f"macro '{name}' has the name of an instruction", frame)
            return
        if key in self.macros:
            old = self.macros[key].span
            self._error(args[0].span, f"duplicate macro '{name}'", frame,
                        [f"first defined at {old.file}:{old.line}:{old.col}"])
            return
        dup = {p for p in params if params.count(p) > 1}
        if dup:
            self._error(args[0].span, f"macro '{name}' names parameter '{sorted(dup)[0]}' twice", frame)
            return
        self.macros[key] = Macro(name, params, body, args[0].span)

    def call_macro(self, macro: Macro, st: Instr, frame, chain, depth) -> None:
        if "." in st.name:
            self._error(st.span, f"macro '{macro.name}' takes no flags", frame)
            return
        named = [a for a in st.args if isinstance(a, (Named, Str))]
        if named:
            self._error(named[0].span, f"macro '{macro.name}' takes positional arguments only", frame)
            return
        if len(st.args) != len(macro.params):
            expected = ", ".join(macro.params) or "no arguments"
            self._error(st.span, f"macro '{macro.name}' takes {len(macro.params)} argument"
                        f"{'s' if len(macro.params) != 1 else ''} ({expected}), got {len(st.args)}", frame)
            return
        if depth >= MAX_MACRO_DEPTH:
            self._error(st.span, f"macros nested deeper than {MAX_MACRO_DEPTH} (a macro that calls itself?)",
                        frame)
            self.stopped = True
            return
        params = {p: (a, frame) for p, a in zip(macro.params, st.args)}
        note = f"in macro '{macro.name}' called at {st.span.file}:{st.span.line}:{st.span.col}"
        self.expand(macro.body, Frame(frame, None, params, note), chain, depth + 1)

    # ----------------------------------------------------------- helpers
    def _error(self, span: Span, message: str, frame, notes=()) -> None:
        self.reporter.error(span, message, list(notes) + frame_notes(frame))

    def _stop(self, span: Span) -> None:
        self.reporter.error(span, f"expansion produces more than {MAX_STATEMENTS:,} statements "
                            "(a .rept count or a recursive macro out of hand?)")
        self.stopped = True


def _macro_argument(node: Node, frame: Frame | None) -> Node:
    """What a macro parameter `\\p` stands for at the call site (a name passes through
    macros by name); any other node as it is."""
    f = frame
    while isinstance(node, Param) and f is not None:
        if f.params is not None and node.text in f.params:
            node, f = f.params[node.text]
        else:
            f = f.parent
    return node


def _file_key(name: str) -> str:
    return name if name.startswith("<") else os.path.abspath(name)


def _display(key: str) -> str:
    if key.startswith("<"):
        return key
    try:
        return os.path.relpath(key)
    except ValueError:
        return key

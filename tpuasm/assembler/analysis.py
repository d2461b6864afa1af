"""The assembler's view of a source for tools: every diagnostic, and where each symbol
is defined and used.

`analyze(text, filename)` runs the very passes `assemble` runs (no second parser) and
keeps what they learnt: the parsed statements of each file, the symbol table, the macros
and the `.include`s.  From those it lists every *occurrence* of a symbol - a definition
(`.equ`, a region directive, a label, `.macro`) or a use (a name in an expression, a
macro call, an `.include` path) - with its exact span.  The language server answers go to
definition, references, rename, hover and the outline from this; `tpuasm lint`'s findings
ride along as warnings.  It never raises: a bug becomes a diagnostic, as in `assemble`.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass, replace

from ..binary import MachineShape, Program
from ..diagnostics import Diagnostic
from ..errors import AssemblyError
from .ast import Binary, Directive, Instr, Label, Name, Named, Param, Span, Str, Unary
from .expand import Macro
from .reporter import KEEP, Reporter
from .symbols import MEMORIES

__all__ = ["Analysis", "Occurrence", "SymbolInfo", "analyze"]

# Symbol kinds; a symbol's key is "kind:name" (macros: the upper-cased name, as calls
# are case-insensitive; files: the absolute path).
KINDS = ("equ", "label", *MEMORIES, "macro", "file")


@dataclass(frozen=True)
class Occurrence:
    key: str                 # the symbol, e.g. "equ:BATCH", "ub:input", "macro:LAYER"
    span: Span               # the name itself (for `ub.input`, just `input`)
    definition: bool


@dataclass
class SymbolInfo:
    key: str
    kind: str
    name: str
    span: Span | None        # the defining name; None for a file
    value: int | None = None         # .equ value, region base, label index
    size: int | None = None          # region rows
    expression: str | None = None    # .equ right-hand side, as written
    params: tuple[str, ...] = ()     # macro parameters

    @property
    def qualified(self) -> str:
        return f"{self.kind}.{self.name}" if self.kind in MEMORIES else self.name


class Analysis:
    """One run's diagnostics and program; the symbol index (symbols, occurrences,
    includes, statements) is built on first use, so a check that only wants the
    diagnostics does not pay for it."""

    def __init__(self, filename: str, program: Program | None, diagnostics: list[Diagnostic],
                 sources: dict[str, str], shape: MachineShape | None = None, passes=None,
                 items=None):
        self.filename = filename
        self.program = program
        self.diagnostics = diagnostics
        self.sources = sources
        self.shape = shape
        self._passes = passes            # (expander, symbols) of the run, for the index
        # the expanded instructions (statement, frame) of a run with errors: an instruction
        # index is its position among them, as labels count (no program to ask)
        self._items = items if program is None else None
        self._indexed = False
        self._statements: dict[str, list] = {}
        self._symbols: dict[str, SymbolInfo] = {}
        self._occurrences: list[Occurrence] = []
        self._includes: list[tuple[Span, str]] = []
        self._by_line: dict = {}

    def _index(self) -> None:
        if self._indexed:
            return
        self._indexed = True
        if self._passes is not None:
            try:
                _index(self, *self._passes)
            except RecursionError:
                pass                     # an expression too deep to walk: no index
            self._passes = None

    @property
    def statements(self) -> dict[str, list]:
        """Each file's parsed statements."""
        self._index()
        return self._statements

    @property
    def symbols(self) -> dict[str, SymbolInfo]:
        self._index()
        return self._symbols

    @property
    def occurrences(self) -> list[Occurrence]:
        self._index()
        return self._occurrences

    @property
    def includes(self) -> list[tuple[Span, str]]:
        """(span of the string, path) of every `.include` met."""
        self._index()
        return self._includes

    def at(self, file: str, line: int, col: int) -> Occurrence | None:
        """The occurrence under 1-based (line, col) of `file` (col may be one past its end,
        where an editor's cursor sits after typing a name)."""
        self._index()
        best = None
        for occ in self._by_line.get((file, line), ()):
            if occ.span.col <= col <= occ.span.end_col:
                best = occ
                if col < occ.span.end_col:
                    break
        return best

    def references(self, key: str) -> list[Occurrence]:
        return [o for o in self.occurrences if o.key == key]

    def definition(self, key: str) -> Occurrence | None:
        return next((o for o in self.occurrences if o.key == key and o.definition), None)

    def instruction_lines(self) -> dict[tuple[str, int], list[int]]:
        """(file, line) -> indices of the instructions assembled from that line.

        In a run with errors, the lines that assembled: every expanded instruction whose
        line has no error, at its position among the expanded instructions (the index it
        has once the errors are fixed, unless a fix adds or removes instructions before
        it; a line the parser could not read is no instruction yet)."""
        out: dict[tuple[str, int], list[int]] = {}
        if self.program is not None:
            for i, loc in enumerate(self.program.locations):
                if loc is not None:
                    out.setdefault((loc.file, loc.line), []).append(i)
        elif self._items:
            failed = {(d.file, d.line) for d in self.diagnostics if d.severity == "error"}
            if len(self.diagnostics) >= KEEP:
                return out           # some errors were only counted: their lines unknown
            for i, (st, _frame) in enumerate(self._items):
                where = (st.span.file, st.span.line)
                if where not in failed:
                    out.setdefault(where, []).append(i)
        return out


def analyze(text: str, filename: str = "<input>", *, config: dict | None = None,
            read_file=None, lint: bool = True) -> Analysis:
    """Assemble `text` as `filename` and index its symbols.  `read_file(path) -> str`
    reads an included file (default: the disk); it may raise OSError or
    UnicodeDecodeError, reported as `assemble` reports them."""
    from . import _run                       # the package's passes, shared with assemble
    reporter = Reporter()
    sources: dict[str, str] = {}
    state: dict = {"read_file": read_file}
    program = None
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        program = _run(text, filename, config or {}, reporter, sources, state)
    except AssemblyError as e:
        reporter.diagnostics.extend(e.diagnostics)
    except RecursionError:
        reporter.diagnostics.append(Diagnostic("input nested too deeply to assemble", filename, 1, 1))
    except Exception as e:          # a bug must not take an editor's server down
        reporter.diagnostics.append(Diagnostic(
            f"internal error in the assembler: {type(e).__name__}: {e} (please report this)",
            filename, 1, 1))
    finally:
        if gc_was_on:
            gc.enable()
    if reporter.diagnostics:
        program = None
    expander = state.get("expander")
    symbols = state.get("symbols")
    passes = (expander, symbols) if expander is not None and symbols is not None else None
    result = Analysis(filename, program, list(reporter.diagnostics), sources, state.get("shape"), passes,
                      items=expander.items if expander is not None else None)
    if lint and program is not None:
        from ..lint import lint as lint_findings
        items = expander.items if expander is not None else []
        for finding in lint_findings(program):
            d = finding.diagnostic()
            if d is None:
                continue
            if len(items) == len(program) and items[finding.run.first][1] is not None:
                # in a macro or an included file: say where it was expanded from
                d = replace(d, notes=d.notes + tuple(items[finding.run.first][1].notes()))
            result.diagnostics.append(d)
    return result


# ------------------------------------------------------------------ the index
def _index(result: Analysis, expander, symbols) -> None:
    result._statements = expander.statements
    macros: dict[str, Macro] = expander.macros
    table = result._symbols
    lines: dict[str, list[str]] = {}
    for c in symbols.consts.values():
        table[f"equ:{c.name}"] = SymbolInfo(f"equ:{c.name}", "equ", c.name, c.span,
                                            value=c.value if c.state == "done" else None,
                                            expression=_text(lines, result.sources, c.expr.span))
    for name, (span, index) in symbols.labels.items():
        table[f"label:{name}"] = SymbolInfo(f"label:{name}", "label", name, span, value=index)
    for kind in MEMORIES:
        for r in symbols.regions[kind].values():
            table[f"{kind}:{r.name}"] = SymbolInfo(f"{kind}:{r.name}", kind, r.name, r.span,
                                                   value=r.base, size=r.size)
    for key, m in macros.items():
        table[f"macro:{key}"] = SymbolInfo(f"macro:{key}", "macro", m.name, m.span,
                                           params=tuple(m.params))
    for node, path in expander.includes:
        key = f"file:{os.path.abspath(path)}"
        table.setdefault(key, SymbolInfo(key, "file", path, None))
        result._includes.append((node.span, path))
        result._occurrences.append(Occurrence(key, node.span, False))
    walker = _Walker(result, symbols, macros)
    for statements in expander.statements.values():
        walker.walk(statements)
    by_line: dict = {}
    for occ in result._occurrences:
        by_line.setdefault((occ.span.file, occ.span.line), []).append(occ)
    for occs in by_line.values():
        occs.sort(key=lambda o: o.span.col)
    result._by_line = by_line


class _Walker:
    """Names in the statements of one file, resolved as symbols.lookup resolves them
    (a .rept variable first, then .equ, then a region, prefixed or not)."""

    def __init__(self, result: Analysis, symbols, macros):
        self.out = result._occurrences
        self.symbols = symbols
        self.macros = macros
        self.scopes: list[str | None] = []       # open .rept variables (None: a .macro)

    def walk(self, statements: list) -> None:
        self.scopes = []
        for st in statements:
            if type(st) is Label:
                self.add(f"label:{st.name}", st.span, True)
            elif type(st) is Instr:
                if st.name.upper() in self.macros:
                    self.add(f"macro:{st.name.upper()}", st.span, False)
                self.exprs(st.args)
            elif type(st) is Directive:
                self.directive(st)

    def directive(self, d: Directive) -> None:
        name, args = d.name, d.args
        head = args[0] if args and type(args[0]) is Name else None
        if name == "equ" and head is not None:
            self.add(f"equ:{head.text}", head.span, True)
            self.exprs(args[1:])
        elif name in MEMORIES and head is not None:
            self.add(f"{name}:{head.text}", head.span, True)
            self.exprs(args[1:])
        elif name == "macro":
            if head is not None:
                self.add(f"macro:{head.text.upper()}", head.span, True)
            self.scopes.append(None)
        elif name == "rept":
            self.exprs(args[:1])
            var = args[1].text if len(args) == 2 and type(args[1]) is Name else None
            self.scopes.append(var)
        elif name in ("endr", "endm"):
            if self.scopes:
                self.scopes.pop()
        elif name != "include":
            self.exprs(args)

    def exprs(self, nodes) -> None:
        stack = list(nodes)
        while stack:
            node = stack.pop()
            t = type(node)
            if t is Name:
                self.name(node)
            elif t is Binary:
                stack += (node.left, node.right)
            elif t is Unary:
                stack.append(node.operand)
            elif t is Named:
                stack.append(node.value)

    def name(self, node: Name) -> None:
        text = node.text
        if text in self.scopes:
            return                                 # a .rept variable
        if text in self.symbols.consts:
            self.add(f"equ:{text}", node.span, False)
            return
        kind, dot, rest = text.partition(".")
        if dot:
            kind = kind.lower()
            if kind in MEMORIES and rest in self.symbols.regions[kind]:
                sp = node.span
                self.add(f"{kind}:{rest}", Span(sp.file, sp.line, sp.col + len(kind) + 1,
                                                sp.end_line, sp.end_col), False)
            return
        owners = [k for k in MEMORIES if text in self.symbols.regions[k]]
        if len(owners) == 1:
            self.add(f"{owners[0]}:{text}", node.span, False)

    def add(self, key: str, span: Span, definition: bool) -> None:
        self.out.append(Occurrence(key, span, definition))


def _text(lines: dict[str, list[str]], sources: dict[str, str], span: Span) -> str | None:
    """The source text a (one-line) span covers; `lines` caches each file's lines."""
    if span.file not in lines:
        text = sources.get(span.file)
        lines[span.file] = text.split("\n") if text is not None else []
    rows = lines[span.file]
    if span.end_line != span.line or not 1 <= span.line <= len(rows):
        return None
    return rows[span.line - 1][span.col - 1:span.end_col - 1]


"""Answers about a position or a whole file: hover, definition, references, rename,
outline, formatting and per-instruction inlay hints."""
from __future__ import annotations

import re

from lsprotocol import types as T
from pygls.exceptions import JsonRpcInvalidParams

from ..assembler.ast import Directive, Name, Span, Str
from ..assembler.expand import _file_key as _key
from ..assembler.symbols import MEMORIES
from ..fmt import format_source
from ..isa import ISA_TABLE
from ..tokens import Token, line_tokens
from . import hover as texts
from .diagnostics import uri_of
from .documents import LINE_LIMIT, Checked

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# ------------------------------------------------------------------ the cursor
def tokens_of(checked: Checked, line: int) -> list[Token]:
    lines = checked.text_lines()
    if not 1 <= line <= len(lines) or len(lines[line - 1]) > LINE_LIMIT:
        return []
    return line_tokens(lines[line - 1], strict=False)


def head_index(tokens: list[Token]) -> int:
    """Index of the statement's first token (after a `label:`)."""
    if len(tokens) >= 2 and tokens[0].kind == "name" and tokens[1].text == ":":
        return 2
    return 0


def token_at(tokens: list[Token], col: int) -> tuple[int, Token] | None:
    """The token under 1-based `col` (or just before it, where a cursor ends a word)."""
    found = None
    for i, t in enumerate(tokens):
        if t.start < col <= t.start + len(t.text) + 1 and t.kind != "punct":
            found = (i, t)
            if col <= t.start + len(t.text):
                break
    return found


# ------------------------------------------------------------------ hover
def hover(checked: Checked | None, position: T.Position) -> T.Hover | None:
    if checked is None:
        return None
    line, col = checked.where(position)
    a = checked.analysis
    occ = occurrence_at(checked, line, col)
    text, span = None, None
    if occ is not None and occ.key in a.symbols:
        text, span = texts.symbol(a.symbols[occ.key], a), occ.span
    else:
        tokens = tokens_of(checked, line)
        hit = token_at(tokens, col)
        if hit is None:
            return None
        i, tok = hit
        span = Span(checked.path, line, tok.start + 1, line, tok.start + len(tok.text) + 1)
        if tok.kind == "directive":
            text = texts.directive(tok.text[1:])
        elif tok.kind == "int":
            text = texts.number(tok.text)
        elif tok.kind == "name" and i == head_index(tokens):
            base, _, letters = tok.text.partition(".")
            spec = ISA_TABLE.lookup(base)
            text = texts.instruction(spec, letters) if spec is not None else None
        elif tok.kind == "name":
            text = texts.register(tok.text)
        elif tok.kind == "param":
            text = f"`{tok.text}`: a macro parameter (or .rept variable), replaced by its argument"
    if not text:
        return None
    return T.Hover(contents=T.MarkupContent(kind=T.MarkupKind.Markdown, value=text),
                   range=checked.lines.span(span))


# ------------------------------------------------------------------ navigation
def _occurrence(checked: Checked | None, position: T.Position):
    if checked is None:
        return None
    return occurrence_at(checked, *checked.where(position))


def occurrence_at(checked: Checked, line: int, col: int, view: Checked | None = None):
    """The symbol occurrence under the cursor; on `ub.` of `ub.input`, that of `input`.
    `view`: look it up in another file's check that includes this one."""
    view = view or checked
    a, file = view.analysis, view.name_of(checked.path) if view is not checked else checked.path
    if file is None:
        return None
    occ = a.at(file, line, col)
    if occ is None:
        hit = token_at(tokens_of(checked, line), col)
        if hit is not None and hit[1].kind == "name":
            occ = a.at(file, line, hit[1].start + len(hit[1].text))
    return occ


def _location(checked: Checked, span: Span) -> T.Location:
    return T.Location(uri=uri_of(span.file), range=checked.lines.span(span))


def definition(checked: Checked | None, position: T.Position):
    occ = _occurrence(checked, position)
    if occ is None:
        return None
    if occ.key.startswith("file:"):
        path = occ.key[5:]
        start = T.Position(line=0, character=0)
        return T.Location(uri=uri_of(path), range=T.Range(start=start, end=start))
    info = checked.analysis.symbols.get(occ.key)
    if info is None or info.span is None:
        return None
    return _location(checked, info.span)


def references(checked: Checked | None, position: T.Position, include_declaration: bool,
               includers: list[Checked] = ()):
    """Every occurrence of the symbol under the cursor, in this file's check and in the
    checks of the open files that include it (`includers`): there a symbol this file
    defines is used, and a symbol this file only uses may be defined.  A check counts
    when it knows the symbol by the same key defined at the same place."""
    if checked is None:
        return None
    line, col = checked.where(position)
    views = [checked, *includers]
    found = next(((view, occ) for view in views
                  if (occ := occurrence_at(checked, line, col, view)) is not None), None)
    if found is None:
        return None
    view, occ = found
    place = _defined_at(view, occ.key)
    out, seen = [], set()
    for view in views:
        if occ.key not in view.analysis.symbols or _defined_at(view, occ.key) != place:
            continue
        for o in view.analysis.references(occ.key):
            loc = _location(view, o.span)
            where = (loc.uri, loc.range.start.line, loc.range.start.character)
            if (include_declaration or not o.definition) and where not in seen:
                seen.add(where)
                out.append(loc)
    return out


def _defined_at(view: Checked, key: str):
    info = view.analysis.symbols.get(key)
    if info is None or info.span is None:
        return None
    return (_key(info.span.file), info.span.line, info.span.col)


def prepare_rename(checked: Checked | None, position: T.Position):
    occ = _occurrence(checked, position)
    if occ is None or occ.key.startswith("file:"):
        return None
    return checked.lines.span(occ.span)


class RenameRefused(JsonRpcInvalidParams):
    """A new name the server refuses: the client gets an InvalidParams error with the
    reason (and the log one line: tpuasm/lsp/logs.py)."""


def rename(checked: Checked | None, position: T.Position, new_name: str):
    occ = _occurrence(checked, position)
    if occ is None or occ.key.startswith("file:"):
        return None
    if not _NAME.match(new_name):
        raise RenameRefused(f"'{new_name}' is not a name (letters, digits and _, not first "
                            "a digit)")
    kind, _, old = occ.key.partition(":")
    if kind == "macro" and ISA_TABLE.lookup(new_name) is not None:
        raise RenameRefused(f"'{new_name}' is an instruction's name")
    changes: dict[str, list[T.TextEdit]] = {}
    for o in checked.analysis.references(occ.key):
        changes.setdefault(uri_of(o.span.file), []).append(
            T.TextEdit(range=checked.lines.span(o.span), new_text=new_name))
    return T.WorkspaceEdit(changes=changes)


# ------------------------------------------------------------------ the whole file
_SYMBOL_KINDS = {"equ": T.SymbolKind.Constant, "label": T.SymbolKind.Key,
                 "macro": T.SymbolKind.Function, **{m: T.SymbolKind.Variable for m in MEMORIES}}


def outline(checked: Checked | None) -> list[T.DocumentSymbol] | None:
    """Regions, constants, labels, macros and `.node` sections defined in this file."""
    if checked is None:
        return None
    a = checked.analysis
    found = []
    for info in a.symbols.values():
        if info.span is None or info.span.file != checked.path:
            continue
        detail = {"equ": f"= {info.value}" if info.value is not None else "",
                  "label": f"instruction {info.value}",
                  "macro": ", ".join(info.params)}.get(info.kind)
        if detail is None:
            detail = f"{info.size} rows at {info.value}" if info.size is not None else ""
        found.append((info.span, info.qualified, _SYMBOL_KINDS[info.kind], detail))
    for st in a.statements.get(checked.path, ()):
        if type(st) is Directive and st.name == "node" and len(st.args) == 1:
            arg = st.args[0]
            name = arg.text if type(arg) is Name else arg.value if type(arg) is Str else None
            if name:
                found.append((arg.span, name, T.SymbolKind.Namespace, "graph node"))
    found.sort(key=lambda f: (f[0].line, f[0].col))
    out = []
    for span, name, kind, detail in found:
        r = checked.lines.span(span)
        out.append(T.DocumentSymbol(name=name, kind=kind, range=r, selection_range=r,
                                    detail=detail or None))
    return out


def formatting(checked: Checked | None) -> list[T.TextEdit] | None:
    if checked is None:
        return None
    after = format_source(checked.text)
    if after == checked.text:
        return []
    lines = checked.text_lines()
    end = T.Position(line=len(lines), character=0)
    return [T.TextEdit(range=T.Range(start=T.Position(line=0, character=0), end=end), new_text=after)]


def inlay_hints(checked: Checked | None, within: T.Range) -> list[T.InlayHint] | None:
    """`#index` after each instruction line (the indices of every instruction the line
    assembles to), and with a run's stats the first one's issue and stall cycles.  In a
    file with errors, the lines that assembled get theirs (analysis.instruction_lines)."""
    if checked is None:
        return None
    if checked.skipped:                  # an emptied line: the indices after it are wrong
        return []
    lines = checked.text_lines()
    out = []
    for (file, line), indices in checked.analysis.instruction_lines().items():
        if file != checked.path or not within.start.line <= line - 1 <= within.end.line:
            continue
        first = indices[0]
        label = f"#{first}" if len(indices) == 1 else f"#{first}..#{indices[-1]} ({len(indices)})"
        if checked.stats is not None:
            extra = checked.stats.hint(first)
            if extra:
                label += f" {extra}"
        code = lines[line - 1]
        code = code[:_comment_start(code)].rstrip()
        out.append(T.InlayHint(position=checked.lines.position(file, line, len(code) + 1),
                               label=label, padding_left=True))
    return out


def _comment_start(line: str) -> int:
    for t in line_tokens(line, strict=False):
        if t.kind == "comment":
            return t.start
    return len(line)

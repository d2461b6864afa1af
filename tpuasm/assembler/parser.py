"""Pass 1: source text -> list of statements (lark LALR, contextual lexer).

The transformer is handed to lark (`transformer=`), so the parser builds our
small AST directly and never a generic parse tree (no second walk).  Every
node carries a Span taken from its tokens, which is why lark's
`propagate_positions` (it only fills in `Tree.meta`) is off.

Syntax errors do not stop the run: after an error the parser resumes on the
next line (statements never span lines), so one run reports every bad line.
"""
from __future__ import annotations

import re
import threading
from importlib import resources

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from ..diagnostics import Diagnostic, shorten
from ..limits import MAX_LITERAL_CHARS, MAX_VALUE_BITS
from ..literals import parse_int
from .ast import Binary, Directive, Instr, Label, Name, Named, Num, Param, Span, Str, Unary


# Binary operators, tighter binding = higher number (C's order).
PRECEDENCE = {"|": 1, "^": 2, "&": 3, "<<": 4, ">>": 4, "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}


class _Build(Transformer):
    """Builds ast nodes; `file`, `line_offset` and `diags` are set per parse."""

    def __init__(self):
        super().__init__(visit_tokens=False)
        self.file = "<input>"
        self.line_offset = 0
        self.diags: list[Diagnostic] = []

    def _span(self, tok: Token) -> Span:
        off = self.line_offset
        return Span(self.file, tok.line + off, tok.column, tok.end_line + off, tok.end_column)

    # statements
    def start(self, children):
        return children

    def label(self, children):
        tok = children[0]
        return Label(tok.value, self._span(tok), [])

    def directive(self, children):
        tok, args = children
        return Directive(tok.value[1:].lower(), self._span(tok), args or [])

    def headed_directive(self, children):
        tok, head, args = children
        return Directive(tok.value[1:].lower(), self._span(tok), [Name(head.value, self._span(head))] + args,
                         headed=True)

    def instruction(self, children):
        tok, args = children
        return Instr(tok.value, self._span(tok), args or [])

    def args(self, children):
        out = []
        for c in children[::2]:          # odd children are the commas
            out.append(self._string(c) if isinstance(c, Token) else c)
        return out

    def named(self, children):
        name, _eq, value = children
        if isinstance(value, Token):
            value = self._string(value)
        span = self._span(name)
        return Named(name.value, span, value, span.to(value.span))

    def _string(self, tok: Token) -> Str:
        return Str(tok.value[1:-1], self._span(tok))

    # expressions
    def expr(self, children):
        """`a op b op c ...` ordered by C precedence (precedence climbing)."""
        operands = children[::2]
        ops = children[1::2]
        pos = 0

        def climb(min_prec):
            nonlocal pos
            left = operands[pos]
            while pos < len(ops) and PRECEDENCE[ops[pos].value] >= min_prec:
                op = ops[pos].value
                pos += 1
                right = climb(PRECEDENCE[op] + 1)    # all binary operators are left-associative
                left = Binary(op, left, right, left.span.to(right.span))
            return left

        return climb(0)

    def operand(self, children):
        node = children[-1]
        for op in reversed(children[:-1]):
            node = Unary(op.value, node, self._span(op).to(node.span))
        return node

    def number(self, children):
        tok = children[0]
        span = self._span(tok)
        value = parse_int(tok.value)
        if value is None:
            why = (f"longer than {MAX_LITERAL_CHARS} characters" if len(tok.value) > MAX_LITERAL_CHARS
                   else "use decimal, 0x hex, 0b binary or 0o octal")
            self.diags.append(Diagnostic(
                f"bad integer literal '{shorten(tok.value, 40)}' ({why})",
                span.file, span.line, span.col, span.end_col))
        elif value.bit_length() > MAX_VALUE_BITS:
            self.diags.append(Diagnostic(
                f"integer literal too large (more than {MAX_VALUE_BITS} bits)",
                span.file, span.line, span.col, span.end_col))
            value = None
            # value None: evaluation knows the error was reported and stays quiet
        return Num(value, span)

    def name(self, children):
        tok = children[0]
        return Name(tok.value, self._span(tok))

    def param(self, children):
        tok = children[0]
        return Param(tok.value[1:], self._span(tok))

    def group(self, children):
        lpar, inner, rpar = children
        inner.span = self._span(lpar).to(self._span(rpar))
        return inner


_builder = _Build()
_lock = threading.Lock()          # the builder carries per-parse state
_parser: Lark | None = None


def _get_parser() -> Lark:
    global _parser
    if _parser is None:
        grammar = resources.files("tpuasm").joinpath("grammar.lark").read_text(encoding="utf-8")
        _parser = Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=False,
                       maybe_placeholders=True, cache=True, transformer=_builder)
    return _parser


def parse(text: str, file: str, fast: bool = True) -> tuple[list, list[Diagnostic]]:
    """Statements of one file and the diagnostics of every malformed line.

    With `fast`, plain instruction lines (`MNEMONIC[.F] a, b + 1, name=c`) are
    read by `_fast_line` and every other run of lines goes to lark.  Measured
    on this project's 2-core machines (idle), lark's LALR parser costs ~5 us
    per token, ~50 us for a line like `MMC.S input, sums + 5, BATCH`, with or
    without the inline transformer: that alone caps assembly near 20,000
    instructions/s.  The fast reader does such a line in ~5-10 us.  It accepts
    a strict subset of the grammar and builds the very same nodes (a property
    test compares it with lark); anything else, and every error, is lark's.
    """
    if not fast:
        return _parse_lark(text, file, 0)
    statements: list = []
    diags: list[Diagnostic] = []
    lines = text.split("\n")
    pending_start = None                  # first line (0-based) of lines waiting for lark
    for i, line in enumerate(lines):
        result = _fast_line(line, file, i + 1)
        if result is None:                # not simple: lark reads it
            if pending_start is None:
                pending_start = i
            continue
        if pending_start is not None:
            _lark_chunk(lines, pending_start, i, file, statements, diags)
            pending_start = None
        if result is not _BLANK:
            statements.append(result)
    if pending_start is not None:
        _lark_chunk(lines, pending_start, len(lines), file, statements, diags)
    return statements, diags


def _lark_chunk(lines, start, stop, file, statements, diags):
    got, errs = _parse_lark("\n".join(lines[start:stop]), file, start)
    statements += got
    diags += errs


_BLANK = object()


def _span(file, line, col, end_line, end_col) -> Span:
    # tuple.__new__ directly: a NamedTuple's own __new__ is a Python function,
    # and the fast reader makes several spans per line
    return _tuple_new(Span, (file, line, col, end_line, end_col))


_tuple_new = tuple.__new__
# Greedy operand text (no lazy quantifier: a long run of blanks must not make
# the regex engine backtrack quadratically); trailing blanks are the operand
# pattern's business.
_SIMPLE_LINE = re.compile(
    r"[ \t]*([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)(?:[ \t]+([^;#\"\\()~\r\n]*))?(?:[;#].*)?\r?")
_BLANK_LINE = re.compile(r"[ \t]*(?:[;#].*)?\r?")
_ATOM = r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?|[0-9][A-Za-z0-9_]*)"
_SIMPLE_OPERAND = re.compile(
    r"[ \t]*(?:([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*)?" + _ATOM +
    r"(?:[ \t]*([-+*])[ \t]*" + _ATOM + r")?[ \t]*")


def _fast_line(line: str, file: str, lineno: int):
    """The statement of a plain instruction line, _BLANK, or None (lark must read it)."""
    if _BLANK_LINE.fullmatch(line):
        return _BLANK
    m = _SIMPLE_LINE.fullmatch(line)
    if m is None:
        return None
    mnemonic = m.group(1)
    span = _span(file, lineno, m.start(1) + 1, lineno, m.end(1) + 1)
    if not m.group(2) or not m.group(2).strip(" \t"):
        return Instr(mnemonic, span, [])
    args = []
    pos = m.start(2)
    for piece in m.group(2).split(","):
        om = _SIMPLE_OPERAND.fullmatch(piece)
        if om is None:
            return None
        a = _fast_atom(om, 2, pos, file, lineno)
        if a is None:
            return None
        if om.group(3):
            b = _fast_atom(om, 4, pos, file, lineno)
            if b is None:
                return None
            a = Binary(om.group(3), a, b, a.span.to(b.span))
        if om.group(1):
            name_span = _span(file, lineno, pos + om.start(1) + 1, lineno, pos + om.end(1) + 1)
            a = Named(om.group(1), name_span, a, name_span.to(a.span))
        args.append(a)
        pos += len(piece) + 1
    return Instr(mnemonic, span, args)


def _fast_atom(om, group, pos, file, lineno):
    text = om.group(group)
    span = _span(file, lineno, pos + om.start(group) + 1, lineno, pos + om.end(group) + 1)
    if text[0].isdigit():
        value = parse_int(text)
        if value is None or value.bit_length() > MAX_VALUE_BITS:
            return None                                     # lark reports bad literals
        return Num(value, span)
    return Name(text, span)


def _parse_lark(text: str, file: str, line_offset: int) -> tuple[list, list[Diagnostic]]:
    """Statements of `text` (whose first line is line_offset + 1) and syntax diagnostics."""
    if not text.endswith("\n"):
        text += "\n"
    statements: list = []
    diags: list[Diagnostic] = []
    chunk = text
    with _lock:
        parser = _get_parser()
        _builder.file = file
        while chunk:
            ok, result, lit_diags = _try(parser, chunk, line_offset)
            if ok:
                statements += result
                diags += lit_diags
                break
            err: UnexpectedInput = result
            bad = max(err.line, 1) if isinstance(err.line, int) else 1
            diags.append(_friendly(err, file, line_offset, chunk))
            starts = _line_starts(chunk, bad + 1)
            if bad > 1:                  # the lines before the bad one parsed fine
                ok, good, lit_diags = _try(parser, chunk[:starts[bad - 1]], line_offset)
                if ok:
                    statements += good
                    diags += lit_diags
            if bad >= len(starts):
                break
            rest = chunk[starts[bad]:]
            first = line_offset + bad
            for k, line in enumerate(rest.split("\n")):
                if not line.strip():
                    continue
                ok, result, lit_diags = _try(parser, line + "\n", first + k)
                if ok:
                    statements += result
                    diags += lit_diags
                else:
                    diags.append(_friendly(result, file, first + k, line + "\n"))
            break
    return statements, diags


def _try(parser, text, line_offset):
    _builder.line_offset = line_offset
    _builder.diags = []
    try:
        result = parser.parse(text)
    except UnexpectedInput as e:
        return False, e, []
    return True, result, _builder.diags


def _line_starts(text: str, upto: int) -> list[int]:
    """Offsets of the first `upto` lines (index 0 = line 1)."""
    starts = [0]
    pos = 0
    while len(starts) < upto:
        pos = text.find("\n", pos)
        if pos < 0:
            break
        pos += 1
        if pos >= len(text):
            break
        starts.append(pos)
    return starts


# What a terminal is called in an error message.
_TERMINAL_WORDS = {
    "COMMA": "','", "EQUALS": "'='", "RPAR": "')'", "LPAR": "'('", "_NL": "end of line",
    "STRING": "a string", "NAME": "a name", "DIRECTIVE": "a directive", "COLON": "':'",
}
_EXPRESSION_START = {"INT", "NAME", "PARAM", "LPAR", "UNOP"}


def _describe_expected(expected: set[str]) -> str:
    words = []
    if "INT" in expected or "PARAM" in expected:
        words.append("an expression")
        expected = expected - _EXPRESSION_START - {"STRING"}
    if "BINOP" in expected:
        words.append("an operator")
        expected = expected - {"BINOP"}
    words += sorted({_TERMINAL_WORDS.get(t, f"'{t.lower()}'") for t in expected if not t.startswith("$")})
    if not words:
        return ""
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _friendly(err: UnexpectedInput, file: str, line_offset: int, chunk: str) -> Diagnostic:
    line = max(err.line, 1) + line_offset if isinstance(err.line, int) else 1 + line_offset
    col = max(err.column, 1) if isinstance(err.column, int) else 1
    if isinstance(err, UnexpectedCharacters):
        ch = chunk[err.pos_in_stream] if 0 <= err.pos_in_stream < len(chunk) else "?"
        hint = ""
        if ch == "\\":
            hint = " (a macro parameter is `\\name`, used inside a .macro body)"
        elif ch == '"':
            hint = " (unterminated string)"
        return Diagnostic(f"unexpected character {ch!r}{hint}", file, line, col, col + 1)
    if isinstance(err, UnexpectedToken):
        tok = err.token
        expected = _describe_expected(set(err.expected))
        if tok.type == "_NL" or tok.type == "$END":
            what = "unexpected end of line"
            end = col + 1
        else:
            what = f"unexpected {shorten(repr(tok.value), 60)}"
            end = tok.end_column if isinstance(tok.end_column, int) and tok.end_line == tok.line else col + 1
        message = f"{what}, expected {expected}" if expected else what
        return Diagnostic(message, file, line, col, end)
    return Diagnostic("syntax error", file, line, col)

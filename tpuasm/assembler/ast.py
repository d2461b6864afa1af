"""The syntax tree the parser builds (small, slotted classes: the benchmark
parses 100,000 lines, so these are built without lark's generic Tree)."""
from __future__ import annotations

from typing import NamedTuple


class Span(NamedTuple):
    """Where a piece of source is: 1-based line and column, end exclusive."""
    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def to(self, other: "Span") -> "Span":
        """The span from the start of self to the end of other."""
        return Span(self.file, self.line, self.col, other.end_line, other.end_col)


class Node:
    __slots__ = ("span",)


class Num(Node):
    __slots__ = ("value",)

    def __init__(self, value: int, span: Span):
        self.value, self.span = value, span


class Name(Node):
    """A symbol reference; `text` may be dotted (`ub.input`)."""
    __slots__ = ("text",)

    def __init__(self, text: str, span: Span):
        self.text, self.span = text, span


class Param(Node):
    """A macro parameter reference `\\name` (`text` without the backslash)."""
    __slots__ = ("text",)

    def __init__(self, text: str, span: Span):
        self.text, self.span = text, span


class Unary(Node):
    __slots__ = ("op", "operand")

    def __init__(self, op: str, operand: Node, span: Span):
        self.op, self.operand, self.span = op, operand, span


class Binary(Node):
    __slots__ = ("op", "left", "right")

    def __init__(self, op: str, left: Node, right: Node, span: Span):
        self.op, self.left, self.right, self.span = op, left, right, span


class Str(Node):
    """A string literal (only `.include` and `.config profile=` take one)."""
    __slots__ = ("value",)

    def __init__(self, value: str, span: Span):
        self.value, self.span = value, span


class Named(Node):
    """`name=value` in an argument list; `name_span` covers the name."""
    __slots__ = ("name", "name_span", "value")

    def __init__(self, name: str, name_span: Span, value: Node, span: Span):
        self.name, self.name_span, self.value, self.span = name, name_span, value, span


class Statement:
    __slots__ = ("name", "span", "args")

    def __init__(self, name: str, span: Span, args: list):
        self.name, self.span, self.args = name, span, args


class Directive(Statement):
    """`.name args`: `name` is lower-case without the dot; `span` covers `.name`.

    `headed` marks the `.macro NAME p1, p2` form (no comma after the first name).
    """
    __slots__ = ("headed",)

    def __init__(self, name: str, span: Span, args: list, headed: bool = False):
        super().__init__(name, span, args)
        self.headed = headed


class Instr(Statement):
    """`NAME[.FLAGS] args`: an instruction or a macro call; `span` covers the mnemonic."""
    __slots__ = ()


class Label(Statement):
    """`name:`; `args` is empty, `span` covers the name."""
    __slots__ = ()

"""Pass 3: symbols and expressions.

Constants (`.equ`) and regions (`.ub/.acc/.host/.tile`) are evaluated lazily,
on first use, so definitions may refer forward; a symbol met again while it
is being computed is a cycle.  Rept variables and macro parameters live in
`Frame`s, the expansion context an instruction was produced in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..limits import MAX_VALUE_BITS
from .ast import Binary, Name, Node, Num, Param, Span, Str, Unary
from .reporter import Reporter, did_you_mean

MEMORIES = ("ub", "acc", "host", "tile")
MAX_SHIFT = 256            # bigger shifts only make huge integers, never a valid field
# No value, final or on the way, may be wider than this: `.equ A, A0*A0` chains would
# otherwise square their way to gigabytes (every field is at most 64 bits wide anyway).
MAX_BITS = MAX_VALUE_BITS


class EvalError(Exception):
    """An expression that has no value; carries the span to underline."""

    def __init__(self, span: Span, message: str, notes=(), reported: bool = False):
        super().__init__(message)
        self.span, self.message, self.notes = span, message, tuple(notes)
        self.reported = reported       # the root cause is already a diagnostic


class Frame:
    """One level of expansion: a .rept iteration (vars) or a macro call (params)."""
    __slots__ = ("parent", "vars", "params", "note")

    def __init__(self, parent, vars=None, params=None, note=""):
        self.parent, self.vars, self.params, self.note = parent, vars or {}, params, note

    def notes(self) -> list[str]:
        out, f = [], self
        while f is not None:
            if f.note:
                out.append(f.note)
            f = f.parent
        return out


def frame_notes(frame: Frame | None) -> list[str]:
    return frame.notes() if frame is not None else []


@dataclass
class Const:
    name: str
    expr: Node
    frame: Frame | None
    span: Span
    state: str = "new"          # new -> busy -> done | failed
    value: int | None = None


@dataclass
class Region:
    kind: str
    name: str
    size_expr: Node
    base_expr: Node | None
    frame: Frame | None
    span: Span
    size: int | None = None
    base: int | None = None


@dataclass
class Layout:
    state: str = "new"
    regions: list = field(default_factory=list)


class Symbols:
    def __init__(self, reporter: Reporter):
        self.reporter = reporter
        self.consts: dict[str, Const] = {}
        self.labels: dict[str, tuple[Span, int]] = {}     # name -> (where, instruction index)
        self.regions: dict[str, dict[str, Region]] = {k: {} for k in MEMORIES}
        self.layouts: dict[str, Layout] = {k: Layout() for k in MEMORIES}
        self.limits: dict[str, int] = {}          # memory kind -> rows (set once the shape is known)
        self._busy: list[str] = []                # names being computed, for cycle messages
        # Once expansion is over no symbol can be added, so a name's value is
        # final: the encoder looks each one up once (hot path: 100,000s of uses).
        self.frozen = False
        self._resolved: dict[str, int] = {}

    # ----------------------------------------------------------- definitions
    def define_const(self, name_node: Node, expr: Node, frame: Frame | None) -> None:
        name = name_node.text
        old = self.consts[name].span if name in self.consts else \
            self.labels[name][0] if name in self.labels else None
        if old is not None:
            self.reporter.error(name_node.span, f"duplicate symbol '{name}'",
                                [f"first defined at {_where(old)}"] + frame_notes(frame))
            return
        self.consts[name] = Const(name, expr, frame, name_node.span)

    def define_label(self, label, index: int, frame: Frame | None) -> None:
        """A label names an instruction index; it shares the namespace of .equ."""
        name = label.name
        if "." in name:
            self.reporter.error(label.span, f"a label is a plain name, not '{name}'", frame_notes(frame))
            return
        old = self.labels.get(name)
        if old is None and name in self.consts:
            old = (self.consts[name].span, None)
        if old is not None:
            if old[0] == label.span:
                message = f"label '{name}' is defined again by every expansion of its .rept or macro body"
                notes = frame_notes(frame)
            else:
                message = f"duplicate symbol '{name}'"
                notes = [f"first defined at {_where(old[0])}"] + frame_notes(frame)
            self.reporter.error(label.span, message, notes)
            return
        self.labels[name] = (label.span, index)

    def define_region(self, kind: str, name_node: Node, size: Node, base: Node | None,
                      frame: Frame | None) -> None:
        name = name_node.text
        old = self.regions[kind].get(name)
        if old is not None:
            self.reporter.error(name_node.span, f"duplicate region '{kind}.{name}'",
                                [f"first defined at {_where(old.span)}"] + frame_notes(frame))
            return
        self.regions[kind][name] = Region(kind, name, size, base, frame, name_node.span)

    # ----------------------------------------------------------- evaluation
    def eval(self, node: Node, frame: Frame | None) -> int:
        """The value of an expression; EvalError if it has none."""
        if isinstance(node, Num):
            if node.value is None:       # a bad literal, already reported by the parser
                raise EvalError(node.span, "bad integer literal", reported=True)
            return node.value
        if isinstance(node, Name):
            return self.lookup(node, frame)
        if isinstance(node, Binary):
            return self._binary(node, frame)
        if isinstance(node, Unary):
            v = self.eval(node.operand, frame)
            v = -v if node.op == "-" else ~v if node.op == "~" else v
            return v if v.bit_length() <= MAX_BITS else _too_wide(node)
        if isinstance(node, Param):
            return self._param(node, frame)
        if isinstance(node, Str):
            raise EvalError(node.span, "expected a number, not a string")
        raise EvalError(node.span, "expected an expression")

    def try_eval(self, node: Node, frame: Frame | None) -> int | None:
        """eval, reporting the error (with the expansion notes) and returning None."""
        try:
            return self.eval(node, frame)
        except EvalError as e:
            if not e.reported:
                self.reporter.error(e.span, e.message, list(e.notes) + frame_notes(frame))
        except RecursionError:
            self.reporter.error(node.span, "expression nested too deeply", frame_notes(frame))
        return None

    def try_eval_const(self, const: Const) -> None:
        """Evaluate a constant nothing used, so that its mistakes are reported too."""
        try:
            self._const_value(const, const.span)
        except EvalError as e:
            if not e.reported:
                self.reporter.error(e.span, e.message, list(e.notes) + frame_notes(const.frame))

    def _binary(self, node: Binary, frame) -> int:
        v = self._binary_value(node, frame)
        return v if v.bit_length() <= MAX_BITS else _too_wide(node)

    def _binary_value(self, node: Binary, frame) -> int:
        a = self.eval(node.left, frame)
        b = self.eval(node.right, frame)
        op = node.op
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            if a.bit_length() + b.bit_length() > MAX_BITS + 1:    # decided before the work
                _too_wide(node)
            return a * b
        if op in ("/", "%"):
            if b == 0:
                raise EvalError(node.span, "division by zero" if op == "/" else "modulo by zero")
            return a // b if op == "/" else a % b         # floor, as spec/isa.md says
        if op in ("<<", ">>"):
            if not 0 <= b <= MAX_SHIFT:
                raise EvalError(node.span, f"shift count {b} out of range 0..{MAX_SHIFT}")
            if op == "<<" and a.bit_length() + b > MAX_BITS + 1:
                _too_wide(node)
            return a << b if op == "<<" else a >> b
        if op == "&":
            return a & b
        if op == "|":
            return a | b
        assert op == "^", op          # the grammar has no other binary operator
        return a ^ b

    def _param(self, node: Param, frame) -> int:
        f = frame
        while f is not None:
            if f.params is not None:
                if node.text in f.params:
                    arg, caller = f.params[node.text]
                    return self.eval(arg, caller)
                break
            if node.text in f.vars:          # `\t` for a .rept variable works too
                return f.vars[node.text]
            f = f.parent
        if f is None:
            raise EvalError(node.span, f"macro parameter '\\{node.text}' used outside a macro")
        raise EvalError(node.span, f"unknown macro parameter '\\{node.text}'"
                        + did_you_mean(node.text, f.params) + f" (parameters: {', '.join(f.params) or 'none'})")

    def lookup(self, node: Name, frame) -> int:
        text = node.text
        f = frame
        while f is not None:
            v = f.vars.get(text)
            if v is not None:
                return v
            f = f.parent
        if self.frozen:
            v = self._resolved.get(text)
            if v is None:
                v = self._resolved[text] = self._lookup_symbol(node, frame)
            return v
        return self._lookup_symbol(node, frame)

    def _lookup_symbol(self, node: Name, frame) -> int:
        """A constant or region by name (not a .rept variable)."""
        text = node.text
        const = self.consts.get(text)
        if const is not None:
            return self._const_value(const, node.span)
        kind, dot, rest = text.partition(".")
        if dot and kind.lower() in MEMORIES:
            region = self.regions[kind.lower()].get(rest)
            if region is None:
                raise EvalError(node.span, f"undefined region '{text}'"
                                + did_you_mean(rest, self.regions[kind.lower()]))
            return self._region_base(region, node.span)
        owners = [k for k in MEMORIES if text in self.regions[k]]
        if len(owners) == 1:
            return self._region_base(self.regions[owners[0]][text], node.span)
        if len(owners) > 1:
            raise EvalError(node.span, f"'{text}' is ambiguous: it names regions in "
                            + " and ".join(owners) + f" (write {owners[0]}.{text})")
        raise EvalError(node.span, f"undefined symbol '{text}'"
                        + did_you_mean(text, self.known_names(frame)))

    def known_names(self, frame) -> list[str]:
        names = list(self.consts)
        for k in MEMORIES:
            names += list(self.regions[k])
            names += [f"{k}.{n}" for n in self.regions[k]]
        f = frame
        while f is not None:
            names += list(f.vars)
            f = f.parent
        return names

    def _const_value(self, const: Const, use: Span) -> int:
        if const.state == "done":
            return const.value
        if const.state == "failed":
            raise EvalError(use, f"'{const.name}' has no value", reported=True)
        if const.state == "busy":
            chain = self._busy[self._busy.index(const.name):] + [const.name]
            raise EvalError(const.span, "circular definition: " + " -> ".join(chain))
        const.state = "busy"
        self._busy.append(const.name)
        try:
            const.value = self.eval(const.expr, const.frame)
            const.state = "done"
            return const.value
        except EvalError as e:
            const.state = "failed"
            if not e.reported:          # report the root cause once, where it is
                self.reporter.error(e.span, e.message, list(e.notes) + frame_notes(const.frame))
            raise EvalError(use, f"'{const.name}' has no value", reported=True)
        except RecursionError:
            const.state = "failed"
            self.reporter.error(const.span, f"'{const.name}' is defined too deeply")
            raise EvalError(use, f"'{const.name}' has no value", reported=True)
        finally:
            self._busy.pop()

    def _region_base(self, region: Region, use: Span) -> int:
        self.layout(region.kind)
        if region.base is None:
            raise EvalError(use, f"region '{region.kind}.{region.name}' has no address", reported=True)
        return region.base

    # ----------------------------------------------------------- region layout
    def layout(self, kind: str) -> None:
        """Place every region of one memory (explicit bases first, the rest in order)."""
        lay = self.layouts[kind]
        if lay.state == "done":
            return
        if lay.state == "busy":
            raise EvalError(self._first_region(kind).span,
                            f"the size or base of a {kind} region depends on the {kind} layout itself")
        lay.state = "busy"
        regions = list(self.regions[kind].values())
        for r in regions:
            r.size = self.try_eval(r.size_expr, r.frame)
            if r.size is not None and r.size < 1:
                self.reporter.error(r.size_expr.span, f"region size {r.size} must be at least 1",
                                    frame_notes(r.frame))
                r.size = None
            if r.base_expr is not None:
                r.base = self.try_eval(r.base_expr, r.frame)
                if r.base is not None and r.base < 0:
                    self.reporter.error(r.base_expr.span, f"region base {r.base} is negative",
                                        frame_notes(r.frame))
                    r.base = None
        explicit = sorted((r for r in regions if r.base_expr is not None and r.base is not None
                           and r.size is not None), key=lambda r: r.base)
        for a, b in zip(explicit, explicit[1:]):
            if b.base < a.base + a.size:
                self.reporter.error(b.span, f"region '{kind}.{b.name}' (rows {b.base}..{b.base + b.size - 1}) "
                                    f"overlaps '{kind}.{a.name}' (rows {a.base}..{a.base + a.size - 1})",
                                    [f"'{kind}.{a.name}' is defined at {_where(a.span)}"])
        cursor = 0
        for r in regions:
            if r.base_expr is not None or r.size is None:
                continue
            moved = True
            while moved:                 # skip over explicit regions in the way
                moved = False
                for e in explicit:
                    if cursor < e.base + e.size and e.base < cursor + r.size:
                        cursor = e.base + e.size
                        moved = True
            r.base = cursor
            cursor += r.size
        limit = self.limits.get(kind)
        for r in regions:
            if r.base is not None and r.size is not None and limit is not None and r.base + r.size > limit:
                self.reporter.error(r.span, f"region '{kind}.{r.name}' (rows {r.base}..{r.base + r.size - 1}) "
                                    f"does not fit in {kind} memory of {limit} rows", frame_notes(r.frame))
        lay.state = "done"

    def _first_region(self, kind):
        return next(iter(self.regions[kind].values()))


def _too_wide(node: Node):
    raise EvalError(node.span, f"value too large: more than {MAX_BITS} bits "
                               "(no operand field is wider than 64)")


def _where(span: Span) -> str:
    return f"{span.file}:{span.line}:{span.col}"

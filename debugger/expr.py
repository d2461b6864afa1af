"""Expressions in debugger commands: `cycle > 5000`, `acc[3][7] < 0`, `acc.layer1 + 8`.

Parsed with Python's `ast` and evaluated by walking a whitelist of node types, so a
condition can never run arbitrary code.  Names resolve, in this order, to machine values
(`cycle`, `status`, `fault`), the memories `ub`, `acc`, `host` and `tile` (`tile[3]` is
weight tile 3 as int8; byte memories read as int8, `ubu` and `hostu` as uint8), the
shape (`array_size`, `ub_rows`, ...), the program's symbols, `retired`, the counters and
the configuration registers.  What an expression computes has a memory budget, checked
before it is computed (expr_budget.py).
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass

import numpy as np

from . import expr_budget as budget

MEMORIES = ("ub", "acc", "host")
REGION_KINDS = ("ub", "acc", "host", "tile")


class ExprError(Exception):
    """A malformed expression or one that names something that does not exist."""


@dataclass(frozen=True)
class Location:
    """A place in a memory: rows of `memory` starting at `row`, element `col` within it."""
    memory: str
    row: int
    col: int = 0
    rows: int = 1          # how many rows a range or a region symbol covers

    def __str__(self):
        return f"{self.memory}[{self.row}]" + (f"[{self.col}]" if self.col else "")


class Memory:
    """A memory as an expression sees it: subscripting gives numpy views (no copies), and
    a subscript that would copy (an array of rows) is sized against the budget first."""

    def __init__(self, name: str, array: np.ndarray):
        self.name = name
        self.array = array

    def get(self, key, what):
        """`self[key]`; `what` (the subscript's node) names it if it is over budget."""
        try:
            budget.check_index(what, self.array, key)
            return self.array[key]
        except IndexError as e:
            raise ExprError(f"{self.name}: {e}") from None


class TileMemory:
    """`tile[t]`: weight tile t as int8, through the machine's tile_values()."""

    def __init__(self, machine):
        self.machine = machine

    def __getitem__(self, key):
        if isinstance(key, tuple):
            return self[key[0]][key[1:]]
        if not isinstance(key, (int, np.integer)):
            raise ExprError("tile[...] takes one tile index")
        tiles = self.machine.weights.shape[0] if self.machine.weights is not None else 0
        if not 0 <= key < tiles:
            raise ExprError(f"tile {key} out of range 0..{tiles - 1}")
        return self.machine.tile_values(int(key))


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.floordiv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge}
_UNOPS = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
# sum, min, max, any, all and count reduce a memory view without copying it (numpy casts
# in small buffers), so they are the way to look at a whole memory; abs makes a copy.
_FUNCTIONS = {"sum": lambda a: np.sum(a, dtype=np.int64),
              "min": lambda a: np.min(a), "max": lambda a: np.max(a), "abs": np.abs,
              "any": lambda a: bool(np.any(a)), "all": lambda a: bool(np.all(a)),
              "len": len, "int": int, "count": lambda a: int(np.count_nonzero(a))}


# names _name() resolves besides symbols, counters and registers
_MACHINE_NAMES = frozenset(("cycle", "status", "fault", "ub", "ubu", "acc", "host", "hostu", "tile",
                            "array_size", "ub_rows", "acc_rows", "fifo_depth", "retired"))
_ALLOWED_NODES = (ast.Expression, ast.Constant, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare,
                  ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Load, ast.operator,
                  ast.unaryop, ast.boolop, ast.cmpop)


def symbol_table(program) -> dict[str, tuple[str, int, int]]:
    """Every name a program's symbols can be written as -> (kind, value, size).

    A region `.ub input` answers to `ub.input` and, when unambiguous, to `input`."""
    table: dict[str, tuple[str, int, int]] = {}
    bare: dict[str, list] = {}
    for s in (program.symbols if program is not None else ()):
        entry = (s.kind, s.value, s.size)
        name = s.name
        if s.kind in REGION_KINDS:
            short = name.split(".", 1)[1] if name.startswith(s.kind + ".") else name
            table[f"{s.kind}.{short}"] = entry
            bare.setdefault(short, []).append(entry)
        else:
            table[name] = entry
    for short, entries in bare.items():
        if len(entries) == 1 and short not in table:
            table[short] = entries[0]
    return table


class Evaluator:
    """Evaluates expressions against one machine and program."""

    def __init__(self, machine, symbols: dict[str, tuple[str, int, int]]):
        self.machine = machine
        self.symbols = symbols
        self._kinds: list[str] = []      # kinds of the symbols the last expression used
        self._size: int | None = None    # the size of the last region symbol used

    # -- public --------------------------------------------------------------------------
    def value(self, text: str):
        """The value of `text`: an int, a bool, a string or a numpy array."""
        try:
            return _plain(_array(self._eval(self._parse(text))))
        except (ValueError, OverflowError, TypeError) as e:
            # numpy: shapes that do not broadcast, an int too large for int64, a string
            # in arithmetic
            raise ExprError(f"`{text.strip()}`: {e}") from None

    def truth(self, text: str) -> bool:
        """`text` as a condition; an array is true when all its elements are."""
        v = self.value(text)
        if isinstance(v, np.ndarray):
            return bool(v.size) and bool(np.all(v))
        return bool(v)

    def integer(self, text: str) -> int:
        v = self.value(text)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ExprError(f"`{text}` is not an integer")
        return v

    def location(self, text: str, default_memory: str | None = None) -> Location:
        """Where `text` points: `ub[3]`, `acc[4][8]`, `acc[0:16]`, `input`, `acc.sums + 8`."""
        tree = self._parse(text)
        node = tree.body
        subs = []
        while isinstance(node, ast.Subscript):
            subs.insert(0, node.slice)
            node = node.value
        if isinstance(node, ast.Name) and node.id in MEMORIES + ("tile",) and subs:
            memory = node.id
            row, rows = self._row_range(subs[0])
            col = self._index(subs[1]) if len(subs) > 1 else 0
            if len(subs) > 2:
                raise ExprError(f"`{text}`: at most two subscripts (row, column)")
            return Location(memory, row, col, rows)
        self._kinds = []
        row = self._eval(tree)
        if isinstance(row, (bool, np.bool_)) or not isinstance(row, (int, np.integer)):
            raise ExprError(f"`{text}` is not an address")
        kinds = [k for k in self._kinds if k in REGION_KINDS]
        memory = kinds[0] if kinds else default_memory
        if memory is None:
            raise ExprError(f"`{text}`: which memory? write ub[...], acc[...] or host[...]")
        size = 1
        if isinstance(node, (ast.Name, ast.Attribute)) and self._size is not None:
            size = max(1, self._size)
        return Location(memory, int(row), 0, size)

    def check(self, text: str) -> None:
        """Raise ExprError if `text` is not a well-formed expression or names something that
        does not exist (nothing is evaluated: memories may change before it is)."""
        self._check(self._parse(text))

    def known_name(self, name: str) -> bool:
        m = self.machine
        return (name in _MACHINE_NAMES or name in self.symbols or name in m.counters()
                or name in m.registers())

    # -- internals -----------------------------------------------------------------------
    def _check(self, tree: ast.AST) -> None:
        """Every node of a whitelisted kind, every name and symbol known."""
        prefixes = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                        and not node.keywords):
                    raise ExprError(f"not allowed in an expression: `{ast.unparse(node)}`")
            elif isinstance(node, ast.Attribute):
                if not isinstance(node.value, ast.Name):
                    raise ExprError(f"not allowed in an expression: `{ast.unparse(node)}`")
                name = f"{node.value.id}.{node.attr}"
                if name not in self.symbols:
                    raise ExprError(f"no symbol {name}")
            elif isinstance(node, ast.Name):
                if id(node) not in prefixes and not self.known_name(node.id) and node.id not in _FUNCTIONS:
                    raise ExprError(f"unknown name `{node.id}`")
            elif not isinstance(node, _ALLOWED_NODES):
                raise ExprError(f"not allowed in an expression: `{ast.unparse(node)}`")

    def _parse(self, text: str) -> ast.Expression:
        text = text.strip()
        if not text:
            raise ExprError("empty expression")
        budget.check_text(text)
        try:
            return ast.parse(text, mode="eval")
        except SyntaxError as e:
            col = (e.offset or 1) - 1
            raise ExprError(f"cannot parse `{text}`\n  {text}\n  {' ' * col}^") from None

    def _row_range(self, node) -> tuple[int, int]:
        if isinstance(node, ast.Slice):
            if node.step is not None:
                raise ExprError("row ranges take no step")
            lo = self._index(node.lower) if node.lower is not None else 0
            if node.upper is None:
                raise ExprError("a row range needs an end: ub[0:16]")
            hi = self._index(node.upper)
            if hi <= lo:
                raise ExprError(f"empty row range {lo}:{hi}")
            return lo, hi - lo
        return self._index(node), 1

    def _index(self, node) -> int:
        v = _plain(self._eval(node))
        if isinstance(v, bool) or not isinstance(v, int):
            raise ExprError(f"`{ast.unparse(node)}` is not an integer")
        return v

    def _eval(self, node):
        m = self.machine
        match node:
            case ast.Expression(body=body):
                self._size = None
                return self._eval(body)
            case ast.Constant(value=v) if isinstance(v, (int, float, str)):
                return v
            case ast.Name(id=name):
                return self._name(name)
            case ast.Attribute(value=ast.Name(id=prefix), attr=attr):
                entry = self.symbols.get(f"{prefix}.{attr}")
                if entry is None:
                    raise ExprError(f"no symbol {prefix}.{attr}")
                self._kinds.append(entry[0])
                self._size = entry[2]
                return entry[1]
            case ast.BinOp(left=l, op=op, right=r) if type(op) in _BINOPS:
                a, b = _array(self._eval(l)), _array(self._eval(r))
                budget.check_broadcast(node, a, b)
                budget.check_int_op(node, _OP_SIGNS.get(type(op), ""), a, b)
                if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and _is_zero(b):
                    raise ExprError("division by zero")
                if isinstance(op, (ast.Pow, ast.LShift)) and np.any(np.asarray(b) > 64):
                    raise ExprError("exponent or shift above 64")     # 2 ** 10 ** 9 would hang
                return _BINOPS[type(op)](_widen(a), _widen(b))
            case ast.UnaryOp(op=ast.Not(), operand=x):
                return not _truth(_array(self._eval(x)))
            case ast.UnaryOp(op=op, operand=x) if type(op) in _UNOPS:
                v = _array(self._eval(x))
                budget.check_broadcast(node, v)
                return _UNOPS[type(op)](_widen(v))
            case ast.BoolOp(op=ast.And(), values=vs):
                return all(_truth(_array(self._eval(v))) for v in vs)
            case ast.BoolOp(op=ast.Or(), values=vs):
                return any(_truth(_array(self._eval(v))) for v in vs)
            case ast.Compare(left=l, ops=ops, comparators=rs):
                left, result = _array(self._eval(l)), True
                for op, r in zip(ops, rs):
                    if type(op) not in _CMPOPS:
                        raise ExprError(f"unsupported comparison {type(op).__name__}")
                    right = _array(self._eval(r))
                    budget.check_broadcast(node, left, right)
                    ok = _compare(_CMPOPS[type(op)], left, right)
                    result = ok if result is True else (result & ok)
                    left = right
                return result
            case ast.Subscript(value=v, slice=s):
                base = self._eval(v)
                key = self._eval(s)
                if isinstance(base, Memory):
                    return base.get(key, node)
                if isinstance(base, TileMemory):
                    return base[key]
                if isinstance(base, np.ndarray):
                    try:
                        budget.check_index(node, base, key)
                        return base[key]
                    except IndexError as e:
                        raise ExprError(str(e)) from None
                raise ExprError(f"`{ast.unparse(v)}` cannot be subscripted")
            case ast.Slice(lower=lo, upper=hi, step=st):
                return slice(*(None if x is None else self._index(x) for x in (lo, hi, st)))
            case ast.Tuple(elts=elts):
                return tuple(self._eval(e) for e in elts)
            case ast.List(elts=elts):
                items = [_plain(_array(self._eval(e))) for e in elts]
                budget.check_elements(node,
                                      (sum(int(np.size(v)) for v in items),))
                return np.array(items, dtype=np.int64)
            case ast.Call(func=ast.Name(id=fn), args=args, keywords=[]) if fn in _FUNCTIONS:
                values = [_array(self._eval(a)) for a in args]
                if fn == "abs":
                    budget.check_broadcast(node, *values)
                try:
                    return _FUNCTIONS[fn](*values)
                except (TypeError, ValueError) as e:
                    raise ExprError(f"{fn}(): {e}") from None
        raise ExprError(f"not allowed in an expression: `{ast.unparse(node)}`")

    def _name(self, name: str):
        m = self.machine
        if name == "cycle":
            return int(m.cycle)
        if name == "status":
            return str(m.status)
        if name == "fault":
            return m.fault.kind if m.fault is not None else None
        if name == "ub":
            return Memory("ub", m.ub.view(np.int8))
        if name == "ubu":
            return Memory("ub", m.ub)
        if name == "acc":
            return Memory("acc", m.acc)
        if name in ("host", "hostu"):
            if m.host is None:
                raise ExprError("no host memory loaded")
            return Memory("host", m.host if name == "hostu" else m.host.view(np.int8))
        if name == "tile":
            return TileMemory(m)
        if name in ("array_size", "ub_rows", "acc_rows", "fifo_depth"):
            return int(getattr(m.config, name))
        if name in self.symbols:
            kind, value, size = self.symbols[name]
            self._kinds.append(kind)
            self._size = size
            return value
        counters = m.counters()
        if name == "retired":
            return int(counters["instructions"])
        if name in counters:
            return _plain(counters[name])
        registers = m.registers()
        if name in registers:
            return int(registers[name])
        raise ExprError(f"unknown name `{name}`")


_OP_SIGNS = {ast.Mult: "*", ast.Pow: "**", ast.LShift: "<<"}


def _array(v):
    """A whole memory used as a value (`sum(ub)`, `acc == 0`, `print host`): its array, a
    view; subscripting goes through Memory so that errors name the memory."""
    if isinstance(v, Memory):
        return v.array
    if isinstance(v, TileMemory):
        raise ExprError("`tile` needs a tile index, e.g. tile[0]")
    return v


def _is_zero(b) -> bool:
    return bool(np.any(np.asarray(b) == 0))


def _widen(v):
    """Arithmetic on memory values happens in int64 so that int8 sums do not wrap."""
    if isinstance(v, np.ndarray) and v.dtype.kind in "iu":
        return v.astype(np.int64)
    if isinstance(v, np.integer):
        return int(v)
    return v


def _compare(op, a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(_widen(a)), np.asarray(_widen(b))
        if a.shape and b.shape and a.shape != b.shape:
            raise ExprError(f"cannot compare shapes {a.shape} and {b.shape}")
        return bool(np.all(op(a, b)))
    try:
        return op(a, b)
    except TypeError:
        raise ExprError(f"cannot compare {a!r} and {b!r}") from None


def _truth(v) -> bool:
    if isinstance(v, np.ndarray):
        return bool(v.size) and bool(np.all(v))
    return bool(v)


def _plain(v):
    """numpy scalars to Python values, so that results print and compare simply."""
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v

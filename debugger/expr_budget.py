"""The memory budget of debugger expressions, checked before anything is allocated.

Reading a memory is free: `ub[0:99999999]` is a numpy view (numpy clips the slice to the
memory's rows, as Python clips a list slice).  What costs memory is what an expression
computes: arithmetic and comparisons widen their operands to int64 and make a result as
large as their broadcast shape, `abs` makes a copy, and indexing with arrays (`ub[acc[0]]`)
gathers a new array.  Each of those is sized here from shapes alone and refused above
limits.MAX_EXPR_ELEMENTS; integers that grow with every operator (`2 ** 64 ** ...`) are
sized from bit lengths and refused above limits.MAX_EXPR_INT_BITS; the text is refused
above limits.MAX_EXPR_CHARS before it is parsed.  spec/limits.md lists the numbers.
"""
from __future__ import annotations

import ast

import numpy as np

from tpuasm import limits

# An array of this dtype holds no bytes: indexing it gives the shape numpy's own rules
# make for any key (basic, advanced, boolean, mixed) without copying a single element.
_NOTHING = np.dtype([])


def _refuse(message: str):
    from .expr import ExprError          # expr.py imports this module
    raise ExprError(message)


def _named(what) -> str:
    """`what` as a message names it: a node is unparsed only then (conditions are
    evaluated before every instruction; checks that pass must cost little)."""
    return f"`{ast.unparse(what)}`" if isinstance(what, ast.AST) else str(what)


def check_text(text: str) -> None:
    if len(text) > limits.MAX_EXPR_CHARS:
        _refuse(f"expression of {len(text):,} characters; at most "
                f"{limits.MAX_EXPR_CHARS:,} (limits.MAX_EXPR_CHARS, spec/limits.md)")


def check_elements(what, shape: tuple[int, ...]) -> None:
    """Refuse computing an array of `shape` above the element budget."""
    n = 1
    for d in shape:
        n *= int(d)
    if n > limits.MAX_EXPR_ELEMENTS:
        dims = f" ({' x '.join(f'{int(d):,}' for d in shape)})" if len(shape) > 1 else ""
        _refuse(
            f"{_named(what)} would compute {n:,} values{dims}; an expression computes at most "
            f"{limits.MAX_EXPR_ELEMENTS:,} per value (limits.MAX_EXPR_ELEMENTS, spec/limits.md): "
            "take fewer rows, e.g. ub[0:16], or reduce with sum(), min(), max(), count()")


def check_broadcast(what, *operands) -> None:
    """An element-wise operator's result: the broadcast shape of its array operands."""
    shapes = [v.shape for v in operands if isinstance(v, np.ndarray)]
    if not shapes:
        return
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:  # said now: numpy would say it only after widening the operands
        _refuse(f"{_named(what)}: shapes {' and '.join(str(s) for s in shapes)} do not broadcast "
                "(element-wise operators need equal shapes, or one of size 1)")
    check_elements(what, shape)


def _is_basic(key) -> bool:
    """A key that gives a view: integers, slices, None and Ellipsis (no arrays, no bools)."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(p is None or p is Ellipsis or isinstance(p, slice)
               or (isinstance(p, (int, np.integer)) and not isinstance(p, (bool, np.bool_)))
               for p in parts)


def check_index(what, base: np.ndarray, key) -> None:
    """Indexing `base` with `key`: free when it is a view; otherwise the gathered array's
    shape (from a placeholder that holds no bytes) must fit the budget.  The index arrays
    are first checked themselves, as numpy broadcasts them against each other."""
    if _is_basic(key):
        return
    parts = key if isinstance(key, tuple) else (key,)
    for p in parts:
        if not (p is None or p is Ellipsis or isinstance(p, (slice, int, np.integer, np.bool_))
                or (isinstance(p, np.ndarray) and p.dtype.kind in "iub")):
            raise IndexError("only integers, slices and integer arrays are valid indices")
    arrays = [p for p in parts if isinstance(p, np.ndarray)]
    if arrays:
        try:
            check_elements(what, np.broadcast_shapes(*(a.shape for a in arrays)))
        except ValueError:
            pass        # shapes that do not broadcast: numpy says so below
    check_elements(what, np.empty(base.shape, dtype=_NOTHING)[key].shape)


def int_bits(v) -> int:
    return abs(int(v)).bit_length() if isinstance(v, (int, np.integer)) else 0


def check_int_op(what, op: str, a, b) -> None:
    """Python integers grow with `*`, `**` and `<<`: bound the result from the operands'
    bit lengths before computing it."""
    a, b = (int(v) if isinstance(v, np.integer) else v for v in (a, b))   # expr.py widens them
    if isinstance(a, bool) or isinstance(b, bool) or not (isinstance(a, int) and isinstance(b, int)):
        return          # arrays stay 64-bit (they wrap); floats do not grow
    if op == "*":
        bits = int_bits(a) + int_bits(b)
    elif op == "**":
        bits = int_bits(a) * max(b, 0)
    elif op == "<<":
        bits = int_bits(a) + max(b, 0)
    else:                                # +, -, //, %, >>, &, |, ^: one bit at most
        bits = max(int_bits(a), int_bits(b)) + 1
    if bits > limits.MAX_EXPR_INT_BITS:
        _refuse(f"{_named(what)} would be an integer of about {bits:,} bits; at most "
                f"{limits.MAX_EXPR_INT_BITS:,} (limits.MAX_EXPR_INT_BITS, spec/limits.md)")

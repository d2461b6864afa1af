"""The machine's small numba helpers run as plain Python: the same source, without numba.

Why.  Faces that only look at a machine (the debugger drawing the matrix unit's progress,
the access history behind `info writes`, the reverse-execution snapshots) need a few of
the core's helpers -- an instruction's footprint, the vectors a MatrixMultiply streams --
once per instruction, not per cycle.  Calling them through numba means importing it and
loading its cache (~0.9 s, jit.py), while the run loop itself comes ready-made from the
ahead-of-time module (aot.py).  `python(f)` gives the very function `f` was written as,
with every njit helper it calls replaced (recursively) by its own plain-Python version, so
there is still one definition of each rule.  Semantics: Python integers instead of int64
(the helpers only add and multiply register values well inside int64), same results.
"""
from __future__ import annotations

import functools
import types

from . import jit


def _source(func):
    """The Python function behind an njit function (lazy or compiled), or None."""
    if isinstance(func, jit.Lazy):
        return func.py_func
    py = getattr(func, "py_func", None)          # a numba dispatcher
    return py if isinstance(py, types.FunctionType) else None


@functools.cache
def python(func):
    """`func` (an njit function of this package) as a plain Python function."""
    src = _source(func) or func
    if not isinstance(src, types.FunctionType):
        raise TypeError(f"not a Python function: {func!r}")
    space = dict(src.__globals__)
    for name in _global_names(src.__code__):     # only the globals the function uses
        value = space.get(name)
        if value is not func and _source(value) is not None:
            space[name] = python(value)
    clone = types.FunctionType(src.__code__, space, src.__name__, src.__defaults__,
                               src.__closure__)
    clone.__doc__, clone.__qualname__ = src.__doc__, src.__qualname__
    return clone


def _global_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:                 # comprehensions and inner functions
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names

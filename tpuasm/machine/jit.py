"""`njit` that imports numba only when compiled code is first needed.

Why.  Importing numba costs ~0.35 s and loading even a cached function another ~0.5 s
(numba refreshes every typing registry first, which imports scipy).  A `tpuasm run` whose
core comes ready-made from the ahead-of-time module (aot.py) needs neither, so the machine's
modules must be importable without numba.  Their functions are decorated with this `njit`,
which only records them; the first call (or attribute lookup such as `.py_func` or
`.overloads`) on any of them -- or `materialize()` -- imports numba and turns every recorded
function into a real numba dispatcher at once, with numba's cache pointed at the keyed
directory (jitcache.py).

After that the module globals hold the real dispatchers, so njit code compiled later sees
ordinary numba functions, and Python callers pay nothing extra.  A reference taken before
(`from .kernels import check_instruction` in another module) stays a `Lazy`: calling it
forwards to the dispatcher, and numba types it as that dispatcher wherever it meets it.
The functions' semantics are numba's in every case: nothing here runs them as Python.
"""
from __future__ import annotations

import sys
import threading

_PENDING: list["Lazy"] = []          # in decoration order (callees before callers)
_BINDERS: list = []                   # module hooks that need numba (gemm's BLAS symbols)
_LOCK = threading.RLock()
_DONE = False


class Lazy:
    """A function waiting to become a numba dispatcher (see the module docstring)."""

    def __init__(self, func, options):
        self.py_func = func
        self.options = options
        self.dispatcher = None
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__
        self.__module__ = func.__module__
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def real(self):
        if self.dispatcher is None:
            materialize()
        return self.dispatcher

    def __call__(self, *args, **kwargs):
        return self.real()(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real(), name)

    def __repr__(self):
        state = "compiled" if self.dispatcher is not None else "not yet compiled"
        return f"<njit {self.__module__}.{self.__qualname__} ({state})>"


def njit(*args, **options):
    """`@njit`, `@njit(...)` or `njit(func, ...)`, as numba's."""
    if args and callable(args[0]):
        return _make(args[0], options)
    return lambda func: _make(func, options)


def _make(func, options):
    with _LOCK:
        if _DONE:                      # a module imported after materialize(): compile now
            from numba import njit as numba_njit

            from .jitcache import keyed_cache_dir
            with keyed_cache_dir():
                return numba_njit(**options)(func)
        lazy = Lazy(func, options)
        _PENDING.append(lazy)
        return lazy


def on_materialize(hook) -> None:
    """Run `hook()` (which may import numba) just before the functions are compiled."""
    with _LOCK:
        if _DONE:
            hook()
        else:
            _BINDERS.append(hook)


_STAND_IN = None                      # the do-nothing C function bound to missing symbols


def external(name: str, signature, library=None):
    """A numba ExternalFunction calling the C function `name` of the ctypes `library`, its
    address registered with LLVM under that name (the ahead-of-time core finds the same name
    through the dynamic linker).  Without the library the name is bound to a do-nothing
    stand-in: the compiled code must link, and its callers never call it.  Only from
    on_materialize hooks (it imports numba)."""
    global _STAND_IN
    import ctypes

    import llvmlite.binding as llvm
    from numba import types
    if library is not None:
        address = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    else:
        if _STAND_IN is None:
            _STAND_IN = ctypes.CFUNCTYPE(None)(lambda: None)
        address = ctypes.cast(_STAND_IN, ctypes.c_void_p).value
    llvm.add_symbol(name, address)
    return types.ExternalFunction(name, signature)


def materialized() -> bool:
    return _DONE


def materialize() -> None:
    """Import numba and make every recorded function a dispatcher (idempotent)."""
    global _DONE
    with _LOCK:
        if _DONE:
            return
        from numba.core.typing.typeof import typeof_impl

        from .jitcache import keyed_cache_dir

        @typeof_impl.register(Lazy)
        def _typeof_lazy(val, c):
            return typeof_impl(val.real(), c)

        with keyed_cache_dir():        # before any dispatcher with cache=True is created
            for hook in _BINDERS:
                hook()
            from numba import njit as numba_njit
            for lazy in _PENDING:
                lazy.dispatcher = numba_njit(**lazy.options)(lazy.py_func)
        # every module of this package now refers to the dispatchers themselves
        prefix = __package__ + "."
        for name, module in list(sys.modules.items()):
            if module is None or not (name.startswith(prefix) or name == __package__):
                continue
            space = vars(module)
            for key, value in list(space.items()):
                if isinstance(value, Lazy):
                    space[key] = value.dispatcher
        _DONE = True
        _PENDING.clear()

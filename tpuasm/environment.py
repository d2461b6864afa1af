"""The one table of the environment variables tpuasm reads: name, type, default, effect and
the modules that read it.  Every read goes through `raw(NAME)`, which refuses a name the
table lacks, so a new switch cannot be added without its row.

`python -m tpuasm.environment` rewrites the generated table in spec/environment.md;
`--check` exits 1 when it is stale (tests/test_environment.py runs it, and also fails when
the code reads a variable the table lacks or the "read in" column is wrong).
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SPEC = Path(__file__).resolve().parent.parent / "spec" / "environment.md"


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str              # what the value is: flag, int, size, text, choice, path, command
    default: str           # in force when the variable is unset (as text, for the docs)
    effect: str
    read_in: tuple         # modules (paths under the repository) that read it


VARIABLES = (
    Variable("TPUASM_MEMORY_LIMIT", "size", "physical memory or what RLIMIT_AS leaves, less "
             "a quarter",
             "Bytes one allocation of user-sized data may take (bytes, or with a K/M/G "
             "suffix); larger inputs are refused before allocating (spec/limits.md).  A "
             "value that is not a size is an error.",
             ("tpuasm/limits.py",)),
    Variable("TPUASM_MAX_STATEMENTS", "int", "1000000",
             "Statements (and `.rept` iterations) one assembly may expand to; read once at "
             "import.  Not a plain decimal integer: the default.",
             ("tpuasm/limits.py",)),
    Variable("TPUASM_SCHEDULER", "text", "unset: a local Dask cluster",
             "The Dask scheduler address of `sweep`, `figure11`, `infer --workers` and "
             "`test --scheduler` when `--scheduler` is not given.",
             ("tpuasm/cluster.py", "tpuasm/regression/cli.py")),
    Variable("TPUASM_AOT", "flag", "1",
             "`0`: the machine's run loop uses the numba JIT instead of the ahead-of-time "
             "build in the cache.",
             ("tpuasm/machine/aot.py",)),
    Variable("TPUASM_BLAS_THREADS", "int", "unset: 1 for programs of small GEMMs, "
             "OpenBLAS's own count for large ones",
             "OpenBLAS threads while a program runs; `0` leaves OpenBLAS alone.  Not an "
             "integer: the default.",
             ("tpuasm/machine/machine.py",)),
    Variable("TPUASM_INT8", "choice", "unset: the best the CPU has (AVX-512 VNNI, AVX2)",
             "`0`, `off` or `no`: no int8 C kernel (MatrixMultiply as exact float GEMMs); "
             "`avx2`: at most the AVX2 kernel.",
             ("tpuasm/machine/native.py",)),
    Variable("TPUASM_INT8_THREADS", "int", "unset: the cores this process may use, at most 8",
             "Threads one large MatrixMultiply pass of the int8 kernel may use.",
             ("tpuasm/machine/native.py",)),
    Variable("TPUASM_NO_BLAS", "flag", "unset",
             "Any non-empty value: do not load numpy's OpenBLAS (the float path and the "
             "ahead-of-time core are then off), to test machines without it.",
             ("tpuasm/machine/gemm.py",)),
    # not tpuasm's own, but read by it
    Variable("XDG_CACHE_HOME", "path", "~/.cache",
             "The cache root is `$XDG_CACHE_HOME/tpuasm` (numba, ahead-of-time and C "
             "kernel builds, compiled apps, the sweep's results).",
             ("tpuasm/cache.py",)),
    Variable("NUMBA_CACHE_DIR", "path", "unset: `<cache root>/numba-<digest>`",
             "numba's own; when set, tpuasm leaves numba's cache where it says.",
             ("tpuasm/machine/jitcache.py",)),
    Variable("CC", "command", "Python's configured C compiler, else `cc`",
             "The C compiler that builds the int8 kernel.",
             ("tpuasm/machine/native.py",)),
    Variable("OPENBLAS_NUM_THREADS", "int", "unset: one thread per core",
             "OpenBLAS's own.  When none of these three is set, the debugger sets it to 1 "
             "while numpy is imported and gives OpenBLAS its cores back after the first "
             "frame (a faster start); a value the user set is left alone.",
             ("debugger/blas_start.py",)),
    Variable("GOTO_NUM_THREADS", "int", "unset", "OpenBLAS's own; see OPENBLAS_NUM_THREADS.",
             ("debugger/blas_start.py",)),
    Variable("OMP_NUM_THREADS", "int", "unset", "OpenMP's own; see OPENBLAS_NUM_THREADS.",
             ("debugger/blas_start.py",)),
)

BY_NAME = {v.name: v for v in VARIABLES}


def raw(name: str) -> str | None:
    """The variable's text, or None when unset.  KeyError for a name not in VARIABLES (a
    programming error: add its row)."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not in tpuasm.environment.VARIABLES")
    return os.environ.get(name)


def put(name: str, value: str | None) -> None:
    """Set the variable for this process and its children (None: remove it); the same
    table check as raw."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not in tpuasm.environment.VARIABLES")
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


# ------------------------------------------------------------------ the docs
def table() -> str:
    rows = ["| variable | value | default | effect | read in |", "|---|---|---|---|---|"]
    for v in VARIABLES:
        where = ", ".join(f"`{m}`" for m in v.read_in)
        rows.append(f"| `{v.name}` | {v.kind} | {v.default} | {v.effect} | {where} |")
    return "\n".join(rows)


_BLOCK = re.compile(r"(<!-- BEGIN GENERATED: environment -->\n).*?"
                    r"(<!-- END GENERATED: environment -->)", re.S)


def render(text: str) -> str:
    if not _BLOCK.search(text):
        raise ValueError(f"{SPEC}: no GENERATED environment block")
    return _BLOCK.sub(lambda m: m.group(1) + table() + "\n" + m.group(2), text)


def main(argv: list[str]) -> int:
    current = SPEC.read_text(encoding="utf-8")
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print(f"{SPEC} is out of date with tpuasm/environment.py: run "
                  "`python -m tpuasm.environment`")
            return 1
        return 0
    from .files import atomic_write
    atomic_write(SPEC, fresh.encode("utf-8"))
    print(f"updated {SPEC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

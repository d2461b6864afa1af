"""Reading the arrays a user gives the compiler: DATA.npy for a one-input model, DATA.npz
keyed by input name otherwise (never pickles)."""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.files import check_input


def read_named_arrays(path, names: list[str]) -> dict[str, np.ndarray]:
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise CompileError(f"{path}: no such file")
    # a FIFO would block np.load, a device feed it forever: refused at once
    check_input(path, what="array file", error=CompileError)
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CompileError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CompileError(f"{path}: not a .npy/.npz file: {e or type(e).__name__}") from None
    if isinstance(loaded, np.ndarray):
        if len(names) != 1:
            raise CompileError(f"{path}: the model has {len(names)} inputs "
                               f"({', '.join(names)}): give an .npz keyed by input name")
        return {names[0]: loaded}
    with loaded:
        try:
            return {k: loaded[k] for k in loaded.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
            raise CompileError(f"{path}: a damaged .npz file: {e or type(e).__name__}"
                               ) from None

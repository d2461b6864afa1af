"""Reading the arrays a user gives the compiler: DATA.npy for a one-input model, DATA.npz
keyed by input name otherwise (never pickles)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tpuasm.compiler.errors import CompileError


def read_named_arrays(path, names: list[str]) -> dict[str, np.ndarray]:
    path = Path(path)
    try:
        loaded = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise CompileError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise CompileError(f"{path}: not a .npy/.npz file: {e}") from None
    if isinstance(loaded, np.ndarray):
        if len(names) != 1:
            raise CompileError(f"{path}: the model has {len(names)} inputs "
                               f"({', '.join(names)}): give an .npz keyed by input name")
        return {names[0]: loaded}
    with loaded:
        return {k: loaded[k] for k in loaded.files}

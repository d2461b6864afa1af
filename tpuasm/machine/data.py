"""Loading and validating host-memory and weight images (.npy or arrays).

Host memory: (rows, N) int8 or uint8, copied (the machine writes it).
Weights: (tiles, N, N) int8 or uint8, read-only; a path is opened with mmap_mode="r" so a
multi-GiB weight image costs only the pages the program touches.
Anything else raises DataFileError naming the file, the shape/dtype found and the one expected.
Pickled objects are never loaded (allow_pickle=False).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import DataFileError

_BYTE_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def _open(path, what: str, mmap: bool) -> np.ndarray:
    if not isinstance(path, (str, os.PathLike)):
        raise DataFileError(f"{what}: expected a numpy array or the path of a .npy file, "
                            f"got {type(path).__name__}")
    p = Path(path)
    if not p.exists():
        raise DataFileError(f"{p}: {what} file not found")
    if p.is_dir():
        raise DataFileError(f"{p}: {what} file is a directory")
    try:
        arr = np.load(p, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as e:
        text = str(e)
        if "allow_pickle" in text or "pickle" in text.lower():
            raise DataFileError(f"{p}: {what} file holds Python objects (pickled data), "
                                f"expected a plain int8/uint8 array") from None
        raise DataFileError(f"{p}: not a valid .npy {what} file ({text})") from None
    except (OSError, EOFError) as e:
        raise DataFileError(f"{p}: cannot read {what} file ({e})") from None
    if not isinstance(arr, np.ndarray):          # a .npz archive: np.load opened a file
        arr.close()
        raise DataFileError(f"{p}: {what} file is a .npz archive, expected a numpy array "
                            f"(.npy)")
    return arr


def _check(arr, name: str, expected: tuple, expected_text: str) -> np.ndarray:
    if not isinstance(arr, np.ndarray):
        raise DataFileError(f"{name}: expected a numpy array, got {type(arr).__name__}")
    if arr.dtype not in _BYTE_TYPES:
        raise DataFileError(f"{name}: dtype {arr.dtype} found, expected int8 or uint8 "
                            f"with shape {expected_text}")
    ok = arr.ndim == len(expected) and all(e is None or e == s for e, s in zip(expected, arr.shape))
    if not ok:
        raise DataFileError(f"{name}: shape {tuple(arr.shape)} found, expected {expected_text}")
    return arr


def load_host(host, array_size: int) -> np.ndarray:
    """Host memory as a private, writable (rows, N) uint8 array (rows may be 0)."""
    n = array_size
    if host is None:
        return np.zeros((0, n), dtype=np.uint8)
    name = str(host) if not isinstance(host, np.ndarray) else "host array"
    arr = host if isinstance(host, np.ndarray) else _open(host, "host memory", mmap=False)
    _check(arr, name, (None, n), f"(rows, {n})")
    return np.ascontiguousarray(arr).view(np.uint8).copy()


def load_weights(weights, array_size: int) -> np.ndarray:
    """Weight image as a read-only (tiles, N, N) uint8 array (a memory map for paths)."""
    n = array_size
    if weights is None:
        out = np.zeros((0, n, n), dtype=np.uint8)
        out.flags.writeable = False
        return out
    name = str(weights) if not isinstance(weights, np.ndarray) else "weight array"
    arr = weights if isinstance(weights, np.ndarray) else _open(weights, "weight", mmap=True)
    _check(arr, name, (None, n, n), f"(tiles, {n}, {n})")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    # np.asarray drops the memmap subclass (numba wants a plain ndarray) without copying.
    out = np.asarray(arr).view(np.uint8)
    if out.flags.writeable:
        out = out.view()
        out.flags.writeable = False
    return out

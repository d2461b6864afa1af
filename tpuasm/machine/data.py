"""Loading and validating host-memory and weight images (.npy or arrays).

Host memory: (rows, N) int8 or uint8, private to the machine (it writes it): an array is
copied; a path is opened with mmap_mode="c" (copy-on-write: the file is never changed, and
only the pages the program reads or writes cost memory).
Weights: (tiles, N, N) int8 or uint8, read-only; a path is opened with mmap_mode="r" so a
multi-GiB weight image costs only the pages the program touches.
Anything else raises DataFileError naming the file, the shape/dtype found and the one expected.
Files are read by tpuasm.files.load_npy: never pickle, the header checked first.
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import DataFileError
from ..files import load_npy
from ..limits import check_allocation

_BYTE_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def _open(path, what: str, mmap: bool | str) -> np.ndarray:
    """A .npy image through tpuasm.files.load_npy: a regular file, its header checked
    (dtype, shape, the data really there) before anything is allocated, never pickle."""
    if not isinstance(path, (str, os.PathLike)):
        raise DataFileError(f"{what}: expected a numpy array or the path of a .npy file, "
                            f"got {type(path).__name__}")
    return load_npy(path, what=f"{what} file", mmap=mmap)


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


def load_host(host, array_size: int, copy: bool = True) -> np.ndarray:
    """Host memory as a private, writable (rows, N) uint8 array (rows may be 0); `copy=False`
    takes a writable, C-contiguous uint8 array as it is (the caller gives it up)."""
    n = array_size
    if host is None:
        return np.zeros((0, n), dtype=np.uint8)
    name = str(host) if not isinstance(host, np.ndarray) else "host array"
    if isinstance(host, np.ndarray):
        _check(host, name, (None, n), f"(rows, {n})")
        if not copy and host.dtype == np.uint8 and host.flags.c_contiguous and \
                host.flags.writeable:
            return host
        check_allocation(f"{name}: host image of shape {host.shape}", host.nbytes)  # the copy
        return np.ascontiguousarray(host).view(np.uint8).copy()
    arr = _check(_open(host, "host memory", mmap="c"), name, (None, n), f"(rows, {n})")
    if not arr.flags.c_contiguous:              # (a Fortran-order file) a private copy
        check_allocation(f"{name}: host image of shape {arr.shape}", arr.nbytes)
        return np.ascontiguousarray(arr).view(np.uint8)
    # a private copy-on-write map: the machine may write it, the file never changes
    return arr.view(np.uint8)


def load_weights(weights, array_size: int) -> np.ndarray:
    """Weight image as a read-only (tiles, N, N) uint8 array (a memory map for paths)."""
    n = array_size
    if weights is None:
        out = np.zeros((0, n, n), dtype=np.uint8)
        out.flags.writeable = False
        return out
    name = str(weights) if not isinstance(weights, np.ndarray) else "weight array"
    arr = weights if isinstance(weights, np.ndarray) else _open(weights, "weight", mmap="r")
    _check(arr, name, (None, n, n), f"(tiles, {n}, {n})")
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    # np.asarray drops the memmap subclass (numba wants a plain ndarray) without copying.
    out = np.asarray(arr).view(np.uint8)
    if out.flags.writeable:
        out = out.view()
        out.flags.writeable = False
    return out

"""The one place tpuasm opens a user's files, for reading and for writing.

Reading (`read_input`, `load_npy`, `npy_header`): regular files only, so `/dev/zero`, a
FIFO or a directory is refused at once instead of read forever or blocked on; a size
limit; errors that name the file and what it was meant to be.  A `.npy` file's header is
validated before anything is allocated: its dtype (never Python objects, never pickle),
a sane shape, and that the file really holds that many bytes.

Writing (`check_outputs`, `atomic_write`, `atomic_directory`): every output path of a
command is checked before any of them is written (its folder exists and is writable, it
is not a folder, it is not one of the command's inputs, no two outputs are the same
file), and each file is written to a temporary name in the same folder and renamed into
place, so a failure never leaves a half-written file or a clobbered old one.
spec/limits.md lists the limits.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from . import limits
from .errors import DataFileError, InputFileError, OutputFileError, TpuasmError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_regular(path, what: str, error: type[TpuasmError]) -> int:
    """A read-only descriptor of `path`, which must be a regular file.  O_NONBLOCK: opening
    a FIFO must not wait for a writer (the check below then refuses it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{path}: {what} is {_kind(mode)}, not a regular file")
    return fd


def check_input(path, *, what: str = "file",
                error: type[TpuasmError] = InputFileError) -> None:
    """Refuse at once an input that is not a regular file (a folder, a FIFO, a device) or
    cannot be opened, before a command works out anything from its name."""
    os.close(_open_regular(path, what, error))


def read_stream(stream, *, what: str = "standard input", limit: int,
                error: type[TpuasmError] = InputFileError) -> bytes:
    """At most `limit` bytes from a binary stream (stdin), `error` beyond: `cat /dev/zero |
    tpuasm fmt -` stops at the limit instead of filling memory."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise error(f"{what} is larger than the {limits.human_bytes(limit)} limit")
    return data


def read_text(path, *, what: str = "file", limit: int,
              error: type[TpuasmError] = InputFileError) -> str:
    """read_input decoded as UTF-8 (a BOM dropped), `error` when it is not UTF-8."""
    data = read_input(path, what=what, limit=limit, error=error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not valid UTF-8 (byte {e.start})") from None


def read_input(path, *, what: str = "file", limit: int,
               error: type[TpuasmError] = InputFileError) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; `error` (naming the file and
    `what` it is) otherwise."""
    fd = _open_regular(path, what, error)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise error(f"{path}: {what} is {limits.human_bytes(size)}, larger than the "
                        f"{limits.human_bytes(limit)} limit")
        chunks, total = [], 0
        while True:          # st_size may be 0 or stale (/proc files, a file still growing)
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise error(f"{path}: {what} is larger than the "
                            f"{limits.human_bytes(limit)} limit")
        return b"".join(chunks)
    except OSError as e:
        raise error(f"{path}: cannot read {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)


# ------------------------------------------------------------------ .npy files
_NPY_MAGIC = b"\x93NUMPY"


class NpyHeader:
    """What a .npy header declares: shape, dtype, order, and where the data starts."""
    __slots__ = ("shape", "dtype", "fortran_order", "offset", "file_size")

    def __init__(self, shape, dtype, fortran_order, offset, file_size):
        self.shape, self.dtype, self.fortran_order = shape, dtype, fortran_order
        self.offset, self.file_size = offset, file_size

    @property
    def nbytes(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count * self.dtype.itemsize


def _read_header(fh, path, what: str) -> NpyHeader:
    import numpy as np
    fmt = np.lib.format
    size = os.fstat(fh.fileno()).st_size
    head = fh.read(len(_NPY_MAGIC))
    if not head:
        raise DataFileError(f"{path}: {what} is an empty file, not a .npy array")
    if head.startswith(b"PK"):
        raise DataFileError(f"{path}: {what} is a .npz archive (or another zip file), "
                            "expected a .npy array")
    if head != _NPY_MAGIC:
        raise DataFileError(f"{path}: {what} is not a .npy file (it does not start with "
                            "numpy's magic bytes)")
    fh.seek(0)
    try:
        version = fmt.read_magic(fh)
        reader = {(1, 0): fmt.read_array_header_1_0,
                  (2, 0): fmt.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
        shape, fortran, dtype = reader(fh, max_header_size=limits.MAX_NPY_HEADER_BYTES)
    except OSError:
        raise
    except Exception as e:     # numpy's header parser raises many kinds on corrupt bytes
        text = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise DataFileError(f"{path}: {what} has a corrupt .npy header ({text})") from None
    if dtype.hasobject:
        raise DataFileError(f"{path}: {what} holds Python objects (pickled data); tpuasm "
                            "never unpickles: expected a plain numeric array")
    if not isinstance(shape, tuple) or len(shape) > limits.MAX_NPY_DIMS or any(
            isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < 1 << 62
            for d in shape) or _product(d for d in shape if d) * dtype.itemsize >= 1 << 62:
        raise DataFileError(f"{path}: {what} declares an impossible shape {shape!r}")
    return NpyHeader(shape, dtype, bool(fortran), fh.tell(), size)


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def npy_header(path, *, what: str = "array file") -> NpyHeader:
    """The validated header of a .npy file (nothing else is read)."""
    fd = _open_regular(path, what, DataFileError)
    with os.fdopen(fd, "rb") as fh:
        try:
            header = _read_header(fh, path, what)
        except OSError as e:
            raise DataFileError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    _check_data_present(header, path, what)
    return header


def _check_data_present(h: NpyHeader, path, what: str) -> None:
    have = h.file_size - h.offset
    if have < h.nbytes:
        raise DataFileError(f"{path}: {what} declares shape {h.shape} of {h.dtype} "
                            f"({limits.human_bytes(h.nbytes)}) but holds only "
                            f"{limits.human_bytes(max(have, 0))} of data (truncated or corrupt)")


def load_npy(path, *, what: str = "array file", dtypes: Iterable | None = None,
             ndim: int | None = None, mmap: bool | str = False):
    """A numpy array from a .npy file, its header checked first (see the module doc).

    `dtypes`: the allowed dtypes (None: any plain dtype); `ndim`: the required number of
    dimensions; `mmap`: a memory map instead of a copy in memory (then nothing is allocated
    for the data): True or "r" read-only, "c" copy-on-write (writable, the file never
    changes, and only the pages written cost memory).  DataFileError names the file and what is wrong.
    """
    import numpy as np
    fd = _open_regular(path, what, DataFileError)
    with os.fdopen(fd, "rb") as fh:
        try:
            h = _read_header(fh, path, what)
            if dtypes is not None:
                allowed = [np.dtype(d) for d in dtypes]
                if h.dtype not in allowed:
                    names = " or ".join(str(d) for d in allowed)
                    raise DataFileError(f"{path}: {what} has dtype {h.dtype}, expected {names}")
            if ndim is not None and len(h.shape) != ndim:
                raise DataFileError(f"{path}: {what} has shape {h.shape}, expected "
                                    f"{ndim} dimensions")
            _check_data_present(h, path, what)
            order = "F" if h.fortran_order else "C"
            if h.nbytes == 0:
                arr = np.zeros(h.shape, dtype=h.dtype)
            elif mmap:
                mode = "r" if mmap is True else mmap
                arr = np.memmap(fh, dtype=h.dtype, mode=mode, offset=h.offset, shape=h.shape,
                                order=order)
                arr = np.asarray(arr)        # a plain ndarray view of the map (no copy)
            else:
                limits.check_allocation(f"{path}: {what} of shape {h.shape}", h.nbytes)
                flat = np.fromfile(fh, dtype=h.dtype, count=h.nbytes // h.dtype.itemsize)
                arr = flat.reshape(h.shape, order=order)
        except OSError as e:
            raise DataFileError(f"{path}: cannot read {what}: {e.strerror or e}") from None
        except MemoryError:
            raise DataFileError(f"{path}: not enough memory to load {what} of shape "
                                f"{h.shape}") from None
    return arr


# ------------------------------------------------------------------ outputs
def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _is_stream(path: Path) -> bool:
    """/dev/null, /dev/stdout, a FIFO: written in place, never replaced by a rename."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_outputs(outputs, inputs=()) -> None:
    """Check every output path before anything is written.

    `outputs`: (label, path) pairs or a {label: path} dict (None paths are skipped); the
    label (e.g. "--listing") is named in each message.  `inputs`: paths the command reads.
    OutputFileError for the first problem: a missing or unwritable folder, a folder given
    as a file, an output that is one of the inputs, two outputs naming the same file.
    """
    pairs = list(outputs.items()) if isinstance(outputs, dict) else list(outputs)
    pairs = [(label, Path(p)) for label, p in pairs if p is not None]
    inputs = [Path(p) for p in inputs if p is not None]
    seen: list[tuple[str, Path]] = []
    for label, path in pairs:
        def refuse(reason: str, path=path, label=label):
            raise OutputFileError(f"{path}: cannot write: {reason}"
                                  + (f" ({label})" if label else ""))

        if path.is_dir():
            refuse("it is a directory, expected a file name")
        if _is_stream(path):
            continue
        parent = path.parent
        if not parent.is_dir():
            refuse(f"directory {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            refuse(f"directory {parent} is not writable")
        if path.exists() and not os.access(path, os.W_OK):
            refuse("the existing file is read-only")
        for source in inputs:
            if _same_file(path, source):
                refuse(f"it is the input {source}")
        for other_label, other in seen:
            if _same_file(path, other):
                refuse(f"it is also the output {other} ({other_label})")
        seen.append((label, path))


def atomic_write(path, data: bytes | str | Callable, *, what: str = "") -> None:
    """Write `data` (bytes, str as UTF-8, or a function writing to a binary file object)
    to `path` through a temporary file in the same folder renamed over it: readers see the
    old file or the new one, never a part.  OutputFileError on failure (nothing is left
    behind; `what` names the file in the message).  A device or FIFO (/dev/null,
    /dev/stdout) is written directly."""
    verb = f"cannot write {what}" if what else "cannot write"
    path = Path(path)
    if _is_stream(path):
        try:
            with open(path, "wb") as fh:
                _emit(fh, data)
        except OSError as e:
            raise OutputFileError(f"{path}: {verb}: {e.strerror or e}") from None
        return
    tmp = _stage(path, data, verb)
    try:
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputFileError(f"{path}: {verb}: {e.strerror or e}") from None


def _stage(path: Path, data, verb: str) -> str:
    """`data` written to a new temporary file beside `path` (its name holds this process's
    id, so a later run can tell a killed run's leftover); its name.  OutputFileError, and
    nothing left behind, on failure."""
    remove_stale_temporaries(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=_temp_prefix(path),
                                   suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            _emit(fh, data)
        os.chmod(tmp, _mode_for(path))
        staged, tmp = tmp, None
        return staged
    except OSError as e:
        raise OutputFileError(f"{path}: {verb}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def write_together(outputs, *, what: str = "") -> None:
    """Write several outputs of one command as one: every regular file is first written to
    its temporary file, then devices and FIFOs are written, and only when all of that
    succeeded are the temporary files renamed into place.  `outputs`: (path, data) pairs
    (data as for atomic_write; None paths skipped).  On any failure no output is changed
    (`asm -o P.tbin --listing FULL/P.lst` leaves no P.tbin)."""
    items = [(Path(p), d) for p, d in outputs if p is not None]
    verb = f"cannot write {what}" if what else "cannot write"
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in items:
            if not _is_stream(path):
                staged.append((_stage(path, data, verb), path))
        for path, data in items:
            if _is_stream(path):
                atomic_write(path, data, what=what)
        while staged:
            tmp, path = staged[0]
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise OutputFileError(f"{path}: {verb}: {e.strerror or e}") from None
            staged.pop(0)
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# ------------------------------------------------------------------ temporaries of killed runs
def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}."


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True            # someone else's process, or not a pid: leave it alone
    return True


def remove_stale_temporaries(path) -> list[Path]:
    """Remove the temporary files and folders that a killed run left beside `path`
    (`.NAME.PID.XXXX.tmp` whose process PID no longer exists: `kill -9` during
    `tpuasm compile -o OUT` leaves `.OUT.PID.XXXX.tmp/`).  Those of live processes, and
    anything not named that way, are kept.  The paths removed."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    head = f".{path.name}."
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not (name.startswith(head) and name.endswith(".tmp")):
            continue
        pid_text = name[len(head):].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _pid_alive(int(pid_text)):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


def _emit(fh, data) -> None:
    if callable(data):
        data(fh)
    else:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


def _mode_for(path: Path) -> int:
    """The existing file's permissions, else what open() would give a new file."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_directory(path):
    """`with atomic_directory(out) as tmp:` fill `tmp`; on success it becomes `out` (an old
    `out` is replaced only then), on an exception it is removed and `out` is untouched."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputFileError(f"{path}: exists and is not a directory")
    if not path.parent.is_dir():
        raise OutputFileError(f"{path}: directory {path.parent} does not exist")
    remove_stale_temporaries(path)
    try:
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp"))
    except OSError as e:
        raise OutputFileError(f"{path}: cannot create: {e.strerror or e}") from None
    try:
        yield tmp
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old.{os.getpid()}")
            os.rename(path, old)
        os.rename(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputFileError(f"{path}: cannot write: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class StagedFile:
    """An output written bit by bit (a sweep's CSV, row by row as points finish) that
    appears under its name only when `commit()` is called: until then it is a temporary
    file beside it (`.NAME.PID.XXXX.tmp`), and `discard()` (or a failure) removes it, so a
    failed or interrupted command leaves the old file as it was.  A device or FIFO
    (/dev/stdout, /dev/full) is written directly.  Write errors (a full disk) are
    OutputFileError naming the file."""

    def __init__(self, path, *, what: str = "", text: bool = True):
        self.path = Path(path)
        self.verb = f"cannot write {what}" if what else "cannot write"
        self.tmp: str | None = None
        try:
            if _is_stream(self.path):
                fd = os.open(self.path, os.O_WRONLY)
            else:
                remove_stale_temporaries(self.path)
                fd, self.tmp = tempfile.mkstemp(dir=self.path.parent or ".",
                                                prefix=_temp_prefix(self.path), suffix=".tmp")
            self.file = os.fdopen(fd, "w", newline="") if text else os.fdopen(fd, "wb")
        except OSError as e:
            self._fail(e)

    def _fail(self, e: OSError):
        self.discard()
        raise OutputFileError(f"{self.path}: {self.verb}: {e.strerror or e}") from None

    def write(self, data) -> None:
        try:
            self.file.write(data)
        except OSError as e:
            self._fail(e)

    def flush(self) -> None:
        try:
            self.file.flush()
        except OSError as e:
            self._fail(e)

    def commit(self) -> None:
        """Close the file and put it in place (OutputFileError, nothing changed, on failure)."""
        try:
            self.file.close()
            if self.tmp is not None:
                os.chmod(self.tmp, _mode_for(self.path))
                os.replace(self.tmp, self.path)
                self.tmp = None
        except OSError as e:
            self._fail(e)

    def discard(self) -> None:
        """Drop what was written; the old file (if any) is untouched."""
        file = getattr(self, "file", None)
        if file is not None:
            with contextlib.suppress(OSError, ValueError):
                file.close()
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.tmp = None


def is_stream(path) -> bool:
    """A device or FIFO output (/dev/null, /dev/stdout): written in place, not renamed."""
    return _is_stream(Path(path))

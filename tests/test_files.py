"""tpuasm.files and tpuasm.limits: the one place input files are opened and outputs written."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tpuasm import limits
from tpuasm.errors import DataFileError, InputFileError, OutputFileError, ResourceLimitError
from tpuasm.files import (atomic_directory, atomic_write, check_outputs, load_npy,
                          npy_header, read_input)


# ------------------------------------------------------------------ read_input
def test_read_input_reads_a_regular_file(tmp_path):
    p = tmp_path / "a.tasm"
    p.write_bytes(b"HLT\n")
    assert read_input(p, what="source", limit=100) == b"HLT\n"


@pytest.mark.parametrize("special, kind", [("/dev/zero", "a character device"),
                                           ("dir", "a directory"), ("fifo", r"a FIFO \(named pipe\)")])
def test_read_input_refuses_what_is_not_a_regular_file(tmp_path, special, kind):
    path = special
    if special == "dir":
        path = tmp_path
    elif special == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)          # nobody writes to it: opening must not block
    with pytest.raises(InputFileError, match=f"source is {kind}, not a regular file"):
        read_input(path, what="source", limit=1 << 20)


def test_read_input_size_limit_names_the_file(tmp_path):
    p = tmp_path / "big.tasm"
    p.write_bytes(b"x" * 1001)
    with pytest.raises(InputFileError, match=r"big.tasm: source is 1001 bytes, larger than "
                                             r"the 1000 bytes limit"):
        read_input(p, what="source", limit=1000)
    with pytest.raises(InputFileError, match="nope: cannot read source: No such file"):
        read_input(tmp_path / "nope", what="source", limit=1000)


# ------------------------------------------------------------------ .npy
def _npy_with_header(path, header: str, data: bytes = b"") -> None:
    """A version 1.0 .npy file with exactly this header dict text (padded as numpy does)."""
    text = header + " " * (64 - (10 + len(header) + 1) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()
                     + data)


def test_load_npy_round_trip_and_mmap(tmp_path):
    p = tmp_path / "a.npy"
    a = np.arange(24, dtype=np.int8).reshape(2, 3, 4)
    np.save(p, a)
    assert np.array_equal(load_npy(p), a)
    m = load_npy(p, mmap=True)
    assert np.array_equal(m, a) and not m.flags.writeable
    f = tmp_path / "f.npy"
    np.save(f, np.asfortranarray(a))
    assert np.array_equal(load_npy(f), a)
    np.save(tmp_path / "e.npy", np.zeros((0, 8), np.uint8))
    assert load_npy(tmp_path / "e.npy", mmap=True).shape == (0, 8)


def test_a_header_claiming_more_data_than_the_file_holds(tmp_path):
    p = tmp_path / "h.npy"
    _npy_with_header(p, "{'descr': '|i1', 'fortran_order': False, 'shape': (1099511627776, 256), }",
                     b"\0" * 100)
    with pytest.raises(DataFileError, match=r"declares shape \(1099511627776, 256\) of int8 "
                                            r"\(256.0 TiB\) but holds only 100 bytes"):
        load_npy(p)
    with pytest.raises(DataFileError, match="holds only 100 bytes"):
        npy_header(p)


def test_negative_and_absurd_shapes_are_refused(tmp_path):
    p = tmp_path / "neg.npy"
    _npy_with_header(p, "{'descr': '|i1', 'fortran_order': False, 'shape': (-1, 256), }")
    with pytest.raises(DataFileError, match=r"impossible shape \(-1, 256\)"):
        load_npy(p)
    # found by the fuzz suite: an empty array whose other dimension numpy cannot hold
    z = tmp_path / "zero.npy"
    _npy_with_header(z, "{'descr': '|i1', 'fortran_order': False, 'shape': (0, 10**30), }"
                     .replace("10**30", str(10 ** 30)))
    with pytest.raises(DataFileError, match=r"impossible shape \(0, 1000000000000000000000000000000\)"):
        load_npy(z)


def test_object_arrays_are_called_pickled_and_nothing_else_is(tmp_path):
    p = tmp_path / "o.npy"
    np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataFileError, match="pickled"):
        load_npy(p)
    r = tmp_path / "random.npy"
    r.write_bytes(os.urandom(300))
    with pytest.raises(DataFileError, match="is not a .npy file") as e:
        load_npy(r)
    assert "pickle" not in str(e.value)
    z = tmp_path / "empty.npy"
    z.write_bytes(b"")
    with pytest.raises(DataFileError, match="empty file"):
        load_npy(z)
    c = tmp_path / "corrupt.npy"
    _npy_with_header(c, "{'descr': '|i1', 'fortran_order': False, 'shape': (2, 2), 'x'")
    with pytest.raises(DataFileError, match="corrupt .npy header") as e:
        load_npy(c)
    assert "pickle" not in str(e.value)


def test_dtype_and_ndim_restrictions(tmp_path):
    p = tmp_path / "f.npy"
    np.save(p, np.zeros((2, 2), np.float32))
    with pytest.raises(DataFileError, match="dtype float32, expected int8 or uint8"):
        load_npy(p, dtypes=(np.int8, np.uint8))
    with pytest.raises(DataFileError, match=r"shape \(2, 2\), expected 3 dimensions"):
        load_npy(p, ndim=3)


def test_an_allocation_over_the_budget_is_refused_before_it_is_made(tmp_path, monkeypatch):
    p = tmp_path / "a.npy"
    np.save(p, np.zeros((1000, 100), np.int8))
    monkeypatch.setenv("TPUASM_MEMORY_LIMIT", "50K")
    with pytest.raises(ResourceLimitError, match=r"needs 97.7 KiB, more than the 50.0 KiB"):
        load_npy(p)
    assert load_npy(p, mmap=True).shape == (1000, 100)      # a map allocates nothing


# ------------------------------------------------------------------ outputs
def test_check_outputs_refuses_before_anything_is_written(tmp_path):
    src = tmp_path / "p.tasm"
    src.write_text("HLT\n")
    with pytest.raises(OutputFileError, match=r"p.tasm: cannot write: it is the input .*p.tasm \(-o\)"):
        check_outputs({"-o": src}, [src])
    with pytest.raises(OutputFileError, match="it is a directory"):
        check_outputs({"--out": tmp_path}, [])
    with pytest.raises(OutputFileError, match="directory .*nonexistent does not exist"):
        check_outputs([("--stats", tmp_path / "nonexistent" / "s.json")], [])
    with pytest.raises(OutputFileError, match=r"x: cannot write: it is also the output .*x \(-o\) \(--listing\)"):
        check_outputs([("-o", tmp_path / "x"), ("--listing", tmp_path / "x")], [])
    check_outputs({"-o": tmp_path / "new.tbin", "--listing": None}, [src])
    check_outputs({"-o": "/dev/null"}, [src])


def test_atomic_write_replaces_whole_files_and_leaves_nothing_on_failure(tmp_path):
    p = tmp_path / "out.bin"
    p.write_bytes(b"old")
    os.chmod(p, 0o640)
    atomic_write(p, b"new")
    assert p.read_bytes() == b"new" and (os.stat(p).st_mode & 0o777) == 0o640

    def fails(fh):
        fh.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputFileError, match="out.bin: cannot write: No space left"):
        atomic_write(p, fails)
    assert p.read_bytes() == b"new"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.bin"]
    atomic_write(tmp_path / "t.txt", "text é")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "text é"


def test_atomic_directory(tmp_path):
    out = tmp_path / "out"
    with atomic_directory(out) as tmp:
        (tmp / "a").write_text("1")
    assert (out / "a").read_text() == "1"
    with pytest.raises(RuntimeError):
        with atomic_directory(out) as tmp:
            (tmp / "b").write_text("2")
            raise RuntimeError
    assert sorted(x.name for x in out.iterdir()) == ["a"]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out"]


# ------------------------------------------------------------------ limits
def test_check_int_and_sizes():
    assert limits.check_int("n", 5, 1, 10) == 5
    with pytest.raises(ResourceLimitError, match="--max-cycles 11 out of range 1..10"):
        limits.check_int("--max-cycles", 11, 1, 10)
    with pytest.raises(ResourceLimitError, match="not an integer"):
        limits.check_int("n", True, 0, 1)
    assert limits.parse_size("4G") == 4 << 30 and limits.parse_size("512M") == 512 << 20
    assert limits.parse_size("12345") == 12345 and limits.parse_size("x") is None


def test_machine_budget_names_the_parts(monkeypatch):
    monkeypatch.setenv("TPUASM_MEMORY_LIMIT", "1G")
    with pytest.raises(ResourceLimitError, match=r"Unified Buffer 16,777,216 x 4,096 bytes.*"
                                                 r"more than the 1.0 GiB"):
        limits.check_machine("the machine", 4096, 16777216, 4096)
    limits.check_machine("the machine", 256, 96 * 1024, 4096)

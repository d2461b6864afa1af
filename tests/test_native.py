"""The int8 MatrixMultiply kernel (tpuasm/machine/mmc_int8.c through native.py) against a
numpy int64 oracle, and the machine choosing it or the float path: same results either way."""
from __future__ import annotations

import numpy as np
import pytest
from fresh_process import exact_mmc_in_fresh_process

from tpuasm.binary import Program
from tpuasm.encoding import Instruction
from tpuasm.isa import ISA_TABLE
from tpuasm.machine import Machine
from tpuasm.machine import kernels as K
from tpuasm.machine import native

needs_int8 = pytest.mark.skipif(native.cpu_level() == native.LEVEL_NONE,
                                reason="no AVX2 or no C compiler on this machine")
LEVELS = [level for level in (native.LEVEL_AVX2, native.LEVEL_VNNI)
          if level <= native.cpu_level()]


def wrap32(values):
    return (np.asarray(values, np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def run_kernel(x, rows, w, signed_x, signed_w, acc, acc_row, overwrite, level, threads=1,
               shift=0):
    n = w.shape[0]
    packed, bias = np.zeros(2 * n * n, np.int8), np.zeros(n, np.int32)
    native.pack_tile(w, signed_w, signed_x, level, packed, bias)
    native.mmc_rows(x, rows, len(rows), packed, bias, signed_x, signed_w, acc, acc_row,
                    overwrite, shift, level, threads)


def oracle(x, rows, w, signed_x, signed_w, acc, acc_row, overwrite, shift=0):
    xs = (x.view(np.int8) if signed_x else x).astype(np.int64)
    ws = (w.view(np.int8) if signed_w else w).astype(np.int64)
    want = acc.astype(np.int64)
    products = (xs[rows] @ ws) << shift
    end = acc_row + len(rows)
    want[acc_row:end] = products if overwrite else want[acc_row:end] + products
    return wrap32(want)


@needs_int8
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("signed_x", [True, False])
@pytest.mark.parametrize("signed_w", [True, False])
@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("n, m, threads", [
    (16, 1, 1), (16, 7, 1), (48, 13, 1), (64, 6, 1), (80, 25, 1), (256, 301, 1),
    (1024, 9, 1),
    (256, 700, 2), (512, 130, 3)])     # over SPLIT_MACS (2^25): shared among threads
def test_kernel_matches_int64_oracle(level, signed_x, signed_w, overwrite, n, m, threads):
    """Every signedness, row counts around the 6-row groups and 96-row blocks, widths
    around the 16- and 64-column panels, gathered (repeated, unordered) input rows,
    accumulating onto random int32s, on one thread and shared among several."""
    rng = np.random.default_rng(n * 1000 + m)
    x = rng.integers(0, 256, (m + 5, n), dtype=np.uint8)
    w = rng.integers(0, 256, (n, n), dtype=np.uint8)
    rows = rng.integers(0, m + 5, m).astype(np.int64)
    acc = rng.integers(-2**31, 2**31, (m + 4, n)).astype(np.int32)
    want = oracle(x, rows, w, signed_x, signed_w, acc, 3, overwrite)
    run_kernel(x, rows, w, signed_x, signed_w, acc, 3, overwrite, level, threads)
    assert np.array_equal(acc, want)


@needs_int8
@pytest.mark.parametrize("signed_x", [True, False])
@pytest.mark.parametrize("signed_w", [True, False])
@pytest.mark.parametrize("overwrite", [True, False])
@pytest.mark.parametrize("n, k_live, m, threads", [
    (64, 16, 7, 1), (256, 48, 301, 1), (256, 240, 13, 1), (256, 64, 700, 2)])
def test_kernel_skipping_zero_rows_matches_the_oracle(signed_x, signed_w, overwrite, n, k_live,
                                                      m, threads):
    """k_live: the tile's rows from there on are zero and skipped; the inputs' bytes there
    are not (random), so the shifted slots' row terms must leave them out too."""
    rng = np.random.default_rng(n + k_live + m)
    x = rng.integers(0, 256, (m + 5, n), dtype=np.uint8)
    w = rng.integers(0, 256, (n, n), dtype=np.uint8)
    w[k_live:] = 0
    rows = rng.integers(0, m + 5, m).astype(np.int64)
    acc = rng.integers(-2**31, 2**31, (m + 3, n), dtype=np.int64).astype(np.int32)
    want = oracle(x, rows, w, signed_x, signed_w, acc, 2, overwrite)
    level = native.LEVEL_VNNI if native.cpu_level() >= native.LEVEL_VNNI else native.LEVEL_AVX2
    packed, bias = np.zeros(2 * n * n, np.int8), np.zeros(n, np.int32)
    native.pack_tile(w, signed_w, signed_x, level, packed, bias)
    native.mmc_rows(x, rows, m, packed, bias, signed_x, signed_w, acc, 2, overwrite, 0, level,
                    threads, k_live)
    np.testing.assert_array_equal(acc, want)


@needs_int8
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("byte_x, byte_w, signed_x, signed_w", [
    (0x80, 0x80, True, True),            # -128 * -128 everywhere: sums of +2^14 per term
    (0x80, 0x7F, True, True),
    (0xFF, 0xFF, False, False),          # 255 * 255 * 1024 > 2^26
    (0xFF, 0x80, False, True),
    (0x80, 0xFF, True, False)])
def test_kernel_extremes_wrap_like_the_accumulators(level, byte_x, byte_w, signed_x, signed_w):
    n = 1024
    x = np.full((2, n), byte_x, np.uint8)
    w = np.full((n, n), byte_w, np.uint8)
    rows = np.array([0, 1], np.int64)
    acc = np.array([[2**31 - 1] * n, [-2**31] * n], np.int32)
    want = oracle(x, rows, w, signed_x, signed_w, acc, 0, False)
    run_kernel(x, rows, w, signed_x, signed_w, acc, 0, False, level)
    assert np.array_equal(acc, want)


@needs_int8
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("shift", [8, 16])
@pytest.mark.parametrize("overwrite", [True, False])
def test_kernel_shifts_products_by_a_bytes_weight(level, shift, overwrite):
    """The high byte of a 16-bit operand: products times 2^8 or 2^16, wrapping."""
    rng = np.random.default_rng(shift)
    n, m = 64, 20
    x = rng.integers(0, 256, (m, n), dtype=np.uint8)
    w = rng.integers(0, 256, (n, n), dtype=np.uint8)
    rows = np.arange(m, dtype=np.int64)
    acc = rng.integers(-2**31, 2**31, (m, n)).astype(np.int32)
    want = oracle(x, rows, w, True, False, acc, 0, overwrite, shift)
    run_kernel(x, rows, w, True, False, acc, 0, overwrite, level, shift=shift)
    assert np.array_equal(acc, want)


@needs_int8
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("n, m, threads", [
    (32, 47, 1), (96, 49, 1), (128, 97, 1), (208, 95, 1), (240, 53, 1),
    (256, 513, 2)])                    # just over SPLIT_MACS: 48-row blocks and a ragged end
def test_kernel_odd_shapes(level, n, m, threads):
    """K (= N) from 32 to 256 in steps that are not multiples of the 64-column panel, row
    counts one off the 6-row groups and 48-row blocks, every signedness in one go."""
    rng = np.random.default_rng(n + m)
    for signed_x in (True, False):
        for signed_w in (True, False):
            x = rng.integers(0, 256, (m + 2, n), dtype=np.uint8)
            w = rng.integers(0, 256, (n, n), dtype=np.uint8)
            rows = rng.permutation(m + 2)[:m].astype(np.int64)
            acc = rng.integers(-2**31, 2**31, (m + 1, n)).astype(np.int32)
            want = oracle(x, rows, w, signed_x, signed_w, acc, 1, False)
            run_kernel(x, rows, w, signed_x, signed_w, acc, 1, False, level, threads)
            assert np.array_equal(acc, want), (signed_x, signed_w)


# ------------------------------------------------------------------ 16-bit, one pass (VNNI)
needs_vnni = pytest.mark.skipif(native.cpu_level() < native.LEVEL_VNNI,
                                reason="no AVX-512 VNNI or no C compiler on this machine")


def value16(low, high, signed, wide):
    """An operand's values: 8-bit (low), or 16-bit from its low (unsigned) and high bytes."""
    if not wide:
        return (low.view(np.int8) if signed else low).astype(np.int64)
    return low.astype(np.int64) + 256 * (high.view(np.int8) if signed else high).astype(np.int64)


def run_and_oracle16(ub, rows, low, high, signed_x, wide_x, signed_w, wide_w, acc, acc_row,
                     overwrite, threads=1):
    """(acc after the one-pass kernel, the int64 oracle's result)."""
    x = value16(ub[rows], ub[rows + 1] if wide_x else None, signed_x, wide_x)
    w = value16(low, high, signed_w, wide_w)
    want = acc.astype(np.int64)
    end = acc_row + len(rows)
    want[acc_row:end] = x @ w if overwrite else want[acc_row:end] + x @ w
    n = low.shape[0]
    packed, bias = np.zeros(2 * n * n, np.int8), np.zeros(n, np.int32)
    native.pack_tile16(low, high, signed_w, wide_w, signed_x, wide_x, packed, bias)
    native.mmc_rows16(ub, rows, len(rows), packed, bias, signed_x, wide_x, signed_w, wide_w,
                      acc, acc_row, overwrite, threads)
    return acc, wrap32(want)


WIDTHS = [(True, False), (False, True), (True, True)]      # (16-bit input, 16-bit weights)


@needs_vnni
@pytest.mark.parametrize("wide_x, wide_w", WIDTHS)
@pytest.mark.parametrize("n, m, threads", [
    (16, 1, 1), (16, 7, 1), (48, 13, 1), (80, 25, 1), (144, 49, 1), (256, 301, 1),
    (256, 300, 2)])                    # 2 x 300 x 256^2 >= SPLIT_MACS: shared
def test_16bit_kernel_matches_int64_oracle(wide_x, wide_w, n, m, threads):
    """H, D and HD in one vpdpwssd pass: every signedness, overwriting and accumulating,
    gathered rows (a 16-bit input's high bytes in the row after its low bytes)."""
    rng = np.random.default_rng(n * 100 + m)
    for signed_x in (True, False):
        for signed_w in (True, False):
            for overwrite in (True, False):
                ub = rng.integers(0, 256, (m + 6, n), dtype=np.uint8)
                rows = rng.integers(0, m + 5, m).astype(np.int64)
                low = rng.integers(0, 256, (n, n), dtype=np.uint8)
                high = rng.integers(0, 256, (n, n), dtype=np.uint8)
                acc = rng.integers(-2**31, 2**31, (m + 3, n)).astype(np.int32)
                got, want = run_and_oracle16(ub, rows, low, high, signed_x, wide_x, signed_w,
                                             wide_w, acc, 2, overwrite, threads)
                assert np.array_equal(got, want), (signed_x, signed_w, overwrite)


@needs_vnni
@pytest.mark.parametrize("x_bytes, w_bytes, signed_x, signed_w", [
    ((0x00, 0x80), (0x00, 0x80), True, True),       # -32768 * -32768: pair sums of 2^31
    ((0xFF, 0x7F), (0x00, 0x80), True, True),
    ((0xFF, 0xFF), (0xFF, 0xFF), False, False),     # 65535 * 65535 * 1024
    ((0xFF, 0xFF), (0x00, 0x80), False, True),
    ((0x00, 0x80), (0xFF, 0xFF), True, False)])
def test_16bit_kernel_extremes_wrap_like_the_accumulators(x_bytes, w_bytes, signed_x,
                                                          signed_w):
    n = 1024
    ub = np.array([[x_bytes[0]] * n, [x_bytes[1]] * n] * 2, np.uint8)
    rows = np.array([0, 2], np.int64)
    low, high = np.full((n, n), w_bytes[0], np.uint8), np.full((n, n), w_bytes[1], np.uint8)
    acc = np.array([[2**31 - 1] * n, [-2**31] * n], np.int32)
    got, want = run_and_oracle16(ub, rows, low, high, signed_x, True, signed_w, True, acc, 0,
                                 False)
    assert np.array_equal(got, want)


@needs_vnni
def test_vnni_probe_counts_its_instructions():
    assert native.vnni_probe(1000) == 12 * 1000


def _big_case(seed):
    """Operands of a call big enough to be shared among threads, and its expected result."""
    rng = np.random.default_rng(seed)
    n, m = 256, 700
    x = rng.integers(0, 256, (m, n), dtype=np.uint8)
    w = rng.integers(0, 256, (n, n), dtype=np.uint8)
    rows = np.arange(m, dtype=np.int64)
    acc = np.zeros((m, n), np.int32)
    return x, w, rows, acc, oracle(x, rows, w, True, True, acc, 0, True)


def _threaded_case(seed=0):
    """run() makes the big call on two threads and says whether it came out exact."""
    x, w, rows, acc, want = _big_case(seed)

    def run():
        run_kernel(x, rows, w, True, True, acc, 0, True, native.cpu_level(), threads=2)
        return np.array_equal(acc, want)
    return run


@needs_int8
def test_kernel_helpers_started_later_wait_for_their_own_job():
    """A helper started after earlier jobs (a call asking for more threads than before)
    starts from the current job number: it neither redoes a finished job nor takes the
    next one before it is posted.  Every call exact."""
    x, w, rows, acc, want = _big_case(5)
    for threads in (2, 3, 2, 5, 4, 8, 2):
        acc[:] = 0
        run_kernel(x, rows, w, True, True, acc, 0, True, native.cpu_level(), threads=threads)
        assert np.array_equal(acc, want), threads


def _child_runs_threaded_kernel(queue):
    queue.put(_threaded_case(1)())


@needs_int8
def test_kernel_threads_survive_fork():
    """The helper threads do not exist in a forked child: it starts its own."""
    import multiprocessing
    assert _threaded_case()()                                    # the parent's helpers are running
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_runs_threaded_kernel, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "the forked child hung or failed"
    assert queue.get(timeout=5) is True


@needs_int8
def test_kernel_called_from_two_threads_at_once():
    """Two callers at once (ctypes releases the GIL during the call): one gets the helper
    threads, the other works alone; both results are exact."""
    import ctypes
    import threading
    lib = native.library()
    lib.tpuasm_i8_mmc.restype = None
    results = []

    def call(seed):
        x, w, rows, acc, want = _big_case(seed)
        m, n = x.shape
        packed, bias = np.zeros(2 * n * n, np.int8), np.zeros(n, np.int32)
        level = native.cpu_level()
        native.pack_tile(w, True, True, level, packed, bias)
        p = ctypes.c_void_p
        for _ in range(5):
            lib.tpuasm_i8_mmc(p(x.ctypes.data), p(rows.ctypes.data), ctypes.c_int64(m),
                              ctypes.c_int64(n), ctypes.c_int64(0), p(packed.ctypes.data),
                              p(bias.ctypes.data),
                              1, 1, p(acc.ctypes.data), ctypes.c_int64(0), 1, 0, level, 2)
        results.append(np.array_equal(acc, want))

    threads = [threading.Thread(target=call, args=(seed,)) for seed in (3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True, True]


def I(key, flags="", repeat=1, **operands):
    spec = ISA_TABLE.instructions[key]
    return Instruction(key, spec.flag_bits(flags), repeat, dict(operands))


def mlp(batch=300):
    body = []
    for layer, flags in enumerate(["SO", "SOU", "SOW", "SOUW"]):
        src, dst = (0, batch) if layer % 2 == 0 else (batch, 0)
        body += [I("RW", tile=layer), I("MMC", flags, ub=src, acc=0, length=batch),
                 I("MMC", "U", ub=src, acc=batch, length=batch // 2),
                 I("ACT", "R", acc=0, ub=dst, length=batch)]
    for flags in ("SOHD", "SH", "SOD", "SOHDUW"):       # 16-bit: two or four byte passes
        body += [I("RW", tile=0), I("RW", tile=1)] if "D" in flags else [I("RW", tile=2)]
        body += [I("MMC", flags, ub=0, acc=batch, length=batch // 2)]
    return Program(body + [I("HLT")])


def run_machine(monkeypatch, setting: str):
    monkeypatch.setenv("TPUASM_INT8", setting)
    m = Machine()
    rng = np.random.default_rng(7)
    weights = rng.integers(-128, 128, (4, 256, 256)).astype(np.int8)
    m.load(mlp(), weights=weights)
    m.ub[:300] = rng.integers(0, 256, (300, 256), dtype=np.uint8)
    result = m.run()
    assert result.status == "halted", result
    return m


@needs_int8
def test_machine_results_equal_on_every_path(monkeypatch):
    runs = {setting: run_machine(monkeypatch, setting) for setting in ("", "avx2", "0")}
    assert runs[""]._scratch.options[2] == native.cpu_level()
    assert runs["avx2"]._scratch.options[2] == native.LEVEL_AVX2
    assert runs["0"]._scratch.options[2] == native.LEVEL_NONE
    float_path = runs["0"]
    for m in runs.values():
        assert np.array_equal(m.acc, float_path.acc) and np.array_equal(m.ub, float_path.ub)
        assert m.cycle == float_path.cycle and m.counters() == float_path.counters()


def test_the_int8_path_is_refused_where_it_cannot_run(monkeypatch):
    with pytest.raises(RuntimeError, match="multiple of 16"):
        K.make_scratch(8, int8_level=native.LEVEL_AVX2)
    with pytest.raises(RuntimeError, match="this one"):
        K.make_scratch(16, int8_level=native.cpu_level() + 1)
    assert K.make_scratch(8).options[2] == 0             # by default: the float path
    for off in ("0", "off", "no"):
        monkeypatch.setenv("TPUASM_INT8", off)
        assert native.level() == 0 and K.make_scratch(256).options[2] == 0


def test_thread_count_setting(monkeypatch):
    monkeypatch.setenv("TPUASM_INT8_THREADS", "3")
    assert native.threads() == 3 and K.make_scratch(16).options[3] == 3
    monkeypatch.setenv("TPUASM_INT8_THREADS", "100")
    assert native.threads() == native.MAX_THREADS
    monkeypatch.setenv("TPUASM_INT8_THREADS", "many")     # not a number: the default
    assert 1 <= native.threads() <= native.MAX_THREADS


def test_without_the_library_the_jit_links_and_the_float_path_serves(tmp_path):
    """No C compiler in a fresh process: one warning, the kernel's names bound to
    stand-ins so that numba's code links, and MatrixMultiply exact on the float path."""
    setup = f"""
        from pathlib import Path
        from tpuasm.machine import native
        native.directory = lambda: Path({str(tmp_path)!r}) / "native-x"
        native._compiler = lambda: ["false"]
    """
    out = exact_mmc_in_fresh_process(
        setup, "assert native.library() is None and s.options[2] == 0")
    assert out.returncode == 0, out.stderr
    assert "exact" in out.stdout
    assert out.stderr.count("int8 MatrixMultiply kernel is unavailable") == 1


def test_a_failed_build_is_noted_and_the_float_path_serves(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "directory", lambda: tmp_path / "native-x")
    monkeypatch.setattr(native, "_compiler", lambda: ["false"])
    monkeypatch.setattr(native, "_library", None)
    with pytest.warns(RuntimeWarning, match="int8 MatrixMultiply kernel is unavailable"):
        assert native.library() is None
    assert (tmp_path / "native-x" / "FAILED").read_text().startswith("RuntimeError")
    assert not list(tmp_path.glob("lock-*")) and not list(tmp_path.glob("building-*"))
    assert native.cpu_level() == 0 and K.make_scratch(256).options[2] == 0
    monkeypatch.setattr(native, "_library", None)        # a later process: no second try
    assert native.library() is None

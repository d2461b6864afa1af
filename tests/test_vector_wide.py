"""VADD / VMUL with 16-bit operands (flags X, Y, Z: A, B, C int16, two UB rows a vector;
spec/isa.md 5.11): values worked out by hand, every engine (the pipeline on the JIT and
ahead-of-time cores, the data path, batches as lanes) against the reference model on
every legal width combination, the UB rows touched (footprints, exact rows, address
faults), the timing formula, the assembler's diagnostics and the faults of hand-made
binaries."""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

from tpuasm.assembler import assemble
from tpuasm.errors import AssemblyError
from tpuasm.isa import ISA_TABLE
from tpuasm.machine import Machine, MachineConfig, aot
from tpuasm.machine.access import AccessMap
from tpuasm.machine.reference import run_reference

from _machine_programs import I, cfg, program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from vector_exactness import from_rows, to_rows  # noqa: E402

N = 8
ACT_LAT = 16
SPEC = ISA_TABLE.instructions["VADD"]


def wide_rows(values):
    """Two host rows (low bytes, high bytes) of one int16 vector of N values."""
    v = np.zeros(N, np.int64)
    v[:len(values)] = values
    return list(to_rows(v, True, N))


def byte_row(values, dtype=np.int8):
    v = np.zeros(N, dtype)
    v[:len(values)] = values
    return [v.view(np.uint8)]


def host_of(*vectors):
    return np.array([r for rows in vectors for r in rows], np.uint8)


def int16_at(m, row, count):
    """The int16 vector whose low bytes are UB row `row` (its high bytes row + 1)."""
    return from_rows(m.ub[row:row + 2], np.int16, N)[:count].tolist()


def both(prog, host):
    """Run on the emulator and the reference; their UBs and faults must agree."""
    m = Machine.for_program(prog)
    m.load(prog, host=host)
    r = m.run()
    ref = run_reference(prog, host)
    assert (r.fault.kind if r.fault else None) == ref.fault_kind, (r, ref.fault_message)
    assert np.array_equal(m.ub, ref.ub)
    return m, r, ref


def small(*code, ub_rows=64):
    return program(*code, I("HLT"), array_size=N, ub_rows=ub_rows, acc_rows=8)


# ------------------------------------------------------------------ values by hand


def test_sixteen_bit_add_saturates_to_int16():
    a = [30000, -30000, 1000, -1, 12345, 32767]
    b = [10000, -10000, -3000, 1, 0, -32768]
    host = host_of(wide_rows(a), wide_rows(b))
    m, _, _ = both(small(I("RHM", host=0, ub=0, length=4),
                         I("VADD", "XYZ", a=0, b=2, c=10, length=1)), host)
    assert int16_at(m, 10, 6) == [32767, -32768, -2000, 0, 12345, -1]


def test_gate_times_cell_state_with_a_negative_zero_point():
    # f (int8) * c (int16, zero point -1000) * 3 / 2^2 -> int16, rounding half to even:
    #   10 * 0 * 3 = 0;  -5 * 3000 * 3 = -45000 -> -11250;  127 * 32000 * 3 / 4 saturates;
    #   1 * 1 * 3 / 4 = 0.75 -> 1;  -1 * 2 * 3 / 4 = -1.5 -> -2;  3 * 2 * 3 / 4 = 4.5 -> 4
    f = [10, -5, 127, 1, -1, 3]
    c = [-1000, 2000, 31000, -999, -998, -998]
    host = host_of(byte_row(f), wide_rows(c))
    m, _, _ = both(small(I("RHM", host=0, ub=0, length=3), cfg("vec_zero_b", -1000),
                         cfg("vec_mult_a", 3), cfg("vec_shift", 2),
                         I("VMUL", "YZ", a=0, b=1, c=10, length=1)), host)
    assert int16_at(m, 10, 6) == [0, -11250, 32767, 1, -2, 4]


def test_broadcast_b_at_sixteen_bits_is_one_vector_of_two_rows():
    # B's int16 vector (rows 8, 9) for both vectors of both iterations (a at rows 0, 1 and
    # 4, 5: rep_ub_stride 4, c's two 16-bit vectors per iteration); row 10, which a second
    # vector of B would start with, is not read
    a = [[100, -100, 7], [-128, 127, 0], [1, 2, 3], [50, 60, 70]]
    k = [1000, -1000, 32760]
    blank = byte_row([])
    host = host_of(byte_row(a[0]), byte_row(a[1]), blank, blank, byte_row(a[2]),
                   byte_row(a[3]), blank, blank, wide_rows(k), byte_row([99, 99, 99]))
    m, _, _ = both(small(I("RHM", host=0, ub=0, length=11), cfg("rep_ub_stride", 4),
                         I("VADD", "BYZ", repeat=2, a=0, b=8, c=20, length=2)), host)
    # 1100 -1100 32767(+7), 872 -873 32760, 1001 -998 32763, 1050 -940 32767(+70)
    assert [int16_at(m, 20 + 2 * r, 3) for r in range(4)] == [
        [1100, -1100, 32767], [872, -873, 32760], [1001, -998, 32763], [1050, -940, 32767]]


def test_lookup_table_reads_the_byte_of_a_sixteen_bit_input():
    # tanh of a 16-bit cell state: VADD.XL c, c, h with vec_mult_b = 0 and a shift to the
    # table's scale; TABLE[b] = 255 - b here.  A / 4: 75, -75, 12 (12.5 to even), 500 -> 127
    table_rows = 256 // N
    table = np.arange(255, -1, -1, dtype=np.uint8).reshape(table_rows, N)
    host = np.concatenate([host_of(wide_rows([300, -300, 50, 2000])), table])
    m, _, _ = both(small(I("RHM", host=0, ub=0, length=2 + table_rows),
                         cfg("act_table", 2), cfg("vec_mult_b", 0), cfg("vec_shift", 2),
                         I("VADD", "XL", a=0, b=0, c=40, length=1)), host)
    assert m.ub[40][:4].tolist() == [255 - 75, 255 - (-75 & 0xFF), 255 - 12, 255 - 127]


def test_the_largest_products_stay_exact_in_int64():
    # |A - z| = 2^16 - 1 both sides and |vec_mult_a| = 2^31: |t| = 2^63 - 2^48 + 2^31, the
    # bound spec/isa.md 5.11 gives; t / 2^62 is -1.99994 -> -2 and, with 2^31 - 1, +2
    extremes = [-32768, 32767]
    host = host_of(wide_rows(extremes), wide_rows(extremes))
    for mult, zero, want in ((-(1 << 31), 32767, [-2, 0]), ((1 << 31) - 1, 32767, [2, 0]),
                             (-(1 << 31), -32768, [0, -2])):
        m, _, _ = both(small(I("RHM", host=0, ub=0, length=4), cfg("vec_mult_a", mult),
                             cfg("vec_shift", 62), cfg("vec_zero_a", zero),
                             cfg("vec_zero_b", zero),
                             I("VMUL", "XYZ", a=0, b=2, c=10, length=1)), host)
        exact = [round((x - zero) * (x - zero) * mult / 2 ** 62) for x in extremes]
        assert int16_at(m, 10, 2) == want == exact
        assert abs((extremes[0] - zero) ** 2 * mult) < 2 ** 63


def test_unsigned_applies_to_the_eight_bit_operands_only():
    # VADD.UX: A int16 (always signed), B and C uint8
    host = host_of(wide_rows([-5, 300, -300]), byte_row([250, 250, 250], np.uint8))
    m, _, _ = both(small(I("RHM", host=0, ub=0, length=3),
                         I("VADD", "UX", a=0, b=2, c=10, length=1)), host)
    assert m.ub[10][:3].tolist() == [245, 255, 0]


def test_in_place_on_a_sixteen_bit_operand_reads_each_vector_before_writing_it():
    # c = c + 1 on an int16 vector pair, in place (the LSTM's c chain)
    host = host_of(wide_rows([1, -1, 32767]), wide_rows([5, 6, 7]), byte_row([1, 1, 1]))
    m, _, _ = both(small(I("RHM", host=0, ub=0, length=5),
                         I("VADD", "XBZ", a=0, b=4, c=0, length=2)), host)
    assert int16_at(m, 0, 3) == [2, 0, 32767] and int16_at(m, 2, 3) == [6, 7, 8]


# ------------------------------------------------------------------ every engine


def _legal_flag_sets():
    letters = "UBLXYZ"
    for k in range(len(letters) + 1):
        for chosen in itertools.combinations(letters, k):
            bits = SPEC.flag_bits("".join(chosen))
            if SPEC.flag_conflict(bits) is None:
                yield "".join(chosen)


FLAG_SETS = list(_legal_flag_sets())


def _random_program(rng, flags, ub_rows=160):
    """Both operations with these flags, random registers (zero points over int16, shifts
    and multipliers as a requantization sets them), repeats, in place or disjoint rows;
    the operands come from the host, the results go back to it."""
    bits = SPEC.flag_bits(flags)
    per_a, per_b, per_c = (SPEC.rows_per_vector(bits, x) for x in "abc")
    table_rows = 256 // N
    code = [I("RHM", host=0, ub=0, length=ub_rows), cfg("act_table", ub_rows - table_rows)]
    for key in ("VADD", "VMUL"):
        length, repeat = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        step = 2 * length        # iterations two vectors apart at the widest
        k = int(rng.choice([0, 3, 15, 31]))
        code += [cfg("rep_ub_stride", step), cfg("vec_shift", k),
                 cfg("vec_mult_a", int(rng.integers(-(1 << 31), 1 << 31)) >> (31 - min(k + 1, 31))),
                 cfg("vec_mult_b", int(rng.integers(-(1 << 20), 1 << 20))),
                 cfg("vec_zero_a", int(rng.integers(-32768, 32768)) >> int(rng.choice([0, 8]))),
                 cfg("vec_zero_b", int(rng.integers(-32768, 32768)) >> int(rng.choice([0, 8]))),
                 cfg("vec_zero_c", int(rng.integers(-300, 300)))]
        span = step * repeat + 2 * length        # the rows any operand's iterations cover
        a, b, c = 0, span, 2 * span
        if rng.random() < 0.4 and per_c == per_a:
            c = a                                 # in place
        code.append(I(key, flags, repeat=repeat, a=a + (key == "VMUL") * 3 * span,
                      b=b + (key == "VMUL") * 3 * span, c=c + (key == "VMUL") * 3 * span,
                      length=length))
    code.append(I("WHM", ub=0, host=0, length=ub_rows - table_rows))
    host = rng.integers(0, 256, (ub_rows, N)).astype(np.uint8)
    return small(*code, ub_rows=ub_rows), host


def _run(prog, host, use_aot, monkeypatch):
    with monkeypatch.context() as mp:
        if not use_aot:
            mp.setattr(aot, "runner", lambda args: None)
        m = Machine.for_program(prog)
        m.load(prog, host=host)
        r = m.run()
    return m, r


@pytest.mark.parametrize("flags", FLAG_SETS)
def test_every_engine_equals_the_reference_on_every_width_combination(flags, monkeypatch):
    rng = np.random.default_rng(sum(map(ord, flags)) + 17)
    prog, host = _random_program(rng, flags)
    ref = run_reference(prog, host)
    assert ref.fault_kind is None, ref.fault_message
    engines = [False] + ([True] if aot.load() is not None else [])
    for use_aot in engines:
        m, r = _run(prog, host, use_aot, monkeypatch)
        assert r.status == "halted", r
        np.testing.assert_array_equal(m.ub, ref.ub, err_msg=f"aot={use_aot}")
        np.testing.assert_array_equal(m.host, ref.host)
    data = Machine.for_program(prog)
    data.load(prog, host=host)
    got = data.run_data()
    assert got.status == "halted" and got.cycle == r.cycle
    np.testing.assert_array_equal(data.ub, ref.ub, err_msg="data path")
    # batches as lanes: this image and a second one, each its own fresh reference run
    other = np.random.default_rng(5).integers(0, 256, host.shape).astype(np.uint8)
    hosts = np.stack([host, other])
    laned = Machine.for_program(prog)
    laned.load(prog, host=host)
    assert laned.run_batches(hosts, lanes=2).status == "halted"
    assert laned._lane_memory(2, 2) is not None          # the lanes path served
    np.testing.assert_array_equal(hosts[0], ref.host, err_msg="lane 0")
    np.testing.assert_array_equal(hosts[1], run_reference(prog, other).host, err_msg="lane 1")


def test_the_random_programs_compute_more_than_saturation():
    # the engine test above would pass on all-rails results: most int16 results are not
    prog, host = _random_program(np.random.default_rng(1), "XYZ")
    ref = run_reference(prog, host)
    values = np.concatenate([
        from_rows(ref.ub[ins["c"]:ins["c"] + 2 * ins["length"]], np.int16, N)
        for ins in prog.instructions if ins.key in ("VADD", "VMUL")])
    assert np.count_nonzero(np.abs(values + 0.5) < 32767) > len(values) // 2


# ------------------------------------------------------------------ rows and timing


def test_rows_touched_double_for_each_sixteen_bit_operand():
    """VADD.XBYZ repeat=2 at rep_ub_stride 10: a reads 0..3 and 10..13 (two vectors of two
    rows), B's vector rows 30, 31 once, c writes 40..43 and 50..53."""
    prog = program(cfg("rep_ub_stride", 10), I("VADD", "XBYZ", repeat=2, a=0, b=30, c=40,
                                                length=2), I("HLT"),
                   array_size=N, ub_rows=64, acc_rows=8)
    m = Machine.for_program(prog)
    m.load(prog, host=np.zeros((4, N), np.uint8))
    amap = AccessMap(m)
    rows: dict = {}
    for i, mem, w, lo, hi in zip(amap.index, amap.mem, amap.write, amap.lo, amap.hi):
        rows.setdefault((int(i), bool(w)), set()).update(range(int(lo), int(hi)))
    assert rows[(1, False)] == {0, 1, 2, 3, 10, 11, 12, 13, 30, 31}
    assert rows[(1, True)] == {40, 41, 42, 43, 50, 51, 52, 53}
    assert m.run().status == "halted"
    assert [a.index for a in amap.history("ub", 53, write=True)] == [1]
    assert amap.history("ub", 54, write=True) == []


@pytest.mark.parametrize("bad, flags, row, address", [
    ("c", "Z", 62, 64), ("a", "X", 62, 64), ("b", "Y", 62, 64), ("b", "BY", 63, 64),
    ("b", "B", 63, None), ("c", "", 62, None)])
def test_address_fault_names_the_high_row_of_a_sixteen_bit_vector(bad, flags, row, address):
    # two vectors from row 62: at 16 bits the second one is rows 64, 65 (B's one vector
    # from row 63: rows 63, 64)
    rows = {"a": 0, "b": 10, "c": 20}
    rows[bad] = row
    prog = small(I("VADD", flags, length=2, **rows))
    m = Machine.for_program(prog)
    m.load(prog)
    r = m.run()
    ref = run_reference(prog, np.zeros((1, N), np.uint8))
    if address is None:
        assert r.status == "halted" and ref.fault_kind is None
        return
    assert r.fault.kind == ref.fault_kind == "address"
    assert f"address {address} out of range 0..63" in str(r.fault)
    assert f"address {address} out of range" in ref.fault_message


def _times(flags, repeat, length, **operands):
    prog = program(I("RHM", host=0, ub=0, length=8), cfg("rep_ub_stride", 40),
                   I("VADD", flags, repeat=repeat, length=length, **operands), I("HLT"))
    m = Machine(MachineConfig())
    m.load(prog, host=np.zeros((16, 256), np.int8))
    assert m.run().status == "halted"
    issue, start, finish = (int(x) for x in m.times[2])
    return finish - start


@pytest.mark.parametrize("flags, reads, writes", [
    ("", 2, 1), ("X", 3, 1), ("XY", 4, 1), ("XYZ", 4, 2), ("Z", 2, 2), ("YZ", 3, 2)])
def test_timing_counts_two_rows_for_each_sixteen_bit_operand(flags, reads, writes):
    # spec/timing.md 4: act_latency + max(rows read, rows written): 3 vectors x 2 iterations
    assert _times(flags, 2, 3, a=100, b=200, c=300) == ACT_LAT + 6 * max(reads, writes)


@pytest.mark.parametrize("flags, cycles", [
    ("B", 6 + 1), ("BY", 6 + 2), ("BZ", 12), ("BXZ", 12 + 1), ("BXYZ", 12 + 2)])
def test_timing_with_broadcast_reads_b_once_and_writes_may_dominate(flags, cycles):
    # a: 6 vectors (x2 rows with X); B's one vector once; c: 6 vectors (x2 with Z);
    # the read and write ports run side by side, so the larger count
    assert _times(flags, 2, 3, a=100, b=200, c=300) == ACT_LAT + cycles


def test_timing_with_the_table_adds_its_rows():
    assert _times("XL", 1, 4, a=100, b=200, c=300) == ACT_LAT + 4 * 3 + 1


# ------------------------------------------------------------------ diagnostics and faults


def diagnostics(source):
    with pytest.raises(AssemblyError) as e:
        assemble(source + "\n")
    return str(e.value)


@pytest.mark.parametrize("source, message", [
    ("VADD.LZ 0, 8, 16, 2", "flags LZ cannot be combined: the 256-byte table maps bytes, "
                            "and a 16-bit C has two per element"),
    ("VMUL.UXYZ 0, 8, 16, 2", "flags UXYZ cannot be combined: U applies to 8-bit operands "
                              "only, and X, Y and Z make all three 16-bit"),
    ("VADD.Z 0, 8, 1, 2", "VADD destination rows 1..4 overlap operand 'a' rows 0..1"),
    ("VADD.X 0, 8, 0, 2", "VADD destination rows 0..1 overlap operand 'a' rows 0..3 without "
                          "being the same rows (in place is allowed on an operand of the "
                          "same width"),
    ("VADD.YZ 0, 4, 5, 2", "VADD destination rows 5..8 overlap operand 'b' rows 4..7"),
])
def test_bad_combinations_are_assembly_errors(source, message):
    assert message in diagnostics(source)


def test_good_combinations_assemble():
    p = assemble("VADD.XZ 0, 8, 0, 2\n"        # in place at 16 bits
                 "VMUL.YZ 20, 8, 8, 2\n"       # in place on b at 16 bits
                 "VADD.BY 0, 30, 40, 2\n"      # B: one 16-bit vector, rows 30, 31
                 "VADD.BYZ 0, 41, 42, 2\n"     # B read once, before any write: may overlap
                 "VMUL.UX 0, 50, 60, 2\nVADD.XL 0, 0, 60, 2\n"
                 "VMUL.XZ 0, 3, 16, 2\nHLT\n")   # a, b overlap freely: squares, doubles
    assert [i.flag_letters for i in p.instructions[:7]] == ["XZ", "YZ", "BY", "BYZ", "UX",
                                                            "LX", "XZ"]


@pytest.mark.parametrize("flags", ["LZ", "ULZ", "UXYZ", "UBXYZ"])
def test_forbidden_flags_in_a_binary_are_invalid_instructions(flags):
    prog = small(I("VADD", flags, a=0, b=8, c=16, length=1))
    m = Machine.for_program(prog)
    m.load(prog)
    r = m.run()
    ref = run_reference(prog, np.zeros((1, N), np.uint8))
    assert r.fault.kind == ref.fault_kind == "invalid_instruction" and r.fault.index == 0
    assert "cannot be combined" in ref.fault_message


@pytest.mark.parametrize("flags", ["X", "Y", "Z"])
def test_vec_float_with_a_sixteen_bit_operand_is_a_config_fault(flags):
    prog = small(cfg("vec_float", 1), I("VMUL", flags, a=0, b=8, c=16, length=1),
                 I("VMUL", a=0, b=8, c=16, length=1))
    m = Machine.for_program(prog)
    m.load(prog)
    r = m.run()
    ref = run_reference(prog, np.zeros((1, N), np.uint8))
    assert r.fault.kind == ref.fault_kind == "config" and r.fault.index == 1
    assert "vec_float = 1 computes 8-bit operands only" in str(r.fault)
    assert "vec_float = 1 computes 8-bit operands only" in ref.fault_message


def test_hover_names_the_width_flags_and_the_forbidden_sets():
    from tpuasm.lsp.hover import instruction
    text = instruction(SPEC, "XZ")
    assert "**`X` wide_a**" in text and "**`Z` wide_c**" in text and "`Y` wide_b" in text
    assert "not U, X, Y, Z together" in text


# ------------------------------------------------------------------ an LSTM cell at 16 bits


def _lstm_cell(wide, gates, c_real, vectors):
    """programs/lstm_cell's gate arithmetic on UB data (i, f, o at scale 1/256, zero point
    -128; g at 1/128): c' = f * c + i * g, then h = o * tanh(c') through the 256-byte table
    round(128 tanh(v / 32)).  The cell state c is int8 at 1/32 or (wide) int16 at 2^-11,
    so f * c (VMUL.YZ), i * g (VMUL.Z) and their sum (VADD.XYZ) stay 16-bit, and the
    tanh's input is the 16-bit c' shifted to the table's 1/32 (VADD.XL).  Returns the
    real c' and h and the quantized c the cell started from."""
    c_scale = 2.0 ** -11 if wide else 1 / 32
    lo, hi = (-32768, 32767) if wide else (-128, 127)
    c_q = np.clip(np.rint(c_real / c_scale), lo, hi).astype(np.int64)
    v = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float64)
    table = np.clip(np.rint(128 * np.tanh(v / 32)), -128, 127).astype(np.int8).view(np.uint8)
    per = 2 if wide else 1
    rows = {"i": 0, "f": vectors, "g": 2 * vectors, "o": 3 * vectors, "c": 4 * vectors}
    rows["t1"] = rows["c"] + per * vectors
    rows["t2"] = rows["t1"] + per * vectors
    rows["tc"] = rows["t2"] + per * vectors
    rows["h"] = rows["tc"] + vectors
    rows["table"] = rows["h"] + vectors
    total = rows["table"] + 256 // N

    host = np.zeros((total, N), np.uint8)
    for name in "ifgo":
        host[rows[name]:rows[name] + vectors] = to_rows(gates[name], False, N)
    host[rows["c"]:rows["c"] + per * vectors] = to_rows(c_q, wide, N)
    host[rows["table"]:] = table.reshape(-1, N)
    z = "Z" if wide else ""
    code = [I("RHM", host=0, ub=0, length=total), cfg("act_table", rows["table"]),
            cfg("vec_zero_a", -128), cfg("vec_mult_a", 1 << 30), cfg("vec_shift", 38),
            I("VMUL", "Y" + z if wide else "", a=rows["f"], b=rows["c"], c=rows["t1"],
              length=vectors),
            cfg("vec_shift", 34 if wide else 40),
            I("VMUL", z, a=rows["i"], b=rows["g"], c=rows["t2"], length=vectors),
            cfg("vec_zero_a", 0), cfg("vec_mult_a", 1), cfg("vec_shift", 0),
            I("VADD", "XY" + z if wide else "", a=rows["t1"], b=rows["t2"], c=rows["c"],
              length=vectors),
            cfg("vec_mult_b", 0), cfg("vec_shift", 6 if wide else 0),
            I("VADD", "XL" if wide else "L", a=rows["c"], b=rows["c"], c=rows["tc"],
              length=vectors),
            cfg("vec_zero_a", -128), cfg("vec_mult_a", 1 << 30), cfg("vec_shift", 38),
            I("VMUL", a=rows["o"], b=rows["tc"], c=rows["h"], length=vectors)]
    m, r, _ = both(program(*code, I("HLT"), array_size=N, ub_rows=total, acc_rows=8), host)
    assert r.status == "halted"
    c_new = from_rows(m.ub[rows["c"]:rows["c"] + per * vectors], np.int16 if wide else np.int8, N)
    h = from_rows(m.ub[rows["h"]:rows["h"] + vectors], np.int8, N)
    return c_new * c_scale, h / 128, c_q * c_scale


def test_an_lstm_cell_keeps_its_cell_state_at_sixteen_bits():
    # The float cell from the same quantized gates and each width's own quantized c is the
    # oracle.  At 8 bits c' is off by up to one LSB (1/32: f * c and i * g each rounded to
    # it) and saturates at +-3.97; at 16 bits it is within one 2^-11 LSB everywhere
    vectors = 128
    rng = np.random.default_rng(11)
    count = vectors * N
    gates = {k: rng.integers(-128, 128, count) for k in "ifgo"}
    sig = {k: (gates[k] + 128) / 256 for k in "ifo"}
    g = gates["g"] / 128
    c_real = rng.uniform(-4.5, 4.5, count)
    errors = {}
    for wide in (False, True):
        c_new, h, c_used = _lstm_cell(wide, gates, c_real, vectors)
        want_c = sig["f"] * c_used + sig["i"] * g
        want_h = sig["o"] * np.tanh(want_c)
        errors[wide] = (np.abs(c_new - want_c), np.abs(h - want_h), np.abs(want_c))
    c8, h8, size8 = errors[False]
    c16, h16, _ = errors[True]
    assert c16.max() <= 2.0 ** -11
    inside = size8 < 3.9
    assert 1 / 64 < c8[inside].max() <= 1 / 32         # the 8-bit cell's own rounding
    assert c8.max() > 0.5                                # and its saturation beyond +-3.97
    # h still goes through the 8-bit tanh table (input 1/32, output 1/128): what it
    # loses at 16 bits is that table's rounding alone
    assert h16.max() <= h8.max() and h16.mean() < h8.mean()
    print(f"\nc' max error: 8-bit {c8.max():.4f} (inside +-3.9: {c8[inside].max():.4f}), "
          f"16-bit {c16.max():.6f}; h mean error: 8-bit {h8.mean():.5f}, "
          f"16-bit {h16.mean():.5f}")

"""VADD and VMUL (spec/isa.md 5.11, spec/timing.md 4.1): values worked out by hand, both
engines (emulator and reference model), cycle counts from the timing formulas, the
scoreboard, the counters, faults and the assembler's diagnostics."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tpuasm.assembler import assemble
from tpuasm.errors import AssemblyError
from tpuasm.machine import Machine, MachineConfig
from tpuasm.machine.reference import run_reference
from tpuasm.machine.vector import fixed_point, qlinear_registers

from _machine_programs import I, cfg, program

ACT_LAT = 16
N = 8


def host_cycles(rows, n=256):
    return 700 + math.ceil(rows * n / (10 * 2 ** 30 / 700e6))


def both(prog, host, **config):
    """Run on the emulator and the reference; their UBs must agree.  Returns the machine."""
    m = Machine.for_program(prog, **config)
    m.load(prog, host=host)
    r = m.run()
    ref = run_reference(prog, host)
    assert (r.fault.kind if r.fault else None) == ref.fault_kind, (r, ref.fault_message)
    assert np.array_equal(m.ub, ref.ub)
    return m


def small(*code, ub_rows=32):
    return program(*code, I("HLT"), array_size=N, ub_rows=ub_rows, acc_rows=8)


def rows(*values):
    """Host rows of N int8 values each (a short list is padded with zeros)."""
    out = np.zeros((len(values), N), np.int8)
    for r, v in enumerate(values):
        out[r, :len(v)] = v
    return out


def signed(m, r):
    return m.ub[r].view(np.int8).tolist()


# ------------------------------------------------------------------ values


def test_reset_registers_give_saturating_add_and_multiply():
    host = rows([100, -100, 5, 127, -1], [50, -50, 7, 1, -128])
    m = both(small(I("RHM", host=0, ub=0, length=2), I("VADD", a=0, b=1, c=4, length=1),
                   I("VMUL", a=0, b=1, c=5, length=1)), host)
    assert signed(m, 4)[:5] == [127, -128, 12, 127, -128]
    assert signed(m, 5)[:5] == [127, 127, 35, 127, 127]          # -1 * -128 = 128 saturates


def test_requantization_rounds_half_to_even():
    # t = (A - 3) * 3 + B * -5, y = round_half_even(t / 4) - 7  (hand-computed below)
    a = [10, 11, 7, 10, 4, 6]
    b = [4, 4, 2, 3, 1, 3]
    #    t:  1  4  2  6 -2 -6   -> t/4: .25 1 .5 1.5 -.5 -1.5 -> 0 1 0 2 0 -2
    host = rows(a, b)
    m = both(small(I("RHM", host=0, ub=0, length=2), cfg("vec_mult_a", 3),
                   cfg("vec_mult_b", -5), cfg("vec_shift", 2), cfg("vec_zero_a", 3),
                   cfg("vec_zero_c", -7), I("VADD", a=0, b=1, c=2, length=1)), host)
    assert signed(m, 2)[:6] == [-7, -6, -7, -5, -7, -9]


def test_multiply_with_zero_points_and_unsigned_operands():
    # U: bytes are 0..255; (A - 200) * (B - 10) * 3 / 2^3, zero point 128, clip 0..255
    a = np.array([200, 210, 255, 190, 0], np.uint8)
    b = np.array([77, 14, 12, 20, 10], np.uint8)
    host = np.zeros((2, N), np.uint8)
    host[0, :5], host[1, :5] = a, b
    m = both(small(I("RHM", host=0, ub=0, length=2), cfg("vec_mult_a", 3), cfg("vec_shift", 3),
                   cfg("vec_zero_a", 200), cfg("vec_zero_b", 10), cfg("vec_zero_c", 128),
                   I("VMUL", "U", a=0, b=1, c=2, length=1)), host.view(np.int8))
    # t: 0, 120, 330, -300, 0 -> /8: 0, 15, 41.25, -37.5 (a tie: to even), 0
    #   -> 0, 15, 41, -38, 0, plus 128
    assert m.ub[2, :5].tolist() == [128, 143, 169, 90, 128]


def test_broadcast_lookup_in_place_and_repeat():
    # B: row 6 is added to every vector; L: every output byte goes through a table
    # (here b -> b ^ 0x0f); in place on a; two iterations 2 rows apart
    host = np.zeros((8 + 256 // N, N), np.int8)
    host[0:4] = np.arange(4 * N).reshape(4, N) % 50
    host[6] = 3
    table = (np.arange(256) ^ 0x0F).astype(np.uint8)
    host[8:] = table.reshape(-1, N).view(np.int8)
    m = both(program(I("RHM", host=0, ub=0, length=8 + 256 // N),
                     cfg("act_table", 8), cfg("rep_ub_stride", 2),
                     I("VADD", "BL", repeat=2, a=0, b=6, c=0, length=2), I("HLT"),
                     array_size=N, ub_rows=64, acc_rows=8), host)
    want = table[(host[0:4].astype(np.int64) + 3).astype(np.uint8)]
    assert np.array_equal(m.ub[0:4], want)


def test_one_minus_z_for_a_gru_needs_no_constant_row():
    # z = sigmoid output, int8 at scale 1/256, zero point -128; 1 - z in the same type:
    # vec_mult_a = -1, vec_mult_b = 0, vec_zero_c = -128 + 1/(1/256) = 128 (spec/isa.md 5.11)
    z = np.arange(-128, 128).reshape(-1, N).astype(np.int8)
    m = both(small(I("RHM", host=0, ub=0, length=len(z)), cfg("vec_mult_a", -1),
                   cfg("vec_mult_b", 0), cfg("vec_zero_a", -128), cfg("vec_zero_c", 128),
                   I("VADD", a=0, b=0, c=len(z), length=len(z)), ub_rows=128), z)
    real = 1 - (z.astype(float) + 128) / 256
    want = np.clip(np.rint(real * 256) - 128, -128, 127)
    assert np.array_equal(m.ub[len(z):2 * len(z)].view(np.int8), want)


def test_a_hand_made_shifted_overlap_reads_before_it_writes():
    # the assembler rejects c = a + 1; the machine defines it (every read first)
    host = rows([1, 2], [10, 20], [30, 40])
    m = both(small(I("RHM", host=0, ub=0, length=3), I("VADD", a=0, b=0, c=1, length=2)), host)
    assert signed(m, 1)[:2] == [2, 4] and signed(m, 2)[:2] == [20, 40]


def test_qlinear_registers_match_the_real_formula():
    regs = qlinear_registers("add", 0.02, 3, 0.05, -4, 0.1, 7)
    # 31-bit mantissa for the larger ratio (0.5), the smaller (0.2) at the same shift
    assert regs["vec_mult_b"] == 1 << 30 and regs["vec_shift"] == 31
    assert regs["vec_mult_a"] == round(0.2 * 2 ** 31)
    # a Sub's negative multiplier may use -2^31, one more bit
    sub = qlinear_registers("sub", 0.02, 0, 0.05, 0, 0.1, 0)
    assert (sub["vec_mult_b"], sub["vec_shift"]) == (-(1 << 31), 32)
    mults, shift = fixed_point([3e-6])
    assert shift == 49 and (1 << 30) <= mults[0] < (1 << 31)      # 31-bit mantissa
    mults, shift = fixed_point([1e-12])                            # the shift's cap, 62
    assert shift == 62 and mults == [round(1e-12 * 2 ** 62)]
    with pytest.raises(ValueError):
        fixed_point([2.0 ** 40])


# ------------------------------------------------------------------ timing


def vec_program(*code):
    return program(I("RHM", host=0, ub=0, length=8), *code, I("HLT"))


def _host():
    return np.random.default_rng(3).integers(-128, 128, (16, 256)).astype(np.int8)


def timed(prog, **config):
    m = Machine(MachineConfig(**config))
    m.load(prog, host=_host())
    r = m.run()
    assert r.status == "halted", r
    return m


def times(m, i):
    return tuple(int(x) for x in m.times[i])


@pytest.mark.parametrize("flags, extra", [("", 0), ("L", 1)])
def test_latency_two_cycles_per_row_after_the_operands_arrive(flags, extra):
    m = timed(vec_program(I("VADD", flags, a=0, b=4, c=10, length=4)))
    rhm = host_cycles(8)
    # the VADD issues in cycle 1 and waits in the activate stage for the RHM (RAW)
    assert times(m, 1) == (1, rhm, rhm + ACT_LAT + 2 * 4 + extra)
    c = m.counters()
    assert c["busy_activate"] == rhm + ACT_LAT + 8 + extra - 1
    assert c["non_matrix_cycles"] == c["cycles"] and c["array_active_cycles"] == 0


def test_broadcast_reads_its_constant_row_once_and_repeat_multiplies_rows():
    m = timed(vec_program(cfg("rep_ub_stride", 2), I("VMUL", "B", repeat=3, a=0, b=7, c=8,
                                                     length=2)))
    rhm = host_cycles(8)
    assert times(m, 2) == (2, rhm, rhm + ACT_LAT + 3 * 2 + 1)


def test_throughput_back_to_back_in_one_stage_with_activate():
    # independent vector operations and an Activate share the activate stage: each one
    # issues when the previous one has finished
    m = timed(vec_program(I("VADD", a=0, b=1, c=20, length=3), I("ACT", acc=0, ub=30, length=5),
                          I("VMUL", a=0, b=1, c=40, length=3)))
    rhm = host_cycles(8)
    v1 = rhm + ACT_LAT + 6
    assert times(m, 1) == (1, rhm, v1)
    assert times(m, 2) == (v1, v1, v1 + ACT_LAT + 5)
    assert times(m, 3) == (v1 + ACT_LAT + 5, v1 + ACT_LAT + 5, v1 + 2 * ACT_LAT + 5 + 6)


def test_matrix_multiply_reading_the_result_waits_and_counts_a_raw_stall():
    weights = np.random.default_rng(4).integers(-128, 128, (1, 256, 256)).astype(np.int8)
    # the VADD (1000 rows: 2000 cycles) finishes long after the tile is ready (~1607)
    prog = vec_program(I("RW", tile=0), I("VADD", a=0, b=4, c=1000, length=1000),
                       I("MMC", "SO", ub=1000, acc=0, length=4))
    m = Machine()
    m.load(prog, host=_host(), weights=weights)
    assert m.run().status == "halted"
    vadd_fin = times(m, 2)[2]
    assert vadd_fin == host_cycles(8) + ACT_LAT + 2000
    assert times(m, 3)[1] == vadd_fin                 # the MMC starts when the VADD is done
    mmc_issue = times(m, 3)[0]
    assert mmc_issue == 3                             # the matrix stage was free
    # a RAW stall counts from the MMC's issue, under its weight stall too (spec/timing.md 8)
    c = m.counters()
    assert c["raw_stall_cycles"] == vadd_fin - mmc_issue and c["input_stall_cycles"] == 0
    ref = run_reference(prog, _host(), weights)
    assert np.array_equal(m.acc, ref.acc) and np.array_equal(m.ub, ref.ub)


def test_strict_mode_calls_an_unsynchronized_operand_a_hazard():
    prog = vec_program(I("VADD", a=0, b=4, c=10, length=4))
    m = Machine(MachineConfig(hazards="error"))
    m.load(prog, host=_host())
    r = m.run()
    assert r.status == "fault" and r.fault.kind == "hazard" and r.fault.index == 1
    m = Machine(MachineConfig(hazards="error"))
    m.load(program(I("RHM", host=0, ub=0, length=8), I("SYNC"),
                   I("VADD", a=0, b=4, c=10, length=4), I("HLT")), host=_host())
    assert m.run().status == "halted"


def test_timing_only_run_has_the_same_times():
    prog = vec_program(I("VADD", "L", a=0, b=4, c=10, length=4), I("VMUL", a=10, b=0, c=10,
                                                                     length=4))
    full = timed(prog)
    fast = Machine(timing_only=True)
    fast.load(prog, host=_host())
    fast.run()
    assert np.array_equal(full.times, fast.times) and full.counters() == fast.counters()
    assert not fast.ub[10:14].any()


# ------------------------------------------------------------------ faults


@pytest.mark.parametrize("bad, first", [("a", 30), ("b", 30), ("c", 30)])
def test_address_fault_names_the_first_bad_row_a_then_b_then_c(bad, first):
    operands = {"a": 0, "b": 8, "c": 16}
    operands[bad] = 30                              # rows 30, 31, 32: 32 is past the UB
    prog = small(I("VADD", **operands, length=3))
    m = Machine.for_program(prog)
    m.load(prog)
    r = m.run()
    ref = run_reference(prog)
    assert r.fault.kind == ref.fault_kind == "address" and r.fault.index == 0
    assert "32" in str(r.fault) and "32" in ref.fault_message


def test_lookup_table_rows_are_checked_first():
    # the table (rows 60..91 for N = 8) and a (row 70) are both past the 64-row UB: the
    # table's first bad row, 64, is named (spec/isa.md 5.11)
    prog = small(cfg("act_table", 60), I("VADD", "L", a=70, b=0, c=8, length=1), ub_rows=64)
    ref = run_reference(prog)
    m = Machine.for_program(prog)
    m.load(prog)
    r = m.run()
    assert r.fault.kind == ref.fault_kind == "address" and r.fault.index == 1
    assert "address 64 " in ref.fault_message and "64" in str(r.fault)
    assert "address 70" not in str(r.fault)


# ------------------------------------------------------------------ assembler


def diagnostics(source):
    with pytest.raises(AssemblyError) as e:
        assemble(source)
    return str(e.value)


def test_shifted_overlap_is_an_error_with_a_caret_on_the_destination():
    text = diagnostics("    VADD 0, 4, 2, 4\n")
    assert "VADD destination rows 2..5 overlap operand 'a' rows 0..3" in text
    assert "overlap operand 'b' rows 4..7" in text
    assert "    1 |     VADD 0, 4, 2, 4\n      |                ^" in text


def test_in_place_disjoint_and_broadcast_overlaps_assemble():
    p = assemble("VADD 0, 4, 0, 4\nVMUL x=0, b=0, c=8, n=4\nVMUL.B 0, 9, 8, 4\nHLT\n"
                 .replace("x=", "a="))
    assert [i.key for i in p.instructions] == ["VADD", "VMUL", "VMUL", "HLT"]


@pytest.mark.parametrize("source, message", [
    ("VADD 0, 4, 8, 4096", "length 4096 out of range 1..4095 (VADD operand 'length')"),
    ("VADD 0, 4, 8, 0", "length 0 out of range 1..4095"),
    (".config ub_rows=2000000\nVMUL 0, 1048576, 8, 1",
     "UB address 1048576 out of range 0..1048575 (VMUL operand 'b')"),
    ("VADD 0, 98304, 8, 1", "UB address 98304 out of range 0..98303"),
    ("VADD.Q 0, 4, 8, 1", "VADD has no flag 'Q'; VADD has flags U, B, L, X, Y, Z"),
    ("VMUL 0, 4, 8", "VMUL takes a, b, c, length: missing length"),
    ("CFG vec_zero_a, 32768", "value 32768 out of range -32768..32767 for register vec_zero_a"),
    ("CFG vec_zero_b, -32769", "value -32769 out of range -32768..32767 for register vec_zero_b"),
    ("CFG vec_shift, 63", "value 63 out of range 0..62 for register vec_shift"),
])
def test_diagnostics(source, message):
    assert message in diagnostics(source + "\n")


# ------------------------------------------------------------------ editor support


def test_hover_and_formatter_know_the_vector_operations():
    from tpuasm.fmt import format_source
    from tpuasm.isa import ISA_TABLE
    from tpuasm.lsp.hover import instruction, register
    text = instruction(ISA_TABLE.lookup("Vector_Multiply"), "B")
    assert "opcode `0x0f`" in text and "stage *activate*" in text
    assert "`VMUL[.UBLXYZ] a, b, c, length`" in text and "**`B` broadcast**" in text
    assert "`c` is the rows of `a` (in place) or does not overlap them." in text
    assert "- `Z` wide_c: C is int16" in text and "not L, Z together: the 256-byte table" in text
    assert "0 .. 62" in register("vec_shift") and "-32768 .. 32767" in register("vec_zero_a")
    src = "vmul.ub   src=1,src2=20 ,dst=40,n=4\n  VADD 0,4,8,4,repeat=2\n"
    out = format_source(src)
    assert out == ("        vmul.ub src=1, src2=20, dst=40, n=4\n"
                   "        VADD    0, 4, 8, 4, repeat=2\n")
    assert assemble(out).instructions == assemble(src).instructions

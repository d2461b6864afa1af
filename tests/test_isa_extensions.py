"""The Activate features added for compiled networks (spec/isa.md 5.5: P, L, act_lo/act_hi,
strided and padded pooling), on hand-computed values, through both the emulator and the
reference model; and their timing (spec/timing.md 3-4: parameter rows are UB reads the
scoreboard orders, and cost cycles)."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.assembler import assemble
from tpuasm.machine import Machine
from tpuasm.machine.reference import run_reference

N = 4
IDENTITY = np.eye(N, dtype=np.int8)[None]


def planes(values) -> np.ndarray:
    """Four byte-plane rows of int32 values (row r = byte r of each column)."""
    u = np.asarray(values, np.int64) & 0xFFFFFFFF
    return np.array([(u >> (8 * r)) & 0xFF for r in range(4)], np.uint8)


def params(bias, mult, shift) -> np.ndarray:
    return np.vstack([planes(bias), planes(mult), np.asarray(shift, np.uint8)[None]])


def run_both(source: str, host: np.ndarray, weights=IDENTITY):
    program = assemble(source)
    host = np.asarray(host).astype(np.uint8).view(np.int8)
    m = Machine.for_program(program)
    m.load(program, host=host, weights=weights)
    r = m.run(max_cycles=1_000_000)
    assert r.status == "halted", r
    ref = run_reference(program, host, weights)
    assert ref.fault_kind is None, ref.fault_message
    np.testing.assert_array_equal(m.ub, ref.ub)
    return m, program


HEAD = """
.config array_size=4, ub_rows=128, acc_rows=32
.host prm, 9
.host x, 16
.host tab, 64
.ub   prm, 9
.ub   x, 16
.ub   tab, 64
.ub   y, 16
.acc  a, 16
        RHM host.prm, ub.prm, 9
        RHM host.x, ub.x, 16
        RHM host.tab, ub.tab, 64
        RW 0
        MMC.SO ub.x, acc.a, 16          ; acc = x (identity tile)
        CFG act_params, ub.prm
        CFG act_table, ub.tab
"""


def host_image(x_rows, prm=None, table=None):
    host = np.zeros((9 + 16 + 64, N), np.uint8)
    if prm is not None:
        host[:9] = prm
    host[9:9 + len(x_rows)] = np.asarray(x_rows, np.int64) & 0xFF
    if table is not None:
        host[25:25 + 64] = np.asarray(table, np.uint8).reshape(64, N)
    return host


def test_per_column_bias_requantization_ties_to_even_and_clip():
    # column: v = x + bias;  y = round_half_even(v * mult / 2^shift) + act_zero
    #   0: 10 + 0 = 10,   10 * 2^30 / 2^31 = 5            -> 5 + 1 = 6
    #   1: -7 + 1 = -6,   -6 * 2^30 / 2^32 = -1.5 -> -2   -> -1
    #   2:  5 - 1 = 4,     4 * 3 / 2^3 = 1.5 -> 2         -> 3
    #   3:  3 + 100 = 103, 103 / 2 = 51.5 -> 52           -> 53, clipped by act_hi 50
    prm = params([0, 1, -1, 100], [1 << 30, 1 << 30, 3, 1], [31, 32, 3, 1])
    src = HEAD + """
        CFG act_zero, 1
        ACT.P acc.a, ub.y, 1
        CFG act_hi, 50
        ACT.P acc.a, ub.y + 1, 1
        HLT
"""
    m, _ = run_both(src, host_image([[10, -7, 5, 3]], prm))
    y = m.ub[9 + 16 + 64:].view(np.int8)
    assert y[0].tolist() == [6, -1, 3, 53]
    assert y[1].tolist() == [6, -1, 3, 50]


def test_lookup_table_maps_every_output_byte():
    table = 255 - np.arange(256)
    src = HEAD + """
        CFG act_lo, -2
        ACT.L acc.a, ub.y, 1            ; int8 bytes [6, -2 (0xfe), 3, 50] -> 255 - b
        HLT
"""
    m, _ = run_both(src, host_image([[6, -9, 3, 50]], table=table))
    assert m.ub[9 + 16 + 64].tolist() == [249, 1, 252, 205]


@pytest.mark.parametrize("flags, count_pad, expected", [
    ("M", 0, [5, 6, 8, 9]),
    ("A", 0, [3, 5, 8, 9]),          # (1+2+4+5)/4 = 3, (3+6)/2 = 4.5 -> 5, (7+8)/2, 9
    ("A", 1, [3, 2, 4, 2]),          # always / 4: 14//4, 11//4, 17//4, 11//4
])
def test_strided_pooling_with_end_padding(flags, count_pad, expected):
    # a 3 x 3 image 1..9 (column 0), 2 x 2 windows, stride 2, one row/column of end padding
    x = [[v, 0, 0, 0] for v in range(1, 10)]
    src = HEAD + f"""
        CFG pool_size, 2
        CFG pool_width, 3
        CFG pool_stride, 2
        CFG pool_pad_end, 1
        CFG pool_count_pad, {count_pad}
        ACT.{flags} acc.a, ub.y, 9
        HLT
"""
    m, _ = run_both(src, host_image(x))
    assert m.ub[9 + 16 + 64:9 + 16 + 64 + 4, 0].tolist() == expected


def test_3x3_stride_2_padded_max_pool():
    # a 4 x 4 image 1..16, 3 x 3 windows, stride 2, padding 1 on both sides -> 2 x 2
    x = [[v, -v, 0, 0] for v in range(1, 17)]
    src = HEAD + """
        CFG pool_size, 3
        CFG pool_width, 4
        CFG pool_stride, 2
        CFG pool_pad, 1
        CFG pool_pad_end, 1
        ACT.M acc.a, ub.y, 16
        HLT
"""
    m, _ = run_both(src, host_image(x))
    y = m.ub[9 + 16 + 64:9 + 16 + 64 + 4].view(np.int8)
    assert y[:, 0].tolist() == [6, 8, 14, 16]
    assert y[:, 1].tolist() == [-1, -2, -5, -6]      # max of negatives: the window's corner


def test_per_column_average_divides_once():
    # P with A: round_half_even(sum * mult / (count * 2^shift)): (1+2+4+5) * 1 / (4 * 2) = 1.5 -> 2
    # (ACT.A then a separate requantization would round twice: 3 then 3/2 -> 2 here, but
    # column 1: 2+4+8+10 = 24 -> 24/8 = 3 exactly; column 2: 1+1+1+2 = 5 -> 5/8 -> 1)
    x = [[1, 2, 1, 0], [2, 4, 1, 0], [4, 8, 1, 0], [5, 10, 2, 0]]
    prm = params([0] * N, [1] * N, [1] * N)
    src = HEAD + """
        CFG pool_size, 2
        CFG pool_width, 2
        ACT.PA acc.a, ub.y, 4
        HLT
"""
    m, _ = run_both(src, host_image(x, prm))
    assert m.ub[9 + 16 + 64, :3].tolist() == [2, 3, 1]


def test_parameter_rows_are_scoreboarded_and_timed():
    # The ACT.P reads the rows the first RHM writes: it cannot start before that RHM has
    # finished, and its duration counts the 9 parameter rows (spec/timing.md 4).
    prm = params([0] * N, [1] * N, [0] * N)
    src = HEAD + """
        ACT.P acc.a, ub.y, 3
        ACT acc.a, ub.y + 3, 3
        HLT
"""
    m, program = run_both(src, host_image([[1, 2, 3, 4]] * 3, prm))
    act_p = next(i for i, ins in enumerate(program.instructions)
                 if ins.key == "ACT" and "P" in ins.flag_letters)
    assert m.issue_cycle(act_p) >= 0
    rhm_params = 0
    assert m.finish_cycle(act_p) - m.finish_cycle(rhm_params) >= m.config.act_latency + 3 + 9
    plain = act_p + 1
    assert m.finish_cycle(plain) - m.finish_cycle(act_p) == m.config.act_latency + 3


def test_parameter_rows_out_of_range_fault_first():
    src = HEAD.replace("CFG act_params, ub.prm", "CFG act_params, 120") + """
        ACT.P acc.a, ub.y, 1
        HLT
"""
    program = assemble(src)
    host = host_image([[1, 2, 3, 4]]).view(np.int8)
    m = Machine.for_program(program)
    m.load(program, host=host, weights=IDENTITY)
    r = m.run()
    ref = run_reference(program, host, IDENTITY)
    assert r.fault is not None and r.fault.kind == ref.fault_kind == "address"
    assert "UB address 128" in str(r.fault) and "128" in ref.fault_message


def test_output_pitch_writes_an_image_into_a_padded_layout():
    # 6 vectors as 2 rows of 3 at a pitch of 5 rows: rows 0,1,2 and 5,6,7 of ub.y; 3,4 kept
    x = [[v, 2 * v, 0, 0] for v in range(1, 11)]
    src = HEAD + """
        RHM host.x, ub.y, 16             ; ub.y starts as a copy of the inputs (x rows)
        CFG act_ub_pitch, 5
        CFG act_ub_width, 3
        CFG act_out, 2                   ; int16: two rows per vector, so rows 0..5, 10..15
        ACT acc.a, ub.y, 6
        HLT
"""
    m, _ = run_both(src, host_image(x))
    y = m.ub[9 + 16 + 64:9 + 16 + 64 + 16].astype(np.int64)
    values = y[0::2] + 256 * y[1::2]               # (low, high) pairs
    assert values[[0, 1, 2, 5, 6, 7], 0].tolist() == [1, 2, 3, 4, 5, 6]
    assert values[[0, 1, 2, 5, 6, 7], 1].tolist() == [2, 4, 6, 8, 10, 12]
    # rows 6..9 (the gap the pitch leaves) still hold the inputs copied there
    assert y[6:10, 0].tolist() == [7, 8, 9, 10]

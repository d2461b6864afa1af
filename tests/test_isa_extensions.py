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


Y = 9 + 16 + 64          # ub.y


def column_0(m, rows):
    return m.ub[Y:Y + rows, 0].view(np.int8).tolist()


@pytest.mark.parametrize("registers", [
    "CFG pool_size_x, 1",                                              # windows that tile
    "CFG pool_size_x, 1\n        CFG pool_stride, 2\n        CFG pool_stride_x, 1",
])
def test_2x1_windows_halve_the_height_alone(registers):
    # a CRNN's MaxPool (2, 1) stride (2, 1): a 4 x 4 image 1..16 -> 2 x 4, rows paired
    x = [[v, 0, 0, 0] for v in range(1, 17)]
    src = HEAD + f"""
        CFG pool_size, 2
        CFG pool_width, 4
        {registers}
        ACT.M acc.a, ub.y, 16
        HLT
"""
    m, _ = run_both(src, host_image(x))
    assert column_0(m, 8) == [5, 6, 7, 8, 13, 14, 15, 16]


def test_2x2_stride_2x1_padded_by_one_column():
    # PaddleOCR's MaxPool((2, 2), (2, 1), (0, 1)): a 4 x 4 image 1..16, no row padding, one
    # column each side -> 2 x 5; the edge windows hold one column of the image
    x = [[v, -v, 0, 0] for v in range(1, 17)]
    src = HEAD + """
        CFG pool_size, 2
        CFG pool_width, 4
        CFG pool_stride, 2
        CFG pool_stride_x, 1
        CFG pool_pad_x, 1
        CFG pool_pad_end_x, 1
        ACT.M acc.a, ub.y, 16
        HLT
"""
    m, _ = run_both(src, host_image(x))
    assert column_0(m, 10) == [5, 6, 7, 8, 8, 13, 14, 15, 16, 16]
    assert m.ub[Y:Y + 10, 1].view(np.int8).tolist() == [-1, -1, -2, -3, -4,
                                                         -9, -9, -10, -11, -12]


@pytest.mark.parametrize("count_pad, expected", [
    # rows 1..4 and 5..8, windows of 3 columns padded by one each side:
    # (1+2)/2 -> 2, 6/3, 9/3, (3+4)/2 -> 4 (floor((sum + count//2) / count))
    (0, [2, 2, 3, 4, 6, 6, 7, 8]),
    (1, [1, 2, 3, 2, 4, 6, 7, 5]),     # always / 3: (3+1)//3, 6//3, 9//3, (7+1)//3, ...
])
def test_1x3_average_padded_across_only(count_pad, expected):
    x = [[v, 0, 0, 0] for v in range(1, 9)]
    src = HEAD + f"""
        CFG pool_size, 1
        CFG pool_size_x, 3
        CFG pool_width, 4
        CFG pool_stride, 1
        CFG pool_pad_x, 1
        CFG pool_pad_end_x, 1
        CFG pool_count_pad, {count_pad}
        ACT.A acc.a, ub.y, 8
        HLT
"""
    m, _ = run_both(src, host_image(x))
    assert column_0(m, 8) == expected


def test_row_padding_without_column_padding():
    # pool_pad = 1 with pool_pad_x = 0: 3 x 1 windows at stride 1 over a 2 x 2 image padded
    # by a row above and below only -> 2 x 2 outputs, max of the two rows each
    x = [[v, 0, 0, 0] for v in (1, 7, 5, 2)]
    src = HEAD + """
        CFG pool_size, 3
        CFG pool_size_x, 1
        CFG pool_width, 2
        CFG pool_stride, 1
        CFG pool_pad, 1
        CFG pool_pad_end, 1
        CFG pool_pad_x, 0
        CFG pool_pad_end_x, 0
        ACT.M acc.a, ub.y, 4
        HLT
"""
    m, _ = run_both(src, host_image(x))
    assert column_0(m, 4) == [5, 7, 5, 7]


def _pool_oracle(image, kind, kh, kw, sy, sx, pads, count_pad):
    """numpy: ONNX-style pooling of an (H, W, N) int image, padding skipped (max) or counted
    as zeros in the sum; the average rounds floor((sum + count // 2) / count)."""
    top, left, bottom, right = pads
    h, w, _ = image.shape
    ho = (h + top + bottom - kh) // sy + 1
    wo = (w + left + right - kw) // sx + 1
    out = []
    for oy in range(ho):
        for ox in range(wo):
            y0, x0 = oy * sy - top, ox * sx - left
            win = image[max(y0, 0):y0 + kh, max(x0, 0):x0 + kw].reshape(-1, image.shape[2])
            if kind == "M":
                out.append(win.max(axis=0))
            else:
                count = kh * kw if count_pad else len(win)
                out.append((win.sum(axis=0) + count // 2) // count)
    return np.array(out)


@pytest.mark.parametrize("kind, geometry", [
    ("M", (3, 4, (2, 1), (2, 1), (0, 0, 0, 0), 0)),
    ("M", (4, 3, (2, 2), (2, 1), (0, 1, 0, 1), 0)),
    ("M", (2, 8, (1, 3), (1, 2), (0, 1, 0, 1), 0)),
    ("A", (2, 7, (1, 3), (1, 1), (0, 1, 0, 1), 0)),
    ("A", (2, 7, (1, 3), (1, 1), (0, 1, 0, 1), 1)),
    ("A", (4, 4, (3, 2), (1, 2), (1, 0, 2, 1), 0)),
    ("A", (4, 4, (3, 2), (2, 1), (2, 1, 1, 0), 1)),
])
def test_rectangular_pooling_against_numpy(kind, geometry):
    h, w, (kh, kw), (sy, sx), pads, count_pad = geometry
    top, left, bottom, right = pads
    rng = np.random.default_rng(h * w + kh)
    image = rng.integers(-128, 128, (h, w, N))
    expected = _pool_oracle(image, kind, kh, kw, sy, sx, pads, count_pad)
    src = HEAD + f"""
        CFG pool_size, {kh}
        CFG pool_size_x, {kw}
        CFG pool_width, {w}
        CFG pool_stride, {sy}
        CFG pool_stride_x, {sx}
        CFG pool_pad, {top}
        CFG pool_pad_end, {bottom}
        CFG pool_pad_x, {left}
        CFG pool_pad_end_x, {right}
        CFG pool_count_pad, {count_pad}
        ACT.{kind} acc.a, ub.y, {h * w}
        HLT
"""
    m, _ = run_both(src, host_image(image.reshape(h * w, N)))
    assert len(expected) <= 16
    np.testing.assert_array_equal(m.ub[Y:Y + len(expected)].view(np.int8), expected)


def test_column_registers_at_their_reset_values_change_nothing():
    # setting them to what reset means (0 / -1) or to the row registers' values is the
    # square pooling of before, bit for bit
    x = [[v, -v, 3 * v, 0] for v in range(1, 17)]
    body = """
        CFG pool_size, 3
        CFG pool_width, 4
        CFG pool_stride, 2
        CFG pool_pad, 1
        CFG pool_pad_end, 1
        CFG pool_count_pad, 1
        {extra}
        ACT.A acc.a, ub.y, 16
        HLT
"""
    outputs = []
    for extra in ("", "CFG pool_size_x, 0\n CFG pool_stride_x, 0\n CFG pool_pad_x, -1",
                  "CFG pool_size_x, 3\n CFG pool_stride_x, 2\n CFG pool_pad_x, 1\n"
                  " CFG pool_pad_end_x, 1"):
        m, _ = run_both(HEAD + body.format(extra=extra), host_image(x))
        outputs.append(m.ub[Y:Y + 4].copy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])


def run_fault(source: str, host):
    program = assemble(source)
    host = np.asarray(host).astype(np.uint8).view(np.int8)
    m = Machine.for_program(program)
    m.load(program, host=host, weights=IDENTITY)
    r = m.run(max_cycles=1_000_000)
    ref = run_reference(program, host, IDENTITY)
    return r, ref


@pytest.mark.parametrize("registers, words", [
    # a column stride for windows that tile (pool_stride 0)
    ("CFG pool_stride_x, 2", "pool_stride_x needs pool_stride > 0"),
    # padding as wide as the window's width
    ("CFG pool_size_x, 1\n CFG pool_stride, 1\n CFG pool_pad_x, 1", "pool_size_x 1"),
    # 3 columns do not tile a 4-wide image
    ("CFG pool_size_x, 3", "pool_size_x 3"),
])
def test_bad_column_pooling_is_a_shape_fault(registers, words):
    src = HEAD + f"""
        CFG pool_size, 2
        CFG pool_width, 4
        {registers}
        ACT.M acc.a, ub.y, 16
        HLT
"""
    r, ref = run_fault(src, host_image([[1, 2, 3, 4]] * 16))
    assert r.fault is not None and r.fault.kind == ref.fault_kind == "shape"
    assert words in str(r.fault), str(r.fault)
    assert "pool" in ref.fault_message


@pytest.mark.parametrize("line, message", [
    ("CFG pool_pad_x, -2", "value -2 out of range -1..255 for register pool_pad_x"),
    ("CFG pool_size_x, 257", "value 257 out of range 0..256 for register pool_size_x"),
    ("CFG pool_stride_x, -1", "value -1 out of range 0..256 for register pool_stride_x"),
    ("CFG pool_pad_end_x, 256", "value 256 out of range -1..255 for register pool_pad_end_x"),
])
def test_column_register_values_out_of_range_are_assembly_errors(line, message):
    from tpuasm.errors import AssemblyError
    with pytest.raises(AssemblyError) as exc:
        assemble(line)
    assert [d.message for d in exc.value.diagnostics] == [message]


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


def test_the_reset_clip_bounds_clip_to_int32_before_the_low_8_bits():
    """Step 3's clip bounds at reset are the int32 range, and they apply before act_out 3's
    low 8 bits: x * -2^31 is -2^31 for x = 1 (low byte 0) and, for x < 0, at least 2^31,
    clipped to 2^31 - 1 (low byte 255).  The emulator's path for programs with no register
    of section 5.5 used to wrap the unclipped product (found by a 2,000-program differential
    run)."""
    host = np.zeros((9 + 16 + 64, N), np.int64)
    host[9] = [1, -1, 2, -2]
    m, _ = run_both(HEAD + """
        CFG act_out, 3
        CFG act_mult, -2147483648
        ACT acc.a, ub.y, 1
        HALT
""", host)
    assert m.ub[Y].tolist() == [0, 255, 0, 255]

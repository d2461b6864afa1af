"""The back end's passes one at a time (no emulator): requantization parameters, UB slot
reuse, the weight stream's Read_Weights placement, fusion decisions and host packing."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.compiler.codegen import alloc, quant
from tpuasm.compiler.codegen.emit import Emitter
from tpuasm.compiler.codegen.fuse import plan_fusion
from tpuasm.compiler.codegen.layout import Layout, Pads
from tpuasm.compiler.ir import Activation, Conv, Dense, Lookup, Pool, QParams, Segment, Tensor


# ----------------------------------------------------------------------------- quant

@pytest.mark.parametrize("real", [1.0, 0.75, 1e-3, 3.3e-5, 0.123456789, 2.0 ** -40, 1000.0])
def test_fixed_point_represents_float32_multipliers_exactly(real):
    r = float(np.float32(real))
    mult, shift = quant.fixed_point(r)
    assert 0 <= shift <= quant.SHIFT_MAX and 0 <= mult < 2 ** 31
    if shift < quant.SHIFT_MAX:
        assert mult >= 2 ** 30                      # a full 31-bit mantissa
        assert mult / 2 ** shift == r               # float32 has 24 bits: exact
    else:
        assert abs(mult / 2 ** shift - r) <= 2 ** -(shift + 1)


def test_fixed_point_rejects_what_the_machine_cannot_hold():
    assert quant.fixed_point(0.0) == (0, 0)
    for bad in (-1.0, float("nan"), 2.0 ** 40):
        with pytest.raises(ValueError):
            quant.fixed_point(bad)


def test_folded_bias_wraps_like_the_accumulators():
    # b - z * colsum overflowing int32 still gives the right sum modulo 2^32
    b = quant.folded_bias([2 ** 31 - 1], [-1], 5)
    assert b.tolist() == [-(2 ** 31) + 4]
    x, w, z, bias = np.array([7, 3]), np.array([[2], [-5]]), 4, np.array([10])
    folded = quant.folded_bias(bias, w.sum(axis=0), z)
    assert (x @ w + folded).tolist() == ((x - z) @ w + bias).tolist()


def test_parameter_rows_are_little_endian_byte_planes():
    rows = quant.parameter_rows([-2, 258], [1 << 30, 7], [31, 3], 4)
    assert rows.shape == (9, 4)
    value = sum(rows[r].astype(np.int64) << (8 * r) for r in range(4))
    assert [(v - (1 << 32)) if v >= 1 << 31 else v for v in value[:2]] == [-2, 258]
    assert sum(rows[4 + r].astype(np.int64) << (8 * r) for r in range(4))[:2].tolist() == [1 << 30, 7]
    assert rows[8].tolist() == [31, 3, 0, 0]


def test_clip_bounds_in_quantized_units():
    q = QParams(0.05, 10, False)
    assert quant.clip_bounds(Activation("relu"), q) == (10, 255)
    assert quant.clip_bounds(Activation("clip", 0.0, 6.0), q) == (10, 130)
    assert quant.clip_bounds(Activation("none"), QParams(0.1, 0, True)) == (-128, 127)


# ----------------------------------------------------------------------------- alloc

def test_slots_are_reused_once_a_tensor_is_dead():
    # x -> a -> b -> c: x dies after op 0, a after op 1
    order = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"])]
    sizes = {"x": 10, "a": 8, "b": 6, "c": 4}
    a = alloc.allocate(order, sizes, ["x"], ["c"])
    assert a.of["b"] is a.of["x"]          # x's slot is free when b is written
    assert a.of["c"] is a.of["a"]
    assert a.of["a"] is not a.of["x"]      # an operator never writes the slot it reads
    assert a.rows == 18


def test_segment_outputs_live_through_the_next_operator_then_free_their_slot():
    # a goes to the host right after op 0: its WHM overlaps op 1, so op 1 must not write
    # a's slot; op 2 may (the scoreboard orders that write after the WHM); x lives to op 3
    order = [(["x"], ["a"]), (["x"], ["b"]), (["b"], ["c"]), (["x"], ["d"])]
    a = alloc.allocate(order, dict.fromkeys("xabcd", 5), ["x"], ["a", "c", "d"])
    assert a.of["b"] is not a.of["a"]
    assert a.of["c"] is a.of["a"]
    assert a.rows == 15


def test_inputs_load_in_order_of_need_as_early_as_allowed():
    # x is read by op 0, y by op 3, z by op 4: y's RHM goes right after op 0 (the input
    # stage is one queue: placed earlier it would hold op 0 behind it), z's after op 3
    order = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"]), (["y"], ["d"]), (["z"], ["e"])]
    assert alloc.load_points(order, ["x", "y", "z"]) == {"x": 0, "y": 1, "z": 4}
    assert alloc.load_points(order, ["x", "y", "z"], lead=1) == {"x": 0, "y": 2, "z": 4}
    assert alloc.load_points(order, ["x", "y", "z"], lead=0) == {"x": 0, "y": 3, "z": 4}
    # an input lives from the operator before its load point: y may not take a's slot
    # (a is read by op 1, after y's RHM), nor b's
    life = alloc.lifetimes(order, ["x", "y", "z"], ["e"])
    assert life["y"] == (0, 3) and life["x"] == (-1, 0)


def test_a_slot_whose_padding_matches_is_preferred():
    # when c is written, x's slot and a's slot are free and equal; best fit alone takes
    # the first (x's); with padding keys c goes where a (the same key) left its padding
    order = [(["x"], ["a"]), (["a"], ["b"]), (["b"], ["c"])]
    sizes = {"x": 5, "a": 5, "b": 9, "c": 5}
    plain = alloc.allocate(order, sizes, ["x"], ["c"])
    assert plain.of["c"] is plain.of["x"]
    keyed = alloc.allocate(order, sizes, ["x"], ["c"], keys={"x": 1, "a": 2, "c": 2})
    assert keyed.of["c"] is keyed.of["a"]


# ----------------------------------------------------------------------------- weights

def test_weight_stream_stays_fifo_depth_plus_one_ahead_and_never_deadlocks():
    e = Emitter(fifo_depth=4)
    e.start_weights()
    counts = [5, 3, 5, 5, 1, 2, 5, 4]
    tile = 0
    for c in counts:
        e.mmc("MMC.S 0, 0, 1", [("w", tile + i) for i in range(c)])
        tile += c
    lines = e.finish()
    requested, consumed = 0, 0
    for line in lines:
        words = line.split()
        if words[0] == "RW":
            rep = int(line.split("repeat=")[1]) if "repeat=" in line else 1
            first = int(line.split("+")[1].split(",")[0]) if "+" in line else 0
            assert first == requested                       # tiles in stream order
            requested += rep
            assert requested - consumed <= 5                # spec/isa.md 5.3
        elif words[0] == "MMC.S":
            c = counts.pop(0)
            assert requested - consumed >= c                # its tiles were requested
            consumed += c
            # (the Read_Weights right after it top the stream up again)
    assert requested == consumed == tile


# ----------------------------------------------------------------------------- fusion

def q(signed=True):
    return QParams(0.05, 0, signed)


def test_fusion_decisions():
    x = Tensor("x", (3, 8, 8), q())
    c = Conv("c", x, Tensor("cy", (4, 8, 8), q()), np.zeros((4, 3, 3, 3), np.int8),
             np.ones(4, np.float32), None, (1, 1), (1, 1, 1, 1))
    mp = Pool("mp", c.output, Tensor("mpy", (4, 4, 4), q()), "max", (2, 2), (2, 2))
    ap = Pool("ap", mp.output, Tensor("apy", (4, 2, 2), QParams(0.1, 0, True)), "avg",
              (2, 2), (2, 2))
    d = Dense("d", ap.output, Tensor("dy", (5,), q()), np.zeros((16, 5), np.int8),
              np.ones(5, np.float32))
    lk = Lookup("lk", d.output, Tensor("ly", (5,), q(False)), np.zeros(256, np.uint8))
    steps = plan_fusion(Segment("s", [c, mp, ap, d, lk], [x], [lk.output]), 2048).steps
    assert [s.nodes for s in steps] == [["c", "mp"], ["ap"], ["d", "lk"]]
    # a pooling whose input is also a segment output is not fused; nor is a too large image
    steps = plan_fusion(Segment("s", [c, mp], [x], [c.output, mp.output]), 2048).steps
    assert [s.nodes for s in steps] == [["c"], ["mp"]]
    steps = plan_fusion(Segment("s", [c, mp], [x], [mp.output]), 32).steps
    assert [s.nodes for s in steps] == [["c"], ["mp"]]


# ----------------------------------------------------------------------------- layout

def test_layout_rows_and_pixels():
    t = Tensor("t", (20, 5, 6), q())
    lay = Layout(t, 8, Pads(1, 2, 1, 2), row_multiple=4)
    assert lay.chunks == 3 and lay.pitch == 10
    assert lay.padded_height == 8                      # 7 rounded up to a multiple of 4
    assert lay.rows(3) == 3 * 3 * 80
    assert lay.pixel(3, 2, 1, 0, 0) == 2 * 240 + 80 + 1 * 10 + 2

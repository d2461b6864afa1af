"""Useful MACs (tpuasm/machine/macs.py, spec/timing.md 8): each retired MatrixMultiply's
vectors times its tile's real K x N (the extent of its non-zero weights), against sums
worked out by hand; the array-active MAC slots (vectors x N x N) beside them."""
from __future__ import annotations

import numpy as np

from tpuasm import assemble
from tpuasm.machine import Machine
from tpuasm.machine.macs import tile_extent


def _run(source: str, weights: np.ndarray, **stop):
    program = assemble(".config array_size=8\n" + source)
    m = Machine.for_program(program)
    m.load(program, host=np.zeros((8, 8), np.int8), weights=weights)
    m.run(**stop)
    return m


def _weights():
    w = np.zeros((4, 8, 8), np.int8)
    w[0, :3, :5] = 1             # a 3 x 5 layer in an 8 x 8 tile
    w[1] = 1                     # a full tile
    w[2, 6, 1] = -7              # extent 7 x 2 (zeros inside the extent count)
    return w                     # w[3]: all zero


def test_tile_extent():
    w = _weights()
    assert [tile_extent(t) for t in w] == [(3, 5), (8, 8), (7, 2), (0, 0)]


def test_each_mmc_counts_its_own_tile():
    m = _run("""
        RW 0
        MMC.S 0, 0, 4
        RW 1, repeat=2
        MMC.S 0, 8, 3, repeat=2     ; two iterations, tiles 1 then 2
        MMC 0, 16, 5                ; no S: the active tile (2) again
        RW 3
        MMC.S 0, 24, 6              ; a zero tile: nothing useful
        HLT
""", _weights())
    c = m.counters()
    assert c["useful_macs"] == 4 * 3 * 5 + 3 * 64 + 3 * 7 * 2 + 5 * 7 * 2
    assert c["array_mac_slots"] == (4 + 3 * 2 + 5 + 6) * 64
    assert c["mxu_utilization"] == c["useful_macs"] / (c["cycles"] * 64)


def test_a_partial_run_counts_retired_mmcs_only():
    source = """
        RW 0
        MMC.S 0, 0, 4
        RW 1
        MMC.S 0, 8, 3
        HLT
"""
    full = _run(source, _weights())
    finish = [int(full.times[i][2]) for i in range(5)]
    m = _run(source, _weights(), max_cycles=finish[3] - 1)     # the second MMC not retired
    assert m.counters()["useful_macs"] == 4 * 3 * 5
    assert full.counters()["useful_macs"] == 4 * 3 * 5 + 3 * 64


def test_a_16_bit_pair_counts_once_with_the_larger_extent():
    w = np.zeros((2, 8, 8), np.int8)
    w[0, :2, :6] = 1             # low bytes: 2 x 6
    w[1, :5, :1] = 1             # high bytes: 5 x 1  -> the pair: 5 x 6
    m = _run("""
        RW 0, repeat=2
        MMC.SD 0, 0, 4
        HLT
""", w)
    assert m.counters()["useful_macs"] == 4 * 5 * 6

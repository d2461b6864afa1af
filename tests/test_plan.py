"""The data path's plan (machine/plan.py) against fresh pipelined runs, at N = 64 (the int8
kernel's size when the CPU has one): MatrixMultiplies on small boxes (a corner tile on the
int8 kernel, numba's loops), with repeat fields and tile switches, overwriting and
accumulating, convolving, next to full-tile and 16-bit ones (not planned) on the same
accumulator rows, a run of them broken by a VADD that writes what the next one reads, and
Activates (plain, pooling, P) on their rows; run_batches and run_data leave every memory as
the pipeline does.  The plan's own figures (paths, rows' zero bounds, Activate columns) are
checked against the boxes the test put in the weights."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm import assemble
from tpuasm.machine import Machine

N = 64
# tile -> (rows, columns) of its non-zero box; None: a full tile, (): an empty one
BOXES = {0: ((3, 13), (2, 14)),      # 10 x 12: corner tile of side 16 (int8 kernel)
         1: ((0, 1), (4, 44)),       # 1 x 40: direct loops (its corner tile would be 48)
         2: ((20, 40), (30, 60)),    # 20 x 30: corner tile of side 32 = N / 2
         3: None,                    # full: the general kernels
         4: (),                      # all zero
         5: ((61, 64), (59, 64))}    # 3 x 5 at the corner's far end

PROGRAM = """
.config array_size=64, ub_rows=256, acc_rows=160
        RHM     0, 0, 128
        RHM     150, 240, 9
        CFG     rep_ub_stride, 10
        CFG     rep_acc_stride, 20
        RW      0, repeat=2
        MMC.SO{f} 0, 0, 20, repeat=2         ; tiles 0 and 1, one per iteration
        RW      2
        MMC.S{f}  30, 0, 20                  ; tile 2 adds a wider box to rows 0..19
        MMC{f}    50, 20, 20                 ; tile 2 again, no switch
        CFG     rep_acc_stride, 0
        RW      3
        MMC.SO{f} 60, 40, 20                 ; tile 3, full: not planned
        RW      4
        MMC.S{f}  70, 40, 20                 ; tile 4, empty: adds nothing
        RW      5
        MMC.SO{f} 80, 60, 20                 ; tile 5
        ACT.R   0, 128, 80
        WHM     128, 128, 80
        RW      0, repeat=3
        RW      5
        CFG     conv_pitch, 8
        CFG     conv_kw, 2
        MMC.SCO{f} 0, 80, 3, 4, repeat=4     ; a 2 x 2 convolution, taps on tiles 0, 1, 2, 5
        CFG     pool_size, 2
        ACT.M   80, 208, 12
        ACT.A   80, 214, 12
        WHM     208, 208, 12
        RW      3
        RW      0
        MMC.SOHD 0, 100, 10                  ; 16-bit (not planned): every column of 100..109
        RW      0
        MMC.SO{f} 40, 100, 6                 ; a small box overwrites 100..105 again
        RW      0
        MMC.SO{f} 0, 120, 8
        VADD    0, 8, 16, 8                  ; writes UB 16..23, which the next one reads
        RW      0
        MMC.S{f}  16, 130, 8
        CFG     act_params, 240
        ACT.P   100, 220, 10
        ACT     120, 230, 8
        ACT.R   130, 238, 2
        WHM     220, 220, 20
        HLT
"""


def _weights(rng):
    weights = np.zeros((6, N, N), np.uint8)
    for t, box in BOXES.items():
        if box is None:
            weights[t] = rng.integers(0, 256, (N, N))
        elif box:
            (k0, k1), (j0, j1) = box
            weights[t, k0:k1, j0:j1] = rng.integers(1, 256, (k1 - k0, j1 - j0))
            weights[t, k0, j0] = weights[t, k1 - 1, j1 - 1] = 7     # the box's corners
    return weights


def _program(flags: str):
    return assemble(PROGRAM.replace("{f}", f".{flags}" if flags else "")
                    .replace(".SO.", ".SO").replace(".S.", ".S").replace(".SCO.", ".SCO"))


@pytest.mark.parametrize("int8", [True, False])
@pytest.mark.parametrize("flags", ["", "U", "W", "UW"])
def test_planned_program_equals_fresh_pipelined_runs(flags, int8, monkeypatch):
    if not int8:
        monkeypatch.setenv("TPUASM_INT8", "0")       # the float path: loops or full tiles
    program = _program(flags)
    rng = np.random.default_rng(len(flags) + 10 * int8)
    weights = _weights(rng)
    hosts = rng.integers(0, 256, (3, 240, N)).astype(np.uint8)
    wanted = []
    for host in hosts:
        full = Machine.for_program(program)
        full.load(program, host=host, weights=weights)
        assert full.run().status == "halted"
        wanted.append((full.host.copy(), full.ub.copy(), full.acc.copy()))
    machine = Machine.for_program(program)
    machine.load(program, host=hosts[0], weights=weights)
    got = hosts.copy()
    assert machine.run_batches(got).status == "halted"
    for b, (host, _, _) in enumerate(wanted):
        np.testing.assert_array_equal(got[b], host, err_msg=f"host of batch {b}")
    np.testing.assert_array_equal(machine.ub, wanted[-1][1])
    np.testing.assert_array_equal(machine.acc, wanted[-1][2])
    machine.load(program, host=hosts[1], weights=weights)
    assert machine.run_data().status == "halted"
    for name, want in zip(("host", "ub", "acc"), wanted[1]):
        np.testing.assert_array_equal(getattr(machine, name), want, err_msg=name)


def test_plan_paths_zero_bounds_and_activate_columns():
    """plan.build on the program: which MatrixMultiplies it plans and on which path, each
    accumulator row's bound (the widest box column any write to it reaches) and each
    Activate's columns, all from the boxes put in the weights."""
    from tpuasm.machine import dataonly, plan
    from tpuasm.machine.decoded import COL_OP, OP_ACT, OP_MMC, reset_registers
    program = _program("")
    machine = Machine.for_program(program)
    machine.load(program, host=np.zeros((240, N), np.uint8),
                 weights=_weights(np.random.default_rng(0)))
    scratch = machine._scratch
    dataonly._begin(scratch)
    try:
        work = plan.build(machine.prog, reset_registers(), machine.weights, scratch,
                          machine.acc.shape[0])
    finally:
        dataonly._end(scratch)
    kind, segs, top, columns = (work[plan.W_KIND], work[plan.W_SEGS], work[plan.W_TOP],
                                work[plan.W_COLUMNS])
    mmcs = np.flatnonzero(machine.prog[:, COL_OP] == OP_MMC)
    planned = [kind[pc] == plan.PLAN_MMC for pc in mmcs]
    paths = list(segs[:, plan.SEG_PATH])
    kernel, loops = plan.PATH_KERNEL, plan.PATH_LOOPS
    if scratch.options[2] != 0:             # the int8 kernel
        # the full tile (4th MatrixMultiply) and the 16-bit one (8th) are not planned
        assert planned == [True, True, True, False, True, True, True, False, True, True,
                           True]
        # segments: tiles 0, 1 (one MMC's iterations), 2, 2, 4, 5, the taps 0, 1, 2, 5,
        # then 0, 0, 0
        assert paths == [kernel, loops, kernel, kernel, loops, kernel, kernel, loops, kernel,
                         kernel, kernel, kernel, kernel]
    else:                                   # the float path: direct boxes only (not tile 2)
        assert planned == [True, False, False, False, True, True, False, False, True, True,
                           True]
        assert paths == [loops] * 7
    reach = {t: (box[1][1] if box else 0) if box is not None else N
             for t, box in BOXES.items()}
    assert list(top[0:20]) == [max(reach[0], reach[2])] * 20     # tile 0, then 2 added
    assert list(top[20:40]) == [max(reach[1], reach[2])] * 20
    assert list(top[40:60]) == [N] * 20                          # the full tile
    assert list(top[60:80]) == [reach[5]] * 20
    assert list(top[80:92]) == [max(reach[t] for t in (0, 1, 2, 5))] * 12
    assert list(top[100:110]) == [N] * 10                        # the 16-bit one
    assert top[92:100].max() == 0 and top[140:].max() == 0       # never written
    acts = np.flatnonzero(machine.prog[:, COL_OP] == OP_ACT)
    bounds = [max(top[0:80]), top[80], top[80], N, max(top[120:128]), max(top[130:132])]
    assert list(columns[acts]) == [min((b + 15) // 16 * 16, N) for b in bounds]


ACTIVATE_REWRITES = """
.config array_size=16, ub_rows=64, acc_rows=40
        RHM     0, 0, 8
        RW      0
        MMC.SO  0, 0, 8
        MMC.O   8, 8, 8              ; reads UB 8..15 before anything writes them (zeros)
        ACT     0, 8, 8              ; then an Activate overwrites them whole
        CFG     act_ub_pitch, 3
        CFG     act_ub_width, 2
        ACT.R   0, 20, 8             ; rows 20, 21, 23, 24, 26, 27, 29, 30 (gaps between)
        CFG     act_ub_pitch, 0
        MMC.O   20, 16, 12           ; the image and its gaps (never written: zeros)
        ACT     8, 40, 20
        WHM     8, 8, 24
        WHM     40, 40, 20
        HLT
"""


@pytest.mark.parametrize("width", [1, 2])
def test_activate_output_rows_are_not_zeroed_but_rows_read_before_them_are(width):
    """An Activate's output rows count as whole first writes (dataonly._activate_writes):
    rows it writes first need no zeroing between batches, but a row read before the
    Activate that overwrites it still does, and a pitched image's gaps stay as load left
    them; against fresh full runs, batch by batch and as lanes."""
    from tpuasm.machine import dataonly
    from tpuasm.machine.decoded import reset_registers
    from tpuasm.machine.kernels import MEM_UB
    program = assemble(ACTIVATE_REWRITES)
    rng = np.random.default_rng(5)
    weights = rng.integers(0, 256, (1, 16, 16)).astype(np.uint8)
    images = [rng.integers(0, 256, (64, 16)).astype(np.uint8) for _ in range(3)]
    wanted = []
    for image in images:
        full = Machine.for_program(program)
        full.load(program, host=image, weights=weights)
        assert full.run().status == "halted"
        wanted.append(np.asarray(full.host).view(np.uint8).copy())
    machine = Machine.for_program(program)
    machine.load(program, host=images[0], weights=weights)
    spans = dataonly._dirty_spans(machine.prog, reset_registers(), MEM_UB,
                                  machine.ub.shape[0], 0, 16)
    zeroed = {r for start, stop in spans for r in range(start, stop)}
    assert set(range(8, 16)) <= zeroed             # read before their Activate
    assert not zeroed & {20, 21, 23, 24, 26, 27, 29, 30, 40}    # an Activate's first
    assert {22, 25, 28} <= zeroed                  # the gaps: read (never written)
    hosts = np.stack(images)
    assert machine.run_batches(hosts, lanes=width).status == "halted"
    for b, want in enumerate(wanted):
        np.testing.assert_array_equal(hosts[b], want, err_msg=f"batch {b}")

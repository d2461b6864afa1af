"""The numba core: the four-stage pipeline, its scoreboard, the weight FIFO and the run loop.

Why a timestamp model.  The front end issues in order, a stage holds one instruction, and an
instruction can only ever wait on *earlier* instructions (the scoreboard looks backwards, the
deadlock rules of spec/isa.md 5.3-5.4 forbid waiting on later ones).  So when an instruction
issues, every time it depends on is already known, and its whole timeline (start, weight
stalls and shifts per iteration, finish) is computed right then in O(repeat).  The run loop is
therefore event driven: it alternates between "issue the next instruction at cycle T" and
"complete the earliest in-flight instruction at cycle F" (where its effects are applied by
kernels.execute_instruction), jumping over every cycle in between.  Stopping at an exact
cycle (step), a breakpoint or a watchpoint is a comparison against those event times.

Cycle convention (spec/timing.md): `cycle` counts cycles executed.  An instruction issued "at
cycle T" issues during cycle T (visible from cycle T+1 on) and holds its stage for cycles
T..F-1; its effects are visible once `cycle >= F`.

The matrix stage is free for the next MatrixMultiply once the previous one has streamed its
last input vector (spec/timing.md 6); that multiply still completes `mmc_latency` cycles
later, while its partial sums drain out of the array.  So besides the one-per-stage rows, the
stage table keeps a ring of draining MatrixMultiplies (rows ROW_DRAIN...), oldest first.

All state lives in a few int64 arrays (layout below) so a call takes few arguments.
"""
from __future__ import annotations

import numpy as np
from .jit import njit

from ..isa import ISA_TABLE
from .decoded import (COL_FLAGS, COL_HEIGHT, COL_LEN, COL_OP, COL_REG, COL_REPEAT, COL_TILE,
                      COL_VALUE, COL_WIDTH, MMC_CONV, MMC_SWITCH, MMC_WIDE_IN, MMC_WIDE_W,
                      NREGS, OP_ACT, OP_CFG, OP_HLT, OP_INT, OP_MMC, OP_NOP, OP_RHM, OP_RHMA,
                      OP_RW, OP_SYNC, OP_TAG, OP_VADD, OP_VMUL, OP_WSYNC)
from .kernels import (FAULT_ADDRESS, FAULT_CONFIG, FAULT_NONE, FAULT_SHAPE, MAX_FOOTPRINT,
                      act_param_rows, check_instruction, execute_instruction, footprint,
                      vector_cycles)

INF = np.int64(1) << 62

# ------------------------------------------------------------------ stages
STAGE_INPUT, STAGE_MATRIX, STAGE_ACTIVATE, STAGE_OUTPUT = range(4)
STAGE_NAMES = ("input", "matrix", "activate", "output")
NSTAGES = 4
# Read_Weights is in no datapath stage: it issues into the weight-fetch engine's own address
# port (spec/timing.md 5), so host DMA in the input stage never holds back a weight hand-off.
PORT_WEIGHTS = -2
_STAGE_OF = {"input": 0, "matrix": 1, "activate": 2, "output": 3, "front": -1,
             "weights": PORT_WEIGHTS}
OP_STAGE = np.full(256, -1, dtype=np.int64)
for _spec in ISA_TABLE.instructions.values():
    OP_STAGE[_spec.opcode] = _STAGE_OF[_spec.stage]

# ------------------------------------------------------------------ st: scalar state
# _I1.._I4 reserve S_INFO+1..S_INFO+4 (a fault's info words are st[S_INFO:S_INFO + 5]),
# _A1 reserves S_ACTIVE+1 (the high tile of a 16-bit pair) and _B1.._B3 reserve
# C_BUSY+1..C_BUSY+3 (one busy counter per stage): never use those names.
(S_CYCLE, S_PC, S_FRONT, S_STATUS, S_INDEX, S_FAULT_PENDING, S_FAULT_KIND, S_FAULT_INDEX,
 S_FAULT_CYCLE, S_INFO, _I1, _I2, _I3, _I4, S_NREQ, S_NCONS, S_ACTIVE_WIDE, S_ACTIVE, _A1,
 S_LAST_FETCH, S_NEVENTS, S_NSEG, S_HALTED,
 # folded counters (spec/timing.md)
 C_ACTIVE, C_WSTALL, C_WSHIFT, C_RAW, C_INPUT, C_MACS, C_BUSY, _B1, _B2, _B3,
 # run request
 S_STOP_CYCLE, S_STOP_INDEX, S_SKIP_BP,
 # configuration
 K_N, K_FIFO, K_FETCH, K_SHIFT, K_MMC_LAT, K_ACT_LAT, K_HOST_LAT, K_HOST_MILLI, K_UB_ROWS,
 K_ACC_ROWS, K_HOST_ROWS, K_NTILES, K_STRICT, K_PROFILE,
 # the ring of draining MatrixMultiplies (sg rows ROW_DRAIN...): oldest slot, how many
 S_DRAIN_HEAD, S_DRAIN_COUNT,
 # the weight port: the Read_Weights it holds (or last held), its first tile, its tile
 # count, and the cycle it frees the port (its last hand-off + 1 = its finish)
 S_RW_IDX, S_RW_TILE0, S_RW_NTILES, S_RW_FREE,
 # 1: timing only (Machine(timing_only=True)): skip every data-path effect
 K_TIMING_ONLY,
 ST_SIZE) = range(58)

# status codes
RUNNING, HALTED, FAULTED, BREAKPOINT, WATCHPOINT, PAUSED = range(6)
# fault kinds raised by the core (kernels' FAULT_ADDRESS/CONFIG/SHAPE are 1..3)
F_ADDRESS, F_CONFIG, F_SHAPE = FAULT_ADDRESS, FAULT_CONFIG, FAULT_SHAPE
F_NO_TILE, F_DEADLOCK_RW, F_DEADLOCK_SWITCH, F_WEIGHT_WIDTH, F_HAZARD, F_INVALID = 4, 5, 6, 7, 8, 9

# ------------------------------------------------------------------ sg: in-flight instructions
# Rows 0..3: the instruction each stage holds (or last held).  Row ROW_FRONT is unused in sg;
# in fps and cregs it holds the front end's footprint scratch and its current configuration
# registers.  Rows ROW_DRAIN...: the ring of MatrixMultiplies that have left the matrix stage
# but are still draining (a slot per row, the same row index in sg, fps and cregs).
# G_FREE: when the stage is free for the next instruction (G_FINISH, except that an MMC frees
# the matrix stage when its last vector has entered the array).
(G_IDX, G_ISSUE, G_START, G_FINISH, G_PENDING, G_BLOCKER, G_TILE0, G_NTILES, G_NFP,
 G_FREE, SG_WIDTH) = range(11)
ROW_FRONT = NSTAGES
ROW_DRAIN = NSTAGES + 1

# ------------------------------------------------------------------ tl: tile table (rows)
T_TILE, T_REQ, T_FS, T_FE, T_SS, T_SE, T_SW, T_HI, TL_ROWS = range(9)

# ------------------------------------------------------------------ seg: matrix timeline
# The first four partition the MMC's time in the matrix stage (issue to last vector in):
# active, waiting for its tile's fetch, for its shift, and SEG_HAZARD: weights ready but the
# scoreboard holds it.  SEG_RAW and SEG_INPUT overlap them: they are the Table 3 rows 7 and
# 8, counted from the MMC's issue, under the weight stall too (spec/timing.md 8).
SEG_ACTIVE, SEG_WSTALL, SEG_WSHIFT, SEG_HAZARD, SEG_RAW, SEG_INPUT = range(6)
MAX_SEGS = 3 * 256 + 16

# ------------------------------------------------------------------ ev: events
EV_INTERRUPT, EV_TAG = 0, 1

# watch modes (the 4th column of a watch row): which accesses stop the run
WATCH_WRITE, WATCH_READ = 1, 2

# flags array: bit 0 breakpoint, bit 1 invalid instruction
FLAG_BREAK, FLAG_INVALID = 1, 2

# times: per instruction issue, start, finish (-1 = not yet)
TM_ISSUE, TM_START, TM_FINISH = range(3)


def new_state() -> np.ndarray:
    st = np.zeros(ST_SIZE, dtype=np.int64)
    st[S_ACTIVE_WIDE] = -1
    st[S_ACTIVE] = -1
    st[S_ACTIVE + 1] = -1
    st[S_STOP_INDEX] = -1
    st[S_SKIP_BP] = -1
    st[S_FAULT_INDEX] = -1
    st[S_INDEX] = -1
    st[S_RW_IDX] = -1
    return st


def drain_slots(mmc_latency: int, mmcs: int) -> int:
    """Ring size for the draining MatrixMultiplies.  When an MMC issues at t, each earlier MMC
    still draining (finish = its stream end + mmc_latency > t) was followed by an issue in
    (t - mmc_latency, t] (the next MMC issues at or after its stream end, and issues are at
    distinct cycles), so at most mmc_latency of them drain at once, and at most `mmcs`."""
    return max(1, min(int(mmc_latency), int(mmcs)))


def new_stages(slots: int = 1) -> np.ndarray:
    sg = np.zeros((ROW_DRAIN + slots, SG_WIDTH), dtype=np.int64)
    sg[:, G_IDX] = -1
    sg[:, G_BLOCKER] = -1
    return sg


# ================================================================== helpers


@njit(cache=True)
def _ensure_shift(tl, j, shift):
    """Shift-in start/end of tile j (known once tile j-1 has been switched in)."""
    if tl[T_SS, j] >= 0:
        return
    fe = tl[T_FE, j]
    if tl[T_HI, j] != 0:
        free = tl[T_SE, j - 1]          # the high tile of a pair follows the low one
    elif j > 0:
        free = tl[T_SW, j - 1]          # the shadow empties when the previous tile switches in
    else:
        free = 0
    ss = max(fe, free)
    tl[T_SS, j] = ss
    tl[T_SE, j] = ss + shift


@njit(cache=True)
def _add_seg(seg, st, kind, a, b):
    if b > a:
        k = st[S_NSEG]
        seg[k, 0] = a
        seg[k, 1] = b
        seg[k, 2] = kind
        st[S_NSEG] = k + 1


@njit(cache=True)
def _conflict(fa, na, fb, nb, info):
    """First conflicting pair between two footprints: 0 none, 1 RAW, 2 WAR, 3 WAW (a is later)."""
    for i in range(na):
        for k in range(nb):
            if fa[i, 0] != fb[k, 0]:
                continue
            if fa[i, 1] == 0 and fb[k, 1] == 0:
                continue
            lo = max(fa[i, 2], fb[k, 2])
            hi = min(fa[i, 3], fb[k, 3])
            if lo < hi:
                info[1] = fa[i, 0]
                info[2] = lo
                info[3] = hi
                if fa[i, 1] == 0:
                    return 1
                if fb[k, 1] == 0:
                    return 2
                return 3
    return 0


@njit(cache=True)
def _inflight_finish(st, sg):
    """When every instruction issued so far has finished (finished ones included).  The
    draining MMCs need no look: they are older than the matrix stage's MMC, so they finish
    no later than it does.  A Read_Weights finishes when it has handed over its last tile."""
    f = st[S_RW_FREE]
    for s in range(NSTAGES):
        if sg[s, G_IDX] >= 0 and sg[s, G_FINISH] > f:
            f = sg[s, G_FINISH]
    return f


@njit(cache=True)
def _drain_row(st, sg, k):
    """Row of the k-th oldest draining MatrixMultiply."""
    return ROW_DRAIN + (st[S_DRAIN_HEAD] + k) % (sg.shape[0] - ROW_DRAIN)


@njit(cache=True)
def _push_drain(st, sg, cregs, fps):
    """The matrix stage's MMC, still draining, makes room for the next one: it moves to the
    tail of the ring with its footprint and registers (it still retires, in order)."""
    if st[S_DRAIN_COUNT] == sg.shape[0] - ROW_DRAIN:
        raise AssertionError("drain ring full (see drain_slots)")
    r = _drain_row(st, sg, st[S_DRAIN_COUNT])
    sg[r, :] = sg[STAGE_MATRIX, :]
    fps[r, :, :] = fps[STAGE_MATRIX, :, :]
    cregs[r, :] = cregs[STAGE_MATRIX, :]
    st[S_DRAIN_COUNT] += 1
    sg[STAGE_MATRIX, G_PENDING] = 0


@njit(cache=True)
def _earliest_completion(st, sg):
    """Row of the pending instruction that finishes first (ties: program order), or -1.  Of
    the draining MMCs only the oldest can be first: they finish in issue order."""
    best = -1
    e = INF
    for k in range(NSTAGES + min(st[S_DRAIN_COUNT], 1)):
        r = k if k < NSTAGES else _drain_row(st, sg, 0)
        if sg[r, G_PENDING] == 0:
            continue
        f = sg[r, G_FINISH]
        if f < e or (f == e and sg[r, G_IDX] < sg[best, G_IDX]):
            e = f
            best = r
    return best


@njit(cache=True)
def _raise_fault(st, sg, kind, pc, t):
    """Fault detected at issue: every earlier instruction completes first (spec/isa.md 7)."""
    st[S_FAULT_PENDING] = 1
    st[S_FAULT_KIND] = kind
    st[S_FAULT_INDEX] = pc
    st[S_FAULT_CYCLE] = max(t, _inflight_finish(st, sg))


@njit(cache=True)
def _next_issue_time(prog, st, sg):
    pc = st[S_PC]
    front = st[S_FRONT]
    if pc >= prog.shape[0]:
        op = OP_HLT
    else:
        op = prog[pc, COL_OP]
    stage = OP_STAGE[op]
    if stage >= 0:
        if sg[stage, G_IDX] >= 0:
            return max(front, sg[stage, G_FREE])
        return front
    if stage == PORT_WEIGHTS:                   # one Read_Weights in the port at a time
        return max(front, st[S_RW_FREE])
    if op == OP_SYNC or op == OP_INT:
        return max(front, _inflight_finish(st, sg))
    if op == OP_WSYNC or op == OP_HLT:
        return max(front, _inflight_finish(st, sg), st[S_LAST_FETCH])
    return front


# ================================================================== issue


@njit(cache=True)
def _issue_rw(prog, st, tl, pc, t):
    row = prog[pc]
    reps = row[COL_REPEAT]
    depth = st[K_FIFO]
    q0 = st[S_NREQ]
    if q0 + reps - st[S_NCONS] > depth + 1:
        st[S_INFO] = q0 + reps - st[S_NCONS]
        st[S_INFO + 1] = depth + 1
        return F_DEADLOCK_RW, t, t
    h = t
    start = t
    last = st[S_LAST_FETCH]
    for k in range(reps):
        q = q0 + k
        if q >= depth:
            # room in the FIFO once the tile `depth` places ahead has begun shifting out
            _ensure_shift(tl, q - depth, st[K_SHIFT])
            h = max(h, tl[T_SS, q - depth])
        if k == 0:
            start = h
        fs = max(h, last)
        last = fs + st[K_FETCH]
        tl[T_TILE, q] = row[COL_TILE] + k
        tl[T_REQ, q] = h
        tl[T_FS, q] = fs
        tl[T_FE, q] = last
        tl[T_SS, q] = -1
        tl[T_SE, q] = -1
        tl[T_SW, q] = -1
        tl[T_HI, q] = 0
        h += 1
    st[S_NREQ] = q0 + reps
    st[S_LAST_FETCH] = last
    return FAULT_NONE, start, h


@njit(cache=True)
def _weight_check(prog, st, pc):
    row = prog[pc]
    flags = row[COL_FLAGS]
    wide = 1 if flags & MMC_WIDE_W else 0
    if flags & MMC_SWITCH:
        need = row[COL_REPEAT] * (1 + wide)
        have = st[S_NREQ] - st[S_NCONS]
        if have < need:
            st[S_INFO] = need
            st[S_INFO + 1] = have
            return F_DEADLOCK_SWITCH
        return FAULT_NONE
    if st[S_ACTIVE_WIDE] < 0:
        return F_NO_TILE
    if st[S_ACTIVE_WIDE] != wide:
        st[S_INFO] = st[S_ACTIVE_WIDE]
        return F_WEIGHT_WIDTH
    return FAULT_NONE


@njit(cache=True)
def _fold_matrix_timeline(st, seg):
    """Add the timeline of the previous MatrixMultiply to the counters.  It is called when
    the next one issues, so every segment lies in the past; until then counters() adds the
    segments itself, clipped to the current cycle.  The active, weight-stall, weight-shift
    and hazard segments cover the MMC's time in the matrix stage, issue to last vector in,
    exactly: that is the stage's busy time; the RAW and input segments lie over them."""
    for k in range(st[S_NSEG]):
        d = seg[k, 1] - seg[k, 0]
        kind = seg[k, 2]
        if kind == SEG_RAW:             # rows 7 and 8 overlap the stage's partition
            st[C_RAW] += d
            continue
        if kind == SEG_INPUT:
            st[C_INPUT] += d
            continue
        if kind == SEG_ACTIVE:
            st[C_ACTIVE] += d
        elif kind == SEG_WSTALL:
            st[C_WSTALL] += d
        elif kind == SEG_WSHIFT:
            st[C_WSHIFT] += d
        st[C_BUSY + STAGE_MATRIX] += d
    st[S_NSEG] = 0


@njit(cache=True)
def _issue_mmc(prog, st, sg, tl, seg, pc, t, ready_chip, ready_host):
    """Timeline of a MatrixMultiply issued at t whose hazards on on-chip instructions clear
    at `ready_chip` and on host reads (RHM/RHMA) at `ready_host`:
    (start, stream end = last vector in, finish = stream end + mmc_latency)."""
    row = prog[pc]
    flags = row[COL_FLAGS]
    reps = row[COL_REPEAT]
    wide = 1 if flags & MMC_WIDE_W else 0
    rate = (2 if flags & MMC_WIDE_IN else 1) * (1 + wide)
    if flags & MMC_CONV:
        vectors = row[COL_HEIGHT] * row[COL_WIDTH]
    else:
        vectors = row[COL_LEN]
    stream = vectors * rate
    shift = st[K_SHIFT]
    ready = max(ready_chip, ready_host)
    _fold_matrix_timeline(st, seg)
    # rows 7 and 8: the waits for each kind of producer, from the issue on, whatever else
    # the MMC waits for meanwhile (a cycle both are pending counts in both)
    _add_seg(seg, st, SEG_RAW, t, ready_chip)
    _add_seg(seg, st, SEG_INPUT, t, ready_host)
    sg[STAGE_MATRIX, G_TILE0] = st[S_NCONS]
    if flags & MMC_SWITCH:
        per = 1 + wide
        sg[STAGE_MATRIX, G_NTILES] = reps * per
        prev_end = t
        start = t
        for it in range(reps):
            j0 = st[S_NCONS]
            j1 = j0 + per - 1
            if per == 2:
                tl[T_HI, j1] = 1
            _ensure_shift(tl, j0, shift)
            if per == 2:
                _ensure_shift(tl, j1, shift)
            ss = tl[T_SS, j0]
            tile_ready = tl[T_SE, j1]
            if it == 0:
                begin = max(ready, tile_ready)
                # [t, begin): fetch wait, then shift, then hazard wait (weights ready)
                _add_seg(seg, st, SEG_WSTALL, t, min(ss, begin))
                _add_seg(seg, st, SEG_WSHIFT, max(t, ss), min(tile_ready, begin))
                _add_seg(seg, st, SEG_HAZARD, max(t, tile_ready), begin)
                start = begin
            else:
                begin = max(prev_end, tile_ready)
                _add_seg(seg, st, SEG_WSTALL, prev_end, min(ss, begin))
                _add_seg(seg, st, SEG_WSHIFT, max(prev_end, ss), begin)
            tl[T_SW, j0] = begin
            tl[T_SW, j1] = begin
            st[S_NCONS] = j1 + 1
            _add_seg(seg, st, SEG_ACTIVE, begin, begin + stream)
            prev_end = begin + stream
        st[S_ACTIVE_WIDE] = wide
    else:
        sg[STAGE_MATRIX, G_NTILES] = 0
        start = max(t, ready)
        _add_seg(seg, st, SEG_HAZARD, t, start)
        prev_end = start + reps * stream
        _add_seg(seg, st, SEG_ACTIVE, start, prev_end)
    return start, prev_end, prev_end + st[K_MMC_LAT]


@njit(cache=True)
def host_dma_cycles(latency, n, milli_bytes_per_cycle, rows):
    """Cycles a host DMA of `rows` N-byte rows takes (spec/timing.md); the one formula, also
    behind MachineConfig.host_cycles."""
    return latency + (rows * n * 1000 + milli_bytes_per_cycle - 1) // milli_bytes_per_cycle


@njit(cache=True)
def _host_cycles(st, rows):
    return host_dma_cycles(st[K_HOST_LAT], st[K_N], st[K_HOST_MILLI], rows)


@njit(cache=True)
def _issued(st, times, pc, issue, start, finish, front):
    """Record instruction pc's issue, start and finish, and move the front end on to pc + 1,
    free again from cycle `front`."""
    times[pc, TM_ISSUE] = issue
    times[pc, TM_START] = start
    times[pc, TM_FINISH] = finish
    st[S_FRONT] = front
    st[S_PC] = pc + 1


@njit(cache=True)
def _issue(prog, st, sg, cregs, fps, times, tl, seg, ev, flagsarr, pc, t):
    """Issue instruction pc at cycle t (its stage is free).  Returns False on a fault."""
    n = prog.shape[0]
    if pc >= n or prog[pc, COL_OP] == OP_HLT:
        if pc < n:
            times[pc, TM_ISSUE] = t
            times[pc, TM_START] = t
            times[pc, TM_FINISH] = t + 1
        st[S_HALTED] = t + 1
        st[S_FRONT] = t + 1
        return True
    row = prog[pc]
    op = row[COL_OP]
    info = st[S_INFO:S_INFO + 5]
    if flagsarr[pc] & FLAG_INVALID:
        _raise_fault(st, sg, F_INVALID, pc, t)
        return False
    stage = OP_STAGE[op]
    regs = cregs[ROW_FRONT]
    if stage == PORT_WEIGHTS:
        # Read_Weights: one front-end cycle, then it hands its tile addresses to the fetch
        # engine from its own port (no footprint, no scoreboard: it touches no memory the
        # datapath stages use; its tiles' timelines are fixed by _issue_rw right now)
        f = check_instruction(row, regs, st[K_UB_ROWS], st[K_ACC_ROWS], st[K_HOST_ROWS],
                              st[K_NTILES], info, st[K_PROFILE])
        if f != FAULT_NONE:
            _raise_fault(st, sg, f, pc, t)
            return False
        q0 = st[S_NREQ]
        f, start, fin = _issue_rw(prog, st, tl, pc, t)
        if f != FAULT_NONE:
            _raise_fault(st, sg, f, pc, t)
            return False
        st[S_RW_IDX] = pc
        st[S_RW_TILE0] = q0
        st[S_RW_NTILES] = row[COL_REPEAT]
        st[S_RW_FREE] = fin
        _issued(st, times, pc, t, start, fin, t + 1)
        return True
    if stage < 0:
        fin = t + 1
        if op == OP_NOP:
            fin = t + row[COL_REPEAT]
        elif op == OP_CFG:
            f = check_instruction(row, regs, st[K_UB_ROWS], st[K_ACC_ROWS], st[K_HOST_ROWS],
                                  st[K_NTILES], info, st[K_PROFILE], st[K_N])
            if f != FAULT_NONE:
                _raise_fault(st, sg, f, pc, t)
                return False
            regs[row[COL_REG]] = row[COL_VALUE]
        elif op == OP_INT or op == OP_TAG:
            k = st[S_NEVENTS]
            if k < ev.shape[0]:
                ev[k, 0] = t
                ev[k, 1] = EV_INTERRUPT if op == OP_INT else EV_TAG
                ev[k, 2] = pc
                ev[k, 3] = row[COL_VALUE]
                st[S_NEVENTS] = k + 1
        _issued(st, times, pc, t, t, fin, fin)
        return True

    # ---- a staged instruction: checks first (nothing changes on a fault)
    f = check_instruction(row, regs, st[K_UB_ROWS], st[K_ACC_ROWS], st[K_HOST_ROWS],
                          st[K_NTILES], info, st[K_PROFILE], st[K_N])
    if f == FAULT_NONE and op == OP_MMC:
        f = _weight_check(prog, st, pc)
    if f != FAULT_NONE:
        _raise_fault(st, sg, f, pc, t)
        return False
    mine = fps[ROW_FRONT]
    nfp = footprint(row, regs, mine, st[K_PROFILE], st[K_N])
    ready = t
    ready_chip = t              # latest finish of a conflicting on-chip instruction
    ready_host = t              # ... of a conflicting host read (RHM/RHMA)
    blocker = -1
    # every unfinished earlier instruction: the stages' (a stage's previous occupant has
    # finished, except a draining MMC in the matrix stage) and the draining MMCs
    for k in range(NSTAGES + st[S_DRAIN_COUNT]):
        r = k if k < NSTAGES else _drain_row(st, sg, k - NSTAGES)
        if sg[r, G_PENDING] == 0:
            continue
        other = sg[r, G_IDX]
        if op == OP_MMC and prog[other, COL_OP] == OP_MMC:
            # MMC after MMC: the array delivers their partial sums to the accumulators in
            # issue order and they retire in issue order, so this is no hazard
            continue
        kind = _conflict(mine, nfp, fps[r], sg[r, G_NFP], info)
        if kind == 0:
            continue
        if st[K_STRICT] != 0:
            info[0] = kind
            info[4] = other
            _raise_fault(st, sg, F_HAZARD, pc, t)
            return False
        fin_other = sg[r, G_FINISH]
        bop = prog[other, COL_OP]
        if bop == OP_RHM or bop == OP_RHMA:
            ready_host = max(ready_host, fin_other)
        else:
            ready_chip = max(ready_chip, fin_other)
        if fin_other > ready:
            ready = fin_other
            blocker = other
    free = np.int64(-1)
    if op == OP_MMC:
        if sg[STAGE_MATRIX, G_PENDING] != 0:
            _push_drain(st, sg, cregs, fps)
        start, free, fin = _issue_mmc(prog, st, sg, tl, seg, pc, t, ready_chip, ready_host)
    else:
        start = ready
        rows = row[COL_LEN] * row[COL_REPEAT]
        if op == OP_ACT:
            # P and L first read their parameter rows (spec/timing.md 4)
            p_rows, t_rows = act_param_rows(row[COL_FLAGS], st[K_N])
            fin = start + st[K_ACT_LAT] + rows + p_rows + t_rows
        elif op == OP_VADD or op == OP_VMUL:
            # the Activation pipeline reads two operand rows per output row (spec/timing.md 4)
            fin = start + st[K_ACT_LAT] + vector_cycles(row, st[K_N])
        else:
            fin = start + _host_cycles(st, rows)
    sg[stage, G_IDX] = pc
    sg[stage, G_ISSUE] = t
    sg[stage, G_START] = start
    sg[stage, G_FINISH] = fin
    sg[stage, G_PENDING] = 1
    sg[stage, G_BLOCKER] = blocker
    sg[stage, G_NFP] = nfp
    sg[stage, G_FREE] = free if op == OP_MMC else fin
    fps[stage, :, :] = mine
    cregs[stage, :] = regs
    _issued(st, times, pc, t, start, fin, t + 1)
    return True


# ================================================================== completion


@njit(cache=True)
def _complete(prog, st, sg, cregs, fps, tl, watch, ub, acc, host, weights, scratch, r):
    """Retire the instruction in row r (a stage or the oldest draining MMC): apply its
    effects, fold its counters.  Returns True if it touched a watched range the way that
    watch asks: watch rows are (memory, start, stop, mode), mode WATCH_WRITE | WATCH_READ."""
    idx = sg[r, G_IDX]
    row = prog[idx]
    op = row[COL_OP]
    if st[K_TIMING_ONLY] == 0:
        # (timing only: no effects; every time and counter depends on instructions and
        # addresses alone, never on data, so they are the same as a full run's)
        t0 = sg[r, G_TILE0]
        nt = sg[r, G_NTILES] if op == OP_MMC else 0
        execute_instruction(row, cregs[r], ub, acc, host, weights, tl[T_TILE, t0:t0 + nt],
                            st[S_ACTIVE:S_ACTIVE + 2], scratch, st[K_PROFILE])
    if op == OP_MMC:
        # its matrix-stage cycles are folded when the next MMC issues (_fold_matrix_timeline)
        st[C_MACS] += mmc_vectors(row) * st[K_N] * st[K_N]
    else:
        st[C_BUSY + OP_STAGE[op]] += sg[r, G_FINISH] - sg[r, G_ISSUE]
    sg[r, G_PENDING] = 0
    if r >= ROW_DRAIN:          # the oldest draining MMC leaves the ring
        st[S_DRAIN_HEAD] = (st[S_DRAIN_HEAD] + 1) % (sg.shape[0] - ROW_DRAIN)
        st[S_DRAIN_COUNT] -= 1
    hit = False
    f = fps[r]
    for i in range(sg[r, G_NFP]):
        mode = WATCH_WRITE if f[i, 1] != 0 else WATCH_READ
        for w in range(watch.shape[0]):
            if (watch[w, 3] & mode) != 0 and watch[w, 0] == f[i, 0] and \
                    max(watch[w, 1], f[i, 2]) < min(watch[w, 2], f[i, 3]):
                hit = True
    return hit


@njit(cache=True)
def mmc_vectors(row):
    """Input vectors a MatrixMultiply streams over all its iterations."""
    if row[COL_FLAGS] & MMC_CONV:
        return row[COL_HEIGHT] * row[COL_WIDTH] * row[COL_REPEAT]
    return row[COL_LEN] * row[COL_REPEAT]


# ================================================================== the run loop


@njit(cache=True)
def run_core(prog, st, sg, cregs, fps, times, tl, seg, ev, flagsarr, watch,
             ub, acc, host, weights, scratch):
    """Advance the machine until st[S_STOP_CYCLE], a halt, a fault, a breakpoint, a watched
    write, or the retirement of instruction st[S_STOP_INDEX].  Sets st[S_STATUS]."""
    stop = st[S_STOP_CYCLE]
    stop_index = st[S_STOP_INDEX]
    skip_bp = st[S_SKIP_BP]
    watch_hit = -1
    st[S_INDEX] = -1
    if st[S_HALTED] > 0:
        st[S_CYCLE] = st[S_HALTED]
        st[S_STATUS] = HALTED
        return
    while True:
        es = _earliest_completion(st, sg)
        e = sg[es, G_FINISH] if es >= 0 else INF
        if st[S_FAULT_PENDING] != 0:
            t_issue = st[S_FAULT_CYCLE]
        else:
            t_issue = _next_issue_time(prog, st, sg)
        if es >= 0 and e <= t_issue and e <= stop:
            idx = sg[es, G_IDX]
            if _complete(prog, st, sg, cregs, fps, tl, watch, ub, acc, host, weights,
                         scratch, es):
                if watch_hit < 0:
                    watch_hit = idx
                    stop = e
            if idx == stop_index:
                stop = min(stop, e)
            continue
        if st[S_FAULT_PENDING] != 0:
            if t_issue <= stop and watch_hit < 0:   # a watched write first, the fault next run
                st[S_CYCLE] = t_issue
                st[S_STATUS] = FAULTED
                st[S_INDEX] = st[S_FAULT_INDEX]
            else:
                st[S_CYCLE] = stop
                st[S_STATUS] = PAUSED
            break
        if t_issue < stop:
            pc = st[S_PC]
            if pc < prog.shape[0] and (flagsarr[pc] & FLAG_BREAK) != 0 and pc != skip_bp:
                st[S_CYCLE] = t_issue
                st[S_STATUS] = BREAKPOINT
                st[S_INDEX] = pc
                break
            skip_bp = -1
            ok = _issue(prog, st, sg, cregs, fps, times, tl, seg, ev, flagsarr, pc, t_issue)
            if st[S_HALTED] > 0:
                st[S_CYCLE] = st[S_HALTED]
                st[S_STATUS] = HALTED
                st[S_INDEX] = pc
                break
            if ok and pc == stop_index:
                stop = min(stop, times[pc, TM_FINISH])
                if OP_STAGE[prog[pc, COL_OP]] < 0:
                    # front-end instructions retire when their issue cycles end
                    stop_index = -1
            continue
        st[S_CYCLE] = stop
        st[S_STATUS] = PAUSED
        break
    if watch_hit >= 0 and st[S_STATUS] == PAUSED and st[S_CYCLE] == stop:
        st[S_STATUS] = WATCHPOINT
        st[S_INDEX] = watch_hit
    st[S_SKIP_BP] = -1

"""The Machine: the public API of spec/machine-api.md over the numba core (core.py).

Python calls into the core once per run/step; everything else here is views over the
core's arrays (no copies) and words for the faces (pipeline stall texts, fault messages).
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np

from ..binary import Program, SourceLoc
from ..encoding import EncodingError, encode
from ..limits import check_machine
from . import aot, core
from .config import MachineConfig
from .data import load_host, load_weights
from .decoded import (COL_FLAGS, COL_HEIGHT, COL_LEN, COL_OP, COL_REPEAT, COL_WIDTH, MMC_CONV,
                      MMC_WIDE_IN, MMC_WIDE_W, NCOLS,
                      NREGS, OP_HLT, OP_INT, OP_MMC, OP_RW, OP_SYNC, OP_TAG, OP_WSYNC,
                      decode_table, reset_registers)
from .faults import MEMORY_NAMES, MachineFault, describe
from .macs import useful_macs as _useful_macs
from .gemm import blas_threads, set_blas_threads
from .kernels import MAX_FOOTPRINT, MEM_ACC, MEM_HOST, MEM_UB, make_scratch
from .pure import python
from ..isa import ISA_TABLE

_MEMORIES = {"ub": MEM_UB, "acc": MEM_ACC, "host": MEM_HOST}
_STATUS = {core.HALTED: "halted", core.FAULTED: "fault", core.BREAKPOINT: "breakpoint",
           core.WATCHPOINT: "watchpoint", core.PAUSED: "paused", core.RUNNING: "paused"}
_DRAINING_OPS = (OP_SYNC, OP_WSYNC, OP_INT, OP_HLT)    # front-end ops that wait for the pipeline
# the views ask the core's own rule, without numba: drawing a machine must not load it
_mmc_vectors = python(core.mmc_vectors)


# ------------------------------------------------------------------------ public records
@dataclass(slots=True)
class RunResult:
    status: str                 # halted, fault, breakpoint, watchpoint, paused
    cycle: int
    fault: MachineFault | None = None
    index: int | None = None


_WATCH_MODES = {"write": core.WATCH_WRITE, "read": core.WATCH_READ,
                "access": core.WATCH_WRITE | core.WATCH_READ}


@dataclass(frozen=True)
class Watch:
    memory: str                 # "ub", "acc" or "host"
    start: int
    stop: int                   # exclusive
    access: str = "write"       # "write", "read" or "access" (either)

    def __post_init__(self):
        if self.access not in _WATCH_MODES:
            raise ValueError(f"watch access must be one of {', '.join(_WATCH_MODES)}, "
                             f"not {self.access!r}")
        if self.memory not in _MEMORIES:
            raise ValueError(f"watch memory must be one of {', '.join(_MEMORIES)}, "
                             f"not {self.memory!r}")
        if self.stop <= self.start:
            raise ValueError(f"empty watch range {self.start}..{self.stop - 1}")


@dataclass(frozen=True)
class FifoEntry:
    tile: int
    state: str                  # "fetching" or "ready"
    done: int                   # bytes
    total: int


@dataclass(frozen=True)
class TileState:
    tile: int
    state: str                  # "shifting" or "ready"
    done: int                   # cycles
    total: int


@dataclass(frozen=True)
class ActiveWeights:
    tiles: tuple[int, ...]
    wide: bool


@dataclass(frozen=True)
class StageState:
    name: str
    index: int | None
    text: str
    location: SourceLoc | None
    progress: int
    total: int
    unit: str
    cycles_in_stage: int
    stall: str | None


@dataclass(frozen=True)
class Event:
    cycle: int
    kind: str                   # "interrupt", "tag", "fault"
    index: int | None
    value: int


@dataclass
class Snapshot:
    """Every array and Python-side field of a machine, copied."""
    arrays: dict = field(default_factory=dict)
    fault: MachineFault | None = None
    status: str = "paused"
    at_break: int = -1

    @property
    def cycle(self) -> int:
        return int(self.arrays["st"][core.S_CYCLE])


# Memory run_batches may give packed weight tiles (the int8 kernel's layout, 3 N^2 bytes a
# tile with the bytes it was packed from): 320 tiles of Table 1's MLP0 take 63 MiB.
PACKED_CACHE_BYTES = 256 << 20


# ------------------------------------------------------------------------ the machine
class Machine:
    """A TPU v1: load a program and its data, run or step it, look at everything."""

    _STATE_ARRAYS = ("st", "sg", "cregs", "fps", "times", "tl", "seg", "ev", "ub", "acc", "host")

    def __init__(self, config: MachineConfig | None = None, trace: bool = False,
                 timing_only: bool = False):
        # `trace` is accepted for compatibility only: the trace is always available after
        # a run (write_trace builds it from the core's arrays; spec/machine-api.md).
        # `timing_only`: cycles, counters, events, faults and the pipeline exactly as a full
        # run, without the data path (ub, acc and host keep their loaded contents).
        self.config = config or MachineConfig()
        check_machine("the machine", self.config.array_size, self.config.ub_rows,
                      self.config.acc_rows)      # ResourceLimitError before any allocation
        self.timing_only = bool(timing_only)
        self.program: Program | None = None
        self.fault: MachineFault | None = None
        self.status = "paused"
        # One GEMM per MatrixMultiply iteration (an iteration writes at most acc_rows rows):
        # every extra OpenBLAS call costs a wake-up of its worker threads, and between calls
        # they spin while this thread converts (bench_emulator.py 1 measured 0.25 -> 0.8 of
        # np.matmul's CPU time going from 1024-row chunks to whole 4096-row MMCs).
        self._scratch = make_scratch(self.config.array_size,
                                     chunk_rows=min(self.config.acc_rows, 4096))
        self._texts: dict[int, str] = {}
        self._no_watch = np.zeros((0, 4), dtype=np.int64)
        self._breaks_set = False
        self._proven = None            # run_data: (program, image sizes, its cycles)
        self.load(Program([], self.config.shape))

    @classmethod
    def for_program(cls, program: Program, trace: bool = False, timing_only: bool = False,
                    **overrides) -> "Machine":
        return cls(MachineConfig.from_shape(program.shape, **overrides), trace=trace,
                   timing_only=timing_only)

    # -------------------------------------------------------------------- loading
    def load(self, program: Program, host=None, weights=None, copy_host: bool = True) -> None:
        """Reset everything and load `program` with its host and weight images
        (`copy_host=False`: a host array given up to the machine, not copied)."""
        cfg = self.config
        n = cfg.array_size
        host_arr = load_host(host, n, copy_host)  # raise DataFileError before changing anything
        weights_arr = load_weights(weights, n)
        self.program = program
        self.fault = None
        self.status = "paused"
        self._texts = {}
        self._breaks_set = False
        self._at_break = -1
        count = len(program.instructions)
        table, invalid = _decoded(program)
        self.prog = table.copy()
        self.flags = np.zeros(count + 1, dtype=np.int8)
        self.flags[invalid] |= core.FLAG_INVALID
        st = core.new_state()
        st[core.K_N] = n
        st[core.K_FIFO] = cfg.fifo_depth
        st[core.K_FETCH] = cfg.fetch_cycles
        st[core.K_SHIFT] = cfg.shift
        st[core.K_MMC_LAT] = cfg.mmc_latency
        st[core.K_ACT_LAT] = cfg.act_latency
        st[core.K_HOST_LAT] = cfg.host_latency
        st[core.K_HOST_MILLI] = cfg.host_milli_bytes_per_cycle
        st[core.K_UB_ROWS] = cfg.ub_rows
        st[core.K_ACC_ROWS] = cfg.acc_rows
        st[core.K_HOST_ROWS] = host_arr.shape[0]
        st[core.K_NTILES] = weights_arr.shape[0]
        st[core.K_STRICT] = 1 if cfg.hazards == "error" else 0
        st[core.K_PROFILE] = 1 if cfg.profile == "opentpu" else 0
        st[core.K_TIMING_ONLY] = 1 if self.timing_only else 0
        self.st = st
        ops = self.prog[:, COL_OP]
        mmcs = int(np.count_nonzero(ops == OP_MMC))
        self._mmcs = mmcs
        self._blas_threads = _run_blas_threads(self.prog, mmcs, self.timing_only)
        self.sg = core.new_stages(core.drain_slots(cfg.mmc_latency, mmcs))
        rows = self.sg.shape[0]                 # sg, cregs and fps share their row index
        self.cregs = np.zeros((rows, NREGS), dtype=np.int64)
        self.cregs[core.ROW_FRONT] = reset_registers()
        self.fps = np.zeros((rows, MAX_FOOTPRINT, 4), dtype=np.int64)
        self.times = np.full((max(count, 1), 3), -1, dtype=np.int64)
        # capacity of the tile table: every RW iteration (invalid repeats fault before use)
        ntiles = int(np.clip(self.prog[ops == OP_RW, COL_REPEAT], 0, 256).sum()) if count else 0
        self.tl = np.full((core.TL_ROWS, max(ntiles, 1)), -1, dtype=np.int64)
        self.seg = np.zeros((core.MAX_SEGS, 3), dtype=np.int64)
        nev = int(np.isin(ops, (OP_INT, OP_TAG)).sum()) if count else 0
        self.ev = np.zeros((max(nev, 1), 4), dtype=np.int64)
        self.ub = _zeroed((cfg.ub_rows, n), np.uint8)
        self.acc = _zeroed((cfg.acc_rows, n), np.int32)
        self.host = host_arr
        self.weights = weights_arr
        self._tile_extents = {}                 # tile -> its real K x N (machine/macs.py)
        # The core's arguments never change identity (restore copies into them), so the
        # call reuses one list and, after the first call, the compiled entry point for
        # exactly these argument types (skipping numba's per-call type dispatch, ~3 us).
        self._args = [self.prog, self.st, self.sg, self.cregs, self.fps, self.times, self.tl,
                      self.seg, self.ev, self.flags, self._no_watch, self.ub, self.acc,
                      self.host, self.weights, self._scratch]
        self._entry = None

    # -------------------------------------------------------------------- running
    @property
    def cycle(self) -> int:
        return int(self.st[core.S_CYCLE])

    def run(self, max_cycles: int | None = None, breakpoints=(), watch=()) -> RunResult:
        """Run until halt, fault, breakpoint, watchpoint or `max_cycles` (a fault)."""
        stop = core.INF if max_cycles is None else int(max_cycles)
        return self._advance(stop, -1, breakpoints, watch, max_cycles=max_cycles)

    def step(self, cycles: int = 1, breakpoints=(), watch=()) -> RunResult:
        """Advance exactly `cycles` cycles (less if the machine halts or faults, or, when
        given, at a breakpoint or watchpoint: a bounded run; "paused" at the limit)."""
        if cycles < 0:
            raise ValueError("cycles must be >= 0")
        return self._advance(self.cycle + int(cycles), -1, breakpoints, watch)

    def step_instruction(self) -> RunResult:
        """Advance until the next instruction to issue has finished its stage."""
        return self._advance(core.INF, int(self.st[core.S_PC]), (), ())

    def run_data(self) -> RunResult:
        """Run the loaded program through the data path alone (machine/dataonly.py): the
        same memories as `run()`, without the pipeline's timing.  The first call for a
        program (and image sizes) runs it timing-only to its halt, which finds any fault and
        gives the cycle count every later call reports; the data path itself checks nothing.
        Counters, events and the trace are those of that timing-only run."""
        failed = self._prove()
        if failed is not None:
            return failed
        from . import dataonly
        restore = _set_blas_threads(self._blas_threads)
        try:
            dataonly.run(self._args, int(self.st[core.K_PROFILE]))
        finally:
            if restore is not None:
                set_blas_threads(restore)
        self.status = "halted"
        return RunResult("halted", self._proven[2])

    def run_batches(self, hosts: np.ndarray, lanes: int = 1) -> RunResult:
        """The loaded program on every host image of `hosts` ((batches, rows, N) uint8,
        C-contiguous, rows those of the loaded host image) through the data path, in one
        call: each batch's outputs are written into its own image, and each batch sees the
        memories a fresh `load` with its image would give (dataonly.run_batches), so
        hosts[b] ends as `load(program, host=hosts[b]); run()` would leave the host memory.
        The program is proven once, like run_data; afterwards ub and acc hold the last
        batch's state and the machine's own host memory is untouched.  The machine must have
        run nothing but this program since its load.

        lanes > 1: up to that many batches at a time run as lanes (machine/lanes.py: each
        instruction once for all of them, their own memories kept apart from the machine's);
        the host images end the same, but ub and acc are then left as they were."""
        hosts = np.asarray(hosts)
        n = self.config.array_size
        if hosts.ndim != 3 or hosts.shape[1:] != self.host.shape or hosts.dtype != np.uint8 \
                or not hosts.flags.c_contiguous or not hosts.flags.writeable:
            raise ValueError(f"hosts must be a writable C-contiguous uint8 array of shape "
                             f"(batches, {self.host.shape[0]}, {n}), not {hosts.dtype} "
                             f"{hosts.shape}")
        failed = self._prove()
        if failed is not None:
            return failed
        self._cache_packed_tiles()
        from . import dataonly
        restore = _set_blas_threads(self._blas_threads)
        try:
            memory = self._lane_memory(int(lanes), len(hosts))
            if memory is None:
                dataonly.run_many(self._args, hosts, int(self.st[core.K_PROFILE]))
            else:
                from . import lanes as laned
                ub, acc = memory
                for start in range(0, len(hosts), len(ub)):
                    group = hosts[start:start + len(ub)]
                    laned.run(self._args, group, ub[:len(group)], acc[:len(group)],
                              int(self.st[core.K_PROFILE]))
        finally:
            if restore is not None:
                set_blas_threads(restore)
        self.status = "halted"
        return RunResult("halted", self._proven[2])

    def _lane_memory(self, lanes: int, batches: int):
        """The lanes' (ub, acc) for run_batches, (L, rows, N) each (L at most `lanes` and
        LANE_BYTES), or None for the batch-by-batch path (one lane wanted or possible, or
        one batch).  Kept for the
        program they were made for (rows outside its write set stay zero); new, zeroed
        memories for another program or shape."""
        if lanes <= 1 or batches <= 1:
            return None
        from .lanes import LANE_BYTES, lane_bytes
        lanes = min(lanes, LANE_BYTES // max(lane_bytes(self.ub.shape, self.acc.shape), 1))
        if lanes <= 1:
            return None
        key = (self.ub.shape, self.acc.shape, lanes)
        kept = getattr(self, "_lanes", None)
        if kept is None or kept[0] is not self.program or kept[1] != key:
            kept = (self.program, key, np.zeros((lanes, *self.ub.shape), self.ub.dtype),
                    np.zeros((lanes, *self.acc.shape), self.acc.dtype))
            self._lanes = kept
        return kept[2], kept[3]

    def _cache_packed_tiles(self) -> None:
        """A scratch whose int8 kernel keeps every weight tile packed (kernels.py, the
        packed-tile cache; up to PACKED_CACHE_BYTES): batches after the first never repack."""
        scratch = self._scratch
        n = self.config.array_size
        tiles = self.weights.shape[0]
        per_slot = 3 * n * n + 4 * n + 24
        wanted = min(tiles, PACKED_CACHE_BYTES // per_slot)
        if scratch.options[2] == 0 or wanted <= scratch.cache8.shape[0]:
            return                          # no int8 kernel, or cache enough already
        self._scratch = make_scratch(n, chunk_rows=min(self.config.acc_rows, 4096),
                                     cached_tiles=wanted)
        self._args[15] = self._scratch

    def _prove(self) -> RunResult | None:
        """The program run timing-only to its halt once per program and image sizes (None
        when proven; the failed run's result otherwise)."""
        key = (self.host.shape, self.weights.shape, self.config)
        proven = self._proven
        if proven is None or proven[0] is not self.program or proven[1] != key:
            saved = self.st[core.K_TIMING_ONLY]
            self.st[core.K_TIMING_ONLY] = 1
            try:
                result = self.run()
            finally:
                self.st[core.K_TIMING_ONLY] = saved
            if result.status != "halted":
                return result
            self._proven = (self.program, key, result.cycle)
        return None

    def _advance(self, stop_cycle, stop_index, breakpoints, watch, max_cycles=None) -> RunResult:
        if self.fault is not None:
            return RunResult("fault", self.cycle, self.fault, self.fault.index)
        st = self.st
        if stop_cycle < st[core.S_CYCLE]:
            stop_cycle = int(st[core.S_CYCLE])
        flags = self.flags
        if breakpoints or self._breaks_set:
            flags &= ~np.int8(core.FLAG_BREAK)
            self._breaks_set = False
            for b in breakpoints:
                b = int(b)
                if 0 <= b < len(flags) - 1:
                    flags[b] |= core.FLAG_BREAK
                    self._breaks_set = True
        watch_arr = self._no_watch
        if watch:
            watch_arr = np.array([(_MEMORIES[w.memory], w.start, w.stop, _WATCH_MODES[w.access])
                                  for w in watch], dtype=np.int64).reshape(-1, 4)
        st[core.S_STOP_CYCLE] = stop_cycle
        st[core.S_STOP_INDEX] = stop_index
        # a run started at a breakpoint issues that instruction
        st[core.S_SKIP_BP] = self._at_break if self._at_break == st[core.S_PC] else -1
        args = self._args
        args[10] = watch_arr
        entry = self._entry
        if entry is None:
            entry = aot.runner(args)        # the ahead-of-time core: no numba in the process
        restore = _set_blas_threads(self._blas_threads)
        try:
            if entry is None:
                core.run_core(*args)
                # numba's compiled entry point, or the dispatcher itself when numba does not
                # say (so the lookup runs once per load, not on every call)
                self._entry = _entry_point(args) or core.run_core
            else:
                self._entry = entry
                entry(*args)
        finally:
            if restore is not None:
                set_blas_threads(restore)
        code = int(st[core.S_STATUS])
        status = _STATUS[code]
        index = int(st[core.S_INDEX])
        index = None if index < 0 else index
        fault = None
        if code == core.FAULTED:
            fault = self._make_fault()
        elif (max_cycles is not None and code == core.PAUSED
              and self.cycle >= int(max_cycles)):
            pc = int(st[core.S_PC])
            fault = MachineFault("max_cycles", f"no halt within max_cycles = {max_cycles}",
                                 self.cycle, pc if pc < len(self.prog) else None,
                                 self.text(pc), self.location(pc))
            status = "fault"
            index = fault.index
        if fault is not None:
            self.fault = fault
        self.status = status
        if status == "breakpoint":
            self._at_break = index
        elif self._at_break != int(st[core.S_PC]):
            self._at_break = -1
        return RunResult(status, self.cycle, fault, index)

    def _make_fault(self) -> MachineFault:
        st = self.st
        code = int(st[core.S_FAULT_KIND])
        index = int(st[core.S_FAULT_INDEX])
        kind, message = describe(code, st[core.S_INFO:core.S_INFO + 5], self.config.fifo_depth)
        if code == core.F_HAZARD:
            other = int(st[core.S_INFO + 4])
            message += f" (`{self.text(other)}`)"
        return MachineFault(kind, message, int(st[core.S_FAULT_CYCLE]), index,
                            self.text(index), self.location(index))

    # -------------------------------------------------------------------- text helpers
    def text(self, index: int | None) -> str:
        """Canonical text of instruction `index` ('' outside the program)."""
        if index is None or not 0 <= index < len(self.program.instructions):
            return ""
        t = self._texts.get(index)
        if t is None:
            t = _format(self.program.instructions[index])
            self._texts[index] = t
        return t

    def location(self, index: int | None) -> SourceLoc | None:
        if index is None or not 0 <= index < len(self.program.locations):
            return None
        return self.program.locations[index]

    def _where(self, index: int) -> str:
        loc = self.location(index)
        name = self.program.instructions[index].key
        return f"{name} (#{index}, {loc.file}:{loc.line})" if loc else f"{name} (#{index})"

    # -------------------------------------------------------------------- state views
    def registers(self) -> dict[str, int]:
        regs = self.cregs[core.ROW_FRONT]
        return {r.name: int(regs[i]) for i, r in sorted(ISA_TABLE.register_by_index.items())}

    def retired(self, index: int) -> bool:
        f = self.times[index, core.TM_FINISH] if 0 <= index < len(self.prog) else -1
        return 0 <= f <= self.cycle

    def issue_cycle(self, index: int) -> int:
        if not 0 <= index < len(self.prog):
            return -1
        t = int(self.times[index, core.TM_ISSUE])
        return t if 0 <= t < self.cycle else -1

    def finish_cycle(self, index: int) -> int:
        return int(self.times[index, core.TM_FINISH]) if self.retired(index) else -1

    def intervals(self) -> np.ndarray:
        """A copy, (instructions, 3) int64: the issue, start and finish cycle of every
        instruction issued so far, -1 in all three for those not issued yet.  An issued
        instruction's whole timeline is fixed when it issues (the timestamp model of
        core.py), so the finish of one still in flight is already its true finish."""
        t = self.times[:len(self.prog)].copy()
        t[(t[:, core.TM_ISSUE] < 0) | (t[:, core.TM_ISSUE] >= self.cycle)] = -1
        return t

    def tile_intervals(self) -> np.ndarray:
        """A copy, (tiles requested so far, 7) int64, one row per weight tile in request
        order: tile number, request, fetch start, fetch end, shift start, shift end and
        switch-in cycle (-1 where not known yet).  Like intervals(), times are the timing
        model's, fixed when the tile is requested; cycles after `cycle` are still to come."""
        nreq = int(self.st[core.S_NREQ])
        rows = (core.T_TILE, core.T_REQ, core.T_FS, core.T_FE, core.T_SS, core.T_SE, core.T_SW)
        return self.tl[list(rows), :nreq].T.copy()

    def _tiles(self):
        """(number of tiles requested, tile table) at the current cycle."""
        nreq = int(self.st[core.S_NREQ])
        tl = self.tl[:, :nreq]
        return nreq, tl

    def fifo(self) -> list[FifoEntry]:
        """Tiles handed to the fetch engine and not yet shifting into the shadow."""
        c = self.cycle
        nreq, tl = self._tiles()
        total = self.config.tile_bytes
        fetch = self.config.fetch_cycles
        ss = tl[core.T_SS]
        qs = np.flatnonzero((tl[core.T_REQ] < c) & ((ss < 0) | (ss >= c)))
        out = []
        for q in qs:
            fs, fe = tl[core.T_FS, q], tl[core.T_FE, q]
            if c >= fe:
                out.append(FifoEntry(int(tl[core.T_TILE, q]), "ready", total, total))
            else:
                done = max(0, c - fs) * total // fetch
                out.append(FifoEntry(int(tl[core.T_TILE, q]), "fetching", int(done), total))
        return out

    def shadow(self) -> TileState | None:
        """The tile in the shadow buffer (the later one of a 16-bit pair being shifted)."""
        c = self.cycle
        nreq, tl = self._tiles()
        shift = self.config.shift
        ss, sw = tl[core.T_SS], tl[core.T_SW]
        qs = np.flatnonzero((ss >= 0) & (ss < c) & ((sw < 0) | (sw >= c)))
        if len(qs) == 0:
            return None
        q = qs[-1]
        tile = int(tl[core.T_TILE, q])
        if c >= tl[core.T_SE, q]:
            return TileState(tile, "ready", shift, shift)
        return TileState(tile, "shifting", int(c - ss[q]), shift)

    def active(self) -> ActiveWeights | None:
        c = self.cycle
        nreq, tl = self._tiles()
        sw = tl[core.T_SW]
        qs = np.flatnonzero((sw >= 0) & (sw < c))
        if len(qs) == 0:
            return None
        last = qs[-1]
        if tl[core.T_HI, last]:
            return ActiveWeights((int(tl[core.T_TILE, last - 1]), int(tl[core.T_TILE, last])), True)
        return ActiveWeights((int(tl[core.T_TILE, last]),), False)

    def tile_values(self, tile: int) -> np.ndarray:
        return self.weights[tile].view(np.int8)

    def _occupant(self, s: int):
        """(index, sg row) of the instruction holding stage s at this cycle, or None.  An
        MMC holds the matrix stage until its last vector has entered (G_FREE); its drain
        is shown by _draining_mmcs."""
        c = self.cycle
        row = self.sg[s]
        idx = int(row[core.G_IDX])
        if idx < 0 or not (row[core.G_ISSUE] < c < row[core.G_FREE]):
            return None
        return idx, row

    def _draining_mmcs(self, c) -> list[int]:
        """sg rows of the MatrixMultiplies past their last vector and not yet finished at
        cycle c, oldest first: the drain ring, then the matrix stage's own MMC."""
        st, sg = self.st, self.sg
        slots = sg.shape[0] - core.ROW_DRAIN
        head, count = int(st[core.S_DRAIN_HEAD]), int(st[core.S_DRAIN_COUNT])
        rows = [core.ROW_DRAIN + (head + k) % slots for k in range(count)]
        rows.append(core.STAGE_MATRIX)
        return [r for r in rows if sg[r, core.G_IDX] >= 0
                and sg[r, core.G_ISSUE] < c and sg[r, core.G_FREE] <= c < sg[r, core.G_FINISH]]

    def pipeline(self) -> list[StageState]:
        c = self.cycle
        out = []
        for s, name in enumerate(core.STAGE_NAMES):
            occ = self._occupant(s)
            if occ is None:
                if s == core.STAGE_MATRIX:
                    out.append(self._drain_state(c))
                else:
                    out.append(StageState(name, None, "", None, 0, 0, "", 0, None))
                continue
            idx, row = occ
            issue, start, finish = int(row[core.G_ISSUE]), int(row[core.G_START]), int(row[core.G_FINISH])
            stall = None
            if s == core.STAGE_MATRIX:
                progress, total, stall = self._matrix_progress(idx, c)
                unit = "rows"
            else:
                rows = int(self.prog[idx, COL_LEN] * self.prog[idx, COL_REPEAT])
                total, unit = (rows, "rows") if rows > 0 else (finish - start, "cycles")
                span = max(1, finish - start)
                progress = int(min(max(c - start, 0), span) * total // span)
                if c < start:
                    stall = self._hazard_text(s, row)
            out.append(StageState(name, idx, self.text(idx), self.location(idx), progress,
                                  total, unit, c - issue, stall))
        out.append(self._weights_state(c))
        out.append(self._front_state(c))
        return out

    def _drain_state(self, c) -> StageState:
        """No MMC streaming: the oldest one still draining, progress in cycles of the drain."""
        draining = self._draining_mmcs(c)
        if not draining:
            return StageState("matrix", None, "", None, 0, 0, "", 0, None)
        row = self.sg[draining[0]]
        idx = int(row[core.G_IDX])
        free, finish = int(row[core.G_FREE]), int(row[core.G_FINISH])
        left = finish - c
        text = f"draining the array into the accumulators ({left} cycle{'s' * (left != 1)} left"
        more = len(draining) - 1
        text += f"; {more} more MMC{'s' if more > 1 else ''} draining behind it)" if more else ")"
        return StageState("matrix", idx, self.text(idx), self.location(idx), c - free,
                          finish - free, "cycles", c - int(row[core.G_ISSUE]), text)

    def _rw_stall(self, c):
        """An RW waits when its next tile's hand-off is later than this cycle (FIFO full)."""
        q0, nt = int(self.st[core.S_RW_TILE0]), int(self.st[core.S_RW_NTILES])
        for q in range(q0, q0 + nt):
            req = int(self.tl[core.T_REQ, q])
            if req >= c:
                if req > c:
                    return (f"Weight FIFO full ({self.config.fifo_depth} tiles): tile "
                            f"{int(self.tl[core.T_TILE, q])} waits for a tile to shift out")
                return None
        return None

    def _matrix_progress(self, idx, c):
        seg = self.seg[:int(self.st[core.S_NSEG])]
        row = self.prog[idx]
        total = int(_mmc_vectors(row))
        rate = (2 if row[COL_FLAGS] & MMC_WIDE_IN else 1) * (2 if row[COL_FLAGS] & MMC_WIDE_W else 1)
        active = 0
        stall = None
        for a, b, kind in seg:
            if kind == core.SEG_ACTIVE:
                active += max(0, min(b, c) - a)
            elif kind in (core.SEG_RAW, core.SEG_INPUT):
                continue                         # counters overlapping the waits below
            elif a <= c < b:                     # what the matrix unit does in the next cycle
                if kind == core.SEG_HAZARD:
                    stall = self._hazard_text(core.STAGE_MATRIX, self.sg[core.STAGE_MATRIX])
                else:
                    stall = self._weight_wait_text(kind, c)
        return active // rate, total, stall

    def _weight_wait_text(self, kind, c):
        nreq, tl = self._tiles()
        for q in range(nreq):
            sw = tl[core.T_SW, q]
            if sw >= c or sw < 0:
                tile = int(tl[core.T_TILE, q])
                if kind == core.SEG_WSTALL:
                    fs, fe = tl[core.T_FS, q], tl[core.T_FE, q]
                    fetch = int(fe - fs)
                    if c < fs:
                        return f"waiting for weight tile {tile} (queued for fetch)"
                    return (f"waiting for weight tile {tile} (fetching, "
                            f"{min(c - fs, fetch)}/{fetch} cycles)")
                ss = tl[core.T_SS, q]
                return f"weight shift: tile {tile} ({c - ss}/{self.config.shift} cycles)"
        return "waiting for weights"

    def _hazard_text(self, s, row):
        blocker = int(row[core.G_BLOCKER])
        if blocker < 0:
            return "waiting"
        for t in range(self.sg.shape[0]):          # the stages and the draining MMCs
            if t != s and self.sg[t, core.G_IDX] == blocker:
                mine, theirs = self.fps[s][:row[core.G_NFP]], self.fps[t][:self.sg[t, core.G_NFP]]
                for m_, w_, a0, a1 in mine:
                    for m2, w2, b0, b1 in theirs:
                        if m_ == m2 and (w_ or w2) and max(a0, b0) < min(a1, b1):
                            kind = "RAW" if not w_ else ("WAR" if not w2 else "WAW")
                            verb = "written" if w2 else "read"
                            return (f"{kind}: {MEMORY_NAMES[int(m_)]} rows {max(a0, b0)}-"
                                    f"{min(a1, b1) - 1} {verb} by {self._where(blocker)}")
        return f"waiting for {self._where(blocker)}"

    def _rw_in_port(self, c):
        """Index of the Read_Weights holding the weight port at cycle c (still handing over
        tiles), or None."""
        idx = int(self.st[core.S_RW_IDX])
        if idx < 0 or not (self.times[idx, core.TM_ISSUE] < c < self.st[core.S_RW_FREE]):
            return None
        return idx

    def _weights_state(self, c):
        """The weight port and fetch engine: a Read_Weights still handing over its tiles
        (progress in tiles, the FIFO-full wait as its stall), else the tile being fetched."""
        idx = self._rw_in_port(c)
        if idx is not None:
            q0, nt = int(self.st[core.S_RW_TILE0]), int(self.st[core.S_RW_NTILES])
            handed = int(np.count_nonzero(self.tl[core.T_REQ, q0:q0 + nt] < c))
            return StageState("weights", idx, self.text(idx), self.location(idx), handed, nt,
                              "tiles", c - int(self.times[idx, core.TM_ISSUE]),
                              self._rw_stall(c))
        nreq, tl = self._tiles()
        fs, fe = tl[core.T_FS], tl[core.T_FE]
        qs = np.flatnonzero((fs < c) & (c < fe))
        if len(qs):
            q = qs[0]
            tile = int(tl[core.T_TILE, q])
            return StageState("weights", None, f"fetch tile {tile}", None, int(c - fs[q]),
                              int(fe[q] - fs[q]), "cycles", int(c - fs[q]), None)
        return StageState("weights", None, "", None, 0, 0, "", 0, None)

    def _front_state(self, c):
        pc = int(self.st[core.S_PC])
        if self.status in ("halted", "fault") or pc >= len(self.prog):
            return StageState("front", None, "", None, 0, 0, "", 0, None)
        op = int(self.prog[pc, COL_OP])
        stage = int(core.OP_STAGE[op])
        stall = None
        if stage >= 0 and self._occupant(stage) is not None:
            stall = f"waiting for the {core.STAGE_NAMES[stage]} stage"
        elif stage == core.PORT_WEIGHTS and self._rw_in_port(c) is not None:
            stall = "waiting for the weight port"
        elif stage < 0 and op in _DRAINING_OPS:
            if any(self._occupant(s) is not None for s in range(core.NSTAGES)) or \
                    self._draining_mmcs(c) or self._rw_in_port(c) is not None:
                stall = "draining the pipeline"
        return StageState("front", pc, self.text(pc), self.location(pc), 0, 1, "instructions",
                          max(0, c - int(self.st[core.S_FRONT])), stall)

    # -------------------------------------------------------------------- counters
    def counters(self, useful_macs: bool = True) -> dict:
        """spec/timing.md 8.  `useful_macs=False`: skip the tile-extent scan behind
        useful_macs (its value, tops and mxu_utilization are None), for callers that know
        the network's MACs from its shapes (the apps' sweep points and profiles: a scan of
        CNN1's 25k zero tiles cost more than its timing-only run)."""
        st = self.st
        c = self.cycle
        active, wstall, wshift = int(st[core.C_ACTIVE]), int(st[core.C_WSTALL]), int(st[core.C_WSHIFT])
        raw, inp = int(st[core.C_RAW]), int(st[core.C_INPUT])
        busy = [int(st[core.C_BUSY + s]) for s in range(core.NSTAGES)]
        for s in range(core.NSTAGES):
            if s != core.STAGE_MATRIX and self.sg[s, core.G_PENDING]:
                busy[s] += max(0, c - int(self.sg[s, core.G_ISSUE]))
        # the latest MMC's matrix-stage timeline is folded only when the next MMC issues
        # (core._fold_matrix_timeline): add the part before this cycle
        for a, b, kind in self.seg[:int(st[core.S_NSEG])]:
            d = max(0, min(int(b), c) - int(a))
            if kind == core.SEG_RAW:             # rows 7 and 8 overlap the partition
                raw += d
                continue
            if kind == core.SEG_INPUT:
                inp += d
                continue
            busy[core.STAGE_MATRIX] += d
            if kind == core.SEG_ACTIVE:
                active += d
            elif kind == core.SEG_WSTALL:
                wstall += d
            elif kind == core.SEG_WSHIFT:
                wshift += d
        nreq, tl = self._tiles()
        busy_w = int(np.clip(np.minimum(tl[core.T_FE], c) - tl[core.T_FS], 0, None).sum()) if nreq else 0
        slots = int(st[core.C_MACS])            # vectors x N x N per MMC: padding included
        macs = _useful_macs(self.prog, self.times, self.tl, nreq, self.weights, c,
                            self._tile_extents) if useful_macs else None
        fin = self.times[:len(self.prog), core.TM_FINISH]
        n = self.config.array_size
        seconds = c / self.config.clock_hz
        return {
            "cycles": c,
            "instructions": int(np.count_nonzero((fin >= 0) & (fin <= c))),
            "array_active_cycles": active,
            "weight_stall_cycles": wstall,
            "weight_shift_cycles": wshift,
            "non_matrix_cycles": c - active - wstall - wshift,
            "raw_stall_cycles": raw,
            "input_stall_cycles": inp,
            "useful_macs": macs,
            "array_mac_slots": slots,
            "tops": None if macs is None else (2 * macs / seconds / 1e12) if c else 0.0,
            "mxu_utilization": None if macs is None else (macs / (c * n * n)) if c else 0.0,
            "busy_input": busy[0], "busy_matrix": busy[1], "busy_activate": busy[2],
            "busy_output": busy[3], "busy_weights": busy_w,
        }

    @property
    def events(self) -> list[Event]:
        kinds = {core.EV_INTERRUPT: "interrupt", core.EV_TAG: "tag"}
        out = [Event(int(cy), kinds[int(k)], int(i), int(v))
               for cy, k, i, v in self.ev[:int(self.st[core.S_NEVENTS])] if cy < self.cycle]
        if self.fault is not None:
            out.append(Event(self.fault.cycle, "fault", self.fault.index, 0))
        return out

    # -------------------------------------------------------------------- time travel
    def snapshot(self) -> Snapshot:
        arrays = {name: getattr(self, name).copy() for name in self._STATE_ARRAYS}
        return Snapshot(arrays, self.fault, self.status, self._at_break)

    def restore(self, snap: Snapshot) -> None:
        for name, arr in snap.arrays.items():
            mine = getattr(self, name)
            if mine.shape != arr.shape:
                raise ValueError("snapshot belongs to another program or machine shape")
            mine[...] = arr
        self.fault = snap.fault
        self.status = snap.status
        self._at_break = snap.at_break

    # -------------------------------------------------------------------- trace / stats
    def write_trace(self, path) -> None:
        from .trace import write_trace
        write_trace(self, path)

    def stats_json(self) -> dict:
        from .trace import stats
        return stats(self)


def _zeroed(shape: tuple, dtype) -> np.ndarray:
    """A zero-filled array on its own anonymous memory map: the kernel hands out zero pages
    as they are first touched, so a 25 MiB Unified Buffer costs nothing until written and
    a reload costs no memset.  (np.zeros may come from the heap after glibc raises its mmap
    threshold, and then zeroes all of it: 1-130 ms per load, measured, which dominated
    timing-only runs.)"""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes < (1 << 20):
        return np.zeros(shape, dtype)
    # Private, not mmap's default MAP_SHARED (shmem: each first touch took a shmem page,
    # and a forked child wrote into its parent's buffer), and in transparent huge pages
    # where the kernel allows them: a run writing 4 MiB of fresh accumulators took 1,024
    # faults, ~4 ms, 3-4 x the 8-bit MatrixMultiply that wrote them (bench_emulator.py 1:
    # one 4096-row MMC 9.2 -> 1.6 ms, the 8-layer MLP 38 -> 27 ms at load 9).
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    memory = mmap.mmap(-1, nbytes, flags=flags) if flags else mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass                              # a kernel without transparent huge pages
    return np.frombuffer(memory, dtype=dtype).reshape(shape)


def _decoded(program: Program):
    """(decoded int64 table, indices of invalid instructions) of `program`, cached on it:
    sweeps, profiles and the debugger's restarts load one program many times, and decoding
    and validating every instruction dominated a timing-only run's cost.  Instructions are
    frozen, so the identities of the list's items tell whether the program changed."""
    cached = program._machine_table
    if cached and cached[0] is None:
        # decoded where the program was made (the apps' table cache, apps/tables.py):
        # such a program's instructions are never edited
        return cached[1], cached[2]
    key = tuple(map(id, program.instructions))
    if cached and cached[0] == key:
        return cached[1], cached[2]
    table, undecodable = _decode(program.instructions)
    invalid = set(undecodable)
    validity: dict = {}                    # programs repeat instructions: check each once
    for i, ins in enumerate(program.instructions):
        ok = validity.get(ins)
        if ok is None:
            ok = validity[ins] = _valid(ins)
        if not ok:
            invalid.add(i)
    invalid = np.array(sorted(invalid), dtype=np.int64)
    table.flags.writeable = False
    program._machine_table = (key, table, invalid)
    return table, invalid


def _decode(instructions):
    """The int64 table, and the indices of hand-made instructions it cannot represent
    (they become NOPs marked invalid, so they fault when they would issue)."""
    try:
        return decode_table(instructions), []
    except Exception:
        pass
    table = np.zeros((len(instructions), NCOLS), dtype=np.int64)
    bad = []
    for i, ins in enumerate(instructions):
        try:
            table[i] = decode_table([ins])[0]
        except Exception:
            bad.append(i)
    return table, bad


# A MatrixMultiply iteration is one GEMM of (vectors x N) by (N x N).  From this many
# vectors per iteration on average, OpenBLAS's threads pay for themselves (measured on
# the 2-core machine with bench_emulator.py 1: the 8 x 256x256 MLP at B = 4096 runs in 32 ms
# with 2 threads against 61 ms with 1); below it, single-threaded (see _run_blas_threads).
LARGE_GEMM_VECTORS = 512


def _run_blas_threads(prog: np.ndarray, mmcs: int, timing_only: bool) -> int | None:
    """OpenBLAS threads while this program runs: None leaves OpenBLAS's setting alone.

    TPUASM_BLAS_THREADS=n forces n (0: leave OpenBLAS alone).  By default, 1 for programs
    of small GEMMs, OpenBLAS's own count (all cores) for programs whose MatrixMultiplies
    stream LARGE_GEMM_VECTORS vectors or more per iteration on average.  Why not always all
    cores: the machine interleaves GEMMs with single-threaded work (conversions, Activate,
    the pipeline), and between GEMMs OpenBLAS's idle workers spin; with small GEMMs that
    made a 64-layer OpenTPU program take 0.5-0.9 s of CPU with 2 threads against 0.03 s
    with 1 (and 20-30x the wall time on a shared machine).  bench_emulator.py 1 prints
    np.matmul at both settings next to the emulator."""
    if timing_only or not mmcs:
        return None                                   # no GEMM runs
    from ..environment import raw
    forced = raw("TPUASM_BLAS_THREADS")
    if forced is not None:
        try:
            return max(0, int(forced)) or None
        except ValueError:
            pass
    rows = prog[prog[:, COL_OP] == OP_MMC]
    conv = (rows[:, COL_FLAGS] & MMC_CONV) != 0
    per_iteration = np.where(conv, rows[:, COL_HEIGHT] * rows[:, COL_WIDTH], rows[:, COL_LEN])
    vectors = float((per_iteration * rows[:, COL_REPEAT]).sum())
    iterations = float(rows[:, COL_REPEAT].sum())
    return None if vectors >= LARGE_GEMM_VECTORS * iterations else 1


def _set_blas_threads(threads: int | None):
    """Set OpenBLAS to `threads` for a run; the previous count to restore, or None."""
    if threads is None:
        return None
    previous = blas_threads()
    if previous is None or previous == threads:
        return None
    set_blas_threads(threads)
    return previous


def _entry_point(args):
    """The compiled run_core for the types of `args` (None if numba does not say)."""
    try:
        sig = tuple(core.run_core.typeof_pyval(a) for a in args)
        return core.run_core.overloads[sig].entry_point
    except Exception:          # any doubt: keep using the type-checking dispatcher
        return None


def _valid(ins) -> bool:
    """Encodable (flags, repeat, operand ranges) and flags that make an instruction (no two
    of an exclusive group, no forbidden set)."""
    try:
        encode(ins)
    except (EncodingError, KeyError, TypeError):
        return False
    return ins.spec.flag_conflict(ins.flags) is None


def _format(ins) -> str:
    try:
        from ..disassembler import format_instruction
        return format_instruction(ins)
    except Exception:          # the text is for humans; never let it break a fault report
        letters = ins.flag_letters
        head = ins.key + ("." + letters if letters else "")
        ops = ", ".join(str(v) for v in ins.operands.values())
        return f"{head} {ops}".strip()

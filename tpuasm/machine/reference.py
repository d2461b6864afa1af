"""The reference model: what every instruction does, written from spec/isa.md alone.

This is the oracle the emulator is tested against, so it is deliberately plain: pure
Python and numpy, one instruction at a time, one iteration at a time, no timing and no
cleverness.  Each function below cites the section of spec/isa.md it implements.

    result = run_reference(program, host, weights)
    result.ub, result.acc, result.host        # final memories (uint8, int32, uint8)
    result.registers                          # {name: value}
    result.fault_kind, result.fault_index     # None, None when the program halted
    result.events                             # [("interrupt", index, code), ("tag", index, tag)]

Faults (section 7): a faulting instruction has no effect and everything before it has
completed.  Every check of an instruction (all iterations) runs before any of its effects.
When one instruction could fault in several ways, the kinds are checked in the order of
section 7: config, shape, address, then the weight faults no_tile, weight_width and deadlock
(an instruction that does not round-trip through its encoding, or whose flags cannot be combined,
such as ACT.RQ or VADD.LZ, is `invalid_instruction` before anything else).  The address a fault
names is the first out-of-range row in execution order (section 7).

Profiles: "tpu" (spec/isa.md) and "opentpu", whose Activate keeps the low 8 bits with no
requantization and computes Q as OpenTPU's sigmoid (spec/opentpu.md section 4).

Weights without timing: the model keeps one queue of the tiles fetched by Read_Weights and
not yet consumed by a switch (the Weight FIFO and the shadow buffer together), plus the
active weights.  The deadlock rules of sections 5.3 and 5.4 are rules about that count.
"""
from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from ..binary import Program
from ..encoding import Instruction, decode, encode
from ..errors import EncodingError
from ..functions import SIGMOID_Q15, T_MIN, TANH_Q15, to_q8
from ..isa import ISA_TABLE

REGISTERS = ISA_TABLE.registers                 # name -> Register(index, reset, min, max)
REGISTER_NAME = {r.index: r.name for r in REGISTERS.values()}

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass
class ReferenceResult:
    ub: np.ndarray                      # (ub_rows, N) uint8
    acc: np.ndarray                     # (acc_rows, N) int32
    host: np.ndarray                    # (host rows, N) uint8
    registers: dict[str, int]
    fault_kind: str | None
    fault_index: int | None
    events: list[tuple[str, int, int]]
    fault_message: str = ""
    executed: int = 0                   # instructions that completed
    next_index: int = 0                 # the instruction that would run next
    fifo: list[int] = field(default_factory=list)   # tiles fetched, not yet switched in
    active: tuple[int, ...] | None = None           # active tile(s): (t,) or (lo, hi)


class Fault(Exception):
    """Raised by a check; the instruction then has no effect."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def wrap_int32(value: int) -> int:
    """Two's complement wrap of an exact integer into int32."""
    return ((int(value) - INT32_MIN) % (1 << 32)) + INT32_MIN


def wrap_int32_array(values: np.ndarray) -> np.ndarray:
    """Elementwise int32 wrap of an int64 array of exact values."""
    v = np.asarray(values, dtype=np.int64)
    return (((v - INT32_MIN) % (1 << 32)) + INT32_MIN).astype(np.int32)


class ReferenceMachine:
    """The architectural state of section 1 and one method per instruction."""

    def __init__(self, program: Program, host, weights):
        shape = program.shape
        from ..limits import check_machine
        check_machine("the reference machine", shape.array_size, shape.ub_rows, shape.acc_rows)
        self.profile = shape.profile
        self.program = program
        self.n = n = shape.array_size
        self.fifo_depth = shape.fifo_depth
        self.ub = np.zeros((shape.ub_rows, n), dtype=np.uint8)
        self.acc = np.zeros((shape.acc_rows, n), dtype=np.int32)
        self.host = _as_bytes(host, (n,), "host", empty=(0, n))
        self.weights = _as_bytes(weights, (n, n), "weights", empty=(0, n, n))
        self.regs = {name: r.reset for name, r in REGISTERS.items()}
        self.pending: list[int] = []             # fetched tiles, oldest first
        self.active: tuple[int, ...] | None = None
        self.events: list[tuple[str, int, int]] = []

    # ------------------------------------------------------------------ checks
    @staticmethod
    def check_rows(memory: str, rows, limit: int) -> None:
        """Every row in `rows` must be in 0..limit-1 (section 7: `address`).  A range is
        checked at its ends (a 2**32-row range must not be walked row by row)."""
        if isinstance(rows, (range, _Repeat)):
            bad = _first_bad(rows, limit)
            if bad is not None:
                raise Fault("address", f"{memory} address {bad} out of range 0..{limit - 1}")
            return
        for row in rows:
            if not 0 <= row < limit:
                raise Fault("address", f"{memory} address {row} out of range 0..{limit - 1}")

    def check_ub(self, rows):
        self.check_rows("UB", rows, self.ub.shape[0])

    def check_acc(self, rows):
        self.check_rows("accumulator", rows, self.acc.shape[0])

    def check_host(self, rows):
        self.check_rows("host memory", rows, self.host.shape[0])

    def check_tiles(self, tiles):
        self.check_rows("weight tile", tiles, self.weights.shape[0])

    # ------------------------------------------------------------ instructions
    def execute(self, index: int, ins: Instruction) -> bool:
        """Run one instruction; False when it stops the machine (HLT).  Raises Fault."""
        _validate(ins)
        handler = getattr(self, "op_" + ins.key)
        return handler(index, ins) is not False

    def op_NOP(self, index, ins):           # 5.10: the front end idles; no state changes
        pass

    def op_SYNC(self, index, ins):          # 5.8: a barrier, no effect without timing
        pass

    def op_WSYNC(self, index, ins):
        pass

    def op_HLT(self, index, ins):           # 5.10
        return False

    def op_INT(self, index, ins):           # 5.9
        self.events.append(("interrupt", index, ins["code"]))

    def op_TAG(self, index, ins):           # 5.9
        self.events.append(("tag", index, ins["tag"]))

    def op_CFG(self, index, ins):           # 5.7, section 4
        reg = REGISTER_NAME[ins["reg"]]
        r = REGISTERS[reg]
        value = ins["value"]
        if not r.min <= value <= r.max:
            raise Fault("config", f"{reg} = {value} out of range {r.min}..{r.max}")
        self.regs[reg] = value

    # 5.1, 5.2 and section 3: contiguous host transfers --------------------------
    def _rows(self, ins, host_step: int, ub_step: int):
        """[(host rows, ub rows)] per iteration of a host transfer whose consecutive
        vectors are `host_step` and `ub_step` rows apart (lazy sequences: a length of
        2**32 - 1 is checked without building 2**32 rows)."""
        out = []
        for i in range(ins.repeat):
            host = ins["host"] + i * self.regs["rep_host_stride"]
            ub = ins["ub"] + i * self.regs["rep_ub_stride"]
            out.append((_stepped(host, ins["length"], host_step),
                        _stepped(ub, ins["length"], ub_step)))
        return out

    def op_RHM(self, index, ins):
        self._host_to_ub(self._rows(ins, 1, 1))

    def op_WHM(self, index, ins):
        self._ub_to_host(self._rows(ins, 1, 1))

    def _host_to_ub(self, plan):
        """Check every row of every iteration (source first), then copy in order."""
        for host_rows, ub_rows in plan:
            self.check_host(host_rows)
            self.check_ub(ub_rows)
        for host_rows, ub_rows in plan:          # in order: a later vector wins
            for h, u in zip(host_rows, ub_rows):
                self.ub[u] = self.host[h]

    def _ub_to_host(self, plan):
        for host_rows, ub_rows in plan:
            self.check_ub(ub_rows)
            self.check_host(host_rows)
        for host_rows, ub_rows in plan:
            for h, u in zip(host_rows, ub_rows):
                self.host[h] = self.ub[u]

    # 5.6: strided transfers ------------------------------------------------------
    def op_RHMA(self, index, ins):
        self._host_to_ub(self._rows(ins, self.regs["dma_host_stride"], self.regs["dma_ub_stride"]))

    def op_WHMA(self, index, ins):
        self._ub_to_host(self._rows(ins, self.regs["dma_host_stride"], self.regs["dma_ub_stride"]))

    # 5.3: Read_Weights -----------------------------------------------------------
    def op_RW(self, index, ins):
        tiles = [ins["tile"] + i for i in range(ins.repeat)]
        self.check_tiles(tiles)
        limit = self.fifo_depth + 1
        if len(self.pending) + len(tiles) > limit:
            raise Fault("deadlock",
                        f"Read_Weights would leave {len(self.pending) + len(tiles)} tiles "
                        f"fetched but not switched in (the FIFO and shadow hold {limit})")
        self.pending.extend(tiles)

    # 5.4: MatrixMultiply / Convolve ----------------------------------------------
    def _inputs(self, ub: int, count: int, wide: bool, unsigned: bool) -> np.ndarray:
        """Input vectors 0..count-1 starting at UB row ub, as exact int64 (count, N)."""
        if wide:
            lo = self.ub[ub:ub + 2 * count:2].astype(np.int64)
            hi_bytes = self.ub[ub + 1:ub + 2 * count:2]
            hi = hi_bytes.astype(np.int64) if unsigned else hi_bytes.view(np.int8).astype(np.int64)
            return lo + 256 * hi
        rows = self.ub[ub:ub + count]
        return rows.astype(np.int64) if unsigned else rows.view(np.int8).astype(np.int64)

    def _input_vector(self, ub: int, v: int, wide: bool, unsigned: bool) -> np.ndarray:
        """Input vector v (UB row ub + v, or rows ub + 2v and ub + 2v + 1 with H)."""
        return self._inputs(ub + (2 * v if wide else v), 1, wide, unsigned)[0]

    def _weight_matrix(self, unsigned: bool) -> np.ndarray:
        """The active weights as exact int64 (N, N): w[k, n]."""
        if len(self.active) == 2:                # D: lo unsigned, hi signed unless W
            lo = self.weights[self.active[0]].astype(np.int64)
            hi_bytes = self.weights[self.active[1]]
            hi = hi_bytes.astype(np.int64) if unsigned else hi_bytes.view(np.int8).astype(np.int64)
            return lo + 256 * hi
        tile = self.weights[self.active[0]]
        return tile.astype(np.int64) if unsigned else tile.view(np.int8).astype(np.int64)

    def _check_weights(self, ins, switches_per_iteration: int):
        """no_tile, weight_width and deadlock (section 5.4)."""
        f = ins.flags
        wide = bool(f & MMC["D"])
        if f & MMC["S"]:
            need = ins.repeat * switches_per_iteration
            if len(self.pending) < need:
                raise Fault("deadlock", f"switch with an empty Weight FIFO and no Read_Weights "
                                        f"in flight (needs {need} tiles, {len(self.pending)} fetched)")
        else:
            if self.active is None:
                raise Fault("no_tile", "no weight tile resident (MatrixMultiply without S)")
            if (len(self.active) == 2) != wide:
                raise Fault("weight_width",
                            f"weight width mismatch: the active weights are "
                            f"{16 if len(self.active) == 2 else 8}-bit, the instruction "
                            f"{'has' if wide else 'does not have'} D")

    def _switch(self, wide: bool):
        """S: the next tile (two with D: low bytes, then high bytes) becomes active."""
        if wide:
            self.active = (self.pending.pop(0), self.pending.pop(0))
        else:
            self.active = (self.pending.pop(0),)

    def op_MMC(self, index, ins):
        if ins.flags & MMC["C"]:
            return self._convolve(index, ins)
        f = ins.flags
        wide_in, wide_w = bool(f & MMC["H"]), bool(f & MMC["D"])
        unsigned_in, unsigned_w = bool(f & MMC["U"]), bool(f & MMC["W"])
        length = ins["length"]
        ub_step, acc_step = self.regs["rep_ub_stride"], self.regs["rep_acc_stride"]
        rows_per_vector = 2 if wide_in else 1
        # checks, every iteration, before any effect
        for i in range(ins.repeat):
            ub = ins["ub"] + i * ub_step
            acc = ins["acc"] + i * acc_step
            self.check_ub(range(ub, ub + rows_per_vector * length))
            self.check_acc(range(acc, acc + length))
        self._check_weights(ins, 2 if wide_w else 1)
        # effects
        for i in range(ins.repeat):
            if f & MMC["S"]:
                self._switch(wide_w)
            ub = ins["ub"] + i * ub_step
            acc = ins["acc"] + i * acc_step
            x = self._inputs(ub, length, wide_in, unsigned_in)        # (length, N)
            w = self._weight_matrix(unsigned_w)                         # (N, N)
            out = wrap_int32_array(x @ w)                               # out[b, n]
            overwrite = bool(f & MMC["O"]) and (i == 0 or acc_step != 0)
            for b in range(length):
                if overwrite:
                    self.acc[acc + b] = out[b]
                else:
                    total = self.acc[acc + b].astype(np.int64) + out[b].astype(np.int64)
                    self.acc[acc + b] = wrap_int32_array(total)

    def _convolve(self, index, ins):
        f = ins.flags
        wide_in, wide_w = bool(f & MMC["H"]), bool(f & MMC["D"])
        unsigned_in, unsigned_w = bool(f & MMC["U"]), bool(f & MMC["W"])
        height, width = ins["height"], ins["width"]
        s = self.regs["conv_stride"]
        kw = self.regs["conv_kw"]
        pitch = self.regs["conv_pitch"] or width
        ub, acc = ins["ub"], ins["acc"]

        def taps():
            for i in range(ins.repeat):
                yield i, i // kw, i % kw

        def pixels():
            for y in range(height):
                for x in range(width):
                    yield y, x

        # checks, tap by tap: the tap's input rows (pixels row-major), then the output rows
        for _i, dy, dx in taps():
            for y, x in pixels():
                v = (y * s + dy) * pitch + (x * s + dx)
                if wide_in:
                    self.check_ub([ub + 2 * v, ub + 2 * v + 1])
                else:
                    self.check_ub([ub + v])
            self.check_acc(range(acc, acc + height * width))
        self._check_weights(ins, 2 if wide_w else 1)
        # effects: tap by tap
        for i, dy, dx in taps():
            if f & MMC["S"]:
                self._switch(wide_w)
            w = self._weight_matrix(unsigned_w)
            overwrite = bool(f & MMC["O"]) and i == 0
            for y, x in pixels():
                v = (y * s + dy) * pitch + (x * s + dx)
                out = wrap_int32_array(self._input_vector(ub, v, wide_in, unsigned_in) @ w)
                row = acc + y * width + x
                if overwrite:
                    self.acc[row] = out
                else:
                    self.acc[row] = wrap_int32_array(self.acc[row].astype(np.int64) + out)

    # 5.5: Activate -----------------------------------------------------------------
    def _function(self, flags: int, x: int) -> int:
        """Step 1 on one int32 value."""
        if flags & ACT["R"]:
            return max(x, 0)
        if flags & ACT["Q"] and self.profile == "opentpu":
            return opentpu_sigmoid(x)               # spec/opentpu.md section 4
        if flags & ACT["Q"]:
            return int(SIGMOID_Q15[to_q8(x, self.regs["fn_in_frac"]) - T_MIN])
        if flags & ACT["T"]:
            return int(TANH_Q15[to_q8(x, self.regs["fn_in_frac"]) - T_MIN])
        return x

    def _pool_groups(self, flags: int, length: int, build: bool = True):
        """Step 2: for each output row, the input row offsets it pools and the count an
        average divides by (None: no pooling).  Raises a `shape` fault when the shape does
        not divide.  build=False: the shape checks alone and how many output rows there
        are (the groups are built only once the address checks have passed)."""
        if not flags & (ACT["M"] | ACT["A"]):
            return None
        k, width = self.regs["pool_size"], self.regs["pool_width"]
        if width == 0:
            if length % k:
                raise Fault("shape", f"pooling: length {length} is not a multiple of "
                                     f"pool_size {k}")
            if not build:
                return length // k
            return [([g * k + j for j in range(k)], k) for g in range(length // k)]
        if length % width:
            raise Fault("shape", f"pooling: length {length} is not a multiple of "
                                 f"pool_width {width}")
        height = length // width
        r = self.regs
        kh, kw = k, r["pool_size_x"] or k          # column registers: 0 / -1 = as the rows
        sy = r["pool_stride"]
        sx = r["pool_stride_x"] or sy
        if sy == 0:                           # the original rule: windows tile the image
            if r["pool_stride_x"]:
                raise Fault("shape", f"pooling: pool_stride_x {r['pool_stride_x']} needs "
                                     f"pool_stride > 0 (windows that tile have no stride)")
            if width % kw or height % kh:
                raise Fault("shape", f"pooling: a {height} x {width} image does not divide "
                                     f"into {kh} x {kw} windows")
            sy, sx, top, bottom, left, right = kh, kw, 0, 0, 0, 0
        else:
            top, bottom = r["pool_pad"], r["pool_pad_end"]
            left = top if r["pool_pad_x"] < 0 else r["pool_pad_x"]
            right = bottom if r["pool_pad_end_x"] < 0 else r["pool_pad_end_x"]
            if (top >= kh or bottom >= kh or left >= kw or right >= kw
                    or height + top + bottom < kh or width + left + right < kw):
                raise Fault("shape", f"pooling: a {height} x {width} image padded by "
                                     f"{top}, {bottom} rows and {left}, {right} columns has "
                                     f"no {kh} x {kw} window of stride {sy} x {sx}")
        out_h = (height + top + bottom - kh) // sy + 1
        out_w = (width + left + right - kw) // sx + 1
        if not build:
            return out_h * out_w
        whole = bool(r["pool_count_pad"])
        groups = []
        for py in range(out_h):
            for px in range(out_w):
                ys = [py * sy - top + dy for dy in range(kh)]
                xs = [px * sx - left + dx for dx in range(kw)]
                inside = [y * width + x for y in ys if 0 <= y < height
                          for x in xs if 0 <= x < width]
                groups.append((inside, kh * kw if whole else len(inside)))
        return groups

    def _requantize(self, x: int) -> int:
        """Step 3, exact."""
        y = x * self.regs["act_mult"]
        shift = self.regs["act_shift"]
        if shift > 0:
            y = (y + (1 << (shift - 1))) >> shift
        return y + self.regs["act_zero"]

    def _per_column_parameters(self) -> tuple[list[int], list[int], list[int]]:
        """P: (bias, multiplier, shift) per column from the 9 UB rows at act_params."""
        p = self.regs["act_params"]

        def int32_row(r):
            values = []
            for col in range(self.n):
                u = sum(int(self.ub[r + b, col]) << (8 * b) for b in range(4))
                values.append(u - (1 << 32) if u >= 1 << 31 else u)
            return values

        return (int32_row(p), int32_row(p + 4),
                [min(int(v), 46) for v in self.ub[p + 8]])

    def _lookup_table(self) -> list[int]:
        """L: the 256 bytes at act_table, entry i in row i // N, column i % N."""
        t = self.regs["act_table"]
        return [int(self.ub[t + i // self.n, i % self.n]) for i in range(256)]

    def _output_rows(self, y: int) -> list[int]:
        """Step 4: the byte(s) of one output value: one byte, or (low, high) for int16."""
        out = self.regs["act_out"]
        if out == 0:
            return [min(max(y, -128), 127) & 0xFF]
        if out == 1:
            return [min(max(y, 0), 255)]
        if out == 2:
            v = min(max(y, -32768), 32767) & 0xFFFF
            return [v & 0xFF, v >> 8]
        return [y & 0xFF]

    def op_ACT(self, index, ins):
        # Under the opentpu profile (spec/opentpu.md section 4) Q is OpenTPU's sigmoid and
        # step 3-4 is just the low 8 bits: no requantization, act_out ignored, one row each;
        # P, L and the clip bounds do nothing there.
        opentpu = self.profile == "opentpu"
        f = ins.flags
        length = ins["length"]
        pooled = self._pool_groups(f, length, build=False)   # shape faults first (section 7)
        out_vectors = length if pooled is None else pooled
        rows_per_vector = 2 if self.regs["act_out"] == 2 and not opentpu else 1
        acc_step, ub_step = self.regs["rep_acc_stride"], self.regs["rep_ub_stride"]
        per_column = bool(f & ACT["P"])
        lookup = bool(f & ACT["L"])
        if per_column:
            self.check_ub(range(self.regs["act_params"], self.regs["act_params"] + 9))
        if lookup:
            t = self.regs["act_table"]
            self.check_ub(range(t, t + -(-256 // self.n)))
        pitch, width = self.regs["act_ub_pitch"], self.regs["act_ub_width"]

        def out_row(r):                 # output vector r's row, in vectors (act_ub_pitch)
            return r if pitch == 0 else (r // width) * pitch + r % width

        for i in range(ins.repeat):
            acc = ins["acc"] + i * acc_step
            ub = ins["ub"] + i * ub_step
            self.check_acc(range(acc, acc + length))
            self.check_ub([ub + rows_per_vector * out_row(r) + k
                           for r in range(out_vectors) for k in range(rows_per_vector)])
        groups = self._pool_groups(f, length)          # built only once the checks pass
        per_column = per_column and not opentpu
        lookup = lookup and not opentpu
        if per_column:
            bias, mult, shift = self._per_column_parameters()
        table = self._lookup_table() if lookup else None
        lo, hi = self.regs["act_lo"], self.regs["act_hi"]
        for i in range(ins.repeat):
            acc = ins["acc"] + i * acc_step
            ub = ins["ub"] + i * ub_step
            # 0. P's bias (wrapping like the accumulators), 1. function (Python ints: exact)
            values = []
            for r in range(length):
                row = [int(v) for v in self.acc[acc + r]]
                if per_column:
                    row = [wrap_int32(v + b) for v, b in zip(row, bias)]
                values.append([self._function(f, v) for v in row])
            counts = [1] * len(values)
            # 2. pooling (with P an average keeps the sum; its count joins step 3's divisor)
            if groups is not None:
                pooled = []
                counts = []
                for members, count in groups:
                    row = []
                    for col in range(self.n):
                        items = [values[r][col] for r in members]
                        if f & ACT["M"]:
                            row.append(max(items))
                        elif per_column:
                            row.append(sum(items))
                        else:
                            row.append((sum(items) + count // 2) // count)
                    pooled.append(row)
                    counts.append(count if f & ACT["A"] else 1)
                values = pooled
            # 3. requantize, clip and 4. output, 5. lookup
            for r, row in enumerate(values):
                if opentpu:
                    bytes_ = [[v & 0xFF] for v in row]
                elif per_column and self.regs["act_float"]:
                    ys = [float_requantize(min(max(v, INT32_MIN), INT32_MAX), mult[col])
                          + self.regs["act_zero"] for col, v in enumerate(row)]
                    bytes_ = [self._output_rows(min(max(y, lo), hi)) for y in ys]
                elif per_column:
                    ys = []
                    for col, v in enumerate(row):
                        v = min(max(v, INT32_MIN), INT32_MAX)
                        ys.append(round_half_even(v * mult[col], counts[r] << shift[col])
                                  + self.regs["act_zero"])
                    bytes_ = [self._output_rows(min(max(y, lo), hi)) for y in ys]
                else:
                    bytes_ = [self._output_rows(min(max(self._requantize(v), lo), hi))
                              for v in row]
                if table is not None:
                    bytes_ = [[table[b] for b in bs] for bs in bytes_]
                if rows_per_vector == 1:
                    self.ub[ub + out_row(r)] = [b[0] for b in bytes_]
                else:
                    self.ub[ub + 2 * out_row(r)] = [b[0] for b in bytes_]
                    self.ub[ub + 2 * out_row(r) + 1] = [b[1] for b in bytes_]

    # 5.11: element-wise vector operations ------------------------------------------
    def op_VADD(self, index, ins):
        self._vector(ins, lambda x, y, r: (x - r["vec_zero_a"]) * r["vec_mult_a"]
                     + (y - r["vec_zero_b"]) * r["vec_mult_b"], float_add)

    def op_VMUL(self, index, ins):
        self._vector(ins, lambda x, y, r: (x - r["vec_zero_a"]) * (y - r["vec_zero_b"])
                     * r["vec_mult_a"], float_mul)

    def _vector(self, ins, combine, in_float):
        f = ins.flags
        unsigned, broadcast, lookup = (bool(f & VEC[c]) for c in "UBL")
        # X, Y, Z: A, B, C are int16, a vector two UB rows (low bytes, then high bytes)
        wide_a, wide_b, wide_c = (bool(f & VEC[c]) for c in "XYZ")
        if self.regs["vec_float"] and (wide_a or wide_b or wide_c):
            raise Fault("config", "vec_float = 1 computes 8-bit operands only, and this "
                        "instruction has a 16-bit one (flag X, Y or Z)")
        length, step = ins["length"], self.regs["rep_ub_stride"]
        per_a, per_b, per_c = (2 if w else 1 for w in (wide_a, wide_b, wide_c))
        if lookup:
            t = self.regs["act_table"]
            self.check_ub(range(t, t + -(-256 // self.n)))
        plan = []
        for i in range(ins.repeat):
            a = ins["a"] + i * step
            b = ins["b"] if broadcast else ins["b"] + i * step
            c = ins["c"] + i * step
            self.check_ub(range(a, a + per_a * length))
            self.check_ub(range(b, b + per_b * (1 if broadcast else length)))
            self.check_ub(range(c, c + per_c * length))
            plan.append((a, b, c))
        table = self._lookup_table() if lookup else None
        shift, zc = self.regs["vec_shift"], self.regs["vec_zero_c"]
        if wide_c:
            lo, hi = -32768, 32767
        else:
            lo, hi = (0, 255) if unsigned else (-128, 127)

        def vector(base, r, wide):
            """Vector r of the operand at UB row `base`, as Python integers."""
            if wide:
                low, high = self.ub[base + 2 * r], self.ub[base + 2 * r + 1]
                return [int.from_bytes(bytes([int(x), int(y)]), "little", signed=True)
                        for x, y in zip(low, high)]
            return [int(v) if unsigned or v < 128 else int(v) - 256 for v in self.ub[base + r]]

        for a, b, c in plan:
            # every read of an iteration before its writes (spec/isa.md 5.11)
            rows_a = [vector(a, r, wide_a) for r in range(length)]
            rows_b = [vector(b, 0 if broadcast else r, wide_b) for r in range(length)]
            for r in range(length):
                out = []
                for x, y in zip(rows_a[r], rows_b[r]):
                    if self.regs["vec_float"]:
                        q = in_float(x, y, self.regs)
                    else:
                        q = round_half_even(combine(x, y, self.regs), 1 << shift) + zc
                    out.append(min(max(q, lo), hi))
                if wide_c:
                    pairs = [v.to_bytes(2, "little", signed=True) for v in out]
                    self.ub[c + 2 * r] = [p[0] for p in pairs]
                    self.ub[c + 2 * r + 1] = [p[1] for p in pairs]
                else:
                    out = [v & 0xFF for v in out]
                    self.ub[c + r] = [table[v] for v in out] if table is not None else out


def round_half_even(numerator: int, denominator: int) -> int:
    """numerator / denominator (> 0) rounded to the nearest integer, ties to even."""
    q, r = divmod(numerator, denominator)
    if 2 * r > denominator or (2 * r == denominator and q % 2 == 1):
        q += 1
    return q


# spec/opentpu.md's step table for -5 <= x <= 5 (written out here, not imported: the
# reference model stays independent of the code it checks).
_OPENTPU_SIGMOID_STEPS = {-5: 1, -4: 4, -3: 12, -2: 30, -1: 68, 0: 127, 1: 186, 2: 224,
                          3: 242, 4: 250, 5: 253}


def float_requantize(value: int, word: int) -> int:
    """Activate P with act_float = 1 (spec/isa.md 5.5): the int32 word's bits as an IEEE
    float32 multiplier, numpy's float32 multiply of float32(value) by it, rounded half to
    even (Python's round), saturated to int32, NaN -> 0."""
    multiplier = np.frombuffer(struct.pack("<I", word & 0xFFFFFFFF), np.float32)[0]
    with np.errstate(over="ignore", invalid="ignore"):
        product = float(np.float32(value) * multiplier)
    if product != product:
        return 0
    if product in (float("inf"), float("-inf")):
        return INT32_MAX if product > 0 else INT32_MIN
    return min(max(round(product), INT32_MIN), INT32_MAX)


def _f32(word: int) -> np.float32:
    return np.frombuffer(struct.pack("<I", word & 0xFFFFFFFF), np.float32)[0]


def _fused(x: int, r: np.float32, c: np.float32) -> np.float32:
    """fl32(x * r + c) rounded once: the exact rational value, rounded to float32 by
    numpy from the nearest float64 (x * r and the sum need at most 9 + 24 + the exponent
    gap bits, within float64's 53 at these magnitudes)."""
    if not (np.isfinite(r) and np.isfinite(c)):      # inf and NaN as IEEE arithmetic has them
        with np.errstate(all="ignore"):
            return np.float32(float(x) * float(r) + float(c))
    exact = Fraction(x) * Fraction(float(r)) + Fraction(float(c))
    with np.errstate(over="ignore"):
        return np.float32(float(exact))


def float_add(x: int, y: int, regs) -> int:
    """VADD with vec_float = 1 (spec/isa.md 5.11): MLAS's QLinearAdd."""
    ra, rb = _f32(regs["vec_mult_a"]), _f32(regs["vec_mult_b"])
    with np.errstate(all="ignore"):
        k = np.float32(regs["vec_zero_c"]) - (ra * np.float32(regs["vec_zero_a"])
                                             + rb * np.float32(regs["vec_zero_b"]))
        return _rounded(_fused(x, ra, _fused(y, rb, k)))


def float_mul(x: int, y: int, regs) -> int:
    """VMUL with vec_float = 1 (spec/isa.md 5.11): MLAS's QLinearMul."""
    with np.errstate(all="ignore"):
        product = np.float32(x - regs["vec_zero_a"]) * np.float32(y - regs["vec_zero_b"])
        return _rounded(product * _f32(regs["vec_mult_a"])) + regs["vec_zero_c"]


def _rounded(value: np.float32) -> int:
    v = float(value)
    if v != v:
        return 0
    if v in (float("inf"), float("-inf")):
        return 1 << 40 if v > 0 else -(1 << 40)       # saturates either way
    return round(v)


def opentpu_sigmoid(x: int) -> int:
    """`int(255 / (1 + exp(-x)))` for an int32 x, from the step table of spec/opentpu.md."""
    if x == INT32_MIN:          # OpenTPU negates an int32 -2^31 back to -2^31: exp(...) = 0
        return 255
    if x <= -6:
        return 0
    if x >= 37:
        return 255
    if x >= 6:
        return 254
    return _OPENTPU_SIGMOID_STEPS[x]


MMC = {letter: flag.bit for letter, flag in ISA_TABLE.instructions["MMC"].flags.items()}
ACT = {letter: flag.bit for letter, flag in ISA_TABLE.instructions["ACT"].flags.items()}
VEC = {letter: flag.bit for letter, flag in ISA_TABLE.instructions["VADD"].flags.items()}


def _validate(ins: Instruction) -> None:
    """A corrupt instruction (one that does not round-trip through the 12-byte encoding, or
    whose flags cannot be combined: isa.toml's exclusive and forbidden) faults with
    `invalid_instruction`."""
    try:
        if decode(encode(ins)) != ins:
            raise EncodingError("does not round-trip through its encoding")
    except EncodingError as e:
        raise Fault("invalid_instruction", str(e)) from None
    conflict = ins.spec.flag_conflict(ins.flags)
    if conflict:
        raise Fault("invalid_instruction", conflict)


def _stepped(start: int, count: int, step: int):
    """The rows start, start + step, ... (count of them), lazily."""
    if step == 0:
        return _Repeat(start, count)
    return range(start, start + count * step, step)


class _Repeat:
    """One row, `count` times, without a list of `count` entries."""
    __slots__ = ("row", "count")

    def __init__(self, row: int, count: int):
        self.row, self.count = row, count

    def __iter__(self):
        return itertools.repeat(self.row, self.count)

    def __len__(self):
        return self.count


def _first_bad(rows, limit: int):
    """The first row of a range or _Repeat outside 0..limit-1 (in order), or None."""
    if len(rows) == 0:
        return None
    if isinstance(rows, _Repeat):
        return None if 0 <= rows.row < limit else rows.row
    start, step = rows.start, rows.step
    if not 0 <= start < limit:
        return start
    k = -(-(limit - start) // step) if step > 0 else -(-(start + 1) // -step)
    return rows[k] if k < len(rows) else None


def _as_bytes(data, row_shape: tuple[int, ...], name: str, empty: tuple[int, ...]) -> np.ndarray:
    """A private uint8 copy of a host or weight image (int8 or uint8 array, or a .npy path)."""
    if data is None:
        return np.zeros(empty, dtype=np.uint8)
    if isinstance(data, (str, os.PathLike)):
        from ..files import load_npy
        data = load_npy(data, what=f"{name} image")
    data = np.asarray(data)
    if data.dtype not in (np.int8, np.uint8):
        raise ValueError(f"{name}: dtype {data.dtype}, expected int8 or uint8")
    if data.ndim != len(row_shape) + 1 or data.shape[1:] != row_shape:
        raise ValueError(f"{name}: shape {data.shape}, expected (rows, {', '.join(map(str, row_shape))})")
    return data.view(np.uint8).copy()


def run_reference(program: Program, host=None, weights=None, *,
                  max_instructions: int | None = None) -> ReferenceResult:
    """Run `program` to its end, its first HLT or its first fault (spec/isa.md).

    `max_instructions` stops (without a fault) after that many instructions have run.
    """
    m = ReferenceMachine(program, host, weights)
    fault_kind = fault_index = None
    message = ""
    executed = 0
    index = 0
    while index < len(program.instructions):
        if max_instructions is not None and executed >= max_instructions:
            break
        try:
            running = m.execute(index, program.instructions[index])
        except Fault as fault:
            fault_kind, fault_index, message = fault.kind, index, fault.message
            break
        executed += 1
        if not running:                 # HLT
            break
        index += 1
    return ReferenceResult(ub=m.ub, acc=m.acc, host=m.host, registers=dict(m.regs),
                           fault_kind=fault_kind, fault_index=fault_index, events=m.events,
                           fault_message=message, executed=executed, next_index=index,
                           fifo=list(m.pending), active=m.active)

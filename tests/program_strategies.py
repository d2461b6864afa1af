"""Hypothesis strategies for random *valid* TPU programs (every word encodes and decodes).

`programs()` draws (Program, host, weights) for a small machine.  The generator tracks the
configuration registers and the weight FIFO as it goes, so that almost every instruction
is one that runs (addresses in range, a tile to switch to, pooling shapes that divide),
and a controlled share of programs contains exactly one instruction built to fault in one
chosen way (`fault_mode`).  Only the *kind* of problem is planned; whether and where the
program faults is for the model under test to say.

Every instruction and flag is reachable: RHM/WHM/RHMA/WHMA with repeats and strides
(negative and zero), RW with repeat, MMC with S C O U W H D, conv taps with pitch and
stride, VADD/VMUL with U B L, requantization and repeats, ACT with each function, max/avg
pooling in 1-D and 2-D (strided and padded too, rectangular windows), per-column
parameters (P), lookup tables (L), clip bounds and every act_out, CFG of
every register, NOP (repeat), SYNC, WSYNC, INT, TAG and HLT.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from tpuasm.binary import MachineShape, Program
from tpuasm.encoding import Instruction
from tpuasm.isa import ISA_TABLE
from tpuasm.machine.vector import float_bits

SHAPE = MachineShape(array_size=8, ub_rows=64, acc_rows=32, fifo_depth=4)
HOST_ROWS = 24
TILES = 6
N = SHAPE.array_size

REGS = ISA_TABLE.registers
FAULT_KINDS = ("address", "no_tile", "weight_width", "deadlock", "config", "shape")


def ins(key: str, flags: str = "", repeat: int = 1, **operands) -> Instruction:
    return Instruction(key, ISA_TABLE.instructions[key].flag_bits(flags), repeat, operands)


def cfg(name: str, value: int) -> Instruction:
    return ins("CFG", reg=REGS[name].index, value=value)


def base_range(offsets, limit: int) -> tuple[int, int] | None:
    """The bases b with b + o in 0..limit-1 for every offset o; None if there are none."""
    lo, hi = -min(offsets), limit - 1 - max(offsets)
    return (lo, hi) if lo <= hi else None


class Builder:
    """Draws one instruction at a time, keeping the state needed to keep it valid."""

    def __init__(self, draw):
        self.draw = draw
        self.regs = {name: r.reset for name, r in REGS.items()}
        self.pending = 0                 # tiles fetched and not yet switched in
        self.active_wide: bool | None = None   # None: no active weights
        self.out: list[Instruction] = []
        self.recent_acc: int | None = None     # first accumulator row the last MMC wrote

    # -------------------------------------------------------------- helpers
    def integers(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def choice(self, options):
        return self.draw(st.sampled_from(options))

    def coin(self, p_true=0.5) -> bool:
        return self.draw(st.sampled_from(range(100))) < p_true * 100

    def place(self, offsets, limit):
        """A base that keeps every offset in range, or None."""
        r = base_range(list(offsets), limit)
        return None if r is None else self.integers(*r)

    def emit(self, instruction: Instruction):
        self.out.append(instruction)

    # -------------------------------------------------------------- registers
    def register_value(self, name: str) -> int:
        """A legal value, mostly small and useful, sometimes a range edge."""
        r = REGS[name]
        if self.coin(0.08):
            return self.choice([r.min, r.max])
        small = {
            "act_mult": lambda: self.choice([1, 1, 2, 3, -1, -5, 100, 12345, -77777,
                                             2 ** 31 - 1, -2 ** 31]),
            "act_shift": lambda: self.choice([0, 0, 1, 2, 3, 7, 8, 15, 30, 40, 62]),
            "act_zero": lambda: self.integers(-200, 200),
            "act_out": lambda: self.integers(0, 3),
            "fn_in_frac": lambda: self.choice([0, 4, 7, 8, 9, 12, 16, 31]),
            "pool_size": lambda: self.integers(1, 3),
            "pool_width": lambda: self.choice([0, 0, 2, 3, 4, 6]),
            "conv_pitch": lambda: self.integers(0, 6),
            "conv_kw": lambda: self.integers(1, 3),
            "conv_stride": lambda: self.integers(1, 2),
            "rep_ub_stride": lambda: self.integers(-6, 6),
            "rep_acc_stride": lambda: self.integers(-4, 4),
            "rep_host_stride": lambda: self.integers(-4, 4),
            "dma_host_stride": lambda: self.integers(-3, 3),
            "dma_ub_stride": lambda: self.integers(-3, 3),
            "act_params": lambda: self.integers(0, SHAPE.ub_rows - 9),
            "act_float": lambda: self.integers(0, 1),
            "act_table": lambda: self.integers(0, SHAPE.ub_rows - 256 // N),
            "act_lo": lambda: self.choice([-2 ** 31, -128, -5, 0, 3]),
            "act_hi": lambda: self.choice([2 ** 31 - 1, 127, 6, 0, 100]),
            "pool_stride": lambda: self.integers(0, 3),
            "pool_pad": lambda: self.integers(0, 2),
            "pool_pad_end": lambda: self.integers(0, 2),
            "pool_count_pad": lambda: self.integers(0, 1),
            "pool_size_x": lambda: self.choice([0, 0, 1, 2, 3]),
            "pool_stride_x": lambda: self.choice([0, 0, 1, 2]),
            "pool_pad_x": lambda: self.choice([-1, -1, 0, 1]),
            "pool_pad_end_x": lambda: self.choice([-1, -1, 0, 1]),
            "act_ub_pitch": lambda: self.choice([0, 0, 1, 2, 3, 5]),
            "act_ub_width": lambda: self.integers(1, 3),
            "vec_mult_a": lambda: self.choice([1, -1, 3, 1 << 20, 3 << 27, -(5 << 26),
                                               2 ** 31 - 1]),
            "vec_mult_b": lambda: self.choice([1, 0, -1, 1 << 20, -(3 << 27), 5 << 26]),
            "vec_shift": lambda: self.choice([0, 0, 1, 2, 20, 29, 30, 31, 35, 45, 62]),
            "vec_zero_a": lambda: self.choice([0, 0, -128, 3, 127, 255]),
            "vec_zero_b": lambda: self.choice([0, 0, -7, 128, 255]),
            "vec_zero_c": lambda: self.choice([0, 0, -128, 5, 200, 300, -65536]),
            "vec_float": lambda: self.integers(0, 1),
        }
        return small[name]()

    def gen_cfg(self):
        name = self.choice(sorted(REGS))
        value = self.register_value(name)
        self.regs[name] = value
        self.emit(cfg(name, value))

    # -------------------------------------------------------------- host transfers
    def transfer_offsets(self, key, length, repeat):
        """(host offsets, ub offsets) of RHM/WHM/RHMA/WHMA relative to their bases."""
        g = self.regs
        host, ub = [], []
        for i in range(repeat):
            for k in range(length):
                if key in ("RHMA", "WHMA"):
                    host.append(i * g["rep_host_stride"] + k * g["dma_host_stride"])
                    ub.append(i * g["rep_ub_stride"] + k * g["dma_ub_stride"])
                else:
                    host.append(i * g["rep_host_stride"] + k)
                    ub.append(i * g["rep_ub_stride"] + k)
        return host, ub

    def set_some(self, options: dict, p: float):
        """Emit CFG for each register in `options` with probability p (a layer's setup)."""
        for name, values in options.items():
            if self.coin(p):
                value = self.choice(values)
                self.regs[name] = value
                self.emit(cfg(name, value))

    def gen_transfer(self):
        key = self.choice(["RHM", "RHM", "WHM", "RHMA", "WHMA"])
        strides = {"rep_host_stride": [-2, 0, 1, 3], "rep_ub_stride": [-3, 0, 2, 5]}
        if key in ("RHMA", "WHMA"):
            strides.update(dma_host_stride=[-1, 0, 2], dma_ub_stride=[-2, 0, 1, 3])
        self.set_some(strides, 0.3)
        for length, repeat in ((self.integers(1, 6), self.integers(1, 4)), (1, 1)):
            host_off, ub_off = self.transfer_offsets(key, length, repeat)
            host = self.place(host_off, HOST_ROWS)
            ub = self.place(ub_off, SHAPE.ub_rows)
            if host is not None and ub is not None:
                self.emit(ins(key, repeat=repeat, host=host, ub=ub, length=length))
                return

    # -------------------------------------------------------------- weights
    def room(self):
        return SHAPE.fifo_depth + 1 - self.pending

    def gen_rw(self):
        if self.room() < 1:
            return self.gen_mmc()
        repeat = self.integers(1, min(3, self.room()))
        tile = self.integers(0, TILES - repeat)
        self.pending += repeat
        self.emit(ins("RW", repeat=repeat, tile=tile))

    def mmc_weight_flags(self, repeat_max: int):
        """(flags, repeat) for a MatrixMultiply that has its weights, or None."""
        switch_ok = self.pending >= 1
        if self.active_wide is None and not switch_ok:
            return None
        if switch_ok and (self.active_wide is None or self.coin(0.6)):
            wide = self.pending >= 2 and self.coin(0.3)
            per = 2 if wide else 1
            repeat = self.integers(1, max(1, min(repeat_max, self.pending // per)))
            self.pending -= per * repeat
            self.active_wide = wide
            return "S" + ("D" if wide else ""), repeat
        return ("D" if self.active_wide else ""), self.integers(1, repeat_max)

    def other_mmc_flags(self):
        return "".join(c for c in "OUWH" if self.coin(0.4))

    def gen_mmc(self):
        if self.coin(0.35):
            return self.gen_conv()
        weights = self.mmc_weight_flags(3)
        if weights is None:
            return self.gen_rw()
        wflags, repeat = weights
        flags = wflags + self.other_mmc_flags()
        if "D" in flags and "H" not in flags and self.coin(0.6):
            flags += "H"            # 16 x 16 bits: sums that wrap int32
        if repeat > 1:
            self.set_some({"rep_ub_stride": [-4, 0, 1, 3], "rep_acc_stride": [-2, 0, 1, 2, 5]}, 0.5)
        for length, rep in ((self.integers(1, 5), repeat), (1, repeat), (1, 1)):
            per = 2 if "H" in flags else 1
            ub_off = [i * self.regs["rep_ub_stride"] + r
                      for i in range(rep) for r in range(per * length)]
            acc_off = [i * self.regs["rep_acc_stride"] + b for i in range(rep) for b in range(length)]
            ub, acc = self.place(ub_off, SHAPE.ub_rows), self.place(acc_off, SHAPE.acc_rows)
            if ub is not None and acc is not None:
                if "S" in flags and rep != repeat:      # give back the switches not used
                    self.pending += (repeat - rep) * (2 if "D" in flags else 1)
                self.emit(ins("MMC", flags, repeat=rep, ub=ub, acc=acc, length=length))
                self.recent_acc = acc + min(acc_off)
                return
        raise AssertionError("length 1, repeat 1 always fits")

    def conv_offsets(self, taps, height, width, wide_in):
        g = self.regs
        s, kw = g["conv_stride"], g["conv_kw"]
        pitch = g["conv_pitch"] or width
        out = []
        for i in range(taps):
            dy, dx = divmod(i, kw)
            for y in range(height):
                for x in range(width):
                    v = (y * s + dy) * pitch + (x * s + dx)
                    out += [2 * v, 2 * v + 1] if wide_in else [v]
        return out

    def gen_conv(self):
        weights = self.mmc_weight_flags(5)
        if weights is None:
            return self.gen_rw()
        wflags, taps = weights
        if "S" not in wflags and self.coin(0.5):
            taps = self.regs["conv_kw"] * self.integers(1, 2)      # whole rows of taps
            taps = min(taps, 6)
        flags = wflags + "C" + self.other_mmc_flags()
        wide_in = "H" in flags
        for h, w, t in ((self.integers(1, 3), self.integers(1, 3), taps), (1, 1, taps), (1, 1, 1)):
            ub = self.place(self.conv_offsets(t, h, w, wide_in), SHAPE.ub_rows)
            if ub is not None:
                if "S" in flags and t != taps:      # give back the switches not used
                    self.pending += (taps - t) * (2 if "D" in flags else 1)
                acc = self.place(range(h * w), SHAPE.acc_rows)
                self.emit(ins("MMC", flags, repeat=t, ub=ub, acc=acc, height=h, width=w))
                self.recent_acc = acc
                return
        raise AssertionError("a 1x1 window with one tap always fits")

    # -------------------------------------------------------------- Activate
    def pool_length(self):
        """A length that pools with the current registers, or None."""
        if self.coin(0.6):
            k = self.integers(2, 3)
            self.set_some({"pool_size": [k]}, 1.0)
            self.set_some({"pool_width": [0, k, 2 * k, 3 * k]}, 0.8)
        if self.coin(0.4):          # strided, padded windows (spec/isa.md 5.5)
            self.set_some({"pool_stride": [1, 2, 3], "pool_pad": [0, 1], "pool_pad_end": [0, 1],
                           "pool_count_pad": [0, 1]}, 0.7)
        if self.coin(0.3):          # rectangular windows, a stride and padding per axis
            self.set_some({"pool_size_x": [0, 1, 2, 3], "pool_stride_x": [0, 1, 2],
                           "pool_pad_x": [-1, 0, 1], "pool_pad_end_x": [-1, 0, 1]}, 0.6)
        k, w = self.regs["pool_size"], self.regs["pool_width"]
        kw = self.regs["pool_size_x"] or k
        if k > 4 or kw > 4:
            return None
        if w == 0:
            return k * self.integers(1, 4)
        if self.regs["pool_stride"] != 0:
            if w > 9:
                return None
            length = w * self.integers(1, 4)
            return length if length <= 24 and self.pool_vectors(length) else None
        if w % kw or w > 9 or self.regs["pool_stride_x"]:
            return None
        height = k * self.integers(1, 3)
        return w * height if w * height <= 24 else None

    def pool_vectors(self, length):
        """Output vectors of a pooling Activate of `length` rows (0: the shape faults)."""
        g = self.regs
        k, w = g["pool_size"], g["pool_width"]
        if w == 0:
            return length // k if length % k == 0 else 0
        kw = g["pool_size_x"] or k            # the column registers at reset: as the rows
        if g["pool_stride"] == 0:
            ok = w % kw == 0 and length % w == 0 and (length // w) % k == 0 \
                and g["pool_stride_x"] == 0
            return length // (k * kw) if ok else 0
        sy, p, e = g["pool_stride"], g["pool_pad"], g["pool_pad_end"]
        sx = g["pool_stride_x"] or sy
        px = p if g["pool_pad_x"] < 0 else g["pool_pad_x"]
        ex = e if g["pool_pad_end_x"] < 0 else g["pool_pad_end_x"]
        h = length // w
        if length % w or p >= k or e >= k or px >= kw or ex >= kw \
                or h + p + e < k or w + px + ex < kw:
            return 0
        return ((h + p + e - k) // sy + 1) * ((w + px + ex - kw) // sx + 1)

    def gen_requant(self, function: str):
        """Requantization that keeps outputs off the rails, as a real layer would set it."""
        if function in ("Q", "T"):
            settings = {"act_mult": 1, "act_shift": self.choice([7, 8, 9]),
                        "fn_in_frac": self.choice([6, 8, 9, 10, 11, 12, 13])}
        else:
            settings = {"act_mult": self.choice([1, 1, 3, -2]),
                        "act_shift": self.choice([0, 0, 1, 2, 3, 5, 7, 8, 10])}
        settings["act_zero"] = self.choice([0, 0, 5, -3])
        settings["act_out"] = self.choice([0, 1, 2, 2, 3, 3])       # 2 and 3 hide the least
        for name, value in settings.items():
            if self.coin(0.8):
                self.regs[name] = value
                self.emit(cfg(name, value))

    def gen_act(self):
        flags = self.choice(["", "", "R", "Q", "T"])
        length = None
        if self.coin(0.4):
            length = self.pool_length()
            if length is not None:
                flags += self.choice(["M", "A"])
        if self.coin(0.7):
            self.gen_requant(flags[:1] if flags[:1] in ("Q", "T") else "")
        if length is None:
            length = self.integers(1, 5)
        if self.coin(0.3):          # per-column bias and requantization from UB rows
            flags += "P"
            self.set_some({"act_params": list(range(SHAPE.ub_rows - 9))}, 0.6)
            self.set_some({"act_float": [0, 1]}, 0.5)    # multiplier words as float32 bits
        if self.coin(0.2):          # a lookup table from UB rows
            flags += "L"
            self.set_some({"act_table": list(range(SHAPE.ub_rows - 256 // N))}, 0.6)
        if self.coin(0.2):
            self.set_some({"act_lo": [-128, -5, 0, 3], "act_hi": [127, 6, 100, 2 ** 31 - 1]}, 0.7)
        vectors = length if not ("M" in flags or "A" in flags) else self.pool_vectors(length)
        if self.coin(0.2):          # outputs at a pitch (spec/isa.md 5.5)
            self.set_some({"act_ub_pitch": [0, 2, 3, 5], "act_ub_width": [1, 2, 3]}, 0.8)
        per = 2 if self.regs["act_out"] == 2 else 1
        pitch, width = self.regs["act_ub_pitch"], self.regs["act_ub_width"]
        if pitch and per * ((vectors - 1) // width * pitch + width) > 24:
            self.regs["act_ub_pitch"] = pitch = 0          # keep it inside the small UB
            self.emit(cfg("act_ub_pitch", 0))

        def out_row(o):
            return o if pitch == 0 else (o // width) * pitch + o % width

        for repeat in (self.integers(1, 3), 1):
            acc_off = [i * self.regs["rep_acc_stride"] + r for i in range(repeat) for r in range(length)]
            ub_off = [i * self.regs["rep_ub_stride"] + per * out_row(o) + k
                      for i in range(repeat) for o in range(vectors) for k in range(per)]
            acc, ub = self.place(acc_off, SHAPE.acc_rows), self.place(ub_off, SHAPE.ub_rows)
            r = self.recent_acc
            if acc is not None and r is not None and self.coin(0.7) and \
                    base_range(acc_off, SHAPE.acc_rows)[0] <= r <= base_range(acc_off, SHAPE.acc_rows)[1]:
                acc = r             # read what the last MatrixMultiply wrote
            if acc is not None and ub is not None:
                self.emit(ins("ACT", flags, repeat=repeat, acc=acc, ub=ub, length=length))
                return
        raise AssertionError("ACT of at most 16 rows, repeat 1, always fits")

    # -------------------------------------------------------------- vector operations
    def gen_vector(self):
        """VADD or VMUL (spec/isa.md 5.11): requantization as a layer sets it, or the
        identity; c in place on a or b, or disjoint; B, U, L; repeats with a UB stride."""
        key = self.choice(["VADD", "VMUL"])
        spec = ISA_TABLE.instructions[key]
        flags = "".join(c for c in "UBLXYZ" if self.coin(0.3))
        while spec.flag_conflict(spec.flag_bits(flags)):    # LZ, UXYZ
            flags = flags.replace(self.choice(["L", "Z", "U"]), "")
        bits = spec.flag_bits(flags)
        per_a, per_b, per_c = (spec.rows_per_vector(bits, k) for k in "abc")
        wide = per_a + per_b + per_c > 3
        if self.coin(0.6):        # a quantized Add/Mul: 2^k-scaled ratios near 1
            k = self.choice([0, 8, 20, 30])
            self.set_some({"vec_shift": [k]}, 1.0)
            self.set_some({"vec_mult_a": [max(1, (3 << k) // 4), (5 << k) // 3, 1 << k],
                           "vec_mult_b": [-(1 << k), (1 << k) // 2 + 1, 0],
                           "vec_zero_a": [0, 3, -128, 200, -1000, 32767],
                           "vec_zero_b": [0, -5, 128, 4000, -32768],
                           "vec_zero_c": [0, 7, -100, 300, -20000]}, 0.7)
        if wide:                  # vec_float computes 8-bit operands only (else config)
            self.set_some({"vec_float": [0]}, 1.0)
        elif self.coin(0.3):      # onnxruntime's float32 arithmetic: ratio bits near 1
            self.set_some({"vec_float": [1]}, 1.0)
            self.set_some({"vec_mult_a": [float_bits(0.75), float_bits(1.6667), float_bits(-0.03)],
                           "vec_mult_b": [float_bits(0.5), float_bits(1.25), float_bits(2.0 ** -9)]},
                          0.7)
        elif self.coin(0.5):
            self.set_some({"vec_float": [0]}, 1.0)
        if "L" in flags:
            self.set_some({"act_table": list(range(SHAPE.ub_rows - 256 // N))}, 0.6)
        repeat = self.integers(1, 3)
        if repeat > 1:
            self.set_some({"rep_ub_stride": [-6, 0, 3, 8]}, 0.5)
        step = self.regs["rep_ub_stride"]
        for length in (self.integers(1, 6), 1):
            def run(per):         # an operand's rows over the iterations
                return [i * step + r for i in range(repeat) for r in range(per * length)]

            rows = {"a": per_a * length, "b": per_b * (1 if "B" in flags else length),
                    "c": per_c * length}
            at = {"a": self.place(run(per_a), SHAPE.ub_rows),
                  "b": self.place(range(per_b) if "B" in flags else run(per_b), SHAPE.ub_rows),
                  "c": self.place(run(per_c), SHAPE.ub_rows)}
            if None in at.values():
                continue
            if self.coin(0.3) and rows["a"] == rows["b"]:
                at["b"] = at["a"]                         # squares, doubles

            def clash(x):     # c over operand x, neither its very rows nor disjoint
                if x == "b" and "B" in flags:
                    return False                          # B's vector is read first
                c, o = at["c"], at[x]
                same = c == o and rows["c"] == rows[x]
                return not same and c < o + rows[x] and o < c + rows["c"]

            if not clash("a") and not clash("b") and self.coin(0.3):
                for x in ("a", "b"):                      # in place on an operand
                    if rows[x] == rows["c"] and (x == "a" or "B" not in flags):
                        at["c"] = at[x]
                        break
            for _ in range(4):            # another place for c, else a shorter length
                if not (clash("a") or clash("b")):
                    break
                at["c"] = self.place(run(per_c), SHAPE.ub_rows)
            if clash("a") or clash("b"):
                continue
            self.emit(ins(key, flags, repeat=repeat, length=length, **at))
            return

    # -------------------------------------------------------------- the rest
    def gen_misc(self):
        kind = self.choice(["NOP", "SYNC", "WSYNC", "INT", "TAG"])
        if kind == "NOP":
            self.emit(ins("NOP", repeat=self.integers(1, 4)))
        elif kind in ("INT", "TAG"):
            self.emit(ins(kind, **{"code" if kind == "INT" else "tag":
                                   self.choice([0, 1, 7, 2 ** 32 - 1])}))
        else:
            self.emit(ins(kind))

    def gen_valid(self):
        gen = self.choice([self.gen_cfg, self.gen_cfg, self.gen_cfg, self.gen_transfer,
                           self.gen_transfer, self.gen_rw, self.gen_rw, self.gen_mmc,
                           self.gen_mmc, self.gen_mmc, self.gen_act, self.gen_act,
                           self.gen_act, self.gen_vector, self.gen_vector, self.gen_misc])
        gen()

    # -------------------------------------------------------------- faults
    def gen_fault(self, kind: str):
        """One instruction meant to fault with `kind` (and in no other way)."""
        if kind == "config":
            name = self.choice(sorted(REGS))
            r = REGS[name]
            lo, hi = -(1 << 31), (1 << 31) - 1          # what the 32-bit field can hold
            options = [v for v in (r.min - 1, r.max + 1, r.min - 1000, r.max + 12345, lo, hi)
                       if lo <= v <= hi and not r.min <= v <= r.max]
            if not options:          # act_mult etc. use the whole field: fall back
                name, options = "act_out", [4, -1, 1000]
            self.emit(cfg(name, self.choice(options)))
        elif kind == "address":
            which = self.choice(["RHM", "WHM", "RHMA", "WHMA", "RW", "MMC", "ACT", "VADD"])
            if which == "RW":
                if self.room() < 1:
                    return self.gen_fault("deadlock")
                self.emit(ins("RW", tile=self.integers(TILES, TILES + 3)))
            elif which == "MMC":
                if self.pending < 1:
                    self.emit(ins("RW", tile=0))
                    self.pending += 1
                ub_bad = self.coin()
                self.emit(ins("MMC", "S", ub=SHAPE.ub_rows - 1 if ub_bad else 0,
                              acc=0 if ub_bad else SHAPE.acc_rows - 1, length=2))
                self.pending -= 1
            elif which == "VADD":
                self.emit(cfg("rep_ub_stride", self.choice([0, 4])))
                bad = self.choice(["a", "b", "c"])
                rows = {k: (SHAPE.ub_rows - 2 if k == bad else 8 * j)
                        for j, k in enumerate("abc")}
                self.emit(ins(self.choice(["VADD", "VMUL"]), repeat=2, length=3, **rows))
            elif which == "ACT":
                self.emit(cfg("pool_width", 0))
                self.emit(cfg("act_out", self.integers(0, 3)))
                self.emit(ins("ACT", acc=SHAPE.acc_rows - self.integers(0, 2),
                              ub=0, length=3))
            else:
                bad_host = self.coin()
                self.emit(cfg("rep_host_stride", 1))
                self.emit(cfg("dma_host_stride", 1))
                self.emit(cfg("dma_ub_stride", 1))
                self.emit(cfg("rep_ub_stride", self.choice([0, 2, -2])))
                self.emit(ins(which, repeat=3,
                              host=HOST_ROWS - 3 if bad_host else 0,
                              ub=10 if bad_host else SHAPE.ub_rows - 1, length=2))
        elif kind == "no_tile":
            if self.active_wide is not None:     # only reachable before the first switch
                return self.gen_fault("deadlock")
            if self.coin():
                self.emit(ins("MMC", self.choice(["C", "CO"]), ub=0, acc=0, height=1, width=1))
            else:
                self.emit(ins("MMC", self.choice(["", "O"]), ub=0, acc=0, length=1))
        elif kind == "weight_width":
            if self.active_wide is None:
                return self.gen_fault("no_tile")
            self.emit(ins("MMC", "" if self.active_wide else "D", ub=0, acc=0, length=1))
        elif kind == "deadlock":
            if self.coin():
                self.emit(ins("RW", repeat=min(TILES, self.room() + 1), tile=0))
            else:
                self.emit(cfg("rep_ub_stride", 0))
                self.emit(cfg("rep_acc_stride", 0))
                self.emit(ins("MMC", "SD" if self.coin() else "S", repeat=self.pending + 1,
                              ub=0, acc=0, length=1))
        elif kind == "shape":
            k = self.integers(2, 3)
            self.emit(cfg("pool_size", k))
            self.emit(cfg("pool_stride", 0))
            self.emit(cfg("pool_size_x", 0))
            self.emit(cfg("pool_stride_x", 0))
            if self.coin():
                self.emit(cfg("pool_width", 0))
                length = k * self.integers(1, 3) + self.integers(1, k - 1)
            else:
                width = k * self.integers(1, 2) + self.integers(0, 1)
                self.emit(cfg("pool_width", width))
                height = self.integers(1, 3)
                length = width * height + (0 if width % k or height % k else 1)
            self.emit(ins("ACT", self.choice(["M", "A", "RM", "QA"]), acc=0, ub=0, length=length))

    def gen_tail(self):
        """Instructions after a planned fault: valid whatever the state (they must not run)."""
        for _ in range(self.integers(0, 3)):
            self.choice([
                lambda: self.emit(ins("TAG", tag=self.integers(0, 99))),
                lambda: self.emit(ins("INT", code=self.integers(0, 99))),
                lambda: self.emit(ins("RHM", host=self.integers(0, HOST_ROWS - 1),
                                      ub=self.integers(0, SHAPE.ub_rows - 1), length=1)),
                lambda: self.emit(cfg("act_shift", self.integers(0, 62))),
            ])()


class Case(NamedTuple):
    program: Program
    host: np.ndarray           # (HOST_ROWS, N) int8
    weights: np.ndarray        # (TILES, N, N) int8, or (0, N, N)
    planned_fault: str | None  # the kind of fault one instruction was built for, if any


@st.composite
def programs(draw, min_size: int = 1, max_size: int = 30, fault_share: float = 0.2,
             fault_kind: str | None = None, profile: str = "tpu", vector_share: float = 0.0,
             padded: bool = False):
    """A Case: a Program on SHAPE (with `profile`) with its host and weight images.

    A share `fault_share` of programs holds one instruction built to fault (kind drawn from
    FAULT_KINDS); `fault_kind` makes every program hold one of that kind.  The programs are
    the same for both profiles (the opentpu profile changes only what Activate computes,
    spec/opentpu.md section 4; the requantization registers it ignores are still set).
    `vector_share` of the instructions (beyond the usual mix) are VADD/VMUL.  `padded`: each
    weight tile is zero outside a random block of rows and columns (as a compiled layer
    smaller than the array leaves it; some tiles all zero, some full)."""
    b = Builder(draw)
    if draw(st.sampled_from(range(100))) < 85:
        # Most programs start by filling the UB from the host, so that MatrixMultiply and
        # Activate see data instead of zeros (UB rows 0..63 = host rows 0..23, 0..23, 8..23).
        b.emit(ins("RHM", host=0, ub=0, length=HOST_ROWS))
        b.emit(ins("RHM", host=0, ub=HOST_ROWS, length=HOST_ROWS))
        b.emit(ins("RHM", host=3 * HOST_ROWS - SHAPE.ub_rows, ub=2 * HOST_ROWS,
                   length=SHAPE.ub_rows - 2 * HOST_ROWS))
        if draw(st.sampled_from(range(100))) < 70 and fault_kind != "no_tile":
            # ... and then every accumulator row from it.
            b.emit(ins("RW", tile=draw(st.integers(0, TILES - 1))))
            b.emit(ins("MMC", "SO" + "".join(c for c in "UWH" if b.coin(0.3)), ub=0, acc=0,
                       length=SHAPE.acc_rows))
            b.active_wide = False
    size = draw(st.integers(min_size, max_size))
    # (st.integers favours small and boundary values; sampled_from is close to uniform.)
    if fault_kind is not None:
        fault, planned = True, fault_kind
    else:
        fault = draw(st.sampled_from(range(100))) < fault_share * 100
        planned = draw(st.sampled_from(FAULT_KINDS)) if fault else None
    fault_at = draw(st.integers(0, size)) if fault else -1
    for position in range(size):
        if position == fault_at:
            break
        if vector_share and draw(st.sampled_from(range(100))) < vector_share * 100:
            b.gen_vector()
        else:
            b.gen_valid()
    if fault:
        b.gen_fault(planned)
        b.gen_tail()
    if b.out and draw(st.sampled_from(range(10))) == 5:
        b.emit(ins("HLT"))
        b.gen_tail()
    seed = draw(st.integers(0, 2 ** 32 - 1))
    scale = draw(st.sampled_from([128, 8, 2]))       # full-range bytes or small values
    rng = np.random.default_rng(seed)
    host = rng.integers(-scale, scale, size=(HOST_ROWS, N)).astype(np.int8)
    weights = rng.integers(-scale, scale, size=(TILES, N, N)).astype(np.int8)
    if padded:
        weights = _pad_tiles(weights, rng)
    if not fault and draw(st.sampled_from(range(40))) == 17:
        weights = rng.integers(-128, 128, size=(0, N, N)).astype(np.int8)      # no weights
    return Case(Program(b.out, replace(SHAPE, profile=profile)), host, weights, planned)


def _pad_tiles(weights: np.ndarray, rng) -> np.ndarray:
    """Every tile zeroed outside a random block (rows k0..k1-1, columns j0..j1-1); the block
    is empty for some tiles and the whole tile for others."""
    out = np.zeros_like(weights)
    n = weights.shape[1]
    for t in range(len(weights)):
        kind = rng.integers(0, 6)
        if kind == 0:
            continue                                     # all zero
        if kind == 1:
            out[t] = weights[t]                          # full
            continue
        k0, j0 = rng.integers(0, n, 2)
        k1, j1 = rng.integers(k0 + 1, n + 1), rng.integers(j0 + 1, n + 1)
        out[t, k0:k1, j0:j1] = weights[t, k0:k1, j0:j1]
    return out

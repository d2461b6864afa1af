"""A numpy-only stand-in for OpenTPU's functional simulator (sim.py), for whole-process
speed comparisons (bench_opentpu.py).  Not part of tpuasm and imports nothing from it.

Like sim.py it reads the 14-byte binary (spec/opentpu.md section 3), then interprets one
instruction at a time with numpy: host and UB copies, a FIFO of weight tiles, an integer
matrix multiply into 32-bit accumulators, and ReLU/sigmoid followed by the low 8 bits.
The arithmetic is programs/opentpu/opentpu_model.py's (the regression suite's model of
OpenTPU's semantics), so both tools must produce the same output.

    python benchmarks/opentpu_sim.py PROG.out HOST.npy WEIGHTS.npy OUT.npy
"""
from __future__ import annotations

import sys
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "programs" / "opentpu"))
import opentpu_model as model  # noqa: E402

WORD = 14
NOP, WHM, RW, MMC, ACT, SYNC, RHM, HLT = range(8)
SWITCH, CONV, OVERWRITE, RELU, SIGMOID = 0x01, 0x02, 0x04, 0x08, 0x10


def decode(data: bytes):
    """(opcode, flags, length, addr, ub_addr) per 14-byte big-endian word."""
    for k in range(0, len(data) - len(data) % WORD, WORD):
        w = data[k:k + WORD]
        yield w[0], w[1], w[2], int.from_bytes(w[3:11], "big"), int.from_bytes(w[11:14], "big")


def simulate(program: bytes, host: np.ndarray, weights: np.ndarray,
             ub_rows: int = 98304, acc_rows: int = 4096) -> np.ndarray:
    n = host.shape[1]
    host = host.astype(np.int8).copy()
    ub = np.zeros((ub_rows, n), np.int8)
    acc = np.zeros((acc_rows, n), np.int64)
    fifo: deque = deque()
    active = None
    for op, flags, length, addr, ub_addr in decode(program):
        if op == RHM:
            ub[ub_addr:ub_addr + length] = host[addr:addr + length]
        elif op == WHM:
            host[addr:addr + length] = ub[ub_addr:ub_addr + length]
        elif op == RW:
            fifo.append(weights[addr].astype(np.int8))
        elif op == MMC:
            if flags & SWITCH:
                active = fifo.popleft()
            product = model.mmc(ub[ub_addr:ub_addr + length], active)
            rows = slice(addr, addr + length)
            acc[rows] = product if flags & OVERWRITE else model.wrap_int32(acc[rows] + product)
        elif op == ACT:
            fn = "relu" if flags & RELU else "sigmoid" if flags & SIGMOID else "none"
            ub[ub_addr:ub_addr + length] = model.act(acc[addr:addr + length], fn)
        elif op == HLT:
            break
    return host


def main(argv: list[str]) -> int:
    prog, host, weights, out = argv
    result = simulate(Path(prog).read_bytes(), np.load(host, allow_pickle=False),
                      np.load(weights, allow_pickle=False))
    np.save(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Code generation time and memory for a 100M-weight network (the paper's CNN1 size).

The network: 8 convolutions 256 -> 256 (3x3, 14x14 images, 4.7M weights), a global average
pool, a Dense 256 -> 2048 and 23 Dense 2048 -> 2048 (96.5M weights): 101M int8 weights,
batch 32, on the TPU v1 machine (256 x 256 array).  The weights are one memory-mapped file,
as the front end hands them over.  Printed next to two references measured in the same run:
one plain copy of all the weights (the least any compiler that builds a weight image must
do) and assembling the generated source.

    .venv/bin/python benchmarks/bench_codegen.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import gc
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpuasm.assembler import assemble  # noqa: E402
from tpuasm.compiler.codegen import generate  # noqa: E402
from tpuasm.compiler.ir import (Activation, Conv, Dense, Pool, QParams, Segment,  # noqa: E402
                                Tensor)

CONVS, CH, HW = 8, 256, 14
DENSES, WIDTH = 23, 2048
BATCH = 32


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build_network(path: Path) -> tuple[Segment, np.memmap]:
    """The segment, its weights slices of one memory-mapped file of random int8."""
    sizes = [CH * CH * 9] * CONVS + [CH * WIDTH] + [WIDTH * WIDTH] * DENSES
    total = sum(sizes)
    rng = np.random.default_rng(0)
    with open(path, "wb") as f:
        for start in range(0, total, 1 << 26):
            f.write(rng.bytes(min(1 << 26, total - start)))
    blob = np.memmap(path, np.int8, "r", shape=(total,))
    q = QParams(0.05, 0, True)
    ops, at = [], 0
    x = Tensor("image", (CH, HW, HW), q)
    t = x
    for i in range(CONVS):
        w = blob[at:at + sizes[i]].reshape(CH, CH, 3, 3)
        at += sizes[i]
        out = Tensor(f"conv{i}", (CH, HW, HW), q)
        ops.append(Conv(f"conv{i}", t, out, w, np.full(CH, 0.002, np.float32),
                        np.zeros(CH, np.int32), (1, 1), (1, 1, 1, 1), Activation("relu")))
        t = out
    gap = Tensor("gap", (CH, 1, 1), q)
    ops.append(Pool("gap", t, gap, "avg", (HW, HW), (1, 1)))
    t = gap
    for i in range(DENSES + 1):
        size = sizes[CONVS + i]
        k = CH if i == 0 else WIDTH
        w = blob[at:at + size].reshape(k, WIDTH)
        at += size
        out = Tensor(f"fc{i}", (WIDTH,), q)
        ops.append(Dense(f"fc{i}", t, out, w, np.full(WIDTH, 0.001, np.float32),
                         np.zeros(WIDTH, np.int32), Activation("relu")))
        t = out
    return Segment("cnn1_like", ops, [x], [t]), blob


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        segment, blob = build_network(Path(tmp) / "weights.bin")
        weights = blob.size
        print(f"network: {len(segment.operators)} operators, {weights / 1e6:.1f}M weights, "
              f"batch {BATCH}, 256 x 256 array")
        gen_times, copy_times, asm_times, peaks = [], [], [], []
        for _ in range(args.repeat):
            gc.collect()
            t0 = time.perf_counter()
            np.array(blob)                        # reference: one copy of every weight
            copy_times.append(time.perf_counter() - t0)
            gc.collect()
            before = rss_mb()
            t0 = time.perf_counter()
            program = generate(segment, BATCH)
            gen_times.append(time.perf_counter() - t0)
            peaks.append(rss_mb() - before)
            t0 = time.perf_counter()
            binary = assemble(program.source)
            asm_times.append(time.perf_counter() - t0)
            del program
        image_mb = weights / 2 ** 20
        program = generate(segment, BATCH)
        print(f"  weight tiles {len(program.weights)} ({program.weights.nbytes / 2**20:.0f} MiB "
              f"image), instructions {len(binary)}, source {len(program.source) / 1024:.0f} KiB")

        def span(v, unit="s"):
            return f"{min(v):.2f}-{max(v):.2f} {unit}"

        print(f"  codegen                 {span(gen_times)}")
        print(f"  reference: one np.copy  {span(copy_times)}  of {image_mb:.0f} MiB of weights")
        print(f"  assembling the source   {span(asm_times)}")
        print(f"  RSS growth during codegen {span(peaks, 'MiB')} (the weight image itself is "
              f"{program.weights.nbytes / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Data for repeat_strides: three input chunks and four tiles.

The expected output follows spec/isa.md sections 3 and 5.4 step by step in numpy
(programs/tpu_oracle.py); see the comments of repeat_strides.tasm.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import numpy as np  # noqa: E402
import tpu_oracle as o  # noqa: E402

SEED = 11


def generate(out_dir):
    c = o.read_equs(HERE / "repeat_strides.tasm")
    b = c["B"]
    g = o.rng(SEED)
    x = o.random_int8(g, (3, b, o.N))                  # host chunks
    w = o.random_int8(g, (4, o.N, o.N))
    ub = x[::-1]                                       # 1. reversed in the UB
    acc = [o.matmul(ub[j], w[j + 1]) for j in range(3)]   # 3. (2.'s junk overwritten)
    for j in (0, 1):                                   # 4. same input, stepping blocks
        acc[j] = acc[j] + o.matmul(ub[0], w[3])
    out = [o.requantize(o.wrap_int32(a), shift=c["SHIFT"]) for a in acc]
    y = np.concatenate(out[::-1])                      # 5. reversed again; 6. copied out
    o.save(out_dir,
           host=o.host_image(6 * b, x=(0, x.reshape(-1, o.N))),
           weights=w,
           y=y)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

"""Data for sigmoid_tanh: a sigmoid layer (uint8 out) feeding a tanh layer.

Expected output from the independent numpy model (programs/tpu_oracle.py), which
uses the Q15 tables of tpuasm/functions.py: they are the definition of the
functions (spec/isa.md 5.5), not emulator code.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import numpy as np  # noqa: E402
import tpu_oracle as o  # noqa: E402

SEED = 4


def generate(out_dir):
    c = o.read_equs(HERE / "sigmoid_tanh.tasm")
    b = c["B"]
    g = o.rng(SEED)
    x = o.random_int8(g, (b, o.N))
    w1 = o.random_int8(g, (o.N, o.N))
    w2 = o.random_int8(g, (o.N, o.N))
    # Two vectors aligned with (against) w1's first column drive their sums past the
    # table's range: sigmoid -> 1.0 = 32768 >> 7 = 256, saturated to 255 (and -> 0).
    x[0] = np.where(w1[:, 0] >= 0, 127, -128)
    x[1] = np.where(w1[:, 0] >= 0, -128, 127)
    s = o.activate(o.matmul(x, w1), fn="sigmoid", in_frac=c["SIG_FRAC"], shift=7, out="uint8")
    # Layer 2 reads s as unsigned bytes (MMC.U).
    t = o.activate(o.matmul(s.astype(np.int64), w2), fn="tanh", in_frac=c["TANH_FRAC"],
                   mult=c["TANH_MULT"], shift=c["TANH_SHIFT"], zero=c["TANH_ZERO"])
    o.save(out_dir,
           host=o.host_image(3 * b, x=(0, x)),
           weights=np.stack([w1, w2]),
           s=s, t=t)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

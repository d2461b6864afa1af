"""Data for lstm_cell: one LSTM cell step, gate arithmetic on the chip (VADD, VMUL).

Expected outputs from the independent numpy model (programs/tpu_oracle.py: Activate
and the vector unit written from spec/isa.md 5.5 and 5.11).  The tanh table for the
cell state is data: round(128 * tanh(v / 32)) for every int8 v, saturated to int8.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import numpy as np  # noqa: E402
import tpu_oracle as o  # noqa: E402

SEED = 21


def tanh_table() -> np.ndarray:
    v = np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float64)
    return np.clip(np.rint(128 * np.tanh(v / 32)), -128, 127).astype(np.int8)


def generate(out_dir):
    e = o.read_equs(HERE / "lstm_cell.tasm")
    b, frac, mult, zs = e["B"], e["FRAC"], e["MULT"], e["SIG_ZERO"]
    g = o.rng(SEED)
    x = o.random_int8(g, (b, o.N))
    c = o.random_int8(g, (b, o.N))
    w = o.random_int8(g, (4, o.N, o.N))
    i, f, og = (o.activate(o.matmul(x, w[k]), fn="sigmoid", in_frac=frac, shift=7, zero=zs)
                for k in (0, 1, 3))
    gg = o.activate(o.matmul(x, w[2]), fn="tanh", in_frac=frac, shift=8)
    t1 = o.vector("mul", f, c, mult_a=mult, shift=e["FC_SHIFT"], zero_a=zs)
    t2 = o.vector("mul", i, gg, mult_a=mult, shift=e["IG_SHIFT"], zero_a=zs)
    c_new = o.vector("add", t1, t2)
    table = tanh_table()
    tc = o.vector("add", c_new, c_new, mult_b=0, table=table.view(np.uint8))
    h = o.vector("mul", og, tc, mult_a=mult, shift=e["OH_SHIFT"], zero_a=zs)
    o.save(out_dir,
           host=o.host_image(5 * b, x=(0, x), c=(b, c), t=(2 * b, table[None, :])),
           weights=w, c_new=c_new, h=h)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

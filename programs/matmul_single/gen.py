"""Data for matmul_single: random full-range int8 inputs and one weight tile.

Expected output from the independent numpy model (programs/tpu_oracle.py).
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import tpu_oracle as o  # noqa: E402

SEED = 1


def generate(out_dir):
    c = o.read_equs(HERE / "matmul_single.tasm")
    b = c["B"]
    g = o.rng(SEED)
    x = o.random_int8(g, (b, o.N))
    w = o.random_int8(g, (o.N, o.N))
    acc = o.matmul(x, w)
    o.save(out_dir,
           host=o.host_image(3 * b, x=(0, x)),
           weights=w[None],
           y_sat=o.requantize(acc),
           y_q=o.requantize(acc, shift=c["SHIFT"]))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

"""Data for mlp3_relu: a 512 -> 256 -> 256 -> 200 MLP with ReLU, batch 100.

Expected output from the independent numpy model (programs/tpu_oracle.py): each
layer is relu(x @ w), requantized by a rounding shift into int8, and feeds the next.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import numpy as np  # noqa: E402
import tpu_oracle as o  # noqa: E402

SEED = 3
SIZES = (512, 256, 256, 200)


def forward(x, ws, shifts):
    """The three layers; returns every layer's int8 output."""
    outs = []
    for w, s in zip(ws, shifts):
        x = o.activate(o.matmul(x, w), fn="relu", shift=s)
        outs.append(x)
    return outs


def generate(out_dir):
    c = o.read_equs(HERE / "mlp3_relu.tasm")
    b = c["B"]
    g = o.rng(SEED)
    x = o.random_int8(g, (b, SIZES[0]))
    ws = [o.pad_to(o.random_int8(g, (k, m)), o.N) for k, m in zip(SIZES, SIZES[1:])]
    h1, h2, y = forward(x, ws, (c["S1"], c["S2"], c["S3"]))
    rows_x = o.k_chunks(x)
    o.save(out_dir,
           host=o.host_image(len(rows_x) + b, x=(0, rows_x)),
           weights=np.concatenate([o.weight_tiles(w) for w in ws]),   # w1 (2 tiles), w2, w3
           h1=h1, h2=h2, y=y)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

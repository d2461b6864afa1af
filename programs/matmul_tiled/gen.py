"""Data for matmul_tiled: x (128 x 600) and w (600 x 520), zero-padded to 768.

Expected output from the independent numpy model (programs/tpu_oracle.py): the
exact product, requantized, laid out as output blocks of B rows.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import tpu_oracle as o  # noqa: E402

SEED = 2
K, M = 600, 520


def generate(out_dir):
    c = o.read_equs(HERE / "matmul_tiled.tasm")
    b = c["B"]
    g = o.rng(SEED)
    x = o.pad_to(o.random_int8(g, (b, K)), o.N, axes=(1,))
    w = o.pad_to(o.random_int8(g, (K, M)), o.N)
    assert x.shape[1] // o.N == c["KT"] and w.shape[1] // o.N == c["NT"]
    y = o.requantize(o.matmul(x, w), shift=c["SHIFT"])
    rows_x = o.k_chunks(x)
    o.save(out_dir,
           host=o.host_image(len(rows_x) + c["NT"] * b, x=(0, rows_x)),
           weights=o.weight_tiles(w),
           y=o.n_blocks(y))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

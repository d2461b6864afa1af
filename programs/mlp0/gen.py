"""Data for mlp0: five 2000 x 2000 int8 layers (20M weights), batch 200.

Expected output from the independent numpy model (programs/tpu_oracle.py): five
times relu(x @ w), shifted and saturated to int8.  float64 BLAS keeps the products
exact and the whole generation under a second.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import numpy as np  # noqa: E402
import tpu_oracle as o  # noqa: E402

SEED = 9
WIDTH = 2000


def generate(out_dir):
    c = o.read_equs(HERE / "mlp0.tasm")
    b, layers = c["B"], c["LAYERS"]
    g = o.rng(SEED)
    # Non-negative inputs, like the ReLU outputs every later layer sees.
    x = o.pad_to(o.random_int8(g, (b, WIDTH), low=0), o.N, axes=(1,))
    tiles = np.empty((layers * c["T"] ** 2, o.N, o.N), dtype=np.int8)
    per_layer = c["T"] ** 2
    h = x
    for layer in range(layers):
        w = o.pad_to(o.random_int8(g, (WIDTH, WIDTH)), o.N)
        tiles[layer * per_layer:(layer + 1) * per_layer] = o.weight_tiles(w)
        h = o.activate(o.matmul(h, w), fn="relu", shift=c["SHIFT"])
    rows_x = o.k_chunks(x)
    o.save(out_dir,
           host=o.host_image(2 * len(rows_x), x=(0, rows_x)),
           weights=tiles,
           y=o.n_blocks(h))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

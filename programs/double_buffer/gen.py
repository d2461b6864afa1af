"""Data for double_buffer (and double_buffer_serial): NB batches through one tile.

Expected output from the independent numpy model (programs/tpu_oracle.py):
relu(x @ w), shifted and saturated to int8, batch after batch.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import tpu_oracle as o  # noqa: E402

SEED = 7


def generate(out_dir, tasm=HERE / "double_buffer.tasm"):
    c = o.read_equs(tasm)
    rows = c["B"] * c["NB"]
    g = o.rng(SEED)
    x = o.random_int8(g, (rows, o.N))
    w = o.random_int8(g, (o.N, o.N))
    o.save(out_dir,
           host=o.host_image(2 * rows, x=(0, x)),
           weights=w[None],
           y=o.activate(o.matmul(x, w), fn="relu", shift=c["SHIFT"]))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

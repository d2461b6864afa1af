"""Data for lstm1_600x600: x (96 x 600), w (600 x 600), zero-padded to 768.

Expected output from the independent numpy model (programs/tpu_oracle.py): the gate
sigmoid(x @ w) from the Q15 table, shifted to Q7 and saturated to int8.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import tpu_oracle as o  # noqa: E402

SEED = 8
K = M = 600


def generate(out_dir):
    c = o.read_equs(HERE / "lstm1_600x600.tasm")
    b = c["B"]
    g = o.rng(SEED)
    x = o.pad_to(o.random_int8(g, (b, K)), o.N, axes=(1,))
    w = o.pad_to(o.random_int8(g, (K, M)), o.N)
    gate = o.activate(o.matmul(x, w), fn="sigmoid", in_frac=c["FRAC"], shift=8)
    o.save(out_dir,
           host=o.k_chunks(x),
           weights=o.weight_tiles(w),
           gate=o.n_blocks(gate))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

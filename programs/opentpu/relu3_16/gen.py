"""Data for relu3_16: 64 samples of 13 small features; layers 13 -> 8 -> 8 -> 1.

Like OpenTPU's Boston-housing example: each layer is ReLU(x @ w) with OpenTPU's
low-8-bit store (large values wrap), feeding the next layer in place.  Expected output
from the independent numpy model of OpenTPU (../opentpu_model.py).
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import numpy as np  # noqa: E402
import opentpu_model as m  # noqa: E402

SEED = 16
N, B = 16, 64
LAYERS = ((13, 8), (8, 8), (8, 1))


def generate(out_dir):
    g = m.rng(SEED)
    x = np.zeros((B, N), np.int8)
    x[:, :13] = m.random_int8(g, (B, 13), 0, 15)
    tiles = np.zeros((len(LAYERS), N, N), np.int8)
    for t, (k, n) in enumerate(LAYERS):
        tiles[t, :k, :n] = m.random_int8(g, (k, n), -2, 3)
    h = x
    for t in range(len(LAYERS)):
        h = m.act(m.mmc(h, tiles[t]), "relu")
    m.save(out_dir, host=x, weights=tiles, y=h)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

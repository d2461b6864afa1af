"""Data for matmul8: full-range int8 inputs and three 8 x 8 tiles.

Expected output from the independent numpy model of OpenTPU (../opentpu_model.py).
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import numpy as np  # noqa: E402
import opentpu_model as m  # noqa: E402

SEED = 8
N, B = 8, 8


def generate(out_dir):
    g = m.rng(SEED)
    x = m.random_int8(g, (B, N))
    w = m.random_int8(g, (3, N, N))
    y_sum = m.act(m.mmc(x, w[0]) + m.mmc(x, w[1]), "none")   # MMC.SO then MMC.S (adds)
    y_relu = m.act(m.mmc(x, w[2]), "relu")
    host = np.zeros((3 * B, N), np.int8)
    host[:B] = x
    m.save(out_dir, host=host, weights=w, y=np.concatenate([y_sum, y_relu]))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

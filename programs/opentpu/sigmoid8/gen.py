"""Data for sigmoid8: one 8 x 8 tile, 8 small and 8 full-range input vectors.

The small rows put the accumulators across the sigmoid's steps (-6..37); the
full-range rows saturate it at both ends.  Expected output from the independent
numpy model of OpenTPU (../opentpu_model.py), whose sigmoid is OpenTPU's float64
formula itself.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import numpy as np  # noqa: E402
import opentpu_model as m  # noqa: E402

SEED = 88
N, B = 8, 16


def generate(out_dir):
    g = m.rng(SEED)
    x = np.concatenate([m.random_int8(g, (8, N), -2, 2), m.random_int8(g, (8, N))])
    w = m.random_int8(g, (1, N, N), -3, 3)
    y = m.act(m.mmc(x, w[0]), "sigmoid")
    host = np.zeros((2 * B, N), np.int8)
    host[:B] = x
    m.save(out_dir, host=host, weights=w, y=y)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

"""Data for strided_dma: a random 32 x 32 picture, one 256-byte pixel per host row.

Expected layouts from plain numpy indexing (no DMA model at all).
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import tpu_oracle as o  # noqa: E402

SEED = 6


def generate(out_dir):
    c = o.read_equs(HERE / "strided_dma.tasm")
    n, p, t = c["IMG"], c["P"], c["T"]
    g = o.rng(SEED)
    img = o.random_int8(g, (n, n, o.N))
    # (patch row, pixel row, patch column, pixel column) -> patch-major
    patches = img.reshape(n // p, p, n // p, p, o.N).transpose(0, 2, 1, 3, 4)
    patches = patches.reshape(-1, p, p, o.N)
    rows = img.reshape(-1, o.N)
    o.save(out_dir,
           host=o.host_image(3 * n * n + p * p + p + 1, img=(0, rows)),
           patches=patches.reshape(-1, o.N),
           vflip=img[::-1].reshape(-1, o.N),
           transposed=patches[t].transpose(1, 0, 2).reshape(-1, o.N),
           reversed=patches[0, 0, ::-1],
           last=patches[0, 0, p - 1][None])


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

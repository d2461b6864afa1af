"""Data for wide_wrap: int16 input vectors (some at full scale, so that 4 x (x @ w)
overflows int32), one signed and one unsigned weight tile.

Expected output from the independent numpy model (programs/tpu_oracle.py): exact
products, wrapped to int32 only where the hardware's adders wrap.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import numpy as np  # noqa: E402
import tpu_oracle as o  # noqa: E402

SEED = 10


def split16(x16):
    """int16 vectors -> UB rows: low bytes (uint8) then high bytes (int8), per vector."""
    lo = (x16.astype(np.int64) & 0xFF).astype(np.uint8).view(np.int8)
    hi = (x16.astype(np.int64) >> 8).astype(np.int8)
    return np.stack([lo, hi], axis=1).reshape(-1, x16.shape[1])


def generate(out_dir):
    c = o.read_equs(HERE / "wide_wrap.tasm")
    b, reps = c["B"], c["REPS"]
    g = o.rng(SEED)
    x = g.integers(-32768, 32768, size=(b, o.N)).astype(np.int16)
    w0 = o.random_int8(g, (o.N, o.N))
    w1 = g.integers(0, 256, size=(o.N, o.N)).astype(np.uint8)
    w16 = g.integers(-32768, 32768, size=(o.N, o.N)).astype(np.int16)
    # Vectors 0..7 at full scale against matching weight columns: 4 x 256 x 32767 x 127
    # is about 4.3e9, so these sums wrap around int32 (once or twice).
    x[:8] = np.where(g.integers(0, 2, size=(8, o.N)) == 1, 32767, -32768)
    w0[:, :8] = np.where(x[:8].T > 0, 127, -128)
    one = o.matmul(x, w0)                      # exact: |one| < 2^31 for a single pass
    s = o.wrap_int32(reps * one)
    u = o.matmul(x, w1)
    # 16 x 16 bits: |x @ w16| < 256 * 2^30, exact in float64, then wrapped to int32.
    v = o.wrap_int32(np.rint(x.astype(np.float64) @ w16.astype(np.float64)).astype(np.int64))
    w16_lo = (w16.astype(np.int64) & 0xFF).astype(np.uint8).view(np.int8)
    w16_hi = (w16.astype(np.int64) >> 8).astype(np.int8)
    y16 = np.clip((u + (1 << 15)) >> 16, -32768, 32767).astype(np.int16)
    rows_x = split16(x)
    o.save(out_dir,
           host=o.host_image(5 * b, x=(0, rows_x)),
           weights=np.stack([w0, w1.view(np.int8), w16_lo, w16_hi]),
           s=s.astype(np.int32),
           u=o.wrap_int32(u).astype(np.int32),
           v=v.astype(np.int32),
           y=o.requantize(s),
           y16=split16(y16))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

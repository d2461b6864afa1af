"""Data for conv2d_pool: a 32 x 32 image of 128 channels, a 3x3 kernel to 256 channels.

Expected output from the independent numpy model (programs/tpu_oracle.py): a direct
convolution over the zero-padded image (tap by tap, no im2col), ReLU, 2x2 max and
average pooling (and conv2d_pool_fifo8's 1-D max pool of 4 rows), then the rounding
shift and int8 saturation.
Usage: python gen.py [OUT_DIR]   (default: ./data)
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(next(p for p in HERE.parents if (p / "tpu_oracle.py").exists())))
import numpy as np  # noqa: E402
import tpu_oracle as o  # noqa: E402

SEED = 5
C_IN, C_OUT = 128, 256


def conv3x3(img, kernel):
    """img (H+2, W+2, N) padded, kernel (3, 3, N, N): out (H, W, N) exact."""
    h, w = img.shape[0] - 2, img.shape[1] - 2
    out = np.zeros((h, w, o.N), dtype=np.int64)
    for dy in range(3):
        for dx in range(3):
            window = img[dy:dy + h, dx:dx + w].reshape(-1, o.N)
            out += o.matmul(window, kernel[dy, dx]).reshape(h, w, o.N)
    return out


def generate(out_dir):
    c = o.read_equs(HERE / "conv2d_pool.tasm")
    h, w = c["H"], c["W"]
    g = o.rng(SEED)
    img = np.zeros((h + 2, w + 2, o.N), dtype=np.int8)          # zero border and channels
    img[1:-1, 1:-1, :C_IN] = o.random_int8(g, (h, w, C_IN))
    kernel = np.zeros((3, 3, o.N, o.N), dtype=np.int8)
    kernel[:, :, :C_IN, :C_OUT] = o.random_int8(g, (3, 3, C_IN, C_OUT))
    acc = o.wrap_int32(conv3x3(img, kernel)).reshape(h * w, o.N)
    relu = np.maximum(acc, 0)
    y = o.requantize(o.max_pool_2d(relu, width=w, k=2), shift=c["SHIFT"])
    y_avg = o.requantize(o.avg_pool_2d(relu, width=w, k=2), shift=c["SHIFT"])
    y_1d = o.requantize(acc.reshape(-1, 4, o.N).max(axis=1), shift=c["SHIFT"])  # fifo8 variant
    rows = img.reshape(-1, o.N)
    o.save(out_dir,
           host=o.host_image(len(rows) + 3 * len(y), img=(0, rows)),
           weights=kernel.reshape(9, o.N, o.N),
           y=y, y_avg=y_avg, y_1d=y_1d)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "data")

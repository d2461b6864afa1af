"""Train the digits MLP and CNN in numpy and write mlp.onnx, cnn.onnx and calibration.npy
(200 training images for post-training quantization) next to this file.

    python programs/digits/train.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import digits  # noqa: E402


def main() -> int:
    import onnx
    x_train, y_train, x_test, y_test = digits.load_split()
    for kind, epochs in (("mlp", 30), ("cnn", 15)):
        params = digits.train(kind, x_train, y_train, epochs)
        acc = digits.accuracy(kind, params, x_test, y_test)
        onnx.save(digits.to_onnx(kind, params), str(HERE / f"{kind}.onnx"))
        print(f"{kind}: test accuracy {acc:.2%} (numpy float)")
    np.save(HERE / "calibration.npy", x_train[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())

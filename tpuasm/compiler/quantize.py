"""Post-training static int8 quantization of a float model from a calibration set, by
onnxruntime.quantization.quantize_static: QDQ format, weights int8 symmetric per output
channel, activations uint8 per tensor (MinMax calibration).  The QDQ model it writes is the
model the compiler then compiles and the reference it is checked against."""
from __future__ import annotations


import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.reader import input_signature


def read_calibration(path, model, model_path) -> dict[str, np.ndarray]:
    """DATA.npy (one input) or DATA.npz (keyed by input name) -> {input: (rows, *shape)}."""
    from tpuasm.compiler.arrays import read_named_arrays
    signature = input_signature(model)
    data = read_named_arrays(path, list(signature))
    return check_samples(data, signature, path)


def check_samples(data: dict, signature: dict, path) -> dict[str, np.ndarray]:
    missing = [n for n in signature if n not in data]
    if missing:
        raise CompileError(f"{path}: no calibration data for input(s) {', '.join(missing)}")
    rows = None
    out = {}
    for name, dims in signature.items():
        x = np.asarray(data[name])
        want = tuple(dims[1:])
        if x.ndim != len(dims) or tuple(x.shape[1:]) != want:
            raise CompileError(f"{path}: calibration data for '{name}' has shape {x.shape}, "
                               f"expected (rows, {', '.join(map(str, want))})")
        if x.dtype.kind not in "fiu" or not np.all(np.isfinite(x)):
            raise CompileError(f"{path}: calibration data for '{name}' must be finite numbers")
        if len(x) == 0 or (rows is not None and len(x) != rows):
            raise CompileError(f"{path}: calibration inputs need the same, non-zero number "
                               f"of rows")
        rows = len(x)
        out[name] = x.astype(np.float32)
    return out


def quantize(model_path, samples: dict[str, np.ndarray], signature: dict, out_path) -> None:
    """Write the QDQ model for `model_path` calibrated on `samples` to `out_path`."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    rows = len(next(iter(samples.values())))
    fixed = {n: d[0] for n, d in signature.items() if isinstance(d[0], int) and d[0] > 0}
    step = min(fixed.values()) if fixed else min(rows, 64)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.start = 0

        def get_next(self):
            if self.start >= rows:
                return None
            feed = {}
            for name, x in samples.items():
                chunk = x[self.start:self.start + step]
                if len(chunk) < step and name in fixed:   # repeat rows: min/max unchanged
                    chunk = np.concatenate([chunk, x[:step - len(chunk)]])
                feed[name] = chunk
            self.start += step
            return feed

    import logging
    logging.getLogger().setLevel(logging.ERROR)      # quantize_static's pre-processing hints
    try:
        quantize_static(str(model_path), str(out_path), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)
    except Exception as e:
        raise CompileError(f"{model_path}: quantization failed: "
                           f"{str(e).strip().splitlines()[0] if str(e).strip() else e!r}"
                           ) from None

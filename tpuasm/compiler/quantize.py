"""Post-training static int8 quantization of a float model from a calibration set, by
onnxruntime.quantization.quantize_static: QDQ format, weights int8 symmetric per output
channel, activations uint8 per tensor (MinMax calibration).  The QDQ model it writes is the
model the compiler then compiles and the reference it is checked against."""
from __future__ import annotations


import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.samples import calibration_feeds, check_samples, read_calibration  # noqa: F401


def quantize(model_path, samples: dict[str, np.ndarray], signature: dict, out_path,
             batch_axes: dict | None = None) -> None:
    """Write the QDQ model for `model_path` calibrated on `samples` to `out_path`
    (`batch_axes`: input -> batch axis or None; default: batch first)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    feeds = calibration_feeds(samples, signature, batch_axes)

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

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

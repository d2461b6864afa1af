"""ONNX models -> TPU programs (spec: issue 10; docs/compiler.md).  ir.py is the seam between
the front end (ONNX -> quantized segments) and the back end (segments -> .tasm, weights, host
layout).

    tpuasm.compile(path, batch=..., calibration=..., config=...) -> CompiledModel
    CompiledModel.run(inputs), .report, .save(outdir);  tpuasm.compiler.load(outdir)
"""
from __future__ import annotations


def compile(path, batch=None, calibration=None, config=None, *,  # noqa: A001 (the API's name)
            per_channel=True, symmetric_activations=False, calibration_method="auto",
            percentile=99.999, keep_float=(), validate=None, min_agreement=0.99,
            min_snr=20.0, batch_axes=None, input_values=None, activation_bits=8,
            wide_tensors=(), weight_bits=8, wide_weights=(), class_axes=None,
            input_shapes=None, input_ranges=None):
    """Compile an ONNX model: a float model with `calibration` (array or {input: array},
    or a .npy/.npz path), or a quantized QDQ/QOperator model.  Returns a CompiledModel.

    For a float model: `per_channel` (int8 weights per output channel, else per tensor),
    `symmetric_activations` (int8 activations with zero point 0, else uint8),
    `calibration_method` ("auto": minmax, or the method that keeps the answers when minmax
    falls below `min_agreement`; "minmax", "entropy", "percentile" with `percentile`),
    `keep_float` (node names or operator types left in float on the host),
    `activation_bits` (16: every activation between TPU matrix operators int16, the TPU's
    16-bit activations at half rate) and `wide_tensors` (names of tensors made int16),
    `weight_bits` (16: int16 weights for every matrix node on the TPU, MatrixMultiply's D
    flag at half rate) and `wide_weights` (names of nodes given int16 weights).  The compiled
    model is checked against the float one on the calibration data, or on `validate` (data,
    or False for no check): `model.report.validation`, whose `warnings` name each output
    below `min_agreement` (top-1, a share) or `min_snr` (dB).  `batch_axes`: {input: axis
    or None} where the inferred batch axes are not the right ones.  `input_values`:
    {input: value}: inputs fixed to a value when compiling (an If on them folded).
    `class_axes`: {output: axis or None}: the axis of an output's class scores, judged by
    top-1 agreement at every other position (None: by SNR only), where the rule of
    runtime/classaxis.py (a Softmax, an ArgMax or a classifier head) is not the right one.
    `input_shapes`: {input: dims}, each a positive integer or a name (N) that stays dynamic:
    the sizes of dynamic dimensions other than the batch (a quantized model's sequence
    length, which no calibration data fixes).  `input_ranges`: {input: (lo, hi)}, a
    quantized model's float inputs' ranges, so that the float nodes over them that
    onnxruntime's quantizer leaves (an LSTM's input products) are quantized from bounds."""
    from tpuasm.compiler.pipeline import compile_model
    quantization = None
    custom = (not per_channel or symmetric_activations or calibration_method != "auto"
              or percentile != 99.999 or keep_float or str(activation_bits) != "8"
              or wide_tensors or str(weight_bits) != "8" or wide_weights)
    if calibration is not None or custom:
        from tpuasm.compiler.front.quantize import QuantOptions
        quantization = QuantOptions(bool(per_channel), bool(symmetric_activations),
                                    calibration_method, percentile,
                                    keep_float if isinstance(keep_float, str)
                                    else tuple(keep_float or ()),
                                    activation_bits=activation_bits,
                                    wide_tensors=wide_tensors if isinstance(wide_tensors, str)
                                    else tuple(wide_tensors or ()),
                                    weight_bits=weight_bits,
                                    wide_weights=wide_weights if isinstance(wide_weights, str)
                                    else tuple(wide_weights or ()))
    return compile_model(path, batch=batch, calibration=calibration, config=config,
                         quantization=quantization, validate=validate,
                         min_agreement=min_agreement, min_snr=min_snr,
                         batch_axes=batch_axes, input_values=input_values,
                         class_axes=class_axes, input_shapes=input_shapes,
                         input_ranges=input_ranges)


def load(outdir):
    """A CompiledModel from a directory written by `CompiledModel.save` / `tpuasm compile`."""
    from tpuasm.compiler.runtime.model import load as _load
    return _load(outdir)

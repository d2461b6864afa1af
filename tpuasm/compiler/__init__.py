"""ONNX models -> TPU programs (spec: issue 10; docs/compiler.md).  ir.py is the seam between
the front end (ONNX -> quantized segments) and the back end (segments -> .tasm, weights, host
layout).

    tpuasm.compile(path, batch=..., calibration=..., config=...) -> CompiledModel
    CompiledModel.run(inputs), .report, .save(outdir);  tpuasm.compiler.load(outdir)
"""
from __future__ import annotations


def compile(path, batch=None, calibration=None, config=None,  # noqa: A001 (the API's name)
            batch_axes=None):
    """Compile an ONNX model: a float model with `calibration` (array or {input: array},
    or a .npy/.npz path), or a quantized QDQ/QOperator model.  `batch_axes`: {input: axis
    or None} where the inferred batch axes are not the right ones.  Returns a
    CompiledModel."""
    from tpuasm.compiler.pipeline import compile_model
    return compile_model(path, batch=batch, calibration=calibration, config=config,
                         batch_axes=batch_axes)


def load(outdir):
    """A CompiledModel from a directory written by `CompiledModel.save` / `tpuasm compile`."""
    from tpuasm.compiler.outdir import load as _load
    return _load(outdir)

"""ONNX models -> TPU programs (spec: issue 10; docs/compiler.md).  ir.py is the seam between
the front end (ONNX -> quantized segments) and the back end (segments -> .tasm, weights, host
layout).

    tpuasm.compile(path, batch=..., calibration=..., config=...) -> CompiledModel
    CompiledModel.run(inputs), .report, .save(outdir);  tpuasm.compiler.load(outdir)
"""
from __future__ import annotations


def compile(path, batch=None, calibration=None, config=None):  # noqa: A001 (the API's name)
    """Compile an ONNX model: a float model with `calibration` (array or {input: array},
    or a .npy/.npz path), or a quantized QDQ/QOperator model.  Returns a CompiledModel."""
    from tpuasm.compiler.pipeline import compile_model
    return compile_model(path, batch=batch, calibration=calibration, config=config)


def load(outdir):
    """A CompiledModel from a directory written by `CompiledModel.save` / `tpuasm compile`."""
    from tpuasm.compiler.model import load as _load
    return _load(outdir)

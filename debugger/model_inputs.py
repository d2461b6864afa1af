"""`tpuasm debug OUTDIR --input X.npy`: every TPU segment of a compiled model with the host
image it sees when the model runs on those inputs (the first batch), instead of the sample
batch saved in OUTDIR.  The model runs once, on the emulator, through the compiler's own
runtime (tpuasm.compiler): the host parts before a segment compute what it reads."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def segment_host_images(outdir: Path, data_path: Path) -> dict[str, np.ndarray]:
    """{segment name: its host image} for the first batch of the inputs in `data_path`
    (.npy for a one-input model, .npz keyed by input name; fewer rows than a batch are
    padded with zeros).  TpuasmError (CompileError, DataFileError) when they do not fit."""
    return model_run(outdir, data_path)[0]


def model_run(outdir: Path, data_path: Path) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """segment_host_images, and what every host part read and wrote in that run:
    {host part name: {"inputs": {tensor: array}, "outputs": {tensor: array}}} (the
    runtime's layout: the batch rows first)."""
    from tpuasm.compiler.front.arrays import read_named_arrays
    from tpuasm.compiler.ir import ir_array
    from tpuasm.compiler.runtime.model import load
    from tpuasm.compiler.runtime.steps import HostStep, TpuStep, batch_values, prepare_inputs
    model = load(outdir)
    data = read_named_arrays(data_path, [i.name for i in model.inputs])
    data, rows = prepare_inputs(model.inputs, data)
    batch = model.batch
    values = batch_values(model.inputs, data, 0, min(batch, rows), batch)
    images, parts = {}, {}
    config = dict(model.config)
    for step in model.steps:
        if isinstance(step, TpuStep) and step.program is not None:
            inputs = {t.name: ir_array(t, values[t.name], batch) for t in step.segment.inputs}
            images[step.name] = step.program.host_image(inputs)
        if isinstance(step, HostStep):
            parts[step.name] = {"inputs": {t: values.get(t) for t in step.runner.inputs}}
        step.run(values, batch, "emulator", config)
        if isinstance(step, HostStep):
            parts[step.name]["outputs"] = {t: values.get(t) for t in step.runner.outputs}
    return images, parts

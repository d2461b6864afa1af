"""Models nobody here wrote: the PyTorch exports that ship with onnx's own backend tests
(onnx/backend/test/data/pytorch-converted and pytorch-operator: IR version 3, opset 6-9,
each with an input and the float output PyTorch computed).  Every one with matrix work is
compiled as shipped, from its own input as calibration data, and run: its output must keep
the float answer (the file's output_0.pb is the oracle) and its matrix MACs go to the TPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.macs import MATRIX_OPS

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def _cases():
    for kind in ("pytorch-converted", "pytorch-operator"):
        for case in sorted((DATA / kind).glob("test_*")):
            model = onnx.load(str(case / "model.onnx"))
            inputs = sorted((case / "test_data_set_0").glob("input_*.pb"))
            if len(inputs) == 1 and any(n.op_type in MATRIX_OPS for n in model.graph.node):
                yield pytest.param(case, id=case.name)


def _tensor(path: Path) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(str(path)))


@pytest.mark.skipif(not DATA.is_dir(), reason="this onnx build ships no backend test data")
@pytest.mark.parametrize("case", list(_cases()) if DATA.is_dir() else [])
def test_a_pytorch_export_compiles_as_shipped_and_keeps_its_answer(case):
    x = _tensor(case / "test_data_set_0" / "input_0.pb")
    want = _tensor(case / "test_data_set_0" / "output_0.pb")
    rng = np.random.default_rng(0)
    noisy = [x + rng.normal(0, 0.1 * float(x.std()) + 1e-3, x.shape).astype(x.dtype)
             for _ in range(7)]
    calibration = np.concatenate([x, *noisy])
    compiled = tpu_compile(str(case / "model.onnx"), calibration=calibration,
                           config={"array_size": 32})
    report = compiled.report
    assert report.macs > 0 and report.tpu_macs == report.macs, report.rows
    got = compiled.run(x)
    got = got[next(iter(got))]
    assert got.shape == want.shape
    error = np.sum((got.astype(np.float64) - want) ** 2)
    snr = 10 * np.log10(np.sum(want.astype(np.float64) ** 2) / max(error, 1e-30))
    assert snr > 30, f"SNR {snr:.1f} dB against PyTorch's own output"


LIGHT = DATA / "light"


@pytest.mark.skipif(not LIGHT.is_dir(), reason="this onnx build ships no light models")
@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_a_zoo_network_compiles_whole_onto_the_tpu(name):
    """The 'light' ImageNet networks onnx ships (their weights made at load time by
    ConstantOfShape, folded here): SqueezeNet's fire modules (Concat of 1x1 and 3x3
    branches) and ShuffleNet's channel shuffle, grouped convolutions and a first pooling
    too large for an accumulator half (on the host, with its reason) compile as shipped,
    every MAC on the TPU, and give the output stored beside the model."""
    path = LIGHT / f"light_{name}.onnx"
    x = np.random.default_rng(0).normal(0, 1, (2, 3, 224, 224)).astype(np.float32)
    compiled = tpu_compile(str(path), calibration=x)
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    got = compiled.run(x[:1])
    got = got[next(iter(got))]
    want = _tensor(LIGHT / f"light_{name}_output_0.pb")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=0.02 * float(np.abs(want).max()))

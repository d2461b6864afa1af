"""The check `tpuasm compile` makes of every segment's program against reference.py
(codegen/golden.py): rounding near-ties pass, a back-end bug does not.  Segments with
VADD/VMUL or average pooling, whose exact arithmetic ties with onnxruntime's float32 on
"round" scales, allow more of them (docs/compiler.md, Rounding)."""
from __future__ import annotations

import numpy as np
import pytest

import float_models
from tpuasm.compiler.codegen.golden import check_against_reference, sample_inputs
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.ir import Elementwise
from tpuasm.compiler.pipeline import compile_model
from tpuasm.compiler.reference import run_segment
from tpuasm.compiler.runtime.steps import TpuStep


def _step_and_answer(tmp_path, layers):
    path = float_models.save(float_models.build(layers, (24,)), tmp_path / "m.onnx")
    calib = np.random.default_rng(0).normal(0, 1, (32, 24)).astype(np.float32)
    model = compile_model(path, batch=8, calibration=calib, config={"array_size": 16},
                          validate=False)
    (step,) = [s for s in model.steps if isinstance(s, TpuStep)]
    inputs = sample_inputs(step, 8)
    return step, inputs, run_segment(step.segment, inputs)


def _off(answer: dict, count: int, by: int) -> dict:
    """The answer with `count` values moved by `by` units."""
    out = {}
    for name, values in answer.items():
        v = values.astype(np.int64).reshape(-1).copy()
        top = np.iinfo(values.dtype).max
        v[:count] = np.where(v[:count] + by > top, v[:count] - by, v[:count] + by)
        out[name] = v.astype(values.dtype).reshape(values.shape)
    return out


def test_a_matrix_segment_allows_a_tie_or_two_and_nothing_more(tmp_path):
    step, inputs, answer = _step_and_answer(tmp_path, [("gemm", 16), ("relu",), ("gemm", 8)])
    assert not any(isinstance(op, Elementwise) for op in step.segment.operators)
    check_against_reference(step, answer, inputs)
    check_against_reference(step, _off(answer, 2, 1), inputs)       # two near-ties
    with pytest.raises(CompileError, match="a back-end bug"):
        check_against_reference(step, _off(answer, 1, 2), inputs)   # 2 LSB
    with pytest.raises(CompileError, match="a back-end bug"):
        check_against_reference(step, _off(answer, 12, 1), inputs)  # too many


def test_a_vector_segment_allows_ties_grown_by_a_constant(tmp_path):
    # the Relu keeps the Add a vector operation (a constant Add right after the Gemm folds)
    step, inputs, answer = _step_and_answer(tmp_path, [("gemm", 16), ("relu",), ("add_const",)])
    assert any(isinstance(op, Elementwise) for op in step.segment.operators)
    size = sum(v.size for v in answer.values())
    check_against_reference(step, _off(answer, max(2, size // 25), 1), inputs)   # 4 %
    check_against_reference(step, _off(answer, 2, 4), inputs)
    with pytest.raises(CompileError, match="a back-end bug"):
        check_against_reference(step, _off(answer, 2, 5), inputs)
    with pytest.raises(CompileError, match="a back-end bug"):
        check_against_reference(step, _off(answer, size // 10, 1), inputs)

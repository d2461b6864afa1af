"""The corpus of real architectures (tests/real_models.py) through the real entry points
(issue 20's acceptance): each model compiled with `python -m tpuasm compile` and run with
`python -m tpuasm infer` in subprocesses, then checked against independent oracles:

- both commands exit 0 without a traceback, and infer writes one output row per input row;
- report.json says `TPU` for every Conv/MatMul/Gemm/BatchNormalization/LSTM/GRU node (and
  QLinear form, and ai.onnx.ml LinearClassifier) whose weights are constants;
- top-1 agreement with onnxruntime on the FLOAT model >= 99 %;
- outputs vs onnxruntime on OUTDIR/model.qdq.onnx: >= 99.9 % identical, none more than one
  step of the output's quantization apart (a QDQ model written with the compiled batch fixed
  runs in chunks of that batch).

The data files hold each input in the model's own layout, what onnxruntime takes: a
sequence-first input keeps its rows on its batch axis (the LSTM's `x` is (10, rows, 8), its
`h0`/`c0` (1, rows, 32); the graph names that dimension `batch` in every input), int32
inputs stay int32.  `--batch B` sets that dimension.

A check that fails on this branch is marked xfail(strict) with the failure measured here, so
that a feature landing turns it into an XPASS (a failure, strict) that asks for the marker to
go.  Each model is compiled and run once per test session (a module fixture); the whole file
runs in about a minute on one core."""
from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from real_models import (BUILDERS, Outcome, RealModel, compile_and_infer, macs, nodes_on_tpu,
                         qdq_agreement, run, top1_agreement)

# check -> model -> the failure measured on this branch (before the issue-20 features merge)
XFAIL = {"runs": {}, "on_tpu": {}, "top1": {}, "identical": {
    # the check (98.44 % top-1 on its rows at 8 bits, int16 activations no better) gives its
    # four weights 16 bits (99.22 %; 100 % top-1 on the evaluation rows, 99.33 % before):
    # onnxruntime has no integer kernel for int16 weights and computes those layers in
    # float32, where the chip sums exactly (docs/compiler.md, 16-bit weights)
    "conv1d_audio": "logits 99.61 % identical to onnxruntime's float32 evaluation of its "
                    "int16-weight QDQ model, none more than one step apart",
    # the check gives the recurrent cell int16 tensors (its SNR against the float model
    # 33.3 -> 39.4 dB, 38.2 -> 41.1 dB): onnxruntime's QDQ model computes its int16 Gemms,
    # Adds and Muls in float32, the chip exactly, and a near-tie that moves a table's index
    # is carried by the later steps
    "lstm_classifier": "logits 99.53 % identical to onnxruntime's float32 evaluation of its "
                       "int16 QDQ model, none more than one int16 step apart",
    "gru_classifier": "logits 98.6 % identical to onnxruntime's float32 evaluation of its "
                      "int16 QDQ model, at most 4 int16 steps apart"}}
# a model that does not compile fails every later check too
for _name in XFAIL["runs"]:
    for _check in ("on_tpu", "top1", "identical"):
        XFAIL[_check].setdefault(_name, "does not compile: " + XFAIL["runs"][_name])


@cache
def build(name: str) -> RealModel:
    return BUILDERS[name]()


def cases(check: str):
    return [pytest.param(name, id=name, marks=[pytest.mark.xfail(strict=True, reason=why)]
                         if (why := XFAIL[check].get(name)) else [])
            for name in BUILDERS]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    done: dict[str, Outcome] = {}

    def get(name: str) -> Outcome:
        if name not in done:
            done[name] = compile_and_infer(build(name), tmp_path_factory.mktemp(name))
        result = done[name]
        if result.failure:
            pytest.fail(result.failure)
        return result
    return get


@pytest.mark.parametrize("name", cases("runs"))
def test_compiles_and_infers_from_the_cli(outcome, name):
    result = outcome(name)      # fails unless both exit 0, no traceback, one row per row
    assert result.outputs[result.model.output].dtype.kind in "fiu"


@pytest.mark.parametrize("name", cases("on_tpu"))
def test_matrix_nodes_with_constant_weights_run_on_the_tpu(outcome, name):
    wanted, missing = nodes_on_tpu(outcome(name))
    assert wanted, "the corpus model has matrix nodes with constant weights"
    assert not missing, f"{len(missing)} of {len(wanted)} not on the TPU: {missing}"


@pytest.mark.parametrize("name", cases("top1"))
def test_top1_agrees_with_the_float_model(outcome, name):
    agreement = top1_agreement(outcome(name))
    assert agreement >= 0.99, f"top-1 agreement with the float model {agreement:.2%}"


@pytest.mark.parametrize("name", cases("identical"))
def test_outputs_equal_onnxruntime_on_the_saved_qdq_model(outcome, name):
    compared = qdq_agreement(outcome(name))
    assert compared, "no tensor output to compare"
    for out, (same, worst) in compared.items():
        assert same >= 0.999, f"{out}: {same:.2%} identical"
        assert worst is None or worst <= 1 + 1e-4, f"{out}: worst difference {worst:.2f} steps"


def test_the_float_models_are_trained_classifiers():
    """Top-1 agreement means something only if the float models predict their data: each
    is >= 90 % accurate on its evaluation rows, and no class takes more than half of them."""
    for name in BUILDERS:
        m = build(name)
        names = [o.name for o in m.reference.graph.output]
        predicted = m.top1(run(m.reference, m.evaluation)[names.index(m.output)])
        assert np.mean(predicted == m.labels) >= 0.9, name
        assert np.bincount(predicted).max() <= len(predicted) / 2, name


def test_mac_counts_match_the_layer_shapes():
    """benchmarks/real_models.py's MACs per sample (shapes from onnxruntime), against counts
    written out from the builders' layer shapes."""
    m = build("mobilenet_v2_block")
    pixels = 12 * 12
    want = (pixels * 16 * 3 * 9 + pixels * 64 * 16 + pixels * 64 * 9 + pixels * 16 * 64
            + pixels * 48 * 16 + 48 * 6)
    assert sum(macs(m.model, m.batch_axis, m.evaluation).values()) == want
    m = build("lstm_classifier")
    counted = macs(m.model, m.batch_axis, m.evaluation)
    assert counted == {"/lstm/LSTM": 10 * 4 * 32 * (8 + 32), "/fc/Gemm": 32 * 5}
    m = build("transformer_encoder")
    tokens, width, heads = 8, 32, 2
    want = (4 * tokens * width * width                          # Q, K, V, output
            + 2 * heads * tokens * tokens * (width // heads)    # scores, context
            + 2 * tokens * width * 4 * width + width * 4)       # MLP, classifier
    assert sum(macs(m.model, m.batch_axis, m.evaluation).values()) == want

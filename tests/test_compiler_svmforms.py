"""Linear-kernel SVMs (ai.onnx.ml SVMClassifier / SVMRegressor, as skl2onnx writes scikit-
learn's SVC and SVR) with their kernels as one Gemm (front/svmforms.py): onnxruntime on the
rewritten model gives the original's answers (labels, Platt probabilities, decision
values), and compiled, the Gemm runs on the TPU."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.front.svmforms import rewrite_linear_svms
from tpuasm.compiler.ort import session

skl2onnx = pytest.importorskip("skl2onnx")


def _data(name):
    from sklearn import datasets
    from sklearn.preprocessing import StandardScaler
    data = getattr(datasets, f"load_{name}")()
    # standardized: unscaled breast-cancer features (up to 4,000) make the float32 kernel
    # sums of the original itself round differently from one order of summation to another
    return StandardScaler().fit_transform(data.data).astype(np.float32), data.target


def _as_arrays(outputs):
    return [np.array([[row[k] for k in sorted(row)] for row in v], np.float32)
            if isinstance(v, list) else v for v in outputs]


def _svc(**options):
    from sklearn.svm import SVC
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # scikit-learn 1.9 deprecates probability
        return SVC(kernel="linear", random_state=0, **options)


CASES = [("digits", dict(probability=True)), ("digits", {}), ("iris", dict(probability=True)),
         ("breast_cancer", dict(probability=True)), ("breast_cancer", {}), ("diabetes", None)]


@pytest.mark.parametrize("dataset, options", CASES)
def test_a_linear_svm_keeps_its_answers_with_its_kernels_one_gemm(dataset, options):
    from sklearn.svm import SVR
    x, target = _data(dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator = (SVR(kernel="linear") if options is None else _svc(**options)).fit(
            x[:300], target[:300])
        model = skl2onnx.to_onnx(estimator, x[:1])
    want = _as_arrays(session(model).run(None, {"X": x}))
    assert rewrite_linear_svms(model, Provenance.of(model)) == 1
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert gemm.input[0] == "X"
    got = _as_arrays(session(model).run(None, {"X": x}))
    for a, b in zip(want, got):
        if a.dtype.kind in "iu":
            np.testing.assert_array_equal(b, a)
        else:
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)


def test_an_rbf_svm_stays_as_it_is():
    from sklearn.svm import SVC
    x, target = _data("iris")
    model = skl2onnx.to_onnx(SVC().fit(x, target), x[:1])
    assert rewrite_linear_svms(model, Provenance.of(model)) == 0


def test_a_linear_svc_with_probabilities_has_its_kernels_on_the_tpu(tmp_path):
    """SVC(kernel='linear', probability=True) on digits: its SVMClassifier ran whole on the
    host; now its 64 x 45 decision Gemm runs on the TPU, the votes and probabilities on the
    host, with the float model's labels on new rows."""
    from sklearn.datasets import load_digits
    x, labels = load_digits(return_X_y=True)
    x = x.astype(np.float32)
    model = skl2onnx.to_onnx(_svc(probability=True).fit(x[:1000], labels[:1000]), x[:1])
    path = tmp_path / "svc.onnx"
    path.write_bytes(model.SerializeToString())
    compiled = tpu_compile(str(path), batch=32, calibration=x[1000:1128])
    row = next(r for r in compiled.report.rows if r.op_type == "SVMClassifier")
    assert row.where == "TPU" and "Gemm on the TPU" in row.reason
    assert compiled.report.tpu_macs == compiled.report.macs == 32 * 64 * 45
    new = x[1128:1640]
    want = session(model).run(["output_label"], {"X": new})[0]
    assert np.mean(compiled.run(new)["output_label"] == want) >= 0.99

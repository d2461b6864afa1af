"""scikit-learn's linear-kernel SVMs with their matrix work as a Gemm (float model, before
quantization; see prepare.py for the other rewrites).

ai.onnx.ml's SVMRegressor and SVMClassifier compute kernels K(x, s) against every support
vector s; with a LINEAR kernel, K(x, s) = x . s, so every sum of kernels they take is x . w
for a w made of the support vectors:

- SVMRegressor: y = sum_s c_s K(x, s) + rho = x . (sum_s c_s s) + rho: a Gemm.
- SVMClassifier (one against one, libsvm's layout): the decision value of classes i < j is
  sum over class i's vectors of c[j-1][s] K(x, s) + over class j's of c[i][s] K(x, s), + rho,
  that is x . w_ij + rho_ij.  The Gemm Z = X W^T (a column per pair) goes to the TPU, and the
  SVMClassifier stays on the host, reading Z with one support vector per pair: the unit
  vector e_p of pair p = (i, j), of class i, its coefficient 1 in row j - 1 (0 elsewhere),
  so that its sum for (i, j) is K(z, e_p) = z_p and its votes, Platt probabilities and
  pairwise coupling are onnxruntime's own, on P = C (C - 1) / 2 columns instead of every
  support vector (SVC(kernel='linear', probability=True) on digits: 64 x 45 on the TPU).

Another kernel, post-transform or a one-class regressor stays as it is, on the host."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tpuasm.compiler.front.prepare import _attr, _expand_nodes, _Index
from tpuasm.compiler.front.provenance import Provenance


def rewrite_linear_svms(model, prov: Provenance) -> int:
    """Every linear-kernel SVMRegressor / SVMClassifier the module's text describes,
    rewritten in place; the count done."""
    idx = _Index(model)

    def wanted(node) -> bool:
        if node.domain != "ai.onnx.ml" or node.op_type not in ("SVMClassifier", "SVMRegressor"):
            return False
        kernel = _attr(node, "kernel_type", b"LINEAR")
        kernel = kernel.decode() if isinstance(kernel, bytes) else kernel
        support = _attr(node, "support_vectors", [])
        return kernel == "LINEAR" and len(support) > 0 and (
            node.op_type == "SVMClassifier" and len(_attr(node, "vectors_per_class", [])) > 1
            or node.op_type == "SVMRegressor" and not _attr(node, "one_class", 0)
            and _post(node) == "NONE")

    def expand(node) -> list:
        return (_classifier if node.op_type == "SVMClassifier" else _regressor)(idx, node)

    return _expand_nodes(model, prov, {}, "rewritten", wanted, expand)


def _post(node) -> str:
    post = _attr(node, "post_transform", b"NONE")
    return post.decode() if isinstance(post, bytes) else post


def _regressor(idx: _Index, node) -> list:
    coef = np.asarray(_attr(node, "coefficients"), np.float64)
    support = np.asarray(_attr(node, "support_vectors"), np.float64).reshape(len(coef), -1)
    w = (coef @ support).astype(np.float32)[None]                       # (1, F)
    rho = np.asarray(_attr(node, "rho", [0.0])[:1], np.float32)
    return [helper.make_node("Gemm", [node.input[0], idx.add_init(w, f"{node.name}_W"),
                                      idx.add_init(rho, f"{node.name}_rho")],
                             list(node.output), name=idx.unique(f"{node.name}_gemm"),
                             transB=1)]


def _classifier(idx: _Index, node) -> list:
    counts = [int(n) for n in _attr(node, "vectors_per_class")]
    classes, total = len(counts), sum(counts)
    coef = np.asarray(_attr(node, "coefficients"), np.float64).reshape(classes - 1, total)
    support = np.asarray(_attr(node, "support_vectors"), np.float64).reshape(total, -1)
    start = np.concatenate([[0], np.cumsum(counts)])
    pairs = [(i, j) for i in range(classes) for j in range(i + 1, classes)]
    w = np.stack([coef[j - 1, start[i]:start[i + 1]] @ support[start[i]:start[i + 1]]
                  + coef[i, start[j]:start[j + 1]] @ support[start[j]:start[j + 1]]
                  for i, j in pairs]).astype(np.float32)                 # (P, F)
    unit = np.zeros((classes - 1, len(pairs)), np.float32)             # e_p's coefficients
    for p, (i, j) in enumerate(pairs):
        unit[j - 1, p] = 1.0
    decisions = idx.unique(f"{node.name}_pairs")
    zeros = np.zeros(len(pairs), np.float32)           # (opset 9's Gemm wants its C)
    gemm = helper.make_node("Gemm", [node.input[0], idx.add_init(w, f"{node.name}_W"),
                                     idx.add_init(zeros, f"{node.name}_zero")],
                            [decisions], name=idx.unique(f"{node.name}_gemm"), transB=1)
    host = helper.NodeProto()
    host.CopyFrom(node)
    host.input[0] = decisions
    keep = [a for a in host.attribute
            if a.name not in ("support_vectors", "coefficients", "vectors_per_class")]
    del host.attribute[:]
    host.attribute.extend(keep)
    host.attribute.extend([
        helper.make_attribute("support_vectors", np.eye(len(pairs), dtype=np.float32)
                              .reshape(-1).tolist()),
        helper.make_attribute("coefficients", unit.reshape(-1).tolist()),
        helper.make_attribute("vectors_per_class",
                              [sum(1 for i, _ in pairs if i == k) for k in range(classes)])])
    return [gemm, host]

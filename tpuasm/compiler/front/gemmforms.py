"""Gemms rewritten in the form the TPU maps (float model, before quantization; see prepare.py
for the other rewrites): alpha and beta folded into the constants.

Gemm(A, B, C; alpha, beta) = alpha * A B + beta * C.  With B a constant, alpha goes into B's
values; with C a constant, beta goes into C's, and the Gemm is a plain one (alpha = beta = 1),
which the matcher takes.  A C computed at run time becomes an Add after the Gemm (beta * C a
Mul before it): scikit-learn's KMeans, as skl2onnx writes it, is Gemm(X, centres^T, Z,
alpha=-2) with Z computed from X, its distances' cross term, which stayed on the host
("alpha or beta is not 1").  A Gemm whose B is computed at run time stays as it is."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tpuasm.compiler.front.prepare import _attr, _expand_nodes, _Index
from tpuasm.compiler.front.provenance import Provenance


def rewrite_scaled_gemms(model, prov: Provenance) -> int:
    """Every Gemm with a constant B and alpha, or beta with a C, not 1, or a constant C of
    shape (1, N), as a plain Gemm (and an Add of C, when C is computed); the count done."""
    idx = _Index(model)

    def scaled(node) -> bool:
        has_c = len(node.input) > 2 and bool(node.input[2])
        c = idx.const(node.input[2]) if has_c else None
        return node.op_type == "Gemm" and idx.const(node.input[1]) is not None and \
            (_attr(node, "alpha", 1.0) != 1.0 or (has_c and _attr(node, "beta", 1.0) != 1.0)
             or (c is not None and c.ndim == 2 and c.shape[0] == 1))

    return _expand_nodes(model, prov, {}, "rewritten", scaled, lambda n: _plain(idx, n))


def _plain(idx: _Index, node) -> list:
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
    b = idx.const(node.input[1])
    inputs = [node.input[0], idx.add_init((b * alpha).astype(b.dtype), f"{node.name}_B")]
    transposes = {k: _attr(node, k) for k in ("transA", "transB") if _attr(node, k)}
    c_name = node.input[2] if len(node.input) > 2 else ""
    c = idx.const(c_name) if c_name else None
    if not c_name or c is not None:
        if c is not None:
            c = c.reshape(-1) if c.ndim == 2 and c.shape[0] == 1 else c
            inputs.append(idx.add_init((c * beta).astype(c.dtype), f"{node.name}_C"))
        return [helper.make_node("Gemm", inputs, list(node.output), name=node.name,
                                 **transposes)]
    product = idx.unique(f"{node.name}_product")
    made = [helper.make_node("Gemm", inputs, [product], name=node.name, **transposes)]
    if beta != 1.0:
        scaled = idx.unique(f"{node.name}_beta_c")
        made.append(helper.make_node("Mul", [c_name, idx.add_init(
            np.asarray(beta, b.dtype), f"{node.name}_beta")], [scaled],
            name=idx.unique(f"{node.name}_beta")))
        c_name = scaled
    made.append(helper.make_node("Add", [product, c_name], list(node.output),
                                 name=idx.unique(f"{node.name}_add_c")))
    return made

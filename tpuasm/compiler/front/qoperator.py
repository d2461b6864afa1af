"""A QOperator model (QLinearConv, QLinearMatMul, com.microsoft QGemm, QLinearAdd, ...)
rewritten in its QDQ form, so that qdqfloat.read_back can read it back as float when it is
given --calibrate.

Each QLinear operator becomes DequantizeLinear on its quantized inputs, the float operator
it stands for, and QuantizeLinear of its output with the output's scale and zero point:
the same arithmetic as onnxruntime's kernels up to where they round.  An int32 bias is
made float with the scale it was quantized at (the input's scale times the weights').  An
operator this does not know leaves the model as it is, and the caller says which."""
from __future__ import annotations

import numpy as np
from onnx import helper

from tpuasm.compiler.front.prepare import _Index

# one quantized input (x, scale, zero point) then the output's (scale, zero point)
_UNARY = {"QLinearSigmoid": "Sigmoid", "QLinearLeakyRelu": "LeakyRelu",
          "QLinearSoftmax": "Softmax", "QLinearGlobalAveragePool": "GlobalAveragePool",
          "QLinearAveragePool": "AveragePool"}
# two quantized inputs (A, scale, zero point, B, scale, zero point), then the output's
_BINARY = {"QLinearAdd": "Add", "QLinearMul": "Mul"}
KNOWN = {"QLinearConv", "QLinearMatMul", "QGemm", "QLinearConcat", *_UNARY, *_BINARY}


def to_qdq(model) -> tuple[int, str | None]:
    """Rewrite `model`'s QLinear operators in place as QDQ; (how many, None), or (0, why
    not) leaving the model as it is."""
    unknown = sorted({n.op_type for n in model.graph.node
                      if n.op_type.startswith("QLinear") and n.op_type not in KNOWN})
    if unknown:
        return 0, f"it has QLinear operators with no float form here ({', '.join(unknown)})"
    idx = _Index(model)
    kept, count = [], 0
    for node in model.graph.node:
        if node.op_type not in KNOWN:
            kept.append(node)
            continue
        nodes = _rewrite(node, idx)
        if nodes is None:
            return 0, f"{node.op_type} '{node.name or node.output[0]}' has a form not read here"
        for made in nodes:            # the float operator keeps the node's name (the report)
            if made.op_type not in ("QuantizeLinear", "DequantizeLinear") and node.name:
                made.name = node.name
        kept.extend(nodes)
        count += 1
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return count, None


def _rewrite(node, idx: _Index):
    ins = list(node.input)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    y = node.output[0]
    if op in _UNARY:
        if attrs.pop("channels_last", 0):
            return None
        if op == "QLinearSoftmax":
            attrs.pop("opset", None)
        x = _dq(ins[0:3], idx)
        f = _float(_UNARY[op], [x[0]], y, idx, attrs)
        return [x[1], f, _q(f, y, ins[3:5], idx)]
    if op in _BINARY:
        a, b = _dq(ins[0:3], idx), _dq(ins[3:6], idx)
        f = _float(_BINARY[op], [a[0], b[0]], y, idx, attrs)
        return [a[1], b[1], f, _q(f, y, ins[6:8], idx)]
    if op == "QLinearConcat":
        parts = [_dq(ins[i:i + 3], idx) for i in range(2, len(ins), 3)]
        f = _float("Concat", [p[0] for p in parts], y, idx, attrs)
        return [p[1] for p in parts] + [f, _q(f, y, ins[0:2], idx)]
    if op == "QLinearConv":
        x, w = _dq(ins[0:3], idx), _dq(ins[3:6], idx, axis=0)
        inputs = [x[0], w[0]]
        if len(ins) > 8 and ins[8]:
            bias = _float_bias(ins[8], ins[1], ins[4], idx)
            if bias is None:
                return None
            inputs.append(bias)
        f = _float("Conv", inputs, y, idx, attrs)
        return [x[1], w[1], f, _q(f, y, ins[6:8], idx)]
    if op == "QLinearMatMul":
        a, b = _dq(ins[0:3], idx), _dq(ins[3:6], idx)
        f = _float("MatMul", [a[0], b[0]], y, idx, {})
        return [a[1], b[1], f, _q(f, y, ins[6:8], idx)]
    if op == "QGemm":                 # com.microsoft: A, a_s, a_zp, B, b_s, b_zp, C, y_s, y_zp
        ins += [""] * (9 - len(ins))
        trans_b = attrs.get("transB", 0)
        a, b = _dq(ins[0:3], idx), _dq(ins[3:6], idx, axis=0 if trans_b else 1)
        inputs = [a[0], b[0]]
        if ins[6]:
            bias = _float_bias(ins[6], ins[1], ins[4], idx)
            if bias is None:
                return None
            inputs.append(bias)
        attrs = {k: v for k, v in attrs.items() if k in ("alpha", "transA", "transB")}
        if not ins[7]:                # a float output
            return [a[1], b[1], helper.make_node("Gemm", inputs, [y], name=node.name or y,
                                                 **attrs)]
        f = _float("Gemm", inputs, y, idx, attrs)
        return [a[1], b[1], f, _q(f, y, ins[7:9], idx)]
    return None


def _dq(triple, idx: _Index, axis: int | None = None):
    """(the float tensor, its DequantizeLinear) of a quantized input (x, scale, zero)."""
    x, scale, zero = (list(triple) + ["", "", ""])[:3]
    out = idx.unique(f"{x}_dequantized")
    attrs = {"axis": axis} if axis is not None else {}
    return out, helper.make_node("DequantizeLinear", [x, scale] + ([zero] if zero else []),
                                 [out], name=idx.unique(f"{x}_DequantizeLinear"), **attrs)


def _float(op: str, inputs: list, y: str, idx: _Index, attrs: dict):
    """The float operator, writing `y`'s float value (quantized by _q after it)."""
    return helper.make_node(op, inputs, [idx.unique(f"{y}_float")],
                            name=idx.unique(f"{y}_{op}"), **attrs)


def _q(made, y: str, pair, idx: _Index):
    """QuantizeLinear of the float node `made`'s output into the QLinear operator's `y`."""
    scale, zero = (list(pair) + ["", ""])[:2]
    return helper.make_node("QuantizeLinear", [made.output[0], scale] + ([zero] if zero else []),
                            [y], name=idx.unique(f"{y}_QuantizeLinear"))


def _float_bias(bias: str, x_scale: str, w_scale: str, idx: _Index):
    """An int32 bias in float: b * x_scale * w_scale (per output channel), as a new
    constant; None if any is not a constant."""
    b, xs, ws = idx.const(bias), idx.const(x_scale), idx.const(w_scale)
    if b is None or xs is None or ws is None:
        return None
    value = (b.astype(np.float64) * float(np.asarray(xs).reshape(-1)[0])
             * np.asarray(ws, np.float64).reshape(-1)).astype(np.float32)
    return idx.add_init(value, f"{bias}_float")

"""The multiply-accumulates of an ONNX node, from its shapes.

One meaning of "MACs" for the compiler's report: the products the network itself asks for
(a Gemm of (M, K) by (K, N) is M x K x N), whatever array they land on and whatever padding
the TPU program adds to fill its tiles.  The count is per batch of the shapes given (the
compiled batch); the quantized forms count like their float ones, onnxruntime's contrib
(com.microsoft) forms too: the fused and integer MatMul / Gemm / Conv kernels and the
DynamicQuantizeLSTM (an LSTM with transposed int8 weights), whether they run on the TPU or on
the host, so that the TPU's share is of the network's own work.
"""
from __future__ import annotations

from math import prod

# op type -> index of the input that holds the weight (Conv-like) or the right operand
_CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3, "FusedConv": 1}
_MATMUL = {"MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul", "MatMulIntegerToFloat",
           "DynamicQuantizeMatMul", "MatMulInteger16", "MatMulNBits"}
_GEMM = {"Gemm", "QGemm", "FusedGemm"}
_RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1, "DynamicQuantizeLSTM": 4}
# W (directions, input, 4 * hidden) and R (directions, hidden, 4 * hidden): the LSTM's
# weights transposed
_TRANSPOSED_GATES = {"DynamicQuantizeLSTM"}

_BRANCHING = {"If"}

# onnxruntime's attention kernels over projections made by MatMuls of their own: only the
# products of two activations, Q K^T and the weights by V
PROJECTED_ATTENTION = frozenset({"MultiHeadAttention", "GroupQueryAttention"})

MATRIX_OPS = frozenset({*_CONV_WEIGHT, *_MATMUL, *_GEMM, *_RECURRENT_GATES, "ConvTranspose",
                        "Einsum", "Attention", "QAttention", *PROJECTED_ATTENTION})


def node_macs(node, shapes: dict) -> int | None:
    """MACs of one node, or None when it is not a matrix operator or a shape it needs is
    unknown.  `node` has op_type, inputs, outputs and attr(); `shapes` maps tensor names to
    full shapes (batch included)."""
    op = node.op_type
    if op in _BRANCHING:
        return _branch_macs(node, shapes)
    if op not in MATRIX_OPS:
        return None

    def shape(name):
        s = shapes.get(name) if name else None
        return None if s is None or any(not isinstance(d, int) or d < 0 for d in s) \
            else tuple(s)

    y = shape(node.outputs[0]) if node.outputs else None
    if op in _CONV_WEIGHT:
        w = shape(node.input(_CONV_WEIGHT[op]))
        # each output element: (C / groups) x kernel products
        return None if y is None or w is None else prod(y) * prod(w[1:])
    if op == "ConvTranspose":
        x, w = shape(node.input(0)), shape(node.input(1))
        # each input element meets (O / groups) x kernel weights
        return None if x is None or w is None else prod(x) * prod(w[1:])
    if op in _MATMUL:
        a = shape(node.input(0))
        if y is None or a is None or not a:
            return None
        return prod(y) * a[-1]
    if op == "Einsum":
        return _einsum_macs(node.attr("equation", ""), [shape(i) for i in node.inputs])
    if op in ("Attention", "QAttention"):
        past = shape(node.input(4)) if op == "Attention" else None   # QAttention's: 8
        return _attention_macs(shape(node.input(0)), shape(node.input(1)),
                               node.attr("qkv_hidden_sizes", None), past)
    if op in PROJECTED_ATTENTION:
        return _projected_attention_macs(op, y, [shape(i) for i in node.inputs],
                                         [shape(o) for o in node.outputs])
    if op in _GEMM:
        a = shape(node.input(0))
        if y is None or a is None or len(a) != 2:
            return None
        k = a[0] if node.attr("transA", 0) else a[1]
        return prod(y) * k
    # LSTM / GRU / RNN: X (seq, batch, input) or batch-first with layout=1; W (dirs, G*H, I);
    # R (dirs, G*H, H): every step multiplies the input and the state by each gate's weights
    x, w, r = shape(node.input(0)), shape(node.input(1)), shape(node.input(2))
    if x is None or w is None or r is None or len(x) != 3 or len(w) != 3 or len(r) != 3:
        return None
    steps_rows = x[0] * x[1]
    if op in _TRANSPOSED_GATES:
        return steps_rows * w[0] * w[2] * (w[1] + r[1])
    return steps_rows * w[0] * w[1] * (w[2] + r[2])


def _attention_macs(x, w, sizes, past=None) -> int | None:
    """onnxruntime's com.microsoft Attention: x (B, S, I) by its packed Q/K/V weights
    (I, Hq + Hk + Hv), then per head Q K^T (S x T x head) and the weights by V, over the
    T = P + S keys of a past state (2, B, N, P, head) and the new ones."""
    if x is None or w is None or len(x) != 3 or len(w) != 2:
        return None
    batch, steps, _ = x
    keys = steps + (past[3] if past is not None and len(past) == 5 else 0)
    hq, _, hv = sizes if sizes else (w[1] // 3,) * 3
    return batch * steps * w[0] * w[1] + batch * steps * keys * (hq + hv)


def _projected_attention_macs(op, y, ins: list, outs: list) -> int | None:
    """MultiHeadAttention / GroupQueryAttention: per query head, Q K^T (S x T x head) and
    the weights by V (S x T x head) over its T keys, 2 x (B x S x N x head) x T in all from
    its output (B, S, N x head).  T: the present keys' length (B, kv heads, T, head) where
    the node writes them, else the keys given (with a past's before them)."""
    def at(shapes, i):
        return shapes[i] if i < len(shapes) else None
    if y is None or len(y) != 3:
        return None
    present = at(outs, 1)
    if present is not None and len(present) == 4:
        keys = present[2]
    else:
        query, key, past = at(ins, 0), at(ins, 1), at(ins, 3 if op == "GroupQueryAttention"
                                                  else 6)
        if key is not None:
            keys = key[2] if len(key) == 4 else key[1]      # (B, N, L, head): cross form
        elif query is not None:
            keys = query[1]                                  # packed Q/K/V
        else:
            return None
        if past is not None and len(past) == 4 and (key is None or len(key) != 4):
            keys += past[2]
    return 2 * prod(y) * keys


def _einsum_macs(equation, shapes: list) -> int | None:
    """An Einsum's products taken pairwise from the left, as onnxruntime contracts them:
    each pair's count is the product of the sizes of every index either operand has, and
    its result keeps the indices that a later operand or the output still needs."""
    eq = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes) or any(s is None for s in shapes) or len(terms) < 2:
        return None
    size: dict[str, int] = {}
    spelled = []
    for term, dims in zip(terms, shapes):
        named = term.replace("...", "")
        # an ellipsis' axes, right-aligned as broadcasting aligns them: ..., '.1', '.0'
        hidden = len(dims) - len(named)
        letters = [f".{hidden - 1 - i}" for i in range(hidden)] if "..." in term else []
        axes = list(term[:term.index("...")] if "..." in term else "") + letters + \
            list(term[term.index("...") + 3:] if "..." in term else term)
        if len(axes) != len(dims):
            return None
        for a, n in zip(axes, dims):
            size[a] = max(size.get(a, 1), n)
        spelled.append(axes)
    wanted = set(out.replace("...", "")) | {a for a in size if a[0] == "."} if arrow else \
        {a for a in size if a[0] == "." or sum(t.count(a) for t in spelled) == 1}
    total, left = 0, spelled[0]
    for k, right in enumerate(spelled[1:], 1):
        both = set(left) | set(right)
        total += prod(size[a] for a in both)
        later = set(wanted).union(*map(set, spelled[k + 1:]))
        left = [a for a in both if a in later]
    return total


def _branch_macs(node, shapes: dict) -> int | None:
    """An If's MACs: those of its larger branch (the one it takes is known at run time
    only), counted from the shapes inference found inside; None when no branch has any."""
    import onnx
    from onnx import helper

    from tpuasm.compiler.front.graph import Node
    best = None
    for name in ("then_branch", "else_branch"):
        graph = node.attr(name)
        if not isinstance(graph, onnx.GraphProto):
            continue
        total = None
        for i, inner in enumerate(graph.node):
            attrs = {a.name: helper.get_attribute_value(a) for a in inner.attribute}
            macs = node_macs(Node(inner.name, inner.op_type, inner.domain or "",
                                  list(inner.input), list(inner.output), attrs, i, inner),
                             shapes)
            if macs is not None:
                total = (total or 0) + macs
        if total is not None:
            best = total if best is None else max(best, total)
    return best

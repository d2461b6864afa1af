"""An Einsum with one constant operand as a MatMul (float model, before quantization; see
prepare.py for the other rewrites).

torch.einsum, Keras' EinsumDense and JAX's dot_general are exported as ONNX Einsum nodes:
the product of an activation X with a constant weight W written as an equation, such as
"bld,dh->blh" (a Dense over a sequence), "abc,cde->abde" (EinsumDense's query projection
into heads) or "abcd,cde->abe" (the heads' output projection).  The matcher maps MatMul, so
each such Einsum stayed on the host ("no TPU mapping") with the layer's MACs.

Every index of the equation is one of:

- a row index, in X and the output only: the MatMul's leading dimensions;
- a contracted index, in X and W, not in the output: the MatMul's K (several are one K);
- a column index, in W and the output only: the MatMul's N (several are one N);
- an index of W alone: W summed over it at compile time;
- an index of X alone: contracted with W repeated along it (one MatMul, whose int32 sums
  take it too), or, when that weight would pass TILED_WEIGHT_LIMIT values or the axis'
  size is not known, X summed over it first (a ReduceSum, on the host: one more 8-bit
  tensor).

So Einsum(X, W) = Transpose(Reshape(MatMul(Reshape(Transpose(X)), W'))), with W' the
weight transposed and reshaped at compile time to (K, N), and every Transpose or Reshape
that would not move anything left out ("bld,dh->blh" is a MatMul alone).  X is transposed
only when its contracted indices are not its last ones, the output only when the equation
interleaves its row and column indices.

An Einsum of several activations and one weight ("bhlm,bmhk,hkd->bld": attention's mixing
and its output projection in one) is first cut in two: the activations' product, then its
product with the weight, rewritten as above.

An index in both operands and the output (per-head weights, "bhld,hdk->bhlk") makes the
weight block-diagonal: one block per value of the index, zeros elsewhere (the matcher
makes it a grouped 1x1 Conv, which skips the zero tiles; the report counts the blocks'
products), up to
BLOCK_DIAGONAL_LIMIT values.  A weight equal along such an index is a broadcast, the index
the activation's row: XLNet's positional scores "ibnd,jbnd->bnij", whose (j, b, n, d)
operand is a constant once the batch is fixed.  An index repeated in an operand (a
diagonal), or a product with no contracted or no row index stays an Einsum on the host, its
reason in the report; so does a product of two activations (attention's scores)."""
from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
from onnx import helper

from tpuasm.compiler.front.prepare import NotRewritten, _attr, _expand_nodes, _Index, _ranks
from tpuasm.compiler.front.provenance import Provenance


TILED_WEIGHT_LIMIT = 1 << 20      # values of a weight repeated along the activation's axes
# values of a block-diagonal weight (per-head weights): the matcher keeps its blocks alone,
# the model holds the whole matrix until quantization (64 MB of float32 at the limit)
BLOCK_DIAGONAL_LIMIT = 1 << 24


def rewrite_einsums(model, prov: Provenance, reasons: dict) -> int:
    """Every two-operand Einsum with one float constant operand as the MatMul the module's
    text describes (in place); the count done, and a reason for each one kept."""
    idx = _Index(model)

    def with_weight(node, operands) -> bool:
        return node.op_type == "Einsum" and node.domain in ("", "ai.onnx") and \
            operands(len(node.input)) and \
            sum(idx.const(name) is not None for name in node.input) == 1
    _expand_nodes(model, prov, reasons, "rewritten", lambda n: with_weight(n, lambda k: k > 2),
                  lambda n: _weight_last(idx, n))
    idx = _Index(model)

    def wanted(node) -> bool:
        return with_weight(node, lambda k: k == 2)
    einsums = [n for n in model.graph.node if wanted(n)]
    if not einsums:
        return 0
    ranks = _ranks(model)         # an ellipsis' rank, the sizes of the activation's own axes
    tails: list[_Tail] = []
    done = _expand_nodes(model, prov, reasons, "rewritten", wanted,
                         lambda n: _as_matmul(idx, n, ranks, tails, prov))
    for tail in tails:
        _hoist_past(model, tail)
    return done


def _weight_last(idx: _Index, node) -> list:
    """An Einsum of several activations and one weight as two: the activations' product
    (on the host: no weight), keeping the indices the weight or the output needs, then its
    product with the weight, which the two-operand rewrite takes.  "bhlm,bmhk,hkd->bld"
    (attention's mixing and output projection in one) is "bhlm,bmhk->blhk", "blhk,hkd->bld"."""
    equation = _equation(node)
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if "..." in equation or not arrow or len(terms) != len(node.input):
        raise NotRewritten("an equation of three or more operands with '...' or no '->'")
    at = next(i for i, name in enumerate(node.input) if idx.const(name) is not None)
    activations = [t for i, t in enumerate(terms) if i != at]
    mine = set("".join(activations))
    # the output's indices, then those the weight contracts: the rewrite needs no Transpose
    kept = "".join(dict.fromkeys(c for c in out + terms[at] if c in mine))
    product = idx.unique(f"{node.name}_activations")
    return [helper.make_node("Einsum", [n for i, n in enumerate(node.input) if i != at],
                             [product], name=idx.unique(f"{node.name}/activations"),
                             equation=f"{','.join(activations)}->{kept}"),
            helper.make_node("Einsum", [product, node.input[at]], list(node.output),
                             name=node.name, equation=f"{kept},{terms[at]}->{out}")]


def _equation(node) -> str:
    eq = _attr(node, "equation", b"")
    return (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")


@dataclass
class _Tail:
    """The Reshape / Transpose nodes between a rewritten Einsum's MatMul and its output,
    and the subscripts that say where each of the output's axes is in the MatMul's."""
    nodes: list
    rows: list
    columns: list
    out: str
    size: dict


def _as_matmul(idx: _Index, node, ranks: dict, tails: list, prov: Provenance) -> list:
    const_at = 0 if idx.const(node.input[0]) is not None else 1
    w = idx.const(node.input[const_at])
    x_name = node.input[1 - const_at]
    if w.dtype != np.float32:
        raise NotRewritten(f"its constant operand is {w.dtype}, not float32")
    x_rank = len(ranks[x_name]) if x_name in ranks else None
    operand_ranks = [w.ndim, x_rank] if const_at == 0 else [x_rank, w.ndim]
    terms, out = _subscripts(_equation(node), operand_ranks, const_at)
    sx, sw = terms[1 - const_at], terms[const_at]
    for s in (sx, sw, out):
        if len(set(s)) != len(s):
            raise NotRewritten(f"an index is repeated in '{s}' (a diagonal)")
    if len(sw) != w.ndim:
        raise NotRewritten(f"'{sw}' names {len(sw)} axes of a weight of rank {w.ndim}")
    if set(out) - set(sx) - set(sw):
        raise NotRewritten(f"its output index '{''.join(sorted(set(out) - set(sx + sw)))}' "
                           f"is in no operand")
    shared = [c for c in sx if c in sw and c in out]
    for c in list(shared):          # a weight equal along a shared axis is a broadcast
        first = np.take(w, [0], axis=sw.index(c))
        if np.array_equal(np.broadcast_to(first, w.shape), w):
            w, sw = np.squeeze(first, axis=sw.index(c)), sw.replace(c, "")
            shared.remove(c)
    summed = [c for c in sx if c not in sw and c not in out]     # the activation's alone
    x_dims = ranks.get(x_name)
    if summed and x_dims is not None and len(x_dims) == len(sx):
        sizes = [x_dims[sx.index(c)] for c in summed]
        if all(isinstance(n, int) and n > 0 for n in sizes) and \
                w.size * int(np.prod(sizes)) <= TILED_WEIGHT_LIMIT:
            # contracted with the weight repeated along them: one MatMul whose int32 sums
            # take them too, where a ReduceSum first is another 8-bit tensor on the host
            w = np.ascontiguousarray(np.broadcast_to(w, (*sizes, *w.shape)))
            sw, summed = "".join(summed) + sw, []
    rows = [c for c in sx if c in out and c not in shared]
    contracted = [c for c in sx if c in sw and c not in shared]
    if not rows or not contracted:
        raise NotRewritten("it has no " + ("row" if not rows else "contracted") + " index")
    alone = [c for c in sw if c not in sx and c not in out]
    if alone:                             # summed over W alone: done now, once
        w = w.sum(axis=tuple(sw.index(c) for c in alone), dtype=np.float64).astype(np.float32)
        sw = "".join(c for c in sw if c not in alone)
    columns = [c for c in out if c in sw and c not in shared]    # N in the output's order
    size = dict(zip(sw, w.shape))
    k = int(np.prod([size[c] for c in contracted]))
    weight = w.transpose([sw.index(c) for c in shared + contracted + columns])
    if shared:
        blocks = int(np.prod([size[c] for c in shared]))
        weight = _block_diagonal(weight.reshape(blocks, k, -1))
        k = weight.shape[0]
        prov.own_work[node.name] = (1, blocks)     # the report's MACs: the blocks' alone
    weight = weight.reshape(k, -1)
    contracted, columns = shared + contracted, shared + columns

    made, value = [], x_name

    def step(op: str, *inputs, output=None, **attrs) -> None:
        nonlocal value
        name = node.name if op == "MatMul" else idx.unique(f"{node.name}/{op.lower()}")
        value = output or idx.unique(f"{node.name}_{op.lower()}")
        made.append(helper.make_node(op, list(inputs), [value], name=name, **attrs))

    if summed:              # sum(x W) over an index of x alone is (sum x) W: summed first
        axes = [sx.index(c) for c in summed]
        if idx.opset >= 13:
            step("ReduceSum", value, idx.add_init(np.asarray(axes, np.int64),
                                                  f"{node.name}_axes"), keepdims=0)
        else:
            step("ReduceSum", value, axes=axes, keepdims=0)
        sx = "".join(c for c in sx if c not in summed)

    order = rows + contracted
    if order != list(sx):
        step("Transpose", value, perm=[sx.index(c) for c in order])
    if len(contracted) > 1:
        step("Reshape", value, _shape(idx, node, [0] * len(rows) + [k]))
    product = [*rows, *columns]
    tail = []                                   # what follows the MatMul, before the output
    if len(columns) != 1:
        tail.append(("Reshape", _shape(idx, node, [0] * len(rows) +
                                       [size[c] for c in columns])))
    if product != list(out):
        tail.append(("Transpose", [product.index(c) for c in out]))
    step("MatMul", value, idx.add_init(weight, f"{node.name}_W"),
         output=None if tail else node.output[0])
    for i, (op, arg) in enumerate(tail):
        last = node.output[0] if i == len(tail) - 1 else None
        if op == "Reshape":
            step("Reshape", value, arg, output=last)
        else:
            step("Transpose", value, output=last, perm=arg)
    if tail:
        tails.append(_Tail(made[-len(tail):], rows, columns, out, size))
    return made


def hoist_past_head_splits(model) -> int:
    """The bias Add, scaling Mul and activation after a MatMul / Gemm (constant weight)
    whose output a Reshape splits into heads, (..., N) -> (..., d, e) with d * e = N,
    moved before the Reshape, as for a rewritten Einsum: tf2onnx writes Keras' EinsumDense
    ("abc,cde->abde", bias_axes="de") as MatMul, Reshape, Add, Relu, whose Add and Relu
    ran on the host between two segments.  The count of Reshapes that got any."""
    ranks = None
    moved = 0
    idx = _Index(model)
    for node in list(model.graph.node):
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        reshape = idx.sole_consumer(node.output[0])
        if idx.const(node.input[1]) is None or reshape is None or \
                reshape.op_type != "Reshape":
            continue
        # one shape inference: a hoist renames only tensors of its own chain
        ranks = _ranks(model) if ranks is None else ranks
        tail = _head_split(ranks.get(node.output[0]), ranks.get(reshape.output[0]), reshape)
        if tail is not None and _hoist_past(model, tail):
            moved += 1
            idx = _Index(model)
    return moved


def _head_split(dims, out_dims, reshape) -> _Tail | None:
    """The Reshape as a _Tail when it keeps the leading axes and splits the last one."""
    if not dims or not out_dims or len(out_dims) <= len(dims):
        return None
    lead, n = len(dims) - 1, dims[-1]
    split = out_dims[lead:]
    if not isinstance(n, int) or any(not isinstance(d, int) for d in split) or \
            int(np.prod(split)) != n or any(
                a is not None and b is not None and a != b
                for a, b in zip(dims[:lead], out_dims[:lead])):
        return None
    letters = string.ascii_letters[:len(out_dims)]
    rows, columns = list(letters[:lead]), list(letters[lead:])
    return _Tail([reshape], rows, columns, letters, dict(zip(columns, split)))


# element-wise operators of one tensor: f(Reshape(x)) = Reshape(f(x)), and so for Transpose
_UNARY = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu",
          "Softplus", "Softsign", "Clip"}


def _hoist_past(model, tail: _Tail) -> int:
    """The bias Add (a constant over the column axes), scaling Mul and activation that
    follow a rewritten Einsum moved before its output's Reshape / Transpose, so that the
    MatMul meets them as it meets a Dense's (the bias fused, the Relu's range the output's
    quantization): EinsumDense("abc,cde->abde", bias_axes="de", activation="relu").
    Returns how many nodes moved."""
    moved = 0
    while True:
        idx = _Index(model)
        nodes = list(model.graph.node)          # the graph's own messages, not the copies made
        layout = [next(n for n in nodes if n.name == t.name) for t in tail.nodes]
        end = layout[-1].output[0]
        op = idx.sole_consumer(end)
        if op is None or op.domain not in ("", "ai.onnx"):
            return moved
        if op.op_type in ("Add", "Mul", "Sub") and len(op.input) == 2:
            at = list(op.input).index(end)
            c = idx.const(op.input[1 - at])
            flat = _over_columns(c, tail) if c is not None and (
                op.op_type != "Sub" or at == 0) else None
            if flat is None:
                return moved
            op.input[1 - at] = idx.add_init(flat, f"{op.name}_columns")
        elif op.op_type not in _UNARY or op.input[0] != end:
            return moved
        op.input[list(op.input).index(end)] = layout[0].input[0]
        before = idx.unique(f"{op.output[0]}_before_layout")
        layout[0].input[0] = before
        layout[-1].output[0], op.output[0] = op.output[0], before
        nodes.remove(op)
        nodes.insert(nodes.index(layout[0]), op)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        moved += 1


def _over_columns(c: np.ndarray, tail: _Tail) -> np.ndarray | None:
    """A constant broadcast against the Einsum's output, as one over the MatMul's N (its
    column axes flattened), or None when it varies along a row axis or has more axes."""
    if c.dtype != np.float32 or c.ndim > len(tail.out):
        return None
    padded = c.reshape((1,) * (len(tail.out) - c.ndim) + c.shape)
    for letter, n in zip(tail.out, padded.shape):
        if n != 1 and (letter in tail.rows or n != tail.size[letter]):
            return None
    kept = [n for letter, n in zip(tail.out, padded.shape) if letter in tail.columns]
    full = np.broadcast_to(padded.reshape(kept), [tail.size[c] for c in tail.columns])
    return np.ascontiguousarray(full).reshape(-1)


def _block_diagonal(per_block: np.ndarray) -> np.ndarray:
    """(blocks, K, N) weights, one per value of an index both operands and the output have
    (a head's), as one (blocks * K, blocks * N) matrix: block p maps block p of the input's
    columns to block p of the output's, zeros elsewhere (the matcher finds the blocks:
    match.block_diagonal_groups), refused past BLOCK_DIAGONAL_LIMIT values."""
    blocks, k, n = per_block.shape
    if blocks * blocks * k * n > BLOCK_DIAGONAL_LIMIT:
        raise NotRewritten(f"an index is in both operands and the output (a weight per "
                           f"batch row), and its block-diagonal weight would hold "
                           f"{blocks * blocks * k * n:,} values")
    out = np.zeros((blocks, k, blocks, n), per_block.dtype)
    for p in range(blocks):
        out[p, :, p, :] = per_block[p]
    return out.reshape(blocks * k, blocks * n)


def _shape(idx: _Index, node, dims: list) -> str:
    return idx.add_init(np.asarray(dims, np.int64), f"{node.name}_shape")


def _subscripts(equation: str, operand_ranks: list, const_at: int) -> tuple[list, str]:
    """The equation's operand and output subscripts, one letter per axis: an ellipsis
    spelled out in letters the equation does not use (the activation's rank from shape
    inference), an implicit output (no '->') as ONNX gives it: the ellipsis' axes, then the
    indices that appear once, in alphabetical order."""
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        raise NotRewritten(f"equation '{equation}' has {len(terms)} operands")
    spare = iter(c for c in string.ascii_letters if c not in equation)
    broadcast = ""
    for i, term in enumerate(terms):
        if "..." not in term:
            continue
        if operand_ranks[i] is None:
            raise NotRewritten("the rank of its '...' operand is unknown")
        dims = operand_ranks[i] - len(term.replace("...", ""))
        if i == const_at and dims:
            raise NotRewritten("its weight has '...' axes")
        if dims < 0:
            raise NotRewritten(f"'{term}' names more axes than its operand has")
        broadcast = broadcast or "".join(next(spare) for _ in range(dims))
        terms[i] = term.replace("...", broadcast[:dims] if i != const_at else "")
    if not arrow:
        once = sorted(c for c in set("".join(terms)) if "".join(terms).count(c) == 1
                      and c not in broadcast)
        out = broadcast + "".join(once)
    else:
        out = out.replace("...", broadcast)
    if not all(c.isalpha() for c in "".join(terms) + out):
        raise NotRewritten(f"equation '{equation}' is not letters and '...'")
    return terms, out

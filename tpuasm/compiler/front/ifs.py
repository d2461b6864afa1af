"""An If whose condition is known when compiling, replaced by the branch it takes.

Exporters wrap a model in If nodes on values that are fixed once its shapes are: PyTorch's
LSTM export tests `Shape(x)[0] == 1`, a model for two sample rates tests an input
`sr == 16000` (fixed with --input-value).  Left as an If, everything inside it runs on the
host (the matcher sees one opaque node).  Once constant folding has made the condition an
initializer, the taken branch's nodes are moved into the graph in the If's place:

- the branch's initializers become the graph's (renamed if the name is taken);
- each If output becomes the branch output's value: the producing branch node writes the
  If's output name directly, an Identity where the branch returns an outer tensor or one
  tensor twice;
- the moved nodes get unique names and are recorded as derived from the If (Provenance).

Nested Ifs come out one level per call (fold.py calls this between its folding rounds, so the
inner conditions have become constants by then)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

INLINE_MAX_DEPTH = 16            # rounds of nested Ifs fold_constants takes at most


def inline_constant_ifs(model: onnx.ModelProto, constant_of, provenance=None) -> int:
    """Replace, in place, each top-level If whose condition `constant_of(name)` knows (a
    numpy value or None) by its taken branch; the number of Ifs inlined."""
    g = model.graph
    taken_names = _all_names(g)
    new_nodes, count = [], 0
    for node in g.node:
        if node.op_type != "If" or (node.domain or "") not in ("", "ai.onnx"):
            new_nodes.append(node)
            continue
        cond = constant_of(node.input[0])
        if cond is None or np.asarray(cond).size != 1:
            new_nodes.append(node)
            continue
        which = "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch"
        branch = next(a.g for a in node.attribute if a.name == which)
        if len(branch.output) != len([o for o in node.output]):
            new_nodes.append(node)              # malformed: onnxruntime will say so
            continue
        made = _inline(g, node, branch, taken_names)
        for n in made:
            if provenance is not None:
                provenance.derive(n.name, node.name)
        new_nodes.extend(made)
        count += 1
        if provenance is not None and not made:
            provenance.fold(node.name, f"an If on a constant condition: its {which} "
                                       f"passes its inputs through")
    if count:
        del g.node[:]
        g.node.extend(new_nodes)
        del g.value_info[:]                     # re-inferred from the new nodes
    return count


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer} | {v.name for v in graph.input}
    for node in graph.node:
        names.add(node.name)
        names.update(o for o in node.output if o)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []) + list(a.graphs):
                names |= _all_names(sub)
    return names


def _unique(name: str, taken: set[str]) -> str:
    base, i = name, 1
    while name in taken:
        name = f"{base}_{i}"
        i += 1
    taken.add(name)
    return name


def _inline(g: onnx.GraphProto, if_node, branch: onnx.GraphProto, taken: set[str]) -> list:
    """The branch's nodes, renamed to write the If's outputs; its initializers added to `g`."""
    rename: dict[str, str] = {}
    outer_inits = {t.name for t in g.initializer}
    for t in branch.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(t)
        if t.name in outer_inits:
            copy.name = _unique(t.name, taken)
            rename[t.name] = copy.name
        g.initializer.append(copy)
        outer_inits.add(copy.name)
    producers = {o: n for n in branch.node for o in n.output if o}
    claimed: set[str] = set()
    out_of: dict[str, str] = {}            # branch output -> If output it can write directly
    extra = []
    for inner, outer in zip((v.name for v in branch.output), if_node.output):
        if not outer:
            continue
        if inner in producers and inner not in claimed:
            claimed.add(inner)
            out_of[inner] = outer
        else:                              # an outer tensor, or one tensor returned twice
            extra.append((inner, outer))
    nodes = []
    for inner in branch.node:
        node = onnx.NodeProto()
        node.CopyFrom(inner)
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
        for i, name in enumerate(node.output):
            if name in out_of:
                rename[name] = out_of[name]
                node.output[i] = out_of[name]
        _rename_inside(node, rename)
        node.name = _unique(node.name or f"{if_node.name}/{node.op_type}", taken)
        nodes.append(node)
    for inner, outer in extra:
        nodes.append(helper.make_node("Identity", [rename.get(inner, inner)], [outer],
                                      name=_unique(f"{if_node.name}/{outer}", taken)))
    return nodes


def _rename_inside(node: onnx.NodeProto, rename: dict[str, str]) -> None:
    """Outer-scope reads of a nested subgraph follow the renamed tensors."""
    if not rename:
        return
    for a in node.attribute:
        for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []) + list(a.graphs):
            for inner in sub.node:
                for i, name in enumerate(inner.input):
                    inner.input[i] = rename.get(name, name)
                _rename_inside(inner, rename)
            for v in sub.output:
                if v.name in rename and v.name not in {o for n in sub.node for o in n.output}:
                    v.name = rename[v.name]

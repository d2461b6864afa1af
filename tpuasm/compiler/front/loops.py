"""A Loop whose trip count is known when compiling, unrolled into the graph.

tf2onnx writes a Keras GRU (reset_after, Keras' default) as a Loop: its trip count M from the
sequence's shape, a step counter, the time, the state h and the cell's weights carried from
step to step, and every step's h as a scan output.  Left as a Loop, the whole recurrence runs
on the host, its gate MatMuls with it (0 % of a bidirectional GRU classifier's MACs on the
TPU).  Once folding has made M an initializer, and the loop's conditions (the initial one and
every step's) are true on constants alone (evaluated here by onnxruntime), the body is copied
M times in the Loop's place:

- copy i reads its iteration number as a constant, and the loop-carried values of copy i-1
  (the Loop's initial values for the first);
- each copy's tensors and node names get the prefix `<loop>/i<i>/`; the body's initializers
  are added once;
- the Loop's outputs are the last copy's loop-carried values (an Identity each) and, for
  each scan output, the Concat of every copy's value Unsqueezed on axis 0.

A body holding a subgraph of its own (an If inside), a trip count above MAX_TRIPS, more nodes
than MAX_UNROLLED_NODES once unrolled, or a condition that depends on the data keeps the
Loop (on the host).  fold.py calls this between its folding rounds, as it inlines Ifs."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tpuasm.compiler.front.ifs import _all_names, _unique

MAX_TRIPS = 512
MAX_UNROLLED_NODES = 50_000


def unroll_constant_loops(model: onnx.ModelProto, constant_of, provenance=None) -> int:
    """Unroll, in place, each top-level Loop that can be (see the module); `constant_of(name)`:
    a tensor's value when folding knows it, else None.  The number of Loops unrolled."""
    g = model.graph
    if not any(n.op_type == "Loop" for n in g.node):
        return 0
    taken = _all_names(g)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    new_nodes, count = [], 0
    for node in g.node:
        made = _unrolled(model, node, constant_of, taken, opset) \
            if node.op_type == "Loop" and (node.domain or "") in ("", "ai.onnx") else None
        if made is None:
            new_nodes.append(node)
            continue
        nodes, inits = made
        g.initializer.extend(inits)
        for n in nodes:
            if provenance is not None:
                provenance.derive(n.name, node.name)
        new_nodes.extend(nodes)
        count += 1
    if count:
        del g.node[:]
        g.node.extend(new_nodes)
        del g.value_info[:]                     # re-inferred from the new nodes
    return count


def _trips(loop, constant_of) -> int | None:
    if not loop.input or not loop.input[0]:
        return None                             # no trip count: the condition decides
    value = constant_of(loop.input[0])
    if value is None or np.asarray(value).size != 1:
        return None
    trips = int(np.asarray(value).reshape(-1)[0])
    return trips if 0 < trips <= MAX_TRIPS else None


def _unrolled(model, loop, constant_of, taken: set[str], opset: int):
    """(nodes, initializers) replacing `loop`, or None when it stays."""
    trips = _trips(loop, constant_of)
    body = next((a.g for a in loop.attribute if a.name == "body"), None)
    if trips is None or body is None or len(body.input) != len(loop.input) or \
            trips * len(body.node) > MAX_UNROLLED_NODES:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in body.node for a in n.attribute):
        return None
    carried = len(loop.input) - 2
    scans = len(body.output) - 1 - carried
    if scans < 0 or len(loop.output) != carried + scans:
        return None
    inits, shared = [], {}
    for t in body.initializer:                  # constants of every copy: added once
        copy = onnx.TensorProto()
        copy.CopyFrom(t)
        copy.name = _unique(f"{loop.name}/{t.name}", taken)
        shared[t.name] = copy.name
        inits.append(copy)
    nodes, conditions, steps = [], [], [[] for _ in range(scans)]
    values = list(loop.input[2:])               # the loop-carried values before copy i
    condition = loop.input[1]
    for i in range(trips):
        if condition:
            conditions.append(condition)
        counter = _unique(f"{loop.name}/i{i}/iteration", taken)
        inits.append(numpy_helper.from_array(np.asarray(i, np.int64), counter))
        local = dict(shared)
        local[body.input[0].name] = counter
        local[body.input[1].name] = condition or _true(inits, taken, loop.name)
        for inner, value in zip(body.input[2:], values):
            local[inner.name] = value
        for inner in body.node:
            node = onnx.NodeProto()
            node.CopyFrom(inner)
            for k, name in enumerate(node.input):
                node.input[k] = local.get(name, name)
            for k, name in enumerate(node.output):
                if name:
                    local[name] = node.output[k] = _unique(f"{loop.name}/i{i}/{_last(name)}",
                                                           taken)
            node.name = _unique(f"{loop.name}/i{i}/{_last(inner.name or inner.op_type)}", taken)
            nodes.append(node)
        outs = [local.get(o.name, o.name) for o in body.output]
        condition = outs[0]
        values = outs[1:1 + carried]
        for k, value in enumerate(outs[1 + carried:]):
            steps[k].append(value)
    if not _always_true(model, nodes, inits, conditions):
        return None
    for value, out in zip(values, loop.output[:carried]):
        if out:
            nodes.append(helper.make_node("Identity", [value], [out],
                                          name=_unique(f"{loop.name}/{out}", taken)))
    for per_step, out in zip(steps, loop.output[carried:]):
        if not out:
            continue
        stacked = [_unsqueezed(v, nodes, inits, taken, opset, loop.name) for v in per_step]
        nodes.append(helper.make_node("Concat", stacked, [out], axis=0,
                                      name=_unique(f"{loop.name}/{out}", taken)))
    return nodes, inits


def _last(name: str) -> str:
    """A body name without the scope the exporter repeats in it (tf2onnx names a Keras
    GRU's body nodes '<model>/<layer>/while/gru_cell/MatMul' inside '<model>/<layer>/
    while_loop'): the copies are named <loop>/i<i>/MatMul, made unique if taken."""
    return name.rsplit("/", 1)[-1]


def _true(inits: list, taken: set[str], prefix: str) -> str:
    name = _unique(f"{prefix}/true", taken)
    inits.append(numpy_helper.from_array(np.asarray(True), name))
    return name


def _unsqueezed(value: str, nodes: list, inits: list, taken: set[str], opset: int,
                prefix: str) -> str:
    out = _unique(f"{value}/step", taken)
    name = _unique(f"{prefix}/unsqueeze", taken)
    if opset >= 13:
        axes = _unique(f"{prefix}/axis0", taken)
        inits.append(numpy_helper.from_array(np.asarray([0], np.int64), axes))
        nodes.append(helper.make_node("Unsqueeze", [value, axes], [out], name=name))
    else:
        nodes.append(helper.make_node("Unsqueeze", [value], [out], name=name, axes=[0]))
    return out


def _always_true(model, nodes: list, inits: list, conditions: list[str]) -> bool:
    """Whether every one of `conditions` (the initial condition and those the copies before
    the last compute) is true, computed by onnxruntime from the model's initializers alone:
    a condition that depends on an input (a while loop on the data) keeps the Loop."""
    known = {t.name: t for t in [*model.graph.initializer, *inits]}
    direct = [c for c in conditions if c in known]
    if not all(_true_value(numpy_helper.to_array(known[c])) for c in direct):
        return False
    conditions = [c for c in conditions if c not in known]
    if not conditions:
        return True
    from tpuasm.compiler.ort import session
    producer = {o: n for n in [*model.graph.node, *nodes] for o in n.output if o}
    needed, todo, used = [], list(conditions), set()
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in known:
            used.add(name)
            continue
        node = producer.get(name)
        if node is None or any(a.type in (onnx.AttributeProto.GRAPH,
                                          onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return False                         # an input, or a value from a subgraph
        needed.append(node)
        todo.extend(node.input)
    order = {id(n): k for k, n in enumerate([*model.graph.node, *nodes])}
    needed = sorted({id(n): n for n in needed}.values(), key=lambda n: order[id(n)])
    graph = helper.make_graph(needed, "conditions", [],
                              [helper.make_empty_tensor_value_info(c)
                               for c in dict.fromkeys(conditions)],
                              [known[n] for n in used])
    probe = helper.make_model(graph, opset_imports=list(model.opset_import))
    probe.ir_version = model.ir_version
    try:
        values = session(probe).run(None, {})
    except Exception:                            # noqa: BLE001 - unknown: the Loop stays
        return False
    return all(_true_value(v) for v in values)


def _true_value(value) -> bool:
    return np.asarray(value).size == 1 and bool(np.asarray(value).reshape(-1)[0])

"""Partition: which nodes the host must run, and the order of TPU segments and host parts.

The TPU operators come from match.py.  The host runs exactly the nodes needed to produce the
model's outputs and the TPU operators' inputs from what is available (model inputs and TPU
outputs): a backward walk from those tensors.  Then the TPU operators and host nodes are
scheduled greedily, alternating phases: as many TPU operators as are ready (one segment, or
one per row count: Segment.rows), then as many host nodes as are ready (one host part), and
so on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tpuasm.compiler.front.graph import Graph, Node
from tpuasm.compiler.ir import Elementwise, Operator, Segment
from tpuasm.compiler.front.match import Lowered


@dataclass
class HostPart:
    name: str
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]


@dataclass
class Plan:
    steps: list                                   # Segment | HostPart, in execution order
    host_nodes: set[str] = field(default_factory=set)
    unused: set[str] = field(default_factory=set)


def lone_elementwise(lowered: Lowered) -> dict[str, str]:
    """Elementwise operators (VADD / VMUL) that neither read a TPU operator's output nor
    feed one: alone they are a segment of their own, a host round trip that costs more
    than the host's own Add.  {operator name: why}, for the pipeline to put on the host."""
    made = {op.output.name for op in lowered.operators}
    read = {t.name for op in lowered.operators for t in op.inputs}
    return {op.name: ("element-wise operator between host nodes: on the TPU alone it would "
                      "cost a host round trip (its operands come from the host and only the "
                      "host reads it)")
            for op in lowered.operators if isinstance(op, Elementwise)
            and not any(t.name in made for t in op.inputs) and op.output.name not in read}


def host_closure(graph: Graph, lowered: Lowered) -> set[str]:
    """Names of the nodes the host must run."""
    available = set(graph.inputs) | set(graph.initializers)
    available |= {op.output.name for op in lowered.operators}
    needed = list(graph.outputs) + [t.name for op in lowered.operators for t in op.inputs]
    host: set[str] = set()
    seen: set[str] = set()
    while needed:
        tensor = needed.pop()
        if tensor in seen or tensor in available or not tensor:
            continue
        seen.add(tensor)
        node = graph.producer.get(tensor)
        if node is None or node.name in host:
            continue
        host.add(node.name)
        needed.extend(node.inputs)
    return host


def plan(graph: Graph, lowered: Lowered, cuts=frozenset()) -> Plan:
    """The steps; an operator named in `cuts` starts a new segment (the back end found the
    segment it was in too large for the machine as a whole)."""
    host_names = host_closure(graph, lowered)
    ops = lowered.operators
    produced_by_op = {op.output.name: op for op in ops}
    host_nodes = [n for n in graph.nodes if n.name in host_names]
    constant = constant_nodes(graph, host_nodes)
    produced_by_host = {o: n for n in host_nodes for o in n.outputs
                        if o and n.name not in constant}

    def deps_of_op(op: Operator):
        deps = set()
        for t in op.inputs:               # one tensor, or two (an Elementwise)
            if t.name in produced_by_op:
                deps.add(("op", produced_by_op[t.name].name))
            elif t.name in produced_by_host:
                deps.add(("host", produced_by_host[t.name].name))
        return deps

    def deps_of_node(node: Node):
        deps = set()
        for t in node.inputs:
            if t in produced_by_op:
                deps.add(("op", produced_by_op[t].name))
            elif t in produced_by_host:
                deps.add(("host", produced_by_host[t].name))
        return deps

    pending_ops = {op.name: op for op in ops}
    pending_host = {n.name: n for n in host_nodes if n.name not in constant}
    done: set = set()
    steps: list = []
    while pending_ops or pending_host:
        phase_ops = _take_ready(pending_ops, deps_of_op, "op", done)
        steps.extend(_runs(phase_ops, cuts, lambda op: graph.segment_rows(op.output.name)))
        phase_nodes = _take_ready(pending_host, deps_of_node, "host", done)
        if phase_nodes:
            steps.append(_with_constants(graph, phase_nodes, constant))
        if not phase_ops and not phase_nodes:
            raise RuntimeError("partition: no progress (cyclic dependencies)")
    # consumers of each tensor across steps, to find each step's outputs
    consumed_at: dict[str, set[int]] = {}
    for i, group in enumerate(steps):
        for item in group:
            reads = [t.name for t in item.inputs] if not isinstance(item, Node) else item.inputs
            for t in reads:
                consumed_at.setdefault(t, set()).add(i)
    final = set(graph.outputs)
    result = []
    seg_count = host_count = 0
    for i, group in enumerate(steps):
        later = lambda t: any(j > i for j in consumed_at.get(t, ())) or t in final  # noqa
        if isinstance(group[0], Node):
            made = {o for n in group for o in n.outputs if o}
            inputs = sorted({t for n in group for t in n.inputs
                             if t and t not in made and t not in graph.initializers
                             and not _constant_made_inside(graph, t, group)},
                            key=_order(graph))
            outputs = [o for n in group for o in n.outputs if o and later(o)]
            result.append(HostPart(f"host{host_count}", group, inputs, outputs))
            host_count += 1
        else:
            made = {op.output.name for op in group}
            seg_inputs, seg_outputs = [], []
            for op in group:
                for t in op.inputs:
                    if t.name not in made and t not in seg_inputs:
                        seg_inputs.append(t)
                if later(op.output.name):
                    seg_outputs.append(op.output)
            result.append(Segment(f"segment{seg_count}", group, seg_inputs, seg_outputs,
                                  graph.segment_rows(group[0].output.name)))
            seg_count += 1
    involved = host_names | set(lowered.fused)
    unused = {n.name for n in graph.nodes if n.name not in involved}
    return Plan(result, host_names, unused)


def _runs(ops: list, cuts, rows_of=lambda op: None) -> list[list]:
    """`ops` (in program order) cut before each operator named in `cuts`, and wherever the
    row count changes (`rows_of`, Graph.segment_rows: a program takes one).  An operator of
    one row count may read another's output through glue it fuses (an unrolled LSTM's state
    Squeeze), so runs keep program order rather than gathering each row count in one."""
    runs: list[list] = []
    for op in ops:
        if not runs or op.name in cuts or rows_of(op) != rows_of(runs[-1][-1]):
            runs.append([])
        runs[-1].append(op)
    return runs


def _take_ready(pending: dict, deps_of, kind: str, done: set) -> list:
    """Remove and return every pending item whose dependencies are done, repeatedly (an
    item made ready by one taken in this phase joins the phase), in pending's order."""
    taken = []
    progress = True
    while progress:
        progress = False
        for name, item in list(pending.items()):
            if deps_of(item) <= done:
                taken.append(item)
                done.add((kind, name))
                del pending[name]
                progress = True
    return taken


def _constant_made_inside(graph: Graph, tensor: str, group) -> bool:
    node = graph.producer.get(tensor)
    return node is not None and node in group


def constant_nodes(graph: Graph, nodes: list[Node]) -> set[str]:
    """Host nodes that compute from constants only (DequantizeLinear of a weight, Constant,
    shape arithmetic): they go into every host part that reads them, not a part of their own."""
    const_tensors = set(graph.initializers)
    names = set()
    for node in sorted(nodes, key=lambda n: n.index):
        if all(not t or t in const_tensors for t in node.inputs):
            names.add(node.name)
            const_tensors.update(o for o in node.outputs if o)
    return names


def _with_constants(graph: Graph, group: list[Node], constant: set[str]) -> list[Node]:
    chosen = {n.name: n for n in group}
    todo = list(group)
    while todo:
        node = todo.pop()
        for t in node.inputs:
            producer = graph.producer.get(t)
            if producer is not None and producer.name in constant and \
                    producer.name not in chosen:
                chosen[producer.name] = producer
                todo.append(producer)
    return sorted(chosen.values(), key=lambda n: n.index)


def _order(graph: Graph):
    position = {name: i for i, name in enumerate(graph.inputs)}
    return lambda t: (position.get(t, len(position)), t)

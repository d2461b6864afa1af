"""Output types and shapes of nodes that onnx shape inference does not know (contrib operators
of com.microsoft, a vendor's domain), read off onnxruntime: the node alone, as a one-node
model, run on zeros of its input shapes (its constant inputs with their real values).

onnx stops propagating at such a node, so the caller alternates: onnx inference, then this
for the nodes whose inputs are all known, until nothing new is learned."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

_MAX_ELEMENTS = 1 << 22        # zero inputs of at most this many elements (16 MB of float32)
# contrib operators of one input whose output has the input's type and shape (element-wise):
# known without running them (a GELU over a big activation exceeds _MAX_ELEMENTS)
_SAME_AS_INPUT = {"FastGelu", "Gelu", "QuickGelu"}


def stand_in(node: onnx.NodeProto, elem_types: dict[str, int]) -> onnx.NodeProto | None:
    """An ONNX node whose outputs onnx infers as `node`'s (same name, shape and element
    type), for a contrib operator that keeps its input's shape: com.microsoft's Quantize /
    DequantizeLinear (an int16 quantization at any opset) read as a Cast to the zero point's
    / the scale's type, a GELU as an Identity.  Inference then runs through them in one
    pass: run alone round by round, the Q/DQ pairs on an unrolled LSTM's state, one per
    step, cost a whole-graph inference each (a 100-step LSTM: minutes).  `elem_types`: the
    initializers' element types; None where the type is not known from them."""
    if node.domain != "com.microsoft" or len(node.output) != 1 or not node.input:
        return None
    op, inputs = node.op_type, [i for i in node.input]
    if op in _SAME_AS_INPUT and len(inputs) == 1:
        return helper.make_node("Identity", inputs, list(node.output), name=node.name)
    if op == "QuantizeLinear" and len(inputs) >= 2:
        to = elem_types.get(inputs[2]) if len(inputs) > 2 and inputs[2] else \
            onnx.TensorProto.UINT8
    elif op == "DequantizeLinear" and len(inputs) >= 2:
        to = elem_types.get(inputs[1])
    else:
        return None
    if to is None:
        return None
    return helper.make_node("Cast", inputs[:1], list(node.output), to=to, name=node.name)


def _elem(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def unknown_nodes(model: onnx.ModelProto, shapes: dict, dtypes: dict) -> list:
    """Nodes whose inputs all have known types and shapes, with an output of unknown type,
    or, outside the ONNX domain, of unknown shape: onnx has schemas for scikit-learn's
    ai.onnx.ml operators but infers no shape for most (a StandardScaler's Scaler left every
    MatMul after it with no shape, and on the host).  An ONNX operator whose shape onnx
    cannot infer depends on its data (NonZero): zeros would give a wrong one."""
    out = []
    for node in model.graph.node:
        foreign = node.domain not in ("", "ai.onnx")
        if all(not o or (o in dtypes and (o in shapes or not foreign)) for o in node.output):
            continue
        if all(not i or (i in dtypes and i in shapes) for i in node.input):
            out.append(node)
    return out


def run_alone(node: onnx.NodeProto, model: onnx.ModelProto, base_dir: Path, shapes: dict,
              dtypes: dict) -> dict[str, tuple[tuple, np.dtype]]:
    """{output: (shape, dtype)} of `node` run by onnxruntime on zeros; {} when it cannot."""
    from tpuasm.compiler.front.graph import tensor_array
    from tpuasm.compiler.ort import session
    if node.domain == "com.microsoft" and node.op_type in _SAME_AS_INPUT and \
            len(node.input) == 1 and len(node.output) == 1:
        return {node.output[0]: (tuple(shapes[node.input[0]]), np.dtype(dtypes[node.input[0]]))}
    inits = {t.name: t for t in model.graph.initializer}
    feeds, inputs, consts = {}, [], []
    for name in dict.fromkeys(i for i in node.input if i):
        if name in inits:
            consts.append(numpy_helper.from_array(np.asarray(tensor_array(inits[name],
                                                                          base_dir)), name))
            continue
        shape = shapes[name]
        if int(np.prod(shape, dtype=np.int64)) > _MAX_ELEMENTS:
            return {}
        feeds[name] = np.zeros(shape, dtypes[name])
        inputs.append(helper.make_tensor_value_info(name, _elem(dtypes[name]), list(shape)))
    outputs = [o for o in node.output if o]
    graph = helper.make_graph([node], "one_node", inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs], consts)
    one = helper.make_model(graph, opset_imports=list(model.opset_import))
    one.ir_version = model.ir_version
    try:
        results = session(one).run(outputs, feeds)
    except Exception:            # onnxruntime does not know it either: left unknown
        return {}
    found = {}
    for name, value in zip(outputs, results):
        if isinstance(value, np.ndarray):
            found[name] = (tuple(value.shape), value.dtype)
    return found


def value_infos(found: dict) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(n, _elem(d), list(s)) for n, (s, d) in found.items()]


_PROBE = 2                      # a dynamic dimension's size when a node is run to learn types


def declare_foreign_outputs(model: onnx.ModelProto, base_dir: Path) -> int:
    """Declare, in the float model's value infos, the outputs of its nodes outside the ONNX
    domain that onnx infers nothing for (ai.onnx.ml's Scaler, which skl2onnx writes for a
    StandardScaler), read off onnxruntime (run_alone, a dynamic dimension at _PROBE): an
    output of its first input's shape gets that shape, dynamic dimensions and all; another
    its exact shape when the input's is static, else its type and rank.  The rewrites before
    quantization read onnx inference alone: without this, nothing after such a node had a
    type or a shape (a PCA's MatMul after a Scaler left the LinearClassifier after it, and
    an MLP's bias Adds, on the host).  Returns how many outputs it declared."""
    from tpuasm.compiler.front.prepare import inferred_values
    if all(node.domain in ("", "ai.onnx") for node in model.graph.node):
        return 0                        # nothing to declare: no shape inference pass
    inits = {t.name: t for t in model.graph.initializer}
    tried: set[str] = set()
    declared = 0
    while True:
        values = inferred_values(model)
        learned = []
        for node in model.graph.node:
            if node.domain in ("", "ai.onnx") or node.name in tried or \
                    all(not o or _typed(values.get(o)) for o in node.output):
                continue
            inputs = [i for i in node.input if i]
            if not all(_typed(values.get(i)) or i in inits for i in inputs):
                continue
            tried.add(node.name)
            learned += _declared_outputs(node, model, base_dir, values, inits)
        if not learned:
            return declared
        model.graph.value_info.extend(learned)
        declared += len(learned)


def _typed(v) -> bool:
    return v is not None and bool(v.type.tensor_type.elem_type)


def _dims(v) -> list:
    t = v.type.tensor_type
    return [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] \
        if t.HasField("shape") else None


def _declared_outputs(node, model: onnx.ModelProto, base_dir: Path, values: dict,
                      inits: dict) -> list:
    shapes, dtypes = {}, {}
    for name in (i for i in node.input if i):
        init = inits.get(name)
        if init is not None:
            shapes[name] = tuple(init.dims)
            dtypes[name] = helper.tensor_dtype_to_np_dtype(init.data_type)
            continue
        dims = _dims(values[name])
        if dims is None:                    # no rank: nothing to run it on
            return []
        shapes[name] = tuple(_PROBE if d is None else d for d in dims)
        dtypes[name] = helper.tensor_dtype_to_np_dtype(values[name].type.tensor_type.elem_type)
    found = run_alone(node, model, base_dir, shapes, dtypes)
    first = values.get(node.input[0]) if node.input and node.input[0] else None
    out = []
    for name, (shape, dtype) in found.items():
        if first is not None and shape == shapes[node.input[0]]:
            v = onnx.ValueInfoProto()
            v.CopyFrom(first)
            v.name = name
            v.type.tensor_type.elem_type = _elem(dtype)
        elif first is not None and None not in _dims(first):
            v = helper.make_tensor_value_info(name, _elem(dtype), list(shape))
        else:
            v = helper.make_tensor_value_info(name, _elem(dtype), [None] * len(shape))
        out.append(v)
    return out

"""Shapes and types through contrib operators onnx does not know (front/ortshapes.py,
reader.infer_shapes).  Oracle: onnxruntime running the whole model, every tensor made an
output: the shape and element type it computes."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler.front import ortshapes, reader
from tpuasm.compiler.ort import session

_STEPS = 30


def _contrib_chain() -> onnx.ModelProto:
    """x (4, 8) float through _STEPS rounds of com.microsoft QuantizeLinear to int16,
    DequantizeLinear and a Relu (an unrolled LSTM's state, step by step), a FastGelu, and a
    uint8 QuantizeLinear with no zero point."""
    nodes, inits, last = [], [numpy_helper.from_array(np.float32(0.01), "s"),
                              numpy_helper.from_array(np.int16(0), "z")], "x"
    for i in range(_STEPS):
        nodes += [helper.make_node("QuantizeLinear", [last, "s", "z"], [f"q{i}"],
                                   domain="com.microsoft", name=f"q{i}"),
                  helper.make_node("DequantizeLinear", [f"q{i}", "s", "z"], [f"d{i}"],
                                   domain="com.microsoft", name=f"d{i}"),
                  helper.make_node("Relu", [f"d{i}"], [f"r{i}"], name=f"r{i}")]
        last = f"r{i}"
    nodes += [helper.make_node("FastGelu", [last], ["g"], domain="com.microsoft", name="g"),
              helper.make_node("QuantizeLinear", ["g", "s"], ["y"], domain="com.microsoft",
                               name="y")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                             [4, 8])],
                              [helper.make_tensor_value_info("y", T.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def _computed(model: onnx.ModelProto) -> dict:
    """{tensor: (shape, dtype)} as onnxruntime computes them."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [o for n in probe.graph.node for o in n.output]
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    values = session(probe).run(names, {"x": x})
    return {n: (v.shape, v.dtype) for n, v in zip(names, values)}


def test_contrib_q_dq_chain_is_inferred_in_one_pass(monkeypatch, tmp_path):
    model = _contrib_chain()
    passes = []
    real_pass = reader._infer_once
    monkeypatch.setattr(reader, "_infer_once",
                        lambda *a: passes.append(1) or real_pass(*a))

    def no_runs(*_):
        raise AssertionError("a shape-keeping contrib node was run alone")
    monkeypatch.setattr(ortshapes, "run_alone", no_runs)
    shapes, dtypes = reader.infer_shapes(model, tmp_path / "chain.onnx")
    assert len(passes) == 1               # not a pass per Q/DQ pair down the chain
    for name, (shape, dtype) in _computed(model).items():
        assert shapes[name] == shape, name
        assert dtypes[name] == dtype, name


def test_a_contrib_node_of_a_computed_zero_point_is_still_run_alone(tmp_path):
    """No initializer says the zero point's type: onnxruntime is asked, as before."""
    zp = helper.make_node("Cast", ["z"], ["zc"], to=T.INT16, name="zc")
    q = helper.make_node("QuantizeLinear", ["x", "s", "zc"], ["y"], domain="com.microsoft",
                         name="q")
    graph = helper.make_graph(
        [zp, q], "computed", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", T.INT16, None)],
        [numpy_helper.from_array(np.float32(0.5), "s"),
         numpy_helper.from_array(np.int32(0), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    assert ortshapes.stand_in(q, {"s": T.FLOAT}) is None
    shapes, dtypes = reader.infer_shapes(model, tmp_path / "computed.onnx")
    assert shapes["y"] == (2, 3) and dtypes["y"] == np.int16

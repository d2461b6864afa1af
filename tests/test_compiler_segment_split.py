"""A segment the Unified Buffer cannot hold as a whole, though each of its operators fits
alone (YOLOv8's first three Convs with their SiLUs at 320 x 320), is cut into runs that fit
(codegen/backend.py's cuts, partition.plan's segments) instead of going to the host whole."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.ort import session


def _three_convs(path):
    rng = np.random.default_rng(5)
    shapes = [(8, 4, 3, 3), (8, 8, 3, 3), (6, 8, 3, 3)]
    weights = [rng.normal(0, 0.3, s).astype(np.float32) for s in shapes]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1] * 4)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["N", 4, 16, 16])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", 6, 16, 16])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return model, rng.normal(0, 1, (8, 4, 16, 16)).astype(np.float32)


@pytest.mark.parametrize("ub_rows,segments", [(1024, 1), (640, 2), (384, 3)])
def test_a_segment_too_large_whole_is_cut_into_segments_that_fit(tmp_path, ub_rows, segments):
    model, calib = _three_convs(tmp_path / "m.onnx")
    compiled = tpu_compile(str(tmp_path / "m.onnx"), batch=2, calibration=calib,
                           config={"array_size": 16, "ub_rows": ub_rows})
    rows = [r for r in compiled.report.rows if r.op_type == "Conv"]
    assert all(r.where == "TPU" for r in rows)
    assert len({r.step for r in rows}) == segments
    x = calib[:2]
    got = compiled.run(x)["y"]
    (want,) = session(model).run(None, {"x": x})
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()
    (same_qdq,) = session(onnx.load(str(compiled.reference_model))).run(None, {"x": x})
    np.testing.assert_array_equal(got, same_qdq)

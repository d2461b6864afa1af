"""Convolutions (and the Relu and pooling after them) whose image the Unified Buffer cannot
hold, cut into bands of rows (front/banding.py) on a tiny machine (16 x 16 array, a few
hundred UB rows) so that small images need it: the rewrite computes what the chain did
(onnxruntime on the float model), the compiled model is onnxruntime's QDQ model to the
LSB, the report counts the layer's MACs once, and the decision comes from the back end's
own capacity rule (codegen/capacity.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.codegen import CodegenError, generate, ub_rows_needed
from tpuasm.compiler.codegen.backend import room
from tpuasm.compiler.front.banding import band_convolutions
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.ort import session
from tpuasm.compiler.runtime.steps import TpuStep
from tpuasm.machine import MachineConfig

TINY = {"array_size": 16, "ub_rows": 512}


def _chain(x_shape, out_channels=8, conv=None, act="Relu", pool=None, group=1, seed=0,
           opset=13):
    """x -> Conv(conv attrs) [-> act] [-> pool (op, attrs)] -> y, float, named nodes."""
    rng = np.random.default_rng(seed)
    c = x_shape[1]
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]) if conv is None else conv
    kh, kw = conv["kernel_shape"]
    w = rng.normal(0, 0.4, (out_channels, c // group, kh, kw)).astype(np.float32)
    b = rng.normal(0, 0.2, out_channels).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", group=group,
                              **conv)]
    last = "c"
    if act:
        nodes.append(helper.make_node(act, [last], ["a"], name="act"))
        last = "a"
    if pool:
        op, attrs = pool
        nodes.append(helper.make_node(op, [last], ["p"], name="pool", **attrs))
        last = "p"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                         ["N", *x_shape[1:]])],
                              [helper.make_tensor_value_info("y", T.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset >= 13 else 4
    inferred = onnx.shape_inference.infer_shapes(model)
    model.graph.output[0].CopyFrom(inferred.graph.output[0])
    return model


CHAINS = [
    # VGG's block: 3x3 same Conv, Relu, 2x2 max pool
    dict(x_shape=(2, 3, 30, 14), pool=("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2]))),
    # an overlapping pool (neighbouring bands compute shared Conv rows)
    dict(x_shape=(2, 4, 33, 14), pool=("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2]))),
    # a strided Conv, uneven pads, no activation, a padded average pooling (its bands would
    # keep padding on one side, which the back end's pool cannot: the Conv banded alone)
    dict(x_shape=(1, 5, 41, 10), act=None,
         conv=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[2, 1, 0, 1]),
         pool=("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]))),
    # a grouped 5x5 Conv alone
    dict(x_shape=(2, 4, 25, 9), group=2, conv=dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])),
]


@pytest.mark.parametrize("case", CHAINS)
@pytest.mark.parametrize("opset", [9, 13])       # Slice's starts/ends as attributes before 10
def test_the_bands_compute_what_the_chain_did(case, opset):
    model = _chain(**case, opset=opset)
    x = np.random.default_rng(1).normal(0, 1, case["x_shape"]).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    prov = Provenance.of(model)
    assert band_convolutions(model, prov, room(MachineConfig(**TINY))) == 1
    onnx.checker.check_model(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") > 1 and ops.count("Concat") == 1
    got = session(model).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the Conv's rows: each counted once over the bands, however many compute it
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    owned = [prov.own_work.get(n.name) for n in convs]
    pools = [n for n in model.graph.node if n.op_type in ("MaxPool", "AveragePool")]
    if len(pools) > 1 and pools[0].attribute[0].ints[0] > 1 and case["pool"][1][
            "kernel_shape"][0] > case["pool"][1]["strides"][0]:
        assert any(o is not None and o[0] < o[1] for o in owned)     # recomputed rows
    else:
        assert all(o is None for o in owned)                         # no overlap at all
    if "pool" in case:
        assert len(pools) == (1 if case["pool"][1].get("pads") else len(convs))
    assert all(prov.source(n.name) == "conv" for n in convs)


def test_a_chain_that_fits_is_left_whole():
    model = _chain((2, 3, 8, 8))
    assert band_convolutions(model, Provenance.of(model), room(MachineConfig(**TINY))) == 0
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu"]


def _compile(tmp_path, model, calib, config=TINY, batch=4):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return tpu_compile(str(path), batch=batch, calibration=calib, config=config)


def _output_lsb(qdq: onnx.ModelProto) -> float:
    """The largest output step of the bands: the scales of the DequantizeLinear nodes the
    Concat joins (the last one before the output; a host pool may follow it)."""
    g = qdq.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    join = producer[g.output[0].name]
    while join.op_type != "Concat":
        join = producer[join.input[0]]
    return max(float(inits[producer[i].input[1]]) for i in join.input)


@pytest.mark.parametrize("case,opset", [(CHAINS[0], 9), (CHAINS[0], 13), (CHAINS[1], 13),
                                        (CHAINS[2], 13)])
def test_a_banded_layer_runs_on_the_tpu_as_onnxruntime_s_qdq_model(tmp_path, case, opset):
    model = _chain(**case, seed=2, opset=opset)
    rng = np.random.default_rng(3)
    calib = rng.normal(0, 1, (8, *case["x_shape"][1:])).astype(np.float32)
    compiled = _compile(tmp_path, model, calib)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["conv"].where == "TPU", rows["conv"].reason
    assert "bands of rows" in rows["conv"].reason
    if "pool" in case and not case["pool"][1].get("pads"):       # banded with the Conv
        assert rows["pool"].where == "TPU", rows["pool"].reason
    assert compiled.report.tpu_macs == compiled.report.macs > 0
    segments = [s for s in compiled.steps if isinstance(s, TpuStep)]
    assert len(segments) == 1 and len(segments[0].segment.operators) > 2   # the bands
    x = calib[:4]
    got = compiled.run(x)["y"]
    qdq = onnx.load(str(compiled.reference_model))
    want = session(qdq).run(None, {"x": x})[0]
    lsb = _output_lsb(qdq)
    assert np.mean(got == want) >= 0.999
    assert np.abs(got - want).max() <= lsb * 1.001
    fl = session(model).run(None, {"x": x})[0]
    assert np.abs(got - fl).max() < 0.05 * np.abs(fl).max()


def test_a_banded_layer_s_macs_are_counted_once(tmp_path):
    """With an overlapping pool some Conv rows are computed by two bands; the report counts
    the network's own products: the same total as the unbanded layer on a large machine."""
    case = CHAINS[1]
    model = _chain(**case, seed=4)
    calib = np.random.default_rng(5).normal(0, 1, (8, *case["x_shape"][1:])).astype(np.float32)
    whole = _compile(tmp_path, model, calib, config={"array_size": 16})
    banded = _compile(tmp_path, model, calib)
    n, c, h, w = case["x_shape"]
    own = 4 * 8 * h * w * c * 9                  # batch x O x H x W x C x kh x kw
    assert whole.report.macs == whole.report.tpu_macs == own
    assert banded.report.macs == banded.report.tpu_macs == own
    row = {r.node: r for r in banded.report.rows}["conv"]
    assert row.macs == own and row.where == "TPU"
    convs = [op for s in banded.steps if isinstance(s, TpuStep) for op in s.segment.operators
             if type(op).__name__ == "Conv"]
    done = sum(4 * int(np.prod(op.output.shape)) * c * 9 for op in convs)
    assert done > own                           # the bands did recompute shared rows


def test_the_back_end_and_the_banding_share_one_capacity_rule(tmp_path):
    """generate() refuses a segment exactly when ub_rows_needed says it does not fit, and
    the bands the front end chose fit it."""
    case = CHAINS[0]
    model = _chain(**case, seed=6)
    calib = np.random.default_rng(7).normal(0, 1, (4, *case["x_shape"][1:])).astype(np.float32)
    compiled = _compile(tmp_path, model, calib)
    seg = next(s for s in compiled.steps if isinstance(s, TpuStep)).segment
    need = ub_rows_needed(seg, 16, MachineConfig().acc_rows)
    assert need <= TINY["ub_rows"]
    generate(seg, 1, array_size=16, ub_rows=need)
    with pytest.raises(CodegenError, match=f"one sample needs {need} UB rows"):
        generate(seg, 1, array_size=16, ub_rows=need - 1)


def test_a_layer_even_one_band_of_cannot_fit_stays_on_the_host_with_its_reason(tmp_path):
    """A row of the image alone (with its halo) is more than the Unified Buffer: no banding,
    the layer on the host saying so, the answers kept."""
    model = _chain((2, 4, 6, 400), pool=None, seed=8)
    calib = np.random.default_rng(9).normal(0, 1, (4, 4, 6, 400)).astype(np.float32)
    compiled = _compile(tmp_path, model, calib, config={"array_size": 16, "ub_rows": 1024})
    row = {r.node: r for r in compiled.report.rows}["conv"]
    assert row.where == "host" and "cannot hold" in row.reason and "bands" in row.reason
    fl = session(model).run(None, {"x": calib})[0]
    assert np.abs(compiled.run(calib)["y"] - fl).max() < 0.05 * np.abs(fl).max()


def test_banded_from_the_cli_passes_the_golden_check_and_infers_as_the_qdq_model(tmp_path):
    """`tpuasm compile` (which checks every segment's program against reference.py) and
    `tpuasm infer` on a banded model: the QDQ model's answers, the report saying so."""
    import json

    from tpuasm.compiler.cli import compile_main, infer_main
    case = CHAINS[0]
    model = _chain(**case, seed=10)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(11)
    np.save(tmp_path / "c.npy", rng.normal(0, 1, (8, *case["x_shape"][1:])).astype(np.float32))
    x = rng.normal(0, 1, (4, *case["x_shape"][1:])).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    assert compile_main([str(path), "-o", str(out), "--calibrate", str(tmp_path / "c.npy"),
                         "--batch", "4", "--config", "array_size=16", "--config",
                         "ub_rows=512", "-q"]) == 0
    rows = {r["node"]: r for r in json.loads((out / "report.json").read_text())["rows"]}
    assert rows["conv"]["where"] == rows["pool"]["where"] == "TPU"
    assert infer_main([str(out), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                       "-q"]) == 0
    qdq = onnx.load(str(out / "model.qdq.onnx"))
    want = session(qdq).run(None, {"x": x})[0]
    got = np.load(tmp_path / "y.npy")
    assert np.mean(got == want) >= 0.999
    assert np.abs(got - want).max() <= _output_lsb(qdq) * 1.001


@pytest.mark.parametrize("case", [
    # YOLOv8's DFL: a 1x1 Conv over a row of 2100 anchors (here 70, wider than a half of 32)
    dict(x_shape=(2, 16, 4, 70), out_channels=1, act=None,
         conv=dict(kernel_shape=[1, 1])),
    # a strided, padded 3x3 Conv whose output rows are wider than a half
    dict(x_shape=(2, 3, 5, 141), out_channels=4,
         conv=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
])
def test_an_output_row_wider_than_an_accumulator_half_runs_in_column_bands(tmp_path, case):
    """An output row longer than an accumulator half (32 rows here, 2048 on the TPU) used to
    send its Conv to the host; it runs one row's columns at a time, the QDQ model's answers."""
    model = _chain(**case, seed=10)
    calib = np.random.default_rng(11).normal(0, 1, (4, *case["x_shape"][1:])).astype(
        np.float32)
    compiled = _compile(tmp_path, model, calib, batch=2,
                        config={"array_size": 16, "acc_rows": 64})
    row = {r.node: r for r in compiled.report.rows}["conv"]
    assert row.where == "TPU", row.reason
    x = calib[:2]
    got = compiled.run(x)["y"]
    qdq = onnx.load(str(compiled.reference_model))
    want = session(qdq).run(None, {"x": x})[0]
    scale = max(float(numpy_helper.to_array(t)) for t in qdq.graph.initializer
                if t.name.endswith("_scale") and numpy_helper.to_array(t).ndim == 0)
    assert np.mean(got == want) >= 0.999
    assert np.abs(got - want).max() <= scale * 1.001


def test_a_lookup_over_rows_wider_than_an_accumulator_half_stays_on_the_host(tmp_path):
    """A lookup of its own (not fused into the Conv: the Conv's output is read twice) copies
    whole image rows through the accumulators; a row wider than a half runs on the host,
    saying so, and the answers are kept."""
    rng = np.random.default_rng(12)
    w = rng.normal(0, 0.4, (4, 3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["y1"], name="sigmoid"),
             helper.make_node("Relu", ["c"], ["y2"], name="relu")]
    outputs = [helper.make_tensor_value_info(n, T.FLOAT, ["N", 4, 2, 70]) for n in ("y1", "y2")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 3, 2, 70])],
                              outputs, [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.normal(0, 1, (4, 3, 2, 70)).astype(np.float32)
    compiled = _compile(tmp_path, model, x, batch=2, config={"array_size": 16, "acc_rows": 64})
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["conv"].where == "TPU", rows["conv"].reason
    assert rows["sigmoid"].where == "host"
    assert "a lookup over rows 70 pixels wide" in rows["sigmoid"].reason
    want = session(model).run(None, {"x": x})
    got = compiled.run(x)
    for name, ref in zip(("y1", "y2"), want):
        assert np.abs(got[name] - ref).max() < 0.05 * np.abs(ref).max()

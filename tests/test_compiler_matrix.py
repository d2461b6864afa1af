"""The matrix work of real networks on the array (issue 20, item 3): MatMul over activations
of rank 3 and up (every leading dimension a row), a bias Add fused into its MatMul, Conv1d,
grouped and depthwise Conv, lookups of any rank, and the host placements with their reasons
for what stays there.  Each model is a QDQ (or QOperator) model built with onnx.helper and
numpy; the compiled model runs on the emulator and on reference.py and is compared with
onnxruntime on the same model: >= 99.9 % of output elements identical, none more than 1 LSB
apart."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

pytest.importorskip("tpuasm.compiler.codegen")

from onnx_models import const, model, qparams_inputs, run_ort, value_info  # noqa: E402
from qdq_builder import QDQBuilder  # noqa: E402
from tpuasm.compiler import codegen  # noqa: E402
from tpuasm.compiler.ir import Conv  # noqa: E402
from tpuasm.compiler.pipeline import compile_model  # noqa: E402

SMALL = ["array_size=16", "acc_rows=64"]


def compiled(tmp_path, m, batch=5, config=SMALL):
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return compile_model(path, batch=batch, config=config)


def assert_matches(model, m, x, y_scale, identical=0.999):
    """Emulator and reference against onnxruntime on the same quantized model, in LSB."""
    (want,) = run_ort(m, {"x": x})
    for engine in ("emulator", "reference"):
        got = model.run(x, engine=engine)["y"]
        assert got.shape == want.shape, (engine, got.shape, want.shape)
        diff = np.rint(np.abs(got.astype(np.float64) - want) / y_scale)
        same = float(np.mean(diff == 0))
        assert diff.max() <= 1 and same >= identical, (engine, same, diff.max())


def rows(model):
    return {r.node: r for r in model.report.rows}


def inputs(b: QDQBuilder, count: int, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1.1, (count,) + b.x_shape).astype(np.float32)


def tpu_ops(model):
    return [op for seg in model.segments for op in seg.operators]


# --- MatMul over rank 3 and up, bias Add fused ----------------------------------------------

@pytest.mark.parametrize("shape", [(6, 20), (3, 4, 18)])
def test_matmul_over_rows_of_rank3_and_rank4_activations(tmp_path, shape):
    b = QDQBuilder(shape, seed=1)
    b.quantize()
    b.matmul(24, "int32", name="fc1")
    b.quantize()
    b.unary("Relu")
    b.quantize()
    b.matmul(17, "int32", name="fc2")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    for name in ("fc1", "fc2"):
        assert placed[name].where == "TPU", placed[name].note
        assert "on each of" in placed[name].note
    adds = [r for r in model.report.rows if r.op_type == "Add"]
    assert len(adds) == 2 and all(r.where == "TPU" and "fused into" in r.note for r in adds)
    assert len(model.segments) == 1
    fc1 = next(op for op in tpu_ops(model) if op.name == "fc1")
    assert isinstance(fc1, Conv) and fc1.input.channels_last and fc1.bias is not None
    assert fc1.input.shape == (shape[-1], int(np.prod(shape[:-1])), 1)
    assert_matches(model, m, inputs(b, 13), b.scale)


def test_mlp_with_bias_adds_is_one_segment(tmp_path):
    # rank 2: MatMul + Add(DequantizeLinear(int32 bias)) is one Dense with its bias
    b = QDQBuilder((30,), seed=2)
    b.quantize()
    for i, n in enumerate((40, 25)):
        b.matmul(n, "int32", name=f"fc{i}")
        b.quantize()
        b.unary("Relu")
        b.quantize()
    b.matmul(7, "int32", name="out")
    m = b.model()
    model = compiled(tmp_path, m, batch=20)
    assert len(model.segments) == 1
    assert [s["kind"] for s in model.report.steps] == ["host", "tpu", "host"]
    from tpuasm.compiler.ir import Dense
    dense = [op for op in tpu_ops(model) if isinstance(op, Dense)]
    assert len(dense) == 3 and all(op.bias is not None for op in dense)
    assert_matches(model, m, inputs(b, 45), b.scale)


def test_rows_flattened_into_a_gemm(tmp_path):
    # a channels-last (rows, C) tensor read whole by a Gemm after Flatten: the Gemm's weight
    # rows follow ONNX's (row, channel) order, the IR image is (C, rows, 1)
    b = QDQBuilder((6, 20), seed=5)
    b.quantize()
    b.matmul(12, "int32", name="fc")
    b.quantize()
    b.current = b.node("Flatten", [b.current], name="flat",
                       value=b.value.reshape(len(b.value), -1))
    b.quantize(same=True)                        # quantize_static: Flatten keeps its input's
    b.matmul(7, "int32", name="head")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["fc"].where == "TPU" and placed["head"].where == "TPU"
    assert len(model.segments) == 1
    assert_matches(model, m, inputs(b, 11), b.scale)


@pytest.mark.parametrize("shape", [(6, 20), (2, 3, 5, 4)])
def test_host_made_tensor_flattened_into_a_gemm_is_a_vector(tmp_path, shape):
    # a tensor of rank 3 or 5 made on the host and read whole: the host delivers it flat
    b = QDQBuilder(shape, seed=3)
    b.quantize()
    b.current = b.node("Flatten", [b.current], name="flat",
                       value=b.value.reshape(len(b.value), -1))
    b.quantize(same=True)
    b.matmul(9, "int32", name="fc")
    m = b.model()
    model = compiled(tmp_path, m, batch=4)
    assert rows(model)["fc"].note == f"Dense {int(np.prod(shape))}x9 + bias"
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_float_constant_bias_is_requantized(tmp_path):
    # a float bias operand of the Add: rounded to x.scale * w.scale (as a Gemm's float
    # bias), so near-ties may differ from onnxruntime's float Add by 1 LSB
    b = QDQBuilder((6, 20), seed=0)
    b.quantize()
    b.matmul(24, "float", name="fc")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["fc"].where == "TPU" and "bias requantized" in placed["fc"].note
    assert [r.where for r in model.report.rows if r.op_type == "Add"] == ["TPU"]
    assert_matches(model, m, inputs(b, 200), b.scale)


def test_matmul_of_two_activations_stays_on_the_host(tmp_path):
    b = QDQBuilder((8, 12), seed=3)
    a = b.quantize()
    t = b.node("Transpose", [a], perm=[0, 2, 1])
    b.current = b.node("MatMul", [a, t], name="scores",
                       value=b.value @ b.value.transpose(0, 2, 1))
    m = b.model()
    model = compiled(tmp_path, m)
    row = rows(model)["scores"]
    assert row.where == "host" and "two activations" in row.note
    assert_matches(model, m, inputs(b, 6), b.scale)


def test_qlinear_matmul_over_rank3(tmp_path):
    rng = np.random.default_rng(4)
    w = rng.integers(-127, 128, (16, 9)).astype(np.int8)
    inits = [*qparams_inputs("x", 0.03, 128, False), const("w", w),
             const("w_scale", rng.uniform(0.002, 0.01, 9).astype(np.float32)),
             const("w_zp", np.zeros(9, np.int8)), *qparams_inputs("y", 0.2, 110, False)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q"),
             helper.make_node("QLinearMatMul", ["xq", "x_scale", "x_zp", "w", "w_scale",
                                                "w_zp", "y_scale", "y_zp"], ["yq"], name="fc"),
             helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["y"], name="dq")]
    m = model(nodes, [value_info("x", np.float32, ("N", 5, 16))],
              [value_info("y", np.float32, ("N", 5, 9))], inits)
    compiled_model = compiled(tmp_path, m)
    assert rows(compiled_model)["fc"].where == "TPU"
    x = np.random.default_rng(5).normal(0, 1, (11, 5, 16)).astype(np.float32)
    assert_matches(compiled_model, m, x, 0.2)


# --- Conv1d ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel, stride, pads, auto_pad", [
    (3, 2, [1, 2], None), (4, 1, None, "SAME_UPPER"), (5, 2, None, "SAME_LOWER"),
    (3, 1, None, "VALID")])
def test_conv1d(tmp_path, kernel, stride, pads, auto_pad):
    b = QDQBuilder((5, 23), seed=kernel)
    b.quantize()
    b.conv(7, (kernel,), stride=stride, pads=pads, auto_pad=auto_pad, name="conv")
    b.unary("Relu")
    b.quantize()
    b.conv(20, (3,), pads=[1, 1], name="conv2")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["conv"].where == "TPU" and placed["conv2"].where == "TPU"
    assert f"{kernel}x1 kernel" in placed["conv"].note and "a 1-D convolution" in \
        placed["conv"].note
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_conv2d_of_height_one_is_a_conv1d(tmp_path):
    # Conv1d exported as a 2-D conv over (C, 1, L) with a (1, k) kernel, strides (1, 2)
    # (different per axis: the back end has one stride, but the vertical one never moves)
    b = QDQBuilder((3, 1, 40), seed=20)
    b.quantize()
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (6, 3, 1, 5)).astype(np.float32)
    wdq, wreal = b.weight(w, 0)
    from qdq_builder import _run_one
    attrs = dict(kernel_shape=[1, 5], strides=[1, 2], pads=[0, 2, 0, 1])
    value = _run_one(helper.make_node("Conv", ["a", "w"], ["y"], **attrs),
                     {"a": b.value, "w": wreal})
    b.current = b.node("Conv", [b.current, wdq], name="conv", value=value, **attrs)
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["conv"].where == "TPU" and "5x1 kernel" in placed["conv"].note
    assert_matches(model, m, inputs(b, 9), b.scale)


@pytest.mark.parametrize("stride", [1, 3])
def test_long_conv1d_is_banded_by_rows(tmp_path, stride):
    # a signal of 300 samples on a machine whose accumulator half holds 32 rows: the
    # output is cut into bands of rows (a pixel per row)
    b = QDQBuilder((3, 300), seed=19)
    b.quantize()
    b.conv(6, (5,), stride=stride, pads=[2, 2], name="conv")
    b.unary("Relu")
    m = b.model()
    model = compiled(tmp_path, m, batch=4)
    assert rows(model)["conv"].where == "TPU"
    assert_matches(model, m, inputs(b, 6), b.scale)


@pytest.mark.parametrize("shape, kernel, perm", [((5, 23), (3,), [0, 2, 1]),
                                                 ((4, 5, 6), (3, 3), [0, 2, 3, 1])])
def test_conv_then_dense_over_its_pixels_stays_on_the_chip(tmp_path, shape, kernel, perm):
    # a Conv front end, its channels moved last by a Transpose, Dense layers per position
    # (the 1-D conv audio classifier's pattern): the MatMul is a 1x1 Conv over the conv's
    # own image, no host round trip
    b = QDQBuilder(shape, seed=16)
    b.quantize()
    b.conv(20, kernel, pads=[1] * 2 * len(kernel), name="conv")
    b.unary("Relu")
    b.quantize()
    b.current = b.node("Transpose", [b.current], name="channels_last", perm=perm,
                       value=b.value.transpose(perm))
    b.quantize(same=True)
    b.matmul(12, "int32", name="fc1")
    b.quantize()
    b.unary("Tanh", name="act")
    b.quantize()
    b.matmul(6, "int32", name="fc2")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    for name in ("conv", "channels_last", "fc1", "act", "fc2"):
        assert placed[name].where == "TPU", (name, placed[name].note)
    assert len(model.segments) == 1
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_lookup_before_a_conv1d_takes_the_signal_layout(tmp_path):
    b = QDQBuilder((5, 17), seed=17)
    b.quantize()
    b.unary("Sigmoid", name="act")
    b.quantize()
    b.conv(6, (3,), pads=[1, 1], name="conv")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["act"].where == "TPU" and placed["conv"].where == "TPU"
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_conv1d_over_a_transposed_sequence_reads_the_host_layout(tmp_path):
    # (N, L, C) -> Transpose -> (N, C, L) -> Conv1d: the quantized tensor after the
    # Transpose is made on the host, the Conv reads it
    b = QDQBuilder((19, 6), seed=18)
    b.quantize()
    b.current = b.node("Transpose", [b.current], name="to_channels", perm=[0, 2, 1],
                       value=b.value.transpose(0, 2, 1))
    b.quantize(same=True)
    b.conv(8, (3,), stride=2, pads=[1, 1], name="conv")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["conv"].where == "TPU" and placed["to_channels"].where == "host"
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_qlinear_conv1d_and_grouped(tmp_path):
    # a grouped QLinearConv 1-D, then a depthwise one written as a 2-D conv of height 1
    # over the reshaped signal (how some exporters write Conv1d): both over (C, L, 1)
    rng = np.random.default_rng(6)
    w1 = rng.integers(-127, 128, (8, 2, 3)).astype(np.int8)          # 1-D, 2 groups of 2
    w2 = rng.integers(-127, 128, (8, 1, 1, 3)).astype(np.int8)       # depthwise (1, 3)
    inits = [*qparams_inputs("x", 0.02, 128, False), const("w1", w1),
             const("w1_scale", rng.uniform(0.002, 0.01, 8).astype(np.float32)),
             const("w1_zp", np.zeros(8, np.int8)), const("b1", rng.integers(-300, 300, 8),
                                                         np.int32),
             *qparams_inputs("c", 0.05, 100, False),
             const("shape", np.array([-1, 8, 1, 12], np.int64)),
             const("w2", w2), const("w2_scale", rng.uniform(0.01, 0.03, 8).astype(np.float32)),
             const("w2_zp", np.zeros(8, np.int8)), *qparams_inputs("y", 0.1, 120, False)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q"),
             helper.make_node("QLinearConv", ["xq", "x_scale", "x_zp", "w1", "w1_scale",
                                              "w1_zp", "c_scale", "c_zp", "b1"], ["c"],
                              name="conv1d", kernel_shape=[3], pads=[1, 1], group=2),
             helper.make_node("Reshape", ["c", "shape"], ["img"], name="as_image"),
             helper.make_node("QLinearConv", ["img", "c_scale", "c_zp", "w2", "w2_scale",
                                              "w2_zp", "y_scale", "y_zp"], ["yq"],
                              name="depthwise", kernel_shape=[1, 3], pads=[0, 1, 0, 1],
                              group=8),
             helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["y"], name="dq")]
    m = model(nodes, [value_info("x", np.float32, ("N", 4, 12))],
              [value_info("y", np.float32, ("N", 8, 1, 12))], inits)
    compiled_model = compiled(tmp_path, m)
    placed = rows(compiled_model)
    assert placed["conv1d"].where == "TPU" and "grouped conv, 2 groups" in placed["conv1d"].note
    assert placed["depthwise"].where == "TPU" and "depthwise conv, 8 groups" in \
        placed["depthwise"].note
    x = np.random.default_rng(8).normal(0, 1, (7, 4, 12)).astype(np.float32)
    assert_matches(compiled_model, m, x, 0.1)


@pytest.mark.parametrize("rank", [1, 2])
def test_zero_pad_before_a_conv_is_folded_into_its_padding(tmp_path, rank):
    b = QDQBuilder((3, 9) if rank == 1 else (3, 9, 8), seed=13)
    b.quantize()
    b.pad([0, 0, 2, 0, 0, 1] if rank == 1 else [0, 0, 1, 2, 0, 0, 2, 0], name="pad")
    b.quantize(same=True)                        # quantize_static: the Pad's input's
    b.conv(5, (3,) * rank, stride=2, auto_pad="SAME_UPPER", name="conv")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["pad"].where == "TPU" and placed["pad"].note == "fused into conv"
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_reflect_pad_stays_on_the_host_and_the_conv_reads_its_result(tmp_path):
    b = QDQBuilder((3, 9, 8), seed=21)
    b.quantize()
    pads = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    b.current = b.node("Pad", [b.current, b._const(pads, "pads")], name="pad", mode="reflect",
                       value=np.pad(b.value, [(0, 0), (0, 0), (1, 1), (1, 1)], mode="reflect"))
    b.quantize(same=True)
    b.conv(5, (3, 3), name="conv")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["pad"].where == "host" and placed["conv"].where == "TPU"
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_qlinear_pad_of_the_zero_point_is_folded(tmp_path):
    rng = np.random.default_rng(14)
    w = rng.integers(-127, 128, (4, 2, 3, 3)).astype(np.int8)
    inits = [*qparams_inputs("x", 0.02, 128, False), const("w", w),
             const("w_scale", rng.uniform(0.002, 0.01, 4).astype(np.float32)),
             const("w_zp", np.zeros(4, np.int8)),
             const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)),
             *qparams_inputs("y", 0.05, 100, False)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q"),
             helper.make_node("Pad", ["xq", "pads", "x_zp"], ["xp"], name="pad"),
             helper.make_node("QLinearConv", ["xp", "x_scale", "x_zp", "w", "w_scale", "w_zp",
                                              "y_scale", "y_zp"], ["yq"], name="conv",
                              kernel_shape=[3, 3]),
             helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["y"], name="dq")]
    m = model(nodes, [value_info("x", np.float32, ("N", 2, 6, 6))],
              [value_info("y", np.float32, ("N", 4, 6, 6))], inits)
    compiled_model = compiled(tmp_path, m)
    placed = rows(compiled_model)
    assert placed["conv"].where == "TPU" and placed["pad"].where == "TPU"
    x = np.random.default_rng(15).normal(0, 1, (5, 2, 6, 6)).astype(np.float32)
    assert_matches(compiled_model, m, x, 0.05)


# --- grouped and depthwise Conv -------------------------------------------------------------

@pytest.mark.parametrize("channels, out, groups", [(20, 20, 20), (36, 24, 4), (12, 24, 3),
                                                   (40, 32, 2)])
def test_grouped_conv_on_the_array(tmp_path, channels, out, groups):
    # channels > the 16-wide array: blocks of outputs read only their groups' input chunks
    b = QDQBuilder((channels, 7, 7), seed=groups)
    b.quantize()
    b.conv(out, (3, 3), stride=1 + (groups == 4), pads=[1] * 4, groups=groups, name="gconv")
    b.unary("Relu")
    m = b.model()
    model = compiled(tmp_path, m)
    row = rows(model)["gconv"]
    assert row.where == "TPU" and f"{groups} groups" in row.note
    assert f"at most 1/{groups} of the array's weights do work" in row.note
    (op,) = tpu_ops(model)
    program = model.steps[1].program
    assert program.weights.shape[0] == codegen.weight_tiles(op, 16)
    assert_matches(model, m, inputs(b, 8), b.scale)


@pytest.mark.parametrize("seed", range(3))
def test_grouped_conv_in_the_back_end_against_the_reference(seed):
    # random groups, strides and padding straight through codegen (8-wide array, small
    # accumulators: banded outputs), against reference.py's grouped convolution
    from test_codegen import assert_close, qparams, run, seg
    from tpuasm.compiler.ir import Activation, Tensor
    rng = np.random.default_rng(seed)
    groups = int(rng.choice([2, 3, 5]))
    cg, og = int(rng.integers(1, 7)), int(rng.integers(1, 6))
    kernel, stride, pad = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(0, 2))
    h = int(rng.integers(kernel, 12))
    x = Tensor("x", (cg * groups, h, h + 1), qparams(rng))
    ho, wo = (h + 2 * pad - kernel) // stride + 1, (h + 1 + 2 * pad - kernel) // stride + 1
    op = Conv("g", x, Tensor("y", (og * groups, ho, wo), qparams(rng)),
              rng.integers(-127, 128, (og * groups, cg, kernel, kernel)).astype(np.int8),
              rng.uniform(0.001, 0.01, og * groups).astype(np.float32),
              rng.integers(-2000, 2000, og * groups).astype(np.int32), (stride, stride),
              (pad,) * 4, Activation("none"), ("g",), groups)
    ours, theirs, program, _ = run(seg([op]), 5, rng, array_size=8, acc_rows=64, ub_rows=4096)
    assert_close(ours, theirs)
    assert program.weights.shape[0] == codegen.weight_tiles(op, 8)


@pytest.mark.parametrize("shape", [(8, 16), (2, 3, 4, 5), (30,), (3, 5, 7)])
def test_back_end_lookup_of_any_ir_rank(shape):
    # the back end packs tensors of any rank (rank 2 crashed the host packing before)
    from test_codegen import assert_close, lookup, qparams, run, seg
    from tpuasm.compiler.ir import Tensor
    rng = np.random.default_rng(len(shape))
    op = lookup(rng, "f", Tensor("x", shape, qparams(rng)))
    ours, theirs, _, _ = run(seg([op]), 6, rng, array_size=8, acc_rows=64, ub_rows=4096)
    assert_close(ours, theirs)


def test_depthwise_weight_tiles_stay_sane():
    # MobileNet's depthwise 3x3 on 144 channels: one tile per tap on the 256 array, and on
    # a 16-wide array a tile per (chunk, tap) on the diagonal only (9 x 9, not 81 x 9)
    from tpuasm.compiler.ir import QParams, Tensor
    q = QParams(0.1, 0, False)
    op = Conv("dw", Tensor("x", (144, 56, 56), q), Tensor("y", (144, 56, 56), q),
              np.ones((144, 1, 3, 3), np.int8), np.ones(144, np.float32), None, (1, 1),
              (1, 1, 1, 1), groups=144)
    assert codegen.weight_tiles(op, 256) == 9
    assert codegen.weight_tiles(op, 16) == 81


# --- lookups of any rank --------------------------------------------------------------------

@pytest.mark.parametrize("shape, function", [((40,), "Sigmoid"), ((8, 16), "Tanh"),
                                             ((3, 4, 12), "Sigmoid"), ((3, 6, 5), "Tanh")])
def test_lookup_of_any_rank(tmp_path, shape, function):
    b = QDQBuilder(shape, seed=9)
    b.quantize()
    b.unary(function, name="f")
    m = b.model()
    model = compiled(tmp_path, m, batch=64)
    assert rows(model)["f"].where == "TPU"
    assert_matches(model, m, inputs(b, 70), b.scale)


# --- what stays on the host, and why --------------------------------------------------------

def test_residual_add_over_rows_runs_on_the_tpu(tmp_path):
    # the Add of two (6, 16) channels-last activations is a VADD (it ran on the host before
    # the vector instructions; tests/test_compiler_eltwise.py has the cases that stay)
    b = QDQBuilder((6, 16), seed=10)
    a = b.quantize()
    skip = b.value
    b.matmul(16, "int32", name="fc")
    b.quantize()
    b.current = b.node("Add", [b.current, a], name="residual", value=b.value + skip)
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["fc"].where == "TPU"
    assert placed["residual"].where == "TPU", placed["residual"].note
    assert [type(op).__name__ for op in tpu_ops(model)] == ["Conv", "Elementwise"]
    assert_matches(model, m, inputs(b, 9), b.scale)


def test_an_internal_lowering_error_puts_the_node_on_the_host(tmp_path, monkeypatch):
    from tpuasm.compiler.front.match import Lowerer

    def broken(self, node):
        raise IndexError("tuple index out of range")
    monkeypatch.setattr(Lowerer, "lower_conv", broken)
    b = QDQBuilder((3, 8, 8), seed=11)
    b.quantize()
    b.conv(4, (3, 3), pads=[1] * 4, name="conv")
    b.quantize()
    b.unary("Sigmoid", name="act")
    m = b.model()
    model = compiled(tmp_path, m)
    placed = rows(model)
    assert placed["conv"].where == "host"
    assert placed["conv"].note == "internal: IndexError: tuple index out of range"
    assert placed["act"].where == "TPU"
    assert_matches(model, m, inputs(b, 6), b.scale)


def _depthwise(b):
    b.conv(12, (3, 3), pads=[1] * 4, groups=12, name="op")


def _rows(b):
    b.matmul(10, "int32", name="op")                 # over the last axis: 12 x 4 rows of 6


@pytest.mark.parametrize("layer", [_depthwise, _rows])
def test_saved_model_keeps_rows_layout_and_groups(tmp_path, layer):
    from tpuasm.compiler import load
    b = QDQBuilder((12, 4, 6), seed=12)
    b.quantize()
    layer(b)
    m = b.model()
    model = compiled(tmp_path, m)
    assert rows(model)["op"].where == "TPU"
    model.save(tmp_path / "out")
    again = load(tmp_path / "out")
    x = inputs(b, 7)
    np.testing.assert_array_equal(model.run(x)["y"], again.run(x)["y"])
    assert_matches(again, m, x, b.scale)


# --- a transformer encoder block ------------------------------------------------------------

def test_transformer_block_maps_every_constant_weight_matmul(tmp_path):
    # the example (0 of 88 nodes on the TPU before): a float model quantized by the
    # pipeline (quantize_static), every MatMul/Gemm with constant weights on the array, the
    # attention's activation x activation MatMuls on the host, outputs as onnxruntime's
    from architectures import transformer_block
    path = tmp_path / "transformer.onnx"
    onnx.save(transformer_block(), str(path))
    calibration = np.random.default_rng(0).normal(0, 1, (48, 8, 32)).astype(np.float32)
    model = compile_model(path, batch=16, calibration=calibration, config=["array_size=16"])
    placed = rows(model)
    for name in ("q_mm", "k_mm", "v_mm", "proj_mm", "ffn1_mm", "ffn2_mm", "classifier"):
        assert placed[name].where == "TPU", (name, placed[name].note)
    for name in ("scores", "context"):
        assert placed[name].where == "host" and "two activations" in placed[name].note
    # the residual Add is quantized (its operands come from the TPU's nodes), and so is the
    # projection's bias Add before it (a per-channel constant: VADD.B), so both run on the
    # chip before the host's LayerNorm
    assert placed["residual1"].where == "TPU", placed["residual1"].note
    x = np.random.default_rng(1).normal(0, 1, (20, 8, 32)).astype(np.float32)
    (want,) = run_ort(onnx.load(str(model.reference_model)), {"x": x})
    for engine in ("emulator", "reference"):
        got = model.run(x, engine=engine)["y"]
        assert np.mean(got == want) >= 0.999, engine


@pytest.mark.parametrize("build, shape, on_tpu", [
    # (the pooling reads the host's residual Add: the quantizer keeps it in float there)
    ("inverted_residual", (16, 12, 12), ("expand", "dw", "project", "fc")),
    ("audio_classifier", (4, 64), ("conv1", "dwconv", "to_rows", "fc1", "fc2"))])
def test_float_architectures_through_the_quantizer(tmp_path, build, shape, on_tpu):
    # float models quantized by the pipeline: every Conv (depthwise, 1-D) and constant-weight
    # MatMul/Gemm on the array; outputs identical to onnxruntime on the QDQ model
    import architectures
    path = tmp_path / "net.onnx"
    onnx.save(getattr(architectures, build)(), str(path))
    calibration = np.random.default_rng(0).normal(0, 1, (48,) + shape).astype(np.float32)
    model = compile_model(path, batch=8, calibration=calibration, config=["array_size=16"])
    placed = rows(model)
    for name in on_tpu:
        assert placed[name].where == "TPU", (name, placed[name].note)
    assert "depthwise conv" in placed["dw" if "dw" in placed else "dwconv"].note
    x = np.random.default_rng(1).normal(0, 1, (20,) + shape).astype(np.float32)
    (want,) = run_ort(onnx.load(str(model.reference_model)), {"x": x})
    for engine in ("emulator", "reference"):
        assert np.mean(model.run(x, engine=engine)["y"] == want) >= 0.999, engine


# --- random shapes --------------------------------------------------------------------------

def _random_model(rng, seed):
    """A random chain over rows (MatMul + bias, lookups) or over a 1-D signal (Conv1d with
    random kernel, stride, padding or auto_pad, groups)."""
    if rng.random() < 0.5:
        lead = tuple(int(v) for v in rng.integers(1, 6, size=rng.integers(1, 3)))
        b = QDQBuilder(lead + (int(rng.integers(3, 40)),), seed=seed)
        b.quantize()
        for _ in range(rng.integers(1, 4)):
            b.matmul(int(rng.integers(2, 40)), rng.choice(["int32", None]))
            b.quantize()
            if rng.random() < 0.4:
                b.unary(str(rng.choice(["Relu", "Tanh", "Sigmoid"])))
                b.quantize()
        return b
    b = QDQBuilder((int(rng.integers(1, 20)), int(rng.integers(12, 90))), seed=seed)
    b.quantize()
    for _ in range(rng.integers(1, 3)):
        cin = b.value.shape[1]
        groups = int(rng.choice([d for d in (1, 2, 3, cin) if cin % d == 0]))
        k, s = int(rng.integers(1, 6)), int(rng.integers(1, 4))
        auto = str(rng.choice(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
        pads = [int(rng.integers(0, k)), int(rng.integers(0, k))]
        b.conv(groups * int(rng.integers(1, 5)), (k,), stride=s, groups=groups,
               pads=pads if auto == "NOTSET" else None,
               auto_pad=None if auto == "NOTSET" else auto)
        b.quantize()
    return b


@pytest.mark.parametrize("seed", range(4))
def test_random_rows_and_signals_against_onnxruntime(tmp_path, seed):
    rng = np.random.default_rng(seed)
    b = _random_model(rng, seed)
    m = b.model()
    batch = int(rng.integers(1, 9))
    model = compiled(tmp_path, m, batch=batch,
                     config=[f"array_size={rng.choice([8, 16])}", "acc_rows=64"])
    host = [r.node for r in model.report.rows if r.where == "host"
            and r.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert not host
    assert_matches(model, m, inputs(b, 2 * batch + 1), b.scale)


# --- an element-wise operator that would fix a layout a matrix operator cannot read --------

def test_a_lookup_that_would_lay_out_a_conv_s_input_goes_to_the_host(tmp_path):
    """x (N, 6, 5) -> Mul (x * x) -> Add -> Sqrt -> Conv1d, quantized by onnxruntime (Silero
    VAD's STFT magnitude and first Conv): the Sqrt lookup kept its input's (5, 6) rows and
    fixed that layout first, so the Conv, which reads the (6, 5) signal, went to the host.
    Now the Sqrt goes to the host instead, with the reason, and the host quantizes the
    magnitude in the Conv's layout."""
    from onnx import TensorProto as T
    from onnx import numpy_helper
    from onnx_models import quantized_by_onnxruntime
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (4, 6, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b")
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="power"),
             helper.make_node("Add", ["sq", "sq"], ["sum"], name="sum"),
             helper.make_node("Sqrt", ["sum"], ["mag"], name="magnitude"),
             helper.make_node("Conv", ["mag", "w", "b"], ["y"], name="conv", pads=[1, 1])]
    graph = helper.make_graph(nodes, "stft",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 6, 5])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4, 5])],
                              [w, b])
    float_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    float_model.ir_version = 8
    x = rng.normal(0, 1, (32, 6, 5)).astype(np.float32)
    path = quantized_by_onnxruntime(tmp_path, float_model, x)
    qdq = onnx.load(str(path))
    m = compile_model(path, batch=8)
    placed = rows(m)
    assert placed["conv"].where == "TPU"
    assert placed["magnitude"].where == "host" and "'conv' can read" in \
        placed["magnitude"].reason
    assert placed["sum"].where == "TPU" and m.report.tpu_macs == m.report.macs
    y_scale = float(numpy_helper.to_array(next(
        t for t in qdq.graph.initializer if t.name == "y_scale")))
    assert_matches(m, qdq, x[:16], y_scale)

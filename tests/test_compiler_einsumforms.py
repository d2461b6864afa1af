"""Einsums with a constant weight rewritten as MatMuls (front/einsumforms.py): the same
function as the float model for every kind of equation (onnxruntime's Einsum is the
oracle), the Transposes and Reshapes only where something moves, the kinds that stay with
their reason, and a model of Einsum layers compiled with every one of them on the TPU."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tpuasm.compiler import compile as tpu_compile
from tpuasm.compiler.front.einsumforms import rewrite_einsums
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.ort import session


def _model(equation: str, x_shape, w_shape, weight_first=False, seed=0):
    rng = np.random.default_rng(seed)
    weight = rng.normal(0, 0.5, w_shape).astype(np.float32)
    w = numpy_helper.from_array(weight, "w")
    operands = [weight, np.zeros(x_shape, np.float32)]
    y_shape = np.einsum(equation, *(operands if weight_first else operands[::-1])).shape
    inputs = ["w", "x"] if weight_first else ["x", "w"]
    node = helper.make_node("Einsum", inputs, ["y"], name="einsum", equation=equation)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                          list(x_shape))],
                              [helper.make_tensor_value_info("y", T.FLOAT, list(y_shape))],
                              [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# equation, x shape, w shape, weight first, the op types it becomes
REWRITTEN = [
    ("bld,dh->blh", (2, 5, 6), (6, 4), False, ["MatMul"]),                # Dense on a sequence
    ("abc,cde->abde", (2, 5, 6), (6, 3, 4), False, ["MatMul", "Reshape"]),  # query into heads
    ("abcd,cde->abe", (2, 5, 3, 4), (3, 4, 6), False, ["Reshape", "MatMul"]),  # heads out
    ("bd,ed->be", (3, 6), (4, 6), False, ["MatMul"]),                     # transposed weight
    ("ed,bd->be", (3, 6), (4, 6), True, ["MatMul"]),                      # weight first
    ("bld,dh->bhl", (2, 5, 6), (6, 4), False, ["MatMul", "Transpose"]),
    ("lbd,dh->blh", (5, 2, 6), (6, 4), False, ["MatMul", "Transpose"]),
    ("bdl,dh->blh", (2, 6, 5), (6, 4), False, ["Transpose", "MatMul"]),
    ("...d,dh->...h", (2, 3, 5, 6), (6, 4), False, ["MatMul"]),           # ellipsis
    ("bij,jk", (2, 5, 6), (6, 4), False, ["MatMul"]),                      # implicit output
    ("bd,dez->be", (3, 6), (6, 4, 2), False, ["MatMul"]),                 # z summed in W
    ("bd,d->b", (3, 6), (6,), False, ["MatMul", "Reshape"]),              # to a vector
    ("bld,dhk->bkhl", (2, 5, 6), (6, 3, 4), False, ["MatMul", "Reshape", "Transpose"]),
    # an index of the activation alone, contracted with the weight repeated along it:
    # jnp.einsum's pooled projection
    ("blhk,hkc->bc", (2, 5, 3, 4), (3, 4, 6), False, ["Reshape", "MatMul"]),
    ("bdz,de->be", (2, 6, 3), (6, 4), False, ["Reshape", "MatMul"]),
    # a weight per head (h in both operands and the output): one block-diagonal MatMul
    ("bhld,hdk->bhlk", (2, 3, 5, 4), (3, 4, 6), False,
     ["Transpose", "Reshape", "MatMul", "Reshape", "Transpose"]),
]


@pytest.mark.parametrize("equation, x_shape, w_shape, weight_first, ops", REWRITTEN,
                         ids=[c[0] for c in REWRITTEN])
def test_an_einsum_with_a_weight_is_a_matmul_with_its_answers(equation, x_shape, w_shape,
                                                               weight_first, ops):
    model = _model(equation, x_shape, w_shape, weight_first)
    x = np.random.default_rng(1).normal(0, 1, x_shape).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    prov = Provenance.of(model)
    assert rewrite_einsums(model, prov, {}) == 1
    assert [n.op_type for n in model.graph.node] == ops
    assert next(n for n in model.graph.node if n.op_type == "MatMul").name == "einsum"
    onnx.checker.check_model(model)
    got = session(model).run(None, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_weight_repeated_along_the_batch_is_a_broadcast():
    """XLNet's positional scores, "ibnd,jbnd->bnij" with its (j, b, n, d) operand folded to a
    constant once the batch is fixed: equal along b, so b is the activation's row, and the
    per-head n a block-diagonal MatMul."""
    rng = np.random.default_rng(6)
    per_position = rng.normal(0, 0.5, (7, 1, 2, 4)).astype(np.float32)
    model = _model("ibnd,jbnd->bnij", (5, 3, 2, 4), (7, 3, 2, 4))
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.ascontiguousarray(np.broadcast_to(per_position, (7, 3, 2, 4))), "w"))
    x = rng.normal(0, 1, (5, 3, 2, 4)).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    prov = Provenance.of(model)
    assert rewrite_einsums(model, prov, {}) == 1
    assert prov.own_work["einsum"] == (1, 2)       # the report counts the blocks' products
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul")
    w = numpy_helper.to_array(next(t for t in model.graph.initializer
                                   if t.name == matmul.input[1]))
    assert w.shape == (2 * 4, 2 * 7) and np.count_nonzero(w[:4, 7:]) == 0   # two blocks
    np.testing.assert_allclose(session(model).run(None, {"x": x})[0], want, rtol=1e-5,
                               atol=1e-5)


def test_a_block_diagonal_weight_past_the_limit_stays(monkeypatch):
    import tpuasm.compiler.front.einsumforms as einsumforms
    monkeypatch.setattr(einsumforms, "BLOCK_DIAGONAL_LIMIT", 100)
    model = _model("bhld,hdk->bhlk", (2, 3, 5, 4), (3, 4, 6))
    reasons: dict = {}
    assert rewrite_einsums(model, Provenance.of(model), reasons) == 0
    assert "block-diagonal weight would hold 216 values" in reasons["einsum"]


@pytest.mark.parametrize("equation, x_shape, w_shape, ops", [
    ("blhk,hkc->bc", (2, 5, 3, 4), (3, 4, 6), ["ReduceSum", "Reshape", "MatMul"]),
    ("bdz,de->be", (2, 6, 3), (6, 4), ["ReduceSum", "MatMul"]),
])
def test_a_weight_too_large_to_repeat_sums_the_activation_first(equation, x_shape, w_shape,
                                                                ops, monkeypatch):
    import tpuasm.compiler.front.einsumforms as einsumforms
    monkeypatch.setattr(einsumforms, "TILED_WEIGHT_LIMIT", 0)
    model = _model(equation, x_shape, w_shape)
    x = np.random.default_rng(1).normal(0, 1, x_shape).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    assert rewrite_einsums(model, Provenance.of(model), {}) == 1
    assert [n.op_type for n in model.graph.node] == ops
    np.testing.assert_allclose(session(model).run(None, {"x": x})[0], want, rtol=1e-5,
                               atol=1e-5)


KEPT = [
    ("bii,ij->bj", (2, 4, 4), (4, 3), "repeated"),
    ("bd,e->bde", (2, 6), (4,), "no contracted index"),
]


def test_an_equation_onnxruntime_refuses_is_left_to_its_error():
    """An output index in no operand: onnxruntime refuses the node; the rewrite leaves it
    with a reason instead of failing on it."""
    model = _model("bld,dh->blh", (2, 5, 6), (6, 4))
    model.graph.node[0].attribute[0].s = b"bld,dh->blz"
    reasons: dict = {}
    assert rewrite_einsums(model, Provenance.of(model), reasons) == 0
    assert "in no operand" in reasons["einsum"]


@pytest.mark.parametrize("equation, x_shape, w_shape, reason", KEPT, ids=[c[0] for c in KEPT])
def test_other_einsums_stay_with_their_reason(equation, x_shape, w_shape, reason):
    model = _model(equation, x_shape, w_shape)
    reasons: dict = {}
    assert rewrite_einsums(model, Provenance.of(model), reasons) == 0
    assert [n.op_type for n in model.graph.node] == ["Einsum"]
    assert reason in reasons["einsum"]


def _with_followers(equation, x_shape, w_shape, followers):
    """_model's Einsum followed by `followers`: (op, constant or None) applied in turn."""
    model = _model(equation, x_shape, w_shape)
    rng = np.random.default_rng(2)
    model.graph.node[0].output[0] = "e"
    for i, (op, const) in enumerate(followers):
        source = "e" if i == 0 else f"f{i - 1}"
        out = "y" if i == len(followers) - 1 else f"f{i}"
        inputs = [source]
        if const is not None:
            model.graph.initializer.append(numpy_helper.from_array(
                rng.normal(0, 1, const).astype(np.float32), f"c{i}"))
            inputs.append(f"c{i}")
        model.graph.node.append(helper.make_node(op, inputs, [out], name=f"{op.lower()}{i}"))
    onnx.checker.check_model(model)
    return model


HOISTED = [
    # EinsumDense("abc,cde->abde", bias_axes="de", activation="relu"): bias over the heads
    ("abc,cde->abde", (2, 5, 6), (6, 3, 4), [("Add", (3, 4)), ("Relu", None)],
     ["MatMul", "Add", "Relu", "Reshape"]),
    ("bld,dhk->bkhl", (2, 5, 6), (6, 3, 4), [("Mul", (4, 1, 1)), ("Sub", (4, 3, 1)),
                                             ("Tanh", None)],
     ["MatMul", "Mul", "Sub", "Tanh", "Reshape", "Transpose"]),
    # varies along l, a row axis: it stays after the layout, and so does what follows it
    ("bld,dh->bhl", (2, 5, 6), (6, 4), [("Add", (5,)), ("Relu", None)],
     ["MatMul", "Transpose", "Add", "Relu"]),
]


@pytest.mark.parametrize("equation, x_shape, w_shape, followers, ops", HOISTED,
                         ids=[c[0] for c in HOISTED])
def test_a_bias_and_activation_after_the_einsum_meet_its_matmul(equation, x_shape, w_shape,
                                                                followers, ops):
    """Moved before the output's Reshape / Transpose, so that the bias is fused and the
    activation's range is the MatMul's output's, as after a Dense."""
    model = _with_followers(equation, x_shape, w_shape, followers)
    x = np.random.default_rng(1).normal(0, 1, x_shape).astype(np.float32)
    want = session(model).run(None, {"x": x})[0]
    assert rewrite_einsums(model, Provenance.of(model), {}) == 1
    assert [n.op_type for n in model.graph.node] == ops
    onnx.checker.check_model(model)
    np.testing.assert_allclose(session(model).run(None, {"x": x})[0], want, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("equation, shapes, at", [
    ("bhlm,bmhk,hkd->bld", [(2, 4, 5, 5), (2, 5, 4, 3), (4, 3, 6)], 2),   # mix + project
    ("bi,ij,bj->b", [(3, 4), (4, 5), (3, 5)], 1),                          # bilinear form
], ids=["attention-output", "bilinear"])
def test_an_einsum_of_activations_and_a_weight_puts_the_weight_s_product_on_a_matmul(
        equation, shapes, at):
    rng = np.random.default_rng(4)
    names = [f"a{i}" for i in range(len(shapes))]
    names[at] = "w"
    inputs = [helper.make_tensor_value_info(n, T.FLOAT, list(s))
              for n, s in zip(names, shapes) if n != "w"]
    w = numpy_helper.from_array(rng.normal(0, 0.5, shapes[at]).astype(np.float32), "w")
    y_shape = np.einsum(equation, *[np.zeros(s) for s in shapes]).shape
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], name="einsum",
                                                equation=equation)], "g", inputs,
                              [helper.make_tensor_value_info("y", T.FLOAT, list(y_shape))], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {v.name: rng.normal(0, 1, shapes[names.index(v.name)]).astype(np.float32)
             for v in inputs}
    want = session(model).run(None, feeds)[0]
    assert rewrite_einsums(model, Provenance.of(model), {}) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops[0] == "Einsum" and "MatMul" in ops and ops.count("Einsum") == 1
    assert next(n for n in model.graph.node if n.op_type == "MatMul").name == "einsum"
    onnx.checker.check_model(model)
    np.testing.assert_allclose(session(model).run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_a_product_of_two_activations_is_not_touched():
    node = helper.make_node("Einsum", ["q", "k"], ["s"], name="scores",
                            equation="bqd,bkd->bqk")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, T.FLOAT, [2, 5, 4])
                                            for n in "qk"],
                              [helper.make_tensor_value_info("s", T.FLOAT, [2, 5, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    reasons: dict = {}
    assert rewrite_einsums(model, Provenance.of(model), reasons) == 0 and not reasons


def _einsum_network(rng):
    """x (N, 8, 12) -> "bld,dh->blh" (+ bias, Relu) -> "abc,cde->abde" into 2 heads of 8
    (+ a bias per head, Relu) -> "abcd,cde->abe" back to 10 -> mean over the sequence -> "bd,ed->be" to 4
    classes: every matrix product an Einsum, as torch.einsum and EinsumDense write them."""
    def init(name, *shape, scale=0.4):
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)
    inits = [init("w1", 12, 16), init("b1", 16, scale=0.1), init("w2", 16, 2, 8),
             init("b2", 2, 8, scale=0.1), init("w3", 2, 8, 10), init("w4", 4, 10)]
    nodes = [helper.make_node("Einsum", ["x", "w1"], ["h1"], name="dense", equation="bld,dh->blh"),
             helper.make_node("Add", ["h1", "b1"], ["h1b"], name="bias"),
             helper.make_node("Relu", ["h1b"], ["a1"], name="relu1"),
             helper.make_node("Einsum", ["a1", "w2"], ["q"], name="to_heads",
                              equation="abc,cde->abde"),
             helper.make_node("Add", ["q", "b2"], ["qb"], name="head_bias"),
             helper.make_node("Relu", ["qb"], ["a2"], name="relu2"),
             helper.make_node("Einsum", ["a2", "w3"], ["o"], name="from_heads",
                              equation="abcd,cde->abe"),
             helper.make_node("ReduceMean", ["o"], ["m"], name="pool", axes=[1], keepdims=0),
             helper.make_node("Einsum", ["w4", "m"], ["y"], name="classes",
                              equation="ed,bd->be")]
    graph = helper.make_graph(nodes, "einsums",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 8, 12])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_a_network_of_einsums_has_its_products_on_the_tpu(tmp_path):
    """Each Einsum was 'no TPU mapping' on the host: now each is a MatMul on the TPU, and
    the compiled network keeps the float model's top-1 on new rows."""
    rng = np.random.default_rng(3)
    model = _einsum_network(rng)
    path = tmp_path / "einsums.onnx"
    onnx.save(model, str(path))
    calib = rng.normal(0, 1, (128, 8, 12)).astype(np.float32)
    compiled = tpu_compile(str(path), batch=16, calibration=calib)
    where = {r.node: r.where for r in compiled.report.rows}
    assert all(where[n] == "TPU" for n in ("dense", "to_heads", "head_bias", "from_heads",
                                           "classes")), where
    new = rng.normal(0, 1, (256, 8, 12)).astype(np.float32)
    want = session(model).run(None, {"x": new})[0]
    got = compiled.run(new)["y"]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.97
    snr = 10 * np.log10(np.sum(want ** 2) / np.sum((got - want) ** 2))
    assert snr > 25, snr


def test_a_quantized_model_s_float_einsums_go_on_the_tpu_from_bounds(tmp_path):
    """onnxruntime's quantize_static leaves an Einsum float.  Compiled as shipped, each
    Einsum with a weight whose input is on a DequantizeLinear's grid (or a mean of a tensor
    of known range) is a MatMul on the TPU, quantized from bounds (qdqrecurrent.py): the
    outputs onnxruntime's on OUTDIR's own QDQ model, bit for bit, and the float model's
    answers kept as well as the shipped QDQ model keeps them.  The one over the float model
    input stays on the host with a reason naming --calibrate, which puts it on the TPU."""
    from onnx_models import quantized_by_onnxruntime
    rng = np.random.default_rng(5)
    calib = rng.normal(0, 1, (32, 8, 12)).astype(np.float32)
    float_model = _einsum_network(rng)
    path = quantized_by_onnxruntime(tmp_path, float_model, calib)
    shipped = tpu_compile(str(path), batch=16)
    rows = {r.node: r for r in shipped.report.rows}
    assert rows["dense"].where == "host" and "--calibrate" in rows["dense"].reason
    assert rows["dense"].macs
    for name in ("to_heads", "from_heads", "classes"):     # over a1, a2 and mean(o)
        assert rows[name].where == "TPU", (name, rows[name].reason)
    assert "Einsums with a weight" in shipped.report.source
    # int16 weights over the 8-bit a1 and a2 and over the int16 mean too: the accumulator
    # has room for each (bounds._wide_scale)
    compiled_qdq = onnx.load(str(shipped.reference_model))
    weight_bits = {init.name: init.data_type for init in compiled_qdq.graph.initializer}
    readers = {n.name: n for n in compiled_qdq.graph.node}
    wide = sorted(n for n, node in readers.items() if node.op_type == "DequantizeLinear"
                  and weight_bits.get(node.input[0]) == T.INT16)
    assert len(wide) == 3, wide
    new = rng.normal(0, 1, (256, 8, 12)).astype(np.float32)
    got = np.concatenate([shipped.run(new[i:i + 16])["y"] for i in range(0, 256, 16)])
    own = session(onnx.load(str(shipped.reference_model)))
    want = np.concatenate([own.run(None, {"x": new[i:i + 16]})[0]
                           for i in range(0, 256, 16)])
    np.testing.assert_array_equal(got, want)
    floats = session(float_model).run(None, {"x": new})[0]
    as_shipped = session(onnx.load(str(path))).run(None, {"x": new})[0]

    def snr(y):
        return 10 * np.log10(np.sum(floats ** 2) / np.sum((y - floats) ** 2))
    assert snr(got) > snr(as_shipped) - 4       # int8 weights where the model kept float
    assert np.mean(got.argmax(1) == floats.argmax(1)) >= \
        np.mean(as_shipped.argmax(1) == floats.argmax(1)) - 0.02
    calibrated = tpu_compile(str(path), batch=16, calibration=calib)
    assert {r.node: r.where for r in calibrated.report.rows}["dense"] == "TPU"


@pytest.mark.parametrize("quant_format", ["QDQ", "QOperator"])
def test_an_einsum_over_a_tensor_the_model_quantizes_for_another_reader(tmp_path,
                                                                        quant_format):
    """x -> Einsum "bld,dh->blh" -> + x (a residual Add, which onnxruntime quantizes) ->
    mean -> MatMul.  The QDQ model gives the Einsum x's DequantizeLinear; the QOperator
    model the float x beside QuantizeLinear(x) for its QLinearAdd: read on that grid, as
    the QDQ form reads it, the Einsum goes on the TPU in both."""
    from onnx_models import quantized_by_onnxruntime
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (12, 12)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.5, (12, 4)).astype(np.float32), "wc")]
    nodes = [helper.make_node("Einsum", ["x", "w"], ["e"], name="mix", equation="bld,dh->blh"),
             helper.make_node("Add", ["x", "e"], ["r"], name="residual"),
             helper.make_node("ReduceMean", ["r"], ["m"], name="pool", axes=[1], keepdims=0),
             helper.make_node("MatMul", ["m", "wc"], ["y"], name="classes")]
    graph = helper.make_graph(nodes, "residual_einsum",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 8, 12])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])], inits)
    float_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    float_model.ir_version = 8
    calib = rng.normal(0, 1, (64, 8, 12)).astype(np.float32)
    path = quantized_by_onnxruntime(tmp_path, float_model, calib, quant_format)
    assert "Einsum" in {n.op_type for n in onnx.load(str(path)).graph.node}
    compiled = tpu_compile(str(path), batch=16)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["mix"].where == "TPU", rows["mix"].reason
    new = rng.normal(0, 1, (128, 8, 12)).astype(np.float32)
    got = np.concatenate([compiled.run(new[i:i + 16])["y"] for i in range(0, 128, 16)])
    own = session(onnx.load(str(compiled.reference_model)))
    want = np.concatenate([own.run(None, {"x": new[i:i + 16]})[0] for i in range(0, 128, 16)])
    np.testing.assert_array_equal(got, want)
    floats = session(float_model).run(None, {"x": new})[0]
    shipped = session(onnx.load(str(path))).run(None, {"x": new})[0]

    def snr(y):
        return 10 * np.log10(np.sum(floats ** 2) / np.sum((y - floats) ** 2))
    assert snr(got) > snr(shipped) - 3, (snr(got), snr(shipped))


def test_per_head_weights_run_as_a_grouped_conv_that_skips_the_zero_blocks(tmp_path):
    """"bhld,hdk->bhlk" is a block-diagonal MatMul; the matcher finds its blocks and makes it
    a grouped 1x1 Conv (the array skips the zero tiles), its outputs onnxruntime's on the
    compiled model's own QDQ model."""
    from tpuasm.compiler.front.match import block_diagonal_groups
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (3, 4, 6)).astype(np.float32), "wh"),
             numpy_helper.from_array(rng.normal(0, 0.3, (3, 6, 4)).astype(np.float32), "wc")]
    nodes = [helper.make_node("Einsum", ["x", "wh"], ["h"], name="heads",
                              equation="bhld,hdk->bhlk"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Einsum", ["r", "wc"], ["y"], name="classes",
                              equation="bhlk,hkc->bc")]
    graph = helper.make_graph(nodes, "heads",
                              [helper.make_tensor_value_info("x", T.FLOAT, ["N", 3, 5, 4])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "heads.onnx"
    onnx.save(model, str(path))
    calib = rng.normal(0, 1, (64, 3, 5, 4)).astype(np.float32)
    compiled = tpu_compile(str(path), batch=16, calibration=calib)
    rows = {r.node: r for r in compiled.report.rows}
    assert rows["heads"].where == "TPU" and rows["classes"].where == "TPU"
    assert rows["heads"].macs == 16 * 3 * 5 * 4 * 6       # the blocks' products alone
    convs = [op for seg in compiled.segments for op in seg.operators
             if getattr(op, "name", "") == "heads"]
    assert convs and convs[0].groups == 3
    new = rng.normal(0, 1, (32, 3, 5, 4)).astype(np.float32)
    got = np.concatenate([compiled.run(new[i:i + 16])["y"] for i in (0, 16)])
    qdq = session(onnx.load(str(compiled.reference_model)))
    want = np.concatenate([qdq.run(None, {"x": new[i:i + 16]})[0] for i in (0, 16)])
    np.testing.assert_array_equal(got, want)
    assert block_diagonal_groups(np.ones((4, 6))) == 1


def test_a_bias_after_a_split_into_heads_meets_its_matmul():
    """tf2onnx's EinsumDense("abc,cde->abde", bias_axes="de", activation="relu"): MatMul,
    Reshape into heads, Add of a (d, e) bias, Relu.  The Add and Relu move before the
    Reshape (the bias flattened to the MatMul's N); a Reshape that does more than split the
    last axis keeps what follows it."""
    from tpuasm.compiler.front.einsumforms import hoist_past_head_splits
    rng = np.random.default_rng(9)

    def model(target):
        inits = [numpy_helper.from_array(rng.normal(0, 0.5, (6, 12)).astype(np.float32), "w"),
                 numpy_helper.from_array(np.asarray(target, np.int64), "shape"),
                 numpy_helper.from_array(rng.normal(0, 1, (3, 4)).astype(np.float32), "b")]
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                 helper.make_node("Reshape", ["m", "shape"], ["r"], name="heads"),
                 helper.make_node("Add", ["r", "b"], ["a"], name="bias"),
                 helper.make_node("Relu", ["a"], ["y"], name="relu")]
        out = [2, 5, 3, 4] if len(target) == 4 else [10, 3, 4]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT,
                                                                             [2, 5, 6])],
                                  [helper.make_tensor_value_info("y", T.FLOAT, out)], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    x = rng.normal(0, 1, (2, 5, 6)).astype(np.float32)
    split = model([2, 5, 3, 4])
    want = session(split).run(None, {"x": x})[0]
    assert hoist_past_head_splits(split) == 1
    assert [n.op_type for n in split.graph.node] == ["MatMul", "Add", "Relu", "Reshape"]
    onnx.checker.check_model(split)
    np.testing.assert_allclose(session(split).run(None, {"x": x})[0], want, rtol=1e-5,
                               atol=1e-5)
    merged = model([10, 3, 4])                  # the rows merged too: not a split of N alone
    assert hoist_past_head_splits(merged) == 0
    assert [n.op_type for n in merged.graph.node] == ["MatMul", "Reshape", "Add", "Relu"]

"""Activate's float requantization (spec/isa.md 5.5, `act_float = 1`): the machine computes
fl32(fl32(acc + bias) * f) rounded half to even, as onnxruntime's MLAS does, so compiled
QLinearConv / QGemm / QLinearMatMul layers are bit-identical to onnxruntime.

Oracles: hand-computed values and numpy's float32 arithmetic for the instruction (through the
emulator and the register-level reference model, which must agree); onnxruntime on the same
QOperator models for the compiler, on random shapes and scales and on accumulators chosen to
sit on near-ties, where the exact fixed point (act_float = 0) provably rounds the other way."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from onnx_models import const, model, qparams_inputs, run_ort, value_info
from test_isa_extensions import HEAD, N, host_image, params, run_both
from tpuasm.compiler.codegen import quant
from tpuasm.compiler.pipeline import compile_model

SMALL = ["array_size=16", "acc_rows=64"]
OUT = 9 + 16 + 64                       # the first row of ub.y in test_isa_extensions' HEAD


def f32_words(values) -> list[int]:
    return np.asarray(values, np.float32).view(np.uint32).astype(np.int64).tolist()


def mlas(acc, bias, f, zero, lo=-128, hi=127) -> np.ndarray:
    """MLAS's requantization in numpy float32: rint(f32(acc + bias) * f) + zero, clamped."""
    v = (np.asarray(acc, np.int64) + np.asarray(bias, np.int64)).astype(np.float32)
    return np.clip(np.rint(v * np.asarray(f, np.float32)).astype(np.int64) + zero, lo, hi)


# --- the instruction -----------------------------------------------------------------------

def test_float_mode_rounds_the_float32_product_where_the_exact_mode_does_not():
    # x = 2^24 + 1 (bias 2^24, acc 1) is not a float32: fl32(x) = 2^24, times 2^-25 = 0.5 -> 0
    # (half to even); the exact form rounds 0.50000003 -> 1.  Column 1: 3 * 0.5 = 1.5 -> 2;
    # column 2: 5 * 0.5 = 2.5 -> 2 (ties to even); column 3: -7 * 0.25 = -1.75 -> -2.
    bias = [1 << 24, 0, 0, 0]
    x = [[1, 3, 5, -7]]
    f = [2.0 ** -25, 0.5, 0.5, 0.25]
    exact = params(bias, [1, 1, 1, 1], [25, 1, 1, 2])
    as_float = params(bias, f32_words(f), [0] * N)
    src = HEAD + """
        CFG act_zero, 3
        ACT.P acc.a, ub.y, 1
        HLT
"""
    m, _ = run_both(src, host_image(x, exact))
    assert m.ub[OUT].view(np.int8).tolist() == [4, 5, 5, 1]
    m, _ = run_both(src.replace("ACT.P", "CFG act_float, 1\n        ACT.P"),
                    host_image(x, as_float))
    assert m.ub[OUT].view(np.int8).tolist() == [3, 5, 5, 1]
    assert (mlas([1, 3, 5, -7], bias, f, 3) == [3, 5, 5, 1]).all()


def test_float_mode_against_numpy_float32_on_random_accumulators_and_multipliers():
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (16, N))
    bias = rng.integers(-(1 << 30), 1 << 30, N)
    f = (rng.uniform(0.5, 1, N) * 2.0 ** rng.integers(-31, -20, N)).astype(np.float32)
    src = HEAD + """
        CFG act_float, 1
        CFG act_zero, -5
        CFG act_out, 2
        ACT.P acc.a, ub.y, 8
        HLT
"""
    m, _ = run_both(src, host_image(x, params(bias, f32_words(f), [0] * N)))
    low, high = m.ub[OUT:OUT + 16:2].astype(np.int64), m.ub[OUT + 1:OUT + 16:2].view(np.int8)
    got = low + 256 * high.astype(np.int64)                  # int16 rows: low, high bytes
    np.testing.assert_array_equal(got, mlas(x[:8], bias, f, -5, -32768, 32767))


def test_float_mode_average_takes_its_count_from_the_multiplier_and_saturates():
    # ACT.PA under act_float: the window's sum times f (no division by the count); an
    # infinite multiplier saturates (then int8's clip), 0 x inf (NaN) is 0
    x = [[1, 2, 0, -3], [2, 4, 0, -3], [4, 8, 0, -3], [5, 10, 0, -3]]
    f = [0.25, 1 / 8, np.inf, np.inf]
    src = HEAD + """
        CFG act_float, 1
        CFG pool_size, 2
        CFG pool_width, 2
        ACT.PA acc.a, ub.y, 4
        HLT
"""
    m, _ = run_both(src, host_image(x, params([0] * N, f32_words(f), [0] * N)))
    assert m.ub[OUT].view(np.int8).tolist() == [3, 3, 0, -128]   # 12/4 = 3, 24/8 = 3


# --- the compiler against onnxruntime -------------------------------------------------------

def compiled(tmp_path, m, batch):
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return compile_model(path, batch=batch, config=SMALL)


def assert_identical(compiled_model, m, x, y_scale):
    (want,) = run_ort(m, {"x": x})
    got = compiled_model.run(x)["y"]                       # the emulator
    diff = np.rint(np.abs(got.astype(np.float64) - want) / y_scale)
    assert got.shape == want.shape and not diff.any(), \
        f"{np.mean(diff == 0):.4%} identical, worst {diff.max()} LSB"


def _qlinear_conv(rng, cin, cout, kernel, stride, groups, scales):
    sx, sy = scales
    w = rng.integers(-127, 128, (cout, cin // groups, kernel, kernel)).astype(np.int8)
    inits = [*qparams_inputs("x", sx, int(rng.integers(0, 256)), False), const("w", w),
             const("w_scale", rng.uniform(0.001, 0.02, cout).astype(np.float32)),
             const("w_zp", np.zeros(cout, np.int8)),
             const("b", rng.integers(-2000, 2000, cout), np.int32),
             *qparams_inputs("y", sy, int(rng.integers(0, 256)), False)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q"),
             helper.make_node("QLinearConv", ["xq", "x_scale", "x_zp", "w", "w_scale", "w_zp",
                                              "y_scale", "y_zp", "b"], ["yq"], name="conv",
                              kernel_shape=[kernel] * 2, strides=[stride] * 2,
                              pads=[kernel // 2] * 4, group=groups),
             helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["y"], name="dq")]
    side = 9
    out = (side + 2 * (kernel // 2) - kernel) // stride + 1
    return model(nodes, [value_info("x", np.float32, ("N", cin, side, side))],
                 [value_info("y", np.float32, ("N", cout, out, out))], inits), (cin, side, side)


@pytest.mark.parametrize("seed, cin, cout, kernel, stride, groups", [
    (0, 3, 20, 3, 1, 1), (1, 24, 24, 3, 2, 24), (2, 40, 18, 1, 1, 1), (3, 8, 16, 3, 1, 2)])
def test_qlinear_conv_is_bit_identical_to_onnxruntime(tmp_path, seed, cin, cout, kernel,
                                                      stride, groups):
    rng = np.random.default_rng(seed)
    scales = (rng.uniform(0.005, 0.05), rng.uniform(0.02, 0.3))
    m, shape = _qlinear_conv(rng, cin, cout, kernel, stride, groups, scales)
    model_ = compiled(tmp_path, m, batch=4)
    assert {r.node: r.where for r in model_.report.rows}["conv"] == "TPU"
    x = rng.normal(0, 1.5, (9, *shape)).astype(np.float32)
    assert_identical(model_, m, x, scales[1])


def _matrix(rng, op, k, n, w, x_scale, w_scale, y_scale, x_zp=0, y_zp=0, bias=None):
    inits = [*qparams_inputs("x", x_scale, x_zp, False), const("w", w),
             const("w_scale", np.asarray(w_scale, np.float32)),
             const("w_zp", np.zeros(n, np.int8)), *qparams_inputs("y", y_scale, y_zp, False)]
    names = ["xq", "x_scale", "x_zp", "w", "w_scale", "w_zp"]
    if op == "QGemm":
        inits.append(const("b", bias if bias is not None else np.zeros(n), np.int32))
        node = helper.make_node("QGemm", names + ["b", "y_scale", "y_zp"], ["yq"], name="fc",
                                domain="com.microsoft")
    else:
        node = helper.make_node("QLinearMatMul", names + ["y_scale", "y_zp"], ["yq"], name="fc")
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q"),
             node, helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zp"], ["y"],
                                    name="dq")]
    return model(nodes, [value_info("x", np.float32, ("N", k))],
                 [value_info("y", np.float32, ("N", n))], inits, ms_domain=op == "QGemm")


@pytest.mark.parametrize("op, seed, k, n", [("QGemm", 0, 70, 21), ("QGemm", 1, 300, 5),
                                            ("QLinearMatMul", 2, 33, 40)])
def test_qgemm_and_qlinear_matmul_are_bit_identical_to_onnxruntime(tmp_path, op, seed, k, n):
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    x_scale, y_scale = rng.uniform(0.005, 0.05), rng.uniform(0.05, 0.5)
    m = _matrix(rng, op, k, n, w, x_scale, rng.uniform(0.001, 0.02, n), y_scale,
                int(rng.integers(0, 256)), int(rng.integers(0, 256)),
                rng.integers(-5000, 5000, n) if op == "QGemm" else None)
    model_ = compiled(tmp_path, m, batch=6)
    assert {r.node: r.where for r in model_.report.rows}["fc"] == "TPU"
    x = rng.normal(0, 1.5, (40, k)).astype(np.float32)
    assert_identical(model_, m, x, y_scale)


def _near_tie_scales(candidates, accs):
    """Weight scales w (x.scale = 1) whose multiplier w / y.scale puts some of `accs` on a
    near-tie: the exact product rounds one way, MLAS's float32 product the other."""
    found = []
    for w in candidates:
        f = np.float32(w) / np.float32(1.0)          # (x.scale * w) / y.scale, x = y = 1
        exact = _exact_rounding(accs, *quant.fixed_point(float(f)))
        if np.any(exact != np.rint(accs.astype(np.float32) * f).astype(np.int64)):
            found.append(np.float32(w))
    return found


def test_near_ties_where_the_exact_form_differs_are_identical_to_onnxruntime(tmp_path):
    # acc = x0 * 1 + x1 * 127 reaches every value 0..32639 (x uint8, zero point 0, scale 1);
    # the weight scales are picked so that each column's multiplier leaves some accumulator
    # on a near-tie, where the exact fixed point rounds away from onnxruntime
    accs = np.arange(0, 127 * 257, dtype=np.int64)
    accs = accs[(accs % 127 <= 255) & (accs // 127 <= 255)]
    rng = np.random.default_rng(9)
    candidates = rng.uniform(0.9, 1.0, 4000) * 255 / 32639
    scales = _near_tie_scales(candidates, accs)[:6]
    assert len(scales) == 6
    n = len(scales)
    # the rows: every near-tie accumulator of any column, and 200 others
    exact = np.stack([_exact_rounding(accs, *quant.fixed_point(float(s))) for s in scales], 1)
    floats = np.stack([np.rint(accs.astype(np.float32) * s) for s in scales], 1)
    ties = np.any(exact != floats, axis=1)
    rows = np.sort(np.concatenate([accs[ties], rng.choice(accs[~ties], 200, replace=False)]))
    w = np.tile(np.array([[1], [127]], np.int8), (1, n))
    m = _matrix(rng, "QGemm", 2, n, w, 1.0, scales, 1.0)
    model_ = compiled(tmp_path, m, batch=32)
    x = np.stack([rows % 127, rows // 127], axis=1).astype(np.float32)
    (want,) = run_ort(m, {"x": x})
    exact = np.stack([_exact_rounding(rows, *quant.fixed_point(float(s))) for s in scales], 1)
    assert np.sum(np.clip(exact, 0, 255) != want) >= 6, "onnxruntime rounds these like the " \
        "exact form: no near-tie, the test would prove nothing"
    np.testing.assert_array_equal(model_.run(x)["y"], want)


def _exact_rounding(accs: np.ndarray, mult: int, shift: int) -> np.ndarray:
    """round_half_even(acc * mult / 2^shift) in exact integers (the act_float = 0 form)."""
    q, r = np.divmod(np.asarray(accs, np.int64) * mult, np.int64(1) << shift)
    half = np.int64(1) << (shift - 1)
    return q + ((r > half) | ((r == half) & (q % 2 == 1)))


def test_act_float_comes_from_the_table_to_the_assembler_disassembler_and_hover():
    from tpuasm.assembler import assemble
    from tpuasm.disassembler import disassemble
    from tpuasm.errors import TpuasmError
    from tpuasm.lsp.hover import register
    program = assemble("CFG act_float, 1\nHLT\n")
    assert program.instructions[0].operands == {"reg": 31, "value": 1}
    assert disassemble(program).splitlines()[0].split() == ["CFG", "act_float,", "1"]
    with pytest.raises(TpuasmError):
        assemble("CFG act_float, 2\nHLT\n")               # range 0 .. 1
    text = register("act_float")
    assert "configuration register 31" in text and "float32" in text and "reset 0" in text


@pytest.mark.parametrize("seed, side", [(0, 5), (1, 4)])
def test_conv_relu_global_average_pool_chain_is_bit_identical(tmp_path, seed, side):
    # QDQ conv -> Relu -> GlobalAveragePool (ACT.PA with the float32 multiplier
    # x.scale / (y.scale * count), MLAS's QLinearGlobalAveragePool) -> conv
    from qdq_builder import QDQBuilder
    b = QDQBuilder((3, side, side), seed=seed)
    b.quantize()
    b.conv(24, (3, 3), pads=[1, 1, 1, 1], name="conv")
    b.unary("Relu")
    b.quantize()
    b.unary("GlobalAveragePool", name="gap")
    b.quantize()
    b.conv(10, (1, 1), name="head")
    m = b.model()
    model_ = compiled(tmp_path, m, batch=8)
    placed = {r.node: r.where for r in model_.report.rows}
    assert placed["gap"] == "TPU" and placed["head"] == "TPU"
    x = np.random.default_rng(seed + 10).normal(0, 1.2, (50, 3, side, side)).astype(np.float32)
    assert_identical(model_, m, x, b.scale)


def test_global_average_pool_near_ties_are_identical_to_onnxruntime(tmp_path):
    # x quantized with scale 1: a 3x3 window's sum s takes every value 0..2295.  The output
    # scale is picked so that some s lie on a near-tie between MLAS's float32 multiplier
    # x.scale / (y.scale * 9) and the exact s * (x.scale / y.scale) / 9
    from qdq_builder import QDQBuilder
    sums = np.arange(0, 9 * 255 + 1)
    rng = np.random.default_rng(2)
    for y_scale in rng.uniform(0.995, 1.0, 20000).astype(np.float32):   # s / 9 / y <= 255
        f = np.float32(1.0) / (y_scale * np.float32(9))
        floats = np.rint(sums.astype(np.float32) * f)
        mult, shift = quant.fixed_point(float(np.float32(1) / y_scale))
        q, r = np.divmod(sums * mult, np.int64(9) << shift)          # / (9 * 2^shift)
        exact = q + ((2 * r > (9 << shift)) | ((2 * r == (9 << shift)) & (q % 2 == 1)))
        if np.any((floats != exact) & (exact <= 255)):
            break
    else:
        pytest.fail("no output scale with near-ties among the candidates")
    b = QDQBuilder((1, 3, 3), seed=0)
    scale, zero = b._const(np.float32(1.0), "scale"), b._const(np.uint8(0), "zp")
    q = b.node("QuantizeLinear", ["x", scale, zero])
    b.current = b.node("DequantizeLinear", [q, scale, zero])
    b.unary("GlobalAveragePool", name="gap")
    ys, yz = b._const(np.float32(y_scale), "scale"), b._const(np.uint8(0), "zp")
    b.nodes += [helper.make_node("QuantizeLinear", [b.current, ys, yz], ["yq"], name="y_q"),
                helper.make_node("DequantizeLinear", ["yq", ys, yz], ["y"], name="y_dq")]
    m = model(b.nodes, [value_info("x", np.float32, ("N", 1, 3, 3))],
              [value_info("y", np.float32, ("N", 1, 1, 1))], b.inits)
    model_ = compiled(tmp_path, m, batch=32)
    assert {r.node: r.where for r in model_.report.rows}["gap"] == "TPU"
    x = (sums // 9 + (np.arange(9)[:, None] < sums % 9)).T.reshape(-1, 1, 3, 3)
    x = x.astype(np.float32)
    assert (x.reshape(len(x), -1).sum(1) == sums).all() and x.max() <= 255
    (want,) = run_ort(m, {"x": x})
    assert np.any(np.rint(want.ravel() / y_scale) != np.minimum(exact, 255)), \
        "onnxruntime rounds like the exact form here: the test would prove nothing"
    np.testing.assert_array_equal(model_.run(x)["y"], want)

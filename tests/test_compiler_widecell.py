"""An LSTM's or GRU's gate arithmetic on the chip at 16 bits (issue 20): with
--activation-bits 16 the cell state chain c = f*c + i*g, its sums and products, and the gate
pre-activations are int16 tensors that VADD / VMUL read and write with X, Y, Z
(spec/isa.md 5.11), and the Tanh / Sigmoid tables read them through onnxruntime's `convert`
to 8 bits over the range where the function still changes (front/widen.py).

Oracles: tables of which tensors may be int16 and why not, worked by hand on a small graph;
the index range from tanh's and the logistic's own inverse; reference.py's table lookup of
an int16 input against a hand computation; the corpus LSTM and GRU classifiers
(tests/real_models.py) compiled and run from the CLI against onnxruntime on the float model
and on the QDQ model the compile wrote (its int16 Add / Mul are float32 QDQ nodes, which
the chip computes exactly: equal but for rounding near-ties)."""
from __future__ import annotations

import json
import math
import re
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from real_models import BUILDERS, compile_and_infer, qdq_agreement, run, top1_agreement
from tpuasm.compiler.codegen.lower import vector_flags
from tpuasm.compiler.front import widen
from tpuasm.compiler.ir import Elementwise, Lookup, QParams, Tensor
from tpuasm.compiler.reference import lookup


# --- which tensors may be int16 ------------------------------------------------------------

def cell_graph() -> onnx.ModelProto:
    """x -> four Gemms; s = Sigmoid(g1), t = Tanh(g2), p = s * t, q = p + g3, r = Tanh(q),
    y = Gemm(r); k = g4 * 2 (a constant operand); m = Relu(g5) (fused into its Gemm)."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def gemm(x, out, k):
        w = f"{out}_w"
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (k, 16)).astype(np.float32), w))
        nodes.append(helper.make_node("Gemm", [x, w], [out], name=out))

    for g in ("g1", "g2", "g3", "g4", "g5"):
        gemm("x", g, 8)
    inits.append(numpy_helper.from_array(np.float32(2.0), "two"))
    nodes += [helper.make_node("Sigmoid", ["g1"], ["s"], name="s"),
              helper.make_node("Tanh", ["g2"], ["t"], name="t"),
              helper.make_node("Mul", ["s", "t"], ["p"], name="p"),
              helper.make_node("Add", ["p", "g3"], ["q"], name="q"),
              helper.make_node("Tanh", ["q"], ["r"], name="r"),
              helper.make_node("Mul", ["g4", "two"], ["k"], name="k"),
              helper.make_node("Relu", ["g5"], ["m"], name="m")]
    gemm("r", "y", 16)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 16]) for n in ("y", "k", "m")]
    graph = helper.make_graph(nodes, "cell", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 8])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model)


def test_vector_operands_and_saturating_tables_may_be_int16_constants_and_clamps_not():
    model = cell_graph()
    chosen = {n.name for n in model.graph.node}
    groups, refusals = widen.eligible(model, chosen)
    # VADD / VMUL of two activations read and write int16 (X, Y, Z); Gemm outputs read by
    # them or by a Tanh / Sigmoid table (through the 8-bit convert) too
    # (and a Relu fused into a Gemm: its Activate clamps and writes int16)
    assert {"p", "q", "g1", "g2", "g3", "x", "m"} <= set(groups)
    # a lookup writes bytes; a constant operand is B's one row of bytes
    assert "made by Sigmoid" in refusals["s"] and "made by Tanh" in refusals["t"]
    assert "made by Tanh" in refusals["r"]
    assert "read by Mul 'k'" in refusals["g4"]
    assert widen.converted(model, groups, chosen) == {"g1": ["s"], "g2": ["t"], "q": ["r"]}


def test_image_tensors_keep_their_8_bit_vector_forms():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])
    w = numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], name="conv"),
             helper.make_node("Add", ["a", "x"], ["y"], name="add")]
    model = onnx.shape_inference.infer_shapes(helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], [w]),
        opset_imports=[helper.make_opsetid("", 17)]))
    groups, refusals = widen.eligible(model, {"conv", "add"})
    assert "a" not in groups and "read by Add 'add'" in refusals["a"]


# --- the 8-bit index a table reads ----------------------------------------------------------

def one_function(op: str) -> onnx.ModelProto:
    node = helper.make_node(op, ["c"], ["f"], name="f")
    return helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("f", TensorProto.FLOAT, [1])]))


def test_the_index_range_stops_where_the_output_stops_changing():
    grid = 16 / 4096                             # index_range's grid over (-8, 8)
    # tanh's output over (-1, 1) in 255 steps: from 1 - 1/255 on it reads as 1
    edge = math.atanh(1 - 1 / 255)               # 3.116
    low, high = widen.index_range(one_function("Tanh"), ["f"], -8.0, 8.0, {"f": (-1.0, 1.0)})
    assert abs(high - edge) <= 2 * grid and abs(low + edge) <= 2 * grid
    # the logistic over (0, 1): saturated below ln(1/509) and above ln(509) (6.23)
    low, high = widen.index_range(one_function("Sigmoid"), ["f"], -4.0, 10.0,
                                  {"f": (0.0, 1.0)})
    assert low == -4.0 and abs(high - math.log(509)) <= 2 * 14 / 4096
    # a range where tanh never saturates, or a function that is not Tanh / Sigmoid: whole
    assert widen.index_range(one_function("Tanh"), ["f"], -1.0, 1.0,
                             {"f": (-1.0, 1.0)}) == (-1.0, 1.0)
    assert widen.index_range(one_function("Erf"), ["f"], -8.0, 8.0,
                             {"f": (-1.0, 1.0)}) == (-8.0, 8.0)


def test_a_table_of_an_int16_input_reads_its_8_bit_requantization():
    wide = QParams(0.001, -7, True, 16)
    index = QParams(0.02, 128, False)
    out = QParams(1.0, 0, False)
    table = np.arange(256)[::-1].astype(np.uint8)          # 255 - byte: any table will do
    op = Lookup("t", Tensor("c", (3,), wide), Tensor("y", (3,), out), table, "tanh",
                index=index)
    x = np.array([[-32768, -7, 32767], [993, -1007, 12]], np.int16)
    real = (x.astype(np.float64) + 7) * 0.001
    byte = np.clip(np.rint(real / 0.02) + 128, 0, 255).astype(np.int64)
    assert np.array_equal(lookup(op, x), 255 - byte)


def test_vector_flags_name_each_16_bit_operand_and_the_8_bit_ones_signedness():
    u8, i8, i16 = QParams(0.1, 3, False), QParams(0.1, 0, True), QParams(0.001, 0, True, 16)

    def op(a, b, c, **kw):
        return Elementwise("e", Tensor("a", (4,), a), None if b is None else
                           Tensor("b", (4,), b), Tensor("c", (4,), c), **kw)

    assert vector_flags(op(u8, i16, i16, op="mul"), False, False) == "UYZ"   # f * c
    assert vector_flags(op(i16, i16, i16), False, False) == "XYZ"            # f*c + i*g
    assert vector_flags(op(i8, i8, i16), False, False) == "Z"
    constant = op(i16, None, u8, constant=np.zeros(1), constant_quant=QParams(1.0, 0, False))
    assert vector_flags(constant, True, True) == "UBLX"                      # tanh(c)


# --- the corpus recurrent classifiers, from the CLI -----------------------------------------

@cache
def compiled(name: str, work: Path, *extra: str):
    return compile_and_infer(BUILDERS[name](), work, *extra)


def float_snr(outcome) -> float:
    m = outcome.model
    names = [o.name for o in m.reference.graph.output]
    want = run(m.reference, m.evaluation)[names.index(m.output)].astype(np.float64)
    got = outcome.outputs[m.output].astype(np.float64)
    return 10 * np.log10((want ** 2).sum() / ((want - got) ** 2).sum())


def vector_instructions(outdir: Path) -> set[str]:
    found = set()
    for tasm in outdir.glob("*.tasm"):
        found |= set(re.findall(r"^\s*(V(?:ADD|MUL)(?:\.[A-Z]+)?)\b", tasm.read_text(), re.M))
    return found


@pytest.mark.parametrize("name, instructions", [
    # f * c, the new c, tanh(c) and each gate's table of its int16 pre-activation
    ("lstm_classifier", {"VMUL.UYZ", "VADD.XYZ", "VADD.UBLX"}),
    ("gru_classifier", {"VMUL.UYZ", "VADD.XYZ", "VADD.UBLX"})])
def test_the_cell_arithmetic_runs_on_the_chip_at_16_bits_closer_to_float(
        tmp_path_factory, name, instructions):
    narrow = compiled(name, tmp_path_factory.mktemp(name), "--calibration-method", "minmax")
    wide = compiled(name, tmp_path_factory.mktemp(name + "16"), "--activation-bits", "16")
    for outcome in (narrow, wide):
        assert outcome.failure is None, outcome.failure
    assert instructions <= vector_instructions(wide.outdir)
    assert not {i for i in vector_instructions(narrow.outdir) if re.search(r"[XYZ]", i)}
    report = json.loads((wide.outdir / "report.json").read_text())
    cell = [r for r in report["compiled_nodes"]
            if r["op_type"] in ("Add", "Sub", "Mul", "Tanh", "Sigmoid")]
    assert cell and all(r["where"] == "TPU" for r in cell), \
        [(r["node"], r["reason"]) for r in cell if r["where"] != "TPU"]
    # closer to the float model than 8 bits, and its top-1 kept
    assert float_snr(wide) >= float_snr(narrow) + 2.0, (float_snr(wide), float_snr(narrow))
    assert top1_agreement(wide) >= 0.99
    # onnxruntime computes the QDQ model's int16 Add / Mul in float32 and rounds, the chip
    # exactly: rounding near-ties, a few int16 steps after ten recurrent steps at most
    for out, (same, worst) in qdq_agreement(wide).items():
        assert same >= 0.98, f"{out}: {same:.2%} identical"
        assert worst <= 4 + 1e-2, f"{out}: {worst:.2f} int16 steps apart"


@pytest.mark.parametrize("name", ["lstm_classifier", "gru_classifier"])
def test_auto_tries_the_16_bit_cell_when_8_bits_meet_the_bar_and_keeps_it_for_its_snr(
        tmp_path_factory, name):
    """On 300 check rows both 8-bit and int16 keep top-1; the SNR says which is closer."""
    auto = compiled(name, tmp_path_factory.mktemp(name + "auto"))
    narrow = compiled(name, tmp_path_factory.mktemp(name), "--calibration-method", "minmax")
    assert auto.failure is None, auto.failure
    source = auto.report()["source"]
    assert "a recurrent cell carries its rounding from step to step" in source, source
    assert {i for i in vector_instructions(auto.outdir) if "Z" in i}
    assert float_snr(auto) >= float_snr(narrow) + 2.0
    assert top1_agreement(auto) >= 0.99


def test_the_recurrent_step_is_for_nodes_of_a_recurrent_node_of_the_users_model():
    from tpuasm.compiler.front.provenance import Provenance
    from tpuasm.compiler.runtime.calibsearch import _recurrent
    prov = Provenance([("lstm", "LSTM"), ("loop", "Loop"), ("fc", "Gemm")],
                      {"lstm/t0/i_x": "lstm", "loop/i3/MatMul": "loop"})
    assert _recurrent(prov, ["fc", "lstm/t0/i_x"])
    assert _recurrent(prov, ["loop/i3/MatMul"])
    assert not _recurrent(prov, ["fc", "added/glue"]) and not _recurrent(None, ["fc"])


def test_long_int16_vector_runs_repeat_one_width_and_split_mixed_widths(tmp_path):
    """More vectors than one VADD's length field (4,095): an all-int16 VADD.XYZ walks them
    with `repeat` (its stride two rows a vector), a VMUL of a uint8 and an int16 operand one
    instruction per 4,095 vectors (the stride would move both alike), each operand at its
    own row offset.  Every row against the same program in one instruction a tensor, and
    reference.py (the compile's own check reads the first 8 samples only)."""
    from tpuasm.compiler import compile as tpu_compile
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, shape).astype(np.float32), name)
             for name, shape in (("w1", (8, 64)), ("w2", (8, 64)), ("w3", (64, 4)))]
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["g1"], name="g1"),
             helper.make_node("Gemm", ["x", "w2"], ["g2"], name="g2"),
             helper.make_node("Sigmoid", ["g1"], ["s"], name="s"),
             helper.make_node("Mul", ["s", "g2"], ["p"], name="p"),
             helper.make_node("Add", ["p", "g2"], ["q"], name="q"),
             helper.make_node("Gemm", ["q", "w3"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "long", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 4])], inits)
    path = tmp_path / "long.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(path))
    x = rng.normal(0, 1, (1024, 8)).astype(np.float32)
    # a 4-wide array: 64 channels are 16 chunks, 16,384 vectors a tensor
    compiled = tpu_compile(path, batch=1024, calibration=x[:256], calibration_method="minmax",
                           activation_bits=16, validate=False,
                           config={"array_size": 4, "ub_rows": 393216})
    source = "\n".join(step.program.source for step in compiled.steps
                       if getattr(step, "program", None) is not None)
    lines = [line.split(";")[0].split() for line in source.splitlines()]
    adds = [" ".join(w) for w in lines if w and w[0] == "VADD.XYZ"]
    muls = [" ".join(w) for w in lines if w and w[0] == "VMUL.UYZ"]
    # 4 x 4,095 vectors by repeat (rep_ub_stride 8,190 rows), the last 4 after them
    assert len(adds) == 2 and adds[0].endswith(", 4095, repeat=4"), adds
    assert adds[1].count("+ 32760") == 3 and adds[1].endswith(", 4"), adds
    assert "CFG rep_ub_stride, 8190" in source
    # A (uint8 s) one row a vector, B and C (int16) two: five instructions, no repeat
    assert len(muls) == 5 and not any("repeat" in m for m in muls), muls
    assert "+ 4095," in muls[1] and muls[1].count("+ 8190") == 2, muls[1]
    assert "+ 16380," in muls[4] and muls[4].count("+ 32760") == 2, muls[4]
    got = compiled.run({"x": x}, engine="emulator")["y"]
    # the same arithmetic in one instruction a tensor (a 64-wide array: 1,024 vectors)
    whole = tpu_compile(path, batch=1024, calibration=x[:256], calibration_method="minmax",
                        activation_bits=16, validate=False, config={"array_size": 64})
    assert np.array_equal(got, whole.run({"x": x}, engine="emulator")["y"])
    # and reference.py's float32 arithmetic: equal but for int16 near-ties
    want = compiled.run({"x": x}, engine="reference")["y"]
    assert np.mean(got == want) >= 0.99


@pytest.mark.parametrize("relu", [False, True])
def test_an_int16_qdq_add_runs_on_the_chip_unless_a_clamp_follows_it(tmp_path, relu):
    """A QDQ model written with int16 tensors (opset 21), not by this compiler: its Add of
    two activations is a VADD.XYZ equal to onnxruntime on it but for near-ties; a Relu
    fused after it would be a clamp table on an int16 output (no L with Z): the host, and
    the report says why."""
    from tpuasm.compiler import compile as tpu_compile
    from tpuasm.compiler.ort import session

    def const(name, value, dtype):
        return numpy_helper.from_array(np.asarray(value, dtype), name)
    last = "r" if relu else "a"
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("QuantizeLinear", ["x", "s3", "z"], ["wq"], name="qw"),
             helper.make_node("DequantizeLinear", ["wq", "s3", "z"], ["wd"], name="dqw"),
             helper.make_node("Add", ["xd", "wd"], ["a"], name="add"),
             *([helper.make_node("Relu", ["a"], ["r"], name="relu")] if relu else []),
             helper.make_node("QuantizeLinear", [last, "s2", "z"], ["aq"], name="qa"),
             helper.make_node("DequantizeLinear", ["aq", "s2", "z"], ["ad"], name="dqa"),
             # a MatMul after it (int8 weights, 8-bit output), so the Add is not alone
             # between host nodes
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], name="dqweight"),
             helper.make_node("MatMul", ["ad", "wf"], ["m"], name="fc"),
             helper.make_node("QuantizeLinear", ["m", "s4", "z8"], ["mq"], name="qm"),
             helper.make_node("DequantizeLinear", ["mq", "s4", "z8"], ["y"], name="dqm")]
    weight = np.random.default_rng(2).integers(-127, 128, (8, 4)).astype(np.int8)
    graph = helper.make_graph(
        nodes, "add16", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [const("s", 0.001, np.float32), const("s3", 0.0007, np.float32),
         const("s2", 0.002, np.float32), const("z", 0, np.int16), const("w", weight, np.int8),
         const("ws", 0.01, np.float32), const("s4", 0.5, np.float32),
         const("z8", 128, np.uint8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = tmp_path / "add16.onnx"
    onnx.save(model, str(path))
    compiled = tpu_compile(path, batch=16)
    row = {r.node: r for r in compiled.report.rows}["add"]
    if relu:
        assert row.where == "host" and "a fused relu on an int16 output" in row.note
        return
    assert row.where == "TPU", row.note
    source = "\n".join(step.program.source for step in compiled.steps
                       if getattr(step, "program", None) is not None)
    assert "VADD.XYZ" in source
    x = np.random.default_rng(3).uniform(-20, 20, (16, 8)).astype(np.float32)
    got = compiled.run({"x": x}, engine="emulator")["y"]
    (want,) = session(model).run(["y"], {"x": x})
    assert np.mean(got == want) >= 0.99 and np.abs(got - want).max() <= 0.5 * 1.001

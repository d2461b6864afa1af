"""The compile report: one row per node of the input model (aggregated through a
Provenance), whole names, each segment's cycles and utilisation, the network's MACs and
their share on the TPU, warnings as data, a validation rendered when present.

Oracles: Provenances and compiled rows built by hand; MACs computed by hand from the shapes;
segment cycles from a full (not timing-only) emulator run of the same program."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper

import float_models
from onnx_models import const, model, value_info
from tpuasm.compiler import load
from tpuasm.compiler.cli import compile_main
from tpuasm.compiler.front.graph import Node
from tpuasm.compiler.front.macs import node_macs
from tpuasm.compiler.pipeline import compile_model
from tpuasm.compiler.front.provenance import Provenance
from tpuasm.compiler.report import (CompileReport, NodeRow, input_rows, mac_warnings)
from tpuasm.compiler.runtime.steps import TpuStep


# --- aggregation through a Provenance (built by hand) ----------------------------------

def _unrolled_lstm():
    """An LSTM of 2 steps unrolled into 8 gate MatMuls (on the TPU) and their gate arithmetic
    (on the host), a Gemm after it, quantization glue around; a BatchNormalization folded."""
    prov = Provenance([("conv", "Conv"), ("bn", "BatchNormalization"), ("lstm", "LSTM"),
                       ("fc", "Gemm")])
    rows = [NodeRow("conv", "Conv", "TPU", "segment0", "Conv ...", 100),
            NodeRow("x_QuantizeLinear", "QuantizeLinear", "host", "host0", "glue")]
    for t in range(2):
        for gate in "ifco":
            name = f"lstm/t{t}/{gate}/MatMul"
            prov.derive(name, "lstm")
            rows.append(NodeRow(name, "MatMul", "TPU", "segment0", "Dense 4x4", 1000))
        for k, op in enumerate(("Sigmoid", "Sigmoid", "Tanh", "Mul", "Mul", "Add")):
            name = f"lstm/t{t}/{op}_{k}"
            prov.derive(name, f"lstm/t{t}/i/MatMul")        # derived from a derived node
            rows.append(NodeRow(name, op, "host", "host1", f"{op} has no TPU mapping"))
    rows.append(NodeRow("fc", "Gemm", "host", "host1", "no TPU mapping", 50))
    prov.fold("bn", "folded into the Conv conv")
    return prov, rows


def test_a_node_split_between_tpu_and_host_is_tpu_and_says_what_ran_where():
    prov, compiled = _unrolled_lstm()
    rows = {r.node: r for r in input_rows(prov, compiled)}
    assert list(rows) == ["conv", "bn", "lstm", "fc"]       # the input model's nodes, in order
    lstm = rows["lstm"]
    assert lstm.where == "TPU" and lstm.op_type == "LSTM"
    assert "8 of 8 MatMul on the TPU" in lstm.reason
    assert "on the host: 4 Sigmoid, 2 Tanh, 4 Mul, 2 Add" in lstm.reason
    assert lstm.step == "segment0, host1"
    assert lstm.macs == 8 * 1000
    assert rows["fc"].where == "host" and rows["fc"].reason == "no TPU mapping"


def test_glue_added_by_a_rewrite_gets_no_row():
    prov, compiled = _unrolled_lstm()
    assert "x_QuantizeLinear" not in {r.node for r in input_rows(prov, compiled)}


def test_a_folded_node_runs_where_what_absorbed_it_runs():
    prov, compiled = _unrolled_lstm()
    bn = next(r for r in input_rows(prov, compiled) if r.node == "bn")
    assert (bn.where, bn.step, bn.reason) == ("TPU", "segment0", "folded into the Conv conv")
    # on the host when the absorber is
    compiled[0] = NodeRow("conv", "Conv", "host", "host0", "grouped", 100)
    bn = next(r for r in input_rows(prov, compiled) if r.node == "bn")
    assert (bn.where, bn.step) == ("host", "host0")


def test_the_absorber_is_the_longest_name_the_reason_mentions():
    prov = Provenance([("conv", "Conv"), ("conv_1", "Conv"), ("bn", "BatchNormalization")])
    prov.fold("bn", "folded into conv_1's weights")
    compiled = [NodeRow("conv", "Conv", "host", "host0", "dilated", 1),
                NodeRow("conv_1", "Conv", "TPU", "segment0", "Conv", 1)]
    bn = next(r for r in input_rows(prov, compiled) if r.node == "bn")
    assert bn.where == "TPU"


def test_a_folded_node_without_an_absorber_is_a_host_constant():
    prov = Provenance([("shape", "Shape"), ("fc", "Gemm")])
    prov.fold("shape", "constant-folded when compiling")
    rows = input_rows(prov, [NodeRow("fc", "Gemm", "TPU", "segment0", "Dense", 8)])
    assert rows[0].where == "host" and rows[0].reason == "constant-folded when compiling"


def test_a_node_rewritten_wholly_onto_the_tpu_counts_its_parts():
    prov = Provenance([("mm", "MatMul")])
    prov.derive("mm/split0", "mm")
    prov.derive("mm/split1", "mm")
    rows = input_rows(prov, [NodeRow("mm/split0", "Gemm", "TPU", "segment0", "Dense", 3),
                             NodeRow("mm/split1", "Gemm", "TPU", "segment1", "Dense", 4)])
    assert (rows[0].where, rows[0].step, rows[0].macs) == ("TPU", "segment0, segment1", 7)
    assert "2 compiled nodes, all on the TPU" in rows[0].reason


# --- MACs from shapes -------------------------------------------------------------------

def _node(op, inputs, outputs, **attrs):
    return Node(op.lower(), op, "", inputs, outputs, attrs, 0)


def test_macs_of_each_matrix_operator_by_hand():
    shapes = {"a": (8, 64), "w": (64, 10), "y": (8, 10),
              "a3": (8, 5, 32), "y3": (8, 5, 16),
              "x": (2, 6, 10, 10), "k": (12, 3, 3, 3), "yc": (2, 12, 8, 8),
              "xs": (7, 2, 20), "W": (2, 4 * 16, 20), "R": (2, 4 * 16, 16), "Y": (7, 2, 2, 16),
              "Wg": (1, 3 * 16, 20), "Rg": (1, 3 * 16, 16),
              "at": (64, 8)}
    assert node_macs(_node("Gemm", ["a", "w"], ["y"]), shapes) == 8 * 64 * 10
    assert node_macs(_node("Gemm", ["at", "w"], ["y"], transA=1), shapes) == 8 * 64 * 10
    assert node_macs(_node("MatMul", ["a3", "w"], ["y3"]), shapes) == 8 * 5 * 32 * 16
    # groups = 2: each output sees 6 / 2 = 3 input channels x 3 x 3
    assert node_macs(_node("Conv", ["x", "k"], ["yc"], group=2), shapes) == \
        2 * 12 * 8 * 8 * 3 * 3 * 3
    assert node_macs(_node("LSTM", ["xs", "W", "R"], ["Y"]), shapes) == \
        7 * 2 * 2 * 4 * 16 * (20 + 16)          # steps x batch x directions x gates
    assert node_macs(_node("GRU", ["xs", "Wg", "Rg"], ["Y"]), shapes) == 7 * 2 * 3 * 16 * 36
    # the quantized forms count like the float ones (their weight at its own input)
    s, z = "s", "z"
    assert node_macs(_node("QLinearConv", ["x", s, z, "k", s, z, s, z], ["yc"], group=2),
                     shapes) == 2 * 12 * 8 * 8 * 3 * 3 * 3
    assert node_macs(_node("QGemm", ["at", s, z, "w", s, z], ["y"], transA=1), shapes) == \
        8 * 64 * 10
    assert node_macs(_node("MatMulInteger", ["a3", "w"], ["y3"]), shapes) == 8 * 5 * 32 * 16
    assert node_macs(_node("ConvTranspose", ["yc", "k"], ["x"]), shapes) == \
        2 * 12 * 8 * 8 * 3 * 3 * 3           # each input element meets 3 x 3 x 3 weights
    assert node_macs(_node("Relu", ["a"], ["y"]), shapes) is None
    assert node_macs(_node("MatMul", ["unknown", "w"], ["y"]), shapes) is None


def test_macs_of_an_einsum_by_hand():
    """A pair's products are every index's sizes multiplied; more operands are contracted
    pairwise from the left, the result keeping what later operands and the output need."""
    shapes = {"x": (2, 5, 6), "w": (6, 4), "x4": (3, 2, 5, 6), "a": (2, 4, 10, 10),
              "v": (2, 10, 4, 8), "wo": (4, 8, 16)}
    assert node_macs(_node("Einsum", ["x", "w"], ["y"], equation=b"bld,dh->blh"),
                     shapes) == 2 * 5 * 6 * 4
    assert node_macs(_node("Einsum", ["x4", "w"], ["y"], equation="...d,dh->...h"),
                     shapes) == 3 * 2 * 5 * 6 * 4
    assert node_macs(_node("Einsum", ["x", "w"], ["y"], equation="bij,jk"), shapes) == \
        2 * 5 * 6 * 4                                        # implicit output: bik
    # (a v) first: b h l m k, then its result (b l h k) with wo: b l h k d
    assert node_macs(_node("Einsum", ["a", "v", "wo"], ["y"], equation="bhlm,bmhk,hkd->bld"),
                     shapes) == 2 * 4 * 10 * 10 * 8 + 2 * 10 * 4 * 8 * 16
    assert node_macs(_node("Einsum", ["x", "unknown"], ["y"], equation="bld,dh->blh"),
                     shapes) is None


def test_macs_of_onnxruntime_s_contrib_matrix_operators_by_hand():
    """com.microsoft's fused and integer kernels count as their float forms; its
    DynamicQuantizeLSTM holds the LSTM's weights transposed: W (dirs, input, 4H)."""
    shapes = {"a3": (8, 5, 32), "w": (32, 16), "y3": (8, 5, 16), "a": (8, 32), "y": (8, 16),
              "x": (2, 6, 10, 10), "k": (12, 6, 3, 3), "yc": (2, 12, 8, 8),
              "xs": (7, 2, 20), "Wq": (2, 20, 4 * 16), "Rq": (2, 16, 4 * 16)}
    s, z = "s", "z"
    for op, inputs in (("MatMulIntegerToFloat", ["a3", "w", s, s]),
                       ("DynamicQuantizeMatMul", ["a3", "w", s]),
                       ("MatMulInteger16", ["a3", "w"])):
        assert node_macs(_node(op, inputs, ["y3"]), shapes) == 8 * 5 * 32 * 16, op
    assert node_macs(_node("FusedGemm", ["a", "w"], ["y"]), shapes) == 8 * 32 * 16
    assert node_macs(_node("FusedConv", ["x", "k"], ["yc"]), shapes) == 2 * 12 * 8 * 8 * 54
    lstm = _node("DynamicQuantizeLSTM", ["xs", "Wq", "Rq", "", "", "", "", "", s, z, s, z],
                 ["Y"])
    assert node_macs(lstm, shapes) == 7 * 2 * 2 * 4 * 16 * (20 + 16)


# --- whole compiles ---------------------------------------------------------------------

LONG = "/model/encoder/layers.0/feed_forward/some_very_long_exporter_prefix/"


@pytest.fixture(scope="module")
def long_names(tmp_path_factory):
    """An MLP whose node names share a 60-character prefix (as exporters write them)."""
    tmp = tmp_path_factory.mktemp("long")
    layers = [("gemm", 24), ("relu",), ("gemm", 16), ("relu",), ("gemm", 10), ("softmax",)]
    m = float_models.build(layers, (20,))
    for node in m.graph.node:
        node.name = LONG + node.name
    path = float_models.save(m, tmp / "long.onnx")
    calib = np.random.default_rng(1).normal(0, 1, (40, 20)).astype(np.float32)
    return m, path, compile_model(path, batch=8, calibration=calib,
                                  config=["array_size=16"])


def test_whole_names_one_row_per_input_node(long_names):
    m, _, compiled = long_names
    report = compiled.report
    assert [r.node for r in report.rows] == [n.name for n in m.graph.node]
    text = report.text()
    for node in m.graph.node:
        assert sum(line.endswith("  " + node.name) for line in text.splitlines()) == 1
    named = [line for line in text[text.index("Nodes of the model"):].splitlines()
             if line.endswith(tuple(n.name for n in m.graph.node))]
    assert len(named) == len(set(named)) == len(m.graph.node)   # no two rows read the same
    rows = {r.node: r for r in report.rows}
    assert all(rows[LONG + f"gemm{i}"].where == "TPU" for i in (0, 2, 4))
    assert rows[LONG + "softmax5"].where == "host"
    # the quantizer absorbed the Relus into the Gemms' output ranges: TPU, reason says so
    assert rows[LONG + "relu1"].where == "TPU" and "gemm0" in rows[LONG + "relu1"].reason
    glue = [r.node for r in report.compiled_nodes if r.op_type == "QuantizeLinear"]
    assert glue and not set(glue) & set(rows)


def test_macs_and_segment_cycles(long_names):
    _, _, compiled = long_names
    report = compiled.report
    per_sample = 20 * 24 + 24 * 16 + 16 * 10                # by hand
    assert report.macs == report.tpu_macs == 8 * per_sample
    assert report.tpu_mac_share == 1.0 and report.warnings == []
    rows = {r.node: r for r in report.rows}
    assert rows[LONG + "gemm2"].macs == 8 * 24 * 16
    steps = [s for s in compiled.steps if isinstance(s, TpuStep)]
    assert [s.name for s in report.segments] == [s.name for s in steps]
    assert sum(s.macs for s in report.segments) == report.tpu_macs
    for seg, step in zip(report.segments, steps):
        # the cycles of a full run of the same program on a real batch
        from tpuasm.machine import Machine
        machine = Machine.for_program(step.binary())
        x = np.zeros((8, *step.segment.inputs[0].shape), np.uint8)
        machine.load(step.binary(), host=step.program.host_image(
            {step.segment.inputs[0].name: x}), weights=step.program.weights)
        assert machine.run().status == "halted"
        c = machine.counters()
        assert seg.cycles == c["cycles"] and seg.array_active_cycles == c["array_active_cycles"]
        assert seg.time_us == pytest.approx(c["cycles"] / 700e6 * 1e6, abs=1e-3)
        assert seg.utilisation == pytest.approx(seg.macs / (c["cycles"] * 16 * 16))
        assert seg.share == pytest.approx(seg.macs / report.macs)
    assert "Cycles" in report.text() and f"{report.segments[0].cycles:,}" in report.text()


def test_report_json_round_trips_through_outdir(long_names, tmp_path):
    _, _, compiled = long_names
    compiled.save(tmp_path / "out")
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    for row in data["rows"]:
        assert {"node", "op_type", "where", "reason"} <= set(row)
        assert row["where"] in ("TPU", "host")
    assert data["compiled_nodes"] and data["segments"][0]["cycles"] > 0
    loaded = load(tmp_path / "out")
    assert loaded.report.text() == compiled.report.text()
    assert loaded.report.rows == compiled.report.rows


# --- warnings ---------------------------------------------------------------------------

def _matmul_integer(tmp_path):
    inits = [const("w", np.ones((64, 48), np.int8)), const("zp", np.uint8(3))]
    nodes = [helper.make_node("MatMulInteger", ["x", "w", "zp"], ["y"], name="mmi")]
    m = model(nodes, [value_info("x", np.uint8, ("N", 64))],
              [value_info("y", np.int32, ("N", 48))], inits)
    path = tmp_path / "mmi.onnx"
    onnx.save(m, str(path))
    return path


def test_less_than_half_the_macs_on_the_tpu_is_a_warning_the_library_does_not_print(
        tmp_path, capsys):
    compiled = compile_model(_matmul_integer(tmp_path), batch=2)
    report = compiled.report
    assert report.macs == 2 * 64 * 48 and report.tpu_macs == 0
    (warning,) = report.warnings
    assert "0.0 %" in warning and "mmi (MatMulInteger, 100.0 %)" in warning
    assert "int32" in warning                       # the host reason comes with it
    assert capsys.readouterr() == ("", "")
    assert json.loads(json.dumps(report.to_json()))["warnings"] == [warning]


def test_the_cli_prints_warnings_to_stderr(tmp_path, capsys):
    code = compile_main([str(_matmul_integer(tmp_path)), "-o", str(tmp_path / "out"),
                         "--batch", "2", "-q"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "warning: only 0.0 % of the model's 6,144 MACs run on the TPU" in err
    assert "warning:" not in out


def test_the_warning_threshold_is_half():
    def report(tpu, host):
        r = CompileReport("m", 1, 256, "q",
                          rows=[NodeRow("a", "Gemm", "TPU", "segment0", "Dense", tpu),
                                NodeRow("b", "MatMul", "host", "host0", "two activations",
                                        host)],
                          macs=tpu + host, tpu_macs=tpu)
        return mac_warnings(r)
    assert report(50, 50) == []
    (w,) = report(49, 51)
    assert w.startswith("only 49.0 % of the model's 100 MACs") and "b (MatMul, 51.0 %)" in w


# --- a validation set by another pass ----------------------------------------------------

class _Validation:
    warnings = ["top-1 agreement 97.0 % is below 99.0 %"]

    def text(self):
        return "Validation against the float model: top-1 agreement 97.0 %\n"

    def to_json(self):
        return {"top1_agreement": 0.97}


def test_a_validation_is_rendered_when_present(long_names, tmp_path):
    _, _, compiled = long_names
    report = compiled.report
    report.validation = None            # (compiled with the float check: replaced here)
    assert "Validation" not in report.text() and "validation" not in report.to_json()
    report.validation = _Validation()
    try:
        text = report.text()
        assert "Validation against the float model: top-1 agreement 97.0 %" in text
        assert "  - top-1 agreement 97.0 % is below 99.0 %" in text
        data = report.to_json()
        assert data["validation"] == {"top1_agreement": 0.97}
        assert data["warnings"] == ["top-1 agreement 97.0 % is below 99.0 %"]
        compiled.save(tmp_path / "out")
        loaded = load(tmp_path / "out").report
        assert loaded.text() == text and loaded.to_json()["validation"] == data["validation"]
        assert loaded.all_warnings() == report.all_warnings()
    finally:
        report.validation = None


# --- one meaning of "useful MACs" -------------------------------------------------------

def test_tpuasm_run_on_a_segment_counts_the_networks_macs(long_names, tmp_path, capsys):
    """The machine's useful MACs of a compiled segment are the MACs the report counts from
    the ONNX shapes; the array-active MAC slots (vectors x 16 x 16) are more."""
    from tpuasm.cli import main
    _, _, compiled = long_names
    out = compiled.save(tmp_path / "out")
    seg = compiled.report.segments[0]
    code = main(["run", str(out / f"{seg.name}.tasm"), "--host", str(out / f"{seg.name}.host.npy"),
                 "--weights", str(out / f"{seg.name}.weights.npy"),
                 "--stats", str(tmp_path / "stats.json")])
    assert code == 0
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["useful_macs"] == seg.macs == 8 * (20 * 24 + 24 * 16 + 16 * 10)
    assert stats["array_mac_slots"] > stats["useful_macs"]          # the tiles' padding
    printed = capsys.readouterr().out
    assert f"{seg.macs:,} useful MACs" in printed and "array-active MAC slots" in printed


def test_quantization_provenance_chains_through_a_rewrite_before_it():
    """A rewrite made the float model (the user's MatMul + Add became one Gemm "fc"; a
    BatchNormalization folded away); quantization renamed nothing but added glue and dropped
    a Relu: the quantized graph's nodes map to the user's nodes."""
    from tpuasm.compiler.pipeline import _quantized_provenance
    float_model = model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc"),
                         helper.make_node("Relu", ["y"], ["r"], name="relu")],
                        [value_info("x", np.float32, (1, 4))],
                        [value_info("r", np.float32, (1, 3))], [])
    base = Provenance([("mm", "MatMul"), ("add", "Add"), ("bn", "BatchNormalization"),
                       ("relu", "Relu")])
    base.derive("fc", "mm")
    base.fold("add", "bias folded into fc")
    base.fold("bn", "folded into mm")

    class Quantized:             # the quantized graph: unnamed nodes renamed, glue added
        nodes = [Node("x_QuantizeLinear", "QuantizeLinear", "", ["x"], ["xq"], {}, 0),
                 Node("Gemm_3", "Gemm", "", ["xd", "w", "b"], ["y"], {}, 1),
                 Node("y_QuantizeLinear", "QuantizeLinear", "", ["y"], ["yq"], {}, 2)]
    prov = _quantized_provenance(float_model, Quantized, base)
    assert prov.source("Gemm_3") == "mm"
    assert prov.source("x_QuantizeLinear") is None
    assert "removed when quantizing" in prov.folded["relu"] and "fc" in prov.folded["relu"]
    rows = {r.node: r for r in input_rows(prov, [
        NodeRow("x_QuantizeLinear", "QuantizeLinear", "host", "host0", "glue"),
        NodeRow("Gemm_3", "Gemm", "TPU", "segment0", "Dense 4x3", 12),
        NodeRow("y_QuantizeLinear", "QuantizeLinear", "TPU", "segment0", "fused")])}
    assert list(rows) == ["mm", "add", "bn", "relu"]
    assert (rows["mm"].where, rows["mm"].macs) == ("TPU", 12)
    # their reasons name mm (a user node) and fc (made by the rewrite, from mm): with mm
    assert all(rows[n].where == "TPU" and rows[n].step == "segment0"
               for n in ("add", "bn", "relu"))


# --- the repo's own models from the CLI ---------------------------------------------------

@pytest.mark.parametrize("name, per_sample", [
    ("mlp", 64 * 64 + 64 * 10),                               # fc1 64 -> 64, fc2 64 -> 10
    # conv1 1 -> 8 on 8x8 (3x3), conv2 8 -> 16 on 4x4 (3x3), fc 16x2x2 -> 10
    ("cnn", 8 * 8 * 8 * 9 + 16 * 4 * 4 * 8 * 9 + 64 * 10)])
def test_digits_from_the_cli(tmp_path, capsys, name, per_sample):
    from pathlib import Path
    digits = Path(__file__).resolve().parent.parent / "programs" / "digits"
    out = tmp_path / name
    assert compile_main([str(digits / f"{name}.onnx"), "-o", str(out), "--batch", "16",
                         "--calibrate", str(digits / "calibration.npy")]) == 0
    printed, err = capsys.readouterr()
    assert "warning:" not in err
    data = json.loads((out / "report.json").read_text())
    user = onnx.load(str(digits / f"{name}.onnx"))
    assert [(r["node"], r["op_type"]) for r in data["rows"]] == \
        [(n.name, n.op_type) for n in user.graph.node]
    for row in data["rows"]:
        if row["op_type"] in ("Conv", "Gemm", "MatMul"):
            assert row["where"] == "TPU", row
    assert next(r for r in data["rows"] if r["op_type"] == "Softmax")["where"] == "host"
    assert data["macs"] == data["tpu_macs"] == 16 * per_sample
    (segment,) = data["segments"]
    assert segment["cycles"] > 0 and segment["macs"] == data["macs"]
    assert f"MACs per batch: {16 * per_sample:,} ({per_sample:,} per sample)" in printed


def test_matrix_nodes_of_unknown_shape_are_named_in_a_warning(tmp_path, monkeypatch):
    import tpuasm.compiler.pipeline as pipeline
    monkeypatch.setattr(pipeline, "node_macs", lambda node, shapes: None)   # shapes unknown
    report = compile_model(_matmul_integer(tmp_path), batch=2).report
    assert report.macs == 0 and report.warnings == [
        "the MACs of 1 matrix node are not counted (shapes unknown): mmi"]

"""The six apps (tpuasm.apps): Table 1 totals, the generated programs' cycle structure,
and `tpuasm profile`.  Oracles: hand-computed shape arithmetic and closed-form counts."""
from __future__ import annotations

import json

import pytest

from tpuasm.apps import cli
from tpuasm.apps.catalog import build, mlp
from tpuasm.apps.codegen import CodegenError, generate
from tpuasm.apps.layers import App, Conv, FC, Pool, Tensor
from tpuasm.apps.paper import TABLE1
from tpuasm.assembler import assemble
from tpuasm.machine import Machine, MachineConfig

# weights, ops per weight byte: hand-computed from the shapes in docs/apps.md
HAND = {
    "MLP0": (5 * 2000 * 2000, 200),
    "MLP1": (1000 * 1000 + 1000 * 1500 + 1500 * 1000 + 1000 * 1000, 168),
    "LSTM0": (4 * (1432 + 1024) * 1024 + 5 * 4 * 2048 * 1024, 64),
    "LSTM1": (9 * 4 * 1200 * 600 + 600 * 13500, 96),
    "CNN0": (25 * 48 * 256 + 13 * 9 * 256 * 256 + 2 * 256 * 256, 361 * 8),
}


@pytest.mark.parametrize("name", list(HAND))
def test_app_totals_match_table1(name):
    app = build(name)
    weights, ops = HAND[name]
    assert app.weights == weights
    assert app.ops_per_weight_byte == pytest.approx(ops)
    layers, paper_weights, paper_ops, batch = TABLE1[name]
    assert app.batch == batch
    assert abs(app.weights / paper_weights - 1) < 0.02


def test_layer_counts_as_in_table1():
    assert build("LSTM0").layer_counts() == "58: 24 FC + 34 vector"
    assert build("LSTM1").layer_counts() == "56: 37 FC + 19 vector"
    assert build("CNN0").layer_counts() == "16 conv"
    cnn1 = build("CNN1")
    assert cnn1.kinds == {"Conv": 72, "Pool": 13, "FC": 4}
    assert abs(cnn1.weights / 100e6 - 1) < 0.01
    assert abs(cnn1.ops_per_weight_byte / 1750 - 1) < 0.01


def run(app: App, n: int = 16, **shape):
    g = generate(app, array_size=n, **shape)
    program = assemble(g.source, "app.tasm")
    import numpy as np
    m = Machine(MachineConfig(array_size=n, **shape))
    m.load(program, host=np.zeros((g.host_rows, n), np.int8),
           weights=np.zeros((g.weight_tiles, n, n), np.int8))
    assert m.run().status == "halted"
    return g, m.counters()


def test_fc_program_streams_every_tile_once():
    app = mlp("tiny", [40, 33, 16], batch=8)      # K, N not multiples of 16
    g, c = run(app)
    tiles = 3 * 3 + 3 * 1                          # ceil(40/16) x ceil(33/16), then 3 x 1
    assert g.weight_tiles == tiles
    assert c["array_active_cycles"] == tiles * 8  # B rows per tile
    fetch = MachineConfig(array_size=16).fetch_cycles
    assert c["cycles"] >= tiles * fetch


def test_conv_program_one_tile_per_tap_and_chunk():
    t = {"x": Tensor("x", 20, 4, 4), "y": Tensor("y", 16, 4, 4), "z": Tensor("z", 16, 4, 4),
         "p": Tensor("p", 16, 2, 2), "f": Tensor("f", 10)}
    layers = [Conv("y", "x", "y", 3), Conv("z", "y", "z", 3), Pool("p", "z", "p", 2),
              FC("f", ("p",), "f")]
    app = App("tinycnn", 2, t, layers, ("x",), ("f",))
    g, c = run(app)
    # conv1: 9 taps x 2 input chunks (20 channels) x 1 output chunk; conv2: 9 x 1 x 1;
    # the FC: 4 pooled pixels x 1 chunk = 4 K tiles, 1 N tile
    assert g.weight_tiles == 18 + 9 + 4
    pixels = 16 * 2                                # 4 x 4 outputs x batch 2
    assert c["array_active_cycles"] == 18 * pixels + 9 * pixels + 4 * 2


def test_too_small_machine_is_a_codegen_error():
    with pytest.raises(CodegenError, match="accumulator"):
        generate(mlp("tiny", [16, 16], batch=8), array_size=16, acc_rows=8)


def test_profile_prints_the_paper_next_to_the_measurement(capsys):
    assert cli.profile_main(["--apps", "mlp1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["MLP1"]
    rows = out["rows"]
    assert rows["active"]["paper"] == 10.6 and rows["tops"]["paper"] == 9.7
    parts = sum(rows[k]["measured"] for k in ("active", "weight_stall", "weight_shift",
                                               "non_matrix"))
    assert parts == pytest.approx(100, abs=0.05)
    for r in rows.values():
        assert r["gap"] == pytest.approx(r["measured"] - r["paper"], abs=0.011)


def test_profile_runs_the_compiled_apps_and_the_generator_on_request(capsys):
    assert cli.profile_main(["--apps", "mlp1", "--json", "--source", "generator"]) == 0
    gen = json.loads(capsys.readouterr().out)["MLP1"]
    assert cli.profile_main(["--apps", "mlp1", "--json"]) == 0
    comp = json.loads(capsys.readouterr().out)["MLP1"]
    assert (gen["source"], comp["source"]) == ("generator", "compiler")
    # the same network (80 tiles of 168 rows: the same array-active cycles), two programs
    assert gen["rows"]["active"]["measured"] * gen["cycles"] == \
        pytest.approx(comp["rows"]["active"]["measured"] * comp["cycles"], rel=1e-3)


def test_profile_full_computes_the_same_table_as_timing_only(capsys):
    # the default is timing-only (values never change timing); --full runs the arithmetic
    assert cli.profile_main(["--apps", "mlp1", "--json", "--full"]) == 0
    full = json.loads(capsys.readouterr().out)["MLP1"]
    assert cli.profile_main(["--apps", "mlp1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["MLP1"] == full


def test_profile_rejects_unknown_apps(capsys):
    assert cli.profile_main(["--apps", "MLP9"]) == 2
    assert "unknown app" in capsys.readouterr().err


def test_onnx_models_have_the_apps_weights_and_run_in_onnxruntime():
    import numpy as np
    import onnxruntime as ort
    from onnx import numpy_helper

    from tpuasm.apps.onnx_models import calibration, model
    for name in ("MLP1", "CNN0"):
        m = model(name, batch=2)
        weights = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
        assert sum(w.size for w in weights.values()) == build(name).weights
        x = calibration(name, 2)
        (y,) = ort.InferenceSession(m.SerializeToString()).run(None, x)
        if name == "MLP1":                 # oracle: the same chain in numpy
            h = x["a0"]
            for i in range(1, 5):
                h = np.maximum(h @ weights[f"fc{i}.W"], 0)
            np.testing.assert_allclose(y, h, rtol=1e-4, atol=1e-5)
        else:
            assert y.shape == (2, 256, 19, 19)

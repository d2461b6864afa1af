"""The six apps (tpuasm.apps): Table 1 totals, the compiled programs' cycle structure,
and `tpuasm profile`.  Oracles: hand-computed shape arithmetic and closed-form counts."""
from __future__ import annotations

import json

import pytest

from tpuasm.apps import cli
from tpuasm.apps.catalog import build
from tpuasm.apps.paper import TABLE1
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


def test_compiled_fc_program_streams_every_tile_once():
    """MLP1 compiled for TPU v1: every 256 x 256 tile of its four matrices is fetched
    once and multiplied by the whole batch once (hand arithmetic: ceil(K/256) x
    ceil(N/256) tiles per layer)."""
    import math

    from tpuasm.apps.programs import app_program
    widths = [1000, 1000, 1500, 1000, 1000]
    tiles = sum(math.ceil(k / 256) * math.ceil(n / 256) for k, n in zip(widths, widths[1:]))
    assert tiles == 80
    ap = app_program("MLP1")
    assert ap.weight_tiles == tiles
    m = Machine(MachineConfig(), timing_only=True)
    m.load(ap.assemble(), *ap.data())
    assert m.run().status == "halted"
    c = m.counters()
    assert c["array_active_cycles"] == tiles * 168        # batch 168 rows per tile
    assert c["cycles"] >= tiles * MachineConfig().fetch_cycles


def test_the_hand_generator_is_gone():
    """One pipeline for the apps: the compiler's.  The old generator is not importable
    and `tpuasm profile` has no --source."""
    import importlib.util
    assert importlib.util.find_spec("tpuasm.apps.codegen") is None
    assert cli.profile_main(["--apps", "mlp1", "--source", "generator"]) == 2


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

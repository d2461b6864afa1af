"""The six apps compiled from their ONNX models (tpuasm.apps.programs, tpuasm.compiler.codegen.whole).

Oracles: onnxruntime running the same QDQ model (the compiled apps' outputs), the segments
run one by one (the joined program), tile counts from the layer shapes (hand arithmetic)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnx_models import agreement, run_ort
from tpuasm.apps import programs
from tpuasm.apps.catalog import build
from tpuasm.apps.onnx_models import calibration, save
from tpuasm.assembler import assemble
from tpuasm.compiler.codegen import pack_segment, weight_tiles
from tpuasm.compiler.ir import Lookup, Pool
from tpuasm.compiler.pipeline import compile_model
from tpuasm.compiler.runtime.steps import TpuStep
from tpuasm.compiler.codegen.whole import whole_program
from tpuasm.machine import Machine, MachineConfig


def _output_scale(model: onnx.ModelProto, name: str) -> float:
    dq = next(n for n in model.graph.node if n.output[0] == name)
    init = next(t for t in model.graph.initializer if t.name == dq.input[1])
    return float(onnx.numpy_helper.to_array(init))


def _compiled(tmp_path, name, batch):
    path = save(name, tmp_path / f"{name}.onnx", batch=batch, quantized=True)
    return path, compile_model(path, batch=batch)


@pytest.mark.parametrize("name,batch", [("MLP1", 4), ("LSTM1", 3), ("CNN0", 1)])
def test_compiled_app_agrees_with_onnxruntime(tmp_path, name, batch):
    path, model = _compiled(tmp_path, name, batch)
    x = calibration(name, batch, seed=5)
    out = build(name).outputs[0]
    ours = model.run(x)[out]
    qdq = onnx.load(str(path))
    (theirs,) = run_ort(qdq, x)
    lsb = np.rint((ours.astype(np.float64) - theirs) / _output_scale(qdq, out))
    same, worst = agreement(lsb, np.zeros_like(lsb))
    assert worst <= 1 and same >= 0.999, (same, worst)
    assert np.std(theirs) > 0                      # not a vacuous all-zero comparison
    for step in model.steps:      # the closed form of the Weight Memory check is exact
        if isinstance(step, TpuStep):
            ops = pack_segment(step.segment, 256)[0].operators
            identity = any(isinstance(op, (Pool, Lookup)) for op in ops) and \
                "identity" in step.program.source
            assert sum(weight_tiles(op, 256) for op in ops) + identity == \
                step.program.weights.shape[0]


def _run(source, host_rows, tiles, n=256):
    m = Machine(MachineConfig(array_size=n))
    m.load(assemble(source, "p.tasm"), host=np.zeros((host_rows, n), np.int8),
           weights=np.zeros((tiles, n, n), np.int8))
    assert m.run().status == "halted"
    return m


def test_joined_program_is_its_segments_with_host_round_trips(tmp_path):
    _, model = _compiled(tmp_path, "LSTM1", 8)
    segments = [s.program for s in model.steps if isinstance(s, TpuStep)]
    whole = whole_program(model)
    assert whole.segments == len(segments) == 10          # 9 cells and the output layer
    assert whole.weight_tiles == sum(p.weights.shape[0] for p in segments)
    for p in segments:        # the closed form the Weight Memory check uses, per segment
        assert sum(weight_tiles(op, 256) for op in p.segment.operators) == p.weights.shape[0]
    joined = _run(whole.source, whole.host_rows, whole.weight_tiles)
    alone = [_run(p.source, p.host_rows, p.weights.shape[0]).counters() for p in segments]
    c = joined.counters()
    for key in ("array_active_cycles", "useful_macs"):
        assert c[key] == sum(a[key] for a in alone)
    assert [e.value for e in joined.events if e.kind == "interrupt"] == list(range(1, 10))
    # the next segment's first tiles are requested before the round trip, not after it
    code = [line.split(";")[0].split() for line in whole.source.splitlines()]
    code = [c[0] for c in code if c and not c[0].startswith(".")]
    for i, op in enumerate(code):
        if op == "INT":
            assert code[i - 1] == "RW" and code[i + 1] == "RHM"
    # the round trips cost time, the overlap of weight fetches across them saves some:
    # the joined run is within a few percent of the segments back to back
    assert abs(c["cycles"] / sum(a["cycles"] for a in alone) - 1) < 0.05


def _tiles(app, n):
    from tpuasm.apps.layers import FC
    total = 0
    for layer in app.layers:
        if isinstance(layer, FC):
            k = sum(app.t(i).channels * app.t(i).pixels for i in layer.inputs)
            total += -(-k // n) * -(-app.t(layer.output).channels // n)
    return total


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(programs, "cache_dir", lambda: tmp_path / "cache")
    programs.app_program.cache_clear()
    programs.model_file.cache_clear()
    yield tmp_path / "cache"
    programs.app_program.cache_clear()
    programs.model_file.cache_clear()


def test_app_program_is_compiled_once_per_shape(cache, monkeypatch):
    lstm1 = build("LSTM1")
    for n in (256, 512):          # the paper: a 600 x 600 matrix is 9 tiles, or 4 at 512
        ap = programs.app_program("LSTM1", array_size=n)
        assert ap.weight_tiles == _tiles(lstm1, n) and ap.segments == 10
        assert ap.macs == lstm1.batch * lstm1.weights
    assert len(list(cache.glob("lstm1-*/program-*.json"))) == 2
    programs.app_program.cache_clear()
    monkeypatch.setattr(programs, "_compile", lambda *a: pytest.fail("compiled again"))
    again = programs.app_program("LSTM1", array_size=512)
    assert again.weight_tiles == _tiles(lstm1, 512)


def test_app_that_does_not_fit_is_a_codegen_error(cache):
    with pytest.raises(programs.CodegenError, match="CNN0.*cannot hold.*Unified Buffer"):
        programs.app_program("CNN0", ub_rows=300)
    programs.app_program.cache_clear()
    with pytest.raises(programs.CodegenError, match="CNN0"):      # cached as an error too
        programs.app_program("CNN0", ub_rows=300)


def test_a_program_beyond_the_assembler_is_a_codegen_error(cache, monkeypatch):
    # a tiny array makes every tile an instruction: beyond the assembler's statement cap
    # the point is skipped with the count, not an assembly error later
    monkeypatch.setattr(programs, "MAX_STATEMENTS", 50)
    with pytest.raises(programs.CodegenError, match="instructions on a 256 x 256 array"):
        programs.app_program("MLP1")


def test_program_key_names_the_program_without_compiling(cache, monkeypatch):
    """A sweep's client keys results by program_key: it must not compile or write, must
    tell shapes and apps apart, and must change with the compiler."""
    from tpuasm.sweep.targets import Target
    monkeypatch.setattr(programs, "_compile", lambda *a: pytest.fail("compiled"))
    key = programs.program_key("MLP1")
    assert key == programs.program_key("MLP1", array_size=256)
    others = {programs.program_key("MLP1", array_size=512),
              programs.program_key("MLP1", fifo_depth=2),
              programs.program_key("LSTM1")}
    assert key not in others and len(others) == 3
    config = {"array_size": 512}
    assert Target("app", "MLP1").digest(config) != Target("app", "MLP1").digest({})
    assert not cache.exists() or not any(cache.iterdir())          # nothing written
    monkeypatch.setattr(programs, "compiler_digest", lambda: "another compiler")
    assert programs.program_key("MLP1") != key

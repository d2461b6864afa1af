"""The streaming calibrator (compiler/front/calibrate.py): one pass of the float model, a chunk
of rows at a time, gives every calibration method's ranges.  Oracles: onnxruntime's own
calibrators (create_calibrator) on the same model and rows, and its quantize_static with its
own calibration (the QDQ model must be the same, byte for byte, for min-max)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tpuasm.compiler.front import quantize as quantize_module
from tpuasm.compiler.front.calibrate import (FINE_BINS, PERCENTILE_BINS, CalibrationPass,
                                             TensorStatistics, float_tensors, kl_divergence,
                                             kl_threshold)
from tpuasm.compiler.front.quantize import QuantOptions, quantize, tpu_nodes

ROWS = 128


def _model():
    """Conv -> Relu -> Conv -> Tanh -> Flatten -> Gemm: activations one-sided, two-sided,
    saturated, and the heavy tails of a Student-t input."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.2, (10, 64)).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "b3")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["c2"], ["t2"], name="tanh2"),
             helper.make_node("Flatten", ["t2"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "calib", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 8, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


@pytest.fixture(scope="module")
def case():
    model = _model()
    x = np.random.default_rng(1).standard_t(4, (ROWS, 3, 8, 8)).astype(np.float32)
    names = float_tensors(model, [n.name for n in model.graph.node])
    return model, x, names


def _chunks(x, step):
    return [{"x": x[i:i + step]} for i in range(0, len(x), step)]


def _feeds(x, step):
    """CalibrationPass.collect's feeds(rows): chunks of `step` rows (the one-row probe
    gets one)."""
    return lambda rows: _chunks(x, 1 if rows == 1 else step)


def _onnxruntime_ranges(model, x, tmp_path, method, extra):
    from onnxruntime.quantization.calibrate import CalibrationDataReader, create_calibrator

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(_chunks(x, 32))

        def get_next(self):
            return next(self.feeds, None)

    onnx.save(model, str(tmp_path / "m.onnx"))
    calibrator = create_calibrator(tmp_path / "m.onnx", None, augmented_model_path=str(
        tmp_path / "augmented.onnx"), calibrate_method=method, extra_options=extra)
    calibrator.collect_data(Reader())
    ranges = calibrator.compute_data()
    histograms = calibrator.collector.histogram_dict if hasattr(calibrator, "collector") \
        else None
    return ranges, histograms


def _value(v) -> float:
    return float(np.asarray(v).reshape(-1)[0])


def test_minmax_ranges_are_onnxruntimes_exactly(case, tmp_path, capsys):
    from onnxruntime.quantization.calibrate import CalibrationMethod
    model, x, names = case
    ours = CalibrationPass()
    ours.collect(model, names, _feeds(x, 32))
    theirs, _ = _onnxruntime_ranges(model, x, tmp_path, CalibrationMethod.MinMax, {})
    got = ours.ranges(names, "minmax")
    assert set(got) == set(names) and {"x", "r1", "t2", "y"} <= set(names)
    for name in names:
        for a, b in zip(got[name], theirs[name].range_value):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), name


def test_percentile_ranges_within_two_of_onnxruntimes_bins(case, tmp_path, capsys):
    """onnxruntime's histogram of |x| (2048 bins) is rebuilt from the fine one: the
    percentile lands within max|x| / 1024 of onnxruntime's (two of its bins)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod
    model, x, names = case
    ours = CalibrationPass()
    ours.collect(model, names, _feeds(x, 32), histograms=True)
    theirs, _ = _onnxruntime_ranges(model, x, tmp_path, CalibrationMethod.Percentile,
                                    {"percentile": 99.9})
    got = ours.ranges(names, "percentile", 99.9)
    clipped = 0
    for name in names:
        stats = ours.tensors[name]
        reach = max(abs(float(stats.low)), abs(float(stats.high)))
        for a, b in zip(got[name], theirs[name].range_value):
            assert abs(_value(a) - _value(b)) <= reach / 1024, (name, a, b)
        clipped += _value(got[name][1]) < float(stats.high)
    assert clipped >= 3        # the ranges really cut the tails (not min-max in disguise)


def test_entropy_ranges_are_as_good_as_onnxruntimes_by_its_own_measure(case, tmp_path,
                                                                        capsys):
    """Entropy's KL divergence is flat near its minimum (a heavy-tailed input): the fine
    histogram rebuilt into onnxruntime's 512 bins moves a few counts and may move the
    argmin a few bins.  Tolerance: on onnxruntime's own histogram the divergence of our
    range is within 1 % of its minimum, and the range within max|x| / 16 of its."""
    from onnxruntime.quantization.calibrate import CalibrationMethod
    model, x, names = case
    ours = CalibrationPass()
    ours.collect(model, names, _feeds(x, 32), histograms=True)
    theirs, histograms = _onnxruntime_ranges(model, x, tmp_path, CalibrationMethod.Entropy,
                                             {"num_bins": 512, "num_quantized_bins": 128})
    got = ours.ranges(names, "entropy")
    exact = 0
    for name in names:
        stats = ours.tensors[name]
        reach = max(abs(float(stats.low)), abs(float(stats.high)))
        hist, edges = histograms[name][:2]
        at = [[int(np.argmin(np.abs(edges - _value(v)))) for v in r]
              for r in (got[name], theirs[name].range_value)]
        for a, b in zip(got[name], theirs[name].range_value):
            assert abs(_value(a) - _value(b)) <= reach / 16, (name, a, b)
        if at[0] == at[1]:
            exact += 1
            continue
        # a range clipped to [min, max] sits inside its end bin: the bin it clipped
        ours_kl, best_kl = (kl_divergence(hist, lo, hi if hi > lo else lo + 1, 128)
                            for lo, hi in at)
        assert ours_kl <= 1.01 * best_kl + 1e-9, (name, at)
    assert exact >= len(names) // 2


def test_chunking_changes_no_range(case):
    """The fine histogram's bound is a power of two and its doublings merge whole bins: the
    rows cut into 7-row chunks give every method the same ranges as 64-row chunks."""
    model, x, names = case
    big, small = CalibrationPass(), CalibrationPass()
    big.collect(model, names, _feeds(x, 64), histograms=True)
    small.collect(model, names, _feeds(x, 7), histograms=True)
    # one histogram pass each (their min and max too)
    assert big.passes == small.passes == 1
    assert (big.runs, small.runs) == (2, -(-ROWS // 7))
    for method in ("minmax", "percentile", "entropy"):
        a, b = big.ranges(names, method, 99.99), small.ranges(names, method, 99.99)
        for name in names:
            assert all(np.array_equal(u, v) for u, v in zip(a[name], b[name])), (method, name)
    for name in names:
        assert np.array_equal(big.tensors[name].counts, small.tensors[name].counts)


def test_histogram_doubling_keeps_every_count_and_a_bound_above_every_value():
    stats = TensorStatistics()
    stats.add(np.zeros(5, np.float32))              # zeros before any scale is known
    stats.add(np.array([0.3, -0.2], np.float32))
    assert stats.bound == 0.5
    stats.add(np.array([3.0, -0.5], np.float32))     # two doublings... to 4
    assert stats.bound == 4.0 and stats.counts.sum() == 9
    whole = TensorStatistics()
    whole.add(np.array([0, 0, 0, 0, 0, 0.3, -0.2, 3.0, -0.5], np.float32))
    assert np.array_equal(whole.counts, stats.counts)
    width = 2 * 4.0 / FINE_BINS
    assert stats.counts[FINE_BINS // 2] == 5 and stats.counts[int((3.0 + 4.0) / width)] == 1
    assert (float(stats.low), float(stats.high), stats.nearest) == (-0.5, 3.0, 0.0)


def test_percentile_of_a_known_distribution():
    """1000 values 1..1000 (and their negatives): the 99 % percentile's |x| threshold is
    within a bin of 990; min-max is the ends."""
    values = np.arange(1, 1001, dtype=np.float32)
    stats = TensorStatistics()
    for part in np.array_split(np.concatenate([values, -values]), 9):
        stats.add(part)
    lo, hi = stats.percentile(99.0)
    assert abs(_value(hi) - 990) <= 999 / PERCENTILE_BINS + 1 and _value(lo) == -_value(hi)
    assert [_value(v) for v in stats.minmax()] == [-1000.0, 1000.0]


def test_kl_threshold_is_onnxruntimes_on_the_same_histogram():
    """On one histogram, the vectorised search picks onnxruntime's entropy bins exactly: a
    Laplace-like peak with outliers, and a one-sided (Relu-like) one with empty bins."""
    from onnxruntime.quantization.calibrate import HistogramCollector
    rng = np.random.default_rng(3)
    peaked = np.histogram(rng.laplace(0, 1, 20000), 512, range=(-30, 30))[0]
    relu = np.histogram(np.maximum(rng.normal(0.5, 1, 20000), 0), 512, range=(-4, 4))[0]
    edges = np.arange(513, dtype=np.float32)
    collector = HistogramCollector("entropy", False, 512, 128, 99.9, "same")
    for hist in (peaked, relu):
        lo, hi = collector.get_entropy_threshold(
            (hist, edges, np.float32(0), np.float32(512), np.float32(512)), 128)
        assert kl_threshold(hist, 128) == (int(lo), int(hi))


def test_quantize_writes_onnxruntimes_own_qdq_model_for_minmax(case, tmp_path):
    """quantize() with the streaming ranges and quantize_static calibrating by itself (its
    MinMax calibrator, the same chunks) write the same QDQ model, byte for byte."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    model, x, _ = case
    options = QuantOptions(calibration_method="minmax")
    nodes = quantize(model, {"x": x}, {"x": ["N", 3, 8, 8]}, tmp_path / "ours.onnx", options)
    assert nodes == tpu_nodes(model, options)
    step = quantize_module.calibration_rows(model)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(_chunks(x, step))

        def get_next(self):
            return next(self.feeds, None)

    source = tmp_path / "float.onnx"
    onnx.save(model, str(source))         # a path: quantize_static rewrites a ModelProto
    quantize_static(str(source), str(tmp_path / "theirs.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    nodes_to_quantize=nodes,
                    op_types_to_quantize=sorted({n.op_type for n in model.graph.node
                                                 if n.name in nodes}),
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True,
                                   "CalibPercentile": 99.999})
    ours = onnx.load(str(tmp_path / "ours.onnx"))
    theirs = onnx.load(str(tmp_path / "theirs.onnx"))
    assert len([n for n in ours.graph.node if n.op_type == "QuantizeLinear"]) >= 4
    assert ours.graph.SerializeToString() == theirs.graph.SerializeToString()


def test_only_histogram_methods_expose_tensors_and_within_the_budget(case, tmp_path,
                                                                      monkeypatch):
    """Min-max exposes no tensor: its range pass (after the one-row run that measures each
    tensor's size) runs chunks of the model's own row count, every min and max computed in
    the graph.  Percentile needs the histograms: a pass exposing five rows' tensors a run
    (the budget), which entropy reuses (no run); their QDQ models are the ones a pass of the
    default budget gives."""
    from tpuasm.compiler.front import calibrate as calibrate_module
    model, x, names = case
    per_row = 4 * (3 * 64 + 2 * 8 * 64 + 3 * 4 * 16 + 10)        # x, c1, r1, c2, t2, f, y
    assert set(names) == {"x", "c1", "r1", "c2", "t2", "f", "y"}
    monkeypatch.setattr(calibrate_module, "CHUNK_BYTES", 5 * per_row + 100)
    seen = []
    real = quantize_module.calibration_feeds

    def spy(*args, **kwargs):
        for feed in real(*args, **kwargs):
            seen.append(len(feed["x"]))
            yield feed

    monkeypatch.setattr(quantize_module, "calibration_feeds", spy)
    shared = CalibrationPass()
    quantize(model, {"x": x}, {"x": ["N", 3, 8, 8]}, tmp_path / "minmax.onnx",
             QuantOptions(calibration_method="minmax"), calibration=shared)
    most = quantize_module.calibration_rows(model)
    assert seen[0] == 1 and max(seen[1:]) == most > 5 and sum(seen[1:]) == ROWS
    assert shared.passes == 1 and not any(s.binned for s in shared.tensors.values())
    assert shared._bytes == {"x": 4 * 3 * 64, "c1": 4 * 8 * 64, "r1": 4 * 8 * 64,
                             "c2": 4 * 4 * 16, "t2": 4 * 4 * 16, "f": 4 * 64, "y": 4 * 10}
    ranged = len(seen)
    for method in ("percentile", "entropy"):
        quantize(model, {"x": x}, {"x": ["N", 3, 8, 8]}, tmp_path / f"{method}.onnx",
                 QuantOptions(calibration_method=method), calibration=shared)
    binned = seen[ranged:]
    assert max(binned) == 5 and sum(binned) == ROWS and shared.rows == 5
    assert shared.passes == 2 and shared.runs == -(-ROWS // most) + -(-ROWS // 5)
    monkeypatch.undo()
    alone = tmp_path / "entropy-alone.onnx"
    quantize(model, {"x": x}, {"x": ["N", 3, 8, 8]}, alone,
             QuantOptions(calibration_method="entropy"))
    assert onnx.load(str(alone)).graph == onnx.load(str(tmp_path / "entropy.onnx")).graph
    ranges = [onnx.load(str(tmp_path / f"{m}.onnx")) for m in ("minmax", "percentile")]
    assert ranges[0].graph != ranges[1].graph          # the methods differ


def test_the_calibration_search_runs_the_float_model_twice_for_every_method(tmp_path,
                                                                           monkeypatch):
    """auto below an unreachable SNR bar tries percentile and entropy and then keeping
    element-wise nodes float: one range pass and one histogram pass serve every quantize()
    it makes."""
    from tpuasm.compiler import ort
    from tpuasm.compiler.runtime.calibsearch import quantize_checked
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (8, 16)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.4, (1, 8)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
             helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
             helper.make_node("Gemm", ["t", "w2"], ["y"], name="fc2", transB=1)]
    g = helper.make_graph(nodes, "reg", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 16])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 1])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = rng.standard_t(3, (96, 16)).astype(np.float32)
    passes, real = [], ort.session

    def counting(m, threads=1, optimize=True, **more):
        if not optimize:
            passes.append(1)
        return real(m, threads, optimize, **more)

    monkeypatch.setattr(ort, "session", counting)
    made = []
    real_quantize = quantize_module.quantize

    def quantize_spy(*args, **kwargs):
        made.append(kwargs.get("calibration"))
        return real_quantize(*args, **kwargs)

    import tpuasm.compiler.runtime.calibsearch as calibsearch
    monkeypatch.setattr(calibsearch, "quantize", quantize_spy)
    nodes, options, note = quantize_checked(
        model, {"x": x}, {"x": ["N", 16]}, tmp_path / "q.onnx", QuantOptions(), "m.onnx",
        None, None, model, {"x": x[:32]}, 0.99, 400.0)
    assert "percentile" in note and "entropy" in note        # the search ran
    assert len(made) >= 3 and all(c is made[0] for c in made) and made[0] is not None
    # one range pass (min-max) and one histogram pass (percentile, entropy) for them all
    assert len(passes) == 2 and made[0].passes == 2 and made[0].runs >= 2


def test_a_fixed_batch_model_counts_every_row_once(case, tmp_path):
    """A model of fixed batch 8 gets 8 rows whatever the chunk asked (the measuring run
    too): its statistics hold each of the 32 rows once; the range pass's measuring run is
    its first chunk, reused, not repeated, and its ranges are the histogram pass's."""
    model, x, names = case
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    from tpuasm.compiler.front.samples import calibration_feeds
    made = []

    def feeds(rows):
        for feed in calibration_feeds({"x": x[:32]}, {"x": [8, 3, 8, 8]}, None, rows):
            made.append(len(feed["x"]))
            yield feed

    ours = CalibrationPass()
    ours.collect(fixed, names, feeds, histograms=True)
    # a run measuring the tensors' sizes, then the histogram pass's four
    assert set(made) == {8} and ours.runs == 4 and len(made) == 1 + 4
    assert ours.tensors["x"].counts.sum() == 32 * 3 * 8 * 8
    whole = CalibrationPass()
    whole.collect(model, names, _feeds(x[:32], 32), histograms=True)
    for name in names:
        assert np.array_equal(ours.tensors[name].counts, whole.tensors[name].counts)
    made.clear()
    ranged = CalibrationPass()
    ranged.collect(fixed, names, feeds)
    assert made == [8] * (1 + 4) and ranged.runs == 4      # the measuring run is chunk 0
    assert ranged.ranges(names, "minmax").keys() == ours.ranges(names, "minmax").keys()
    for name, (lo, hi) in ranged.ranges(names, "minmax").items():
        assert (lo, hi) == ours.ranges([name], "minmax")[name], name


@pytest.mark.parametrize("values", [[1e-40, -3e-41, 0.0], [3e38, -3.3e38, 1.0]])
def test_subnormal_and_near_overflow_values_are_binned(values):
    """A bound of 2^-132 (its scale 2^144 overflows float32: float64 then) and of 2^128."""
    stats = TensorStatistics()
    stats.add(np.array(values, np.float32))
    assert stats.counts.sum() == 3 and len(np.flatnonzero(stats.counts)) == 3
    assert [_value(v) for v in stats.minmax()] == [float(np.float32(min(values))),
                                                   float(np.float32(max(values)))]


def test_tensors_of_unknown_type_are_calibrated_when_their_values_are_float(case):
    """A tensor the model gives no type (onnxruntime's own shape inference may know it, and
    quantize it) is exposed anyway and calibrated if float; an integer one is left out."""
    model, x, _ = case
    untyped = onnx.ModelProto()
    untyped.CopyFrom(model)
    del untyped.graph.value_info[:]                    # c1, r1, c2, t2, f: no types
    shape = helper.make_node("Shape", ["r1"], ["r1_shape"], name="shape")
    # a boolean one too: no ReduceMin takes it, its size is measured by Size alone
    positive = helper.make_node("Greater", ["c1", "zero"], ["c1_positive"], name="positive")
    untyped.graph.initializer.append(numpy_helper.from_array(np.float32(0), "zero"))
    untyped.graph.node.extend([shape, positive])
    names = float_tensors(untyped, ["conv1", "relu1", "conv2", "shape", "positive"])
    assert {"c1", "r1", "c2", "r1_shape", "c1_positive"} <= set(names)
    ours = CalibrationPass()
    ours.collect(untyped, names, _feeds(x, 32))
    got = ours.ranges(names, "minmax")
    assert "r1_shape" not in got and ours.tensors["r1_shape"] is None
    assert ours.tensors["c1_positive"] is None
    typed = CalibrationPass()
    typed.collect(model, ["c1", "r1", "c2"], _feeds(x, 32))
    for name in ("c1", "r1", "c2"):
        assert all(np.array_equal(a, b) for a, b in zip(got[name],
                                                        typed.ranges([name], "minmax")[name]))
    binned = CalibrationPass()            # the histogram pass measures them by Size alone
    binned.collect(untyped, names, _feeds(x, 32), histograms=True)
    assert binned.tensors["r1_shape"] is None and binned.tensors["c1_positive"] is None
    for name in ("c1", "r1", "c2"):
        assert binned.tensors[name].binned and binned.tensors[name].counts.sum() > 0
        assert all(np.array_equal(a, b) for a, b in zip(got[name],
                                                        binned.ranges([name], "minmax")[name]))


def _fixed_copy(model, batch):
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = batch
    return fixed


def _fixed_feeds(x, batch, made):
    from tpuasm.compiler.front.samples import calibration_feeds

    def feeds(rows):
        for feed in calibration_feeds({"x": x}, {"x": [batch, 3, 8, 8]}, None, rows):
            made.append(len(feed["x"]))
            yield feed
    return feeds


def test_a_fixed_batch_larger_than_the_budget_is_binned_a_few_tensors_a_pass(case):
    """Fixed batch 32, a budget of 16 rows' tensors: no run can have fewer rows, so the
    tensors are exposed a few at a time, one pass each (each at most the budget), and the
    histograms are those of one pass over everything."""
    model, x, names = case
    budget = 16 * 4 * (3 * 64 + 2 * 8 * 64 + 3 * 4 * 16 + 10)
    made = []
    ours = CalibrationPass()
    ours.collect(_fixed_copy(model, 32), names, _fixed_feeds(x, 32, made), budget=budget,
                 histograms=True)
    groups = calibrate_groups(names, ours._bytes, budget)
    assert ours.passes == len(groups) >= 2 and ours.runs == ours.passes * ROWS // 32
    assert sorted(n for g in groups for n in g) == sorted(names)
    assert max(sum(ours._bytes[n] for n in g) for g in groups) <= budget
    whole = CalibrationPass()
    whole.collect(model, names, _feeds(x, 32), histograms=True)
    for name in names:
        assert np.array_equal(ours.tensors[name].counts, whole.tensors[name].counts), name


def calibrate_groups(names, sizes, budget):
    from tpuasm.compiler.front.calibrate import _groups
    return _groups(names, sizes, budget)


def test_a_fixed_batch_larger_than_the_budget_is_binned_at_a_batch_of_one(case):
    """With the model at a batch of one (`rebatched`), one pass of one-row runs bins every
    tensor: the same histograms, and no run exposes more than a row's tensors."""
    model, x, names = case
    per_row = 4 * (3 * 64 + 2 * 8 * 64 + 3 * 4 * 16 + 10)
    made, ones = [], []
    ours = CalibrationPass()
    ours.collect(_fixed_copy(model, 32), names, _fixed_feeds(x, 32, made),
                 budget=8 * per_row, histograms=True,
                 rebatched=lambda: (_fixed_copy(model, 1), _fixed_feeds(x, 1, ones)))
    assert ours.passes == 1 and made == [32] and set(ones) == {1}
    assert ours.runs == ROWS and len(ones) == 1 + ROWS       # a measuring run, then each row
    whole = CalibrationPass()
    whole.collect(model, names, _feeds(x, 32), histograms=True)
    for name in names:
        assert np.array_equal(ours.tensors[name].counts, whole.tensors[name].counts), name


def test_the_model_at_a_batch_of_one_is_taken_only_when_it_is_the_same_graph(case):
    """quantize's calibration_model: the compile's model at a batch of one differs in its
    int64 shape constants alone (a Reshape's target); any other difference (a weight) and
    it is refused (None: the histograms then come a few tensors a pass)."""
    from tpuasm.compiler.front.quantize import calibration_model, same_but_shapes

    def with_reshape(batch, weight=0.5):
        m = onnx.ModelProto()
        m.CopyFrom(case[0])
        g = m.graph
        g.input[0].type.tensor_type.shape.dim[0].dim_value = batch
        flat = next(n for n in g.node if n.op_type == "Flatten")
        flat.op_type, flat.input[:] = "Reshape", [flat.input[0], "target"]
        g.initializer.append(numpy_helper.from_array(np.array([batch, 64], np.int64),
                                                     "target"))
        g.initializer[0].CopyFrom(numpy_helper.from_array(
            np.full((8, 3, 3, 3), weight, np.float32), g.initializer[0].name))
        del g.value_info[:]
        return onnx.shape_inference.infer_shapes(m)

    model, x = with_reshape(64), case[1]
    assert same_but_shapes(model, with_reshape(1))
    assert not same_but_shapes(model, with_reshape(1, weight=0.25))
    got = calibration_model(model, lambda: with_reshape(1), {"x": x}, None, "m.onnx")
    one, feeds = got
    assert one.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    assert [len(f["x"]) for f in feeds(8)] == [1] * ROWS
    assert calibration_model(model, lambda: with_reshape(1, 0.25), {"x": x}, None,
                             "m.onnx") is None


def _computed_reshape_model():
    """The case's network with its Flatten written as exporters write it: Reshape to
    (Shape(x)[0], -1), which the compile folds into a constant holding its batch."""
    m = _model()
    g = m.graph
    flat = next(n for n in g.node if n.op_type == "Flatten")
    at = list(g.node).index(flat)
    g.initializer.extend([numpy_helper.from_array(np.array([0], np.int64), "zero"),
                          numpy_helper.from_array(np.array([-1], np.int64), "minus_one")])
    made = [helper.make_node("Shape", ["t2"], ["t2_shape"], name="shape"),
            helper.make_node("Gather", ["t2_shape", "zero"], ["n"], name="batch", axis=0),
            helper.make_node("Concat", ["n", "minus_one"], ["target"], name="target",
                             axis=0)]
    flat.op_type, flat.input[:] = "Reshape", ["t2", "target"]
    for k, node in enumerate(made):
        g.node.insert(at + k, node)
    del g.value_info[:]
    return onnx.shape_inference.infer_shapes(m)


def test_the_compile_bins_a_batch_it_folded_at_a_batch_of_one(tmp_path, monkeypatch):
    """A float model whose batch the compile folds into its constants: with a budget below
    one batch's tensors its percentile histograms come from the model folded and prepared
    at a batch of one, one pass (no run exposes more than a row's tensors), and its QDQ
    model is the one the default budget gives."""
    from tpuasm.compiler.front import calibrate as calibrate_module
    from tpuasm.compiler.pipeline import compile_model
    path = tmp_path / "reshape.onnx"
    onnx.save(_computed_reshape_model(), str(path))
    x = np.random.default_rng(1).standard_t(4, (ROWS, 3, 8, 8)).astype(np.float32)
    options = QuantOptions(calibration_method="percentile")

    def compiled():
        m = compile_model(path, batch=16, calibration=x, quantization=options,
                          validate=False, codegen=False)
        return onnx.load(str(m.reference_model))

    wide = compiled()
    taken, real = [], quantize_module.calibration_model

    def spy(*args):
        got = real(*args)
        taken.append(got)
        return got

    monkeypatch.setattr(quantize_module, "calibration_model", spy)
    monkeypatch.setattr(calibrate_module, "CHUNK_BYTES", 4 * 8 * 64 * 4)   # four rows' c1
    narrow = compiled()
    assert len(taken) == 1 and taken[0] is not None
    assert taken[0][0].graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    assert narrow.graph == wide.graph


# --- ranges extrapolated to new rows ----------------------------------------------------

def test_extrapolated_ranges_grow_by_the_growth_from_half_the_rows():
    """[lo - (lo_half - lo), hi + (hi - hi_half)]: the half's pass is the set's first half,
    made once per set; a range the half already reached does not grow."""
    from tpuasm.compiler.front.calibrate import Extrapolated
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    g = helper.make_graph([node], "r", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 2])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["N", 2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.zeros((8, 2), np.float32)
    x[:4, 0] = [-1.0, 0.5, 1.0, 0.0]          # the first half: x in [-1, 1]
    x[4:, 0] = [-4.0, 3.0, 0.0, 0.0]          # all of it: x in [-4, 3]
    whole = CalibrationPass()
    extrapolated = Extrapolated(whole, _feeds(x[:4], 2))
    extrapolated.collect(model, ["x", "y"], _feeds(x, 2))
    ranges = extrapolated.ranges(["x", "y"], "minmax")
    assert (_value(ranges["x"][0]), _value(ranges["x"][1])) == (-7.0, 5.0)
    assert (_value(ranges["y"][0]), _value(ranges["y"][1])) == (0.0, 5.0)   # 0: reached
    assert whole.ranges(["x"], "minmax")["x"][1] == 3.0                      # untouched
    tensors = extrapolated.tensors
    assert (tensors["x"].low, tensors["x"].high) == (-7.0, 5.0)
    assert Extrapolated(whole, None).half is extrapolated.half              # one per set
    with pytest.raises(ValueError):
        extrapolated.ranges(["x"], "percentile")


def _two_scores(rows: int, low: float, high: float, seed: int) -> np.ndarray:
    """Rows (a, a + d): a rising evenly from `low` to `high` along the rows (the set's
    extremes grow as it goes: half of it reaches half way), d uniform in [-0.5, 0.5]: the
    class is d's sign."""
    a = np.linspace(low, high, rows, dtype=np.float32)
    d = np.random.default_rng(seed).uniform(-0.5, 0.5, rows).astype(np.float32)
    return np.stack([a, a + d], axis=1)


def test_the_search_extrapolates_ranges_that_clip_the_rows_it_held_out(tmp_path):
    """A Gemm's two scores (a, a + d): min-max ranges of 128 rows with a up to 16 keep
    every answer on those rows, and tie both scores of new rows beyond 16 at the range's
    top (the class flips to 0).  Held out, ranges fitted to the first 64 rows clip the
    other 64 the same way, and extrapolated ones (from the first 32) much less: so the
    model's ranges are extrapolated from all 128, and new rows up to 24 keep their class
    (but those within its rounding of a tie)."""
    from tpuasm.compiler.ort import session
    from tpuasm.compiler.runtime.calibsearch import quantize_checked
    w = numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"], name="scores")], "two",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                          [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = _two_scores(128, 0.0, 16.0, 0)
    new = _two_scores(512, 16.0, 24.0, 1)
    want = new[:, 1] > new[:, 0]

    def new_rows_kept(path):
        y = session(onnx.load(str(path))).run(None, {"x": new})[0]
        return float(np.mean((y[:, 1] > y[:, 0]) == want))

    _, options, note = quantize_checked(model, {"x": x}, {"x": ["N", 2]}, tmp_path / "q.onnx",
                                        QuantOptions(), "m.onnx", None, None, model,
                                        {"x": x}, 0.9, 10.0, held_out=True)
    assert options.extrapolate_ranges and "extrapolated from all 128" in note, note
    plain = tmp_path / "plain.onnx"
    quantize(model, {"x": x}, {"x": ["N", 2]}, plain, QuantOptions(calibration_method="minmax"),
             "m.onnx")
    assert new_rows_kept(plain) < 0.75 and new_rows_kept(tmp_path / "q.onnx") > 0.9
    # the check rows are not calibration rows (--validate DATA): nothing to hold out
    _, options, _ = quantize_checked(model, {"x": x}, {"x": ["N", 2]}, tmp_path / "v.onnx",
                                     QuantOptions(), "m.onnx", None, None, model, {"x": x},
                                     0.9, 10.0, held_out=False)
    assert not options.extrapolate_ranges

"""Activation ranges for every calibration method from streaming passes of the float model.

onnxruntime's calibrators keep every intermediate tensor of every calibration chunk until the
pass ends (its histogram methods then stack them all): compiling PaddleOCR's recogniser
peaked at 11.2 GB, and each method the check tries (runtime/calibsearch.py) ran the model
again.  Here (CalibrationPass) the min and max of every tensor come from a range pass that
computes them inside onnxruntime's graph, no tensor leaving the session; the histograms
percentile and entropy need come, only when asked, from a pass that exposes the tensors a
chunk at a time and folds each into its `TensorStatistics` (min, max and a fine histogram)
before the next chunk: memory is the model's working set plus one chunk's exposed tensors
(at most CHUNK_BYTES) and a histogram per tensor; percentile and entropy ranges come from the
same histograms.

Min-max is exactly onnxruntime's (the min and max of float32 values; the QDQ model is the
one quantize_static writes with its own calibrator, byte for byte).  Percentile and entropy
are computed the way onnxruntime's calibrators compute them, on the histogram onnxruntime
would build (symmetric |x| in 2048 bins for percentile, 512 bins over [-max|x|, max|x|] for
entropy), rebuilt from the fine histogram: a fine bin that straddles one of those bins'
edges is split in proportion, so percentile lands within max|x| / 1024 of onnxruntime's
(two of its bins), and entropy's range is as good by its own criterion (KL divergence on
onnxruntime's histogram within 1 % of the least) but may sit a few bins away where the
divergence is flat (tests/test_compiler_calibrate.py)."""
from __future__ import annotations

import math

import numpy as np
import onnx

FINE_BINS = 8192          # over [-bound, bound): >= 2 fine bins per bin of onnxruntime's
_BLOCK = 1 << 18          # values binned at a time (a cache-sized float32 block)
PERCENTILE_BINS = 2048    # onnxruntime's percentile calibrator (on |x|)
ENTROPY_BINS = 512        # quantize.py's entropy setting (onnxruntime's default is 128)
ENTROPY_QUANTIZED_BINS = 128


class TensorStatistics:
    """One tensor's values over the calibration pass: min, max and counts in FINE_BINS
    equal bins over [-bound, bound), the bound the least power of two above every |x| seen:
    doubled (pairs of bins merged, exactly) whenever a chunk's values reach it.  The counts
    therefore do not depend on how the rows were cut into chunks, nor on their order."""

    __slots__ = ("low", "high", "nearest", "bound", "counts", "dtype", "binned")

    def __init__(self):
        self.low = self.high = self.nearest = None
        self.bound = 0.0
        self.counts = np.zeros(FINE_BINS, np.int64)
        self.dtype = np.dtype(np.float32)
        self.binned = True         # False once add_range gave it a range without values

    def add_range(self, low, high) -> None:
        """A chunk's min and max alone (computed in the graph: CalibrationPass's range
        pass), for min-max: no histogram then.  A NaN one is skipped, as onnxruntime's
        calibrator's nanmin / nanmax over its chunks' reductions skip it."""
        self.binned = False
        self.dtype = np.asarray(low).dtype
        if not np.isnan(low):
            self.low = low if self.low is None else min(self.low, low)
        if not np.isnan(high):
            self.high = high if self.high is None else max(self.high, high)

    def add(self, values: np.ndarray) -> None:
        x = np.asarray(values).reshape(-1)
        if x.size == 0:
            return
        self.dtype = x.dtype
        low, high = np.min(x), np.max(x)
        if np.isnan(low) or np.isnan(high):            # as onnxruntime's nanmin/nanmax
            low, high = np.nanmin(x), np.nanmax(x)
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)
        if np.isfinite(low) and np.isfinite(high):
            finite, reach = x, max(abs(float(low)), abs(float(high)))
        else:                                  # an overflow: its range fails in quantize
            finite = x[np.isfinite(x)]
            if finite.size == 0:
                return
            reach = max(abs(float(np.min(finite))), abs(float(np.max(finite))))
        if reach > 0.0 and self.bound == 0.0:
            self.bound = math.ldexp(1.0, math.frexp(reach)[1])   # a power of two > reach
        while reach >= self.bound > 0.0:
            self._double()
        self._count(finite)

    def _count(self, x: np.ndarray) -> None:
        """Bin `x` (every |x| < bound) and note its least |x|, a block at a time: a chunk's
        tensor can be a hundred million values, and whole-array temporaries cost more in
        page faults than the arithmetic.  The bin is floor(x * FINE_BINS / (2 bound)) + the
        centre: a power-of-two scale, exact in float32, so a value's bin is the same
        whichever chunk brings it, before or after a doubling."""
        scale = FINE_BINS / (2.0 * self.bound) if self.bound else 0.0
        # float32 holds the scale unless every |x| is below 2^-114: float64 then
        work = np.float32 if scale < 2.0 ** 120 else np.float64
        scale = work(scale)
        block = np.empty(min(x.size, _BLOCK), work)
        index = np.empty(block.size, np.int32)
        nearest = math.inf
        for start in range(0, x.size, _BLOCK):
            part = x[start:start + _BLOCK]
            t, i = block[:part.size], index[:part.size]
            np.abs(part, out=t, casting="same_kind")
            nearest = min(nearest, float(t.min()))      # percentile's |x| bins start here
            np.multiply(part, scale, out=t, casting="same_kind")
            np.floor(t, out=t)
            t += work(FINE_BINS // 2)
            np.copyto(i, t, casting="unsafe")          # in [0, FINE_BINS): |x| < bound
            self.counts += np.bincount(i, minlength=FINE_BINS)
        self.nearest = nearest if self.nearest is None else min(self.nearest, nearest)

    def _double(self) -> None:
        merged = self.counts.reshape(-1, 2).sum(axis=1)
        self.counts = np.zeros(FINE_BINS, np.int64)
        self.counts[FINE_BINS // 4: 3 * FINE_BINS // 4] = merged
        self.bound *= 2.0

    def _limits(self):
        low = np.asarray(self.low if self.low is not None else 0, self.dtype)
        high = np.asarray(self.high if self.high is not None else 0, self.dtype)
        return low, high

    def minmax(self) -> tuple[np.ndarray, np.ndarray]:
        """onnxruntime's MinMax calibrator's range: arrays of shape (1,), as its reduction's
        outputs are."""
        low, high = self._limits()
        return low.reshape(1), high.reshape(1)

    def percentile(self, percentile: float) -> tuple[np.ndarray, np.ndarray]:
        """onnxruntime's (symmetric) percentile range: the left edge t of the bin of |x|
        (PERCENTILE_BINS over [min|x|, max|x|]) where the share `percentile` of values is
        reached, as (-t, t) clipped to [min, max]."""
        low, high = self._limits()
        reach = max(abs(float(low)), abs(float(high)))
        floor = self.nearest if self.nearest is not None else reach
        half = FINE_BINS // 2
        folded = self.counts[half:] + self.counts[:half][::-1]      # |x| over [0, bound]
        edges = np.linspace(np.float32(floor), np.float32(reach), PERCENTILE_BINS + 1,
                            dtype=self.dtype if self.dtype != np.float16 else np.float32)
        if reach == floor:
            threshold = np.asarray(reach, self.dtype)
        else:
            counts = _rebin(folded, 0.0, self.bound, edges.astype(np.float64))
            cdf = np.cumsum(counts / max(counts.sum(), 1e-300))
            index = min(int(np.searchsorted(cdf, percentile / 100.0)), PERCENTILE_BINS)
            threshold = np.asarray(edges[index], self.dtype)
        return _clipped(-threshold, threshold, low, high)

    def entropy(self, bins: int = ENTROPY_BINS,
                quantized_bins: int = ENTROPY_QUANTIZED_BINS) -> tuple[np.ndarray, np.ndarray]:
        """onnxruntime's entropy (KL divergence) range on `bins` bins over [-max|x|,
        max|x|], clipped to [min, max]."""
        low, high = self._limits()
        reach = np.float32(max(abs(float(low)), abs(float(high))))
        if reach == 0:
            return _clipped(np.asarray(0, self.dtype), np.asarray(0, self.dtype), low, high)
        edges = np.linspace(-reach, reach, bins + 1).astype(self.dtype)
        counts = np.rint(_rebin(self.counts, -self.bound, self.bound,
                                edges.astype(np.float64)))       # whole counts, as its own
        start, stop = kl_threshold(counts, quantized_bins)
        return _clipped(np.asarray(edges[start], self.dtype), np.asarray(edges[stop], self.dtype),
                        low, high)


def _clipped(lo, hi, low, high):
    lo = low if lo < low else lo
    hi = high if hi > high else hi
    return np.asarray(lo, low.dtype), np.asarray(hi, high.dtype)


def _rebin(counts: np.ndarray, start: float, stop: float, edges: np.ndarray) -> np.ndarray:
    """Counts in equal bins over [start, stop] -> counts between `edges` (which hold every
    counted value), each bin's count spread evenly over it."""
    fine = np.linspace(start, stop, counts.size + 1)
    cumulative = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)])
    at = np.interp(edges, fine, cumulative)
    at[0], at[-1] = 0.0, cumulative[-1]       # the values at the ends belong to the end bins
    return np.diff(at)


def kl_threshold(hist: np.ndarray, quantized_bins: int) -> tuple[int, int]:
    """The bins [start, stop) of `hist` (symmetric about its centre) whose quantization into
    `quantized_bins` levels loses the least information (TensorRT's KL-divergence
    calibration, as onnxruntime's entropy calibrator defines it): every width 2i+1 around
    the centre from `quantized_bins` + 1 bins up, the first of the least divergences."""
    hist = np.asarray(hist, np.float64)
    n = hist.size
    centre, half = n // 2, quantized_bins // 2
    below = np.concatenate([[0.0], np.cumsum(hist)])       # below[k] = sum(hist[:k])
    best, best_bins = np.inf, (centre - half, min(centre + half + 1, n))
    for i in range(half, centre + 1):
        start, stop = centre - i, min(centre + i + 1, n)
        div = kl_divergence(hist, start, stop, quantized_bins, below)
        if div < best:
            best, best_bins = div, (start, stop)
    return best_bins


def kl_divergence(hist: np.ndarray, start: int, stop: int, quantized_bins: int,
                  below: np.ndarray | None = None) -> float:
    """KL(p || q) for the bins [start, stop) of `hist`: p the clipped distribution (the
    outliers added to its end bins), q p's bins merged into `quantized_bins` groups and
    each group's count spread evenly (whole counts) over the group's bins p does not leave
    empty."""
    hist = np.asarray(hist, np.float64)
    if below is None:
        below = np.concatenate([[0.0], np.cumsum(hist)])
    sliced = hist[start:stop]
    p = sliced.copy()
    p[0] += below[start]
    p[-1] += below[hist.size] - below[stop]
    filled = p != 0
    group = sliced.size // quantized_bins
    whole = group * quantized_bins
    sums = sliced[:whole].reshape(quantized_bins, group).sum(axis=1)
    sums[-1] += sliced[whole:].sum()
    used = filled[:whole].reshape(quantized_bins, group).sum(axis=1)
    spread = np.where(used > 0, np.floor(sums / np.maximum(used, 1)), 0.0)
    q = np.zeros(p.size)
    q[:whole] = np.repeat(spread, group)
    return _kl(_smoothed(p), _smoothed(q))


def _smoothed(p: np.ndarray, eps: float = 1e-4):
    """p with its zeros raised to eps and the same mass taken evenly off the others (so
    that the KL divergence is finite); None when p is all zeros."""
    zeros = p == 0
    nonzero = p.size - int(zeros.sum())
    if nonzero == 0:
        return None
    out = p.astype(np.float32)
    out += np.where(zeros, eps, -eps * float(zeros.sum()) / nonzero).astype(np.float32)
    return out


def _kl(p, q) -> float:
    """KL(p || q) in float32, as onnxruntime computes it (its near-ties fall the same way)."""
    if p is None or q is None:
        return np.inf
    p = p / p.sum()
    q = q / q.sum()
    with np.errstate(all="ignore"):
        terms = np.where((p > 0) & (q > 0), p * np.log(p / q), np.float32(np.inf))
    return float(np.where(p == 0, np.float32(0), terms).sum(dtype=np.float32))


CHUNK_BYTES = 64 << 20    # the exposed tensors' values of one onnxruntime run


def _same_feed(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.shape(a[k]) == np.shape(b[k]) and np.array_equal(a[k], b[k]) for k in a)


class CalibrationPass:
    """The statistics of a float model's tensors over a calibration set, collected by
    `collect` for the tensors not yet seen: calibsearch asks for every method, and keeping
    nodes float asks for fewer tensors, without another pass.  One object serves one model
    and one calibration set.

    Two kinds of pass.  The range pass (min-max): each float32 tensor's min and max are
    computed by onnxruntime inside the graph, by a ReduceMin and a ReduceMax right after
    the node that makes it (as onnxruntime's own MinMax calibrator adds them) run in the
    order that frees the tensor at once, so no tensor leaves the session: its memory is the
    model's own working set (Magika at its fixed batch of 64: 0.9 GB with the 31 tensors
    exposed, 0.33 GB so) and no value is touched by numpy.  Min-max needs nothing more.
    The histogram pass (`histograms`: percentile, entropy; their min and max too) exposes
    the tensors and bins them (TensorStatistics.add), at most `budget` bytes of them a run:
    fewer rows a run; for a model whose fixed batch holds more than that, the same model at
    a batch of one (`rebatched`), else fewer tensors a pass."""

    def __init__(self):
        self.tensors: dict[str, TensorStatistics | None] = {}   # None: not float
        self.runs = 0              # onnxruntime runs (chunks) made, for tests and reports
        self.rows = 0              # rows per run of the last pass
        self.passes = 0            # passes over the calibration set
        self._bytes: dict[str, int] = {}     # a tensor's bytes in the range pass's first run
        # the pass over the first half of the same set, for Extrapolated (made by it)
        self.half: CalibrationPass | None = None

    def collect(self, model: onnx.ModelProto, names, feeds, most_rows: int = 64,
                budget: int | None = None, histograms: bool = False, rebatched=None) -> None:
        """Run `model` over the calibration set for the min and max of the tensors of
        `names` not seen yet (with `histograms`: the histograms of those not binned yet).
        `feeds(rows)` iterates over the set as {input: chunk} of at most `rows` rows (a
        model of fixed batch gets its batch whatever the rows asked); a one-row run first
        measures each tensor's bytes (shape inference rarely knows them all: a one-hot's
        depth, an image's height); then chunks of at most `most_rows` rows (the model's
        own working set) and `budget` bytes of exposed tensors (CHUNK_BYTES) go.
        `rebatched()`: None, or (the model at a batch of one, its feeds) for a histogram
        pass the fixed batch would not fit."""
        names = list(dict.fromkeys(names))
        budget = budget or CHUNK_BYTES
        if histograms:          # its min and max too: no range pass first
            unbinned = [n for n in names if n not in self.tensors or (
                self.tensors[n] is not None and not self.tensors[n].binned)]
            if unbinned:
                self._histogram_pass(model, unbinned, feeds, most_rows, budget, rebatched)
            return
        unseen = [n for n in names if n not in self.tensors]
        if unseen:
            self._range_pass(model, unseen, feeds, most_rows, budget)

    def _range_pass(self, model, names, feeds, most_rows: int, budget: int) -> None:
        """Min and max of `names`: in the graph for the float32 tensors, from their exposed
        values for the others (float16, or of a type the model does not say: kept when
        their values are float)."""
        from tpuasm.compiler.ort import session
        float32 = _typed(model, onnx.TensorProto.FLOAT)
        reduced = [n for n in names if n in float32]
        exposed = [n for n in names if n not in float32]
        probe, made = _range_probe(model, reduced, exposed)
        wanted = [o for n in reduced for o in made[n]] + exposed
        # no arena: it grows in powers of two (Magika's range pass: 0.33 -> 0.25 GB)
        run = session(probe, threads=0, optimize=False, arena=False, early_free=True)
        del probe
        first = next(iter(feeds(1)), None)
        if first is None:
            return
        values = dict(zip(wanted, run.run(wanted, first)))
        self._bytes.update({n: 4 * int(values[made[n][2]]) for n in reduced})
        self._bytes.update({n: int(getattr(values[n], "nbytes", 0)) for n in exposed})
        per_row = sum(self._bytes[n] for n in exposed)
        self.rows = int(max(1, min(most_rows, budget // max(per_row, 1))))
        found = {n: TensorStatistics() for n in names}
        self.passes += 1
        for k, feed in enumerate(feeds(self.rows)):
            if k or not _same_feed(feed, first):     # a fixed batch: that run was this one
                values = dict(zip(wanted, run.run(wanted, feed)))
            for n in reduced:
                low, high, size = (values[o] for o in made[n])
                if int(size):
                    found[n].add_range(low.reshape(-1)[0], high.reshape(-1)[0])
            for n in exposed:
                _add(found, n, values[n])
            values = None
            self.runs += 1
        self.tensors.update(found)

    def _histogram_pass(self, model, names, feeds, most_rows: int, budget: int,
                        rebatched) -> None:
        from tpuasm.compiler.ort import session
        unmeasured = [n for n in names if n not in self._bytes]
        if unmeasured:
            self._bytes.update(self._measured(model, unmeasured, feeds))
        sizes = self._bytes
        if sum(sizes.get(n, 0) for n in names) > budget and rebatched is not None:
            one = rebatched()
            if one is not None:
                model, feeds = one
                sizes = self._measured(model, names, feeds)
        for group in _groups(names, sizes, budget):
            probe = _exposing(model, group)
            run = session(probe, threads=0, optimize=False, arena=False)
            del probe
            self.rows = int(max(1, min(most_rows, budget // max(
                sum(sizes.get(n, 0) for n in group), 1))))
            found = {n: TensorStatistics() for n in group}
            self.passes += 1
            for feed in feeds(self.rows):
                for name, value in zip(group, run.run(group, feed)):
                    _add(found, name, value)
                self.runs += 1
            self.tensors.update(found)

    @staticmethod
    def _measured(model, names, feeds) -> dict[str, int]:
        """Each tensor's bytes in one run of `model` on the first one-row feed (its Size
        computed in the graph; 4 bytes a value, float32's)."""
        from tpuasm.compiler.ort import session
        probe, made = _range_probe(model, names, [], ops=("Size",))   # any type
        run = session(probe, threads=0, optimize=False, arena=False, early_free=True)
        first = next(iter(feeds(1)), None)
        if first is None:
            return {}
        sizes = run.run([made[n][0] for n in names], first)
        return {n: 4 * int(s) for n, s in zip(names, sizes)}

    def ranges(self, names, method: str, percentile: float = 99.999) -> dict:
        """{tensor: (lowest, highest)} by `method` (minmax, percentile or entropy; those
        two need the histograms: collect(histograms=True))."""
        out = {}
        for name in names:
            stats = self.tensors.get(name)
            if stats is None or stats.low is None:
                continue                   # never computed a value (an empty tensor)
            if method != "minmax" and not stats.binned:
                raise ValueError(f"{method} ranges of {name}: collect(histograms=True) first")
            out[name] = stats.minmax() if method == "minmax" else \
                stats.percentile(percentile) if method == "percentile" else stats.entropy()
        return out


class _Range:
    """A tensor's extrapolated min and max, read as a TensorStatistics' are (tied_ranges)."""
    __slots__ = ("low", "high")

    def __init__(self, low, high):
        self.low, self.high = low, high


class Extrapolated:
    """Min-max ranges carried one doubling of the rows beyond the calibration set, for data
    it has not seen.  The extremes of a tensor grow with the rows (about with their log, for
    light tails): the growth from the set's first half to the whole set is the growth to
    expect again from the whole set to twice as many rows, so each range is widened by it,
    [lo - (lo_half - lo), hi + (hi - hi_half)].  Min-max ranges fitted to 128 rows clipped
    new rows' gate sums of a JAX LSTM (the calibration rows' values beyond the range: none,
    by construction; new rows': 4 %), flipping 1.4 % of their top-1 where the check, which
    reads the calibration rows, saw none (runtime/calibsearch.py tries these ranges when the
    rows it holds out say so).  `whole`: the set's CalibrationPass; `half_feeds(rows)`: the
    feeds of its first half.  The half's pass is kept on `whole`: one per model and set."""

    def __init__(self, whole: CalibrationPass, half_feeds):
        self.whole = whole
        if whole.half is None:
            whole.half = CalibrationPass()
        self.half, self._half_feeds = whole.half, half_feeds
        self._tensors: dict | None = None

    def collect(self, model, names, feeds, most_rows: int = 64, budget: int | None = None,
                histograms: bool = False, rebatched=None) -> None:
        if histograms:
            raise ValueError("extrapolated ranges are min-max ranges: no histograms")
        self.whole.collect(model, names, feeds, most_rows, budget)
        self.half.collect(model, names, self._half_feeds, most_rows, budget)
        self._tensors = None

    def _widened(self, name: str):
        stats, half = self.whole.tensors.get(name), self.half.tensors.get(name)
        if stats is None or stats.low is None:
            return None
        low, high = stats.minmax()
        if half is not None and half.low is not None:
            half_low, half_high = half.minmax()
            low = (low - np.maximum(half_low - low, 0)).astype(low.dtype)
            high = (high + np.maximum(high - half_high, 0)).astype(high.dtype)
        return low, high

    @property
    def tensors(self) -> dict:
        """{tensor: its widened range}, as CalibrationPass.tensors (tied_ranges reads it a
        tensor at a time): made once per collect."""
        if self._tensors is None:
            self._tensors = {}
            for name in self.whole.tensors:
                found = self._widened(name)
                self._tensors[name] = None if found is None else _Range(found[0].item(),
                                                                         found[1].item())
        return self._tensors

    def ranges(self, names, method: str, percentile: float = 99.999) -> dict:
        if method != "minmax":
            raise ValueError(f"extrapolated ranges are min-max ranges, not {method}")
        return {n: found for n in names if (found := self._widened(n)) is not None}


def _add(found: dict, name: str, value) -> None:
    """An exposed tensor's values into its statistics (a tensor whose values are not float
    has none)."""
    if found[name] is None:
        return
    if getattr(value, "dtype", None) in (np.float32, np.float16):
        found[name].add(value)
    else:
        found[name] = None


def _typed(model: onnx.ModelProto, elem_type: int) -> set[str]:
    """The tensors the model declares of `elem_type` (value infos, inputs, outputs)."""
    g = model.graph
    return {v.name for v in (*g.value_info, *g.input, *g.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == elem_type}


_REDUCTIONS = ("ReduceMin", "ReduceMax", "Size")


def _range_probe(model: onnx.ModelProto, reduced, exposed, ops=_REDUCTIONS):
    """A copy of `model` whose outputs are, for each of `reduced`, its ReduceMin, ReduceMax
    (keepdims: an empty dimension reduces) and Size (`ops` of them), each placed right
    after the node that makes the tensor, and the tensors of `exposed` themselves; and
    {tensor: (output names of `ops`)}."""
    from onnx import helper
    g = model.graph
    taken = {t for n in g.node for t in [*n.input, *n.output]} | \
        {v.name for v in (*g.input, *g.output)}
    made, after = {}, {}
    for k, name in enumerate(reduced):
        outs = []
        for op in ops:
            out = f"{name}/calibrate/{op}"
            while out in taken:
                out += "_"
            outs.append(out)
            attrs = {"keepdims": 1} if op != "Size" else {}
            after.setdefault(name, []).append(helper.make_node(
                op, [name], [out], name=f"{out}/{k}", **attrs))
        made[name] = tuple(outs)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    nodes = list(probe.graph.node)
    del probe.graph.node[:]
    sources = [v.name for v in probe.graph.input]
    probe.graph.node.extend(n for s in sources for n in after.get(s, ()))
    for node in nodes:
        probe.graph.node.append(node)
        probe.graph.node.extend(n for o in node.output for n in after.get(o, ()))
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(o)
                              for outs in made.values() for o in outs)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n)
                              for n in exposed if n not in known)
    return probe, made


def _exposing(model: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of `model` with `names` among its outputs."""
    from onnx import helper
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n)
                              for n in names if n not in known)
    return probe


def _groups(names, sizes: dict, budget: int) -> list[list[str]]:
    """`names` in order, cut into groups of at most `budget` bytes (one tensor at least)."""
    groups, current, held = [], [], 0
    for name in names:
        size = sizes.get(name, 0)
        if current and held + size > budget:
            groups.append(current)
            current, held = [], 0
        current.append(name)
        held += size
    return groups + ([current] if current else [])


def float_tensors(model: onnx.ModelProto, nodes) -> list[str]:
    """The tensors `nodes` (names) read or write that onnxruntime's calibrators would
    calibrate: float or float16 by the model's value_info, inputs or outputs, and not
    initializers; and those whose type the model does not say (onnxruntime infers shapes
    again on its own copy and may know them: a paddle2onnx MatMul's output), kept by
    CalibrationPass.collect when their values are float."""
    chosen = set(nodes)
    inits = {t.name for t in model.graph.initializer}
    g = model.graph
    infos = {v.name: v for v in [*g.value_info, *g.output, *g.input]}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    names = []
    for node in g.node:
        if node.name not in chosen:
            continue
        for t in [*node.input, *node.output]:
            if not t or t in inits:
                continue
            v = infos.get(t)
            kind = v.type.tensor_type.elem_type if v is not None and \
                v.type.HasField("tensor_type") else 0
            if kind in floats or kind == 0:
                names.append(t)
    return list(dict.fromkeys(names))

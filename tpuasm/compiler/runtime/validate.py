"""The compiled model checked against the float model it came from: both run over the same
data (the calibration set, or the user's --validate DATA), onnxruntime on the float model,
the compiled model with reference.py's engine (bit-identical to the emulator, and fast).

Per output: top-1 agreement for outputs of class scores (the arg-max along the class axis at
every other position: each row of a (rows, classes) output, each step of a sequence of
classes; classaxis.py says which axis, and why), exact agreement for integer outputs
(labels), and the signal-to-noise ratio in dB of every float output (the float answer is
the signal, the difference the noise).  A figure below the user's bar (--min-agreement, --min-snr) is a
warning: the library returns it, the CLI prints it on stderr."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.runtime.probes import probe_why
from tpuasm.compiler.runtime.steps import batch_axis_of

DEFAULT_MIN_AGREEMENT = 0.99
DEFAULT_MIN_SNR = 20.0
_CHUNK = 256                       # rows per onnxruntime call for a dynamic batch
# Rows the default check (on the calibration data) runs: both models over every calibration
# row cost as much as the calibration itself again (issue 20, item 7: a 3 MB sequence CNN
# spent half its compile there).  128 keeps one disagreement in 100 rows under the default
# 99 % bar; the rows are spread evenly over the set (spread_rows), so a set ordered by
# class is still sampled across its classes.  Data the user gives (--validate) runs whole.
CALIBRATION_CHECK_ROWS = 128


@dataclass
class OutputCheck:
    """One output's figures."""
    name: str
    kind: str                        # "top-1" | "per-step top-1" | "exact" | "snr"
    agreement: float | None = None   # share of rows (steps) that agree (top-1 / exact)
    snr_db: float | None = None      # float outputs; inf when identical
    max_abs_error: float | None = None
    class_axis: int | None = None    # the axis top-1 is taken over
    why: str | None = None           # why that metric (classaxis.judged_axis)
    snr_too: bool = False            # judged by top-1 and held to the SNR bar as well
    expected: float | None = None    # top-1 expected on new rows (pair_agreement)
    expected_stderr: float | None = None   # the standard error of that estimate

    @property
    def judged(self) -> float | None:
        """The agreement held to --min-agreement: the lower of the rows' own and the one
        expected on new rows."""
        if self.expected is None or self.agreement is None:
            return self.agreement
        return min(self.agreement, self.expected)

    @property
    def cautious(self) -> float | None:
        """The lowest agreement new rows plausibly give: one standard error below the one
        expected (the calibration search holds this to --min-agreement, so that it does
        not stop at an estimate within its own noise of the bar; the warning is for the
        estimate itself)."""
        if self.expected is None or self.agreement is None:
            return self.agreement
        return min(self.agreement, self.expected - (self.expected_stderr or 0.0))

    @property
    def snr_bar(self) -> bool:
        """Whether its SNR is held to --min-snr."""
        return self.snr_db is not None and (self.kind == "snr" or self.snr_too)

    def text(self) -> str:
        parts = []
        if self.agreement is not None:
            what = "rows identical" if self.kind == "exact" else f"{self.kind} agreement"
            parts.append(f"{what} {100 * self.agreement:.2f} %" + (
                "" if self.expected is None else
                f" ({expected_text(self.expected, self.expected_stderr)})"))
        if self.snr_db is not None:
            parts.append("SNR identical" if math.isinf(self.snr_db) and self.snr_db > 0
                         else f"SNR {self.snr_db:.1f} dB")
        if self.max_abs_error is not None:
            parts.append(f"max |error| {self.max_abs_error:.3g}")
        return f"{self.name}: " + ", ".join(parts) + (f" ({self.why})" if self.why else "")

    def to_json(self) -> dict:
        snr = self.snr_db
        return {"output": self.name, "kind": self.kind, "agreement": self.agreement,
                "snr_db": snr if snr is None or math.isfinite(snr) else None,
                "identical": snr is not None and math.isinf(snr) and snr > 0,
                "max_abs_error": self.max_abs_error, "class_axis": self.class_axis,
                "why": self.why, "snr_too": self.snr_too, "expected_agreement": self.expected,
                "expected_stderr": self.expected_stderr}


@dataclass
class Validation:
    """The compiled model against the float model, per output; `warnings` for the CLI."""
    rows: int
    data: str                                  # where the rows came from
    min_agreement: float
    min_snr: float
    outputs: list[OutputCheck] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    of_rows: int | None = None                 # the data's rows when `rows` is a subset
    against: str = "the float model"           # what the float answers are of

    def text(self) -> str:
        which = (f"{self.rows} rows" if not self.of_rows or self.of_rows == self.rows
                 else f"{self.rows} of the {self.of_rows} rows (evenly spaced)")
        lines = [f"Against {self.against} (onnxruntime) on {which} of {self.data}:"]
        lines += [f"  {o.text()}" for o in self.outputs]
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    @classmethod
    def from_json(cls, d: dict) -> "Validation":
        outputs = [OutputCheck(o["output"], o["kind"], o["agreement"],
                               math.inf if o["identical"] else o["snr_db"], o["max_abs_error"],
                               o.get("class_axis"), o.get("why"), o.get("snr_too", False),
                               o.get("expected_agreement"), o.get("expected_stderr"))
                   for o in d["outputs"]]
        return cls(d["rows"], d["data"], d["min_agreement"], d["min_snr_db"], outputs,
                   list(d["warnings"]), d.get("of_rows"), d.get("against", "the float model"))

    def to_json(self) -> dict:
        return {"rows": self.rows, "of_rows": self.of_rows or self.rows, "data": self.data,
                "min_agreement": self.min_agreement,
                "min_snr_db": self.min_snr, "outputs": [o.to_json() for o in self.outputs],
                "warnings": list(self.warnings), "against": self.against}


def check_thresholds(min_agreement, min_snr) -> tuple[float, float]:
    """Range checks of the user's bars (one clear error each)."""
    try:
        a = float(min_agreement)
    except (TypeError, ValueError):
        raise CompileError(f"min agreement {min_agreement!r} is not a number") from None
    if not 0.0 <= a <= 1.0:
        raise CompileError(f"min agreement {min_agreement!r}: expected a share in [0, 1] "
                           f"(0.99 = 99 %)")
    try:
        s = float(min_snr)
    except (TypeError, ValueError):
        raise CompileError(f"min SNR {min_snr!r} is not a number") from None
    if not -200.0 <= s <= 400.0:
        raise CompileError(f"min SNR {min_snr!r}: expected dB in [-200, 400]")
    return a, s


def compare(float_out: dict, compiled_out: dict, names: list[str],
            classes: dict | None = None, expected: bool = True) -> list[OutputCheck]:
    """The figures of each output (arrays of the same rows); `classes`: {output: ClassAxis}
    of the float model (classaxis.class_axes), without which only a rank-2 output is
    judged by top-1; `expected`: whether top-1 outputs get pair_agreement's figures (a model
    calibrated by min-max, whose errors on the rows are rounding, not clipping)."""
    from tpuasm.compiler.runtime.classaxis import judged_axis
    checks = []
    for name in names:
        ref = np.asarray(float_out[name])
        got = np.asarray(compiled_out[name])
        if ref.shape != got.shape:
            raise CompileError(f"output '{name}': the compiled model gives shape {got.shape}, "
                               f"the float model {ref.shape}")
        if ref.dtype.kind in "iub":
            rows = ref.reshape(len(ref), -1) if ref.ndim else ref.reshape(1, -1)
            same = np.all(rows == got.reshape(rows.shape), axis=1)
            checks.append(OutputCheck(name, "exact", float(np.mean(same)) if len(same) else 1.0))
            continue
        ref64, got64 = ref.astype(np.float64), got.astype(np.float64)
        noise = float(np.sum((ref64 - got64) ** 2))
        signal = float(np.sum(ref64 ** 2))
        snr = math.inf if noise == 0 else (-math.inf if signal == 0 else
                                           10 * math.log10(signal / noise))
        err = float(np.max(np.abs(ref64 - got64))) if ref.size else 0.0
        axis, why, snr_too = judged_axis((classes or {}).get(name), ref.shape)
        if axis is None:
            checks.append(OutputCheck(name, "snr", None, snr, err, None, why))
            continue
        agree = float(np.mean(np.argmax(ref, axis) == np.argmax(got, axis))) if ref.size \
            else 1.0
        kind = "top-1" if ref.ndim == 2 else "per-step top-1"
        pair = pair_agreement(ref, got, axis) if expected else None
        checks.append(OutputCheck(name, kind, agree, snr, err, axis, why, snr_too,
                                  *(pair or (None, None))))
    return checks


def expected_text(expected: float, stderr: float | None) -> str:
    spread = f" ± {100 * stderr:.2f}" if stderr else ""
    return f"{100 * expected:.2f}{spread} % expected on new rows"


EXPECTED_ELEMENTS = 20_000_000   # the cost bound of pair_agreement: rows x rows x classes


def pair_agreement(ref: np.ndarray, got: np.ndarray, axis: int) -> tuple | None:
    """(the top-1 agreement to expect on rows the check has not seen, its standard error):
    each row's float scores with each row's quantization error (got - ref) added, the share
    of those pairs that keep the row's float top-1 (its own pair is the check's).  Few check
    rows say little by their flips alone: none of 128 is anywhere from 97 to 100 % on new
    data; the errors of every row against the margins of every row say more (a PyTorch GRU
    classifier: 99.22 % on its 128 rows, 98.45 % expected, 97.85 % on 1,024 new ones).
    Rounding errors move over to other rows; clipping ones do not (a clipped range cuts
    the largest scores, and another row's cut would flip rows it never reaches), so
    compare() asks for it for min-max models only (a random CNN calibrated by entropy:
    100 % on its 32 rows, 88.8 % expected, 96.2 % on 2,048 new rows; by min-max: 100 %,
    99.9 %, 98.1 %).  The estimate is a mean over pairs of two samples of the same rows,
    the rows' margins and the rows' errors, so its standard error is that of a two-sample
    U-statistic: the spread of the per-row means plus that of the per-error means, over
    the rows (a Keras attention block: 99.30 % expected from 128 rows, 98.93 % on 1,024
    new ones: a few rows near a tie carry the estimate).  Over rows (and steps) spread
    evenly when rows x rows x classes passes EXPECTED_ELEMENTS; None when a score is not
    finite."""
    scores = np.moveaxis(ref, axis, -1).astype(np.float64)
    classes = scores.shape[-1]
    scores = scores.reshape(-1, classes)
    moved = np.moveaxis(got, axis, -1).astype(np.float64).reshape(scores.shape)
    if not len(scores) or not (np.all(np.isfinite(scores)) and np.all(np.isfinite(moved))):
        return None
    errors = moved - scores
    keep = spread_rows(len(scores), max(16, math.isqrt(EXPECTED_ELEMENTS // classes)))
    scores, errors = scores[keep], errors[keep]
    rows = len(scores)
    top = scores.argmax(1)
    per_row = np.empty(rows)             # the share of the errors that keep row i's top-1
    per_error = np.zeros(rows)           # the share of the rows that error j keeps
    for i, (row, t) in enumerate(zip(scores, top)):
        kept = (row + errors).argmax(1) == t
        per_row[i] = np.count_nonzero(kept) / rows
        per_error += kept
    per_error /= rows
    spread = (per_row.var(ddof=1) + per_error.var(ddof=1)) / rows if rows > 1 else 0.0
    return float(per_row.mean()), math.sqrt(spread)


def spread_rows(rows: int, limit: int) -> np.ndarray:
    """`limit` row indices spread evenly over 0..rows-1, first and last included (all of
    them when rows <= limit): deterministic, and across a set ordered by class."""
    if rows <= limit:
        return np.arange(rows)
    return np.unique(np.linspace(0, rows - 1, limit).round().astype(np.int64))


def spread_subset(data: dict, axes: dict, max_rows: int | None) -> dict:
    """`data` ({input: rows}) cut to `max_rows` rows spread evenly (spread_rows) along each
    input's batch axis (`axes`: input -> axis or None; inputs without one whole)."""
    first = next((n for n in data if axes.get(n, 0) is not None), None)
    if first is None or max_rows is None:
        return data
    rows = np.shape(data[first])[axes.get(first, 0)]
    if rows <= max_rows:
        return data
    keep = spread_rows(rows, max_rows)
    return {n: np.take(np.asarray(x), keep, axis=axes.get(n, 0))
            if axes.get(n, 0) is not None else x for n, x in data.items()}


class FloatReference:
    """A float model and its outputs on some rows ({input: rows}), computed once, on first
    use: the calibration search scores every QDQ model it tries against the same answers,
    and the compiled model's check after it is on the same rows (each run of a 3 MB
    sequence CNN's float model on 128 rows cost two seconds)."""

    def __init__(self, model, rows: dict, batch_first: bool):
        self.model, self.rows, self.batch_first = model, rows, batch_first
        self._outputs, self._done = None, False

    def outputs(self) -> dict | None:
        """{output: values} of every graph output, None when the model cannot run."""
        if not self._done:
            import onnx
            model = onnx.load_model_from_string(bytes(self.model)) if isinstance(
                self.model, (bytes, bytearray)) else self.model
            try:
                self._outputs = run_float(self.model, self.rows,
                                          [o.name for o in model.graph.output],
                                          self.batch_first)
            except Exception:               # noqa: BLE001 - no reference: no figure
                self._outputs = None
            self._done = True
        return self._outputs

    def serves(self, rows: dict, names, batch_first: bool) -> bool:
        """Are its outputs the float model's answers on `rows` for `names`, joined along
        axis 0 (run_float's batch-first runs)?"""
        if batch_first != self.batch_first or rows.keys() != self.rows.keys() or not all(
                np.shape(rows[k]) == np.shape(self.rows[k]) and np.array_equal(
                    rows[k], self.rows[k]) for k in rows):
            return False
        found = self.outputs()
        return found is not None and all(n in found for n in names)


def validate(compiled, float_model, data: dict, what: str,
             min_agreement: float = DEFAULT_MIN_AGREEMENT,
             min_snr: float = DEFAULT_MIN_SNR, max_rows: int | None = None,
             classes: dict | None = None,
             reference: FloatReference | None = None, expected: bool = True,
             probes: dict | None = None) -> Validation:
    """Run `compiled` (on the emulator's data path) and onnxruntime on `float_model` (a ModelProto
    or its bytes) over `data` ({input: rows}), or over `max_rows` of its rows (spread_rows)
    when it has more; the figures and warnings.  `classes`: the float model's class axes
    (classaxis.class_axes; worked out here when None).  `reference`: the float model's
    outputs if already known on these rows (the calibration search's).  `expected`: as
    compare()'s.  `probes`: {scores tensor: the outputs it is judged for} (probes.py), the
    float model's outputs that the compiled model gives as its `probes`."""
    min_agreement, min_snr = check_thresholds(min_agreement, min_snr)
    values = [*compiled.outputs, *compiled.probes]
    names = [o.name for o in values]
    axes = {i.name: getattr(i, "batch_axis", 0) for i in compiled.inputs}
    first = next((n for n in data if axes.get(n) is not None), None)
    total = np.shape(data[first])[axes[first]] if first is not None else 1
    data = spread_subset(data, axes, max_rows)
    rows = np.shape(data[first])[axes[first]] if first is not None else 1
    result = Validation(rows, what, min_agreement, min_snr, of_rows=total)
    feeds = {i.name: np.asarray(data[i.name]).astype(np.dtype(i.dtype), copy=False)
             for i in compiled.inputs if i.name in data}
    batch_first = all(a == 0 for a in axes.values())
    out_axes = {o.name: getattr(o, "batch_axis", 0) for o in values}
    # the compile itself succeeded: a check that cannot run is said, never a failure
    try:
        if reference is not None and all(a == 0 for a in out_axes.values()) and \
                reference.serves(data, names, batch_first):
            ref = reference.outputs()
        else:
            ref = run_float(float_model, data, names, batch_first=batch_first,
                            out_axes=out_axes)
    except Exception as e:                # noqa: BLE001 - onnxruntime's errors have no base
        result.warnings.append(f"the float model could not be run for the check: "
                               f"{_first_line(e)}")
        return result
    try:
        got = _run_compiled(compiled, feeds)   # the programs on the data path, as infer
    except Exception as e:                # noqa: BLE001 - as above
        result.warnings.append(f"the compiled model could not be run on {what}: "
                               f"{_first_line(e)}")
        return result
    tensors = [n for n in names if not isinstance(ref.get(n), (list, dict))
               and not isinstance(got.get(n), (list, dict))]    # a ZipMap's maps: skipped
    if classes is None:
        from tpuasm.compiler.runtime.classaxis import class_axes
        classes = class_axes(float_model)
    result.outputs = compare(ref, got, tensors, classes, expected)
    for o in result.outputs:
        if o.name in (probes or {}):
            o.why = probe_why(probes[o.name]) + (f"; {o.why}" if o.why else "")
    for o in result.outputs:
        if o.judged is not None and o.judged < min_agreement:
            what_ = "exact agreement" if o.kind == "exact" else f"{o.kind} agreement"
            if o.judged < o.agreement:
                what_ += " expected on new rows"
            axis = (f" (classes on axis {o.class_axis}; --class-axis {o.name}=none if that "
                    f"is not a class axis)") if o.kind == "per-step top-1" else ""
            result.warnings.append(
                f"output '{o.name}': {what_} with the float model is {100 * o.judged:.2f} "
                f"%, below {100 * min_agreement:g} % (--min-agreement){axis}; try "
                f"--keep-float, --calibration-method, or more calibration rows")
        if o.snr_bar and o.snr_db < min_snr:
            result.warnings.append(
                f"output '{o.name}': SNR against the float model is {o.snr_db:.1f} dB, below "
                f"{min_snr:g} dB (--min-snr)")
    return result


def _run_compiled(compiled, feeds: dict) -> dict:
    """The compiled model on `feeds` as `infer` runs it, but a batch a call (a model whose
    every input and output is batch first), each step's memory let go when its run ends
    (steps.one_off): the check's memory is one step's on one batch, not its rows' (two
    batches of Magika's one-hot host part at once, every part's arena and every segment's
    machine kept, were 1 GB)."""
    from tpuasm.compiler.runtime.steps import join_parts, one_off
    batch = compiled.batch
    values = [*compiled.outputs, *compiled.probes]
    with one_off(compiled.steps):
        rows = {len(x) for x in feeds.values() if np.ndim(x)}
        if len(rows) != 1 or not all(getattr(v, "batch_axis", 0) == 0 for v in
                                     (*compiled.inputs, *values)):
            return compiled.run(feeds, probes=True)
        total = rows.pop()
        if total <= batch:
            return compiled.run(feeds, probes=True)
        parts = [compiled.run({k: v[start:start + batch] for k, v in feeds.items()},
                              probes=True) for start in range(0, total, batch)]
    return {o.name: join_parts(o, [p[o.name] for p in parts]) for o in values}


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def run_float(float_model, data: dict, names: list[str], batch_first: bool = True,
              out_axes: dict | None = None, sums: bool = False) -> dict[str, np.ndarray]:
    """onnxruntime on the float model, in chunks of its fixed batch (the last one padded)
    or of _CHUNK rows when the batch is dynamic; a model whose inputs are not all batch
    first runs on all the rows at once.  `out_axes`: each output's batch axis (None: not
    batched), when known, else 0; either checked against the first run's sizes
    (steps.batch_axis_of: a time-first (T, 1, classes) output holds a batch of 1 on axis 1).
    `sums`: the outputs are sums over a run's rows, added up over the chunks (the rows a
    whole number of a fixed batch: a padded chunk's zeros would count)."""
    from tpuasm.compiler.ort import session
    try:
        # alone here: every core; a few runs, so no arena (it grows in powers of two and
        # held 0.11 GB more than the runs needed on the PP-OCRv4 recogniser's QDQ model)
        sess = session(float_model, threads=0, arena=False)
    except Exception as e:
        raise CompileError(str(e).strip().splitlines()[0] if str(e).strip() else repr(e)) \
            from None
    infos = {i.name: i for i in sess.get_inputs()}
    dtypes = {n: _np_type(i.type) for n, i in infos.items()}
    fixed = [i.shape[0] for i in infos.values() if i.shape and isinstance(i.shape[0], int)
             and i.shape[0] > 0]
    if not batch_first:
        feed = {n: np.asarray(data[n]).astype(dtypes[n], copy=False) for n in infos}
        return dict(zip(names, sess.run(names, feed)))
    step = min(fixed) if fixed else _chunk_rows(float_model)
    rows = len(next(iter(data.values())))
    parts = {n: [] for n in names}
    for start in range(0, rows, step):
        take = min(step, rows - start)
        feed = {}
        for name in infos:
            x = np.asarray(data[name][start:start + take]).astype(dtypes[name], copy=False)
            if fixed and take < step:
                pad = np.zeros((step - take,) + x.shape[1:], x.dtype)
                x = np.concatenate([x, pad])
            feed[name] = x
        try:
            outs = sess.run(names, feed)
        except Exception as e:
            raise CompileError(str(e).strip().splitlines()[0]) from None
        for n, o in zip(names, outs):
            parts[n].append(np.asarray(o))
    if sums:
        return {n: np.sum(p, axis=0) for n, p in parts.items()}
    joined = {}
    for n, p in parts.items():
        axis = batch_axis_of(p[0], (out_axes or {}).get(n, 0),
                             step if fixed else min(step, rows))
        if axis is None or p[0].ndim <= axis:
            joined[n] = p[0]
            continue
        cut = [np.take(x, range(min(step, rows - k * step)), axis=axis)
               for k, x in enumerate(p)]
        joined[n] = np.concatenate(cut, axis=axis)
    return joined



def _chunk_rows(float_model) -> int:
    """Rows per onnxruntime call: as many as the model's activations allow in the
    calibration's memory budget (quantize.calibration_rows), at most _CHUNK.  (Four times
    that held 92 rows of a one-hot's (2048, 257) floats at once: 0.25 GB for a check.)"""
    import onnx

    from tpuasm.compiler.front.quantize import _with_shapes, calibration_rows
    model = float_model
    if isinstance(model, (bytes, bytearray)):
        model = onnx.load_model_from_string(bytes(model))
    return max(1, min(_CHUNK, calibration_rows(_with_shapes(model))))


def _np_type(ort_type: str):
    table = {"tensor(float)": np.float32, "tensor(double)": np.float64,
             "tensor(float16)": np.float16, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32, "tensor(int16)": np.int16, "tensor(int8)": np.int8,
             "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}
    return table.get(ort_type, np.float32)

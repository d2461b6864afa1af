"""The calibration method chosen by the answers it keeps, when the user chose none.

Min-max calibration first (the onnxruntime default, exact on the project's own models).  Its
QDQ model is then run by onnxruntime against the float model on the check rows (the rows the
compiled model's validation uses): the compiled model computes exactly what the QDQ model
does, so this is the validation's figure before any code is generated.  Below the user's bar
(--min-agreement for outputs of class scores, a classifier's rows or a sequence's steps
(classaxis.py), --min-snr for the others) the other methods are
tried, percentile then entropy, and the QDQ model that keeps the most answers is compiled;
still below, the TPU's 16-bit activations (front/widen.py): the noisiest activation tensors
that can be int16 are made so (_widen_the_noisiest); still below, the 8-bit-only TPU nodes
(lookups, VADD/VMUL, pooling) go to the host in float so that every tensor between matrix
operators is int16 (_widen_through_the_host); still below, the element-wise node whose
8-bit output costs the most answers is kept in float (never a matrix op), up to three of
them; still below, the TPU's 16-bit weights (front/wideweights.py): the costliest weights
in 8 bits, then all of them (_widen_the_weights).  Those steps also follow a clipping
method's pass with flips on the check rows (its ranges are fitted to them), each kept only
if it beats it there.  A recurrent network (an unrolled LSTM, GRU or Loop) whose model
meets the bars is tried with every tensor int16 too, its cell chain's included, and keeps
it for a higher SNR (_widen_the_recurrent).  The report says which and why.  Magika
(issue 20): min-max 98.44 %, percentile 100 % top-1 agreement on the check rows, every
matrix op still on the TPU."""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tpuasm.compiler.front.quantize import QuantOptions, quantize
from tpuasm.compiler.runtime.validate import expected_text

_OTHERS = ("percentile", "entropy")
_NAMES = {"minmax": "min-max", "percentile": "percentile", "entropy": "entropy"}


@dataclass
class Score:
    """A QDQ model against the float model: the lowest top-1 (or exact) agreement and the
    lowest SNR over the outputs (None when no output has that kind of figure); `what`: the
    kind of the lowest agreement ("top-1", "per-step top-1": classaxis.py); `snr_bar`: the
    lowest SNR of the outputs held to --min-snr (those judged by SNR, and those judged by
    top-1 only because a classifier head makes them, validate.OutputCheck.snr_bar);
    `expected`: the top-1 agreement expected on new rows of the output whose estimate,
    less its standard error (`stderr`), is the lowest, where that is below the rows' own
    (validate.pair_agreement: min-max models).  The bar is held to the lower of the
    rows' agreement and that cautious figure: the search does not stop at an estimate
    within its own noise of the bar.  QDQ models are ranked by the rows' own agreement,
    then SNR (a clipping method's model has no expected figure, and its agreement on the
    rows is not to be beaten by another's estimate)."""
    agreement: float | None
    snr_db: float | None
    what: str = "top-1"
    snr_bar: float | None = None
    expected: float | None = None
    stderr: float | None = None
    # the lowest expected agreement whether or not it is below the rows' own: a finer
    # figure than flips on few rows (_extrapolate_if_clipped compares models by it)
    spread: float | None = None

    def below(self, min_agreement: float, min_snr: float, cautious: bool = True) -> bool:
        """Whether it misses a bar; `cautious`: judged by the expected agreement less its
        standard error (whether the search may stop here), else by the estimate itself
        (whether a model may replace one that met the bars)."""
        judged = self.agreement if self.expected is None else \
            self.expected - (self.stderr or 0.0 if cautious else 0.0)
        return (judged is not None and judged < min_agreement) or \
            (self.snr_bar is not None and self.snr_bar < min_snr)

    def key(self) -> tuple:
        return (-1.0 if self.agreement is None else self.agreement,
                -math.inf if self.snr_db is None else self.snr_db)

    def text(self) -> str:
        snr = None if self.snr_bar is None else f"SNR {self.snr_bar:.1f} dB"
        if self.agreement is not None:
            expected = "" if self.expected is None else \
                f" ({expected_text(self.expected, self.stderr)})"
            return f"{100 * self.agreement:.2f} % {self.what} agreement{expected}" + (
                f", {snr}" if snr else "")
        return snr or ("no figure" if self.snr_db is None else f"SNR {self.snr_db:.1f} dB")


def float_outputs(float_model, data: dict, batch_first: bool) -> dict | None:
    """The float model's outputs on `data` (None if it cannot run): score()'s reference,
    computed once when many QDQ models are scored against it.  `float_model`: a ModelProto,
    its bytes, or a validate.FloatReference (its outputs when `data` are its rows)."""
    from tpuasm.compiler.runtime.validate import FloatReference, run_float
    import onnx
    if isinstance(float_model, FloatReference):
        if data is float_model.rows and batch_first == float_model.batch_first:
            return float_model.outputs()
        float_model = float_model.model
    model = onnx.load_model_from_string(float_model) if isinstance(
        float_model, (bytes, bytearray)) else float_model
    try:
        return run_float(float_model, data, [o.name for o in model.graph.output], batch_first)
    except Exception:                   # noqa: BLE001 - no reference: no figure
        return None


def score(qdq, float_model, data: dict, batch_first: bool, ref: dict | None = None,
          minmax: bool = True) -> Score | None:
    """onnxruntime on both models over `data` ({input: rows}); None if either cannot run.
    `qdq`: a path or a ModelProto; `ref`: the float model's outputs, if known.  Outputs
    are judged by top-1 over the float model's class axes (classaxis.py: those of the
    search under way, classaxis.judging); `minmax`: whether `qdq` is calibrated by
    min-max, and so judged by the lower of its top-1 agreement and the one expected on new
    rows (validate.pair_agreement)."""
    from tpuasm.compiler.runtime.classaxis import class_axes, searched_axes
    from tpuasm.compiler.runtime.validate import FloatReference, compare, run_float
    import onnx
    ref = ref if ref is not None else float_outputs(float_model, data, batch_first)
    model = float_model.model if isinstance(float_model, FloatReference) else float_model
    if ref is None:
        return None
    names = list(ref)
    try:
        got = run_float(qdq if isinstance(qdq, onnx.ModelProto) else
                        Path(qdq).read_bytes(), data, names, batch_first)
        # numbers only: skl2onnx's ZipMap output is an array of dicts
        checks = compare(ref, got, [n for n in names if isinstance(ref[n], np.ndarray)
                                    and ref[n].dtype.kind in "biuf"],
                         searched_axes() or class_axes(model), expected=minmax)
    except Exception:                   # noqa: BLE001 - no figure: the first model is kept
        return None
    agreements = [c for c in checks if c.agreement is not None]
    lowest = min(agreements, key=lambda c: c.agreement) if agreements else None
    cautious = min(agreements, key=lambda c: c.cautious) if agreements else None
    snrs = [c.snr_db for c in checks if c.snr_db is not None]
    held = [c.snr_db for c in checks if c.snr_db is not None and c.snr_bar]
    spread = [c.expected for c in agreements if c.expected is not None]
    below_rows = cautious is not None and cautious.cautious < lowest.agreement
    return Score(None if lowest is None else lowest.agreement, min(snrs) if snrs else None,
                 "top-1" if lowest is None or lowest.kind == "exact" else lowest.kind,
                 min(held) if held else None,
                 cautious.expected if below_rows else None,
                 cautious.expected_stderr if below_rows else None,
                 min(spread) if spread else None)


def quantize_checked(model, samples: dict, signature: dict, out_path: Path,
                     options: QuantOptions, path, provenance, batch_axes, float_model,
                     check: dict, min_agreement: float, min_snr: float,
                     held_out: bool = False, **more):
    """quantize() with `options` (and `more` of its keyword arguments); when
    `options.search_calibration` and the QDQ model falls below the bars on `check` ({input:
    rows}), the best of every method.  `float_model`: a ModelProto, its bytes, or a
    validate.FloatReference on `check` (whose outputs the caller's validation reuses).
    Every method's ranges come from the calibration passes over `samples`
    (front/calibrate.py: min-max's range pass, one histogram pass for the others), shared
    by all the quantize() calls here.  `held_out`: the check rows are calibration rows, so
    that rows held out of the calibration may tell what new rows will meet
    (_extrapolate_if_clipped).
    Returns (quantized nodes, the options used, a sentence for the report or None)."""
    from tpuasm.compiler.front.calibrate import CalibrationPass
    more = dict(more, batch_axes=batch_axes)
    notes: dict = {}
    if more.get("calibration") is None:
        more["calibration"] = CalibrationPass()
    nodes = quantize(model, samples, signature, out_path, options, path, provenance,
                     notes=notes, **more)
    if not options.search_calibration or not nodes:
        return nodes, options, _narrow_note(notes)
    batch_first = all(a == 0 for a in (batch_axes or {}).values())
    from tpuasm.compiler.runtime.validate import FloatReference
    if not isinstance(float_model, FloatReference):    # every score against one answer
        float_model = FloatReference(float_model, check, batch_first)
    first = score(out_path, float_model, check, batch_first,
                  minmax=options.calibration_method == "minmax")
    if first is None:
        return nodes, options, _narrow_note(notes)
    searching = (model, samples, signature, out_path, path, provenance, more, float_model,
                 check, batch_first, min_agreement, min_snr)
    if not first.below(min_agreement, min_snr):
        options, first, nodes, widened, notes = _widen_the_recurrent(
            searching, options, first, nodes, notes)
        # after the widening: in 16 bits a wider range costs no answers
        options, _, nodes, extrapolated, notes = _extrapolate_if_clipped(
            searching, options, first, nodes, notes, held_out)
        return nodes, options, "; ".join(filter(None, (widened, extrapolated,
                                                       _narrow_note(notes)))) or None
    best, best_score, best_nodes = options, first, nodes
    tried = [f"min-max: {first.text()}"]
    for method in _OTHERS:
        other = replace(options, calibration_method=method)
        candidate = Path(out_path).with_suffix(f".{method}.onnx")
        try:
            found = quantize(model, samples, signature, candidate, other, path, provenance,
                             **more)
        except Exception:               # noqa: BLE001 - a method that fails is not chosen
            continue
        s = score(candidate, float_model, check, batch_first, minmax=False)
        if s is None:
            continue
        tried.append(f"{_NAMES[method]}: {s.text()}")
        if s.key() > best_score.key():
            shutil.copyfile(candidate, out_path)
            best, best_score, best_nodes = other, s, found
        if not s.below(min_agreement, min_snr) and best is other:
            break
    rows = _rows(check, batch_axes)
    note = (f"calibration method chosen by the check against the float model on {rows} "
            f"rows ({'; '.join(tried)}): {_NAMES[best.calibration_method]}")

    def going_on(options, s) -> bool:
        # below the bars; or a clipping method's pass with flips: its ranges are fitted to
        # these very rows (a Keras attention block: percentile 99.22 % here, min-max 98.44;
        # 98.93 % of 1,024 new rows), so the steps below are tried too, each kept only if
        # it beats it on these rows
        return s.below(min_agreement, min_snr) or (
            options.calibration_method != "minmax" and s.agreement is not None and
            s.agreement < 1.0)

    if going_on(best, best_score) and best.activation_bits == 8:
        best, best_score, best_nodes, widened, notes = _widen_the_noisiest(
            model, samples, signature, out_path, best, best_score, best_nodes, path,
            provenance, more, float_model, check, batch_first, min_agreement, min_snr, notes)
        if widened:
            note += "; " + widened
    # the cheapest change first: up to three element-wise nodes in float, and only then
    # every 8-bit-only node on the host (a host round trip each)
    if going_on(best, best_score):
        best, best_score, best_nodes, moved = _float_the_sensitive(
            model, samples, signature, out_path, best, best_score, best_nodes, path,
            provenance, more, float_model, check, batch_first, min_agreement, min_snr)
        if moved:
            note += "; " + moved
    if going_on(best, best_score):
        best, best_score, best_nodes, hosted, notes = _widen_through_the_host(
            model, samples, signature, out_path, best, best_score, best_nodes, path,
            provenance, more, float_model, check, batch_first, notes)
        if hosted:
            note += "; " + hosted
    if going_on(best, best_score) and best.weight_bits == 8:
        best, best_score, best_nodes, weighted, notes = _widen_the_weights(
            model, samples, signature, out_path, best, best_score, best_nodes, path,
            provenance, more, float_model, check, batch_first, min_agreement, min_snr, notes)
        if weighted:
            note += "; " + weighted
    if best.checked_float and not best_score.below(min_agreement, min_snr):
        best, best_score, best_nodes, taken_back, notes = _take_back_the_floated(
            model, samples, signature, out_path, best, best_score, best_nodes, path,
            provenance, more, float_model, check, batch_first, min_agreement, min_snr, notes)
        if taken_back:
            note += "; " + taken_back
    if not best_score.below(min_agreement, min_snr):
        best, best_score, best_nodes, widened, notes = _widen_the_recurrent(
            searching, best, best_score, best_nodes, notes)
        if widened:
            note += "; " + widened
    narrow = _narrow_note(notes)
    return best_nodes, best, note + (f"; {narrow}" if narrow else "")


def _rows(check: dict, batch_axes: dict | None) -> int:
    """The check's rows: along the first batched input's batch axis (an LSTM's sequence-
    first input holds its time on axis 0)."""
    for name, x in check.items():
        axis = (batch_axes or {}).get(name, 0)
        if axis is not None:
            return int(np.shape(x)[axis])
    return 1


def _widen_through_the_host(model, samples, signature, out_path, options, current, nodes,
                            path, provenance, more: dict, float_model, check, batch_first,
                            notes: dict):
    """Still below the bars with every tensor that can be int16 so: the TPU nodes that
    hold tensors at 8 bits (lookup tables, VADD/VMUL, pooling: spec/isa.md's L table maps
    bytes, the vector unit is 8-bit) are kept in float on the host, and every tensor
    between matrix operators becomes int16 (min-max calibration).  Every Conv, Gemm and
    MatMul stays on the TPU; the host computes the element-wise arithmetic in float, as the
    float model does.  Kept when the check says it is better.  Returns (options, score,
    nodes, a sentence for the report or "", notes)."""
    hosted = _eight_bit_nodes(model, nodes)
    if not hosted:
        return options, current, nodes, "", notes
    other = replace(options, calibration_method="minmax",
                    checked_float=(*options.checked_float, *hosted))
    groups = _eligible_wide(model, other, path, provenance)
    if groups is None:
        return options, current, nodes, "", notes
    other = replace(other, checked_wide=tuple(groups))
    candidate = Path(out_path).with_suffix(".host.onnx")
    quantized = _quantized(model, samples, signature, candidate, other, path, provenance, more)
    if quantized is None:
        return options, current, nodes, "", notes
    found, tried = quantized
    if _moves_matrix_work(candidate, found, out_path):
        return options, current, nodes, "", notes
    s = score(candidate, float_model, check, batch_first)
    if s is None or s.key() <= current.key():
        return options, current, nodes, "", notes
    shutil.copyfile(candidate, out_path)
    return other, s, found, (
        f"kept in float by the check: the {len(hosted)} element-wise nodes on the TPU "
        f"(lookup tables and pooling write 8 bits, VADD/VMUL among them), so that "
        f"{len(groups)} tensors "
        f"between matrix operators are int16, min-max calibration: {current.text()} -> "
        f"{s.text()}"), tried


def _eligible_wide(model, options, path, provenance) -> dict | None:
    """widen.eligible's int16 tensor groups with the nodes `options` puts on the TPU, or None
    when that choice of nodes fails."""
    from tpuasm.compiler.front import widen
    from tpuasm.compiler.front.quantize import _with_shapes, tpu_nodes
    try:
        chosen = set(tpu_nodes(_with_shapes(model), options, path, provenance))
    except Exception:                   # noqa: BLE001 - no such choice
        return None
    return widen.eligible(model, chosen)[0]


def _quantized(model, samples, signature, candidate, options, path, provenance, more: dict):
    """(quantized nodes, quantize()'s notes) of a candidate QDQ model written to
    `candidate`, or None when quantize() fails (the search keeps what it had)."""
    tried: dict = {}
    try:
        found = quantize(model, samples, signature, candidate, options, path, provenance,
                         notes=tried, **more)
    except Exception:                   # noqa: BLE001 - as it was
        return None
    return found, tried


def _eight_bit_nodes(model, nodes) -> list[str]:
    """The quantized nodes that keep their tensors 8-bit: all but matrix operators, layout
    nodes, a MatMul's bias Add (prepare.matmul_bias_pairs: the bias on either side, as
    PyTorch writes Add(bias, MatMul)) and a Relu / Clip its matrix operator's Activate
    applies.  Moving a bias Add to the host would leave its MatMul's output unquantized,
    and the MatMul with it on the host."""
    from tpuasm.compiler.front import widen
    from tpuasm.compiler.front.prepare import matmul_bias_pairs
    chosen = set(nodes)
    bias_adds = {add.name for _, add, _, _ in matmul_bias_pairs(model)}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    out = []
    for n in model.graph.node:
        if n.name not in chosen or n.op_type in widen.MATRIX_OPS or \
                n.op_type in widen.LAYOUT_OPS or n.name in bias_adds:
            continue
        before = producer.get(n.input[0]) if n.input else None
        fed = before is not None and before.name in chosen and \
            before.op_type in widen.MATRIX_OPS and readers.get(n.input[0], 0) == 1
        if fed and n.op_type in ("Relu", "Clip"):
            continue
        out.append(n.name)
    return out


def _narrow_note(notes: dict) -> str | None:
    """The report's words for the tensors widen.py kept 8-bit and the weights
    wideweights.py kept 8-bit or gave a coarser step (accumulator range)."""
    parts = []
    for key, words in (("kept 8-bit", "kept 8-bit although asked for 16"),
                       ("weights kept 8-bit", "weights kept 8-bit although asked for 16")):
        kept = notes.get(key) or {}
        if kept:
            shown = "; ".join(f"{t}: {why}" for t, why in list(kept.items())[:3])
            more = f" (and {len(kept) - 3} more)" if len(kept) > 3 else ""
            parts.append(f"{words}: {shown}{more}")
    coarser = notes.get("weights coarser") or {}
    if coarser:
        shown = ", ".join(f"{node} {db:.0f} dB" for node, db in list(coarser.items())[:3])
        more = f" (and {len(coarser) - 3} more)" if len(coarser) > 3 else ""
        parts.append(f"int16 weights at steps coarser than the finest so that the int32 "
                     f"accumulators hold their sums (their rounding below int8's; 48 dB "
                     f"at the finest): {shown}{more}")
    return "; ".join(parts) or None


_WIDEN_SHARE = 4          # the first try makes the noisiest quarter of the tensors int16


RECURRENT_GAIN_DB = 1.0     # the SNR a recurrent model's int16 tensors must add to be kept


RECURRENT_OPS = {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM", "Loop"}


def _recurrent(provenance, nodes) -> bool:
    """Whether a quantized node comes from a recurrent node of the user's model (an LSTM,
    GRU or RNN unrolled by prepare.py, a Loop unrolled by loops.py: tf2onnx's Keras GRU)."""
    if provenance is None:
        return False
    kinds = dict(provenance.nodes)
    return any(kinds.get(provenance.source(n)) in RECURRENT_OPS for n in nodes)


HELD_OUT_MIN_ROWS = 32       # fewer calibration rows: halves too small to tell anything


def _extrapolate_if_clipped(searching: tuple, options, current, nodes, notes: dict,
                            held_out: bool):
    """Min-max ranges are fitted to the calibration rows, so they clip rows beyond them, and
    a check on those very rows cannot see it (validate.pair_agreement moves rounding
    errors between rows, not clipping).  A JAX LSTM calibrated on 128 rows: 100 % top-1 on
    them, 99.77 % expected, 98.63 % on 512 new rows.  So, when the check rows are the
    calibration rows (`held_out`) and the model is not sure to keep every answer (its
    agreement, or the one expected on new rows, below 100 %), the calibration set is cut in
    two: min-max ranges fitted to its first half, as they are and extrapolated
    (calibrate.Extrapolated, from that half's own first half), are judged on its second
    half; when the extrapolated ones keep more answers there, the model's ranges are
    extrapolated from all the rows, kept if it still meets the bars on the check rows.
    Returns (options, score, nodes, a sentence for the report or "", notes)."""
    from tpuasm.compiler.front.calibrate import CalibrationPass
    from tpuasm.compiler.front.samples import row_range, sample_rows
    from tpuasm.compiler.runtime.validate import FloatReference
    (model, samples, signature, out_path, path, provenance, more, float_model, check,
     batch_first, min_agreement, min_snr) = searching
    unchanged = options, current, nodes, "", notes
    axes = more.get("batch_axes")
    rows = sample_rows(samples, axes)
    if not held_out or options.calibration_method != "minmax" or options.extrapolate_ranges \
            or rows < HELD_OUT_MIN_ROWS or current.agreement is None or \
            min(current.agreement, 1.0 if current.expected is None else current.expected) >= 1:
        return unchanged
    fitted, unseen = row_range(samples, axes, 0, rows // 2), row_range(samples, axes,
                                                                        rows // 2, rows)
    reference = FloatReference(float_model.model, unseen, batch_first)
    half = dict(more, calibration=CalibrationPass())       # both halves' fits share it
    held = {}
    for extrapolate in (False, True):
        candidate = Path(out_path).with_suffix(f".held-out-{int(extrapolate)}.onnx")
        try:
            quantize(model, fitted, signature, candidate,
                     replace(options, extrapolate_ranges=extrapolate), path, provenance, **half)
        except Exception:               # noqa: BLE001 - no figure: the model is kept
            return unchanged
        held[extrapolate] = score(candidate, reference, unseen, batch_first, minmax=True)
        if held[extrapolate] is None:
            return unchanged

    def on_new_rows(s: Score) -> tuple:
        return (s.agreement if s.spread is None else s.spread,
                -math.inf if s.snr_db is None else s.snr_db)

    if not on_new_rows(held[True]) > on_new_rows(held[False]):
        return unchanged
    found = _best_of([(None, replace(options, extrapolate_ranges=True))], current,
                     Path(out_path).with_suffix(".extrapolated.onnx"), out_path,
                     (model, samples, signature, path, provenance, more),
                     (float_model, check, batch_first, None, min_agreement, min_snr),
                     beats=lambda s, _: not s.below(min_agreement, min_snr))
    if found is None:
        return unchanged
    _, extrapolated, s, found_nodes, _ = found
    return extrapolated, s, found_nodes, (
        f"min-max ranges fitted to {rows // 2} of the calibration rows clipped the other "
        f"{rows - rows // 2} ({_held_text(held[False])} there; {_held_text(held[True])} "
        f"with the ranges extrapolated): so extrapolated from all {rows} ({s.text()})"), notes


def _held_text(s: Score) -> str:
    expected = "" if s.spread is None else f", {100 * s.spread:.2f} % expected"
    snr = "" if s.snr_db is None else f", SNR {s.snr_db:.1f} dB"
    return f"{100 * s.agreement:.2f} % {s.what} agreement{expected}{snr}"


def _widen_the_recurrent(searching: tuple, options, current, nodes, notes: dict):
    """An unrolled LSTM / GRU (or Loop: `_recurrent`) carries its rounding
    from step to step, and on a few hundred check rows top-1 flips cannot tell 98.5 %
    from 99 % on new rows (the PyTorch LSTM classifier: 100 % of its 128 check rows at 8
    bits, 98.4 % of 1,024 new ones; with its cell int16, 99.1 %).  So when the search's
    model of one meets the bars (at once, or after the steps before), every tensor that can
    be int16 (its cell's too) is tried (min-max), and kept when it meets them with an SNR
    higher by RECURRENT_GAIN_DB: the figure the check rows do resolve.  Returns (options,
    score, nodes, a sentence for the report or "", notes)."""
    (model, samples, signature, out_path, path, provenance, more, float_model, check,
     batch_first, min_agreement, min_snr) = searching
    # prepare.py's per-step tensors (`tied`) say so too where the user's LSTM sat in an If
    # (silero_vad.onnx's, inlined: its provenance is the If)
    if not (more.get("tied") or _recurrent(provenance, nodes)) or \
            options.activation_bits != 8 or current.snr_db is None:
        return options, current, nodes, "", notes
    from tpuasm.compiler.front import widen
    groups, _ = widen.eligible(model, set(nodes))
    if not groups or set(groups) <= set(options.checked_wide):
        return options, current, nodes, "", notes

    def clearer(s: Score, old: Score) -> bool:
        # the model it replaces met the bars, a clipping method's by its flips on these
        # rows, which is no surer than an estimate: the estimate itself is held to them
        return s.snr_db is not None and not s.below(min_agreement, min_snr, cautious=False) \
            and s.snr_db >= old.snr_db + RECURRENT_GAIN_DB

    wide = replace(options, calibration_method="minmax", checked_wide=tuple(groups))
    found = _best_of([(None, wide)], current, Path(out_path).with_suffix(".recurrent.onnx"),
                     out_path, (model, samples, signature, path, provenance, more),
                     (float_model, check, batch_first, None, min_agreement, min_snr),
                     beats=clearer)
    if found is None:
        return options, current, nodes, "", notes
    _, wide, s, found_nodes, tried = found
    return wide, s, found_nodes, (
        f"a recurrent cell carries its rounding from step to step: made int16 by the check "
        f"as well, {len(groups)} activation tensors, min-max calibration: SNR "
        f"{current.snr_db:.1f} dB -> {s.snr_db:.1f} dB ({s.text()})"), tried


def _widen_the_noisiest(model, samples, signature, out_path, options, current, nodes, path,
                        provenance, more: dict, float_model, check, batch_first,
                        min_agreement, min_snr, notes: dict):
    """Below the bars with 8-bit activations: before anything is kept in float, the TPU's
    16-bit activations (front/widen.py).  The tensors between matrix operators (which cost
    no instruction more), ranked by the SNR of their 8-bit rounding in the QDQ model (the
    noisiest first, as _float_the_sensitive ranks element-wise outputs): the noisiest
    quarter made int16 and checked, then every one of them; then those of the VADD / VMUL
    and Tanh / Sigmoid tables as well (widen.eligible's `vectors`: a table's input through
    its 8-bit index, one VADD more); then every tensor between matrix operators with the
    method the 8-bit search chose.  The best QDQ model is kept.  Returns (options, score,
    nodes, a sentence for the report or "", notes)."""
    from tpuasm.compiler.front import widen
    groups, _ = widen.eligible(model, set(nodes), vectors=False)
    every, _ = widen.eligible(model, set(nodes))
    if not every:
        return options, current, nodes, "", notes
    ranked = _noisiest_tensors(out_path, list(groups), check, batch_first) if groups else []
    ref = float_outputs(float_model, check, batch_first)
    start = current
    first = max(1, -(-len(ranked) // _WIDEN_SHARE))
    # min-max first: 16 bits have the resolution to cover the whole range, which the
    # clipping methods give up for 8-bit steps (entropy's clipped logits kept top-1 but
    # lost 20 dB of SNR on a small MLP); then the method the 8-bit search chose
    sets = [tuple(ranked[:count]) for count in dict.fromkeys((first, len(ranked))) if count]
    tries = [(wide, "minmax") for wide in sets]
    if set(every) - set(groups):
        tries.append((tuple(every), "minmax"))
    if options.calibration_method != "minmax" and ranked:
        tries.append((tuple(ranked), options.calibration_method))
    choices = [(wide, replace(options, calibration_method=method, checked_wide=wide))
               for wide, method in tries]
    found = _best_of(choices, current, Path(out_path).with_suffix(".wide.onnx"), out_path,
                     (model, samples, signature, path, provenance, more),
                     (float_model, check, batch_first, ref, min_agreement, min_snr))
    if found is None:
        return options, current, nodes, "", notes
    chosen, options, current, nodes, notes = found
    names = ", ".join(chosen[:6]) + (" ..." if len(chosen) > 6 else "")
    what = (f"{len(chosen)} of {len(ranked)} activation tensors between matrix operators, "
            f"the noisiest in 8 bits first" if set(chosen) <= set(groups) else
            f"{len(chosen)} activation tensors, those of the element-wise nodes too")
    return options, current, nodes, (
        f"made int16 by the check: {what} ({names}), "
        f"{_NAMES[options.calibration_method]} calibration: {start.text()} -> "
        f"{current.text()}"), notes


def _beats(s: Score, current: Score) -> bool:
    return s.key() > current.key()


def _best_of(choices: list, current: Score, candidate: Path, out_path, quantizing: tuple,
             scoring: tuple, beats=_beats):
    """Quantize with each of `choices` ([(label, QuantOptions)]) in turn into `candidate`,
    score it against the float model, and keep (copied to `out_path`) each that `beats` the
    best so far (by default: ranks above it, Score.key); stop at the first that meets the
    bars.  `quantizing`: (model, samples, signature, path, provenance, quantize()'s other
    keywords); `scoring`: (float model, check rows, batch_first, the float outputs,
    min_agreement, min_snr).  Returns (label, options, score, nodes, notes) of the best, or
    None when none beat `current`."""
    model, samples, signature, path, provenance, more = quantizing
    float_model, check, batch_first, ref, min_agreement, min_snr = scoring
    best = None
    for label, other in choices:
        tried: dict = {}
        try:
            nodes = quantize(model, samples, signature, candidate, other, path, provenance,
                             notes=tried, **more)
        except Exception:               # noqa: BLE001 - a choice that fails is not made
            continue
        if _moves_matrix_work(candidate, nodes, out_path):
            continue
        s = score(candidate, float_model, check, batch_first, ref,
                  other.calibration_method == "minmax")
        if s is None or not beats(s, current):
            continue
        shutil.copyfile(candidate, out_path)
        best, current = (label, other, s, nodes, tried), s
        if not current.below(min_agreement, min_snr):
            break
    return best


def _moves_matrix_work(candidate, nodes, best) -> bool:
    """Whether a QDQ model the search tried would send a matrix node to the host that the
    best so far (`best`, a path) keeps on the TPU (widen.requantized_inputs): a better
    score is not worth the TPU's work."""
    import onnx
    from tpuasm.compiler.front.widen import requantized_inputs

    def lost(path):
        return set(requantized_inputs(onnx.load(str(path), load_external_data=False), nodes))
    try:
        return bool(lost(candidate) - lost(best))
    except Exception:                   # noqa: BLE001 - no verdict: the score decides
        return False


_WEIGHT_SHARE = 4         # the first try gives the costliest quarter of the weights 16 bits
_MAX_WEIGHTS_RANKED = 24  # weights whose float form is scored (one pass of a few rows each)


def _widen_the_weights(model, samples, signature, out_path, options, current, nodes, path,
                       provenance, more: dict, float_model, check, batch_first,
                       min_agreement, min_snr, notes: dict):
    """Still below the bars with int16 activations: the TPU's 16-bit weights
    (front/wideweights.py).  The matrix nodes' weights ranked by what each costs
    (_costliest_weights: the check's SNR with that weight alone in float), the costliest
    quarter made int16 and checked, then every one; the best QDQ model is kept.  Returns
    (options, score, nodes, a sentence for the report or "", notes)."""
    from tpuasm.compiler.front import wideweights
    found = wideweights.candidates(model, set(nodes))
    if not found:
        return options, current, nodes, "", notes
    readers: dict[str, list] = {}
    for node, weight in found.items():
        readers.setdefault(weight, []).append(node)
    inits = {t.name: t for t in model.graph.initializer}
    # copies of one weight (an unrolled LSTM's steps) are one choice
    groups = {copies[0]: copies for copies in wideweights.same_values(inits, list(readers))}
    ref = float_outputs(float_model, check, batch_first)
    try:
        ranked, scored = _costliest_weights(out_path, model, groups, readers, float_model,
                                            check, batch_first)
    except Exception:                   # noqa: BLE001 - no measure: every weight at once
        ranked, scored = list(groups), 0
    start = current
    first = max(1, -(-len(ranked) // _WEIGHT_SHARE))
    choices = [(count, replace(options, checked_wide_weights=tuple(
        n for label in ranked[:count] for weight in groups[label] for n in readers[weight])))
        for count in dict.fromkeys((first, len(ranked)))]
    found = _best_of(choices, current, Path(out_path).with_suffix(".weights.onnx"), out_path,
                     (model, samples, signature, path, provenance, more),
                     (float_model, check, batch_first, ref, min_agreement, min_snr))
    if found is None:
        return options, current, nodes, "", notes
    chosen, options, current, nodes, notes = found
    names = ", ".join(readers[label][0] for label in ranked[:min(chosen, 4)]) + \
        (" ..." if chosen > 4 else "")
    return options, current, nodes, (
        f"int16 weights chosen by the check: {chosen} of {len(ranked)} weights, the "
        f"costliest in 8 bits first ({names}; {scored} ranked by the check's SNR with each "
        f"alone in float): {start.text()} -> {current.text()}"), notes


def _costliest_weights(qdq_path, model, groups: dict, readers: dict, float_model, check,
                       batch_first) -> tuple[list[str], int]:
    """The labels of `groups` ({label: [weights of equal values]}; `readers`: {weight: its
    matrix nodes}), the costliest in 8 bits first, and how many were measured.  Measured:
    the QDQ model's SNR against the float model on a few check rows with that group's
    weights read in float (their DequantizeLinear bypassed: one onnxruntime pass each, no
    new calibration), for the _MAX_WEIGHTS_RANKED groups whose own rounding is the largest
    (the relative noise power of the int8 weight against the float one, from the two
    models' initializers); the rest after them in that order."""
    import onnx
    from onnx import numpy_helper
    qdq = onnx.load(str(qdq_path))
    inits = {t.name: t for t in qdq.graph.initializer}
    floats = {t.name: t for t in model.graph.initializer}
    graph_nodes = list(qdq.graph.node)
    producer = {o: i for i, n in enumerate(graph_nodes) for o in n.output if o}
    by_name = {n.name: n for n in graph_nodes}
    dequantized: dict[str, int] = {}   # weight -> where its DequantizeLinear is in the QDQ
    for weight, nodes in readers.items():
        node = by_name.get(nodes[0])
        at = producer.get(node.input[1]) if node is not None and len(node.input) > 1 \
            else None
        dq = graph_nodes[at] if at is not None else None
        if dq is not None and dq.op_type == "DequantizeLinear" and weight in floats \
                and dq.input[0] in inits and len(dq.input) > 1 and dq.input[1] in inits:
            dequantized[weight] = at
    rounding = {}
    for label in groups:
        if label not in dequantized:
            continue
        dq = graph_nodes[dequantized[label]]
        w = numpy_helper.to_array(floats[label]).astype(np.float64)
        q = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float64)
        scale = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1) % max(w.ndim, 1)
        shape = [1] * w.ndim
        if scale.size > 1:
            shape[axis] = scale.size
        noise = float(((q * scale.reshape(shape) - w) ** 2).sum())
        rounding[label] = noise / max(float((w ** 2).sum()), 1e-300)
    order = sorted(groups, key=lambda label: -rounding.get(label, -1.0))
    measured = [label for label in order if label in rounding][:_MAX_WEIGHTS_RANKED]
    rows = {k: v[:_RANKING_ROWS] for k, v in check.items()} if batch_first else check
    ref = float_outputs(float_model, rows, batch_first)
    snr = {}
    for label in measured:
        probe = onnx.ModelProto()
        probe.CopyFrom(qdq)
        for weight in groups[label]:
            if weight not in dequantized:
                continue
            dq = probe.graph.node[dequantized[weight]]
            name = f"{weight}_float_for_the_check"
            probe.graph.initializer.append(numpy_helper.from_array(
                numpy_helper.to_array(floats[weight]), name))
            dq.op_type, dq.domain = "Identity", ""
            del dq.input[:]
            dq.input.append(name)
            del dq.attribute[:]
        s = score(probe, float_model, rows, batch_first, ref)
        if s is not None and s.snr_db is not None:
            snr[label] = s.snr_db
    ranked = sorted(measured, key=lambda label: -snr.get(label, -math.inf))
    return ranked + [label for label in order if label not in ranked], len(snr)


_MAX_FLOATED = 3          # element-wise nodes the check may move to the host, one at a time


def _float_the_sensitive(model, samples, signature, out_path, options, current, nodes, path,
                         provenance, more: dict, float_model, check, batch_first,
                         min_agreement, min_snr):
    """Still below the bars: the element-wise nodes on the TPU (lookup tables, VADD/VMUL;
    never a matrix op) ranked by what keeping each one's output in float gives (its
    QuantizeLinear/DequantizeLinear pair bypassed in the QDQ model: one onnxruntime pass
    each, no new calibration), and the best one kept in float, requantized and checked;
    again while it helps and the bars are not met.  Returns (options, score, nodes, a
    sentence for the report or "")."""
    from tpuasm.compiler.front.match import LOOKUP_OPS
    from tpuasm.compiler.front.prepare import matmul_bias_pairs
    bias_adds = {add.name for _, add, _, _ in matmul_bias_pairs(model)}
    by_name = {n.name: n for n in model.graph.node}
    start, moved = current, []
    ref = float_outputs(float_model, check, batch_first)
    for _ in range(_MAX_FLOATED):
        candidates = [by_name[n] for n in nodes if n in by_name and n not in bias_adds
                      and (by_name[n].op_type in LOOKUP_OPS or
                           by_name[n].op_type in ("Add", "Sub", "Mul"))]
        candidates = _noisiest(out_path, candidates, check, batch_first)[:_MAX_SCORED]
        ranked = []
        for node in candidates:
            s = _bypassed_score(out_path, node.output[0], float_model, check, batch_first,
                                ref, options.calibration_method == "minmax")
            if s is not None and s.key() > current.key():
                ranked.append((s.key(), node.name))
        if not ranked:
            break
        name = max(ranked)[1]
        other = replace(options, checked_float=(*options.checked_float, name))
        candidate = Path(out_path).with_suffix(".float.onnx")
        try:
            found = quantize(model, samples, signature, candidate, other, path, provenance,
                             **more)
        except Exception:               # noqa: BLE001 - as it was
            break
        s = score(candidate, float_model, check, batch_first, ref,
                  options.calibration_method == "minmax")
        if s is None or s.key() <= current.key():
            break
        shutil.copyfile(candidate, out_path)
        options, current, nodes = other, s, found
        moved.append(name)
        if not current.below(min_agreement, min_snr):
            break
    if not moved:
        return options, current, nodes, ""
    return options, current, nodes, (f"kept in float by the check: {', '.join(moved)} "
                                     f"({start.text()} -> {current.text()})")


def _take_back_the_floated(model, samples, signature, out_path, options, current, nodes,
                           path, provenance, more: dict, float_model, check, batch_first,
                           min_agreement, min_snr, notes: dict):
    """The bars met after element-wise nodes were kept in float (each a host round trip)
    and a later step changed more (int16 weights): those nodes back on the TPU, every other
    choice kept (the int16 tensors that can still be so), kept if it still meets the bars
    (a token classifier: its Tanh floated for 0.03 points, then int16 weights took it from
    99.13 to 99.88 % expected on new rows; with its Tanh on the TPU again, the same).
    Returns (options, score, nodes, a sentence for the report or "", notes)."""
    other = replace(options, checked_float=())
    groups = _eligible_wide(model, other, path, provenance)
    if groups is None:
        return options, current, nodes, "", notes
    wide = {t for key, alike in groups.items() for t in (key, *alike)}
    other = replace(other, checked_wide=tuple(t for t in options.checked_wide if t in wide))
    candidate = Path(out_path).with_suffix(".back.onnx")
    quantized = _quantized(model, samples, signature, candidate, other, path, provenance, more)
    if quantized is None:
        return options, current, nodes, "", notes
    found, tried = quantized
    s = score(candidate, float_model, check, batch_first,
              minmax=other.calibration_method == "minmax")
    if s is None or s.below(min_agreement, min_snr):
        return options, current, nodes, "", notes
    shutil.copyfile(candidate, out_path)
    back = ", ".join(options.checked_float[:6]) + (
        " ..." if len(options.checked_float) > 6 else "")
    return other, s, found, (
        f"back on the TPU, the bars met without them in float: {back} "
        f"({current.text()} -> {s.text()})"), tried


def _noisiest(qdq_path, candidates: list, check, batch_first) -> list:
    """`candidates` with the worst 8-bit rounding of their own output first: the SNR of each
    output against its QuantizeLinear -> DequantizeLinear copy, from one onnxruntime pass of
    the QDQ model over a few check rows (_rounding_snr).  Bypassing every candidate costs a
    pass each (a PaddleOCR recogniser has a hundred element-wise nodes: the check took 15
    minutes); the first _MAX_SCORED of this order are the ones worth it.  The order as
    given when the pass cannot run."""
    snr = _rounding_snr(qdq_path, [node.output[0] for node in candidates], check,
                        batch_first)
    if snr is None:
        return candidates
    return sorted(candidates, key=lambda node: snr.get(node.output[0], math.inf))


def _noisiest_tensors(qdq_path, tensors: list[str], check, batch_first) -> list[str]:
    """`tensors` (float model names) with the worst 8-bit rounding first (_noisiest's
    order); a tensor the QDQ model quantizes under another name (a model output's
    QuantizeLinear reads "<name>_QuantizeLinear_Input") is found by its scale's name."""
    snr = _rounding_snr(qdq_path, tensors, check, batch_first)
    if snr is None:
        return list(tensors)
    return sorted(tensors, key=lambda t: snr.get(t, math.inf))


def _rounding_snr(qdq_path, tensors: list[str], check, batch_first) -> dict | None:
    """{tensor: SNR in dB of its QuantizeLinear -> DequantizeLinear copy against it} from
    one onnxruntime pass of the QDQ model over a few check rows; None when it cannot run.

    The sums of squares are computed in the graph (_with_rounding_sums): the pass returns
    two numbers a tensor, so it holds no more than the model's own working set (onnxruntime
    keeps every graph output of a run until the run ends, fetched or not: a recogniser's
    activations as outputs over all rows filled 24 GB), and it is one session (an unrolled
    two-layer LSTM's 640 tensors took 80 passes of 8, 60 s of its compile in sessions)."""
    import onnx
    from tpuasm.compiler.runtime.validate import run_float
    qdq = onnx.load(str(qdq_path))
    producer = {o: n for n in qdq.graph.node for o in n.output if o}
    wanted = set(tensors)
    by_scale = {f"{t}_scale": t for t in tensors}
    pairs = {}
    for node in qdq.graph.node:
        q = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if q is None or q.op_type != "QuantizeLinear":
            continue
        name = q.input[0] if q.input[0] in wanted else by_scale.get(
            q.input[1] if len(q.input) > 1 else "")
        if name is not None and name not in pairs:
            pairs[name] = (q.input[0], node.output[0])
    if not pairs:
        return {}
    sums = _with_rounding_sums(qdq, pairs)
    try:
        values = run_float(qdq.SerializeToString(), _ranking_rows(qdq, check, batch_first),
                           [n for both in sums.values() for n in both], batch_first,
                           sums=True)
    except Exception:                   # noqa: BLE001 - no order: as given
        return None
    snr = {}
    for tensor, (signal_name, noise_name) in sums.items():
        signal = float(np.sum(values[signal_name], dtype=np.float64))
        noise = float(np.sum(values[noise_name], dtype=np.float64))
        snr[tensor] = math.inf if noise == 0 else \
            10 * math.log10(max(signal, 1e-300) / noise)
    return snr


def _with_rounding_sums(model, pairs: dict) -> dict:
    """`model` with two outputs of shape (1,) per {tensor: (value, its QDQ copy)}: the sum
    of the value's squares and that of its difference from the copy (in float64, whatever
    the tensor's type), computed right after the copy is made; returns {tensor: (signal
    output, noise output)}.  (onnxruntime's priority order, which frees a tensor as soon
    as its readers ran, held more here: 911 MB against 657 MB for 200 tensors of ddddocr's
    recogniser in its default order, 818 MB for the passes of 8 before.)"""
    from onnx import TensorProto, helper, numpy_helper
    graph = model.graph
    one = "rounding_sums/shape"
    graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), one))
    names, after = {}, {}
    for i, (tensor, (value, copy)) in enumerate(pairs.items()):
        tag = f"rounding_sums/{i}"
        made = after.setdefault(copy, [])

        def add(op, inputs, what, **attrs):
            out = f"{tag}/{what}"
            made.append(helper.make_node(op, inputs, [out], name=out, **attrs))
            return out
        x = add("Cast", [value], "x", to=TensorProto.DOUBLE)
        noise = add("Sub", [x, add("Cast", [copy], "copy", to=TensorProto.DOUBLE)],
                    "difference")
        names[tensor] = tuple(
            add("Reshape", [add("ReduceSumSquare", [t], f"{what}_sum", keepdims=0), one],
                what)
            for t, what in ((x, "signal"), (noise, "noise")))
        graph.output.extend(helper.make_tensor_value_info(n, TensorProto.DOUBLE, [1])
                            for n in names[tensor])
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        graph.node.append(node)
        graph.node.extend(n for o in node.output for n in after.get(o, ()))
    return names


def _ranking_rows(model, check: dict, batch_first: bool) -> dict:
    """The check rows a ranking pass reads: _RANKING_ROWS, or a whole number of the model's
    fixed batch (run_float pads a short chunk with zeros, whose activations the sums would
    count), check rows repeated when there are fewer."""
    if not batch_first:
        return check
    graph_inits = {t.name for t in model.graph.initializer}
    fixed = [d.dim_value for i in model.graph.input if i.name not in graph_inits
             for d in i.type.tensor_type.shape.dim[:1] if d.dim_value > 0]
    batch = min(fixed) if fixed else 1
    count = -(-_RANKING_ROWS // batch) * batch
    return {k: np.take(np.asarray(v), range(count), axis=0, mode="wrap")
            for k, v in check.items()}


_RANKING_ROWS = 8        # check rows for _noisiest's order


_MAX_SCORED = 8          # candidates bypassed and scored per round (_noisiest's order)


def _bypassed_score(qdq_path, tensor: str, float_model, check, batch_first,
                    ref: dict | None = None, minmax: bool = True) -> Score | None:
    """The QDQ model's score with `tensor` read in float where its DequantizeLinear was."""
    import onnx
    qdq = onnx.load(str(qdq_path))
    producer = {o: n for n in qdq.graph.node for o in n.output if o}
    changed = False
    for node in qdq.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        q = producer.get(node.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and q.input[0] == tensor:
            node.op_type, node.domain = "Identity", ""
            del node.input[:]
            node.input.append(tensor)
            del node.attribute[:]
            changed = True
    if not changed:
        return None
    return score(qdq, float_model, check, batch_first, ref, minmax)

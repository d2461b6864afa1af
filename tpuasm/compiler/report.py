"""The compile report, after the Edge TPU compiler's: every node of the user's model, where it
runs and why, each TPU segment's cycles and utilisation, and the share of the network's MACs
that the TPU does.

Two levels of nodes.  The *compiled* graph is what the passes matched (the quantized model,
after any rewrite: a BatchNormalization folded, an LSTM unrolled into per-step Gemms, the
QuantizeLinear/DequantizeLinear glue); `compiled_nodes` keeps one row per node of it.  The
*input* model is what the user wrote: `rows` has one row per node of it, aggregated through a
Provenance (tpuasm/compiler/front/provenance.py).  Warnings are data (`warnings`): the CLI prints
them to stderr, the library never prints.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache

from tpuasm.compiler.ir import Conv, Dense, Elementwise, Lookup, Pool

# below this share of the network's MACs on the TPU the report warns
MIN_TPU_MAC_SHARE = 0.5


@dataclass
class NodeRow:
    node: str
    op_type: str
    where: str            # "TPU" | "host" | "unused"
    step: str             # segment / host part name(s), "-" when it runs nowhere
    reason: str           # what it became on the TPU, or why it is on the host
    macs: int | None = None   # the network's MACs for this node (per batch), matrix ops only

    @property
    def note(self) -> str:            # the name the first reports used
        return self.reason


@dataclass
class SegmentRow:
    name: str
    operators: int
    macs: int                         # the network's MACs this segment performs (per batch)
    share: float                      # of all the network's MACs
    cycles: int | None = None         # per batch, timing-only run at compile time
    time_us: float | None = None      # at the machine's clock
    array_active_cycles: int | None = None
    utilisation: float | None = None  # macs / (cycles x N x N): the paper's Table 3 row 2
    rows: int | None = None           # rows its program takes per batch (Segment.program_rows)
    own_rows: bool = False            # its tensors' leading dimension, not the batch


@dataclass
class CompileReport:
    model: str
    batch: int
    array_size: int
    source: str                           # how the model was quantized
    rows: list[NodeRow] = field(default_factory=list)        # one per input-model node
    steps: list[dict] = field(default_factory=list)   # name, kind, items (operators / nodes)
    compiled_nodes: list[NodeRow] = field(default_factory=list)   # the compiled graph's
    segments: list[SegmentRow] = field(default_factory=list)
    macs: int = 0                         # all the network's MACs per batch, host ones too
    tpu_macs: int = 0                     # of which on the TPU
    clock_hz: float = 700e6
    warnings: list[str] = field(default_factory=list)
    validation: object = None             # set by the validation pass: text(), to_json(), warnings
    wide_tensors: list[str] = field(default_factory=list)    # int16 tensors on the TPU
    wide_weights: list[str] = field(default_factory=list)    # operators with int16 weights

    @property
    def tpu_nodes(self) -> int:
        return sum(r.where == "TPU" for r in self.rows)

    @property
    def host_nodes(self) -> int:
        return sum(r.where == "host" for r in self.rows)

    @property
    def tpu_mac_share(self) -> float | None:
        return self.tpu_macs / self.macs if self.macs else None

    def all_warnings(self) -> list[str]:
        """The report's warnings and the validation's, in that order."""
        extra = list(getattr(self.validation, "warnings", None) or [])
        return list(self.warnings) + [w for w in extra if w not in self.warnings]

    # ------------------------------------------------------------------ json
    def to_json(self) -> dict:
        d = {"model": self.model, "batch": self.batch, "array_size": self.array_size,
             "clock_hz": self.clock_hz, "source": self.source,
             "summary": {"tpu_nodes": self.tpu_nodes, "host_nodes": self.host_nodes,
                         "segments": sum(s["kind"] == "tpu" for s in self.steps),
                         "host_parts": sum(s["kind"] == "host" for s in self.steps),
                         "macs": self.macs, "tpu_macs": self.tpu_macs,
                         "tpu_mac_share": self.tpu_mac_share},
             "macs": self.macs, "tpu_macs": self.tpu_macs,
             "warnings": self.all_warnings(),
             "segments": [asdict(s) for s in self.segments],
             "steps": self.steps,
             "rows": [asdict(r) for r in self.rows],
             "compiled_nodes": [asdict(r) for r in self.compiled_nodes],
             "wide_tensors": list(self.wide_tensors),
             "wide_weights": list(self.wide_weights)}
        if self.validation is not None:
            d["validation"] = self.validation.to_json()
            d["validation_text"] = self.validation.text()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CompileReport":
        """The report as report.json saved it (a validation comes back as its saved text)."""
        d = dict(d)
        d.pop("summary", None)
        validation = d.pop("validation", None)
        validation_text = d.pop("validation_text", None)
        rows = [_node_row(r) for r in d.pop("rows", [])]
        compiled = [_node_row(r) for r in d.pop("compiled_nodes", [])]
        segments = [SegmentRow(**s) for s in d.pop("segments", [])]
        known = {f.name for f in fields(cls)}
        report = cls(rows=rows, compiled_nodes=compiled, segments=segments,
                     **{k: v for k, v in d.items() if k in known})
        if validation is not None:
            report.validation = _saved_validation(validation, validation_text)
        return report

    # ------------------------------------------------------------------ text
    def text(self) -> str:
        segments = sum(s["kind"] == "tpu" for s in self.steps)
        lines = [f"Model: {self.model}",
                 f"Quantization: {self.source}",
                 f"Batch {self.batch}, array {self.array_size}x{self.array_size}, clock "
                 f"{self.clock_hz / 1e6:,.0f} MHz",
                 f"Nodes on the TPU: {self.tpu_nodes} (in {segments} segment"
                 f"{'s' if segments != 1 else ''}); on the host: {self.host_nodes}",
                 _mac_line(self)]
        if self.wide_tensors:
            shown = ", ".join(self.wide_tensors[:8]) + (
                f" ... ({len(self.wide_tensors)} in all)" if len(self.wide_tensors) > 8 else "")
            lines.append(f"16-bit activations (int16; their matrix operators read them at half "
                         f"rate): {shown}")
        if self.wide_weights:
            shown = ", ".join(self.wide_weights[:8]) + (
                f" ... ({len(self.wide_weights)} in all)" if len(self.wide_weights) > 8 else "")
            lines.append(f"16-bit weights (int16, MatrixMultiply's D flag: half rate, a quarter "
                         f"with an int16 input): {shown}")
        warnings = self.all_warnings()
        if warnings:
            lines += ["", "Warnings:"] + [f"  - {w}" for w in warnings]
        if self.validation is not None:
            lines += ["", self.validation.text().rstrip()]
        if self.segments:
            lines += ["", _segment_table(self.segments, self.array_size)]
        lines += ["", "Execution order:"]
        for s in self.steps:
            what = ", ".join(s["items"][:6]) + (" ..." if len(s["items"]) > 6 else "")
            lines.append(f"  {s['name']:<10} {s['kind']:<5} {what}")
        lines += ["", "Nodes of the model (the reason below each):", _table(self.rows)]
        return "\n".join(lines) + "\n"


@dataclass
class SavedValidation:
    """A validation read back from report.json: the same face as the live one."""
    data: dict
    saved_text: str
    warnings: list[str]

    def text(self) -> str:
        return self.saved_text

    def to_json(self) -> dict:
        return self.data


def _saved_validation(data: dict, text: str | None):
    """validate.Validation as report.json saved it; a validation of another shape comes back
    as its saved text (its warnings are already in report.warnings: all_warnings saved them)."""
    from tpuasm.compiler.runtime.validate import Validation
    try:
        return Validation.from_json(data)
    except (KeyError, TypeError, ValueError):
        return SavedValidation(data, text or "", [])


def _node_row(r: dict) -> NodeRow:
    r = dict(r)
    if "note" in r and "reason" not in r:          # report.json of the first format
        r["reason"] = r.pop("note")
    return NodeRow(**{k: v for k, v in r.items() if k in {f.name for f in fields(NodeRow)}})


def _mac_line(report: CompileReport) -> str:
    if not report.macs:
        return "MACs: none (no Gemm, MatMul, Conv, LSTM or GRU with known shapes)"
    per_sample = report.macs / max(report.batch, 1)
    return (f"MACs per batch: {report.macs:,} ({per_sample:,.0f} per sample); on the TPU: "
            f"{report.tpu_macs:,} ({100 * report.tpu_mac_share:.1f} %)")


def _segment_table(segments: list[SegmentRow], n: int) -> str:
    header = ("Segment", "Rows", "Ops", "MACs", "Share", "Cycles", "Time", "Array active",
              "Utilisation")
    cells = [header]
    for s in segments:
        timed = s.cycles is not None
        rows = "-" if s.rows is None else f"{s.rows:,}" + (" own" if s.own_rows else "")
        cells.append((s.name, rows, str(s.operators), f"{s.macs:,}", f"{100 * s.share:.1f} %",
                      f"{s.cycles:,}" if timed else "-",
                      f"{s.time_us:,.2f} us" if timed else "-",
                      f"{100 * s.array_active_cycles / max(s.cycles, 1):.1f} %" if timed
                      else "-",
                      f"{100 * s.utilisation:.2f} %" if s.utilisation is not None else "-"))
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    left = {0}
    out = [f"TPU segments (per batch; rows: the rows its program takes per batch, the "
           f"batch, or 'own': its tensors' leading dimension at this batch, the frames of a "
           f"model run whole, a Reshape (1, T*F) -> (T, F); utilisation = the network's MACs "
           f"/ (cycles x {n} x {n}), the paper's Table 3 row 2):"]
    for i, c in enumerate(cells):
        out.append("  " + "  ".join(c[j].ljust(widths[j]) if j in left else c[j].rjust(widths[j])
                                    for j in range(len(c))).rstrip())
        if i == 0:
            out.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(out)


def _table(rows: list[NodeRow]) -> str:
    """One line per node with its whole name last (names are never cut, however long), its
    reason indented on the line below."""
    header = ("Runs on", "Step", "Operator", "MACs", "Node")
    cells = [(r.where, r.step, r.op_type, f"{r.macs:,}" if r.macs else "", r.node)
             for r in rows]
    widths = [max([len(header[i])] + [len(c[i]) for c in cells]) for i in range(4)]

    def line(c):
        return ("  " + "  ".join(c[j].rjust(widths[j]) if j == 3 else c[j].ljust(widths[j])
                                 for j in range(4)) + "  " + c[4])
    out = [line(header), "  " + "  ".join("-" * w for w in widths) + "  " + "-" * 4]
    indent = " " * (4 + sum(widths[:2]) + 2 * 2)
    for r, c in zip(rows, cells):
        out.append(line(c))
        if r.reason:
            out.append(f"{indent}{r.reason}")
    return "\n".join(out)


# ---------------------------------------------------------------------- aggregation

def input_rows(provenance, compiled: list[NodeRow]) -> list[NodeRow]:
    """One row per node of the input model (provenance.nodes), from the compiled graph's
    rows.  A node whose compiled nodes run in several places is "TPU" when any of them is,
    with a reason saying what ran where; glue the rewrites added (no source) gets no row; a
    node folded away runs where the node its reason names runs."""
    groups: dict[str, list[NodeRow]] = {}
    for row in compiled:
        source = provenance.source(row.node)
        if source is not None:
            groups.setdefault(source, []).append(row)
    rows: dict[str, NodeRow] = {}
    notes = getattr(provenance, "notes", {})
    for name, op_type in provenance.nodes:
        group = groups.get(name)
        if group:
            rows[name] = _aggregate(name, op_type, group)
            if name in notes:
                rows[name].reason = f"{rows[name].reason}; {notes[name]}"
    by_compiled = {r.node: r for r in compiled}
    for name, op_type in provenance.nodes:
        if name in rows:
            continue
        why = provenance.folded.get(name)
        if why is None:
            rows[name] = NodeRow(name, op_type, "unused", "-",
                                 "not in the compiled graph (removed before matching)")
            continue
        # what absorbed it: a node its reason names (an input-model node, a compiled one, or
        # one a rewrite made on the way, which stands for its own source)
        absorber = _named_in(why, [n for n in rows if n != name], list(by_compiled),
                             list(provenance.origin))
        target = rows.get(absorber) or by_compiled.get(absorber) or \
            rows.get(provenance.source(absorber) if absorber else None)
        if target is None:
            # nothing at run time computes it (a constant folded when compiling)
            rows[name] = NodeRow(name, op_type, "host", "-", why)
        else:
            rows[name] = NodeRow(name, op_type, target.where, target.step, why, 0)
    return [rows[name] for name, _ in provenance.nodes]


def _aggregate(name: str, op_type: str, group: list[NodeRow]) -> NodeRow:
    # the MACs the node does: a compiled part whose result nothing needs (an unrolled GRU's
    # reset gate at step 0, over a zero state) does none, as the report's total says
    used = [r for r in group if r.where != "unused"] or group
    macs = [r.macs for r in used if r.macs is not None]
    total = sum(macs) if macs else None
    steps = list(dict.fromkeys(r.step for r in group if r.step != "-")) or ["-"]
    places = {r.where for r in group}
    if len(group) == 1 and group[0].node == name:
        r = group[0]
        return NodeRow(name, op_type, r.where, r.step, r.reason, r.macs)
    if len(places) == 1:
        where = places.pop()
        if where == "unused":
            reason = "its result is not needed"
        elif len(group) == 1:
            reason = group[0].reason
        else:
            reason = (f"{len(group)} compiled nodes, all on the {where}: "
                      f"{_counted(r.op_type for r in group)}")
            if where == "host":
                reasons = list(dict.fromkeys(r.reason for r in group))
                reason += f" ({reasons[0]}{' ...' if len(reasons) > 1 else ''})"
        return NodeRow(name, op_type, where, ", ".join(steps), reason, total)
    on_tpu = [r for r in group if r.where == "TPU"]
    on_host = [r for r in group if r.where == "host"]
    parts = []
    for kind, count in Counter(r.op_type for r in on_tpu).items():
        of = sum(r.op_type == kind for r in group)
        why = next((r.reason for r in on_host if r.op_type == kind and r.reason), None)
        parts.append(f"{count} of {of} {kind} on the TPU" + (f" (the others: {why})"
                                                              if why else ""))
    tpu_kinds = {r.op_type for r in on_tpu}
    host_only = [r for r in on_host if r.op_type not in tpu_kinds]
    if host_only:
        parts.append(f"on the host: {_counted(r.op_type for r in host_only)}")
    where = "TPU" if on_tpu else "host"
    return NodeRow(name, op_type, where, ", ".join(steps), "; ".join(parts), total)


def _counted(kinds) -> str:
    return ", ".join(f"{n} {k}" for k, n in Counter(kinds).items())


def _named_in(text: str, *candidates: list[str]) -> str | None:
    """The longest node name that `text` mentions as a whole word (not inside a longer run
    of name characters): the text's words are found once, so a model of thousands of nodes
    costs a set lookup per name, not a regular expression."""
    words = set(_WORD.findall(text))
    best = None
    for names in candidates:
        for name in names:
            if best is not None and len(name) <= len(best):
                continue
            if name in words if _plain(name) else re.search(
                    rf"(?<![\w./:-]){re.escape(name)}(?![\w./:-])", text):
                best = name
    return best


_WORD = re.compile(r"[\w./:-]+")


@lru_cache(maxsize=65536)
def _plain(name: str) -> bool:
    return _WORD.fullmatch(name) is not None


# ---------------------------------------------------------------------- warnings

def mac_warnings(report: CompileReport, limit: int = 3) -> list[str]:
    """Less than half the network's MACs on the TPU: say so, and which host nodes weigh."""
    share = report.tpu_mac_share
    if share is None or share >= MIN_TPU_MAC_SHARE:
        return []
    heavy = sorted((r for r in report.rows if r.where == "host" and r.macs),
                   key=lambda r: -r.macs)[:limit]
    text = (f"only {100 * share:.1f} % of the model's {report.macs:,} MACs run on the TPU "
            f"({report.tpu_macs:,})")
    if heavy:
        text += "; the largest on the host: " + "; ".join(
            f"{r.node} ({r.op_type}, {100 * r.macs / report.macs:.1f} %): {r.reason}"
            for r in heavy)
    return [text]


def describe(op) -> str:
    """One line saying what an IR operator computes."""
    act = "" if getattr(op, "activation", None) is None or op.activation.kind == "none" \
        else f" + {op.activation.kind}"
    bias = " + bias" if getattr(op, "bias", None) is not None else ""
    if isinstance(op, Dense):
        k, n = op.weight.shape
        return f"Dense {k}x{n}{bias}{act}{_widths(op)}"
    if isinstance(op, Conv):
        o, c, kh, kw = op.weight.shape
        if (op.input.channels_last or op.output.channels_last) and (kh, kw) == (1, 1):
            positions = op.input.shape[1] * op.input.shape[2]
            return (f"Dense {c}x{o}{bias}{act} on each of {positions} rows (a 1x1 Conv over "
                    f"the {'channels-last rows' if op.input.channels_last else 'image'})"
                    f"{_widths(op)}")
        return (f"Conv {c * op.groups}x{op.input.shape[1]}x{op.input.shape[2]} -> "
                f"{o}x{op.output.shape[1]}x{op.output.shape[2]}, {kh}x{kw} kernel, stride "
                f"{op.strides[0]}x{op.strides[1]}{bias}{act}{grouped(op)}{_widths(op)}")
    if isinstance(op, Pool):
        return (f"{op.kind} pool {op.kernel[0]}x{op.kernel[1]} stride "
                f"{op.strides[0]}x{op.strides[1]} -> {'x'.join(map(str, op.output.shape))}")
    if isinstance(op, Lookup):
        return f"{op.function or 'element-wise'} lookup table"
    if isinstance(op, Elementwise):
        what = "two tensors" if op.b is not None else (
            "a tensor and a constant" if not op.reverse else "a constant and a tensor")
        return (f"element-wise {op.op} of {what} {'x'.join(map(str, op.output.shape))}"
                f" ({'VMUL' if op.op == 'mul' else 'VADD'}{'.B' if op.b is None else ''}){act}")
    return type(op).__name__


def _widths(op) -> str:
    """A matrix operator's 16-bit activations and weights (nothing when all are 8-bit)."""
    parts = []
    if op.input.quant.wide and op.wide_weights:
        parts.append("int16 input and int16 weights (H and D flags, a quarter of the rate)")
    elif op.input.quant.wide:
        parts.append("int16 input (H flag, half rate)")
    elif op.wide_weights:
        parts.append("int16 weights (D flag, half rate)")
    if op.output.quant.wide:
        parts.append("int16 output")
    return f"; {', '.join(parts)}" if parts else ""


def grouped(op) -> str:
    """A grouped convolution's array utilisation (nothing for groups = 1)."""
    g = op.groups
    if g == 1:
        return ""
    o, cg = op.weight.shape[:2]
    kind = "depthwise conv" if cg == 1 and o == g else "grouped conv"
    return (f"; {kind}, {g} groups: block-diagonal {cg * g}x{o} weights per tap, 1/{g} of "
            f"them non-zero, so at most 1/{g} of the array's weights do work (all-zero "
            f"tiles skipped)")

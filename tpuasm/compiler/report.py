"""The compile report, after the Edge TPU compiler's: every node, where it runs, and why it is
not on the TPU."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tpuasm.compiler.ir import Conv, Dense, Lookup, Pool


@dataclass
class NodeRow:
    node: str
    op_type: str
    where: str            # "TPU" | "host" | "unused"
    step: str             # segment / host part name, or the operator it was fused into
    note: str             # what it became on the TPU, or why it is on the host


@dataclass
class CompileReport:
    model: str
    batch: int
    array_size: int
    source: str                           # how the model was quantized
    rows: list[NodeRow] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)   # name, kind, operators / nodes

    @property
    def tpu_nodes(self) -> int:
        return sum(r.where == "TPU" for r in self.rows)

    @property
    def host_nodes(self) -> int:
        return sum(r.where == "host" for r in self.rows)

    def to_json(self) -> dict:
        d = asdict(self)
        d["summary"] = {"tpu_nodes": self.tpu_nodes, "host_nodes": self.host_nodes,
                        "segments": sum(s["kind"] == "tpu" for s in self.steps),
                        "host_parts": sum(s["kind"] == "host" for s in self.steps)}
        return d

    def text(self) -> str:
        segments = sum(s["kind"] == "tpu" for s in self.steps)
        lines = [f"Model: {self.model}",
                 f"Quantization: {self.source}",
                 f"Batch {self.batch}, array {self.array_size}x{self.array_size}",
                 f"Nodes on the TPU: {self.tpu_nodes} (in {segments} segment"
                 f"{'s' if segments != 1 else ''}); on the host: {self.host_nodes}", "",
                 "Execution order:"]
        for s in self.steps:
            what = ", ".join(s["items"][:6]) + (" ..." if len(s["items"]) > 6 else "")
            lines.append(f"  {s['name']:<10} {s['kind']:<5} {what}")
        lines += ["", _table(self.rows)]
        return "\n".join(lines) + "\n"


def _table(rows: list[NodeRow]) -> str:
    header = ("Node", "Operator", "Runs on", "Step", "Note")
    cells = [header] + [(r.node, r.op_type, r.where, r.step, r.note) for r in rows]
    widths = [min(max(len(c[i]) for c in cells), 40) for i in range(4)]
    out = []
    for i, c in enumerate(cells):
        out.append("  ".join(c[j][:40].ljust(widths[j]) for j in range(4)) + "  " + c[4])
        if i == 0:
            out.append("  ".join("-" * w for w in widths) + "  " + "-" * 4)
    return "\n".join(out)


def describe(op) -> str:
    """One line saying what an IR operator computes."""
    act = "" if getattr(op, "activation", None) is None or op.activation.kind == "none" \
        else f" + {op.activation.kind}"
    bias = " + bias" if getattr(op, "bias", None) is not None else ""
    if isinstance(op, Dense):
        k, n = op.weight.shape
        return f"Dense {k}x{n}{bias}{act}"
    if isinstance(op, Conv):
        o, c, kh, kw = op.weight.shape
        if (op.input.channels_last or op.output.channels_last) and (kh, kw) == (1, 1):
            positions = op.input.shape[1] * op.input.shape[2]
            return (f"Dense {c}x{o}{bias}{act} on each of {positions} rows (a 1x1 Conv over "
                    f"the {'channels-last rows' if op.input.channels_last else 'image'})")
        return (f"Conv {c * op.groups}x{op.input.shape[1]}x{op.input.shape[2]} -> "
                f"{o}x{op.output.shape[1]}x{op.output.shape[2]}, {kh}x{kw} kernel, stride "
                f"{op.strides[0]}x{op.strides[1]}{bias}{act}{grouped(op)}")
    if isinstance(op, Pool):
        return (f"{op.kind} pool {op.kernel[0]}x{op.kernel[1]} stride "
                f"{op.strides[0]}x{op.strides[1]} -> {'x'.join(map(str, op.output.shape))}")
    if isinstance(op, Lookup):
        return f"{op.function or 'element-wise'} lookup table"
    return type(op).__name__


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

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
    validation: object = None             # validate.Validation (a compiled float model)

    @property
    def tpu_nodes(self) -> int:
        return sum(r.where == "TPU" for r in self.rows)

    @property
    def host_nodes(self) -> int:
        return sum(r.where == "host" for r in self.rows)

    def to_json(self) -> dict:
        validation, self.validation = self.validation, None
        d = asdict(self)
        self.validation = validation
        d["validation"] = validation.to_json() if validation is not None else None
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
        if self.validation is not None:
            lines += ["", self.validation.text()]
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
    if isinstance(op, Dense):
        k, n = op.weight.shape
        return f"Dense {k}x{n}{' + bias' if op.bias is not None else ''}{act}"
    if isinstance(op, Conv):
        o, c, kh, kw = op.weight.shape
        return (f"Conv {c}x{op.input.shape[1]}x{op.input.shape[2]} -> "
                f"{o}x{op.output.shape[1]}x{op.output.shape[2]}, {kh}x{kw} kernel, stride "
                f"{op.strides[0]}x{op.strides[1]}{act}")
    if isinstance(op, Pool):
        return (f"{op.kind} pool {op.kernel[0]}x{op.kernel[1]} stride "
                f"{op.strides[0]}x{op.strides[1]} -> {'x'.join(map(str, op.output.shape))}")
    if isinstance(op, Lookup):
        return f"{op.function or 'element-wise'} lookup table"
    return type(op).__name__

"""Which operators fold into the Activate of the layer before them.

- A Lookup (quantized sigmoid, tanh, ...) whose input is produced by a Dense, Conv or Pool
  and read by nothing else becomes that Activate's L table.
- A max Pool right after a Conv (same quantization, the conv output read by nothing else)
  becomes that Activate's M pooling: requantization is monotonic, so pooling the int32 sums
  then requantizing equals requantizing then pooling.  Average pooling is not fused: its
  mean of requantized values rounds twice.  Fusion needs a sample's whole conv output in one
  accumulator half.
- A Lookup after an Elementwise (read by nothing else) becomes its VADD/VMUL's L table.
Each remaining group is a `Step`: one operator plus what is fused into it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Conv, Dense, Elementwise, Lookup, Pool, Segment
from .layout import output_hw


@dataclass
class Step:
    op: Dense | Conv | Pool | Lookup | Elementwise
    pool: Pool | None = None
    lookup: Lookup | None = None

    @property
    def reads(self) -> list[str]:
        """The tensors the step reads: one, or an Elementwise's two."""
        return list(dict.fromkeys(t.name for t in self.op.inputs))

    @property
    def writes(self) -> str:
        last = self.lookup or self.pool or self.op
        return last.output.name

    @property
    def needs_identity(self) -> bool:
        # a table of an int16 input is a VADD (lower.requantization), not an identity copy
        return isinstance(self.op, Pool) or (isinstance(self.op, Lookup) and
                                             self.op.index is None)

    @property
    def nodes(self) -> list[str]:
        return [o.name for o in (self.op, self.pool, self.lookup) if o is not None]

    def constant_rows(self, n: int) -> int:
        op = self.op
        table = -(-256 // n) if (self.lookup is not None or isinstance(op, Lookup) or (
            isinstance(op, Elementwise) and op.activation.kind != "none")) else 0
        if isinstance(op, Dense):
            blocks = -(-op.weight.shape[1] // n)
        elif isinstance(op, Conv):
            blocks = -(-op.weight.shape[0] // n)
        elif isinstance(op, Pool) and op.kind == "avg":
            blocks = -(-op.input.shape[0] // n)
        else:
            blocks = 0
        # an Elementwise's constant operand: one row per chunk of channels (B flag)
        vconst = -(-op.a.shape[0] // n) if isinstance(op, Elementwise) and op.b is None else 0
        if isinstance(op, Lookup) and op.index is not None:
            vconst = 1                  # the requantization's constant 0 (one row serves all)
        return 9 * blocks + table + vconst

    def summary(self) -> str:
        op = self.op
        if isinstance(op, Dense):
            k, m = op.weight.shape
            what = f"Dense {k} -> {m}"
        elif isinstance(op, Conv):
            o, c, kh, kw = op.weight.shape
            what = (f"Conv {c * op.groups} -> {o}, {kh}x{kw} stride {op.strides[0]}, "
                    f"pads {op.pads}")
            if op.groups != 1:
                what += f", {op.groups} groups"
        elif isinstance(op, Pool):
            what = f"{op.kind} Pool {op.kernel} stride {op.strides} pads {op.pads}"
        elif isinstance(op, Elementwise):
            what = (f"element-wise {op.op}{' (b - a)' if op.reverse else ''}"
                    f"{' with a constant' if op.b is None else ''}"
                    f"{' with a row per sample' if op.broadcasts_b else ''}"
                    f" ({'VMUL' if op.op == 'mul' else 'VADD'})")
        else:
            what = f"Lookup ({op.function or 'table'})"
        act = getattr(op, "activation", None)
        if act is not None and act.kind != "none":
            what += f" + {act.kind}" + (f"({act.lo}, {act.hi})" if act.kind == "clip" else "")
        if self.pool is not None:
            what += f" + max pool {self.pool.kernel} stride {self.pool.strides} pads {self.pool.pads}"
        if self.lookup is not None:
            what += f" + lookup ({self.lookup.function or 'table'})"
        return f"{' + '.join(self.nodes)}: {what}"

    def describe(self, layouts) -> str:
        fused = self.op.nodes if self.op.nodes else ()
        extra = f" (ONNX nodes {', '.join(fused)})" if fused else ""
        return f"---- {self.summary()}{extra}\n     {', '.join(self.reads)} -> {self.writes}"

    def lower(self, low):
        op = self.op
        if isinstance(op, Dense):
            low.dense(op, self.lookup)
        elif isinstance(op, Conv):
            low.conv(op, self.pool, self.lookup)
        elif isinstance(op, Pool):
            low.pool(op, self.lookup)
        elif isinstance(op, Elementwise):
            low.elementwise(op, self.lookup)
        else:
            low.lookup(op)


@dataclass
class Fusion:
    steps: list[Step]


def plan_fusion(segment: Segment, half_rows: int) -> Fusion:
    readers: dict[str, list] = {}
    for op in segment.operators:
        for name in dict.fromkeys(t.name for t in op.inputs):
            readers.setdefault(name, []).append(op)
    outputs = {t.name for t in segment.outputs}

    def only_reader(tensor) -> object | None:
        r = readers.get(tensor.name, [])
        return r[0] if len(r) == 1 and tensor.name not in outputs else None

    fused: set[int] = set()
    steps: list[Step] = []
    for op in segment.operators:
        if id(op) in fused:
            continue
        step = Step(op)
        last = op
        if isinstance(op, Conv):
            nxt = only_reader(op.output)
            ho, wo = output_hw(op)
            if isinstance(nxt, Pool) and nxt.kind == "max" and nxt.input.quant == nxt.output.quant \
                    and ho * wo <= half_rows:
                step.pool = nxt
                fused.add(id(nxt))
                last = nxt
        if isinstance(op, (Dense, Conv, Pool, Elementwise)):
            nxt = only_reader(last.output)
            if isinstance(nxt, Lookup) and nxt.index is None:
                # an int16 input's table reads its own 8-bit requantization (Lookup.index),
                # not the byte the op before would write
                step.lookup = nxt
                fused.add(id(nxt))
        steps.append(step)
    return Fusion(steps)

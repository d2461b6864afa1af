"""Which node of the user's model each node of the compiled graph came from.

The front end rewrites the model before it is matched to the TPU (constant folding, a
BatchNormalization folded into the Conv before it, an LSTM unrolled into per-step Gemms, a bias
Add folded into its MatMul) and quantization adds QuantizeLinear/DequantizeLinear glue.  The
report still speaks of the nodes the user wrote: every rewrite records here where its nodes
came from, and the report has one row per node of the input model.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Provenance:
    nodes: list[tuple[str, str]] = field(default_factory=list)   # input model: (name, op_type)
    origin: dict[str, str] = field(default_factory=dict)   # compiled node -> input-model node
    folded: dict[str, str] = field(default_factory=dict)   # input-model node gone -> why
    # compiled node -> (num, den): the share of its products the network asks for, where a
    # rewrite made it do more (zeros spread into a dilated kernel, an upsampled input)
    own_work: dict[str, tuple[int, int]] = field(default_factory=dict)
    # input-model node -> what a rewrite did to it that the report should say (banding.py:
    # "in 2 bands of rows ...")
    notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, model) -> "Provenance":
        """The identity provenance of an (already node-named) ONNX model."""
        return cls([(n.name, n.op_type) for n in model.graph.node])

    def source(self, node: str) -> str | None:
        """The input-model node a compiled node came from (None for added glue)."""
        if node in self.origin:
            return self.origin[node]
        return node if node in self.names else None

    @property
    def names(self) -> set[str]:
        return {name for name, _ in self.nodes}

    def derive(self, new: str, old: str) -> None:
        """Node `new` was made from node `old` (itself a compiled or an input-model node)."""
        self.origin[new] = self.source(old) or old

    def fold(self, old: str, why: str) -> None:
        """Node `old` left the graph entirely (`why` says what absorbed it)."""
        source = self.source(old) or old
        self.folded.setdefault(source, why)

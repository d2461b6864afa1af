"""Listings and symbol maps (customasm-style text reports of an assembled program)."""
from __future__ import annotations

from ..binary import SYMBOL_KINDS, Program
from ..encoding import encode
from ..isa import WORD_BYTES


def listing(program: Program) -> str:
    """One line per instruction: index, byte address, the 12 bytes in hex, the source line
    (and a `name:` line before an instruction that a label names, a `.node NAME` line where
    a graph node's run starts)."""
    out = [f"{'index':>6}  {'addr':>8}  {'bytes':<{WORD_BYTES * 3 - 1}}  source"]
    labels: dict[int, list[str]] = {}
    for s in program.symbols:
        if s.kind == "label":
            labels.setdefault(s.value, []).append(s.name)
    nodes = {r.start: program.node_of(r.start) for r in program.node_runs()}
    for i, ins in enumerate(program.instructions):
        if i in nodes:
            out.append(f"{'':>6}  {'':>8}  .node {nodes[i]}")
        for name in labels.get(i, ()):
            out.append(f"{'':>6}  {'':>8}  {name}:")
        hex_bytes = " ".join(f"{b:02x}" for b in encode(ins))
        loc = program.locations[i]
        text = f"{loc.file}:{loc.line}  {program.source_line(loc)}" if loc is not None else ""
        out.append(f"{i:>6}  {i * WORD_BYTES:08x}  {hex_bytes}  {text}".rstrip())
    return "\n".join(out) + "\n"


def symbol_map(program: Program) -> str:
    """Every symbol: kind, value (region base, a node's first instruction), size (rows of a
    region, instructions of a node's run), name; sorted by kind then value."""
    out = [f"{'kind':<6} {'value':>12} {'rows':>8}  name"]
    for s in sorted(program.symbols, key=lambda s: (SYMBOL_KINDS.index(s.kind), s.value, s.name)):
        name = s.name if s.kind in ("const", "label", "node") else f"{s.kind}.{s.name}"
        rows = str(s.size) if s.kind not in ("const", "label") else ""
        out.append(f"{s.kind:<6} {s.value:>12} {rows:>8}  {name}")
    return "\n".join(out) + "\n"

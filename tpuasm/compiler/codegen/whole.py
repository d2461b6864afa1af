"""A compiled model as one TPU program, for cycle counts (`tpuasm profile`, `tpuasm sweep`).

A model that the compiler cut into several segments (TPU operators with host parts between
them: an LSTM's element-wise gate arithmetic, a Concat) runs as one program per segment.
To time the whole network the way the paper's counters saw it, the segments are joined in
order into one program, each host part becoming a host round trip:

- the segment's outputs go to host memory (its own WHMs, as in the separate programs);
- `INT k` (Interrupt_Host: it waits until every earlier instruction has finished, then
  signals the host) stands for "the host takes the outputs and computes host part k";
- the next segment's inputs come back by its own RHMs, after the interrupt.

The next segment's first Read_Weights stay *before* the interrupt: weights do not depend on
the host, so a TPU engineer fetches them during the round trip.  The host's own compute
time is not modelled (zero): the machine's counters only see the TPU's side.

Each segment keeps its Unified Buffer layout (every segment's UB regions start at row 0:
segments run one after the other, so they reuse the buffer) and the shared accumulator
halves; host regions and weight tiles get a per-segment prefix, so host buffers and the
weight image are the segments' own, one after the other.  Data values never change the
timing, so the program is meant to run on zero host and weight images (or timing-only).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tpuasm.compiler.errors import CompileError

_DIRECTIVE = re.compile(r"^\.(ub|host|tile|acc)\s+([A-Za-z_]\w*)\s*,\s*([^;]+?)\s*(;.*)?$")
_REF = re.compile(r"\b(ub|host|tile)\.([A-Za-z_]\w*)\b")
_INPUT_DMA = re.compile(r"^\s*RHM\s+host\.s\d+_in_")


@dataclass(frozen=True)
class WholeProgram:
    source: str
    host_rows: int
    weight_tiles: int
    segments: int
    instructions: int = 0


def whole_program(compiled, title: str = "") -> WholeProgram:
    """Join the segments of a CompiledModel (with programs) into one .tasm program."""
    from tpuasm.compiler.runtime.steps import TpuStep
    programs = [s.program for s in compiled.steps if isinstance(s, TpuStep)]
    if not programs or any(p is None for p in programs):
        raise CompileError("no TPU programs to join (compile with the back end)")
    head, declarations, bodies = [], [], []
    host_rows = tiles = 0
    instructions = 1 + sum(p.instructions for p in programs)   # + the INTs, - the HLTs
    acc = None
    config = None
    for k, program in enumerate(programs):
        seg = _split(program.source, f"s{k}_")
        if config is None:
            config = seg.config
        elif seg.config != config:
            raise CompileError(f"segment {k}: machine shape {seg.config!r} differs from "
                               f"{config!r}")
        if acc is None:
            acc = seg.acc
            declarations += seg.acc
        elif seg.acc != acc:
            raise CompileError(f"segment {k}: accumulator regions differ from segment 0's")
        declarations += seg.host + seg.tile
        host_rows += program.host_rows
        tiles += int(program.weights.shape[0])
        body = seg.body
        if k > 0:
            body = _round_trip(body, k)
        bodies.append([f"; ======== segment {k} ({program.segment.name}) ========", *body])
    head.append(f"; {title or 'model'}: {len(programs)} TPU segment(s) joined by "
                f"tpuasm.compiler.codegen.whole (host parts = INT round trips)")
    head.append(config)
    lines = head + [""] + declarations + [""]
    for body in bodies:
        lines += body + [""]
    lines.append("        HLT")
    return WholeProgram("\n".join(lines) + "\n", max(host_rows, 1), max(tiles, 1),
                        len(programs), instructions)


@dataclass
class _Segment:
    config: str
    acc: list
    host: list
    tile: list
    body: list


def _split(source: str, prefix: str) -> _Segment:
    """Declarations and body of one segment's program, its UB references made numeric
    (bases as the assembler would place them) and its host/tile regions prefixed."""
    ub_base, top = {}, 0
    config, acc, host, tile, body = None, [], [], [], []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith(".config"):
            config = stripped
            continue
        if config is None or stripped.upper() == "HLT":
            continue                      # the segment's header comments, its HLT
        m = _DIRECTIVE.match(stripped)
        if m:
            kind, name, rest, _ = m.groups()
            args = [a.strip() for a in rest.split(",")]
            if kind == "ub":
                if len(args) != 1:
                    raise CompileError(f"unexpected UB region with a fixed base: {stripped}")
                ub_base[name] = top
                top += int(args[0], 0)
            elif kind == "acc":
                acc.append(stripped)
            elif kind == "host":
                host.append(f".host  {prefix}{name}, {rest}")
            else:
                tile.append(f".tile  {prefix}{name}, {rest}")
            continue
        body.append(line)
    if config is None:
        raise CompileError("a segment program without .config")

    def ref(m):
        kind, name = m.groups()
        if kind == "ub":
            if name not in ub_base:
                raise CompileError(f"unknown UB region {name!r} in a segment program")
            return str(ub_base[name])
        return f"{kind}.{prefix}{name}"

    body = [_REF.sub(ref, line) if not line.lstrip().startswith(";") else line
            for line in body]
    return _Segment(config, acc, host, tile, body)


def _round_trip(body: list[str], k: int) -> list[str]:
    """`INT k` before the segment's first input DMA (after its first Read_Weights)."""
    for i, line in enumerate(body):
        if _INPUT_DMA.match(line):
            return body[:i] + [f"        INT {k}                       ; host part {k}: "
                               f"the host takes the outputs, computes, sends the inputs"] \
                + body[i:]
    return [f"        INT {k}"] + body

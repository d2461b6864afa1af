"""`tpuasm lint`: NOP padding that tpuasm's interlocked pipeline makes unnecessary.

OpenTPU has no interlocks, so its programs pad every dependency with NOPs (hundreds
of them in its examples).  tpuasm's pipeline stalls a dependent instruction until its
inputs are ready, so a NOP never changes what a program computes; it only delays it.
`lint` reports each run of NOPs with its source position and the dependency it was
padding; `strip_nops` removes them all (labels move to the next kept instruction).
The output of a program is the same with or without its NOPs (tests prove it on the
reference model and the emulator).
"""
from __future__ import annotations

from dataclasses import dataclass

from .binary import Program, SourceLoc, Symbol
from .diagnostics import Diagnostic
from .disassembler import format_instruction
from .encoding import Instruction
from .opentpu import (ACT_LATENCY_CYCLES, FIFO_CYCLES, HOST_VECTORS_PER_CYCLE,
                      MMC_CYCLES_PER_N, WEIGHT_BYTES_PER_CYCLE, _problems, word_count)


@dataclass(frozen=True)
class NopRun:
    """Consecutive NOP instructions `first`..`last` (indices), idling `cycles` cycles."""
    first: int
    last: int
    cycles: int
    before: int | None      # the instruction just before the run, if any
    after: int | None       # the instruction just after the run, if any

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def nop_runs(program: Program) -> list[NopRun]:
    """Every maximal run of NOPs, in program order."""
    runs, start, cycles = [], None, 0
    instructions = program.instructions
    for i, ins in enumerate(instructions + [None]):
        if ins is not None and ins.key == "NOP":
            if start is None:
                start, cycles = i, 0
            cycles += ins.repeat
        elif start is not None:
            runs.append(NopRun(start, i - 1, cycles, start - 1 if start > 0 else None,
                               i if i < len(instructions) else None))
            start = None
    return runs


# ------------------------------------------------------------------ what a NOP run was for
# Row ranges each instruction reads and writes, for OpenTPU's instructions and flags
# without a repeat, whose footprint is a plain range of one row per vector.  Enough to
# name the dependency an OpenTPU program padded; anything beyond OpenTPU's set (16-bit
# vectors, strided DMA, registers such as act_out) gets the general wording.
def _footprint(ins: Instruction):
    """(reads, writes): sets of (memory, start, stop) ranges, or None if not simple."""
    if ins.repeat != 1 or _problems(ins):
        return None
    o = ins.operands
    if ins.key == "RHM":
        return {("host", o["host"], o["host"] + o["length"])}, {("ub", o["ub"], o["ub"] + o["length"])}
    if ins.key == "WHM":
        return {("ub", o["ub"], o["ub"] + o["length"])}, {("host", o["host"], o["host"] + o["length"])}
    if ins.key == "RW":
        return set(), {("fifo", 0, 1)}
    if ins.key == "MMC" and "C" not in ins.flag_letters:
        reads = {("ub", o["ub"], o["ub"] + o["length"])}
        if "S" in ins.flag_letters:
            reads.add(("fifo", 0, 1))
        return reads, {("acc", o["acc"], o["acc"] + o["length"])}
    if ins.key == "ACT" and not set(ins.flag_letters) & {"M", "A"}:
        return {("acc", o["acc"], o["acc"] + o["length"])}, {("ub", o["ub"], o["ub"] + o["length"])}
    return None


def _overlaps(a, b) -> bool:
    return any(m1 == m2 and s1 < e2 and s2 < e1 for m1, s1, e1 in a for m2, s2, e2 in b)


def padded_dependency(program: Program, run: NopRun) -> int | None:
    """The nearest instruction before `run` that the instruction after it depends on
    (reads what it writes, or writes what it reads or writes); None if there is none
    or the footprints are not simple enough to tell."""
    if run.after is None or run.before is None:
        return None
    later = _footprint(program.instructions[run.after])
    if later is None:
        return None
    reads, writes = later
    for j in range(run.before, -1, -1):
        earlier = _footprint(program.instructions[j])
        if earlier is None:
            if program.instructions[j].key in ("NOP", "SYNC"):
                continue
            return None
        r, w = earlier
        if _overlaps(reads, w) or _overlaps(writes, r) or _overlaps(writes, w):
            return j
    return None


# ------------------------------------------------------------------ findings
@dataclass(frozen=True)
class Finding:
    run: NopRun
    message: str
    location: SourceLoc | None

    def diagnostic(self) -> Diagnostic | None:
        if self.location is None:
            return None
        loc = self.location
        return Diagnostic(self.message, loc.file, loc.line, loc.col, loc.col + 3,
                          severity="warning",
                          notes=("`tpuasm asm --strip-nops` drops them; the output is the same",))


def _describe(program: Program, index: int) -> str:
    loc = program.locations[index]
    where = f"line {loc.line}" if loc is not None else f"instruction {index}"
    return f"`{format_instruction(program.instructions[index])}` ({where})"


def lint(program: Program) -> list[Finding]:
    """One finding per NOP run: where it is, how long, and what it was padding."""
    findings = []
    for run in nop_runs(program):
        what = f"{run.count} NOP{'s' if run.count > 1 else ''}"
        if run.cycles != run.count:
            what += f" ({run.cycles} cycles)"
        first, last = program.locations[run.first], program.locations[run.last]
        if first is not None and last is not None and first.file == last.file and last.line > first.line:
            what += f" (lines {first.line}-{last.line})"
        dep = padded_dependency(program, run)
        if run.after is None:
            why = f"nothing follows {'them' if run.count > 1 else 'it'}"
        elif dep is not None:
            why = (f"the interlocked pipeline already makes {_describe(program, run.after)} "
                   f"wait for {_describe(program, dep)}")
        else:
            why = (f"the interlocked pipeline already orders {_describe(program, run.after)} "
                   "after everything it depends on")
        verb = "are" if run.count > 1 else "is"
        findings.append(Finding(run, f"{what} {verb} unnecessary: {why}", first))
    return findings


def render(findings: list[Finding], program: Program, name: str, color: bool = False) -> str:
    """Compiler-style text for every finding, then a one-line summary."""
    blocks = []
    for f in findings:
        d = f.diagnostic()
        if d is not None:
            blocks.append(d.render(program.sources, color))
        else:
            span = (f"instruction {f.run.first}" if f.run.count == 1
                    else f"instructions {f.run.first}-{f.run.last}")
            blocks.append(f"{name}: {span}: warning: {f.message}")
    nops = sum(f.run.count for f in findings)
    cycles = sum(f.run.cycles for f in findings)
    if findings:
        blocks.append(f"{name}: {nops} unnecessary NOP{'s' if nops > 1 else ''} in "
                      f"{len(findings)} run{'s' if len(findings) > 1 else ''} "
                      f"({cycles} idle cycle{'s' if cycles > 1 else ''}); "
                      "`tpuasm asm --strip-nops` drops them")
    else:
        blocks.append(f"{name}: no unnecessary NOPs")
    return "\n\n".join(blocks) + "\n"


# ------------------------------------------------------------------ OpenTPU's hardware
# The reverse question, for programs that must also run on OpenTPU: is the NOP padding
# enough for a machine without interlocks?  OpenTPU issues one instruction per cycle and
# documents each one's latency (spec/opentpu.md section 6); an instruction that issues
# before an earlier one has finished with the rows (or tile, or unit) it needs reads
# stale data there.  The check works at whole-instruction granularity, as OpenTPU's
# latency table does, so it is conservative.
@dataclass(frozen=True)
class Hazard:
    index: int              # the instruction that issues too early
    waits_for: int          # the earlier instruction it must wait for
    issue: int              # its issue cycle on OpenTPU
    ready: int              # the first cycle it could safely issue
    why: str                # a template: {what} is the earlier instruction, {ready} the cycle

    @property
    def nops(self) -> int:
        return self.ready - self.issue


def _opentpu_latency(ins: Instruction, n: int) -> int:
    """Cycles the instruction keeps its unit busy on OpenTPU (an RW's tile then needs up
    to FIFO_CYCLES more through the FIFO); opentpu.py holds the numbers."""
    if ins.key in ("RHM", "WHM"):
        return -(-ins.operands["length"] // HOST_VECTORS_PER_CYCLE)
    if ins.key == "RW":
        return -(-n * n // WEIGHT_BYTES_PER_CYCLE)
    if ins.key == "MMC":
        return ins.operands["length"] + MMC_CYCLES_PER_N * n
    if ins.key == "ACT":
        return ins.operands["length"] + ACT_LATENCY_CYCLES
    return 0


_UNIT = {"RHM": "host-read", "WHM": "host-write", "RW": "weight", "MMC": "matrix",
         "ACT": "activate"}


def opentpu_hazards(program: Program) -> list[Hazard]:
    """Where the program's padding is too short for OpenTPU's hardware: one Hazard per
    early instruction (the latest-finishing conflict).  OpenTPU programs only (no repeat,
    OpenTPU's instructions and flags; `opentpu.opentpu_errors` says what else)."""
    n = program.shape.array_size
    cycle = 0
    busy: dict[str, tuple[int, int]] = {}           # unit -> (until cycle, instruction)
    live: list[tuple[set, set, int, int, int]] = []  # (reads, writes, read end, finish, index)
    tiles: list[tuple[int, int]] = []               # RW tiles not yet switched in: (ready, index)
    hazards = []
    for i, ins in enumerate(program.instructions):
        issue = cycle
        cycle += word_count(ins)                     # OpenTPU issues one word per cycle
        worst = None

        def need(ready, j, why):
            nonlocal worst
            if ready > issue and (worst is None or ready > worst[0]):
                worst = (ready, j, why)

        if ins.key == "HLT":                         # OpenTPU stops as soon as HLT decodes
            for _r, _w, _e, finish, j in live:
                need(finish, j, "{what} runs until cycle {ready}, but OpenTPU stops at HLT at once")
        unit = _UNIT.get(ins.key)
        if unit in busy:
            need(busy[unit][0], busy[unit][1],
                 f"OpenTPU's {unit} unit is busy with {{what}} until cycle {{ready}}")
        foot = _footprint(ins)
        if foot is not None:
            reads, writes = foot
            if "fifo" in {m for m, _, _ in reads} and tiles:
                ready, j = tiles.pop(0)
                need(ready, j, "the tile of {what} reaches the array at cycle {ready}")
            for r, w, read_end, finish, j in live:
                if _overlaps(reads, w) or _overlaps(writes, w):
                    need(finish, j, "{what} writes rows this uses until cycle {ready}")
                elif _overlaps(writes, r):
                    need(read_end, j, "{what} reads rows this overwrites until cycle {ready}")
        if worst is not None:
            hazards.append(Hazard(i, worst[1], issue, worst[0], worst[2]))
        latency = _opentpu_latency(ins, n)
        if unit is not None:
            busy[unit] = (issue + latency, i)
        if ins.key == "RW":
            tiles.append((issue + latency + FIFO_CYCLES, i))
        elif foot is not None:
            r, w = foot
            stream = ins.operands.get("length", 0)
            live.append(({x for x in r if x[0] != "fifo"}, w, issue + stream, issue + latency, i))
    return hazards


def render_hazards(hazards: list[Hazard], program: Program, name: str,
                   color: bool = False) -> str:
    """Compiler-style text for each hazard, then a summary line."""
    blocks = []
    for h in hazards:
        why = h.why.format(what=_describe(program, h.waits_for), ready=h.ready)
        message = (f"on OpenTPU's hardware (no interlocks) this issues at cycle {h.issue}, "
                   f"{h.nops} cycle{'s' if h.nops > 1 else ''} too early: {why}")
        note = f"OpenTPU needs {h.nops} more NOP{'s' if h.nops > 1 else ''} before it"
        loc = program.locations[h.index]
        if loc is not None:
            blocks.append(Diagnostic(message, loc.file, loc.line, loc.col, severity="warning",
                                     notes=(note,)).render(program.sources, color))
        else:
            blocks.append(f"{name}: instruction {h.index}: warning: {message} ({note})")
    blocks.append(f"{name}: {len(hazards)} place{'s' if len(hazards) != 1 else ''} where "
                  "OpenTPU's hardware needs more NOPs" if hazards
                  else f"{name}: the NOP padding is enough for OpenTPU's hardware")
    return "\n\n".join(blocks) + "\n"


# ------------------------------------------------------------------ the transform
def strip_nops(program: Program) -> Program:
    """The same program without NOPs: code, locations and label symbols follow along.

    A label on a removed NOP moves to the next kept instruction (the one the NOP fell
    through to); a graph node's run keeps the instructions it still has.  Sources, other
    symbols and the machine shape are unchanged.
    """
    keep = [i for i, ins in enumerate(program.instructions) if ins.key != "NOP"]
    new_index, k = [], 0
    for i in range(len(program.instructions) + 1):      # old index -> next kept index
        while k < len(keep) and keep[k] < i:
            k += 1
        new_index.append(k)
    symbols = [s for s in (_reindexed(s, new_index) for s in program.symbols)
               if s.kind != "node" or s.size]      # a node of nothing but NOPs is gone
    return Program([program.instructions[i] for i in keep], program.shape,
                   [program.locations[i] for i in keep], symbols, dict(program.sources))


def _reindexed(s: Symbol, new_index: list[int]) -> Symbol:
    """A label or node-run symbol moved to the instruction indices after NOPs are removed."""
    n = len(new_index) - 1
    if s.kind == "label" and 0 <= s.value <= n:
        return Symbol(s.name, s.kind, new_index[s.value], s.size)
    if s.kind == "node" and 0 <= s.value and s.value + s.size <= n:
        start = new_index[s.value]
        return Symbol(s.name, s.kind, start, new_index[s.value + s.size] - start)
    return s

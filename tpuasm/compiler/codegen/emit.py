"""The instruction stream: readable .tasm lines, configuration registers set only when they
change, and the weight stream (Read_Weights placed as early as the FIFO allows).

Weight stream.  Every switching MatrixMultiply consumes the next tiles of one sequence
(`switch(...)` records how many).  `finish()` inserts the Read_Weights: the first
fifo_depth + 1 tiles before everything else (they are the bottleneck), then after each
switching MatrixMultiply exactly the tiles it consumed, so the stream always stays
fifo_depth + 1 tiles ahead of the multiplies -- the most the deadlock rule (spec/isa.md
5.3) allows, and what keeps Weight Memory busy while the array computes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...isa import ISA_TABLE

RESET = {name: r.reset for name, r in ISA_TABLE.registers.items()}
WEIGHTS_START = "<weights start>"


@dataclass
class TileRun:
    """Tiles [first, first + count) of a named .tile region."""
    region: str
    first: int
    count: int


@dataclass
class Emitter:
    fifo_depth: int
    items: list = field(default_factory=list)      # str lines, or ("switch", line, tiles)
    regs: dict = field(default_factory=lambda: dict(RESET))
    stream: list = field(default_factory=list)     # (region, tile offset) in consumption order
    instructions: int = 0

    # ------------------------------------------------------------------ text
    def line(self, text: str, comment: str = ""):
        self.items.append(f"        {text:<56} ; {comment}" if comment else f"        {text}")
        self.instructions += 1

    def comment(self, text: str):
        for part in text.splitlines():
            self.items.append(f"; {part}" if part else ";")

    def blank(self):
        self.items.append("")

    def start_weights(self):
        """Where the first Read_Weights go (after the declarations)."""
        self.items.append(WEIGHTS_START)

    def node(self, name: str):
        self.items.append(f'.node "{name}"')

    def cfg(self, **values):
        """Set registers, emitting a CFG only for values that change."""
        for name, value in values.items():
            value = value if isinstance(value, str) else int(value)   # str: an expression
            if self.regs[name] != value:
                self.regs[name] = value
                self.line(f"CFG {name}, {value}")

    # ------------------------------------------------------------------ weights
    def mmc(self, text: str, tiles: list[tuple[str, int]] = (), comment: str = ""):
        """A MatrixMultiply; `tiles` are the (region, offset) it switches to, in order."""
        self.instructions += 1
        body = f"        {text:<56} ; {comment}" if comment else f"        {text}"
        self.items.append(("switch", body, len(tiles)))
        self.stream.extend(tiles)

    def finish(self) -> list[str]:
        """The final lines, with the Read_Weights inserted."""
        ahead = self.fifo_depth + 1
        out: list[str] = []
        requested = 0

        def request(upto: int):
            nonlocal requested
            for run in _runs(self.stream[requested:upto]):
                rep = f", repeat={run.count}" if run.count > 1 else ""
                off = f" + {run.first}" if run.first else ""
                out.append(f"        RW      tile.{run.region}{off}{rep}")
                self.instructions += 1
            requested = max(requested, upto)

        consumed = 0
        started = False
        for item in self.items:
            if item == WEIGHTS_START or (isinstance(item, tuple) and not started):
                if not started:
                    request(min(ahead, len(self.stream)))
                    started = True
                if item == WEIGHTS_START:
                    continue
            if isinstance(item, tuple):
                _, body, count = item
                if count:
                    request(min(consumed + count, len(self.stream)))   # (never: ahead >= count)
                out.append(body)
                consumed += count
                if count:
                    request(min(consumed + ahead, len(self.stream)))
            else:
                out.append(item)
        return out


def _runs(tiles) -> list[TileRun]:
    runs: list[TileRun] = []
    for region, offset in tiles:
        last = runs[-1] if runs else None
        if last and last.region == region and last.first + last.count == offset \
                and last.count < 256:
            last.count += 1
        else:
            runs.append(TileRun(region, offset, 1))
    return runs

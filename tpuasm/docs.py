"""Generate the table-derived sections of spec/isa.md from spec/isa.toml.

`python -m tpuasm.docs` rewrites the sections between the GENERATED markers;
`python -m tpuasm.docs --check` exits 1 if they are stale (a test runs the check),
so the human spec can never drift from the machine-readable table.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from .binary import MEMORY_BOUNDS
from .isa import ISA_TABLE, WORD_BYTES, Field, InstructionSpec
from .encoding import FLAGS_LSB, FLAGS_WIDTH, OPCODE_LSB, OPCODE_WIDTH, REPEAT_LSB, REPEAT_WIDTH

SPEC = Path(__file__).resolve().parent.parent / "spec" / "isa.md"
_HEADER_FIELDS = (("opcode", OPCODE_LSB, OPCODE_WIDTH), ("flags", FLAGS_LSB, FLAGS_WIDTH),
                  ("repeat", REPEAT_LSB, REPEAT_WIDTH))


def registers_section() -> str:
    rows = ["| # | register | reset | range | meaning |", "|---|---|---|---|---|"]
    for r in sorted(ISA_TABLE.registers.values(), key=lambda r: r.index):
        rows.append(f"| {r.index} | `{r.name}` | {r.reset} | {r.min} .. {r.max} | {r.doc} |")
    return "\n".join(rows)


def _diagram(fields: list[tuple[str, int, int]]) -> list[str]:
    """A byte map, most significant byte first, one box per field (0 = reserved bits)."""
    cells, cursor = [], WORD_BYTES * 8
    for name, lsb, width in sorted(fields, key=lambda f: -f[1]):
        if lsb + width < cursor:
            cells.append(("0", cursor - 1, cursor - lsb - width))
        cells.append((name, lsb + width - 1, width))
        cursor = lsb
    numbers = "".join(f"{msb:<{w}}" for _, msb, w in cells) + "0"
    border = "".join("+" + "-" * (w - 1) for _, _, w in cells) + "+"
    boxes = "".join("|" + name.center(w - 1) for name, _, w in cells) + "|"
    return [numbers, border, boxes, border]


def _instruction_block(spec: InstructionSpec) -> str:
    names = ", ".join(f"`{n}`" for n in spec.names)
    out = [f"### {spec.key}: {spec.long_name} (opcode 0x{spec.opcode:02x})", "",
           f"{spec.summary}  Names: {names}.  Stage: {spec.stage}.  "
           f"Repeat: {'yes' if spec.repeat else 'no (field must be 0)'}.", ""]
    layouts = [("", spec.operands, spec.fields)]
    if spec.conv_fields:
        layouts.append((" (with flag C)", spec.conv_operands, spec.conv_fields))
    for label, operands, fields in layouts:
        usage = f"`{spec.key} {', '.join(operands)}`" if operands else "none"
        out.append(f"Operands{label}: {usage}")
        out.append("")
        out.append("```")
        allf = [(n, lsb, w) for n, lsb, w in _HEADER_FIELDS] + [(f.name, f.lsb, f.width) for f in fields]
        out.extend(_diagram(allf))
        out.append("```")
        out.append("")
        if not fields:
            continue
        out.append("| bits | field | kind | range |")
        out.append("|---|---|---|---|")
        for f in fields:
            out.append(f"| {f.lsb}-{f.lsb + f.width - 1} | `{f.name}` | {ISA_TABLE.kinds[f.kind]} | {_range(f)} |")
        out.append("")
    if spec.flags:
        out.append("| flag | bit | meaning |")
        out.append("|---|---|---|")
        for fl in spec.flags.values():
            out.append(f"| {fl.letter} | 0x{fl.bit:02x} | {fl.doc} |")
        out.append("")
        if spec.forbidden:
            out.append("  ".join(f"Not {', '.join(rule.letters)} together: {rule.why}."
                                 for rule in spec.forbidden))
            out.append("")
    return "\n".join(out)


def _range(f: Field) -> str:
    if f.kind in MEMORY_BOUNDS:
        limit = f" (and < {MEMORY_BOUNDS[f.kind]})"
    else:
        limit = " (a defined register)" if f.kind == "reg" else ""
    return f"{f.min} .. {f.max}{limit}"


def encodings_section() -> str:
    blocks = ["Bits are numbered from the least significant bit of byte 0; diagrams show bit "
              "numbers above the most significant bit of each field, most significant byte "
              "first.  `0` marks reserved bits.", ""]
    for spec in sorted(ISA_TABLE.instructions.values(), key=lambda s: s.opcode):
        blocks.append(_instruction_block(spec))
    return "\n".join(blocks).rstrip()


SECTIONS = {"registers": registers_section, "encodings": encodings_section}


def render(text: str) -> str:
    for name, build in SECTIONS.items():
        pattern = re.compile(rf"(<!-- BEGIN GENERATED: {name} -->\n).*?(<!-- END GENERATED: {name} -->)",
                             re.DOTALL)
        text = pattern.sub(lambda m: m.group(1) + build() + "\n" + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    from . import tmgrammar          # the editors' grammar is derived from the table too
    current = SPEC.read_text(encoding="utf-8")
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print(f"{SPEC} is out of date with spec/isa.toml: run `python -m tpuasm.docs`")
            return 1
        return tmgrammar.main(["--check"])
    SPEC.write_text(fresh, encoding="utf-8")
    print(f"updated {SPEC}")
    tmgrammar.main([])
    print(f"updated {tmgrammar.TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

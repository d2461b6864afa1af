"""Hover texts (Markdown): instructions and their flags, configuration registers,
symbols, directives and numbers.  Instruction and register texts come from the ISA table
(spec/isa.toml), so they follow it."""
from __future__ import annotations

from ..assembler.analysis import Analysis, SymbolInfo
from ..isa import ISA_TABLE, InstructionSpec
from ..literals import parse_int

DIRECTIVES = {
    "equ": (".equ NAME, expression", "A constant; expressions may refer forward."),
    "ub": (".ub NAME, rows[, base]", "Reserve Unified Buffer rows: binds `ub.NAME` (and `NAME`)."),
    "acc": (".acc NAME, rows[, base]", "Reserve accumulator rows: binds `acc.NAME`."),
    "host": (".host NAME, rows[, base]", "Reserve host memory rows: binds `host.NAME`."),
    "tile": (".tile NAME, count[, base]", "Reserve weight tiles: binds `tile.NAME`."),
    "include": ('.include "file.tasm"', "Assemble another file here (relative to this one)."),
    "config": (".config key=value, ...", "The machine shape (array_size, ub_rows, acc_rows, "
                                         "fifo_depth, profile); before the first instruction."),
    "macro": (".macro NAME p1, p2", "Define a macro; its body uses the parameters as `\\p1`."),
    "endm": (".endm", "End of a `.macro` body."),
    "rept": (".rept count[, var]", "Repeat the block `count` times; `var` counts 0..count-1."),
    "endr": (".endr", "End of a `.rept` block."),
    "node": (".node NAME", "The following instructions belong to the ONNX node NAME "
                           "(compiler output; profiles group by node)."),
}
_FIELD_WORDS = {"ub": "UB row", "acc": "accumulator row", "host": "host row", "tile": "weight tile",
                "count": "rows", "reg": "register", "imm": "signed immediate", "uimm": "immediate"}


def instruction(spec: InstructionSpec, letters: str = "") -> str:
    flags = "".join(spec.flags)
    usage = f"{spec.key}{'[.' + flags + ']' if flags else ''} {', '.join(spec.operands)}".rstrip()
    out = [f"**{spec.key}** — {spec.long_name}  ·  opcode `0x{spec.opcode:02x}`  ·  stage *{spec.stage}*",
           "", f"`{usage}`"]
    if spec.conv_operands:
        out[-1] += f"  (with C: `{spec.key}.C {', '.join(spec.conv_operands)}`)"
    out += ["", spec.summary, ""]
    fields = {f.name: f for f in spec.fields + spec.conv_fields}
    if fields:
        out.append("Operands: " + ", ".join(
            f"`{f.name}` ({_FIELD_WORDS.get(f.kind, f.kind)}, {f.width} bits"
            + (f"; also `{'=`, `'.join(f.aliases)}=`" if f.aliases else "") + ")"
            for f in fields.values()))
        for dst, src in spec.same_or_disjoint:
            out.append(f"`{dst}` is the rows of `{src}` (in place) or does not overlap them.")
        out.append("")
    if spec.flags:
        out.append("Flags:")
        for f in spec.flags.values():
            mark = "**" if f.letter in letters.upper() else ""
            out.append(f"- {mark}`{f.letter}` {f.name}{mark}: {f.doc}")
        for group in spec.exclusive:
            out.append(f"- at most one of {', '.join(group)}")
        for rule in spec.forbidden:
            out.append(f"- not {', '.join(rule.letters)} together: {rule.why}")
        out.append("")
    out.append(f"Timing: {spec.timing}" if spec.timing else "")
    out.append(f"Repeat: {'`repeat=` 1..256' if spec.repeat else 'no'}.  "
               f"Names: {', '.join(spec.names)}.")
    return "\n".join(out).strip()


def register(name: str) -> str | None:
    r = ISA_TABLE.registers.get(name)
    if r is None:
        return None
    return (f"**{r.name}** — configuration register {r.index}\n\n{r.doc}\n\n"
            f"Range {r.min} .. {r.max}, reset {r.reset}.  Set with `CFG {r.name}, value`.")


def number(text: str) -> str | None:
    value = parse_int(text)
    if value is None:
        return None
    parts = [f"{value}", f"0x{value:x}" if value >= 0 else f"-0x{-value:x}",
             f"0b{value:b}" if value >= 0 else f"-0b{-value:b}"]
    return f"`{text}` = " + " = ".join(f"`{p}`" for p in parts)


def symbol(info: SymbolInfo, analysis: Analysis) -> str:
    where = f"{info.span.file}:{info.span.line}" if info.span else ""
    if info.kind == "equ":
        value = "no value (see the errors)" if info.value is None else _value(info.value)
        return f"**{info.name}** — constant\n\n`.equ {info.name}, {info.expression or '…'}`\n\n= {value}\n\n{where}"
    if info.kind == "label":
        return f"**{info.name}:** — label of instruction {info.value}\n\n{where}"
    if info.kind == "macro":
        sig = f".macro {info.name} {', '.join(info.params)}".rstrip()
        return f"**{info.name}** — macro\n\n`{sig}`\n\n{where}"
    if info.kind == "file":
        return f"**{info.name}** — included file"
    memory = {"ub": "Unified Buffer", "acc": "accumulators", "host": "host memory",
              "tile": "weight tiles"}[info.kind]
    unit = "tiles" if info.kind == "tile" else "rows"
    if info.value is None or info.size is None:
        placed = "not placed (see the errors)"
    else:
        placed = f"base {_value(info.value)}, {info.size} {unit} ({info.value} .. {info.value + info.size - 1})"
    return f"**{info.kind}.{info.name}** — region of {memory}\n\n{placed}\n\n{where}"


def directive(name: str) -> str | None:
    entry = DIRECTIVES.get(name.lower())
    if entry is None:
        return None
    return f"`{entry[0]}`\n\n{entry[1]}"


def _value(v: int) -> str:
    return f"{v} (0x{v:x})" if v >= 0 else str(v)

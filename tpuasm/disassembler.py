"""Instructions and programs back to .tasm text.

Driven by the ISA table like the encoder: operand order, flag letters and
register names all come from spec/isa.toml.  `disassemble(p)` re-assembles to
the same code and machine shape (a property test checks it).
"""
from __future__ import annotations

from .binary import CONFIG_KEYS, MachineShape, Program
from .encoding import Instruction
from .isa import ISA_TABLE


def format_instruction(ins: Instruction) -> str:
    """Canonical one-line text: `MMC.SO 0, 0, 10`, `CFG act_shift, 8`, `RW 3, repeat=9`."""
    spec = ISA_TABLE.instructions[ins.key]
    head = spec.key
    letters = spec.flag_letters(ins.flags)
    if letters:
        head += "." + letters
    names, _fields = spec.layout(ins.flags)
    parts = [_operand_text(spec.key, name, ins.operands.get(name)) for name in names]
    if ins.repeat > 1:
        parts.append(f"repeat={ins.repeat}")
    return f"{head} {', '.join(parts)}" if parts else head


def _operand_text(key: str, name: str, value: int | None) -> str:
    if value is None:
        return "?"
    if key == "CFG" and name == "reg":
        reg = ISA_TABLE.register_by_index.get(value)
        return reg.name if reg is not None else str(value)
    return str(value)


def _config_line(shape: MachineShape) -> str | None:
    """`.config ...` naming every setting that differs from the default machine."""
    default = MachineShape()
    parts = [f"{key}={getattr(shape, key)}"
             for key in CONFIG_KEYS
             if getattr(shape, key) != getattr(default, key)]
    return ".config " + ", ".join(parts) if parts else None


def disassemble(program: Program, annotate: bool = False) -> str:
    """.tasm text for `program`; with `annotate`, each line carries its source line as a comment."""
    lines = []
    config = _config_line(program.shape)
    if config:
        lines.append(config)
    texts = [format_instruction(ins) for ins in program.instructions]
    width = max((len(t) for t in texts), default=0) + 2
    node = None
    for i, text in enumerate(texts):
        if program.node_of(i) != node:          # keep which graph node each block computes
            node = program.node_of(i)
            lines.append(f'.node "{node}"' if node is not None else ".node")
        comment = ""
        loc = program.locations[i]
        if annotate and loc is not None:
            line = program.source_line(loc)
            comment = f"; {loc}: {line}" if line else f"; {loc}"
        lines.append(f"{text:<{width}}{comment}".rstrip() if comment else text)
    return "\n".join(lines) + "\n"

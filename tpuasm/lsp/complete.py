"""Completion: what may be typed where the cursor is.

At a statement's start: mnemonics, macros and directives; after `MNEMONIC.`: the flag
letters it takes; as CFG's first operand: register names; elsewhere in operands:
constants, regions (bare and with their `ub.`/`acc.`/`host.`/`tile.` prefix) and the
`name=` operand keywords; inside `.include "`: the .tasm files next to this one.
"""
from __future__ import annotations

import os
import re

from lsprotocol import types as T

from ..assembler.symbols import MEMORIES
from ..isa import ISA_TABLE
from ..tokens import line_tokens
from .documents import Checked
from .hover import DIRECTIVES

K = T.CompletionItemKind
_WORD_BEFORE = re.compile(r"[A-Za-z_.\\][A-Za-z0-9_.]*\Z")


def items(checked: Checked | None, position: T.Position) -> T.CompletionList | None:
    if checked is None:
        return None
    line, col = checked.where(position)
    lines = checked.text_lines()
    text = lines[line - 1] if 1 <= line <= len(lines) else ""
    before = text[:col - 1]
    m = re.search(r'^\s*\.include\s+"([^"]*)\Z', before)
    if m:
        return _files(checked, line, col, m.group(1))
    word = _WORD_BEFORE.search(before)
    typed = word.group() if word else ""
    start_col = col - len(typed)
    edit_range = checked.lines.range(checked.path, line, start_col, col)
    tokens = line_tokens(before[:start_col - 1], strict=False) or []
    if any(t.kind == "comment" for t in tokens) or before.count('"') % 2:
        return None
    if len(tokens) >= 2 and tokens[0].kind == "name" and tokens[1].text == ":":
        tokens = tokens[2:]
    if not tokens:
        found = _statement_start(checked, typed)
    else:
        found = _operands(checked, tokens, typed)
    out = []
    for label, kind, detail, doc in found:
        out.append(T.CompletionItem(
            label=label, kind=kind, detail=detail,
            documentation=T.MarkupContent(kind=T.MarkupKind.Markdown, value=doc) if doc else None,
            text_edit=T.TextEdit(range=edit_range, new_text=label), filter_text=label))
    return T.CompletionList(is_incomplete=False, items=out)


def _statement_start(checked: Checked, typed: str):
    base, dot, letters = typed.partition(".")
    spec = ISA_TABLE.lookup(base) if dot else None
    if spec is not None:                          # `MMC.S|`: the flags it may take next
        used = set(letters.upper())
        return [(f"{base}.{letters}{f.letter}", K.EnumMember, f.name, f.doc)
                for f in spec.flags.values() if f.letter not in used]
    out = [(f".{d}", K.Keyword, usage, doc) for d, (usage, doc) in DIRECTIVES.items()]
    for s in ISA_TABLE.instructions.values():
        for n in s.names:
            out.append((n, K.Function, s.long_name, s.summary))
    for info in checked.analysis.symbols.values():
        if info.kind == "macro":
            out.append((info.name, K.Snippet, "macro " + ", ".join(info.params), None))
    return out


def _operands(checked: Checked, tokens, typed: str):
    head = tokens[0]
    first_operand = not any(t.text == "," for t in tokens[1:])
    if head.kind == "name" and head.text.upper() in ("CFG", "SET_CONFIGURATION") and first_operand:
        return [(r.name, K.Property, f"register {r.index}: {r.min} .. {r.max}, reset {r.reset}", r.doc)
                for r in ISA_TABLE.registers.values()]
    symbols = checked.analysis.symbols.values()
    prefix, dot, _ = typed.partition(".")
    if dot and prefix.lower() in MEMORIES:
        kind = prefix.lower()
        return [(f"{prefix}.{s.name}", K.Variable, _region(s), None)
                for s in symbols if s.kind == kind]
    out = []
    for s in symbols:
        if s.kind == "equ":
            out.append((s.name, K.Constant, f"= {s.value}" if s.value is not None else "", None))
        elif s.kind in MEMORIES:
            out.append((f"{s.kind}.{s.name}", K.Variable, _region(s), None))
            out.append((s.name, K.Variable, _region(s), None))
    out += [(f"{m}.", K.Module, "region prefix", None) for m in MEMORIES]
    spec = ISA_TABLE.lookup(head.text.partition(".")[0]) if head.kind == "name" else None
    if spec is not None:
        keys = {"repeat"} if spec.repeat else set()
        for f in spec.fields + spec.conv_fields:
            keys |= {f.name, *f.aliases}
        out += [(f"{k}=", K.Field, "operand by name", None) for k in sorted(keys)]
    return out


def _region(s) -> str:
    if s.value is None or s.size is None:
        return f"{s.kind} region"
    return f"{s.kind} rows {s.value} .. {s.value + s.size - 1}"


def _files(checked: Checked, line: int, col: int, typed: str):
    base = os.path.dirname(checked.path)
    folder = os.path.join(base, os.path.dirname(typed))
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        names = []
    start = col - len(os.path.basename(typed))
    edit_range = checked.lines.range(checked.path, line, start, col)
    out = []
    for n in names[:500]:
        full = os.path.join(folder, n)
        if os.path.isdir(full) or n.endswith((".tasm", ".a", ".inc")):
            label = n + "/" if os.path.isdir(full) else n
            out.append(T.CompletionItem(label=label, kind=K.Folder if label.endswith("/") else K.File,
                                        text_edit=T.TextEdit(range=edit_range, new_text=label)))
    return T.CompletionList(is_incomplete=False, items=out)

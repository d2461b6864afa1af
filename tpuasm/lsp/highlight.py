"""Semantic tokens: highlighting for editors without the TextMate grammar, and a finer
one for those with it (a name is coloured by what the assembler resolved it to)."""
from __future__ import annotations

from lsprotocol import types as T

from ..assembler.symbols import MEMORIES
from ..isa import ISA_TABLE
from ..tokens import line_tokens
from .documents import LINE_LIMIT, Checked

TYPES = ["keyword", "function", "macro", "enumMember", "variable", "parameter", "property",
         "namespace", "number", "string", "comment", "operator"]
MODIFIERS = ["declaration", "readonly"]
LEGEND = T.SemanticTokensLegend(token_types=TYPES, token_modifiers=MODIFIERS)
_T = {t: i for i, t in enumerate(TYPES)}
_DECLARATION, _READONLY = 1, 2
_SIMPLE = {"comment": "comment", "string": "string", "int": "number", "op": "operator",
           "param": "parameter", "directive": "keyword"}


def semantic_tokens(checked: Checked | None) -> T.SemanticTokens | None:
    if checked is None:
        return None
    a = checked.analysis
    codec = checked.lines.codec
    data: list[int] = []
    last_line = last_start = 0
    for row, text in enumerate(checked.text_lines()):
        if len(text) > LINE_LIMIT:
            continue
        ascii_line = text.isascii()
        pieces = []
        tokens = line_tokens(text, strict=False)
        head = 2 if len(tokens) >= 2 and tokens[0].kind == "name" and tokens[1].text == ":" else 0
        for i, tok in enumerate(tokens):
            if tok.kind in _SIMPLE:
                pieces.append((tok.start, len(tok.text), _T[_SIMPLE[tok.kind]], 0))
            elif tok.kind == "name":
                pieces += _name(a, checked.path, row + 1, tok, i, head, tokens)
        for start, length, kind, mods in pieces:
            if not ascii_line:
                start, length = (codec.client_num_units(text[:start]),
                                 codec.client_num_units(text[start:start + length]))
            data += [row - last_line, start - last_start if row == last_line else start,
                     length, kind, mods]
            last_line, last_start = row, start
    return T.SemanticTokens(data=data)


def _name(a, path, line, tok, i, head, tokens):
    text, start = tok.text, tok.start
    if i == 0 and head == 2:
        return [(start, len(text), _T["function"], _DECLARATION)]       # a label
    occ = a.at(path, line, start + len(text))         # on its last character
    if occ is not None and occ.span.end_col == start + len(text) + 1:
        kind = occ.key.partition(":")[0]
        mods = _DECLARATION if occ.definition else 0
        if kind == "macro":
            return [(start, len(text), _T["macro"], mods)]
        if kind == "equ":
            return [(start, len(text), _T["variable"], mods | _READONLY)]
        if kind == "label":
            return [(start, len(text), _T["function"], mods)]
        if kind in MEMORIES and occ.definition:
            return [(start, len(text), _T["variable"], mods)]
    prefix, dot, rest = text.partition(".")
    if i == head:
        spec = ISA_TABLE.lookup(prefix)
        if spec is None:
            return [(start, len(text), _T["macro"], 0)]
        out = [(start, len(prefix), _T["keyword"], 0)]
        if dot:
            out.append((start + len(prefix) + 1, len(rest), _T["enumMember"], 0))
        return out
    if dot and prefix.lower() in MEMORIES:
        return [(start, len(prefix), _T["namespace"], 0),
                (start + len(prefix) + 1, len(rest), _T["variable"], 0)]
    if text in ISA_TABLE.registers or (i + 1 < len(tokens) and tokens[i + 1].text == "="):
        return [(start, len(text), _T["property"], 0)]
    return [(start, len(text), _T["variable"], 0)]

"""A Pygments lexer for .tasm, built from the ISA table.

Mnemonics, flag letters and configuration register names come from
`tpuasm.isa.ISA_TABLE`, so a new instruction is highlighted without touching this
file.  Registered under the `pygments.lexers` entry point, so `pygmentize -l tasm`
and rich's Syntax use it too.
"""
from __future__ import annotations

import re

from pygments.lexer import RegexLexer, bygroups, words
from pygments.token import (Comment, Keyword, Name, Number, Operator, Punctuation, String,
                            Text, Whitespace)

from tpuasm.assembler.expand import DIRECTIVES
from tpuasm.isa import ISA_TABLE

MNEMONICS = sorted({n for s in ISA_TABLE.instructions.values() for n in s.names},
                   key=len, reverse=True)
FLAG_LETTERS = "".join(sorted({f for s in ISA_TABLE.instructions.values() for f in s.flags}))
REGISTERS = sorted(ISA_TABLE.registers, key=len, reverse=True)
OPERAND_NAMES = sorted({n for s in ISA_TABLE.instructions.values()
                        for f in s.fields + s.conv_fields for n in (f.name, *f.aliases)}
                       | {"repeat", "src", "dst", "len"}, key=len, reverse=True)



class TasmLexer(RegexLexer):
    """TPU v1 assembly (.tasm) as written for tpuasm and OpenTPU."""
    name = "TPU assembly"
    # "tasm" is taken by Pygments' built-in Turbo Assembler lexer, which also claims
    # *.tasm; a priority above its 0 makes *.tasm files come here.
    aliases = ["tpuasm", "tpu-asm"]
    filenames = ["*.tasm"]
    mimetypes = ["text/x-tasm"]
    priority = 1
    flags = re.IGNORECASE | re.MULTILINE

    def analyse_text(text):
        """Recognise tpuasm source by its directives and TPU mnemonics."""
        score = 0.0
        if re.search(r"^\s*\.(config|ub|acc|tile)\b", text, re.M):
            score += 0.5
        if re.search(r"^\s*(MMC|RHM|WHM|ACT|RW)(\.[A-Z]+)?\s", text, re.M | re.I):
            score += 0.4
        return score

    tokens = {
        "root": [
            (r"[ \t]+", Whitespace),
            (r"\n", Text),
            (r"[;#].*$", Comment.Single),
            (r'"[^"\n]*"', String),
            (words(tuple("." + d for d in DIRECTIVES), suffix=r"\b"), Keyword.Pseudo),
            (r"[A-Za-z_][A-Za-z0-9_]*:", Name.Label),
            (r"(" + "|".join(re.escape(m) for m in MNEMONICS) + r")(\.[" + FLAG_LETTERS + r"]+)?\b",
             bygroups(Keyword, Keyword.Type)),
            (words(tuple(OPERAND_NAMES), suffix=r"(?=\s*=)"), Name.Attribute),
            (words(tuple(REGISTERS), suffix=r"\b"), Name.Builtin),
            (r"\b(ub|acc|host|tile)(\.)([A-Za-z_][A-Za-z0-9_]*)",
             bygroups(Name.Builtin.Pseudo, Punctuation, Name.Variable)),
            (r"\\[A-Za-z_][A-Za-z0-9_]*", Name.Variable.Magic),
            (r"0x[0-9a-f_]+|0b[01_]+|0o[0-7_]+|[0-9][0-9_]*", Number),
            (r"[A-Za-z_][A-Za-z0-9_]*", Name),
            (r"<<|>>|[-+*/%&|^~=()]", Operator),
            (r",", Punctuation),
            (r".", Text),
        ],
    }

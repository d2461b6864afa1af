"""The tokens of one line of .tasm, as the grammar's terminals cut it (tpuasm/grammar.lark).

For tools that work on text and must keep every character: the formatter re-spaces tokens,
the language server colours them and finds the word under the cursor.  The assembler itself
parses with lark (assembler/parser.py); a test checks this lexer cuts the library's lines
into the same names and numbers.
"""
from __future__ import annotations

import re
from typing import NamedTuple

# Longest first where terminals overlap, as lark's lexer chooses.
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\f\r]+)
  | (?P<comment>[;\#].*)
  | (?P<string>"[^"\n]*")
  | (?P<param>\\[A-Za-z_][A-Za-z0-9_]*)
  | (?P<directive>\.[A-Za-z_][A-Za-z0-9_]*)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)
  | (?P<int>[0-9][A-Za-z0-9_]*)
  | (?P<op><<|>>|[-+*/%|^&~])
  | (?P<punct>[,:=()])
""", re.VERBOSE)

WORDS = ("string", "param", "name", "int")


class Token(NamedTuple):
    kind: str       # comment string param directive name int op punct (or "error")
    text: str
    start: int      # 0-based offset in the line


def line_tokens(line: str, strict: bool = True) -> list[Token] | None:
    """The tokens of `line` (a comment is the last one, without trailing blanks).  A
    character no terminal matches makes the result None, or with `strict=False` an
    "error" token of that one character."""
    out: list[Token] = []
    pos, n = 0, len(line)
    while pos < n:
        m = _TOKEN.match(line, pos)
        if m is None:
            if strict:
                return None
            out.append(Token("error", line[pos], pos))
            pos += 1
            continue
        kind = m.lastgroup
        if kind == "comment":
            out.append(Token(kind, m.group().rstrip(), pos))
            break
        if kind != "ws":
            out.append(Token(kind, m.group(), pos))
        pos = m.end()
    return out

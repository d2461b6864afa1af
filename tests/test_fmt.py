"""`tpuasm fmt`: the layout is canonical and idempotent, keeps every comment, and never
changes what the source assembles to (the library, random programs, random spacing)."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuasm.assembler import assemble
from tpuasm.disassembler import disassemble
from tpuasm.errors import AssemblyError
from tpuasm.fmt import format_source, main

from program_strategies import programs

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = sorted(glob.glob(str(ROOT / "programs/**/*.tasm"), recursive=True)
                 + glob.glob(str(ROOT / "programs/**/*.a"), recursive=True))


def assembled(text: str, filename: str):
    """What a source means: the code, machine shape and symbol values, or its error texts
    (positions left out: the formatter moves columns, never meanings)."""
    try:
        p = assemble(text, filename)
    except AssemblyError as e:
        # positions quoted inside a message move with the layout: leave them out
        return ("error", sorted(re.sub(r":\d+(:\d+)?\b", ":_", d.message) for d in e.diagnostics))
    return (p.stripped().to_bytes(), sorted((s.name, s.kind, s.value, s.size) for s in p.symbols))


def comments(text: str) -> list[str]:
    """Every comment's text, in order (a `;` or `#` outside a string to the line's end)."""
    out = []
    for line in text.split("\n"):
        m = re.match(r'(?:[^;#"]|"[^"\n]*")*([;#].*)', line)
        if m:
            out.append(m.group(1).rstrip())
    return out


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: os.path.relpath(p, ROOT))
def test_the_library_assembles_to_the_same_bytes_after_formatting(path):
    text = Path(path).read_text(encoding="utf-8")
    out = format_source(text)
    assert assembled(out, path) == assembled(text, path)
    assert format_source(out) == out
    assert comments(out) == comments(text)


def test_the_canonical_layout():
    src = ("  ; header\n\n\n.equ N,4;n\nstart:   RHM   host.x,ub.x ,N*2 ; load\n"
           ".macro  TWICE a\n MMC.SO \\a ,acc.s,  -N+(1) ,repeat = 2\n.endm\n"
           ".rept 2,t\nRW tile.w+t\n.endr\n  # hash comment\nHLT\n\n\n")
    out = format_source(src)
    assert out == (
        "        ; header\n"
        "\n"
        ".equ   N, 4                          ;n\n"        # the paragraph's comment column
        "start:  RHM     host.x, ub.x, N * 2  ; load\n"
        ".macro TWICE a\n"
        "            MMC.SO  \\a, acc.s, -N + (1), repeat=2\n"
        ".endm\n"
        ".rept  2, t\n"
        "            RW      tile.w + t\n"
        ".endr\n"
        "        # hash comment\n"
        "        HLT\n")


def test_a_line_with_a_syntax_error_is_kept_as_written():
    # exactly, trailing blanks too: "unexpected end of line" points past them
    src = "        RHM   0,,1   \n.equ X  ,  2\n        MMC   0, 0,  \n"
    out = format_source(src)
    assert out.split("\n")[0] == "        RHM   0,,1   "
    assert out.split("\n")[1] == ".equ   X, 2"
    assert out.split("\n")[2] == "        MMC   0, 0,  "


def test_errors_keep_their_lines_and_columns(tmp_path):
    # blank lines are not folded in a file with errors (that would move the errors'
    # lines), and a semantic error's line is kept with a syntax error elsewhere
    src = "\n\n.equ A, 1\n\n\n\nact_shift\n   FROB ((\n\n\n"
    path = tmp_path / "bad.tasm"
    path.write_text(src)

    def positions():
        try:
            assemble(path.read_text(), str(path))
        except AssemblyError as e:
            return sorted((d.line, d.col, d.message) for d in e.diagnostics)
    before = positions()
    assert len(before) == 2
    assert main([str(path)]) == 0
    assert positions() == before
    assert path.read_text().split("\n")[2] == ".equ   A, 1"          # the rest is formatted
    assert main([str(path), "--check"]) == 0


def test_strings_with_comment_characters_and_crlf():
    src = '.include   "a;b#c.tasm"   ; real comment\r\nHLT\r\n'
    assert format_source(src) == '.include "a;b#c.tasm"           ; real comment\n        HLT\n'


def test_generated_code_with_graph_nodes_keeps_its_meaning():
    # compiler output: `.node` sections, long runs of plain instructions
    src = ('.config array_size=8\n.ub a, 8\n.acc s, 8\n.host x, 8\n.tile w, 1\n'
           + "".join(f'.node "layer{k}"\nRHM host.x,ub.a,8\nRW tile.w\nMMC.SO ub.a,acc.s,8\n'
                     f'ACT.R acc.s,ub.a,8\nWHM ub.a,host.x,8\n' for k in range(3)) + ".node\nHLT\n")
    out = format_source(src)
    assert '.node  "layer1"\n        RHM     host.x, ub.a, 8\n' in out
    assert assembled(out, "g.tasm") == assembled(src, "g.tasm")
    assert assemble(out, "g.tasm").nodes() == assemble(src, "g.tasm").nodes()


def test_empty_and_blank_sources():
    assert format_source("") == ""
    assert format_source("\n \n\t\n") == ""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_size=20))
def test_random_programs_keep_their_code(case):
    program = case[0]
    text = disassemble(program)
    out = format_source(text)
    assert assembled(out, "r.tasm") == assembled(text, "r.tasm")
    assert format_source(out) == out


# Random spacing of library lines: the tokens stay, the blanks between them are drawn.
_TOKEN = re.compile(r'"[^"\n]*"|\\?[A-Za-z_.][A-Za-z0-9_.]*|[0-9][A-Za-z0-9_]*|<<|>>|[;#].*|\S')
# The library has few macros, .rept blocks, labels or graph nodes: mix such lines in.
_EXTRA = """\
.equ K, (4 + 2) * -3 % 5 ; signed arithmetic
.macro STEP src, dst
    MMC.SO \\src, acc.a, K + 1, repeat=2
    ACT.R acc.a, \\dst, K+1
.endm
.node "conv1"
.node relu_2
loop: STEP ub.b, ub.b + 1
.rept 3, t
    RW tile.w + t ; tap t
.endr
    RHM host=0, ub=ub.b, length=~-2 # hash comment
.node
    HLT
""".split("\n")
_LINES = [line for path in LIBRARY for line in Path(path).read_text().split("\n")] + _EXTRA * 40


@st.composite
def respaced_sources(draw):
    start = draw(st.integers(0, max(0, len(_LINES) - 40)))
    out = []
    for line in _LINES[start:start + draw(st.integers(1, 40))]:
        pieces = _TOKEN.findall(line)
        text = draw(st.sampled_from(["", " ", "\t", "    "]))
        for a, b in zip(pieces, pieces[1:] + [""]):
            text += a
            if not b:
                break
            word = re.compile(r"[\w.\\\"]")
            need = bool(word.match(a[-1]) and word.match(b[0]))
            text += draw(st.sampled_from([" ", "  ", "\t"] if need else ["", " ", "\t "]))
        out.append(text + draw(st.sampled_from(["", " ", "\t"])))
        out += [""] * draw(st.integers(0, 2))
    return "\n".join(out)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(respaced_sources())
def test_respaced_library_text_keeps_its_meaning(text):
    out = format_source(text)
    assert assembled(out, str(ROOT / "programs/x.tasm")) == assembled(text, str(ROOT / "programs/x.tasm"))
    assert format_source(out) == out
    assert comments(out) == comments(text)


# ------------------------------------------------------------------ the command
def run(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "tpuasm", "fmt", *args], capture_output=True,
                          text=True, input=stdin, cwd=ROOT)


def test_fmt_rewrites_in_place_and_check_and_diff_report(tmp_path):
    f = tmp_path / "p.tasm"
    f.write_text("RHM 0,0,1\nHLT\n")
    os.chmod(f, 0o640)
    assert main(["--check", str(f)]) == 1
    assert f.read_text() == "RHM 0,0,1\nHLT\n"
    r = run("--diff", str(f))
    assert r.returncode == 1
    assert "-RHM 0,0,1" in r.stdout and "+        RHM     0, 0, 1" in r.stdout
    assert main([str(f)]) == 0
    assert f.read_text() == "        RHM     0, 0, 1\n        HLT\n"
    assert os.stat(f).st_mode & 0o777 == 0o640
    assert main(["--check", str(f)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["p.tasm"]     # no temporary left


def test_fmt_stdin_and_bad_files(tmp_path):
    r = run("-", stdin="HLT\n")
    assert r.returncode == 0 and r.stdout == "        HLT\n"
    bad = tmp_path / "bad.tasm"
    bad.write_bytes(b"HLT \xff\n")
    r = run(str(bad), str(tmp_path / "missing.tasm"))
    assert r.returncode == 2
    assert "bad.tasm: not valid UTF-8" in r.stderr and "missing.tasm: cannot read" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_token_lexer_cuts_names_and_numbers_as_the_parser_does():
    from tpuasm.assembler.ast import Binary, Directive, Name, Named, Num, Unary
    from tpuasm.assembler.parser import parse
    from tpuasm.tokens import line_tokens

    def leaves(node):
        if isinstance(node, (Name, Num)):
            yield node
        elif isinstance(node, Binary):
            yield from leaves(node.left)
            yield from leaves(node.right)
        elif isinstance(node, Unary):
            yield from leaves(node.operand)
        elif isinstance(node, Named):
            yield from leaves(node.value)

    checked = 0
    for path in LIBRARY:
        text = Path(path).read_text(encoding="utf-8")
        lines = text.split("\n")
        statements, _ = parse(text, path)
        for st in statements:
            tokens = {(t.start + 1, t.text) for t in line_tokens(lines[st.span.line - 1]) or ()}
            head = lines[st.span.line - 1][st.span.col - 1:st.span.end_col - 1]
            assert (st.span.col, head) in tokens
            for arg in st.args if not isinstance(st, Directive) or st.name != "include" else ():
                for leaf in leaves(arg):
                    sp = leaf.span
                    assert (sp.col, lines[sp.line - 1][sp.col - 1:sp.end_col - 1]) in tokens
                    checked += 1
    assert checked > 500


@pytest.mark.parametrize("ending", ["\r\n", "\r", "\n"])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_fmt_keeps_the_files_line_endings_and_bom(tmp_path, ending, bom):
    messy = ".equ  X,2\n  RHM   0,0,X   ; in\nHLT\n"
    path = tmp_path / "p.tasm"
    path.write_bytes(bom + messy.replace("\n", ending).encode())
    assert main([str(path)]) == 0
    want = bom + format_source(messy).replace("\n", ending).encode()
    assert path.read_bytes() == want
    from tpuasm.assembler import decode_source     # as `tpuasm asm` reads the file
    assert assembled(decode_source(path.read_bytes(), "p.tasm"), "p.tasm") == \
        assembled(messy, "p.tasm")
    assert main([str(path), "--check"]) == 0              # formatted: nothing to change
    before = path.stat().st_mtime_ns
    assert main([str(path)]) == 0 and path.stat().st_mtime_ns == before


def test_fmt_diff_of_a_crlf_file_shows_only_layout(tmp_path, capsys):
    path = tmp_path / "p.tasm"
    path.write_bytes(b".equ  X,2\r\n        HLT\r\n")
    assert main([str(path), "--diff"]) == 1
    out = capsys.readouterr().out
    assert "-.equ  X,2\n+.equ   X, 2\n" in out            # the one line whose layout changes
    assert "-        HLT" not in out and "\r" not in out


def test_a_file_mixing_line_endings_gets_its_first_one(tmp_path):
    path = tmp_path / "p.tasm"
    path.write_bytes(b"HLT\r\nHLT\nHLT\r")
    assert main([str(path)]) == 0
    assert path.read_bytes() == b"        HLT\r\n        HLT\r\n        HLT\r\n"

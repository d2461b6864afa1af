"""`tpuasm lsp` on files with errors and on files that include each other, over a real
connection (tests/lsp_client.py).  Oracles: the assembler on a corrected copy of the
file (the instruction indices the hints must show), and positions worked out by hand
(0-based, as LSP counts)."""
from __future__ import annotations

import pytest
from pygls.uris import from_fs_path

from lsp_client import LspClient, at, doc
from tpuasm.assembler import assemble

# Lines 4, 5, 7 and 8 (1-based) have errors; the others assemble.
BROKEN = """\
.host x, 4
.ub   y, 4
.acc  s, 4
    RW  nosuch
.equ Z, (
    RHM host.x, y, 4
    BOGUS 1
    ACT s, y, 4, 99999
    MMC.SO y, s, 4 ; comment
    HLT
"""
# The same program with its errors corrected (an instruction for an instruction).
FIXED = BROKEN.replace("RW  nosuch", "RW  0").replace(".equ Z, (", "; no .equ") \
    .replace("BOGUS 1", "NOP").replace("ACT s, y, 4, 99999", "ACT s, y, 4")
ERROR_LINES = {3, 4, 6, 7}          # 0-based

LIB = """\
.equ N, 4
.macro LOAD dst
    RHM host.x, \\dst, N
    NOP
.endm
"""
MAIN = """\
.include "lib.tasm"
.host x, N
.ub   y, N * 2
    LOAD ub.y
    RHM host.x, y, N
    HLT
"""
OTHER = """\
.include "lib.tasm"
.host x, 8
.ub   z, N
    RHM x, z, N
"""


def hints(client, uri, lines=40):
    got = client.request("textDocument/inlayHint", {"textDocument": {"uri": uri},
                                                    "range": {"start": at(0, 0), "end": at(lines, 0)}})
    return [(h["position"]["line"], h["position"]["character"], h["label"]) for h in got]


def places(refs, names):
    return sorted((names[r["uri"]], r["range"]["start"]["line"], r["range"]["start"]["character"])
                  for r in refs)


@pytest.fixture
def client(request):
    c = LspClient("--debounce", getattr(request, "param", "0.05"))
    c.initialize()
    yield c
    assert c.close() == 0


def test_lines_that_assembled_keep_their_hints_when_others_have_errors(client, tmp_path):
    program = assemble(FIXED, "p.tasm")
    want = []
    lines = FIXED.split("\n")
    for i, loc in enumerate(program.locations):
        if loc.line - 1 not in ERROR_LINES:
            code = lines[loc.line - 1].split(";")[0].rstrip()
            want.append((loc.line - 1, len(code), f"#{i}"))
    assert [w[2] for w in want] == ["#1", "#4", "#5"]       # RW, NOP and ACT are #0, #2, #3
    uri = from_fs_path(str(tmp_path / "p.tasm"))
    client.open(uri, BROKEN)
    errors = {d["range"]["start"]["line"] for d in client.diagnostics(uri)
              if d["severity"] == 1}
    assert errors == ERROR_LINES
    assert hints(client, uri) == want
    client.change(uri, 2, FIXED)                                  # fixed: every line
    client.diagnostics(uri)
    assert [h[2] for h in hints(client, uri)] == [f"#{i}" for i in range(len(program))]


def test_a_line_beyond_the_checked_length_turns_hints_off(client, tmp_path):
    uri = from_fs_path(str(tmp_path / "long.tasm"))
    client.open(uri, BROKEN + "; " + "x" * 100_001 + "\n")       # LINE_LIMIT: indices unknown
    client.diagnostics(uri)
    assert hints(client, uri) == []


@pytest.fixture
def workspace(client, tmp_path):
    for name, text in (("lib.tasm", LIB), ("main.tasm", MAIN), ("other.tasm", OTHER)):
        (tmp_path / name).write_text(text)
    uris = {name: from_fs_path(str(tmp_path / f"{name}.tasm")) for name in ("lib", "main", "other")}
    client.open(uris["lib"], LIB)
    client.diagnostics(uris["lib"])
    client.open(uris["main"], MAIN)
    client.diagnostics(uris["main"])
    client.uris = uris
    client.names = {u: n for n, u in uris.items()}
    return client


def refs(client, name, line, character, declaration=True):
    return places(client.request("textDocument/references", {
        **doc(client.uris[name], line, character),
        "context": {"includeDeclaration": declaration}}), client.names)


def test_references_in_an_included_file_include_its_open_includers(workspace):
    c = workspace
    # N, defined in lib: lib's own two, and main's three uses
    want = [("lib", 0, 5), ("lib", 2, 22), ("main", 1, 9), ("main", 2, 9), ("main", 4, 19)]
    assert refs(c, "lib", 0, 5) == want
    assert refs(c, "lib", 2, 22) == want
    assert refs(c, "main", 4, 19) == want                  # from the includer: the same
    assert refs(c, "lib", 0, 5, declaration=False) == [w for w in want if w != ("lib", 0, 5)]
    # host.x: used in lib, defined in main only (lib alone does not know it)
    assert refs(c, "lib", 2, 13) == [("lib", 2, 13), ("main", 1, 6), ("main", 4, 13)]
    # a second includer that uses N too
    c.open(c.uris["other"], OTHER)
    c.diagnostics(c.uris["other"])
    assert refs(c, "lib", 0, 5) == sorted(want + [("other", 2, 9), ("other", 3, 14)])
    # closed includers are no longer asked
    for name in ("main", "other"):
        c.notify("textDocument/didClose", {"textDocument": {"uri": c.uris[name]}})
        c.diagnostics(c.uris[name])
    assert refs(c, "lib", 0, 5) == [("lib", 0, 5), ("lib", 2, 22)]
    assert c.request("textDocument/references", {
        **doc(c.uris["lib"], 2, 13), "context": {"includeDeclaration": True}}) is None


@pytest.mark.parametrize("client", ["60"], indirect=True)    # not re-published in the test
def test_references_follow_an_unpublished_edit_of_the_included_file(workspace):
    c = workspace
    # a line added on top: main's last check saw N one line higher
    c.change(c.uris["lib"], 2, "; first\n" + LIB)
    assert refs(c, "lib", 1, 5) == [("lib", 1, 5), ("lib", 3, 22),
                                    ("main", 1, 9), ("main", 2, 9), ("main", 4, 19)]


def test_no_partial_hints_when_errors_were_only_counted():
    from tpuasm.assembler.analysis import analyze
    from tpuasm.assembler.reporter import KEEP
    few = analyze("RW nosuch\nHLT\n", "p.tasm")
    assert few.instruction_lines() == {("p.tasm", 2): [1]}
    # past KEEP the reporter counts errors without their lines: which line assembled is
    # unknown, so no line gets a hint (not a wrong one)
    many = analyze("\n".join(f"RW nosuch{i}" for i in range(KEEP + 5)) + "\nHLT\n", "p.tasm")
    assert len(many.diagnostics) == KEEP and many.instruction_lines() == {}

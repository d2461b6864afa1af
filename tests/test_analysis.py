"""tpuasm.assembler.analysis: the assembler's diagnostics plus where every symbol is
defined and used (what the language server navigates with)."""
from __future__ import annotations

from tpuasm.assembler import assemble
from tpuasm.assembler.analysis import analyze
from tpuasm.errors import AssemblyError

SRC = """\
.equ N, 4
.equ TWO_N, N * 2
.ub x, TWO_N
.acc s, N
.host x, N
.tile w, 2
.macro LOAD dst
    RHM host.x, \\dst, N
.endm
start:
    LOAD ub.x
.rept 2, N
    RW tile.w + N
.endr
    MMC.S ub.x, s, N
    HLT
"""


def spans(a, key):
    return [(o.span.line, o.span.col, o.span.end_col, o.definition) for o in a.references(key)]


def test_definitions_and_uses_with_their_columns():
    a = analyze(SRC, "p.tasm")
    assert a.program is not None and a.diagnostics == []
    # .rept's variable N shadows the constant inside the block (line 13)
    assert spans(a, "equ:N") == [(1, 6, 7, True), (2, 13, 14, False), (4, 9, 10, False),
                                 (5, 10, 11, False), (8, 23, 24, False), (15, 20, 21, False)]
    assert spans(a, "equ:TWO_N") == [(2, 6, 11, True), (3, 8, 13, False)]
    # `ub.x` names the name part only
    assert spans(a, "ub:x") == [(3, 5, 6, True), (11, 13, 14, False), (15, 14, 15, False)]
    assert spans(a, "host:x") == [(5, 7, 8, True), (8, 14, 15, False)]
    assert spans(a, "acc:s") == [(4, 6, 7, True), (15, 17, 18, False)]
    assert spans(a, "macro:LOAD") == [(7, 8, 12, True), (11, 5, 9, False)]
    assert spans(a, "label:start") == [(10, 1, 6, True)]
    assert a.at("p.tasm", 15, 21).key == "equ:N"        # just after the name
    assert a.at("p.tasm", 15, 5) is None                # on the mnemonic


def test_symbol_values_match_the_assembled_program():
    a = analyze(SRC, "p.tasm")
    program = assemble(SRC, "p.tasm")
    for s in program.symbols:
        info = a.symbols[f"{'equ' if s.kind == 'const' else s.kind}:{s.name}"]
        assert info.value == s.value
        if s.kind in ("ub", "acc", "host", "tile"):
            assert info.size == s.size
    assert a.symbols["equ:TWO_N"].expression == "N * 2"
    assert a.symbols["macro:LOAD"].params == ("dst",)
    assert a.instruction_lines()[("p.tasm", 15)] == [3]        # RHM 0, RW 1-2, MMC 3


def test_diagnostics_are_the_assemblers(tmp_path):
    bad = "MMC.Z 0, 0, 1\n.equ A, B\nRHM 0,,1\n"
    try:
        assemble(bad, "b.tasm")
    except AssemblyError as e:
        expected = sorted(d.message for d in e.diagnostics)
    assert sorted(d.message for d in analyze(bad, "b.tasm").diagnostics) == expected


def test_includes_read_through_the_hook_and_lint_warnings(tmp_path):
    main = tmp_path / "main.tasm"
    lib = tmp_path / "lib.tasm"
    lib.write_text(".equ K, 1\n")               # on disk; the hook's text wins
    read = {str(lib): ".equ K, 3\n"}.__getitem__
    a = analyze('.include "lib.tasm"\nNOP\nRHM 0, 0, K\nHLT\n', str(main), read_file=read)
    assert a.symbols["equ:K"].value == 3
    assert a.symbols["equ:K"].span.file == str(lib)
    assert a.includes[0][1] == str(lib)
    assert [o.key for o in a.references(f"file:{lib}")] == [f"file:{lib}"]
    warnings = [d for d in a.diagnostics if d.severity == "warning"]
    assert len(warnings) == 1 and "NOP is unnecessary" in warnings[0].message


def test_bad_includes_are_diagnostics(tmp_path):
    me = tmp_path / "me.tasm"
    a = analyze('.include "me.tasm"\n.include "gone.tasm"\nHLT\n', str(me))
    messages = [d.message for d in a.diagnostics]
    assert any(m.startswith("include cycle") for m in messages)
    assert any("gone.tasm" in m and "cannot read" in m for m in messages)

"""Golden diagnostics, customasm style: each case is a program with one
mistake and the exact text the user sees (file:line:col, message, the source
line, the caret underline, notes).  Expectations are written inline; each
column and caret width was checked by hand against its source line.
"""
from __future__ import annotations

import textwrap

import pytest

from tpuasm.assembler import assemble
from tpuasm.errors import AssemblyError

GOLDEN = [
    ("misspelt mnemonic", "NOP\n    MMX.S 0, 0, 10\n", """
t.tasm:2:5: error: unknown instruction 'MMX'; did you mean 'MMC'?
    2 |     MMX.S 0, 0, 10
      |     ^^^
"""),
    ("unknown flag", "MMC.SX 0, 0, 10\n", """
t.tasm:1:6: error: MMC has no flag 'X'; MMC has flags S, C, O, U, W, H, D
    1 | MMC.SX 0, 0, 10
      |      ^
"""),
    ("flags on a flagless instruction", "RHM.S 0, 0, 1\n", """
t.tasm:1:5: error: RHM takes no flags
    1 | RHM.S 0, 0, 1
      |     ^
"""),
    ("mutually exclusive flags", "ACT.RQ 0, 0, 1\n", """
t.tasm:1:5: error: flags R and Q cannot be combined (ACT takes at most one of R, Q, T)
    1 | ACT.RQ 0, 0, 1
      |     ^^
"""),
    ("repeated flag", "MMC.SS 0, 0, 1\n", """
t.tasm:1:6: error: flag 'S' given twice
    1 | MMC.SS 0, 0, 1
      |      ^
"""),
    ("missing operand", "RHM 0, 1\n", """
t.tasm:1:1: error: RHM takes host, ub, length: missing length
    1 | RHM 0, 1
      | ^^^
"""),
    ("extra operand", "RW 1, 2\n", """
t.tasm:1:7: error: RW takes tile (got 2 operands)
    1 | RW 1, 2
      |       ^
"""),
    ("UB address out of range", "MMC.S 98304, 0, 1\n", """
t.tasm:1:7: error: UB address 98304 out of range 0..98303 (MMC operand 'ub')
    1 | MMC.S 98304, 0, 1
      |       ^^^^^
"""),
    ("accumulator address out of range, from an expression", ".equ BASE, 4000\nACT BASE + 96, 0, 1\n", """
t.tasm:2:5: error: accumulator address 4096 out of range 0..4095 (ACT operand 'acc')
    2 | ACT BASE + 96, 0, 1
      |     ^^^^^^^^^
"""),
    ("zero length", "WHM 0, 0, 0\n", """
t.tasm:1:11: error: length 0 out of range 1..65535 (WHM operand 'length')
    1 | WHM 0, 0, 0
      |           ^
"""),
    ("repeat on an instruction without one", "SYNC repeat=2\n", """
t.tasm:1:6: error: SYNC does not take a repeat count
    1 | SYNC repeat=2
      |      ^^^^^^^^
"""),
    ("repeat out of range", "RW 0, repeat=257\n", """
t.tasm:1:14: error: repeat 257 out of range 1..256
    1 | RW 0, repeat=257
      |              ^^^
"""),
    ("unknown named operand", "RHM host=0, ubb=1, length=2\n", """
t.tasm:1:13: error: RHM has no operand 'ubb'; did you mean 'ub'? (operands: host, ub, length)
    1 | RHM host=0, ubb=1, length=2
      |             ^^^
"""),
    ("positional after named", "RHM host=0, 1, 2\n", """
t.tasm:1:13: error: positional operand after a named one
    1 | RHM host=0, 1, 2
      |             ^
"""),
    ("misspelt register", "CFG act_shfit, 8\n", """
t.tasm:1:5: error: unknown configuration register 'act_shfit'; did you mean 'act_shift'?
    1 | CFG act_shfit, 8
      |     ^^^^^^^^^
"""),
    ("register value out of range", "CFG act_shift, 63\n", """
t.tasm:1:16: error: value 63 out of range 0..62 for register act_shift
    1 | CFG act_shift, 63
      |                ^^
"""),
    ("misspelt symbol", ".equ BATCH, 8\nRHM 0, 0, BACTH\n", """
t.tasm:2:11: error: undefined symbol 'BACTH'; did you mean 'BATCH'?
    2 | RHM 0, 0, BACTH
      |           ^^^^^
"""),
    ("duplicate symbol", ".equ N, 1\n.equ N, 2\n", """
t.tasm:2:6: error: duplicate symbol 'N'
    2 | .equ N, 2
      |      ^
      = note: first defined at t.tasm:1:6
"""),
    ("division by zero", "TAG 10 / (2 - 2)\n", """
t.tasm:1:5: error: division by zero
    1 | TAG 10 / (2 - 2)
      |     ^^^^^^^^^^^^
"""),
    ("circular .equ", ".equ A, B + 1\n.equ B, A\n", """
t.tasm:1:6: error: circular definition: A -> B -> A
    1 | .equ A, B + 1
      |      ^
"""),
    ("bad integer literal", "TAG 0b102\n", """
t.tasm:1:5: error: bad integer literal '0b102' (use decimal, 0x hex, 0b binary or 0o octal)
    1 | TAG 0b102
      |     ^^^^^
"""),
    ("misspelt directive", ".rep 3\n", """
t.tasm:1:1: error: unknown directive '.rep'; did you mean '.rept'?
    1 | .rep 3
      | ^^^^
"""),
    ("unterminated .rept", ".rept 3\nNOP\n", """
t.tasm:1:1: error: unterminated .rept (no matching .endr)
    1 | .rept 3
      | ^^^^^
"""),
    ("syntax error: missing operand between commas", "MMC 0,, 1\n", """
t.tasm:1:7: error: unexpected ',', expected an expression
    1 | MMC 0,, 1
      |       ^
"""),
    ("syntax error: unexpected character", "RW $4\n", """
t.tasm:1:4: error: unexpected character '$'
    1 | RW $4
      |    ^
"""),
    ("syntax error: dangling operator", "RW 1 +\n", """
t.tasm:1:7: error: unexpected end of line, expected an expression
    1 | RW 1 +
      |       ^
"""),
    ("error inside a macro body notes the call site", ".macro LOAD n\n    RHM 0, 0, \\n\n.endm\n    LOAD 0\n", """
t.tasm:2:15: error: length 0 out of range 1..65535 (RHM operand 'length')
    2 |     RHM 0, 0, \\n
      |               ^^
      = note: in macro 'LOAD' called at t.tasm:4:5
"""),
    ("overlapping regions", ".ub a, 8, 0\n.ub b, 8, 4\n", """
t.tasm:2:5: error: region 'ub.b' (rows 4..11) overlaps 'ub.a' (rows 0..7)
    2 | .ub b, 8, 4
      |     ^
      = note: 'ub.a' is defined at t.tasm:1:5
"""),
    (".config after an instruction", "NOP\n.config array_size=16\n", """
t.tasm:2:1: error: .config must come before the first instruction
    2 | .config array_size=16
      | ^^^^^^^
      = note: the first instruction is at t.tasm:1:1
"""),
]


def rendered(source: str) -> str:
    with pytest.raises(AssemblyError) as exc:
        assemble(source, "t.tasm")
    return exc.value.render()


@pytest.mark.parametrize("name, source, expected", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden(name, source, expected):
    assert rendered(source) == textwrap.dedent(expected).strip("\n")


def test_at_least_fifteen_distinct_mistakes():
    assert len({g[0] for g in GOLDEN}) >= 15


def test_every_error_of_a_run_is_reported_in_source_order():
    src = "FOO 1\nRHM 0, 0\nRW undefined\n.bogus\nTAG 1 / 0\nMMC.Z 0, 0, 1\n"
    with pytest.raises(AssemblyError) as exc:
        assemble(src, "t.tasm")
    text = exc.value.render()
    heads = [line for line in text.splitlines() if line.startswith("t.tasm:")]
    assert [h.split(": error")[0] for h in heads] == [
        "t.tasm:1:1", "t.tasm:2:1", "t.tasm:3:4", "t.tasm:4:1", "t.tasm:5:5", "t.tasm:6:5"]
    assert text.endswith("6 errors")


def test_error_in_each_rept_iteration_is_reported_once_with_its_iteration():
    with pytest.raises(AssemblyError) as exc:
        assemble(".rept 3, t\n  RW 4 / (t - 1) + 4\n.endr\n", "t.tasm")
    (d,) = exc.value.diagnostics
    assert d.message == "division by zero"
    assert d.notes == ("in .rept iteration t=1 (t.tasm:1)",)


def test_syntax_errors_on_several_lines_are_all_reported():
    with pytest.raises(AssemblyError) as exc:
        assemble("RW (1\nNOP\nRW 2)\n.equ X 3\nRW X\n", "t.tasm")
    assert [(d.line, d.col) for d in exc.value.diagnostics] == [(1, 6), (3, 5), (4, 8), (5, 4)]


def test_included_file_errors_name_that_file(tmp_path):
    (tmp_path / "inc.tasm").write_text("NOP\nRW bad\n")
    main = tmp_path / "main.tasm"
    main.write_text('.include "inc.tasm"\n')
    with pytest.raises(AssemblyError) as exc:
        assemble(main)
    (d,) = exc.value.diagnostics
    assert (d.file, d.line, d.col, d.message) == (str(tmp_path / "inc.tasm"), 2, 4, "undefined symbol 'bad'")
    assert d.notes == (f"included from {main}:1",)
    assert "    2 | RW bad" in exc.value.render()


def test_every_bad_config_value_is_reported_at_its_own_place():
    with pytest.raises(AssemblyError) as exc:
        assemble(".config array_size=0, ub_rows=0\nHLT\n", "t.tasm")
    assert [(d.line, d.col, d.message) for d in exc.value.diagnostics] == [
        (1, 20, "bad machine configuration: array_size 0 out of range 1..4096"),
        (1, 31, "bad machine configuration: ub_rows 0 out of range 1..16777216")]


# Messages the golden table does not show: (mistake, source, line, col, exact message).
MESSAGES = [
    (".equ of the wrong shape", ".equ X\n", 1, 1, ".equ takes a name and a value: .equ NAME, expression"),
    ("region directive of the wrong shape", ".ub a\n", 1, 1,
     ".ub takes a name, a row count and an optional base: .ub NAME, rows[, base]"),
    (".rept of the wrong shape", ".rept\nNOP\n.endr\n", 1, 1,
     ".rept takes a count and an optional variable: .rept N[, var]"),
    (".macro without a name", ".macro\nNOP\n.endm\n", 1, 1, ".macro needs a name: .macro NAME p1, p2"),
    (".config without settings", ".config\nNOP\n", 1, 1,
     ".config takes key=value settings, e.g. .config array_size=16"),
    (".config setting without a key", ".config 16\nNOP\n", 1, 9,
     "expected key=value (array_size, ub_rows, acc_rows, fifo_depth, profile)"),
    ("missing comma in a directive", ".equ X 3\n", 1, 8, "missing ',' after 'X'"),
    ("duplicate macro", ".macro M\nNOP\n.endm\n.macro M\nHLT\n.endm\n", 4, 8, "duplicate macro 'M'"),
    ("undefined region", "MMC ub.x, 0, 1\n", 1, 5, "undefined region 'ub.x'"),
    ("repeat given twice", "RW 0, repeat=2, repeat=3\n", 1, 17, "repeat given twice"),
    ("negative region base", ".ub a, 4, -1\n", 1, 11, "region base -1 is negative"),
    (".rept count out of range", ".rept 2000000\nNOP\n.endr\n", 1, 7, ".rept count 2000000 out of range 0..1000000"),
    ("string as an operand", 'RW "a"\n', 1, 4, "expected a number, not a string"),
    ("string as a constant", '.equ X, "a"\nRW X\n', 1, 9, "expected a number, not a string"),
    ("named argument to a macro", ".macro M a\nRW \\a\n.endm\nM a=1\n", 4, 3,
     "macro 'M' takes positional arguments only"),
    ("parameter named twice", ".macro M a, a\nNOP\n.endm\n", 1, 8, "macro 'M' names parameter 'a' twice"),
    ("modulo by zero", "RW 4 % 0\n", 1, 4, "modulo by zero"),
    ("expression nested too deeply", "RW " + "-" * 20000 + "1\n", 1, 4, "expression nested too deeply"),
]


@pytest.mark.parametrize("name, source, line, col, message", MESSAGES, ids=[m[0] for m in MESSAGES])
def test_message(name, source, line, col, message):
    with pytest.raises(AssemblyError) as exc:
        assemble(source, "t.tasm")
    first = exc.value.diagnostics[0]
    assert (first.line, first.col, first.message) == (line, col, message)


def test_a_constant_defined_too_deeply_is_named_at_its_definition():
    # where the chain breaks depends on Python's recursion limit: only the form is fixed
    source = "".join(f".equ A{i}, A{i + 1}\n" for i in range(3000)) + ".equ A3000, 1\nRW A0\n"
    with pytest.raises(AssemblyError) as exc:
        assemble(source, "t.tasm")
    first = exc.value.diagnostics[0]
    assert first.col == 6 and first.message == f"'A{first.line - 1}' is defined too deeply"


def test_expansion_budget_exceeded(monkeypatch):
    import tpuasm.assembler.expand as expand
    monkeypatch.setattr(expand, "MAX_STATEMENTS", 1000)     # the real 1,000,000 takes 6 s
    # counts known up front: refused before expanding (1000 x (2 + 1000 x 2) statements)
    with pytest.raises(AssemblyError) as exc:
        assemble(".rept 1000\n.rept 1000\nNOP\n.endr\n.endr\n", "t.tasm")
    first = exc.value.diagnostics[0]
    assert (first.line, first.col, first.message) == (
        1, 7, ".rept would expand to about 2,002,000 statements, more than the 1,000 an "
              "assembly may produce (counting nested .rept blocks)")
    # an inner count known only in the iteration: refused when that iteration starts
    with pytest.raises(AssemblyError) as exc:
        assemble(".rept 10, i\n.rept i * 100\nNOP\n.endr\n.endr\n", "t.tasm")
    first = exc.value.diagnostics[0]
    assert first.line == 2 and first.message.startswith(".rept would expand to about")
    # macro bodies are not counted ahead: expansion stops when the budget runs out
    with pytest.raises(AssemblyError) as exc:
        assemble(".macro m\nNOP\nNOP\n.endm\n.rept 400\nm\n.endr\n", "t.tasm")
    first = exc.value.diagnostics[0]
    assert first.message == ("expansion produces more than 1,000 statements (a .rept count or "
                             "a recursive macro out of hand?)")

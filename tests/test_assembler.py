"""Assembler features (spec/isa.md section 6), checked against instructions
written out by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from tpuasm.assembler import assemble, assemble_file, listing, symbol_map
from tpuasm.binary import MachineShape, SourceLoc, Symbol
from tpuasm.encoding import Instruction as I
from tpuasm.errors import AssemblyError


def code(text: str, **kw) -> list[I]:
    return assemble(text, **kw).instructions


def one(text: str) -> I:
    (ins,) = code(text)
    return ins


def errors(text: str, **kw) -> list[str]:
    with pytest.raises(AssemblyError) as exc:
        assemble(text, **kw)
    return [d.message for d in exc.value.diagnostics]


# ------------------------------------------------------------------ basics
def test_opentpu_program_as_is():
    src = """# OpenTPU style
RHM 0, 0, 10        # host 0 -> UB 0
RW 0
MMC.SO 0, 0, 10
ACT.R 0, 0, 10
WHM 0, 0, 10
SYNC
NOP
HLT
"""
    assert code(src) == [
        I("RHM", 0, 1, {"host": 0, "ub": 0, "length": 10}),
        I("RW", 0, 1, {"tile": 0}),
        I("MMC", 0x05, 1, {"ub": 0, "acc": 0, "length": 10}),
        I("ACT", 0x08, 1, {"acc": 0, "ub": 0, "length": 10}),
        I("WHM", 0, 1, {"ub": 0, "host": 0, "length": 10}),
        I("SYNC"), I("NOP"), I("HLT"),
    ]


@pytest.mark.parametrize("text", ["mmc.so 1, 2, 3", "MatrixMultiply.SO 1, 2, 3",
                                  "Convolve.os 1,2,3", "MMC.OS 1 , 2 , 3 ; c"])
def test_mnemonics_and_flags_are_case_insensitive_and_unordered(text):
    assert one(text) == I("MMC", 0x05, 1, {"ub": 1, "acc": 2, "length": 3})


def test_every_name_in_the_table_is_accepted():
    from tpuasm.isa import ISA_TABLE
    for spec in ISA_TABLE.instructions.values():
        for name in spec.names:
            ops = ", ".join("1" if n != "reg" else "act_mult" for n in spec.operands)
            assert one(f"{name} {ops}").key == spec.key


def test_integer_literals():
    assert one("TAG 0x_ff") == I("TAG", 0, 1, {"tag": 255})
    assert one("TAG 0b1010") == I("TAG", 0, 1, {"tag": 10})
    assert one("TAG 0o17") == I("TAG", 0, 1, {"tag": 15})
    assert one("TAG 1_000_000") == I("TAG", 0, 1, {"tag": 1000000})
    assert one("TAG 007") == I("TAG", 0, 1, {"tag": 7})


@pytest.mark.parametrize("expr, value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("1 << 2 + 1", 8), ("6 & 3 | 8", 10),
    ("1 | 2 ^ 3", 1 | (2 ^ 3)), ("7 & ~2", 5), ("-7 / 2 + 10", 6), ("-7 % 3 + 10", 12),
    ("100 >> 2 >> 1", 12), ("10 - 2 - 3", 5), ("2 * -3 + 10", 4), ("--5", 5), ("+5", 5),
    ("12 / 4 / 3", 1), ("1 + 2 << 3", 24), ("5 ^ 1 & 3", 5 ^ (1 & 3)),
])
def test_expressions_follow_c_precedence_and_floor_division(expr, value):
    assert one(f"TAG {expr}")["tag"] == value


def test_comments_both_styles_and_blank_lines():
    assert code("\n\n; a\n  # b\nNOP ; c\nHLT # d\n\n") == [I("NOP"), I("HLT")]


def test_crlf_line_endings():
    assert code("NOP\r\nRW 3\r\n") == [I("NOP"), I("RW", 0, 1, {"tile": 3})]


# ------------------------------------------------------------------ operands
def test_named_operands_equal_positional():
    positional = one("RHM 5, 16, 4")
    assert one("RHM host=5, ub=16, length=4") == positional
    assert one("RHM ub=16, length=4, host=5") == positional
    assert one("RHM src=5, dst=16, len=4") == positional
    assert one("RHM 5, length=4, ub=16") == positional
    assert one("RHM 5, 16, n=4") == positional


def test_named_operands_of_act_follow_its_aliases():
    assert one("ACT.R src=1, dst=2, len=3") == one("ACT.R 1, 2, 3") == \
        I("ACT", 0x08, 1, {"acc": 1, "ub": 2, "length": 3})


def test_repeat():
    assert one("MMC.S 0, 0, 8, repeat=256").repeat == 256
    assert one("RW 1, repeat=9") == I("RW", 0, 9, {"tile": 1})
    assert one("NOP repeat=3") == I("NOP", 0, 3, {})


def test_convolve_takes_four_operands():
    assert one("MMC.CSO 0, 0, 4, 5, repeat=9") == \
        I("MMC", 0x07, 9, {"ub": 0, "acc": 0, "height": 4, "width": 5})
    assert one("MMC.C ub=1, acc=2, h=3, w=4") == I("MMC", 0x02, 1, {"ub": 1, "acc": 2, "height": 3, "width": 4})


def test_cfg_register_by_name_or_number():
    assert one("CFG act_shift, 8") == I("CFG", 0, 1, {"reg": 1, "value": 8})
    assert one("CFG 1, 8") == one("CFG act_shift, 8")
    assert one("SETC reg=rep_ub_stride, value=-4") == I("CFG", 0, 1, {"reg": 10, "value": -4})
    assert one("CFG act_mult, -2147483648")["value"] == -2147483648


def test_cfg_value_checked_against_register_range():
    assert errors("CFG act_out, 4") == ["value 4 out of range 0..3 for register act_out"]
    assert errors("CFG pool_size, 0") == ["value 0 out of range 1..256 for register pool_size"]


def test_address_ranges_follow_the_machine_shape():
    assert one("MMC 98303, 4095, 1")["ub"] == 98303
    assert errors("MMC 98304, 0, 1") == ["UB address 98304 out of range 0..98303 (MMC operand 'ub')"]
    assert errors("MMC 0, 4096, 1") == ["accumulator address 4096 out of range 0..4095 (MMC operand 'acc')"]
    assert errors(".config ub_rows=100\nMMC 100, 0, 1") == \
        ["UB address 100 out of range 0..99 (MMC operand 'ub')"]
    # host and tile are checked against their field width only
    assert one("RHM 0xffffffff, 0, 1")["host"] == 0xFFFFFFFF
    assert errors("RW 0x100000000") == ["weight tile 4294967296 out of range 0..4294967295 (RW operand 'tile')"]
    assert errors("RHM 0, 0, 0") == ["length 0 out of range 1..65535 (RHM operand 'length')"]
    assert errors("MMC 0, 0, -1") == ["length -1 out of range 1..4294967295 (MMC operand 'length')"]


# ------------------------------------------------------------------ symbols
def test_equ_with_forward_references():
    p = assemble(".equ A, B * 2\n.equ B, C + 1\n.equ C, 4\nTAG A")
    assert p.instructions == [I("TAG", 0, 1, {"tag": 10})]
    assert {s.name: s.value for s in p.symbols if s.kind == "const"} == {"A": 10, "B": 5, "C": 4}


def test_equ_cycles_are_reported():
    assert errors(".equ A, B\n.equ B, C + 1\n.equ C, A\nTAG A") == ["circular definition: A -> B -> C -> A"]
    assert errors(".equ A, A + 1\nTAG A") == ["circular definition: A -> A"]


def test_regions_allocate_in_order_and_bind_names():
    src = """.equ N, 10
.ub a, N
.ub b, 5
.acc s, 3
.host x, 7
.tile w, 9
.ub fixed, 16, 0x100
RHM host.x, ub.b, N
MMC.S b, s, 5
MMC fixed, acc.s + 2, 1
RW w + 8
"""
    p = assemble(src)
    assert p.instructions == [
        I("RHM", 0, 1, {"host": 0, "ub": 10, "length": 10}),
        I("MMC", 0x01, 1, {"ub": 10, "acc": 0, "length": 5}),
        I("MMC", 0, 1, {"ub": 256, "acc": 2, "length": 1}),
        I("RW", 0, 1, {"tile": 8}),
    ]
    assert set(p.symbols) == {Symbol("N", "const", 10), Symbol("a", "ub", 0, 10), Symbol("b", "ub", 10, 5),
                              Symbol("fixed", "ub", 256, 16), Symbol("s", "acc", 0, 3),
                              Symbol("x", "host", 0, 7), Symbol("w", "tile", 0, 9)}


def test_automatic_regions_skip_explicit_ones():
    p = assemble(".ub fixed, 4, 2\n.ub a, 2\n.ub b, 3\nNOP")
    bases = {s.name: s.value for s in p.symbols}
    assert bases == {"fixed": 2, "a": 0, "b": 6}


def test_region_size_may_refer_forward():
    p = assemble(".ub a, N\n.ub b, 1\n.equ N, 3\nTAG b")
    assert p.instructions[0]["tag"] == 3


def test_same_name_in_two_memories_needs_its_prefix():
    assert one(".ub x, 4\n.acc x, 4, 10\nMMC ub.x, acc.x, 1") == I("MMC", 0, 1, {"ub": 0, "acc": 10, "length": 1})
    assert errors(".ub x, 4\n.acc x, 4\nTAG x") == \
        ["'x' is ambiguous: it names regions in ub and acc (write ub.x)"]


def test_region_errors():
    assert errors(".ub a, 4, 0\n.ub b, 4, 2\nNOP") == \
        ["region 'ub.b' (rows 2..5) overlaps 'ub.a' (rows 0..3)"]
    assert errors(".ub big, 98305\nNOP") == \
        ["region 'ub.big' (rows 0..98304) does not fit in ub memory of 98304 rows"]
    assert errors(".acc a, 10, 4090\nNOP") == \
        ["region 'acc.a' (rows 4090..4099) does not fit in acc memory of 4096 rows"]
    assert errors(".ub a, 0\nNOP") == ["region size 0 must be at least 1"]


def test_equ_shadows_a_bare_region_name():
    assert one(".ub x, 4, 7\n.equ x, 100\nTAG x + ub.x") == I("TAG", 0, 1, {"tag": 107})


# ------------------------------------------------------------------ config
def test_config_sets_shape():
    p = assemble(".config array_size=16, ub_rows=1024, acc_rows=64, fifo_depth=2, profile=opentpu\nNOP")
    assert p.shape == MachineShape(16, 1024, 64, 2, "opentpu")


def test_config_default_shape_and_row_counts_stay():
    assert assemble("NOP").shape == MachineShape()
    assert assemble(".config array_size=16\nNOP").shape == MachineShape(array_size=16)


def test_config_override_from_command_line_wins():
    p = assemble(".config array_size=16, ub_rows=100\nMMC 150, 0, 1", config={"ub_rows": 200})
    assert p.shape == MachineShape(array_size=16, ub_rows=200)


def test_config_errors():
    assert errors("NOP\n.config array_size=16") == [".config must come before the first instruction"]
    assert errors(".config array_sise=16\nNOP") == [
        "unknown .config key 'array_sise'; did you mean 'array_size'? "
        "(keys: array_size, ub_rows, acc_rows, fifo_depth, profile)"]
    assert errors(".config profile=tpu2\nNOP") == ["unknown profile 'tpu2' (choose from tpu, opentpu)"]
    assert errors(".config fifo_depth=0\nNOP") == ["bad machine configuration: fifo_depth 0 out of range 1..64"]


# ------------------------------------------------------------------ rept and macros
def test_rept_with_variable():
    assert code(".rept 3, t\n RW 10 + t\n.endr") == [I("RW", 0, 1, {"tile": 10 + t}) for t in range(3)]


def test_rept_nested_and_zero():
    got = code(".rept 2, i\n.rept 3, j\nTAG i * 10 + j\n.endr\n.endr\n.rept 0\nNOP\n.endr")
    assert [g["tag"] for g in got] == [0, 1, 2, 10, 11, 12]


def test_rept_count_from_earlier_equ():
    assert len(code(".equ N, 4\n.rept N\nNOP\n.endr")) == 4


def test_macro_substitutes_parameters():
    src = """.macro LAYER src, dst, n
    MMC.SO \\src, 0, \\n
    ACT.R  0, \\dst, \\n
.endm
.ub in, 8
.ub out, 8
    LAYER in, out + 1, 2 * 3
"""
    assert code(src) == [I("MMC", 0x05, 1, {"ub": 0, "acc": 0, "length": 6}),
                         I("ACT", 0x08, 1, {"acc": 0, "ub": 9, "length": 6})]


def test_macro_locations_point_into_the_body():
    src = ".macro TWO a\n  TAG \\a\n  TAG \\a + 1\n.endm\nTWO 5\n"
    p = assemble(src, "m.tasm")
    assert p.locations == [SourceLoc("m.tasm", 2, 3), SourceLoc("m.tasm", 3, 3)]


def test_macro_inside_rept_and_rept_inside_macro():
    src = """.macro ROW base
.rept 2, k
    TAG \\base + k
.endr
.endm
.rept 2, r
    ROW r * 10
.endr
"""
    assert [i["tag"] for i in code(src)] == [0, 1, 10, 11]


def test_macro_errors():
    assert errors(".macro M a, b\nTAG \\a\n.endm\nM 1") == ["macro 'M' takes 2 arguments (a, b), got 1"]
    assert errors(".macro M\nM\n.endm\nM") == ["macros nested deeper than 64 (a macro that calls itself?)"]
    assert errors(".macro M a\nTAG \\b\n.endm\nM 1") == ["unknown macro parameter '\\b' (parameters: a)"]
    assert errors(".macro NOP\n.endm") == ["macro 'NOP' has the name of an instruction"]


def test_unterminated_blocks():
    assert errors(".rept 2\nNOP") == ["unterminated .rept (no matching .endr)"]
    assert errors(".macro M\nNOP") == ["unterminated .macro (no matching .endm)"]
    assert errors("NOP\n.endr") == [".endr without a matching .rept"]


# ------------------------------------------------------------------ includes and files
def test_include_relative_to_including_file(tmp_path: Path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "defs.tasm").write_text(".equ N, 7\n.include \"more.tasm\"\n")
    (tmp_path / "lib" / "more.tasm").write_text("TAG N + 1\n")
    main = tmp_path / "main.tasm"
    main.write_text('.include "lib/defs.tasm"\nTAG N\n')
    p = assemble_file(main)
    assert p.instructions == [I("TAG", 0, 1, {"tag": 8}), I("TAG", 0, 1, {"tag": 7})]
    more = str(tmp_path / "lib" / "more.tasm")
    assert p.locations[0] == SourceLoc(more, 1, 1)
    assert set(p.sources) == {str(main), str(tmp_path / "lib" / "defs.tasm"), more}
    assert assemble(main) == p


def test_include_cycle_reports_chain(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.tasm").write_text('.include "b.tasm"\n')
    Path("b.tasm").write_text('NOP\n.include "a.tasm"\n')
    with pytest.raises(AssemblyError) as exc:
        assemble(Path("a.tasm"))
    (d,) = exc.value.diagnostics
    assert d.message == "include cycle: a.tasm -> b.tasm -> a.tasm"
    assert (d.file, d.line, d.col) == ("b.tasm", 2, 10)


def test_missing_include(tmp_path: Path):
    main = tmp_path / "m.tasm"
    main.write_text('.include "nope.tasm"\n')
    with pytest.raises(AssemblyError, match="nope.tasm: cannot read source file: No such file"):
        assemble_file(main)


def test_missing_source_file(tmp_path: Path):
    with pytest.raises(AssemblyError, match="cannot read"):
        assemble_file(tmp_path / "absent.tasm")


# ------------------------------------------------------------------ program output
def test_program_records_locations_sources_and_round_trips_the_container():
    src = ".ub in, 4\nRHM 0, in, 4\n  HLT\n"
    p = assemble(src, "t.tasm")
    assert p.locations == [SourceLoc("t.tasm", 2, 1), SourceLoc("t.tasm", 3, 3)]
    assert p.sources == {"t.tasm": src}
    from tpuasm.binary import Program
    q = Program.from_bytes(p.to_bytes())
    assert q.instructions == p.instructions and q.locations == p.locations and q.symbols == p.symbols


def test_listing_and_symbol_map():
    p = assemble(".equ N, 2\n.ub in, N\nRHM 1, in, N\n", "t.tasm")
    lines = listing(p).splitlines()
    assert lines[1].split() == ["0", "00000000"] + "06 00 00 00 00 00 01 00 00 00 02 00".split() + \
        ["t.tasm:3", "RHM", "1,", "in,", "N"]
    smap = symbol_map(p).splitlines()
    assert smap[1].split() == ["const", "2", "N"]
    assert smap[2].split() == ["ub", "0", "2", "ub.in"]


def test_all_errors_are_reported_in_one_run():
    msgs = errors("FOO 1\nRHM 0, 0\nRW undefined\n.bogus\nTAG 1 / 0\n")
    assert len(msgs) == 5


def test_unknown_config_key_from_command_line():
    assert errors("NOP", config={"array_sze": 16}) == [
        "unknown configuration key 'array_sze' (from the command line); did you mean 'array_size'? "
        "(keys: array_size, ub_rows, acc_rows, fifo_depth, profile)"]


def test_command_line_config_values_may_be_text():
    assert assemble("NOP", config={"ub_rows": "0x100", "profile": "opentpu"}).shape == \
        MachineShape(ub_rows=256, profile="opentpu")


def test_text_source_with_a_filename_includes_relative_to_it(tmp_path: Path):
    (tmp_path / "defs.tasm").write_text(".equ N, 3\n")
    p = assemble('.include "defs.tasm"\nTAG N\n', str(tmp_path / "main.tasm"))
    assert p.instructions == [I("TAG", 0, 1, {"tag": 3})]


def test_flag_names_instead_of_letters_get_a_suggestion():
    assert errors("ACT.relu 0, 0, 1") == [
        "ACT has no flags 'e', 'u'; ACT has flags R, Q, T, M, A, P, L; did you mean 'ACT.R' (relu)?"]


def test_labels_name_the_next_instruction():
    p = assemble("start:\n  NOP\nmm: MMC 0, 0, 1\n.rept 2\n  RW 1\n.endr\nend: HLT\n")
    assert [s for s in p.symbols if s.kind == "label"] == [
        Symbol("start", "label", 0), Symbol("mm", "label", 1), Symbol("end", "label", 4)]
    assert len(p) == 5


def test_label_errors():
    assert errors(".equ x, 1\nx: NOP") == ["duplicate symbol 'x'"]
    assert errors(".rept 2\nl: NOP\n.endr") == [
        "label 'l' is defined again by every expansion of its .rept or macro body"]


def test_listing_shows_labels():
    lines = listing(assemble("start:\n  NOP\n", "t.tasm")).splitlines()
    assert lines[1].strip() == "start:"
    assert lines[2].split()[:2] == ["0", "00000000"]


def test_byte_order_mark_and_empty_source():
    assert code("\ufeffNOP\n") == [I("NOP")]
    assert code("") == []


def test_macro_used_before_its_definition():
    assert errors("M 1\n.macro M a\n.endm") == ["macro 'M' is used before its definition (at <input>:2:8)"]


def test_label_must_be_a_plain_name():
    assert errors("ub.x: NOP") == ["a label is a plain name, not 'ub.x'"]

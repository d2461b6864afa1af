"""`tpuasm lint` findings and the strip-nops transform (same output either way)."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.assembler import assemble
from tpuasm.binary import Program, SourceLoc, Symbol
from tpuasm.encoding import Instruction
from tpuasm.lint import lint, nop_runs, padded_dependency, render, strip_nops
from tpuasm.machine.reference import run_reference

N8 = {"array_size": 8}

SIMPLEMULT = (
    "# simple matrix multiply, OpenTPU style\n"      # line 1
    "RHM 0, 0, 8\n"                                  # 2
    "RW 0\n"                                         # 3
    + "NOP\n" * 20 +                                 # 4-23
    "MMC.S 0, 0, 8\n"                                # 24
    + "NOP\n" * 5 +                                  # 25-29
    "ACT.R 0, 0, 8\n"                                # 30
    "NOP repeat=7\n"                                 # 31
    "NOP\n"                                          # 32
    "WHM 0, 0, 8\n"                                  # 33
    "NOP\nNOP\n"                                     # 34-35
    "HLT\n"                                          # 36
)


def program(text=SIMPLEMULT, config=N8) -> Program:
    return assemble(text, "mult.a", config=config)


def test_nop_runs_are_maximal_and_count_cycles():
    runs = nop_runs(program())
    assert [(r.first, r.last, r.count, r.cycles) for r in runs] == [
        (2, 21, 20, 20), (23, 27, 5, 5), (29, 30, 2, 8), (32, 33, 2, 2)]
    assert [(r.before, r.after) for r in runs] == [(1, 22), (22, 28), (28, 31), (31, 34)]


def test_runs_at_the_start_and_the_end():
    p = program("NOP\nNOP\nHLT\nNOP\n")
    runs = nop_runs(p)
    assert [(r.first, r.last, r.before, r.after) for r in runs] == [(0, 1, None, 2), (3, 3, 2, None)]


def test_findings_have_positions_and_name_the_dependency():
    p = program()
    findings = lint(p)
    assert [(f.location.line, f.location.col) for f in findings] == [(4, 1), (25, 1), (31, 1), (34, 1)]
    assert findings[0].message == (
        "20 NOPs (lines 4-23) are unnecessary: the interlocked pipeline already makes "
        "`MMC.S 0, 0, 8` (line 24) wait for `RW 0` (line 3)")
    assert "`ACT.R 0, 0, 8` (line 30) wait for `MMC.S 0, 0, 8` (line 24)" in findings[1].message
    assert findings[2].message.startswith("2 NOPs (8 cycles) (lines 31-32) are unnecessary")
    assert "`WHM 0, 0, 8` (line 33) wait for `ACT.R 0, 0, 8` (line 30)" in findings[2].message
    # HLT's footprint is not a row range: the general wording
    assert "orders `HLT` (line 36) after everything it depends on" in findings[3].message


def test_dependency_skips_unrelated_instructions():
    p = program("RHM 0, 0, 4\nRHM 0, 8, 4\nRW 0\nNOP\nMMC.S 0, 0, 4\nHLT\n")
    (run,) = nop_runs(p)
    assert padded_dependency(p, run) == 2            # RW 0, not the RHMs before it
    p = program("RHM 0, 0, 4\nRHM 0, 8, 4\nNOP\nMMC 8, 0, 4\nHLT\n")
    (run,) = nop_runs(p)
    assert padded_dependency(p, run) == 1            # the RHM that wrote UB rows 8-11
    p = program("RHM 0, 0, 4\nNOP\nRHM 0, 8, 4\nHLT\n")
    (run,) = nop_runs(p)
    assert padded_dependency(p, run) is None
    assert "after everything it depends on" in lint(p)[0].message


def test_dependency_beyond_opentpus_instructions_gets_the_general_wording():
    # MMC.SH reads two UB rows per vector (0-15), so the nearest dependency is line 2, not
    # line 1; footprints only model OpenTPU's set, so the wording stays general.
    p = program("RHM 0, 0, 8\nRHM 0, 8, 8\nNOP\nMMC.SH 0, 0, 8\nHLT\n")
    (run,) = nop_runs(p)
    assert padded_dependency(p, run) is None
    message = lint(p)[0].message
    assert "line 1" not in message
    assert "orders `MMC.SH 0, 0, 8` (line 4) after everything it depends on" in message


def test_render_is_compiler_style_with_a_summary():
    p = program()
    text = render(lint(p), p, "mult.a")
    assert "mult.a:4:1: warning: 20 NOPs (lines 4-23) are unnecessary" in text
    assert "    4 | NOP\n      | ^^^" in text
    assert "`tpuasm asm --strip-nops` drops them; the output is the same" in text
    assert text.rstrip().endswith("mult.a: 29 unnecessary NOPs in 4 runs (35 idle cycles); "
                                  "`tpuasm asm --strip-nops` drops them")
    clean = strip_nops(p)
    assert lint(clean) == []
    assert render([], clean, "mult.a") == "mult.a: no unnecessary NOPs\n"


def test_render_without_source_positions():
    p = program().stripped()
    text = render(lint(p), p, "mult.out")
    assert "mult.out: instructions 2-21: warning: 20 NOPs are unnecessary" in text
    assert "(instruction 22) wait for `RW 0` (instruction 1)" in text


def test_strip_nops_keeps_code_locations_and_moves_labels():
    p = program()
    p.symbols = [Symbol("mm", "label", 22), Symbol("pad", "label", 2), Symbol("end", "label", 35),
                 Symbol("x", "ub", 0, 8)]
    s = strip_nops(p)
    assert [i.key for i in s.instructions] == ["RHM", "RW", "MMC", "ACT", "WHM", "HLT"]
    assert [loc.line for loc in s.locations] == [2, 3, 24, 30, 33, 36]
    assert {sym.name: sym.value for sym in s.symbols} == {"mm": 2, "pad": 2, "end": 6, "x": 0}
    assert s.shape == p.shape and s.sources == p.sources
    assert len(p.instructions) == 35                 # the original is untouched


def _data(rng, rows, tiles, n):
    host = rng.integers(-128, 128, (rows, n), dtype=np.int8)
    weights = rng.integers(-128, 128, (tiles, n, n), dtype=np.int8)
    return host, weights


LAYERS3 = "RHM 0, 0, 10\n" + "".join(
    f"RW {t}\n" + "NOP\n" * 9 + "MMC.SO 0, 0, 10\n" + "NOP\n" * 40 + "ACT.R 0, 0, 10\n" + "NOP\n" * 12
    for t in range(3)) + "WHM 0, 0, 10\n" + "NOP\n" * 3 + "HLT\n"


@pytest.mark.parametrize("text, n, rows, tiles", [(SIMPLEMULT, 8, 8, 1), (LAYERS3, 16, 10, 3)])
def test_stripping_nops_gives_the_same_output(text, n, rows, tiles):
    p = program(text, {"array_size": n})
    host, weights = _data(np.random.default_rng(n), rows, tiles, n)
    full = run_reference(p, host, weights)
    lean = run_reference(strip_nops(p), host, weights)
    assert full.fault_kind is None and lean.fault_kind is None
    assert np.array_equal(full.host, lean.host)
    assert np.array_equal(full.ub, lean.ub) and np.array_equal(full.acc, lean.acc)
    assert len(strip_nops(p)) < len(p) / 5


def test_strip_nops_on_a_program_without_locations():
    p = Program([Instruction("NOP"), Instruction("HLT")])
    s = strip_nops(p)
    assert [i.key for i in s.instructions] == ["HLT"] and s.locations == [None]
    assert lint(p)[0].location is None


def test_a_single_nop_is_singular():
    p = program("RHM 0, 0, 1\nNOP\nWHM 0, 0, 1\nHLT\n")
    assert lint(p)[0].message.startswith("1 NOP is unnecessary: ")
    assert isinstance(lint(p)[0].location, SourceLoc)
    assert render(lint(p), p, "one.a").rstrip().endswith(
        "one.a: 1 unnecessary NOP in 1 run (1 idle cycle); `tpuasm asm --strip-nops` drops them")


def test_trailing_nops_say_nothing_follows_them_or_it():
    (one,) = lint(program("HLT\nNOP\n"))
    assert one.message == "1 NOP is unnecessary: nothing follows it"
    (two,) = lint(program("HLT\nNOP\nNOP\n"))
    assert two.message == "2 NOPs (lines 2-3) are unnecessary: nothing follows them"


# ---------------------------------------------------------------- OpenTPU's hardware
from tpuasm.lint import opentpu_hazards, render_hazards  # noqa: E402

CHAIN = "RHM 0, 0, 8\nRW 0\nMMC.SO 0, 0, 8\nACT 0, 8, 8\nWHM 8, 8, 8\nHLT\n"


def test_hazards_of_an_unpadded_chain_are_hand_computed():
    # N = 8, one instruction per cycle: RHM@0 writes UB 0-7 until 8; RW@1 busy until 2,
    # its tile in the array at 1 + 1 + 3 = 5; MMC@2 needs both: 8; it writes acc 0-7
    # until 2 + 8 + 16 = 26; ACT@3 needs them: 26, writes UB 8-15 until 3 + 9 = 12;
    # WHM@4 needs them: 12; HLT@5 must wait for the MMC (26), the longest in flight.
    p = program(CHAIN)
    got = [(h.index, h.waits_for, h.issue, h.ready) for h in opentpu_hazards(p)]
    assert got == [(2, 0, 2, 8), (3, 2, 3, 26), (4, 3, 4, 12), (5, 2, 5, 26)]


def test_exactly_enough_padding_has_no_hazards_and_one_nop_less_has_one():
    lines = CHAIN.splitlines()
    pads = {2: 6, 3: 23, 4: 8, 5: 7}                  # NOPs before each instruction
    def build(pads):
        out = []
        for i, line in enumerate(lines):
            out += ["NOP"] * pads.get(i, 0) + [line]
        return "\n".join(out) + "\n"
    assert opentpu_hazards(program(build(pads))) == []
    for i in pads:
        fewer = {**pads, i: pads[i] - 1}
        hazards = opentpu_hazards(program(build(fewer)))
        assert [h.nops for h in hazards] == [1], i


def test_structural_and_war_hazards():
    # the matrix unit is busy for L + 2N; an ACT may not overwrite UB rows an MMC still reads
    p = program("RW 0\nRW 1\nNOP\nNOP\nNOP\nNOP\nMMC.SO 0, 0, 8\nMMC.S 8, 8, 8\nHLT\n")
    (h, hlt) = opentpu_hazards(p)
    assert (h.index, h.waits_for, h.ready) == (7, 6, 6 + 8 + 16)
    assert "matrix unit is busy" in h.why
    p = program("RW 0\nMMC.SO 0, 0, 8\nACT 16, 0, 8\nHLT\n")
    tile, war, _hlt = opentpu_hazards(p)
    assert (tile.index, tile.waits_for, tile.ready) == (1, 0, 0 + 1 + 3)
    assert (war.index, war.waits_for, war.ready) == (2, 1, 1 + 8)   # MMC reads UB 0-7 for 8
    assert "reads rows this overwrites" in war.why


def test_padded_programs_are_enough_for_opentpu_and_stripped_ones_are_not():
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "programs" / "opentpu"
    for name, n in (("matmul8", 8), ("relu3_16", 16), ("sigmoid8", 8)):
        p = assemble(root / name / f"{name}.a", config={"profile": "opentpu", "array_size": n})
        assert opentpu_hazards(p) == [], name
        assert len(opentpu_hazards(strip_nops(p))) >= 3, name


def test_render_hazards():
    p = program(CHAIN)
    text = render_hazards(opentpu_hazards(p), p, "mult.a")
    assert ("mult.a:3:1: warning: on OpenTPU's hardware (no interlocks) this issues at cycle 2, "
            "6 cycles too early: `RHM 0, 0, 8` (line 1) writes rows this uses until cycle 8") in text
    assert "= note: OpenTPU needs 6 more NOPs before it" in text
    assert "runs until cycle 26, but OpenTPU stops at HLT at once" in text
    assert text.rstrip().endswith("mult.a: 4 places where OpenTPU's hardware needs more NOPs")
    assert render_hazards([], p, "x.a") == "x.a: the NOP padding is enough for OpenTPU's hardware\n"


def test_render_hazards_without_source_positions_and_in_the_singular():
    # `tpuasm lint --opentpu prog.out`: a binary has no source positions
    pads = "RHM 0, 0, 8\nRW 0\n" + "NOP\n" * 5 + "MMC.SO 0, 0, 8\n" + "NOP\n" * 40 + "HLT\n"
    p = program(pads).stripped()
    (h,) = opentpu_hazards(p)
    assert h.nops == 1
    text = render_hazards([h], p, "prog.out")
    assert ("prog.out: instruction 7: warning: on OpenTPU's hardware (no interlocks) this "
            "issues at cycle 7, 1 cycle too early: `RHM 0, 0, 8` (instruction 0) writes rows "
            "this uses until cycle 8 (OpenTPU needs 1 more NOP before it)") in text
    assert text.rstrip().endswith("prog.out: 1 place where OpenTPU's hardware needs more NOPs")

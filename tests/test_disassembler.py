"""The disassembler: canonical text per instruction, and programs that
re-assemble to the same code and machine shape."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies import instructions, programs
from tpuasm.assembler import assemble
from tpuasm.binary import MachineShape, Program
from tpuasm.disassembler import disassemble, format_instruction
from tpuasm.encoding import Instruction as I
from tpuasm.isa import ISA_TABLE


def test_format_instruction_canonical_forms():
    assert format_instruction(I("MMC", 0x05, 1, {"ub": 0, "acc": 0, "length": 10})) == "MMC.SO 0, 0, 10"
    assert format_instruction(I("MMC", 0x07, 9, {"ub": 1, "acc": 2, "height": 3, "width": 4})) == \
        "MMC.SCO 1, 2, 3, 4, repeat=9"
    assert format_instruction(I("ACT", 0x48, 1, {"acc": 7, "ub": 8, "length": 2})) == "ACT.RM 7, 8, 2"
    assert format_instruction(I("RHM", 0, 1, {"host": 1, "ub": 2, "length": 3})) == "RHM 1, 2, 3"
    assert format_instruction(I("WHM", 0, 1, {"ub": 1, "host": 2, "length": 3})) == "WHM 1, 2, 3"
    assert format_instruction(I("CFG", 0, 1, {"reg": 1, "value": -8})) == "CFG act_shift, -8"
    assert format_instruction(I("RW", 0, 4, {"tile": 3})) == "RW 3, repeat=4"
    assert format_instruction(I("HLT")) == "HLT"
    assert format_instruction(I("NOP", 0, 2, {})) == "NOP repeat=2"


@settings(max_examples=300, deadline=None)
@given(instructions())
def test_formatted_instruction_assembles_back(ins):
    assert assemble(format_instruction(ins)).instructions == [ins]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_disassembly_reassembles_to_the_same_binary(p):
    again = assemble(disassemble(p))
    assert again.stripped().to_bytes() == p.stripped().to_bytes()


def test_config_line_only_when_shape_differs():
    assert disassemble(Program([I("HLT")])) == "HLT\n"
    text = disassemble(Program([I("HLT")], MachineShape(array_size=16, profile="opentpu")))
    assert text.splitlines()[0] == ".config array_size=16, profile=opentpu"


def test_annotate_adds_source_lines():
    src = ".ub in, 4\n  RHM 0, in, 4   ; load\nHLT\n"
    text = disassemble(assemble(src, "t.tasm"), annotate=True)
    assert text.splitlines() == [
        "RHM 0, 0, 4  ; t.tasm:2:3: RHM 0, in, 4   ; load",
        "HLT          ; t.tasm:3:1: HLT",
    ]
    again = assemble(text)
    assert again.instructions == assemble(src).instructions


def test_annotate_without_sources_is_plain():
    p = assemble("HLT\n").stripped()
    assert disassemble(p, annotate=True) == "HLT\n"


@settings(max_examples=200, deadline=None)
@given(instructions(), st.randoms(use_true_random=False), st.booleans())
def test_named_operands_in_any_order_equal_positional(ins, rng, use_aliases):
    """Write each operand as name=value (a field name or one of its aliases), shuffled."""
    names, fields = ins.spec.layout(ins.flags)
    text_ops = []
    for f in fields:
        value = ins.operands[f.name]
        if f.kind == "reg":
            value = ISA_TABLE.register_by_index[value].name
        key = rng.choice(f.aliases) if use_aliases and f.aliases else f.name
        text_ops.append(f"{key}={value}")
    if ins.repeat > 1:
        text_ops.append(f"repeat={ins.repeat}")
    rng.shuffle(text_ops)
    head = ins.key + ("." + ins.flag_letters if ins.flags else "")
    assert assemble(f"{head} {', '.join(text_ops)}").instructions == [ins]

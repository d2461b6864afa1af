"""`.node`: which graph node each instruction computes, through assembly, the binary,
listings and NOP stripping (spec/isa.md section 6)."""
import pytest

from tpuasm.assembler import assemble, listing, symbol_map
from tpuasm.binary import Program
from tpuasm.errors import AssemblyError
from tpuasm.lint import strip_nops

SOURCE = """
        NOP
.node "/layer1/MatMul"
        RW 0
        NOP
        NOP
.node relu1
        NOP
.macro BLOCK name
.node \\name
        NOP
.endm
        BLOCK mm2
        BLOCK mm2
.node
        HLT
"""


def test_each_instruction_maps_to_the_node_before_it():
    p = assemble(SOURCE)
    assert [p.node_of(i) for i in range(len(p))] == [
        None, "/layer1/MatMul", "/layer1/MatMul", "/layer1/MatMul", "relu1", "mm2", "mm2", None]
    assert p.nodes() == ["/layer1/MatMul", "relu1", "mm2"]
    # the two macro expansions are one run: the same node, consecutive instructions
    assert p.node_runs("mm2") == [range(5, 7)]
    assert p.node_runs() == [range(1, 4), range(4, 5), range(5, 7)]


def test_a_node_may_have_several_runs():
    p = assemble('.node "a"\nNOP\n.node "b"\nNOP\n.node "a"\nNOP\nNOP\nHLT')
    assert p.node_runs("a") == [range(0, 1), range(2, 5)]
    assert [p.node_of(i) for i in range(5)] == ["a", "b", "a", "a", "a"]
    assert p.node_of(99) is None and p.node_of(-1) is None


def test_nodes_survive_the_binary_round_trip():
    p = assemble(SOURCE)
    q = Program.from_bytes(p.to_bytes())
    assert [q.node_of(i) for i in range(len(q))] == [p.node_of(i) for i in range(len(p))]
    assert q.nodes() == p.nodes()


def test_a_node_without_instructions_leaves_no_symbol():
    p = assemble('.node "empty"\n.node "x"\nNOP\n.node "tail"\n')
    assert p.nodes() == ["x"]


def test_listing_and_symbol_map_name_the_nodes():
    p = assemble(SOURCE)
    text = listing(p)
    assert ".node /layer1/MatMul" in text and ".node relu1" in text
    assert text.index(".node relu1") < text.index("     4  ")
    assert "node" in symbol_map(p) and "/layer1/MatMul" in symbol_map(p)


def test_stripping_nops_keeps_each_instruction_in_its_node():
    p = assemble(SOURCE)
    s = strip_nops(p)
    assert [ins.key for ins in s.instructions] == ["RW", "HLT"]
    assert [s.node_of(i) for i in range(len(s))] == ["/layer1/MatMul", None]
    assert s.nodes() == ["/layer1/MatMul"]


@pytest.mark.parametrize("line, message", [
    ('.node "a", "b"', ".node takes one graph node name"),
    ('.node 3', ".node takes one graph node name"),
    ('.node ""', "the node name is empty"),
])
def test_bad_node_directives_are_reported_with_their_position(line, message):
    with pytest.raises(AssemblyError) as e:
        assemble(line + "\nHLT", "p.tasm")
    text = e.value.render(color=False)
    assert message in text and "p.tasm:1:" in text


def test_disassembly_keeps_the_nodes():
    from tpuasm.disassembler import disassemble
    p = assemble(SOURCE)
    text = disassemble(p)
    assert '.node "/layer1/MatMul"' in text and '.node "mm2"' in text
    q = assemble(text)
    assert q.code() == p.code()
    assert [q.node_of(i) for i in range(len(q))] == [p.node_of(i) for i in range(len(p))]

"""Property tests: any text at all gives a Program or an AssemblyError and
nothing else; the fast line reader agrees with the lark grammar."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuasm.assembler import assemble
from tpuasm.assembler.parser import parse
from tpuasm.binary import Program
from tpuasm.errors import AssemblyError

# Fragments that reach deep into the passes, mixed with arbitrary characters.
FRAGMENTS = [
    "MMC", ".SO", "ACT.R", "RHM", "CFG", "act_shift", "RW", "HLT", "NOP", "repeat=", "len=",
    ".equ", ".ub", ".acc", ".host", ".tile", ".config", "array_size=", "profile=", ".rept",
    ".endr", ".macro", ".endm", ".include", '"x.tasm"', "\\a", "ub.", "M", "A", "B",
    "0x", "0b1", "1_0", "99999999999", "-", "+", "*", "/", "%", "<<", ">>", "&", "|", "^", "~",
    "(", ")", ",", "=", " ", "\t", "\n", ";", "#", "0", "1", "7", "\r\n", "\\", "$", "é",
]
texts = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join),
    st.lists(st.sampled_from(FRAGMENTS), max_size=12).map(" ".join),
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
def test_any_text_gives_a_program_or_an_assembly_error(text):
    try:
        program = assemble(text, "fuzz.tasm")
    except AssemblyError as e:
        assert e.diagnostics, "an AssemblyError always carries diagnostics"
        for d in e.diagnostics:
            assert not d.message.startswith("internal error"), d.message
        e.render()                      # rendering never fails either
        return
    assert isinstance(program, Program)
    program.to_bytes()


def _dump(node):
    if isinstance(node, tuple):                      # Span
        return tuple(node)
    if isinstance(node, list):
        return [_dump(x) for x in node]
    slots = [s for cls in type(node).__mro__ for s in getattr(cls, "__slots__", ())]
    if slots:
        return (type(node).__name__, {s: _dump(getattr(node, s)) for s in slots})
    return node


names = st.sampled_from(["MMC", "mmc.so", "RHM", "x", "ub.input", "A_1", "repeat", "len", "t"])
atoms = st.one_of(names, st.sampled_from(["0", "17", "0x1F", "0b101", "1_000", "0o7", "007"]))
operands = st.one_of(
    atoms,
    st.tuples(atoms, st.sampled_from(["+", "-", "*"]), atoms).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
    st.tuples(names, atoms).map(lambda t: f"{t[0]}={t[1]}"),
)
lines = st.tuples(
    st.sampled_from(["", " ", "\t", "    "]), names,
    st.lists(operands, max_size=4),
    st.sampled_from(["", " ; comment", "# c", "   "]),
).map(lambda t: f"{t[0]}{t[1]}{' ' if t[2] else ''}{', '.join(t[2])}{t[3]}")


@settings(max_examples=300, deadline=None)
@given(st.lists(lines, min_size=1, max_size=6))
def test_fast_reader_builds_the_same_tree_as_the_grammar(src_lines):
    text = "\n".join(src_lines) + "\n"
    fast, fast_diags = parse(text, "f.tasm", fast=True)
    slow, slow_diags = parse(text, "f.tasm", fast=False)
    assert _dump(fast) == _dump(slow)
    assert fast_diags == slow_diags

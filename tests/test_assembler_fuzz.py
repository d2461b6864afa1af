"""Property tests: any text at all gives a Program or an AssemblyError and
nothing else; the fast line reader agrees with the lark grammar."""
from __future__ import annotations

import operator
import re

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
    "(", ")", ",", "=", " ", "\t", "\n", ";", "#", "0", "1", "7", "\r\n", "\\", "$", "é", ":", "l:",
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


# ------------------------------------------------------------------ expressions vs Python
# For these operators Python's precedence and associativity are C's, and with `/`
# read as `//` its division and modulo floor as spec/isa.md says: Python is the oracle.
literals = st.one_of(st.integers(0, 300).map(str), st.integers(0, 0xFFFF).map(hex),
                     st.integers(0, 64).map(bin), st.just("1_000"))
exprs = st.recursive(
    literals,
    lambda sub: st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^"]), sub)
        .map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(st.sampled_from(["-", "~", "+"]), sub).map(lambda t: f"{t[0]}{t[1]}"),
        sub.map(lambda s: f"({s})"),
    ),
    max_leaves=8,
)


class W(int):
    """A Python int whose shifts refuse counts outside 0..256, as the assembler does."""

    def _w(op):
        return lambda a, b=None: W(op(int(a)) if b is None else op(int(a), int(b)))

    __add__ = _w(operator.add)
    __sub__ = _w(operator.sub)
    __mul__ = _w(operator.mul)
    __floordiv__ = _w(operator.floordiv)
    __mod__ = _w(operator.mod)
    __and__ = _w(operator.and_)
    __or__ = _w(operator.or_)
    __xor__ = _w(operator.xor)
    __neg__ = _w(operator.neg)
    __pos__ = _w(operator.pos)
    __invert__ = _w(operator.invert)

    def __lshift__(self, n):
        if not 0 <= n <= 256:
            raise ValueError("shift count")
        return W(int(self) << int(n))

    def __rshift__(self, n):
        if not 0 <= n <= 256:
            raise ValueError("shift count")
        return W(int(self) >> int(n))


def python_value(text: str):
    wrapped = re.sub(r"0x[0-9a-f]+|0b[01]+|[0-9_]+", lambda m: f"W({m.group()})", text)
    try:
        return int(eval(wrapped.replace("/", "//"), {"__builtins__": {}, "W": W}))  # noqa: S307
    except (ZeroDivisionError, ValueError):
        return None


@settings(max_examples=400, deadline=None)
@given(exprs)
def test_expressions_agree_with_python(text):
    expected = python_value(text)
    try:
        got = assemble(f"CFG act_mult, 0\n.equ X, {text}\nINT X & 0xffffffff\n").instructions[1]["code"]
    except AssemblyError as e:
        assert expected is None, e.render()
        return
    assert expected is not None and got == expected & 0xFFFFFFFF

"""Hypothesis strategies for random valid instructions and programs, built from
the ISA table (spec/isa.toml) so they grow with it.  Other test modules may
import these.

    instructions()                  any instruction the assembler accepts on `shape`
    instructions(raw=True)          any instruction the *encoder* accepts (field ranges only)
    programs()                      a Program of such instructions on a random small shape
"""
from __future__ import annotations

from hypothesis import strategies as st

from tpuasm.binary import MachineShape, Program
from tpuasm.encoding import MAX_REPEAT, Instruction
from tpuasm.isa import ISA_TABLE, Field, InstructionSpec

DEFAULT_SHAPE = MachineShape()


def _flag_sets(spec: InstructionSpec):
    """Flag bit sets that respect the table's mutually exclusive groups."""
    letters = list(spec.flags)

    def ok(chosen):
        return spec.flag_conflict(spec.flag_bits(chosen)) is None

    return st.lists(st.sampled_from(letters), unique=True).filter(ok).map(spec.flag_bits) \
        if letters else st.just(0)


def field_values(field: Field, shape: MachineShape | None) -> st.SearchStrategy[int]:
    lo, hi = field.min, field.max
    if shape is not None:
        if field.kind == "ub":
            hi = min(hi, shape.ub_rows - 1)
        elif field.kind == "acc":
            hi = min(hi, shape.acc_rows - 1)
    if field.kind == "reg":
        return st.sampled_from(sorted(ISA_TABLE.register_by_index))
    # edges matter most for encodings: mix them in explicitly
    return st.one_of(st.sampled_from([lo, hi, min(lo + 1, hi)]), st.integers(lo, hi))


@st.composite
def instruction_of(draw, spec: InstructionSpec, shape: MachineShape | None = DEFAULT_SHAPE,
                   raw: bool = False) -> Instruction:
    flags = draw(_flag_sets(spec))
    repeat = draw(st.integers(1, MAX_REPEAT)) if spec.repeat else 1
    _names, fields = spec.layout(flags)
    operands = {f.name: draw(field_values(f, None if raw else shape)) for f in fields}
    if spec.key == "CFG" and not raw:
        reg = ISA_TABLE.register_by_index[operands["reg"]]
        operands["value"] = draw(st.one_of(st.sampled_from([reg.min, reg.max, reg.reset]),
                                           st.integers(reg.min, reg.max)))
    if spec.same_or_disjoint and not raw:
        # VADD/VMUL: a destination that shifts over an operand is an assembly error;
        # make it in place or disjoint (either is drawn)
        n = operands["length"]
        broadcast = "B" in spec.flag_letters(flags)

        def rows(x):
            return n * spec.rows_per_vector(flags, x)

        def shifted(x, y):
            p, q = operands[x], operands[y]
            same = p == q and rows(x) == rows(y)
            return not same and p < q + rows(y) and q < p + rows(x)

        if shifted("c", "a") or (not broadcast and shifted("c", "b")):
            # in place on a, all three 8-bit (in place needs the same width)
            flags &= ~spec.flag_bits("XYZ")
            operands["c"] = operands["a"]
            if not broadcast and shifted("c", "b"):
                operands["b"] = operands["a"]
    return Instruction(spec.key, flags, repeat, operands)


def instructions(shape: MachineShape | None = DEFAULT_SHAPE, raw: bool = False):
    """Random valid instructions of every kind in the table."""
    return st.sampled_from(sorted(ISA_TABLE.instructions)).flatmap(
        lambda key: instruction_of(ISA_TABLE.instructions[key], shape, raw))


def shapes() -> st.SearchStrategy[MachineShape]:
    return st.builds(MachineShape,
                     array_size=st.sampled_from([8, 16, 256]),
                     ub_rows=st.sampled_from([64, 1024, ISA_TABLE.machine.ub_rows]),
                     acc_rows=st.sampled_from([32, ISA_TABLE.machine.acc_rows]),
                     fifo_depth=st.integers(1, 8),
                     profile=st.sampled_from(["tpu", "opentpu"]))


@st.composite
def programs(draw, max_size: int = 30) -> Program:
    shape = draw(shapes())
    code = draw(st.lists(instructions(shape), min_size=0, max_size=max_size))
    return Program(code, shape)

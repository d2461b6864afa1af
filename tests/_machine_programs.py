"""Programs shared by the pipeline and machine tests, built from Instruction objects."""
from __future__ import annotations

from tpuasm.binary import Program
from tpuasm.encoding import Instruction


def I(key, flags="", repeat=1, **operands):
    """Instruction from mnemonic, flag letters, repeat and operands."""
    from tpuasm.isa import ISA_TABLE
    spec = ISA_TABLE.instructions[key]
    return Instruction(key, spec.flag_bits(flags), repeat, dict(operands))


def cfg(name, value):
    from tpuasm.isa import ISA_TABLE
    return I("CFG", reg=ISA_TABLE.registers[name].index, value=value)


def program(*instructions, **shape):
    from tpuasm.binary import MachineShape
    return Program(list(instructions), MachineShape(**shape))


def lstm1_600x600(batch=96):
    """The paper's LSTM1 worked example: a 600 x 600 weight matrix on a 256 x 256 array is
    3 x 3 tiles = 9 tile steps.  Input chunk k (96 rows) sits at UB rows 96k (written by the
    previous layer); output block j accumulates its 3 chunks at accumulator rows 96j.
    Weight tile j*3 + k multiplies chunk k into block j.  RWs are interleaved with the MMCs
    so no Read_Weights needs a later switch (spec/isa.md 5.3)."""
    b = batch
    return program(
        I("RW", repeat=4, tile=0),
        cfg("rep_ub_stride", b),
        I("MMC", "SO", repeat=3, ub=0, acc=0, length=b),
        I("RW", repeat=3, tile=4),
        I("MMC", "SO", repeat=3, ub=0, acc=b, length=b),
        I("RW", repeat=2, tile=7),
        I("MMC", "SO", repeat=3, ub=0, acc=2 * b, length=b),
        cfg("rep_ub_stride", 0),
        I("ACT", "R", acc=0, ub=1000, length=3 * b),
        I("HLT"),
    )

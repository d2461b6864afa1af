"""A program as one int64 array, one row per instruction, for the numba core.

Column numbers, opcodes and flag bits are module-level ints so that numba code can
use them as compile-time constants; all of them come from the ISA table.
"""
from __future__ import annotations

import numpy as np

from ..isa import ISA_TABLE

# Columns of the decoded table.  Unused operands are 0.
COL_OP, COL_FLAGS, COL_REPEAT, COL_UB, COL_ACC, COL_HOST, COL_TILE, COL_LEN, \
    COL_HEIGHT, COL_WIDTH, COL_REG, COL_VALUE, COL_VA, COL_VB, COL_VC, NCOLS = range(16)

_OPERAND_COLUMN = {"ub": COL_UB, "acc": COL_ACC, "host": COL_HOST, "tile": COL_TILE,
                   "length": COL_LEN, "height": COL_HEIGHT, "width": COL_WIDTH,
                   "reg": COL_REG, "value": COL_VALUE, "code": COL_VALUE, "tag": COL_VALUE,
                   "a": COL_VA, "b": COL_VB, "c": COL_VC}

_I = ISA_TABLE.instructions
OP_NOP, OP_WHM, OP_RW, OP_MMC, OP_ACT, OP_SYNC, OP_RHM, OP_HLT, OP_RHMA, OP_WHMA, OP_CFG, \
    OP_WSYNC, OP_INT, OP_TAG = (_I[k].opcode for k in (
        "NOP", "WHM", "RW", "MMC", "ACT", "SYNC", "RHM", "HLT", "RHMA", "WHMA", "CFG",
        "WSYNC", "INT", "TAG"))

# VADD and VMUL (spec/isa.md 5.11): one layout, one set of flags
OP_VADD, OP_VMUL = _I["VADD"].opcode, _I["VMUL"].opcode
_VF = _I["VADD"].flags
assert _VF == _I["VMUL"].flags
VEC_UNSIGNED, VEC_BROADCAST, VEC_LOOKUP = (_VF[c].bit for c in "UBL")
# the flags that make A, B or C 16-bit (two UB rows a vector)
VEC_WIDE_A, VEC_WIDE_B, VEC_WIDE_C = (
    next(f.bit for f in _VF.values() if f.wide == operand) for operand in "abc")

_MF, _AF = _I["MMC"].flags, _I["ACT"].flags
MMC_SWITCH, MMC_CONV, MMC_OVERWRITE, MMC_UNSIGNED_IN, MMC_UNSIGNED_W, MMC_WIDE_IN, \
    MMC_WIDE_W = (_MF[c].bit for c in "SCOUWHD")
ACT_RELU, ACT_SIGMOID, ACT_TANH, ACT_MAXPOOL, ACT_AVGPOOL = (_AF[c].bit for c in "RQTMA")
ACT_PER_COLUMN, ACT_LOOKUP = (_AF[c].bit for c in "PL")

# Configuration register indices and reset values.
_R = ISA_TABLE.registers
REG_ACT_MULT, REG_ACT_SHIFT, REG_ACT_ZERO, REG_ACT_OUT, REG_FN_IN_FRAC, REG_POOL_SIZE, \
    REG_POOL_WIDTH, REG_CONV_PITCH, REG_CONV_KW, REG_CONV_STRIDE, REG_REP_UB_STRIDE, \
    REG_REP_ACC_STRIDE, REG_REP_HOST_STRIDE, REG_DMA_HOST_STRIDE, REG_DMA_UB_STRIDE = (
        _R[n].index for n in (
            "act_mult", "act_shift", "act_zero", "act_out", "fn_in_frac", "pool_size",
            "pool_width", "conv_pitch", "conv_kw", "conv_stride", "rep_ub_stride",
            "rep_acc_stride", "rep_host_stride", "dma_host_stride", "dma_ub_stride"))
# Registers added for compiled networks (spec/isa.md 5.5).
REG_ACT_PARAMS, REG_ACT_TABLE, REG_ACT_LO, REG_ACT_HI, REG_POOL_STRIDE, REG_POOL_PAD, \
    REG_POOL_PAD_END, REG_POOL_COUNT_PAD, REG_ACT_UB_PITCH, REG_ACT_UB_WIDTH = (
        _R[n].index for n in (
            "act_params", "act_table", "act_lo", "act_hi", "pool_stride", "pool_pad",
            "pool_pad_end", "pool_count_pad", "act_ub_pitch", "act_ub_width"))
# 2-D pooling's column axis (spec/isa.md 5.5): 0 / -1 at reset mean "as the row register"
REG_POOL_SIZE_X, REG_POOL_STRIDE_X, REG_POOL_PAD_X, REG_POOL_PAD_END_X = (
    _R[n].index for n in ("pool_size_x", "pool_stride_x", "pool_pad_x", "pool_pad_end_x"))
REG_ACT_FLOAT = _R["act_float"].index      # P's float32 requantization (spec/isa.md 5.5)
REG_VEC_FLOAT = _R["vec_float"].index      # VADD / VMUL in float32 (spec/isa.md 5.11)
REG_VEC_MULT_A, REG_VEC_MULT_B, REG_VEC_SHIFT, REG_VEC_ZERO_A, REG_VEC_ZERO_B, \
    REG_VEC_ZERO_C = (_R[n].index for n in (
        "vec_mult_a", "vec_mult_b", "vec_shift", "vec_zero_a", "vec_zero_b", "vec_zero_c"))
NREGS = max(r.index for r in _R.values()) + 1
ACT_OUT_INT8, ACT_OUT_UINT8, ACT_OUT_INT16, ACT_OUT_WRAP8 = range(4)


def reset_registers() -> np.ndarray:
    regs = np.zeros(NREGS, dtype=np.int64)
    for r in _R.values():
        regs[r.index] = r.reset
    return regs


def register_limits() -> tuple[np.ndarray, np.ndarray]:
    lo = np.zeros(NREGS, dtype=np.int64)
    hi = np.zeros(NREGS, dtype=np.int64)
    for r in _R.values():
        lo[r.index], hi[r.index] = r.min, r.max
    return lo, hi


def decode_table(instructions) -> np.ndarray:
    """The (n, NCOLS) int64 table of a list of Instruction objects."""
    table = np.zeros((len(instructions), NCOLS), dtype=np.int64)
    for row, ins in zip(table, instructions):
        row[COL_OP] = ins.spec.opcode
        row[COL_FLAGS] = ins.flags
        row[COL_REPEAT] = ins.repeat
        for name, value in ins.operands.items():
            row[_OPERAND_COLUMN[name]] = value
    return table

"""OpenTPU (UCSB) compatibility: its binary format, its Activate functions, its data shapes.

OpenTPU programs are the `.a` sources our assembler already reads; this module adds
what differs from tpuasm's own formats (spec/opentpu.md has the whole profile):

- The binary: one 14-byte **big-endian** word per instruction, most significant byte
  first: opcode (1) | flags (1) | length (1) | addr (8) | ub_addr (3).
  `to_opentpu_bytes(program)` writes it, `from_opentpu_bytes(data)` reads it, and
  `looks_like_opentpu` / `is_opentpu_file` recognise it by content and extension.
- Activate: `opentpu_sigmoid` is `int(255 / (1 + exp(-x)))` as OpenTPU's float64 code
  computes it, for every int32 x, from a small integer table (no libm at run time).
- `matsize_from_data`: the array size N implied by OpenTPU's host and weight images.

Everything in OpenTPU's format is also in ours, so decoding yields an ordinary Program
(profile "opentpu"); encoding rejects, with the instruction's source position, what
OpenTPU's format cannot hold (a length over 255, a repeat, an instruction or flag
OpenTPU lacks).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .binary import MAGIC, MachineShape, Program
from .diagnostics import Diagnostic
from .encoding import Instruction
from .errors import AssemblyError, BinaryFormatError, DataFileError, EncodingError, TpuasmError
from .isa import ISA_TABLE
from .limits import BYTES_PER_INSTRUCTION, check_allocation

# ------------------------------------------------------------------ the 14-byte word
WORD_BYTES = 14
EXTENSION = ".out"                      # what OpenTPU's assembler names its output

# Field widths in bits, from the least significant end of the 112-bit word.
UB_BITS, ADDR_BITS, LENGTH_BITS, FLAGS_BITS, OPCODE_BITS = 24, 64, 8, 8, 8
UB_SHIFT = 0
ADDR_SHIFT = UB_SHIFT + UB_BITS                 # 24
LENGTH_SHIFT = ADDR_SHIFT + ADDR_BITS           # 88
FLAGS_SHIFT = LENGTH_SHIFT + LENGTH_BITS        # 96
OPCODE_SHIFT = FLAGS_SHIFT + FLAGS_BITS         # 104
MAX_LENGTH = (1 << LENGTH_BITS) - 1             # 255 vectors per instruction

OPCODES = {"NOP": 0, "WHM": 1, "RW": 2, "MMC": 3, "ACT": 4, "SYNC": 5, "RHM": 6, "HLT": 7}
KEY_BY_OPCODE = {v: k for k, v in OPCODES.items()}

# OpenTPU's flag letters and bits (TPU_FACTS.md; OpenTPU's hardware decoder).  Both
# formats spell flags with the same letters, so conversion goes letter by letter and
# never assumes the two bit assignments agree.
FLAG_BITS = {"S": 0x01, "C": 0x02, "O": 0x04, "R": 0x08, "Q": 0x10}

# The flags each instruction may carry in OpenTPU form.  OpenTPU defines a convolve bit
# but implements no convolution (its README), so C is refused both ways.
ALLOWED_FLAGS = {"MMC": "SO", "ACT": "RQ"}


@dataclass(frozen=True)
class _Fields:
    """Which of our operand names fill OpenTPU's addr, ub_addr and length fields."""
    addr: str | None = None
    ub: str | None = None
    length: str | None = None


# RHM and ACT: addr = source, ub_addr = destination; WHM and MMC: ub_addr = source,
# addr = destination; RW: addr = weight tile index.
FIELDS = {
    "NOP": _Fields(), "SYNC": _Fields(), "HLT": _Fields(),
    "RHM": _Fields("host", "ub", "length"),
    "WHM": _Fields("host", "ub", "length"),
    "RW": _Fields("tile"),
    "MMC": _Fields("acc", "ub", "length"),
    "ACT": _Fields("acc", "ub", "length"),
}


# ------------------------------------------------------------------ OpenTPU's latencies
# spec/opentpu.md section 6, for an N x N array and an instruction of length L.  The one
# place these numbers live: `lint.opentpu_hazards` uses them (and the emulator's OpenTPU
# timing should), without importing the numba machine.
HOST_VECTORS_PER_CYCLE = 1          # RHM / WHM: L cycles
WEIGHT_BYTES_PER_CYCLE = 64         # RW: 64-byte DRAM chunks, ceil(N*N / 64) cycles
FIFO_CYCLES = 3                     # then the RW's tile needs 3 cycles through the FIFO
MMC_CYCLES_PER_N = 2                # MMC: L + 2N (systolic fill and drain)
ACT_LATENCY_CYCLES = 1              # ACT: L + 1


# ------------------------------------------------------------------ encoding
def _problems(ins: Instruction) -> list[str]:
    """Why `ins` cannot be written in OpenTPU's format (empty when it can)."""
    if ins.key not in OPCODES:
        return [f"OpenTPU has no {ins.spec.long_name} ({ins.key}) instruction: "
                f"it has only {', '.join(sorted(OPCODES))}"]
    out = []
    letters = ins.flag_letters
    extra = "".join(c for c in letters if c not in ALLOWED_FLAGS.get(ins.key, ""))
    if extra:
        allowed = ALLOWED_FLAGS.get(ins.key, "")
        what = f"only {', '.join(allowed)}" if allowed else "none"
        out.append(f"OpenTPU's {ins.key} has no flag {', '.join(extra)} "
                   f"(OpenTPU allows {what} on {ins.key})")
    if ins.repeat > 1 and ins.key != "NOP":    # a repeated NOP is written out as NOPs
        out.append(f"OpenTPU has no repeat field (repeat={ins.repeat}): "
                   f"write the {ins.repeat} instructions out")
    fields = FIELDS[ins.key]
    length = ins.operands.get(fields.length) if fields.length else None
    if length is not None and length > MAX_LENGTH:
        out.append(f"length {length} does not fit OpenTPU's 1-byte length field "
                   f"(at most {MAX_LENGTH}): split the instruction")
    return out


def word_count(ins: Instruction) -> int:
    """How many OpenTPU instructions `ins` becomes: a NOP with repeat=R is R NOPs (a
    repeat on anything else does not fit the format), every other instruction one."""
    return ins.repeat if ins.key == "NOP" else 1


def _word(ins: Instruction) -> bytes:
    fields = FIELDS[ins.key]
    flags = sum(FLAG_BITS[c] for c in ins.flag_letters)
    word = (OPCODES[ins.key] << OPCODE_SHIFT) | (flags << FLAGS_SHIFT)
    if fields.length:
        word |= ins.operands[fields.length] << LENGTH_SHIFT
    if fields.addr:
        word |= ins.operands[fields.addr] << ADDR_SHIFT
    if fields.ub:
        word |= ins.operands[fields.ub] << UB_SHIFT
    return word.to_bytes(WORD_BYTES, "big")


def opentpu_errors(program: Program) -> list[tuple[int, str]]:
    """Every (instruction index, reason) that keeps `program` out of OpenTPU's format."""
    return [(i, msg) for i, ins in enumerate(program.instructions) for msg in _problems(ins)]


def check_opentpu(program: Program) -> None:
    """Raise unless `program` fits OpenTPU's format: an AssemblyError carrying every
    offending instruction's source position (EncodingError when the program has no source
    positions)."""
    errors = opentpu_errors(program)
    if errors:
        raise _encoding_failure(program, errors)


def to_opentpu_bytes(program: Program) -> bytes:
    """OpenTPU's binary for `program`, byte for byte what OpenTPU's assembler writes.

    A NOP with repeat=R becomes R NOPs.  Anything the format cannot hold raises as
    `check_opentpu` does.
    """
    check_opentpu(program)
    return b"".join(_word(ins) * word_count(ins)
                    for ins in program.instructions)


def _encoding_failure(program: Program, errors: list[tuple[int, str]]) -> Exception:
    located = [(program.locations[i], msg) for i, msg in errors]
    if all(loc is not None for loc, _ in located):
        diags = [Diagnostic(f"cannot write in OpenTPU format: {msg}", loc.file, loc.line,
                            loc.col, notes=("`--format opentpu` writes OpenTPU's 14-byte "
                                            "binary; spec/opentpu.md lists what it holds",))
                 for loc, msg in located]
        return AssemblyError(diags, program.sources)
    lines = [f"instruction {i}: {msg}" for i, msg in errors]
    return EncodingError("cannot write in OpenTPU format:\n  " + "\n  ".join(lines))


# ------------------------------------------------------------------ decoding
def _fail(index: int, message: str):
    raise BinaryFormatError(f"instruction {index} (byte {index * WORD_BYTES}): {message}")


def _decode_word(word: bytes, index: int) -> Instruction:
    value = int.from_bytes(word, "big")
    opcode = value >> OPCODE_SHIFT
    flags = (value >> FLAGS_SHIFT) & 0xFF
    length = (value >> LENGTH_SHIFT) & 0xFF
    addr = (value >> ADDR_SHIFT) & ((1 << ADDR_BITS) - 1)
    ub = value & ((1 << UB_BITS) - 1)
    key = KEY_BY_OPCODE.get(opcode)
    if key is None:
        _fail(index, f"invalid opcode 0x{opcode:02x} (OpenTPU's opcodes are 0-7: "
                     + ", ".join(f"{k}={v}" for k, v in OPCODES.items()) + ")")
    allowed = ALLOWED_FLAGS.get(key, "")
    letters = "".join(c for c, bit in FLAG_BITS.items() if flags & bit)
    unknown = flags & ~sum(FLAG_BITS.values())
    if unknown or any(c not in allowed for c in letters):
        bad = flags & ~sum(FLAG_BITS[c] for c in allowed)
        hint = " (OpenTPU implements no convolution)" if key == "MMC" and flags & FLAG_BITS["C"] else ""
        _fail(index, f"{key}: flag bits 0x{bad:02x} are not defined for {key}{hint}")
    if "R" in letters and "Q" in letters:
        _fail(index, "ACT: both ReLU (R) and sigmoid (Q) flags are set")
    fields = FIELDS[key]
    spec = ISA_TABLE.instructions[key]
    values = {"addr": addr, "ub": ub, "length": length}
    operands = {}
    for slot in ("addr", "ub", "length"):
        name = getattr(fields, slot)
        if name is None:
            if values[slot]:
                _fail(index, f"{key}: its unused {slot} field is {values[slot]}, not 0 "
                             "(is this really an OpenTPU binary?)")
            continue
        if slot == "length" and values[slot] == 0:
            _fail(index, f"{key}: length 0 (an OpenTPU length is 1..{MAX_LENGTH})")
        field = next(f for f in spec.fields if f.name == name)
        if not field.min <= values[slot] <= field.max:
            _fail(index, f"{key}: {name} {values[slot]} out of range {field.min}..{field.max}")
        operands[name] = values[slot]
    our_flags = spec.flag_bits(letters)
    return Instruction(key, our_flags, 1, operands)


def from_opentpu_bytes(data: bytes, shape: MachineShape | None = None) -> Program:
    """The Program in an OpenTPU binary; BinaryFormatError names what is wrong and where.

    OpenTPU binaries do not record the array size: `shape` gives it (default: OpenTPU's
    8 x 8 array with the opentpu profile).
    """
    data = bytes(data)
    if not data:
        raise BinaryFormatError("empty file: an OpenTPU program has at least one "
                                f"{WORD_BYTES}-byte instruction")
    if len(data) % WORD_BYTES:
        whole, rest = divmod(len(data), WORD_BYTES)
        raise BinaryFormatError(f"{len(data)} bytes is not a whole number of {WORD_BYTES}-byte "
                                f"OpenTPU instructions: instruction {whole} is truncated "
                                f"({rest} of {WORD_BYTES} bytes)")
    count = len(data) // WORD_BYTES
    check_allocation(f"{count:,} OpenTPU instructions", count * BYTES_PER_INSTRUCTION)
    instructions = [_decode_word(data[p:p + WORD_BYTES], p // WORD_BYTES)
                    for p in range(0, len(data), WORD_BYTES)]
    return Program(instructions, shape or MachineShape(array_size=8, profile="opentpu"))


def looks_like_opentpu(data: bytes) -> bool:
    """True when `data` is shaped like an OpenTPU binary: whole 14-byte words whose
    opcode bytes are 0-7 and whose flag bytes use only OpenTPU's five bits."""
    if not data or len(data) % WORD_BYTES or data[:len(MAGIC)] == MAGIC:
        return False
    mask = ~sum(FLAG_BITS.values()) & 0xFF
    return all(data[p] in KEY_BY_OPCODE and not data[p + 1] & mask
               for p in range(0, len(data), WORD_BYTES))


def is_opentpu_file(path) -> bool:
    """An OpenTPU binary by extension (`.out`) or by content."""
    from .files import read_input
    from .limits import MAX_BINARY_BYTES
    path = Path(path)
    if path.suffix == EXTENSION:
        return True
    try:
        data = read_input(path, what="binary", limit=MAX_BINARY_BYTES)
    except TpuasmError:
        return False
    return looks_like_opentpu(data)


def load_opentpu(path, shape: MachineShape | None = None) -> Program:
    """Read an OpenTPU binary; errors carry the file name."""
    from .files import read_input
    from .limits import MAX_BINARY_BYTES
    data = read_input(path, what="binary", limit=MAX_BINARY_BYTES, error=BinaryFormatError)
    try:
        return from_opentpu_bytes(data, shape)
    except BinaryFormatError as e:
        raise BinaryFormatError(f"{path}: {e}") from None


def to_opentpu_source(program: Program) -> str:
    """OpenTPU assembly text (`MMC.SO 0, 0, 10`, `#` comments) that OpenTPU's assembler and
    ours both read; raises like `to_opentpu_bytes` if the program does not fit."""
    from .disassembler import format_instruction
    check_opentpu(program)
    lines = ["# OpenTPU assembly, written by tpuasm"]
    for ins in program.instructions:
        text = format_instruction(Instruction(ins.key, ins.flags, 1, ins.operands))
        lines.extend([text] * word_count(ins))
    return "\n".join(lines) + "\n"


def opentpu_listing(program: Program) -> str:
    """Like `tpuasm asm --listing`, for the OpenTPU binary: one line per 14-byte word
    (index, byte address, the bytes in hex, the source line)."""
    check_opentpu(program)                      # raises with positions if it does not fit
    out = [f"{'index':>6}  {'addr':>8}  {'bytes':<{WORD_BYTES * 3 - 1}}  source"]
    k = 0
    for ins, loc in zip(program.instructions, program.locations):
        text = f"{loc.file}:{loc.line}  {program.source_line(loc)}" if loc is not None else ""
        word = " ".join(f"{b:02x}" for b in _word(ins))
        for _ in range(word_count(ins)):
            out.append(f"{k:>6}  {k * WORD_BYTES:08x}  {word}  {text}".rstrip())
            k += 1
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ Activate
# int(255 / (1 + exp(-x))) as OpenTPU computes it (Python floats, float64), for integer x:
# (first x, value) at each step; below the first step the value is 0.  Derivation and
# proof that float64 rounding cannot move any step: spec/opentpu.md and
# tests/test_opentpu_functions.py (which recomputes the steps in exact decimal arithmetic
# and with float64 math).  The last step is float64's: for x >= 37, exp(-x) < 2**-53, so
# 1 + exp(-x) rounds to exactly 1.0 and the quotient is 255.0, while every x <= 36 leaves
# 1 + exp(-x) >= 1 + 2**-52 and a quotient just below 255.
SIGMOID_STEPS = ((-5, 1), (-4, 4), (-3, 12), (-2, 30), (-1, 68), (0, 127), (1, 186),
                 (2, 224), (3, 242), (4, 250), (5, 253), (6, 254), (37, 255))
INT32_MIN = -(1 << 31)

# The same function as a lookup table over [SIGMOID_LO, SIGMOID_HI], constant outside:
# what a kernel indexes after clipping x (a table of 44 bytes).
SIGMOID_LO, SIGMOID_HI = SIGMOID_STEPS[0][0] - 1, SIGMOID_STEPS[-1][0]
_STEP_X = np.array([x for x, _ in SIGMOID_STEPS], dtype=np.int64)
_STEP_Y = np.array([0] + [y for _, y in SIGMOID_STEPS], dtype=np.uint8)
SIGMOID_TABLE = _STEP_Y[np.searchsorted(_STEP_X, np.arange(SIGMOID_LO, SIGMOID_HI + 1),
                                        side="right")]
SIGMOID_TABLE.setflags(write=False)


def opentpu_sigmoid(x) -> np.ndarray:
    """int(255 / (1 + exp(-x))) for int32 x, as OpenTPU's float64 code yields it.

    OpenTPU raises OverflowError for -2**31 < x <= -710 (exp overflows); there we give the
    limit, 0.  For x = -2**31 numpy's int32 negation wraps, exp(-x) is 0.0 and OpenTPU
    yields 255; so do we (spec/opentpu.md).
    """
    x = np.asarray(x, dtype=np.int64)
    out = _STEP_Y[np.searchsorted(_STEP_X, x, side="right")]
    return np.where(x == INT32_MIN, np.uint8(255), out)


# ------------------------------------------------------------------ data images
MATSIZES = (8, 16)


def _npy_shape(path, what: str) -> tuple[int, ...]:
    """The shape a .npy file declares, its header validated (tpuasm.files.npy_header)."""
    from .files import npy_header
    return npy_header(path, what=what).shape


def matsize_from_data(host=None, weights=None) -> int | None:
    """The array size N that OpenTPU's images imply: weights (tiles, N, N), host (rows, N).

    None when neither file is given; DataFileError when they disagree or are misshapen.
    """
    found = []
    if weights is not None:
        shape = _npy_shape(weights, "weight image")
        if len(shape) != 3 or shape[1] != shape[2]:
            raise DataFileError(f"{weights}: weight image has shape {shape}, "
                                "expected (tiles, N, N)")
        found.append((weights, shape[2]))
    if host is not None:
        shape = _npy_shape(host, "host image")
        if len(shape) != 2:
            raise DataFileError(f"{host}: host image has shape {shape}, expected (rows, N)")
        found.append((host, shape[1]))
    for path, n in found:            # OpenTPU's array is 8 x 8 or 16 x 16, nothing else
        if n not in MATSIZES:
            raise DataFileError(f"{path}: its shape implies an array size N = {n}, but "
                                f"OpenTPU's is {' or '.join(map(str, MATSIZES))} "
                                "(give --matsize, or --config array_size=N for a "
                                "larger array)")
    if not found:
        return None
    sizes = {n for _, n in found}
    if len(sizes) > 1:
        raise DataFileError("the host and weight images disagree on the array size: "
                            + ", ".join(f"{p} has N = {n}" for p, n in found))
    return found[0][1]


def shape_config(config: dict, profile: str | None = None, matsize: int | None = None,
                 host=None, weights=None) -> dict:
    """The `.config` settings the command line asks for: `config` (from --config) plus
    --profile and --matsize.  Under the opentpu profile without a size, N comes from the
    host and weight images (OpenTPU's files do not say it otherwise), else 8."""
    out = dict(config)
    if profile is not None:
        out["profile"] = profile
    if matsize is not None:
        out["array_size"] = matsize
    elif out.get("profile") == "opentpu" and "array_size" not in out:
        out["array_size"] = matsize_from_data(host, weights) or MATSIZES[0]
    return out

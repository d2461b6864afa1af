"""Every cap tpuasm puts on what a user's input can make it do, in one place.

The numbers are documented in spec/limits.md.  Two kinds of check live here:

- `check_int(what, value, lo, hi)`: an integer from any source (a `.config`, the command
  line, a manifest, a binary header, a `.npy` header) that sizes work or memory, checked
  before it is used.
- `check_allocation(what, nbytes)`: memory about to be allocated for user-sized data,
  checked against what this process can actually get (`memory_budget()`), so an
  oversized machine or image is a clear error instead of a MemoryError half way.

Both raise ResourceLimitError (a TpuasmError: exit status 2, never a traceback).
"""
from __future__ import annotations

import os

from .errors import ResourceLimitError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _env_int(name: str, default: int) -> int:
    from .environment import raw
    text = (raw(name) or "").strip()
    return int(text) if text.isdigit() and len(text) < 19 else default


# ---- input files (tpuasm.files.read_input refuses anything larger)
MAX_SOURCE_BYTES = 64 * MiB          # one .tasm file (the 100,000-line benchmark is ~3 MiB)
MAX_BINARY_BYTES = 256 * MiB         # a .tbin or OpenTPU binary
MAX_MANIFEST_BYTES = 1 * MiB         # a test.toml
MAX_MODEL_MANIFEST_BYTES = 64 * MiB  # an OUTDIR's manifest.json (an unrolled 64-step LSTM's IR
                                     # operators alone take 0.6 MiB)
MAX_SCRIPT_BYTES = 16 * MiB          # a debugger batch script
MAX_GRID_BYTES = 1 * MiB             # a sweep's --grid TOML
MAX_RESULTS_BYTES = 1 * GiB          # a sweep's results CSV read back (figure11 --from-csv)
MAX_NPY_HEADER_BYTES = 64 * KiB      # a .npy header (numpy's own default is 10,000)
MAX_NPY_DIMS = 8
MAX_SHIPPED_MODEL_BYTES = 4 * GiB    # a compiled model sent to Dask workers (`infer --workers`)
MAX_INFER_WORKERS = 1024             # `infer --workers`: local worker processes

# ---- the assembler
# Statements (and .rept iterations) one assembly may expand to: ~6 s and ~600 MB at the
# cap on this project's machines; the largest program in programs/ has 205, the assembler
# benchmark 100,000.  TPUASM_MAX_STATEMENTS lowers (or raises) it, e.g. for a sandbox.
MAX_STATEMENTS = _env_int("TPUASM_MAX_STATEMENTS", 1_000_000)
MAX_VALUE_BITS = 512                 # an expression's value (and every step on the way)
MAX_LITERAL_CHARS = 200              # an integer literal's text
MAX_DIAGNOSTICS = 100                # diagnostics kept and shown; the rest are counted
MAX_EXCERPT_CHARS = 160              # columns of a source line shown under a diagnostic
MAX_MESSAGE_CHARS = 400              # characters of one diagnostic's message

# ---- binaries: a decoded instruction costs about this much memory (Instruction objects)
BYTES_PER_INSTRUCTION = 600

# ---- running
MAX_CYCLES = 1 << 62                 # --max-cycles, a manifest's max_cycles (int64 cycles)
MAX_TIMING_CYCLES = 1 << 40          # a latency in cycles (MachineConfig)
MAX_RATE = 1e15                      # clock_hz, bytes per cycle (MachineConfig)

# ---- the debugger's expressions (`print`, `display`, `expect`, `watch COND`, break
# conditions): checked before anything is computed (debugger/expr_budget.py).  Reading a
# memory (`ub[0:99999999]`, `acc`) is a numpy view and costs nothing; what an expression
# computes from it is widened to int64, so one computed value of the cap is 32 MiB and an
# operator holds at most three (its two widened operands and its result).
MAX_EXPR_CHARS = 10_000              # an expression's text (the parser's tree grows with it)
MAX_EXPR_ELEMENTS = 1 << 22          # elements of one computed array (a whole 4096 x 256 acc fits)
MAX_EXPR_INT_BITS = 4096             # a computed integer (`2 ** 64 ** ...` would grow without end)

# ---- the compiler
MAX_BATCH = 1 << 16                  # `compile --batch`, an OUTDIR's batch (~0.5 GB of rows
#                                      for the corpus's models at the cap; 10**6 took 7 GB)
# `compile --input-shape`: the elements of one sample of an input it fixes (a few
# characters could otherwise ask for 2**31 x 2**31 values: 64 M float32 values are 256 MB)
MAX_GIVEN_SAMPLE_ELEMENTS = 1 << 26
# bytes of memory a compile needs per byte of model file: the weights as read, their
# float32 and float64 copies in quantization and in the golden check (8 bytes per int8
# weight), and the onnxruntime session of the reference model
COMPILE_BYTES_PER_MODEL_BYTE = 12

_ENV = "TPUASM_MEMORY_LIMIT"


def compile_bytes(model_bytes: int) -> int:
    """Memory a compile of a model file of this size needs (see COMPILE_BYTES_PER_MODEL_BYTE)."""
    return model_bytes * COMPILE_BYTES_PER_MODEL_BYTE


def check_int(what: str, value, lo: int, hi: int) -> int:
    """`value` as an int in lo..hi, else ResourceLimitError naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourceLimitError(f"{what}: not an integer: {value!r}")
    if not lo <= value <= hi:
        raise ResourceLimitError(f"{what} {value} out of range {lo}..{hi}")
    return value


def memory_budget() -> int:
    """Bytes one allocation of user-sized data may take: TPUASM_MEMORY_LIMIT if set (bytes,
    or with a K/M/G suffix), else the smaller of physical memory and what is left of the
    address-space limit (RLIMIT_AS), less a quarter for the interpreter, numba and
    everything else."""
    from .environment import raw
    env = (raw(_ENV) or "").strip()
    if env:
        parsed = parse_size(env)
        if parsed is None:
            raise ResourceLimitError(f"{_ENV}={env!r}: expected a number of bytes, "
                                     "e.g. 4G or 512M")
        return parsed
    limit = _physical_memory()
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:      # what is left of the address space
            limit = min(limit, max(soft - _address_space(), 0))
    except (ImportError, OSError, ValueError):
        pass
    return limit * 3 // 4


def _address_space() -> int:
    """This process's current virtual size (Linux), else 0."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * GiB


def parse_size(text: str) -> int | None:
    """'4G' -> 4 GiB, '512M', '100K', '12345' -> bytes; None when malformed."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}.get(text[-1:], 1)
    digits = text[:-1] if scale != 1 else text
    return int(digits) * scale if digits.isdigit() and len(digits) < 20 else None


def human_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} bytes"


def check_allocation(what: str, nbytes: int, budget: int | None = None) -> None:
    """Raise ResourceLimitError when `nbytes` (for `what`) exceeds the memory budget."""
    budget = memory_budget() if budget is None else budget
    if nbytes > budget:
        raise ResourceLimitError(
            f"{what} needs {human_bytes(nbytes)}, more than the {human_bytes(budget)} this "
            f"process can allocate (set {_ENV} to change the limit)")


def machine_bytes(array_size: int, ub_rows: int, acc_rows: int, host_rows: int = 0,
                  weight_tiles: int = 0) -> int:
    """What a machine of this shape allocates: the Unified Buffer (1 byte per element),
    the accumulators (4), the emulator's staging buffers (about 40 N*N + 24 KiB*N) and
    the host and weight images it copies."""
    n = array_size
    return (ub_rows * n + acc_rows * n * 4 + 40 * n * n + 24 * 1024 * n
            + host_rows * n + weight_tiles * n * n)


def check_machine(what: str, array_size: int, ub_rows: int, acc_rows: int,
                  host_rows: int = 0, weight_tiles: int = 0) -> None:
    """check_allocation for a machine of this shape, the parts named in the message."""
    need = machine_bytes(array_size, ub_rows, acc_rows, host_rows, weight_tiles)
    budget = memory_budget()
    if need > budget:
        n = array_size
        parts = [f"Unified Buffer {ub_rows:,} x {n:,} bytes",
                 f"accumulators {acc_rows:,} x {n:,} x 4 bytes"]
        if host_rows:
            parts.append(f"host image {host_rows:,} x {n:,} bytes")
        if weight_tiles:
            parts.append(f"weights {weight_tiles:,} x {n:,} x {n:,} bytes")
        check_allocation(f"{what} ({', '.join(parts)})", need, budget)

"""The compiler's back end as the pipeline and OUTDIR use it: the machine shape a model is
compiled for, one SegmentProgram per TPU segment (tpuasm.compiler.codegen), and the Weight
Memory check that comes before any weight is read."""
from __future__ import annotations

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.runtime.steps import TpuStep


CANNOT_HOLD = "the machine cannot hold it"     # the reason of a node too large for the shape


def machine_config(config: dict):
    from tpuasm.machine import MachineConfig
    try:
        return MachineConfig(**config)
    except TypeError as e:
        raise CompileError(f"--config: {e}") from None
    except ValueError as e:
        raise CompileError(f"--config: {e}") from None


def codegen_module():
    """The back end's module (an ImportError inside it is a bug to show, not a missing
    feature to hide)."""
    import importlib
    return importlib.import_module("tpuasm.compiler.codegen")


def generate_programs(steps, batch, machine, path="the model", fall_back: bool = False,
                      cuts: set | None = None) -> dict[str, str]:
    """The back end: one SegmentProgram per segment, for its rows (Segment.program_rows:
    the batch, or the segment's own fixed rows).  The back end's CodegenError (a segment
    the machine cannot hold: a Unified Buffer or accumulators too small for its images) and
    any other failure (a case it mishandles) are clear errors, or with `fall_back` their
    culprits are returned ({operator: why}) for the pipeline to put on the host.  With a
    `cuts` set, a segment too large only as a whole (each operator fits alone: YOLO's first
    three Convs with their SiLUs) is not sent to the host: the operators at which it must
    be cut into runs that fit are added to `cuts`, for the partition to split it there."""
    codegen = codegen_module()
    check_weight_memory(steps, machine.array_size, path, codegen)
    failed = {}

    def generate(segment):
        return codegen.generate(segment, segment.program_rows(batch),
                                array_size=machine.array_size,
                                ub_rows=machine.ub_rows, acc_rows=machine.acc_rows,
                                fifo_depth=machine.fifo_depth)

    for step in steps:
        if isinstance(step, TpuStep):
            try:
                step.program = generate(step.segment)
            except codegen.Refused as e:      # one operator, in this company: to the host
                if not fall_back:
                    raise CompileError(f"{step.name}: {e}") from None
                failed[e.operator] = f"the back end does not map it: {e}"
            except codegen.CodegenError as e:
                if not fall_back:
                    raise CompileError(f"{step.name}: {e}") from None
                split = _cuts_that_fit(step.segment, generate, codegen.CodegenError) \
                    if cuts is not None else None
                if split and not split <= cuts:
                    cuts.update(split)
                    continue
                failed.update(_culprits(step.segment, generate,
                                        f"{CANNOT_HOLD}: {_first_line(e)}",
                                        codegen.CodegenError))
            except Exception as e:    # noqa: BLE001 - a case the back end mishandles
                why = f"code generation failed ({type(e).__name__}: {_first_line(e)})"
                if not fall_back:
                    raise CompileError(f"{path}: {step.name}: {why}") from None
                failed.update(_culprits(step.segment, generate, why, codegen.CodegenError))
    return failed


def _culprits(segment, generate, why: str, capacity: type) -> dict[str, str]:
    """The operators of a failing segment that fail alone ({name: why}); all of them when
    none does (the failure needs their company)."""
    from tpuasm.compiler.ir import Segment
    found = {}
    for op in segment.operators:
        try:
            generate(Segment(f"{segment.name}_{op.name}", [op], list(dict.fromkeys(op.inputs)),
                             [op.output], segment.rows))
        except Exception as e:       # noqa: BLE001 - as above, operator by operator
            found[op.name] = (f"{CANNOT_HOLD}: {_first_line(e)}"
                              if isinstance(e, capacity) else
                              f"code generation failed ({type(e).__name__}: {_first_line(e)})")
    return found or {op.name: why for op in segment.operators}


def _cuts_that_fit(segment, generate, capacity: type) -> set[str] | None:
    """The operators that start each run when `segment`'s operators (in their order, which
    is the program's) are cut into the longest runs the machine holds; None when one
    operator alone does not fit (or the segment has one).  Each run is the longest prefix
    that fits, found by bisection: a run that fits still fits without its last operator."""
    ops = segment.operators
    if len(ops) < 2:
        return None

    def fits(run) -> bool:
        try:
            generate(_sub_segment(segment, run))
            return True
        except capacity:
            return False

    cuts, start = set(), 0
    while start < len(ops):
        lo, hi = start, len(ops)          # ops[start:lo] fits (lo == start: nothing yet)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(ops[start:mid]):
                lo = mid
            else:
                hi = mid - 1
        if lo == start:
            return None
        if start:
            cuts.add(ops[start].name)
        start = lo
    return cuts


def _sub_segment(segment, run):
    """The segment of the operators `run` (a slice of segment's): it reads what they read
    and do not make, and writes what the segment writes or its other operators read."""
    from tpuasm.compiler.ir import Segment
    made = {op.output.name for op in run}
    names = {op.name for op in run}
    read_elsewhere = {t.name for op in segment.operators if op.name not in names
                      for t in op.inputs}
    wanted = {t.name for t in segment.outputs} | read_elsewhere
    inputs = list(dict.fromkeys(t for op in run for t in op.inputs if t.name not in made))
    outputs = [op.output for op in run if op.output.name in wanted]
    return Segment(f"{segment.name}_{run[0].name}", list(run), inputs, outputs, segment.rows)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_weight_memory(steps, n: int, path, codegen) -> None:
    """Every segment's tiles together must fit the Weight Memory: checked from the shapes,
    before a weight is read or an image allocated; the error names the node that crosses."""
    tile_bytes = n * n
    limit = codegen.WEIGHT_MEMORY_BYTES // tile_bytes
    used = 0
    for step in steps:
        if not isinstance(step, TpuStep):
            continue
        for op in codegen.pack_segment(step.segment, n)[0].operators:
            used += codegen.weight_tiles(op, n)
            if used > limit:
                raise CompileError(
                    f"{path}: node {op.name}: the model's weights do not fit the Weight "
                    f"Memory: {used:,} tiles of {n} x {n} ({used * tile_bytes / 2**30:,.1f} "
                    f"GiB) by this node, the TPU's {codegen.WEIGHT_MEMORY_BYTES >> 30} GiB "
                    f"hold {limit:,}")


def room(machine):
    """The back end's capacity questions for `machine` (a MachineConfig), for the front
    end's banding (codegen/capacity.py Room)."""
    from tpuasm.compiler.codegen.capacity import Room
    return Room(machine.array_size, machine.ub_rows, machine.acc_rows)


def backend_support(op) -> str | None:
    """None when the back end maps the operator, else its reason (shown in the report)."""
    return codegen_module().supports(op)

"""The compiler's back end as the pipeline and OUTDIR use it: the machine shape a model is
compiled for, one SegmentProgram per TPU segment (tpuasm.compiler.codegen), and the Weight
Memory check that comes before any weight is read."""
from __future__ import annotations

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.runtime import TpuStep


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


def generate_programs(steps, batch, machine, path="the model") -> None:
    """The back end: one SegmentProgram per segment."""
    codegen = codegen_module()
    check_weight_memory(steps, machine.array_size, path, codegen)
    for step in steps:
        if isinstance(step, TpuStep):
            try:
                step.program = codegen.generate(
                    step.segment, batch, array_size=machine.array_size,
                    ub_rows=machine.ub_rows, acc_rows=machine.acc_rows,
                    fifo_depth=machine.fifo_depth)
            except codegen.CodegenError as e:
                raise CompileError(f"{step.name}: {e}") from None


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


def backend_support(op) -> str | None:
    """None when the back end maps the operator, else its reason (shown in the report)."""
    return codegen_module().supports(op)

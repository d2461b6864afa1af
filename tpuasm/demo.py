"""`tpuasm demo` (and `make demo`): a real multi-layer program, end to end.

Generates the data of programs/mlp3_relu (a 3-layer MLP, batch 100), assembles the
program, runs it on the emulator, prints the output next to what an independent numpy
model of the math expects, and the run's statistics.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from .errors import TpuasmError

PROGRAM = "mlp3_relu"


def find_program() -> Path:
    root = Path(__file__).resolve().parent.parent / "programs" / PROGRAM
    if not (root / f"{PROGRAM}.tasm").exists():
        raise TpuasmError(f"the demo needs the repository's programs/ folder ({root} not found); "
                          "run it from a clone of the repository")
    return root


def run_demo() -> int:
    from rich.console import Console

    from .assembler import assemble_file
    from .regression.runner import generate
    from .runreport import make_machine, print_summary

    console = Console(highlight=False)
    folder = find_program()
    source = folder / f"{PROGRAM}.tasm"
    with tempfile.TemporaryDirectory(prefix="tpuasm-demo-") as tmp:
        data = Path(tmp)
        generate(folder / "gen.py", data)
        program = assemble_file(source)
        console.print(f"[bold]{source.relative_to(folder.parent.parent)}[/]: "
                      f"{len(program)} instructions, N = {program.shape.array_size}; "
                      f"data from {PROGRAM}/gen.py (seeded)\n")
        machine = make_machine(program)
        machine.load(program, host=data / "host.npy", weights=data / "weights.npy")
        result = machine.run(max_cycles=10_000_000)
        print_summary(machine, name=source.name)
        if result.fault is not None:
            console.print(f"[red]fault:[/] {result.fault}")
            return 1
        expected = np.load(data / "y.npy", allow_pickle=False)
        y = program.symbol("host.y")
        got = machine.host[y.value:y.value + len(expected)].view(np.int8)[:, :expected.shape[1]]
        same = np.array_equal(got, expected)
        console.print(f"\noutput y = relu(relu(relu(x @ W1) @ W2) @ W3), requantized, "
                      f"first 3 of {len(expected)} rows, first 12 of {expected.shape[1]} columns:")
        for row in got[:3]:
            console.print("  " + " ".join(f"{v:4d}" for v in row[:12]) + "  ...")
        verdict = "[green]identical to[/]" if same else "[red]DIFFERENT from[/]"
        console.print(f"\nall {expected.size:,} output values are {verdict} the independent "
                      f"numpy model of the math (programs/tpu_oracle.py)")
        return 0 if same else 1

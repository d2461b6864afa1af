"""tpuasm: assembler, cycle-level emulator and debugger for Google's TPU v1.

The public API (imported lazily so that `tpuasm --help` does not pay for numba):
    assemble(source_or_path) -> Program
    Program.to_bytes() / Program.from_bytes() / load_binary(path)
    disassemble(program) -> str
    Machine, MachineConfig (tpuasm.machine)
    compile(model.onnx, batch=..., calibration=..., config=...) -> CompiledModel (tpuasm.compiler)
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "assemble": ("tpuasm.assembler", "assemble"),
    "disassemble": ("tpuasm.disassembler", "disassemble"),
    "Program": ("tpuasm.binary", "Program"),
    "MachineShape": ("tpuasm.binary", "MachineShape"),
    "load_binary": ("tpuasm.binary", "load_binary"),
    "Instruction": ("tpuasm.encoding", "Instruction"),
    "encode": ("tpuasm.encoding", "encode"),
    "decode": ("tpuasm.encoding", "decode"),
    "AssemblyError": ("tpuasm.errors", "AssemblyError"),
    "BinaryFormatError": ("tpuasm.errors", "BinaryFormatError"),
    "DataFileError": ("tpuasm.errors", "DataFileError"),
    "TpuasmError": ("tpuasm.errors", "TpuasmError"),
    "Machine": ("tpuasm.machine", "Machine"),
    "MachineConfig": ("tpuasm.machine", "MachineConfig"),
    "MachineFault": ("tpuasm.machine", "MachineFault"),
    "compile": ("tpuasm.compiler", "compile"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tpuasm' has no attribute {name!r}")

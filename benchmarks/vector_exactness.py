"""VADD / VMUL against onnxruntime's QLinearAdd / QLinearMul (com.microsoft): how often the
chip's integer fixed point gives onnxruntime's byte, and by how much it differs otherwise
(spec/isa.md 5.11).

    .venv/bin/python benchmarks/vector_exactness.py [--sets 2000] [--rows 4] [--seed 0]

Each set draws random scales and zero points (signed or unsigned, add, sub or mul), sets
the registers with tpuasm.machine.vector.qlinear_registers, and runs `rows` UB rows of
random operands through one VADD/VMUL of one program on the emulator; onnxruntime runs
the same operands with the same parameters (one-node models built with onnx.helper).
tests/test_vector_onnx.py runs a small version.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpuasm.binary import MachineShape, Program  # noqa: E402
from tpuasm.encoding import Instruction  # noqa: E402
from tpuasm.isa import ISA_TABLE  # noqa: E402
from tpuasm.machine import Machine  # noqa: E402
from tpuasm.machine.vector import qlinear_registers  # noqa: E402

OPS = ("add", "sub", "mul")


@dataclass
class Case:
    op: str
    unsigned: bool
    a_scale: float
    a_zero: int
    b_scale: float
    b_zero: int
    c_scale: float
    c_zero: int


def random_case(rng: np.random.Generator) -> Case:
    """Scales log-uniform over 2^-12..2^2; the output scale near what the operation's range
    needs (times 0.25..4), so that most results are not at the rails."""
    op = OPS[rng.integers(len(OPS))]
    unsigned = bool(rng.integers(2))
    lo, hi = (0, 255) if unsigned else (-128, 127)
    sa, sb = (float(np.float32(2.0 ** rng.uniform(-12, 2))) for _ in range(2))
    span = 127.0 * (sa * sb * 127.0 if op == "mul" else sa + sb)
    sc = float(np.float32(span / 127.0 * 2.0 ** rng.uniform(-2, 2)))
    za, zb, zc = (int(rng.integers(lo, hi + 1)) for _ in range(3))
    return Case(op, unsigned, sa, za, sb, zb, sc, zc)


def _session(op_type: str, unsigned: bool):
    import onnxruntime as ort
    from onnx import TensorProto, helper
    t = TensorProto.UINT8 if unsigned else TensorProto.INT8
    names = ["A", "A_scale", "A_zero_point", "B", "B_scale", "B_zero_point", "C_scale",
             "C_zero_point"]
    kinds = [t, TensorProto.FLOAT, t, t, TensorProto.FLOAT, t, TensorProto.FLOAT, t]
    inputs = [helper.make_tensor_value_info(n, k, [None] if n in "AB" else [])
              for n, k in zip(names, kinds)]
    node = helper.make_node(op_type, names, ["C"], domain="com.microsoft")
    graph = helper.make_graph([node], op_type, inputs,
                              [helper.make_tensor_value_info("C", t, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def onnxruntime_result(case: Case, a: np.ndarray, b: np.ndarray, sessions: dict) -> np.ndarray:
    """QLinearAdd / QLinearMul of a and b (a Sub as QLinearAdd of a and the negated-scale
    b is not expressible: onnxruntime's scales are positive, so a Sub is checked as
    QLinearAdd(a, b') with b' = 2*zb - b, the same real value -(b - zb) * sb)."""
    dtype = np.uint8 if case.unsigned else np.int8
    key = ("QLinearMul" if case.op == "mul" else "QLinearAdd", case.unsigned)
    if key not in sessions:
        sessions[key] = _session(*key)

    def f(v):
        return np.array(v, np.float32)

    def z(v):
        return np.array(v, dtype)

    return sessions[key].run(None, {
        "A": a.ravel(), "A_scale": f(case.a_scale), "A_zero_point": z(case.a_zero),
        "B": b.ravel(), "B_scale": f(case.b_scale), "B_zero_point": z(case.b_zero),
        "C_scale": f(case.c_scale), "C_zero_point": z(case.c_zero)})[0].reshape(a.shape)


def _ins(key, flags="", **operands):
    return Instruction(key, ISA_TABLE.instructions[key].flag_bits(flags), 1, operands)


def chip_results(cases: list[Case], a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Every case's VADD/VMUL in one program on the emulator: case i's operands are UB rows
    i*R.. of the A and B blocks, its result the same rows of the C block."""
    sets, rows = a.shape[0], a.shape[1] // n
    total = sets * rows
    code = [_ins("RHM", host=0, ub=0, length=total), _ins("RHM", host=total, ub=total,
                                                          length=total)]
    for i, case in enumerate(cases):
        for name, value in qlinear_registers(case.op, case.a_scale, case.a_zero, case.b_scale,
                                             case.b_zero, case.c_scale, case.c_zero).items():
            code.append(_ins("CFG", reg=ISA_TABLE.registers[name].index, value=value))
        key = "VMUL" if case.op == "mul" else "VADD"
        code.append(_ins(key, "U" if case.unsigned else "", a=i * rows, b=total + i * rows,
                         c=2 * total + i * rows, length=rows))
    code.append(_ins("HLT"))
    shape = MachineShape(array_size=n, ub_rows=3 * total, acc_rows=16, fifo_depth=4)
    program = Program(code, shape)
    host = np.concatenate([a.view(np.uint8).reshape(total, n),
                           b.view(np.uint8).reshape(total, n)])
    m = Machine.for_program(program)
    m.load(program, host=host)
    result = m.run()
    if result.status != "halted":
        raise RuntimeError(f"the vector program did not halt: {result}")
    return np.array(m.ub[2 * total:3 * total]).reshape(sets, rows * n)


def measure(sets: int = 2000, rows: int = 4, seed: int = 0, n: int = 256) -> dict:
    """{'elements', 'identical', 'max_lsb', 'by_op': {op: (elements, identical, max)},
    'off_rails': share of onnxruntime results strictly inside the type's range}."""
    rng = np.random.default_rng(seed)
    cases = [random_case(rng) for _ in range(sets)]
    raw = rng.integers(0, 256, size=(2, sets, rows * n), dtype=np.uint8)
    a, b = raw[0], raw[1]
    chip = chip_results(cases, a, b, n)
    sessions: dict = {}
    diffs, by_op, inside = [], {}, 0
    for i, case in enumerate(cases):
        dtype = np.uint8 if case.unsigned else np.int8
        ai, bi = a[i].view(dtype), b[i].view(dtype)
        if case.op == "sub":        # the same real value: -(b - zb) * sb = (b' - zb) * sb
            bi = np.clip(2 * case.b_zero - bi.astype(np.int64), *_limits(dtype)).astype(dtype)
            keep = (2 * case.b_zero - b[i].view(dtype).astype(np.int64) == bi)
        else:
            keep = np.ones(ai.shape, bool)
        want = onnxruntime_result(case, ai, bi, sessions).astype(np.int64)[keep]
        got = chip[i].view(dtype).astype(np.int64)[keep]
        lo, hi = _limits(dtype)
        inside += int(np.count_nonzero((want > lo) & (want < hi)))
        d = np.abs(got - want)
        diffs.append(d)
        e, s, mx = by_op.get(case.op, (0, 0, 0))
        by_op[case.op] = (e + d.size, s + int(np.count_nonzero(d == 0)),
                          max(mx, int(d.max(initial=0))))
    d = np.concatenate(diffs)
    return {"elements": int(d.size), "identical": float(np.mean(d == 0)),
            "max_lsb": int(d.max(initial=0)), "by_op": by_op,
            "off_rails": inside / max(1, d.size)}


def _limits(dtype):
    return (0, 255) if dtype == np.uint8 else (-128, 127)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    r = measure(args.sets, args.rows, args.seed)
    print(f"{r['elements']} elements in {args.sets} random parameter sets "
          f"({100 * r['off_rails']:.1f} % of onnxruntime's results off the rails)")
    print(f"identical: {100 * r['identical']:.4f} %   max difference: {r['max_lsb']} LSB")
    for op, (e, s, mx) in sorted(r["by_op"].items()):
        print(f"  {op}: {e} elements, {100 * s / e:.4f} % identical, max {mx} LSB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""VADD / VMUL against onnxruntime's QLinearAdd / QLinearMul (com.microsoft): how often the
chip's integer fixed point gives onnxruntime's byte, and by how much it differs otherwise
(spec/isa.md 5.11).  With --wide, the 16-bit operands (flags X, Y, Z) against
DequantizeLinear -> Add / Sub / Mul -> QuantizeLinear in onnxruntime (opset 21, int16 QDQ:
onnxruntime has no int16 QLinearAdd / QLinearMul).

    .venv/bin/python benchmarks/vector_exactness.py [--sets 2000] [--rows 4] [--seed 0] [--wide]

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
    wide: str = ""          # the 16-bit operands' flags among X (A), Y (B), Z (C)

    def dtype(self, operand: str):
        """The numpy type of operand "a", "b" or "c"."""
        if "XYZ"["abc".index(operand)] in self.wide:
            return np.int16
        return np.uint8 if self.unsigned else np.int8


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


def random_wide_case(rng: np.random.Generator) -> Case:
    """As random_case with at least one 16-bit operand (random X, Y, Z): int16 zero points
    within 500 codes of 0 (a calibrated int16 tensor's are small), the 8-bit operands int8
    or uint8 (U; not with all three 16-bit), scales log-uniform over 2^-16..1."""
    op = OPS[rng.integers(len(OPS))]
    wide = ""
    while not wide:
        wide = "".join(c for c in "XYZ" if rng.random() < 0.5)
    unsigned = wide != "XYZ" and bool(rng.integers(2))
    case = Case(op, unsigned, 0, 0, 0, 0, 0, 0, wide)
    reach = {x: 32767.0 if case.dtype(x) == np.int16 else 127.0 for x in "abc"}
    sa, sb = (float(np.float32(2.0 ** rng.uniform(-16, 0))) for _ in range(2))
    span = sa * reach["a"] * sb * reach["b"] if op == "mul" else sa * reach["a"] + sb * reach["b"]
    sc = float(np.float32(span / reach["c"] * 2.0 ** rng.uniform(-2, 2)))

    def zero(x):
        if case.dtype(x) == np.int16:
            return int(rng.integers(-500, 501))
        lo, hi = _limits(case.dtype(x))
        return int(rng.integers(lo, hi + 1))

    return Case(op, unsigned, sa, zero("a"), sb, zero("b"), sc, zero("c"), wide)


def qdq_result(case: Case, a: np.ndarray, b: np.ndarray, sessions: dict) -> np.ndarray:
    """DequantizeLinear(A), DequantizeLinear(B) -> Add / Sub / Mul -> QuantizeLinear: the
    float32 graph onnxruntime runs for a QDQ model of the case's types (opset 21: int16),
    one session per operation and types (scales and zero points are inputs)."""
    key = (case.op,) + tuple(np.dtype(case.dtype(x)).name for x in "abc")
    if key not in sessions:
        sessions[key] = _qdq_session(case)
    def f32(v):
        return np.array(v, np.float32)

    return sessions[key].run(None, {
        "A": a, "B": b, "sa": f32(case.a_scale), "sb": f32(case.b_scale),
        "sc": f32(case.c_scale), "za": np.array(case.a_zero, case.dtype("a")),
        "zb": np.array(case.b_zero, case.dtype("b")),
        "zc": np.array(case.c_zero, case.dtype("c"))})[0]


def _qdq_session(case: Case):
    import onnxruntime as ort
    from onnx import TensorProto, helper
    types = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8,
             np.int16: TensorProto.INT16}
    ta, tb, tc = (types[case.dtype(x)] for x in "abc")
    inputs = [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in (
        ("A", ta, [None]), ("B", tb, [None]), ("sa", TensorProto.FLOAT, []),
        ("za", ta, []), ("sb", TensorProto.FLOAT, []), ("zb", tb, []),
        ("sc", TensorProto.FLOAT, []), ("zc", tc, []))]
    nodes = [helper.make_node("DequantizeLinear", ["A", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["B", "sb", "zb"], ["fb"]),
             helper.make_node(case.op.capitalize(), ["fa", "fb"], ["fc"]),
             helper.make_node("QuantizeLinear", ["fc", "sc", "zc"], ["C"])]
    graph = helper.make_graph(nodes, "qdq", inputs,
                              [helper.make_tensor_value_info("C", tc, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    # onnxruntime would fuse DQ -> op -> Q into its QLinear kernels where it has them: keep
    # the graph as written (the float32 arithmetic a QDQ model means)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


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


def to_rows(values: np.ndarray, wide: bool, n: int) -> np.ndarray:
    """Vectors of n values as UB rows: a byte each, or (wide) a low bytes row and a high
    bytes row per vector, as VADD / VMUL with X, Y, Z read and write them."""
    v = np.asarray(values, np.int64).reshape(-1, n)
    if not wide:
        return (v & 0xFF).astype(np.uint8)
    pairs = v.astype(np.int16).view(np.uint8).reshape(-1, n, 2)
    return np.ascontiguousarray(pairs.transpose(0, 2, 1)).reshape(-1, n)


def from_rows(rows: np.ndarray, dtype, n: int) -> np.ndarray:
    """The values of UB rows written as `dtype` (to_rows undone)."""
    rows = np.asarray(rows, np.uint8).reshape(-1, n)
    if dtype != np.int16:
        return rows.view(dtype).astype(np.int64).ravel()
    low, high = rows[0::2].astype(np.int64), rows[1::2].astype(np.int64)
    v = low | (high << 8)
    return (v - ((v & 0x8000) << 1)).ravel()


def chip_results(cases: list[Case], a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Every case's VADD/VMUL in one program on the emulator: case i's operand values a[i],
    b[i] (rows of n, as the case's types hold them) in UB rows of their own, the results
    (sets, values) read back as the case's C type."""
    blocks, code, at = [], [], 0
    placed = []
    for i, case in enumerate(cases):
        rows = {}
        for name, values in (("a", a[i]), ("b", b[i])):
            block = to_rows(values, case.dtype(name) == np.int16, n)
            rows[name] = at
            blocks.append(block)
            at += len(block)
        rows["c"] = at
        c_rows = len(to_rows(a[i], case.dtype("c") == np.int16, n))
        at += c_rows
        blocks.append(np.zeros((c_rows, n), np.uint8))
        placed.append(rows)
    for case, rows, values in zip(cases, placed, a):
        for name, value in qlinear_registers(case.op, case.a_scale, case.a_zero, case.b_scale,
                                             case.b_zero, case.c_scale, case.c_zero).items():
            code.append(_ins("CFG", reg=ISA_TABLE.registers[name].index, value=value))
        key = "VMUL" if case.op == "mul" else "VADD"
        code.append(_ins(key, ("U" if case.unsigned else "") + case.wide,
                         length=len(values) // n, **rows))
    host = np.concatenate(blocks)
    code = [_ins("RHM", host=0, ub=0, length=len(host))] + code + [_ins("HLT")]
    shape = MachineShape(array_size=n, ub_rows=len(host), acc_rows=16, fifo_depth=4)
    program = Program(code, shape)
    m = Machine.for_program(program)
    m.load(program, host=host)
    result = m.run()
    if result.status != "halted":
        raise RuntimeError(f"the vector program did not halt: {result}")
    out = []
    for case, rows, values in zip(cases, placed, a):
        c_rows = len(to_rows(values, case.dtype("c") == np.int16, n))
        out.append(from_rows(m.ub[rows["c"]:rows["c"] + c_rows], case.dtype("c"), n))
    return np.stack(out)


def _random_values(rng, dtype, count):
    lo, hi = _limits(dtype)
    return rng.integers(lo, hi + 1, count)


def measure(sets: int = 2000, rows: int = 4, seed: int = 0, n: int = 256,
            wide: bool = False) -> dict:
    """{'elements', 'identical', 'max_lsb', 'by_op': {op: (elements, identical, max)},
    'off_rails': share of onnxruntime results strictly inside the type's range}.  wide:
    16-bit combinations against onnxruntime's QDQ float graph (by_op then keyed by
    operation and flags, e.g. "mul.YZ")."""
    rng = np.random.default_rng(seed)
    cases = [(random_wide_case if wide else random_case)(rng) for _ in range(sets)]
    if wide:
        a = np.stack([_random_values(rng, c.dtype("a"), rows * n) for c in cases])
        b = np.stack([_random_values(rng, c.dtype("b"), rows * n) for c in cases])
    else:                       # random bytes, as the measurement in spec/isa.md drew them
        raw = rng.integers(0, 256, size=(2, sets, rows * n), dtype=np.uint8)
        a, b = ([r.view(c.dtype(x)).astype(np.int64) for r, c in zip(raw[k], cases)]
                for k, x in ((0, "a"), (1, "b")))
    chip = chip_results(cases, a, b, n)
    sessions: dict = {}
    diffs, by_op, inside = [], {}, 0
    for i, case in enumerate(cases):
        ai, bi = a[i].astype(case.dtype("a")), b[i].astype(case.dtype("b"))
        keep = np.ones(ai.shape, bool)
        if wide:
            want = qdq_result(case, ai, bi, sessions).astype(np.int64)
        else:
            if case.op == "sub":    # the same real value: -(b - zb) * sb = (b' - zb) * sb
                flipped = 2 * case.b_zero - bi.astype(np.int64)
                bi = np.clip(flipped, *_limits(bi.dtype)).astype(bi.dtype)
                keep = flipped == bi
            want = onnxruntime_result(case, ai, bi, sessions).astype(np.int64)
        want, got = want[keep], chip[i][keep]
        lo, hi = _limits(case.dtype("c"))
        inside += int(np.count_nonzero((want > lo) & (want < hi)))
        d = np.abs(got - want)
        diffs.append(d)
        key = f"{case.op}.{case.wide}" if wide else case.op
        e, s, mx = by_op.get(key, (0, 0, 0))
        by_op[key] = (e + d.size, s + int(np.count_nonzero(d == 0)),
                      max(mx, int(d.max(initial=0))))
    d = np.concatenate(diffs)
    return {"elements": int(d.size), "identical": float(np.mean(d == 0)),
            "max_lsb": int(d.max(initial=0)), "by_op": by_op,
            "off_rails": inside / max(1, d.size)}


def _limits(dtype):
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wide", action="store_true",
                        help="16-bit operands (X, Y, Z) against onnxruntime's int16 QDQ graph")
    args = parser.parse_args(argv)
    r = measure(args.sets, args.rows, args.seed, wide=args.wide)
    print(f"{r['elements']} elements in {args.sets} random parameter sets "
          f"({100 * r['off_rails']:.1f} % of onnxruntime's results off the rails)")
    print(f"identical: {100 * r['identical']:.4f} %   max difference: {r['max_lsb']} LSB")
    for op, (e, s, mx) in sorted(r["by_op"].items()):
        print(f"  {op}: {e} elements, {100 * s / e:.4f} % identical, max {mx} LSB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

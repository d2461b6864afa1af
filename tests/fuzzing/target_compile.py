"""Fuzz target `compile`: `tpuasm compile` on mutated ONNX models.

A case is one line of JSON (the command's flags and the calibration array's shape), a
newline, then the model's bytes.  Seeds are small valid models built with onnx.helper
(float MLP and convolution, QDQ MatMul and Conv); mutations reach bytes, shapes,
attributes, initializers, opsets, element types and the graph's wiring.

Promises checked (besides harness.verdict's exit code and no traceback): the model file
is unchanged; a refused compile prints one error and leaves no OUTDIR and no temporary
folder beside it; a compile that succeeds leaves an OUTDIR that loads.
"""
from __future__ import annotations

import contextlib
import io
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SEEDS: list[tuple[bytes, list | None]] | None = None     # (model, calibration shape)


def seeds() -> list[tuple[bytes, list | None]]:
    global _SEEDS
    if _SEEDS is None:
        sys.path.insert(0, str(ROOT / "tests"))
        import float_models
        from qdq_builder import QDQBuilder
        out = []
        out.append((float_models.build([("gemm", 8), ("relu",)], (16,)).SerializeToString(),
                    [8, 16]))
        out.append((float_models.build([("conv", 3, 3, 1, 1), ("relu",)], (2, 5, 5))
                    .SerializeToString(), [6, 2, 5, 5]))
        b = QDQBuilder((8,), rows=8)
        b.quantize()
        b.matmul(4)
        b.unary("Relu")
        out.append((b.model().SerializeToString(), None))
        b = QDQBuilder((2, 5, 5), rows=8)
        b.quantize()
        b.conv(3, (3, 3), pads=[1, 1, 1, 1])
        b.unary("Relu")
        out.append((b.model().SerializeToString(), None))
        _SEEDS = out
    return _SEEDS


_DIMS = [0, 1, 2, 3, 4, 7, 16, -1, 1 << 20, (1 << 31) - 1, 1 << 40]
_OPS = ["Gemm", "MatMul", "Conv", "Relu", "Add", "Mul", "Reshape", "Flatten", "Softmax",
        "QuantizeLinear", "DequantizeLinear", "MaxPool", "Bogus", "Identity", "Concat", ""]
_OPSETS = [0, 1, 7, 10, 11, 13, 17, 19, 21, 99, 10 ** 6]
_ELEM = [0, 1, 2, 3, 6, 7, 8, 10, 11, 16, 17, 40]


def _edge_array(rng, np, like):
    kind = rng.randrange(7)
    shape = like.shape
    if kind == 0:
        return np.full(shape, rng.choice([np.nan, np.inf, -np.inf]), like.dtype) \
            if like.dtype.kind == "f" else like
    if kind == 1:                                   # another shape
        return np.zeros(tuple(rng.choice([0, 1, 2, 3, 5, 9]) for _ in range(rng.randint(0, 4))),
                        like.dtype)
    if kind == 2:
        return np.zeros(shape, like.dtype)          # zero scales, zero weights
    if kind == 3 and like.dtype.kind == "f":
        return (-np.abs(like) - 1).astype(like.dtype)   # negative scales
    if kind == 4:
        return like.astype(rng.choice([np.float64, np.int64, np.int8, np.uint8, np.int32,
                                       np.float16, np.bool_]))
    if kind == 5 and like.dtype.kind == "f" and like.size:
        v = like.copy().reshape(-1)
        v[rng.randrange(v.size)] = rng.choice([1e38, -1e38, 1e-45, np.nan])
        return v.reshape(shape)
    return np.array(rng.choice([0, 1, -1, 127, 255, 1 << 30])).astype(like.dtype)   # scalar


def _mutate_model(rng: random.Random, model) -> None:
    import numpy as np
    from onnx import AttributeProto, helper, numpy_helper
    g = model.graph
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(9)
        if op == 0:                                         # shapes of inputs/outputs
            vi = rng.choice(list(g.input) + list(g.output))
            dims = vi.type.tensor_type.shape.dim
            choice = rng.randrange(4)
            if choice == 0 and len(dims):
                d = dims[rng.randrange(len(dims))]
                if rng.random() < 0.7:
                    d.dim_value = rng.choice(_DIMS) if rng.choice(_DIMS) >= 0 else 0
                else:
                    d.dim_param = rng.choice(["N", "K", "", "batch"])
            elif choice == 1:
                dims.add().dim_value = rng.choice([1, 2, 3])
            elif choice == 2 and len(dims):
                del dims[rng.randrange(len(dims))]
            else:
                vi.type.tensor_type.ClearField("shape")
        elif op == 1:                                       # attributes
            nodes = [n for n in g.node if len(n.attribute)] or list(g.node)
            n = rng.choice(nodes)
            if len(n.attribute) and rng.random() < 0.7:
                a = n.attribute[rng.randrange(len(n.attribute))]
                if a.type == AttributeProto.INTS and len(a.ints):
                    a.ints[rng.randrange(len(a.ints))] = rng.choice(_DIMS + [-5])
                    if rng.random() < 0.3:
                        a.ints.append(rng.choice([0, 1, 2]))
                elif a.type == AttributeProto.INT:
                    a.i = rng.choice(_DIMS + [-5])
                elif a.type == AttributeProto.FLOAT:
                    a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0, 1e30])
                elif rng.random() < 0.5:
                    del n.attribute[rng.randrange(len(n.attribute))]
            else:
                name = rng.choice(["kernel_shape", "strides", "pads", "group", "axis",
                                   "transA", "transB", "alpha", "dilations", "auto_pad",
                                   "bogus"])
                value = rng.choice([[0], [1, 1], [-1, 3], 0, 2, 1.5, "SAME_UPPER", "x",
                                    [1 << 31, 1]])
                n.attribute.append(helper.make_attribute(name, value))
        elif op == 2 and len(g.initializer):                # initializers
            i = rng.randrange(len(g.initializer))
            t = g.initializer[i]
            if rng.random() < 0.8:
                try:
                    arr = numpy_helper.to_array(t)
                except ValueError:                  # an earlier mutation cut its data
                    continue
                with np.errstate(all="ignore"):     # NaN cast to int: wanted, not news
                    t.CopyFrom(numpy_helper.from_array(np.asarray(_edge_array(rng, np, arr)),
                                                       t.name))
            elif rng.random() < 0.5:
                t.dims[:] = [rng.choice(_DIMS[:8]) for _ in range(rng.randint(0, 3))]
            else:
                t.data_type = rng.choice(_ELEM)
        elif op == 3:                                       # opsets
            o = model.opset_import[0] if len(model.opset_import) else model.opset_import.add()
            if rng.random() < 0.8:
                o.version = rng.choice(_OPSETS)
            else:
                o.domain = rng.choice(["ai.onnx.ml", "com.microsoft", "bogus", ""])
            if rng.random() < 0.2:
                model.ir_version = rng.choice([0, 1, 3, 7, 8, 10, 99])
        elif op == 4 and len(g.node):                       # operator types
            g.node[rng.randrange(len(g.node))].op_type = rng.choice(_OPS)
        elif op == 5 and len(g.node):                       # the wiring
            n = g.node[rng.randrange(len(g.node))]
            names = [x for m in g.node for x in m.output] + [t.name for t in g.initializer] \
                + ["x", "nope", ""]
            if len(n.input) and rng.random() < 0.6:
                n.input[rng.randrange(len(n.input))] = rng.choice(names)
            elif len(n.output):
                n.output[0] = rng.choice(names)
        elif op == 6 and len(g.node) > 1:                   # drop or repeat a node
            i = rng.randrange(len(g.node))
            if rng.random() < 0.5:
                del g.node[i]
            else:
                g.node.insert(rng.randrange(len(g.node)), g.node[i])
        elif op == 7:                                       # element types
            vi = rng.choice(list(g.input) + list(g.output))
            vi.type.tensor_type.elem_type = rng.choice(_ELEM)
        else:                                               # another graph input
            g.input.append(helper.make_tensor_value_info(
                rng.choice(["x2", "x", g.initializer[0].name if len(g.initializer) else "w"]),
                1, [rng.choice(["N", 1, 4]), rng.choice([1, 8, 16])]))


def gen_compile(rng: random.Random) -> bytes:
    import onnx
    from targets import _mutate_bytes
    data, calib = rng.choice(seeds())
    r = rng.random()
    if r < 0.15:
        pass                                    # the seed as it is: only flags vary
    elif r < 0.7:
        model = onnx.load_from_string(data)
        _mutate_model(rng, model)
        data = model.SerializeToString()
    if r >= 0.6 and rng.random() < 0.5 or r >= 0.7:
        data = _mutate_bytes(rng, data, 3)
    flags = []
    if rng.random() < 0.5:
        flags += ["--batch", rng.choice(["1", "4", "0", "-3", "x", "1000000000000", "64",
                                         "3"])]
    if rng.random() < 0.15:
        flags += ["--config", rng.choice(["array_size=8", "array_size=0", "ub_rows=1",
                                          "bogus=1", "array_size=1000000", "=", "x"])]
    if rng.random() < 0.1:
        flags += [rng.choice(["--per-tensor", "--symmetric-activations"])]
    if rng.random() < 0.1:
        flags += ["--calibration-method", rng.choice(["entropy", "percentile", "minmax"])]
    if rng.random() < 0.1:
        flags += ["--keep-float", rng.choice(["Relu", "MatMul", "nope", ",", "Gemm,Conv"])]
    if rng.random() < 0.1:
        flags += ["--batch-axis", rng.choice(["x=0", "x=1", "x=none", "x=9", "y=0", "x"])]
    if rng.random() < 0.6:
        flags += ["--no-validate"]              # validation's onnxruntime run is the slow part
    if calib is not None and rng.random() < 0.2:
        calib = list(calib)
        calib[rng.randrange(len(calib))] = rng.choice([0, 1, 3, 9])
    elif calib is None and rng.random() < 0.1:
        calib = [4, 8]
    if rng.random() < 0.05:
        calib = None
    head = {"flags": flags, "calib": calib, "calib_kind": rng.choice(["npy"] * 8 + ["npz",
                                                                                    "junk"])}
    return json.dumps(head).encode() + b"\n" + data


def run_compile(case: bytes, tmp: Path) -> int:
    """`tpuasm compile m.onnx -o OUT [--calibrate c.npy] FLAGS -q`, then the promises."""
    import shutil
    import numpy as np
    from tpuasm.cli import main
    head, _, data = case.partition(b"\n")
    spec = json.loads(head)
    work = tmp / "compile"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    model = work / "m.onnx"
    model.write_bytes(data)
    args = ["compile", str(model), "-o", str(work / "OUT"), "-q", *spec["flags"]]
    if spec["calib"] is not None:
        x = np.random.default_rng(0).normal(0, 1, spec["calib"]).astype(np.float32)
        kind = spec["calib_kind"]
        path = work / ("c.npz" if kind == "npz" else "c.npy")
        if kind == "npz":
            np.savez(path, x=x)
        elif kind == "junk":
            path.write_bytes(b"\x93NUMPY junk")
        else:
            np.save(path, x)
        args += ["--calibrate", str(path)]
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            code = main(args)
    finally:
        print(printed.getvalue(), end="")        # to the worker's capture
    problems = check_output(code, printed.getvalue())
    assert not problems, "\n".join(problems)
    for name, content in before.items():
        assert (work / name).read_bytes() == content, f"compile changed its input {name}"
    left = sorted(p.name for p in work.iterdir() if p.name not in before)
    if code == 0:
        from tpuasm.compiler import load
        assert left == ["OUT"], f"a compile that succeeded left {left}"
        load(work / "OUT")
    else:
        assert not left, f"a refused compile left {left}"
    return code


def check_output(code: int, text: str) -> list[str]:
    """The target's own judgement of what was printed: one error message when refused,
    and no Python warning (issue 24: NaN weights came with RuntimeWarnings)."""
    problems = []
    if code == 2 and sum("error" in line.lower() for line in text.splitlines()
                         if line.strip()) != 1:
        problems.append(f"a refusal is not one error message:\n{text[-1500:]}")
    if "Warning:" in text:
        problems.append(f"a Python warning reached the user:\n{text[-1500:]}")
    return problems


def warm_cases() -> list[bytes]:
    """Each seed compiled as it is (with and without validation): onnxruntime's and the
    compiler's imports and first runs are not charged to the first fuzz case."""
    out = []
    for data, calib in seeds():
        for flags in ([], ["--no-validate"]):
            head = {"flags": ["--batch", "4", *flags], "calib": calib, "calib_kind": "npy"}
            out.append(json.dumps(head).encode() + b"\n" + data)
    return out

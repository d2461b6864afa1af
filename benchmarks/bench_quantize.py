"""Agreement with the float model: onnxruntime's default quantization (quantize_static, QDQ,
every operator it knows quantized) against tpuasm's (only the nodes the TPU takes, the host
parts float), on small float models built here with random weights: a CNN with
BatchNormalization, an LSTM and a GRU classifier (32 steps, unrolled by prepare.py).  Prints
per model the top-1 agreement of each with onnxruntime on the float model, the SNR of the
logits, the Gemm/Conv nodes on the TPU and the compile time (float model -> CompiledModel,
back end included).  onnxruntime has no QDQ form of LSTM/GRU: its default leaves them float
(on the host), where tpuasm quantizes every gate product of the unrolled steps for the TPU.

    .venv/bin/python benchmarks/bench_quantize.py [--rows 512] [--steps 32]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _t(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


def cnn(rng, rows):
    c = 16
    inits = [_t("w1", rng.normal(0, 0.3, (c, 3, 3, 3))), _t("b1", np.zeros(c)),
             _t("g", rng.uniform(0.5, 1.5, c)), _t("be", rng.normal(0, 0.2, c)),
             _t("mu", rng.normal(0, 0.3, c)), _t("var", rng.uniform(0.5, 2, c)),
             _t("w2", rng.normal(0, 0.1, (c, c, 3, 3))), _t("fw", rng.normal(0, 0.5, (10, c))),
             _t("fb", np.zeros(10))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"],
                              name="bn"),
             helper.make_node("Relu", ["n1"], ["r1"], name="r1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="c2"),
             helper.make_node("HardSwish", ["c2"], ["h2"], name="hs"),
             helper.make_node("GlobalAveragePool", ["h2"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["fl"], name="flat"),
             helper.make_node("Gemm", ["fl", "fw", "fb"], ["y"], transB=1, name="fc")]
    g = helper.make_graph(nodes, "cnn", [_f("x", ["N", 3, 12, 12])], [_f("y", ["N", 10])], inits)
    return g, rng.normal(0, 1, (rows, 3, 12, 12)).astype(np.float32)


def recurrent(kind, steps):
    def build(rng, rows):
        i, h, gates = 16, 64, 4 if kind == "LSTM" else 3
        inits = [_t("W", rng.normal(0, 0.3, (1, gates * h, i))),
                 _t("R", rng.normal(0, 0.15, (1, gates * h, h))),
                 _t("B", rng.normal(0, 0.1, (1, 2 * gates * h))),
                 _t("fw", rng.normal(0, 1, (h, 10))), _t("fb", np.zeros(10)),
                 numpy_helper.from_array(np.array([0], np.int64), "ax0")]
        outs = ["", "yh", ""] if kind == "LSTM" else ["", "yh"]
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="seq"),
                 helper.make_node(kind, ["xt", "W", "R", "B"], outs, hidden_size=h, name="rnn"),
                 helper.make_node("Squeeze", ["yh", "ax0"], ["hl"], name="last"),
                 helper.make_node("MatMul", ["hl", "fw"], ["m"], name="fc"),
                 helper.make_node("Add", ["m", "fb"], ["y"], name="fc_bias")]
        g = helper.make_graph(nodes, kind, [_f("x", ["N", steps, i])], [_f("y", ["N", 10])],
                              inits)
        return g, rng.normal(0, 1, (rows, steps, i)).astype(np.float32)
    return build


def ort_default(path: Path, x: np.ndarray, out: Path) -> np.ndarray:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    from tpuasm.compiler.ort import session

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.done = False

        def get_next(self):
            if self.done:
                return None
            self.done = True
            return {"x": x}
    quantize_static(str(path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return session(onnx.load(str(out))).run(None, {"x": x})[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    import logging

    import tpuasm
    from tpuasm.compiler.ort import session
    logging.getLogger().setLevel(logging.ERROR)
    models = {"CNN + BatchNorm": cnn, f"LSTM x{args.steps}": recurrent("LSTM", args.steps),
              f"GRU x{args.steps}": recurrent("GRU", args.steps)}
    print(f"{'model':<16} {'onnxruntime all ops':>20} {'tpuasm TPU-only':>16} "
          f"{'SNR dB':>7} {'matrix nodes on TPU':>20} {'compile s':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in models.items():
            graph, x = build(np.random.default_rng(0), args.rows)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 8
            path = Path(tmp) / f"{graph.name}.onnx"
            onnx.save(model, str(path))
            want = session(model).run(None, {"x": x})[0]
            every = ort_default(path, x, Path(tmp) / f"{graph.name}.all.onnx")
            t = time.perf_counter()
            compiled = tpuasm.compile(path, batch=64, calibration=x)
            seconds = time.perf_counter() - t
            (check,) = compiled.report.validation.outputs
            top1_all = np.mean(np.argmax(every, 1) == np.argmax(want, 1))
            matrix = [r for r in compiled.report.rows if r.op_type in ("Conv", "Gemm", "MatMul")]
            on_tpu = sum(r.where == "TPU" for r in matrix)
            print(f"{name:<16} {100 * top1_all:>19.2f}% {100 * check.agreement:>15.2f}% "
                  f"{check.snr_db:>7.1f} {f'{on_tpu} of {len(matrix)}':>20} {seconds:>9.1f}")


if __name__ == "__main__":
    main()

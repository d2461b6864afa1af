"""QDQ models built directly with onnx.helper and numpy, as onnxruntime's quantize_static
writes them (DequantizeLinear on activations, int8 symmetric per-channel weights, int32
biases at x.scale * w.scale[n]), with every activation's scale taken from a numpy forward
pass over a calibration batch.  The builder walks one float tensor ("current") at a time."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class QDQBuilder:
    def __init__(self, x_shape, seed=0, rows=64):
        self.rng = np.random.default_rng(seed)
        self.x_shape = tuple(x_shape)
        self.calib = self.rng.normal(0, 1, (rows,) + self.x_shape).astype(np.float32)
        self.value = self.calib
        self.current = "x"
        self.nodes: list = []
        self.inits: list = []
        self.count = 0
        self.scale = None                    # the current tensor's quantization, when any
        self.zero_point = None

    def _name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def _const(self, value, stem: str) -> str:
        name = self._name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs, name=None, value=None, **attrs) -> str:
        name = name or self._name(op.lower())
        out = name + "_out"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=name, **attrs))
        if value is not None:
            self.value = value.astype(np.float32)
        return out

    # --- quantization --------------------------------------------------------------------
    def quantize(self, signed=False, name=None, same=False, widen=1.0) -> str:
        """QuantizeLinear + DequantizeLinear of the current float tensor (per tensor, range
        from the calibration batch, or `same` as the last quantization: quantize_static's
        choice for Pad, Reshape, MaxPool); returns the dequantized tensor, now current.
        `widen` multiplies a new scale (a range that is not the batch's exact one)."""
        lo, hi = min(float(self.value.min()), 0.0), max(float(self.value.max()), 0.0)
        if same:
            scale, zp = float(self.scale), self.zero_point
            dtype = np.int8 if signed else np.uint8
        elif signed:
            scale = max(abs(lo), abs(hi)) / 127 or 1.0
            zp, dtype = 0, np.int8
        else:
            scale = (hi - lo) / 255 or 1.0
            zp, dtype = int(round(-lo / scale)), np.uint8
        if not same:
            scale *= widen
        s = self._const(np.float32(scale), "scale")
        z = self._const(np.asarray(zp, dtype), "zp")
        q = self.node("QuantizeLinear", [self.current, s, z], name=name and name + "_q")
        info = np.iinfo(dtype)
        qv = np.clip(np.rint(self.value / np.float32(scale)) + zp, info.min, info.max)
        self.value = ((qv - zp) * np.float32(scale)).astype(np.float32)
        self.current = self.node("DequantizeLinear", [q, s, z], name=name)
        self.scale, self.zero_point = np.float32(scale), zp
        return self.current

    def weight(self, w: np.ndarray, axis: int) -> tuple[str, np.ndarray]:
        """int8 symmetric per-channel weight (scales along `axis`) behind DequantizeLinear."""
        other = tuple(i for i in range(w.ndim) if i != axis)
        scales = (np.abs(w).max(axis=other) / 127).astype(np.float32)
        scales[scales == 0] = 1.0
        shape = [1] * w.ndim
        shape[axis] = -1
        wq = np.clip(np.rint(w / scales.reshape(shape)), -127, 127).astype(np.int8)
        dq = self.node("DequantizeLinear", [self._const(wq, "w"), self._const(scales, "ws"),
                                            self._const(np.zeros(len(scales), np.int8), "wz")],
                       axis=axis)
        return dq, (wq * scales.reshape(shape)).astype(np.float32)

    def bias(self, b: np.ndarray, w_scales: np.ndarray, kind: str) -> tuple[str, np.ndarray]:
        """A bias operand: "int32" behind DequantizeLinear at x.scale * w.scale[n], or
        "float" as a plain constant."""
        if kind == "float":
            return self._const(b.astype(np.float32), "b"), b.astype(np.float32)
        scale = (self.scale * w_scales).astype(np.float32)
        bq = np.rint(b / scale).astype(np.int32)
        dq = self.node("DequantizeLinear", [self._const(bq, "b"), self._const(scale, "bs"),
                                            self._const(np.zeros(len(bq), np.int32), "bz")],
                       axis=0)
        return dq, (bq * scale).astype(np.float32)

    # --- layers --------------------------------------------------------------------------
    def matmul(self, n: int, bias: str | None = "int32", name=None) -> str:
        """MatMul over the last axis (+ an Add of a bias: "int32", "float" or None)."""
        k = self.value.shape[-1]
        w = self.rng.normal(0, 1 / np.sqrt(k), (k, n)).astype(np.float32)
        wdq, wreal = self.weight(w, 1)
        scales = np.abs(w).max(axis=0) / 127
        value = self.value @ wreal
        out = self.node("MatMul", [self.current, wdq], name=name, value=value)
        if bias:
            b = self.rng.normal(0, 0.3, n).astype(np.float32)
            bname, breal = self.bias(b, scales.astype(np.float32), bias)
            out = self.node("Add", [out, bname], value=self.value + breal)
        self.current = out
        return out

    def conv(self, out_channels: int, kernel, stride=1, pads=None, groups=1, auto_pad=None,
             name=None) -> str:
        """1-D (kernel (k,)) or 2-D convolution with an int32 bias."""
        c = self.value.shape[1]
        kernel = tuple(kernel)
        w = self.rng.normal(0, 1 / np.sqrt(c // groups * np.prod(kernel)),
                            (out_channels, c // groups) + kernel).astype(np.float32)
        wdq, wreal = self.weight(w, 0)
        scales = (np.abs(w).reshape(out_channels, -1).max(axis=1) / 127).astype(np.float32)
        b = self.rng.normal(0, 0.2, out_channels).astype(np.float32)
        bdq, breal = self.bias(b, scales, "int32")
        d = len(kernel)
        attrs = dict(kernel_shape=list(kernel), strides=[stride] * d, group=groups)
        if auto_pad:
            attrs["auto_pad"] = auto_pad
        else:
            attrs["pads"] = list(pads or [0] * 2 * d)
        value = _run_one(helper.make_node("Conv", ["a", "w", "b"], ["y"], **attrs),
                         {"a": self.value, "w": wreal, "b": breal})
        self.current = self.node("Conv", [self.current, wdq, bdq], name=name, value=value,
                                 **attrs)
        return self.current

    def pad(self, pads, name=None) -> str:
        """A constant Pad of zeros (ONNX pads: every axis' begin, then every end)."""
        rank = self.value.ndim
        widths = [(pads[i], pads[i + rank]) for i in range(rank)]
        self.current = self.node("Pad", [self.current, self._const(np.asarray(pads, np.int64),
                                                                   "pads")],
                                 name=name, value=np.pad(self.value, widths))
        return self.current

    def unary(self, op: str, name=None, **attrs) -> str:
        value = _run_one(helper.make_node(op, ["a"], ["y"], **attrs), {"a": self.value})
        self.current = self.node(op, [self.current], name=name, value=value, **attrs)
        return self.current

    def model(self, signed_output=False) -> onnx.ModelProto:
        """Quantize the current tensor as the output "y" (dequantized) and build the model."""
        self.quantize(signed_output, name="y_dq")
        self.nodes[-1].output[0] = "y"
        out_shape = ["N", *self.value.shape[1:]]
        graph = helper.make_graph(
            self.nodes, "qdq", [helper.make_tensor_value_info(
                "x", TensorProto.FLOAT, ["N", *self.x_shape])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        return m


def _run_one(node, feeds: dict) -> np.ndarray:
    """One float ONNX node evaluated by onnxruntime (the builder's forward pass)."""
    from onnx_models import run_ort
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in feeds.items()
             if k != "a"]
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info(
        "a", TensorProto.FLOAT, list(feeds["a"].shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    (y,) = run_ort(m, {"a": feeds["a"]})
    return y

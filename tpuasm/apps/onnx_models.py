"""The six apps as ONNX models (onnx.helper), built from the same layer lists.

Two forms of one graph:
- `model(name)`: float, random weights from a fixed seed, for onnxruntime and for
  `tpuasm compile --calibrate` like any user's model;
- `quantized_model(name)`: the same graph in QDQ form with int8 weights drawn directly
  (per-output-channel scales, fixed activation scales): what the paper's production
  networks were, int8 models.  This is what `tpuasm profile` compiles: it needs no
  calibration pass (which over CNN1's 5.4 GMAC per sample would cost minutes), and weight
  or activation values never change the machine's timing.

`save(name, path, quantized=...)` writes MODEL.onnx with its weights as external data
next to it (100M weights for CNN1), so the compiler memory-maps them.  The graph per layer
kind: FC -> MatMul (+ Relu / Sigmoid / Tanh), over a Concat when it has several inputs
(one MatMul per input and their Add for an LSTM gate's W x + R h, `FC.per_input`);
conv -> Conv (same padding) + Relu; pool -> MaxPool; a vector layer -> its Mul / Add (/ Tanh)
nodes; image features into an FC layer -> Flatten (and Concat).  Inputs are
(batch, features) or (batch, C, H, W) float32.

Quantization of the QDQ form (docs/apps.md): weights int8 uniform in [-127, 127] with scale
g / (73.3 sqrt(fan-in)) per output channel (g = sqrt(2) before a ReLU, He's
initialisation, else 1); model inputs uint8 in
[0, 1] (int8 in [-8, 8] when a vector layer reads them: an LSTM's c_prev); ReLU outputs
uint8 in [0, 8]; the input of a sigmoid / tanh, every vector-layer result and intermediate
(f * c, i * g) and each product of a per-input FC int8 in [-8, 8]; sigmoid outputs int8 in
[0, 1] (zero point -128), tanh outputs int8 in [-1, 1]: the vector layers' operands share one
signedness, as VADD / VMUL need.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .catalog import build
from .layers import FC, App, Conv, Pool, Vector

OPSET = 17
ACT_OP = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}
# (scale, zero point, signed) of the quantized tensors, by what produced them
Q_INPUT = (1 / 255, 0, False)
Q_RELU = (8 / 255, 0, False)
Q_WIDE = (8 / 127, 0, True)          # before a sigmoid/tanh, vector results, plain outputs
Q_SIGMOID = (1 / 255, -128, True)   # int8 like the tanh outputs it meets in the vector layers
Q_TANH = (1 / 127, 0, True)
W_STD = 73.3                          # std of int8 uniform in [-127, 127]


def model(name, seed: int = 0, batch: int | None = None):
    """The app (a name, or an App of catalog.py's kinds) as a float onnx.ModelProto
    (weights inside; use `save` for external data)."""
    return _Builder(name, seed, batch, quantized=False).build()


def quantized_model(name, seed: int = 0, batch: int | None = None):
    """The app in QDQ form with int8 weights (what `tpuasm profile` compiles)."""
    return _Builder(name, seed, batch, quantized=True).build()


class _Builder:
    """One app's graph, layer by layer, in float or QDQ form.  In QDQ form every app tensor
    is an 8-bit tensor (`source` maps app names to graph names where they differ) and each
    consumer reads it through a DequantizeLinear of its own."""

    def __init__(self, name, seed, batch, quantized):
        self.app = name if isinstance(name, App) else build(name)
        self.b = batch or self.app.batch
        self.g = np.random.default_rng(seed)
        self.quantized = quantized
        self.nodes, self.inits = [], []
        self.qparams = {}             # quantized tensor -> (scale, zero point, signed)
        self.source = {}              # app tensor -> the graph tensor that holds it
        self.names = set()
        self.params = set()
        self.concats = {}

    # -- helpers -------------------------------------------------------------------------
    def node(self, op, inputs, output, name=None, **attrs):
        from onnx import helper
        name = name or output
        assert name not in self.names, name
        self.names.add(name)
        self.nodes.append(helper.make_node(op, inputs, [output], name=name, **attrs))
        return output

    def const(self, name, value):
        from onnx import numpy_helper
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def scale_zp(self, q):
        scale, zp, signed = q
        key = f"q.{scale:.8g}.{'s' if signed else 'u'}{zp}"
        if key not in self.params:
            self.params.add(key)
            self.const(key + ".scale", np.float32(scale))
            self.const(key + ".zp", np.int8(zp) if signed else np.uint8(zp))
        return key + ".scale", key + ".zp"

    def quant(self, x, out, q):
        """QuantizeLinear(x) -> out (quantized with q)."""
        if not self.quantized:
            return self.node("Identity", [x], out, name=f"{out}.id")
        out = self.source.get(out, out)
        s, z = self.scale_zp(q)
        self.qparams[out] = q
        return self.node("QuantizeLinear", [x, s, z], out, name=f"{out}.q")

    def deq(self, t, consumer):
        """The float value of tensor t as `consumer` reads it (one DequantizeLinear per
        consumer, as the QDQ format has it)."""
        t = self.source.get(t, t)
        if not self.quantized or t not in self.qparams:
            return t
        s, z = self.scale_zp(self.qparams[t])
        return self.node("DequantizeLinear", [t, s, z], f"{t}.dq.{consumer}")

    def weight(self, wname, dims, fan_in, axis, fn):
        gain = np.sqrt(2.0) if fn == "relu" else 1.0      # He's: keeps ReLU stacks alive
        if not self.quantized:
            w = (self.g.standard_normal(dims, dtype=np.float32) * gain / np.sqrt(fan_in))
            return self.const(wname, w.astype(np.float32))
        w = self.g.integers(-127, 128, dims, dtype=np.int8)
        self.const(wname + ".q", w)
        scale = np.full(dims[axis], gain / (W_STD * np.sqrt(fan_in)), np.float32)
        self.const(wname + ".scale", scale)
        self.const(wname + ".zp", np.zeros(dims[axis], np.int8))
        return self.node("DequantizeLinear", [wname + ".q", wname + ".scale", wname + ".zp"],
                         wname, axis=axis)

    def flat(self, tname, consumer):
        x = self.deq(tname, consumer)
        if not self.rank4(tname):
            return x
        return self.node("Flatten", [x], f"{tname}.flat.{consumer}", axis=1)

    def rank4(self, tname):
        """Images, and what convolutions and pools produce (a 1 x 1 image too)."""
        return self.app.t(tname).is_image or any(
            isinstance(layer, (Conv, Pool)) and layer.output == tname for layer in self.app.layers)

    def shape(self, t):
        return [self.b, t.channels] if not self.rank4(t.name) else [self.b, t.channels,
                                                                     t.height, t.width]

    # -- layers --------------------------------------------------------------------------
    def fc(self, layer):
        app = self.app
        if layer.per_input and len(layer.inputs) > 1:
            return self.fc_per_input(layer)
        if len(layer.inputs) == 1:
            x = self.flat(layer.inputs[0], layer.name)
        else:       # one Concat per input list: an LSTM cell's four gates read the same one
            cat = self.concats.get(layer.inputs)
            if cat is None:
                ins = [self.flat(t, layer.name) for t in layer.inputs]
                cat = self.node("Concat", ins, f"{layer.name}.concat", axis=1)
                if self.quantized:
                    cat = self.quant(cat, f"{layer.name}.cat", Q_WIDE)
                self.concats[layer.inputs] = cat
            x = self.deq(cat, layer.name)
        k = sum(app.t(i).channels * app.t(i).pixels for i in layer.inputs)
        m = app.t(layer.output).channels
        w = self.weight(f"{layer.name}.W", (k, m), k, 1, layer.fn)
        mm = self.node("MatMul", [x, w], f"{layer.name}.mm", name=layer.name)
        self.activation(mm, layer.output, layer.fn, layer.name)

    def fc_per_input(self, layer):
        """act(sum_i x_i @ W_i): one MatMul per input (W split by rows; the same weights
        as the concatenated form draws), each product quantized, summed by Adds."""
        app = self.app
        widths = [app.t(i).channels * app.t(i).pixels for i in layer.inputs]
        k, m = sum(widths), app.t(layer.output).channels
        parts = self.weight_rows(f"{layer.name}.W", (k, m), widths, layer.fn)
        total = None
        for i, (t, w) in enumerate(zip(layer.inputs, parts)):
            mm = self.node("MatMul", [self.flat(t, f"{layer.name}.{i}"), w],
                           f"{layer.name}.mm{i}", name=f"{layer.name}.{i}" if i else layer.name)
            term = self.requantized(mm, f"{layer.name}.part{i}", Q_WIDE, f"{layer.name}.sum")
            total = term if total is None else self.node(
                "Add", [total, term], f"{layer.name}.sum{i}")
            if i < len(parts) - 1 and i:
                total = self.requantized(total, f"{layer.name}.acc{i}", Q_WIDE,
                                         f"{layer.name}.sum")
        self.activation(total, layer.output, layer.fn, layer.name)

    def weight_rows(self, wname, dims, widths, fn):
        """`weight`'s draw for a (K, M) matrix, split into row blocks of `widths` rows."""
        gain = np.sqrt(2.0) if fn == "relu" else 1.0
        k, m = dims
        cuts = np.cumsum([0, *widths])
        if not self.quantized:
            w = (self.g.standard_normal(dims, dtype=np.float32) * gain / np.sqrt(k))
            return [self.const(f"{wname}{i}", w[a:b].astype(np.float32))
                    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
        w = self.g.integers(-127, 128, dims, dtype=np.int8)
        scale = np.full(m, gain / (W_STD * np.sqrt(k)), np.float32)
        names = []
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            part = f"{wname}{i}"
            self.const(part + ".q", np.ascontiguousarray(w[a:b]))
            self.const(part + ".scale", scale)
            self.const(part + ".zp", np.zeros(m, np.int8))
            names.append(self.node("DequantizeLinear", [part + ".q", part + ".scale",
                                                        part + ".zp"], part, axis=1))
        return names

    def requantized(self, y, name, q, consumer):
        """y quantized as `name` and read back by `consumer` (QDQ form; float: y itself):
        every intermediate of the vector layers is an 8-bit tensor, as a quantized
        model's are."""
        if not self.quantized:
            return y
        return self.deq(self.quant(y, name, q), consumer)

    def activation(self, pre, out, fn, name):
        """pre (float) -> fn -> out (quantized)."""
        if fn == "none":
            return self.quant(pre, out, Q_WIDE)
        if fn == "relu":
            r = self.node("Relu", [pre], f"{name}.relu.out", name=f"{name}.relu")
            return self.quant(r, out, Q_RELU)
        if self.quantized:        # sigmoid/tanh between QuantizeLinear and DequantizeLinear
            pre = self.deq(self.quant(pre, f"{name}.pre", Q_WIDE), f"{name}.{fn}")
        y = self.node(ACT_OP[fn], [pre], f"{name}.{fn}.out", name=f"{name}.{fn}")
        return self.quant(y, out, Q_SIGMOID if fn == "sigmoid" else Q_TANH)

    def conv(self, layer):
        app = self.app
        c, o = app.t(layer.input).channels, app.t(layer.output).channels
        k, p = layer.kernel, layer.kernel // 2
        w = self.weight(f"{layer.name}.W", (o, c, k, k), c * k * k, 0, layer.fn)
        pre = self.node("Conv", [self.deq(layer.input, layer.name), w], f"{layer.name}.conv",
                        name=layer.name, kernel_shape=[k, k], pads=[p, p, p, p])
        self.activation(pre, layer.output, layer.fn, layer.name)

    def pool(self, layer):
        y = self.node("MaxPool", [self.deq(layer.input, layer.name)], f"{layer.name}.out",
                      name=layer.name, kernel_shape=[layer.size] * 2,
                      strides=[layer.size] * 2)
        q = self.qparams.get(self.source.get(layer.input, layer.input), Q_RELU)
        self.quant(y, layer.output, q)     # max pooling keeps its input's quantization

    def vector(self, layer):
        ins = [self.deq(x, layer.name) for x in layer.inputs]
        n = layer.name
        if layer.op == "mul":
            y = self.node("Mul", ins, f"{n}.mul")
        elif layer.op == "add":
            y = self.node("Add", ins, f"{n}.add")
        elif layer.op == "cell":                   # f * c_prev + i * g
            fc = self.requantized(self.node("Mul", ins[:2], f"{n}.mul0"), f"{n}.fc", Q_WIDE, n)
            ig = self.requantized(self.node("Mul", ins[2:], f"{n}.mul1"), f"{n}.ig", Q_WIDE, n)
            y = self.node("Add", [fc, ig], f"{n}.add")
        elif layer.op == "gate":                   # o * tanh(c)
            tc = self.requantized(self.node("Tanh", ins[1:], f"{n}.tanh"), f"{n}.tc", Q_TANH,
                                  n)
            y = self.node("Mul", [ins[0], tc], f"{n}.mul")
        elif layer.op == "scale":
            y = self.node("Mul", [ins[0], self.const(f"{n}.k", np.float32(0.5))], f"{n}.mul")
        else:
            y = ins[0]
        if layer.fn != "none":
            y = self.node(ACT_OP[layer.fn], [y], f"{n}.{layer.fn}")
        self.quant(y, layer.output, Q_WIDE if layer.fn == "none" else Q_TANH)

    def build(self):
        import onnx
        from onnx import TensorProto, helper
        app = self.app
        inputs = []
        if self.quantized:
            self.source.update({n: f"{n}.q" for n in app.outputs})
        # an input a vector layer reads (an LSTM's c_prev) is int8 like the vector layers'
        # other operands (VADD / VMUL take one signedness); the others uint8 in [0, 1]
        vector_read = {t for layer in app.layers if isinstance(layer, Vector)
                       for t in layer.inputs}
        for n in app.inputs:
            inputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                                        self.shape(app.t(n))))
            if self.quantized:
                self.source[n] = self.quant(n, f"{n}.q",
                                            Q_WIDE if n in vector_read else Q_INPUT)
        for layer in app.layers:
            if isinstance(layer, FC):
                self.fc(layer)
            elif isinstance(layer, Conv):
                self.conv(layer)
            elif isinstance(layer, Pool):
                self.pool(layer)
            elif isinstance(layer, Vector):
                self.vector(layer)
        outputs = []
        for n in app.outputs:
            out = n
            if self.quantized:
                s, z = self.scale_zp(self.qparams[f"{n}.q"])
                self.node("DequantizeLinear", [f"{n}.q", s, z], n, name=f"{n}.dq")
            outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT,
                                                         self.shape(app.t(n))))
        graph = helper.make_graph(self.nodes, app.name, inputs, outputs, self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="tpuasm.apps")
        m.ir_version = min(m.ir_version, 9)
        if m.ByteSize() < 1_900_000_000:
            onnx.checker.check_model(m)
        return m


def save(name: str, path: Path, seed: int = 0, batch: int | None = None,
         quantized: bool = False) -> Path:
    """Write the model to `path`, weights as external data in PATH.data."""
    import onnx
    m = (quantized_model if quantized else model)(name, seed, batch)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    return path


def calibration(name: str, samples: int = 16, seed: int = 1) -> dict:
    """A synthetic calibration set: {input name: (samples, ...) float32}."""
    app = build(name)
    g = np.random.default_rng(seed)
    out = {}
    for n in app.inputs:
        t = app.t(n)
        dims = (samples, t.channels) if not t.is_image else (samples, t.channels, t.height, t.width)
        out[n] = g.random(dims, dtype=np.float32)
    return out

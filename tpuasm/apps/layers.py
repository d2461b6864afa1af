"""The layer vocabulary of the paper's six applications, and their totals.

A description, not a code generator: catalog.py writes Table 1's apps in it, onnx_models.py
turns them into ONNX graphs, and the compiler (`tpuasm.compile`) makes the programs, as for
any user's model.  Table 1's layer counts and totals are computed from it.

An application is a list of layers over named tensors.  A tensor is a per-sample vector of
`width` features, or an image `channels x height x width`.  Layers:
- `FC`: y = act(concat(inputs) @ W); weights K x M (ONNX: MatMul over a Concat; with
  `per_input`, one MatMul per input and their sum, W split by rows: an LSTM gate's W x + R h).
- `Vector`: an element-wise step without weights (the LSTM's gate arithmetic: ONNX Mul,
  Add, Tanh); Table 1 counts these as the LSTMs' "vector" layers.
- `Conv`: 2-D convolution, kernel kh x kw, stride 1, "same" padding; weights C x O x kh x kw.
- `Pool`: max pooling, window = stride.

`ops_per_weight_byte` counts one op per MAC, as the paper's Table 1 and roofline do
(int8 weights, so a weight is a byte): batch x the output pixels each weight meets.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tensor:
    name: str
    channels: int                 # features of a vector; channels of an image
    height: int = 1               # 1 x 1 for a vector
    width: int = 1

    @property
    def is_image(self) -> bool:
        return self.height > 1 or self.width > 1

    @property
    def pixels(self) -> int:
        return self.height * self.width


@dataclass(frozen=True)
class FC:
    name: str
    inputs: tuple[str, ...]
    output: str
    fn: str = "relu"              # relu | sigmoid | tanh | none
    # one weight matrix per input, the products summed (an LSTM gate's W x + R h, as
    # ONNX's LSTM holds W and R): the same K x M weights, no concatenated input
    per_input: bool = False


@dataclass(frozen=True)
class Vector:
    name: str
    inputs: tuple[str, ...]
    output: str
    fn: str = "none"
    op: str = "mul"               # mul a*b | add a+b | cell a*b + c*d | gate a*tanh(b) |
    #                               copy a | scale a*0.5 (then fn)


@dataclass(frozen=True)
class Conv:
    name: str
    input: str
    output: str
    kernel: int = 3
    fn: str = "relu"


@dataclass(frozen=True)
class Pool:
    name: str
    input: str
    output: str
    size: int = 2


Layer = FC | Vector | Conv | Pool


@dataclass
class App:
    name: str
    batch: int
    tensors: dict[str, Tensor]
    layers: list[Layer]
    inputs: tuple[str, ...]           # from the host
    outputs: tuple[str, ...]          # back to the host
    notes: str = ""
    kinds: dict[str, int] = field(init=False)

    def __post_init__(self):
        kinds: dict[str, int] = {}
        for layer in self.layers:
            kinds[type(layer).__name__] = kinds.get(type(layer).__name__, 0) + 1
        self.kinds = kinds

    def t(self, name: str) -> Tensor:
        return self.tensors[name]

    def layer_weights(self, layer: Layer) -> int:
        if isinstance(layer, FC):
            k = sum(self.t(n).channels * self.t(n).pixels for n in layer.inputs)
            return k * self.t(layer.output).channels
        if isinstance(layer, Conv):
            return (self.t(layer.input).channels * self.t(layer.output).channels
                    * layer.kernel * layer.kernel)
        return 0

    def layer_macs(self, layer: Layer) -> int:
        """MACs per sample."""
        pixels = self.t(layer.output).pixels if isinstance(layer, Conv) else 1
        return self.layer_weights(layer) * pixels

    @property
    def weights(self) -> int:
        return sum(self.layer_weights(layer) for layer in self.layers)

    @property
    def macs_per_sample(self) -> int:
        return sum(self.layer_macs(layer) for layer in self.layers)

    @property
    def ops_per_weight_byte(self) -> float:
        return self.batch * self.macs_per_sample / self.weights

    def layer_counts(self) -> str:
        order = ("FC", "Conv", "Vector", "Pool")
        words = {"FC": "FC", "Conv": "conv", "Vector": "vector", "Pool": "pool"}
        parts = [f"{self.kinds[k]} {words[k]}" for k in order if k in self.kinds]
        return f"{len(self.layers)}: " + " + ".join(parts) if len(parts) > 1 else parts[0]

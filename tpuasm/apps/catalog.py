"""The paper's six production applications (Table 1) as layer lists.

Table 1 gives each app's layer counts, total weights and batch; the shapes are ours,
chosen to meet those totals (docs/apps.md has the arithmetic):
- MLP0, MLP1: plain fully connected stacks.
- LSTM0, LSTM1: one time step of stacked LSTM cells.  A cell's four gates are four FC
  layers over (x, h_prev), each W x + R h (one matrix per input, as ONNX's LSTM holds W
  and R); its "vector" layers are the element-wise gate arithmetic.
- CNN0: a Go-board network (19 x 19, like AlphaGo's), so ops/weight byte = 361 x 8 = 2888.
- CNN1: four convolution towers over 24 x 24 crops, their features concatenated into four
  FC layers.
"""
from __future__ import annotations

from .layers import FC, App, Conv, Pool, Tensor, Vector

PAPER_ORDER = ("MLP0", "MLP1", "LSTM0", "LSTM1", "CNN0", "CNN1")


def _vec(name, width):
    return Tensor(name, width)


def mlp(name: str, widths: list[int], batch: int, notes: str = "") -> App:
    tensors = {f"a{i}": _vec(f"a{i}", w) for i, w in enumerate(widths)}
    layers = [FC(f"fc{i + 1}", (f"a{i}",), f"a{i + 1}", "relu") for i in range(len(widths) - 1)]
    return App(name, batch, tensors, layers, ("a0",), (f"a{len(widths) - 1}",), notes)


def lstm_cells(tensors, layers, cell: int, x: str, hidden: int, fine: bool) -> str:
    """One LSTM cell: 4 gate FC layers over (x, h_prev), then the vector layers.  `fine`:
    five vector layers (f*c, i*g, their sum, tanh(c), o*tanh(c)); else two (the new c,
    and h = o * tanh(c)).  Returns the name of its output h."""
    p = f"c{cell}"
    for t in ("h_prev", "c_prev", "i", "f", "g", "o", "c", "h"):
        tensors[f"{p}.{t}"] = _vec(f"{p}.{t}", hidden)
    ins = (x, f"{p}.h_prev")
    for gate, fn in (("i", "sigmoid"), ("f", "sigmoid"), ("g", "tanh"), ("o", "sigmoid")):
        layers.append(FC(f"{p}.{gate}", ins, f"{p}.{gate}", fn, per_input=True))
    if fine:
        for t in ("fc", "ig", "tc"):
            tensors[f"{p}.{t}"] = _vec(f"{p}.{t}", hidden)
        layers += [Vector(f"{p}.f*c", (f"{p}.f", f"{p}.c_prev"), f"{p}.fc"),
                   Vector(f"{p}.i*g", (f"{p}.i", f"{p}.g"), f"{p}.ig"),
                   Vector(f"{p}.c", (f"{p}.fc", f"{p}.ig"), f"{p}.c", op="add"),
                   Vector(f"{p}.tanh(c)", (f"{p}.c",), f"{p}.tc", "tanh", "copy"),
                   Vector(f"{p}.h", (f"{p}.o", f"{p}.tc"), f"{p}.h")]
    else:
        layers += [Vector(f"{p}.c", (f"{p}.f", f"{p}.c_prev", f"{p}.i", f"{p}.g"), f"{p}.c",
                          op="cell"),
                   Vector(f"{p}.h", (f"{p}.o", f"{p}.c"), f"{p}.h", op="gate")]
    return f"{p}.h"


def lstm0() -> App:
    """6 cells of 1024 (the first over a 1432-wide input), 5 vector layers each, and
    residual additions into cells 3-6: 24 FC + 34 vector, 52.0M weights."""
    tensors, layers = {"x": _vec("x", 1432)}, []
    x = "x"
    for cell in range(6):
        h = lstm_cells(tensors, layers, cell, x, 1024, fine=True)
        if cell >= 2:                       # residual connection (as in GNMT's stacks)
            r = f"c{cell}.res"
            tensors[r] = _vec(r, 1024)
            layers.append(Vector(r, (h, x), r, op="add"))
            h = r
        x = h
    inputs = ("x", *(f"c{i}.{t}" for i in range(6) for t in ("h_prev", "c_prev")))
    return App("LSTM0", 64, tensors, layers, inputs, (x,))


def lstm1() -> App:
    """9 cells of 600 (every gate is the paper's 600 x 600 worked example twice: W_x and
    W_h), 2 vector layers each, then a 600 x 13,500 output layer and its scaling: 37 FC +
    19 vector, 34.0M weights."""
    tensors, layers = {"x": _vec("x", 600)}, []
    x = "x"
    for cell in range(9):
        x = lstm_cells(tensors, layers, cell, x, 600, fine=False)
    tensors["logits"] = _vec("logits", 13500)
    tensors["scaled"] = _vec("scaled", 13500)
    layers.append(FC("out", (x,), "logits", "none"))
    layers.append(Vector("out.scale", ("logits",), "scaled", op="scale"))
    inputs = ("x", *(f"c{i}.{t}" for i in range(9) for t in ("h_prev", "c_prev")))
    return App("LSTM1", 96, tensors, layers, inputs, ("scaled",))


def _img(name, channels, size):
    return Tensor(name, channels, size, size)


def cnn0() -> App:
    """A Go network on the 19 x 19 board: 48 feature planes, a 5 x 5 convolution to 256
    channels, 13 of 3 x 3 and 2 of 1 x 1 at 256: 16 conv, 8.1M weights."""
    tensors = {"board": _img("board", 48, 19)}
    layers, x = [], "board"
    kernels = [5] + [3] * 13 + [1] * 2
    for i, k in enumerate(kernels):
        y = f"conv{i + 1}"
        tensors[y] = _img(y, 256, 19)
        layers.append(Conv(y, x, y, k))
        x = y
    return App("CNN0", 8, tensors, layers, ("board",), (x,))


def cnn1() -> App:
    """Four towers over 24 x 24 RGB crops: 6 convolutions at 24 x 24 x 128, a 2 x 2 pool,
    6 at 12 x 12 x 256, a pool, 6 at 6 x 6 x 512, a pool (3 x 3 x 512 out); the fourth
    tower's last convolution is a 1 x 1 at 3 x 3 followed by a 3 x 3 pool (global
    context).  The towers' 4,608 + 4,608 + 4,608 + 512 features feed four FC layers (2048, 1024, 1024, 1000).
    72 conv + 13 pool + 4 FC = 89 layers, 99.3M weights, 1739 ops per weight byte."""
    tensors, layers, features = {}, [], []
    for tower in range(4):
        p = f"t{tower}"
        tensors[f"{p}.in"] = _img(f"{p}.in", 3, 24)
        x = f"{p}.in"
        plan = [(24, 128, 3)] * 6 + [(12, 256, 3)] * 6 + [(6, 512, 3)] * 6
        if tower == 3:
            plan[-1] = (3, 512, 1)
        for i, (size, channels, k) in enumerate(plan):
            if tensors[x].height != size:     # a stage boundary: pool the previous output
                y = f"{p}.pool{len([l for l in layers if isinstance(l, Pool) and l.name.startswith(p)]) + 1}"
                tensors[y] = _img(y, tensors[x].channels, size)
                layers.append(Pool(y, x, y, tensors[x].height // size))
                x = y
            y = f"{p}.conv{i + 1}"
            tensors[y] = _img(y, channels, size)
            layers.append(Conv(y, x, y, k))
            x = y
        out = 1 if tower == 3 else 3
        y = f"{p}.out"
        tensors[y] = _img(y, tensors[x].channels, out)
        layers.append(Pool(y, x, y, tensors[x].height // out))
        features.append(y)
    widths = [2048, 1024, 1024, 1000]
    x_in: tuple[str, ...] = tuple(features)
    for i, w in enumerate(widths):
        y = f"fc{i + 1}"
        tensors[y] = _vec(y, w)
        layers.append(FC(y, x_in, y, "relu" if i < 3 else "none"))
        x_in = (y,)
    return App("CNN1", 32, tensors, layers, tuple(f"t{i}.in" for i in range(4)), ("fc4",))


def build(name: str) -> App:
    return _BUILDERS[name.upper()]()


_BUILDERS = {
    "MLP0": lambda: mlp("MLP0", [2000] * 6, 200),
    "MLP1": lambda: mlp("MLP1", [1000, 1000, 1500, 1000, 1000], 168),
    "LSTM0": lstm0,
    "LSTM1": lstm1,
    "CNN0": cnn0,
    "CNN1": cnn1,
}

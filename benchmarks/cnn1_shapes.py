"""CNN1's layer shapes against the paper's Table 3 column: ours, and an FC-heavy variant.

    python benchmarks/cnn1_shapes.py

Table 1 publishes CNN1's totals only (89 layers: 72 conv + 13 pool + 4 FC, 100M weights,
1,750 ops per weight byte, batch 32); the paper's text puts its weight waiting (rows 4-5,
35 %) in "the 4 fully connected layers that run at an operational intensity of just 32".
This compiles two shapings through the apps' own path (QDQ ONNX model -> tpuasm.compile ->
one joined program), runs them timing-only on TPU v1 and prints their Table 3 rows next to
the paper's (docs/apps.md, "CNN1's layer shapes"):

- catalog: tpuasm/apps/catalog.py's CNN1 (four towers of 128/256/512 channels, 33.5M FC
  weights);
- fc-heavy: four towers of 18 convolutions 3 x 3 at 24 x 24 x 128 (10.0M weights), the
  pools after them, and 89.4M weights in the FC layers (8192, 6400, 1024, 1000).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tpuasm.apps.catalog import build  # noqa: E402
from tpuasm.apps.layers import FC, App, Conv, Pool, Tensor  # noqa: E402
from tpuasm.apps.paper import ROWS, TABLE3, measured_row  # noqa: E402


def fc_heavy() -> App:
    """72 conv + 13 pool + 4 FC, batch 32, ~99.4M weights, most of them in the FC layers."""
    tensors, layers, features = {}, [], []
    for tower in range(4):
        p = f"t{tower}"
        x = f"{p}.in"
        tensors[x] = Tensor(x, 3, 24, 24)
        for i in range(18):
            y = f"{p}.conv{i + 1}"
            tensors[y] = Tensor(y, 128, 24, 24)
            layers.append(Conv(y, x, y, 3))
            x = y
        sizes = (12, 6, 3, 1) if tower == 3 else (12, 6, 3)
        for i, size in enumerate(sizes):
            y = f"{p}.pool{i + 1}"
            tensors[y] = Tensor(y, 128, size, size)
            layers.append(Pool(y, x, y, tensors[x].height // size))
            x = y
        features.append(x)
    x_in: tuple[str, ...] = tuple(features)
    for i, w in enumerate((8192, 6400, 1024, 1000)):
        y = f"fc{i + 1}"
        tensors[y] = Tensor(y, w)
        layers.append(FC(y, x_in, y, "relu" if i < 3 else "none"))
        x_in = (y,)
    return App("CNN1", 32, tensors, layers, tuple(f"t{i}.in" for i in range(4)), ("fc4",))


def measure(app: App) -> dict:
    import numpy as np
    import onnx

    from tpuasm.assembler import assemble
    from tpuasm.compiler.pipeline import compile_model
    from tpuasm.compiler.codegen.whole import whole_program
    from tpuasm.machine import Machine, MachineConfig
    from tpuasm.apps.onnx_models import quantized_model
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cnn1.onnx"
        onnx.save_model(quantized_model(app), str(path), save_as_external_data=True,
                        location="cnn1.onnx.data", size_threshold=1024)
        compiled = compile_model(path, batch=app.batch, config={})
        whole = whole_program(compiled, app.name)
    config = MachineConfig()
    m = Machine(config, timing_only=True)
    m.load(assemble(whole.source, "cnn1.tasm"),
           host=np.zeros((whole.host_rows, 256), np.int8),
           weights=np.zeros((whole.weight_tiles, 256, 256), np.int8))
    m.run()
    c = m.counters()
    cycles = int(c["cycles"])
    macs = app.batch * app.macs_per_sample
    c = dict(c, tops=2.0 * macs / (cycles / config.clock_hz) / 1e12,
             mxu_utilization=macs / (cycles * 256 ** 2))
    return {key: measured_row(key, c) for key, *_ in ROWS} | {"cycles": cycles}


def main() -> int:
    shapes = {"catalog": build("CNN1"), "fc-heavy": fc_heavy()}
    results = {}
    for name, app in shapes.items():
        fc = sum(app.layer_weights(x) for x in app.layers if isinstance(x, FC))
        print(f"{name}: {app.layer_counts()}, {app.weights / 1e6:.1f}M weights "
              f"({fc / 1e6:.1f}M in FC), {app.ops_per_weight_byte:,.0f} ops per weight byte",
              flush=True)
        results[name] = measure(app)
    print("| row | paper | " + " | ".join(results) + " |")
    print("|---|---|" + "---|" * len(results))
    for key, label, _, _ in ROWS:
        print(f"| {label} | {TABLE3[key]['CNN1']:.1f} | "
              + " | ".join(f"{r[key]:.1f}" for r in results.values()) + " |")
    print("| cycles | 11.9M (row 2) | " + " | ".join(f"{r['cycles']:,}" for r in results.values())
          + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Flax networks exported by jax2onnx, compiled and run through the CLI (OPTIONAL: not run by
`make test`; `make bench-jax` installs the `jax` extra, JAX, Flax, optax and jax2onnx, into
.venv first).

    make bench-jax                        # or, with the extra installed:
    .venv/bin/python benchmarks/real_models_jax.py [--only NAME] [--work DIR]

Each network is a flax.nnx module trained for 300 Adam steps on 2,048 rows of a synthetic
task of its own, exported by `jax2onnx.to_onnx` (opset 23, a dynamic batch "B"), compiled
with `tpuasm compile --calibrate` on 128 other rows and run with `tpuasm infer` on 1,024 more,
against onnxruntime on the float model (top-1 with its 95 % interval, SNR of the logits, the
float model's own accuracy) and on the compiled model's own QDQ model; then onnxruntime's
quantize_static of the export, compiled as it is and with --calibrate
(benchmarks/real_models_torch.py's comparisons).

- mlp: nnx.Linear, ReLU, exact GELU (jax2onnx writes ONNX Gelu), a Linear head.
- cnn: NHWC Conv + BatchNorm + ReLU, a depthwise strided Conv (feature_group_count), a 1x1
  Conv with hard swish, a spatial mean, Linear (jax2onnx wraps the Convs in Transposes).
- block: a transformer block: nnx.MultiHeadAttention, two LayerNorms (written out in
  primitives), an MLP with GELU, residual Adds, a mean over the sequence.
- seq1d: 1-D Convs over (N, T, C), one dilated, tanh, a max over the sequence.
- lstm / gru: nnx.LSTMCell / nnx.GRUCell scanned over the sequence by jax.lax.scan, which
  jax2onnx writes as an ONNX Loop (front/loops.py unrolls it), the last step into a head.
- tokens: int32 token ids into nnx.Embed, a mean over the sequence, an MLP.
- einsum: jnp.einsum with weights, which jax2onnx keeps as ONNX Einsum: a projection into
  heads with a bias per head and ReLU, then one summing the sequence and the heads away.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_models_torch import ROWS, TRAIN, one_input_export  # noqa: E402

NAMES = ("mlp", "cnn", "block", "seq1d", "lstm", "gru", "tokens", "einsum")
STEPS, MINIBATCH = 300, 256


def _task(name: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels of a network's synthetic task (ROWS rows)."""
    if name == "cnn":
        x = rng.normal(0, 1, (ROWS, 16, 16, 3)).astype(np.float32)
        labels = rng.integers(0, 4, ROWS)
        for i, k in enumerate(labels):                       # a bright quadrant, NHWC
            x[i, (k // 2) * 8:(k // 2) * 8 + 8, (k % 2) * 8:(k % 2) * 8 + 8] += 1.0
        return x, labels
    if name == "tokens":
        x = rng.integers(0, 50, (ROWS, 12)).astype(np.int32)
        return x, np.argmax(np.stack([np.sum(x // 13 == k, 1) for k in range(4)], 1), 1)
    if name == "mlp":
        x = rng.normal(0, 1, (ROWS, 20)).astype(np.float32)
        return x, np.argmax(np.tanh(x @ rng.normal(0, 1, (20, 6))), 1)
    shape = (ROWS, 32, 4) if name == "seq1d" else (ROWS, 10, 8)
    x = rng.normal(0, 1, shape).astype(np.float32)
    return x, np.argmax(x[:, :, :3].sum(1), 1)


def _networks(jax, jnp, nnx):
    class MLP(nnx.Module):
        def __init__(self, r):
            self.a, self.b = nnx.Linear(20, 64, rngs=r), nnx.Linear(64, 32, rngs=r)
            self.head = nnx.Linear(32, 6, rngs=r)

        def __call__(self, x):
            return self.head(nnx.gelu(self.b(nnx.relu(self.a(x))), approximate=False))

    class CNN(nnx.Module):
        def __init__(self, r):
            self.c1, self.bn = nnx.Conv(3, 16, (3, 3), rngs=r), nnx.BatchNorm(16, rngs=r)
            self.dw = nnx.Conv(16, 16, (3, 3), strides=2, feature_group_count=16, rngs=r)
            self.pw, self.head = nnx.Conv(16, 24, (1, 1), rngs=r), nnx.Linear(24, 4, rngs=r)

        def __call__(self, x):
            y = nnx.relu(self.bn(self.c1(x)))
            y = nnx.hard_swish(self.pw(nnx.relu(self.dw(y))))
            return self.head(y.mean((1, 2)))

    class Block(nnx.Module):
        def __init__(self, r):
            self.inp = nnx.Linear(8, 32, rngs=r)
            self.attn = nnx.MultiHeadAttention(4, 32, decode=False, rngs=r)
            self.n1, self.n2 = nnx.LayerNorm(32, rngs=r), nnx.LayerNorm(32, rngs=r)
            self.m1, self.m2 = nnx.Linear(32, 64, rngs=r), nnx.Linear(64, 32, rngs=r)
            self.head = nnx.Linear(32, 3, rngs=r)

        def __call__(self, x):
            h = self.inp(x)
            h = h + self.attn(self.n1(h))
            h = h + self.m2(nnx.gelu(self.m1(self.n2(h))))
            return self.head(h.mean(1))

    class Seq1D(nnx.Module):
        def __init__(self, r):
            self.c1 = nnx.Conv(4, 16, (3,), rngs=r)
            self.c2 = nnx.Conv(16, 16, (3,), kernel_dilation=2, rngs=r)
            self.head = nnx.Linear(16, 3, rngs=r)

        def __call__(self, x):
            y = nnx.tanh(self.c1(x))
            return self.head((y + nnx.relu(self.c2(y))).max(1))

    def scanned(cell_type):
        class Recurrent(nnx.Module):
            def __init__(self, r):
                self.cell = cell_type(8, 24, rngs=r)
                self.head = nnx.Linear(24, 3, rngs=r)

            def __call__(self, x):
                graph, state = nnx.split(self.cell)

                def step(carry, x_t):        # the cell as a pure function: scan traces it
                    return nnx.merge(graph, state)(carry, x_t)
                zeros = jnp.zeros((x.shape[0], 24), x.dtype)
                carry = (zeros, zeros) if cell_type is nnx.LSTMCell else zeros
                _, ys = jax.lax.scan(step, carry, jnp.swapaxes(x, 0, 1))
                return self.head(ys[-1])
        return Recurrent

    class Tokens(nnx.Module):
        def __init__(self, r):
            self.embed = nnx.Embed(50, 16, rngs=r)
            self.a, self.head = nnx.Linear(16, 32, rngs=r), nnx.Linear(32, 4, rngs=r)

        def __call__(self, t):
            return self.head(nnx.relu(self.a(self.embed(t).mean(1))))

    class Einsum(nnx.Module):
        def __init__(self, r):
            keys = jax.random.split(jax.random.key(0), 2)
            self.heads = nnx.Param(jax.random.normal(keys[0], (8, 4, 6)) * 0.35)
            self.bias = nnx.Param(jnp.zeros((4, 6)))
            self.out = nnx.Param(jax.random.normal(keys[1], (4, 6, 3)) * 0.2)

        def __call__(self, x):
            h = jax.nn.relu(jnp.einsum("bld,dhk->blhk", x, self.heads.value) + self.bias.value)
            return jnp.einsum("blhk,hkc->bc", h, self.out.value) / x.shape[1]

    return {"mlp": MLP, "cnn": CNN, "block": Block, "seq1d": Seq1D, "einsum": Einsum,
            "lstm": scanned(nnx.LSTMCell), "gru": scanned(nnx.GRUCell), "tokens": Tokens}


def _train(nnx, optax, model, x, labels) -> None:
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, xb, yb):
        def loss(m):
            return optax.softmax_cross_entropy_with_integer_labels(m(xb), yb).mean()
        value, grads = nnx.value_and_grad(loss)(model)
        optimizer.update(model, grads)
        return value

    rng = np.random.default_rng(1)
    model.train()
    for _ in range(STEPS):
        pick = rng.integers(0, len(x), MINIBATCH)
        step(model, optimizer, x[pick], labels[pick])
    model.eval()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, help="where models and OUTDIRs go (default: temp)")
    p.add_argument("--only", action="append", default=[], help=f"one of {', '.join(NAMES)}")
    args = p.parse_args(argv)
    try:
        import jax
        import jax.numpy as jnp
        import onnx
        import optax
        from flax import nnx
        from jax2onnx import to_onnx
    except ImportError:
        print("JAX, Flax and jax2onnx are not installed: `make bench-jax` installs the jax "
              "extra", file=sys.stderr)
        return 2
    networks = _networks(jax, jnp, nnx)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        for name in args.only or NAMES:
            x, labels = _task(name, rng)
            model = networks[name](nnx.Rngs(0))
            _train(nnx, optax, model, jnp.asarray(x[:TRAIN]), jnp.asarray(labels[:TRAIN]))
            folder = work / name
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"jax_{name}.onnx"
            spec = jax.ShapeDtypeStruct(("B", *x.shape[1:]), jnp.asarray(x[:1]).dtype)
            exported = to_onnx(model, [spec], model_name=name, input_names=["x"])
            onnx.save(exported, str(path))
            one_input_export(path, folder, f"jax {name} (jax2onnx)", x, labels,
                             {"ops": sorted({n.op_type for n in exported.graph.node})})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""16-bit activations in the back end (the TPU v1's 8-bit weights x 16-bit activations): an
int16 tensor is two UB rows per vector (low bytes, then high bytes), read by MatrixMultiply
with the H flag and written by Activate with act_out = 2.  Generated programs run on the
emulator and are compared with the IR's numpy semantics (reference.py, onnxruntime's
arithmetic): equal but for requantization near-ties, one unit at most."""
from __future__ import annotations

import numpy as np
import pytest

from test_codegen import SMALL, assert_close, conv, dense, run, seg
from tpuasm.compiler.codegen import generate, supports
from tpuasm.compiler.ir import Activation, Lookup, QParams, Tensor


def wide(rng, zero_range=2000) -> QParams:
    return QParams(float(rng.uniform(1e-4, 4e-4)), int(rng.integers(-zero_range, zero_range)),
                   True, 16)


def random16(rng, t: Tensor, batch: int) -> np.ndarray:
    return rng.integers(-32768, 32768, (batch, *t.shape)).astype(np.int16)


@pytest.mark.parametrize("seed", range(3))
def test_dense_chain_with_int16_input_middle_and_output(seed):
    """x (int16) -> Dense -> h (int16) -> Dense -> y (int16): H reads, act_out 2 writes, the
    vector input's K chunks two rows each (rep_ub_stride doubled)."""
    rng = np.random.default_rng(seed)
    k, m, n = int(rng.integers(5, 30)), int(rng.integers(5, 20)), int(rng.integers(3, 12))
    x = Tensor("x", (k,), wide(rng))
    a = dense(rng, "fc1", x, m, Activation("relu"))
    a.output = Tensor("h", (m,), wide(rng))
    # the accumulator scale must keep the int16 result in range: weights' scale small
    a.weight_scale = (a.weight_scale * 0.05).astype(np.float32)
    b = dense(rng, "fc2", a.output, n, Activation("none"))
    b.output = Tensor("y", (n,), wide(rng))
    b.weight_scale = (b.weight_scale * 0.05).astype(np.float32)
    segment = seg([a, b])
    ours, theirs, program, _ = run(segment, int(rng.integers(3, 40)), rng, **SMALL,
                                   inputs=random16)
    assert "MMC.SOH" in program.source and "CFG act_out, 2" in program.source
    assert ours["y"].dtype == np.int16
    assert np.abs(theirs["y"].astype(np.int64)).max() > 255     # beyond any 8-bit range
    assert_close(ours, theirs)


@pytest.mark.parametrize("seed", range(3))
def test_padded_conv_reads_int16_and_writes_int16(seed):
    """A padded, strided convolution over an int16 image: MMC.C with H walks pixel vectors
    two rows apart, the padding holds the zero point's two bytes, the next conv reads the
    int16 output (written at a pitch into its padded layout)."""
    rng = np.random.default_rng(50 + seed)
    c, o = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    h, w = int(rng.integers(3, 8)), int(rng.integers(3, 8))
    x = Tensor("x", (c, h, w), wide(rng))
    a = conv(rng, "c1", x, o, 3, int(rng.integers(1, 3)), 1, Activation("relu"))
    a.output = Tensor("h", a.output.shape, wide(rng))
    a.weight_scale = (a.weight_scale * 0.1).astype(np.float32)
    b = conv(rng, "c2", a.output, int(rng.integers(1, 10)), 3, 1, 1, Activation("none"))
    b.weight_scale = (b.weight_scale * 0.002).astype(np.float32)      # an 8-bit output
    ours, theirs, program, _ = run(seg([a, b]), int(rng.integers(1, 5)), rng, **SMALL,
                                   inputs=random16)
    assert ours[b.output.name].dtype == b.output.quant.dtype
    assert "MMC.CSOH " in program.source and "CFG act_out, 2" in program.source
    assert_close(ours, theirs)


def test_wide_rows_twice_the_narrow_and_pack_round_trip():
    rng = np.random.default_rng(7)
    x = Tensor("x", (11, 3, 4), wide(rng))
    op = conv(rng, "c", x, 5, 3, 1, 1)
    narrow = conv(rng, "c", Tensor("x", (11, 3, 4), QParams(0.1, 3, True)), 5, 3, 1, 1)
    p16, p8 = generate(seg([op]), 3, **SMALL), generate(seg([narrow]), 3, **SMALL)
    assert p16.inputs["x"].rows == 2 * p8.inputs["x"].rows
    data = random16(rng, x, 3)
    host = p16.host_image({"x": data})
    lay = p16.layouts["x"]
    # pad rows hold the zero point's bytes, low then high
    zp = np.array([x.quant.zero_point], np.int16).view(np.uint8)
    first = np.asarray(host[p16.inputs["x"].base:p16.inputs["x"].base + 2]).view(np.uint8)
    assert lay.pads.top and (first[0] == zp[0]).all() and (first[1] == zp[1]).all()


def test_lookup_and_uint16_refused_with_a_reason():
    rng = np.random.default_rng(3)
    x = Tensor("x", (8,), wide(rng))
    look = Lookup("sig", x, Tensor("y", (8,), QParams(0.01, 0, True)),
                  np.zeros(256, np.int8), "sigmoid", ("sig",))
    assert "16-bit" in supports(look)
    op = dense(rng, "fc", Tensor("x", (8,), QParams(1e-3, 0, False, 16)), 4)
    assert "uint16" in supports(op)

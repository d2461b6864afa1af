"""A regression manifest per TPU segment (spec/regression.md) so that `tpuasm test OUTDIR`
re-runs each compiled program on one batch of sample inputs.

The expected host rows are the emulator's output for that batch, recorded only after the
outputs read from them (`SegmentProgram.read_outputs`) agreed with reference.py's independent
evaluation of the segment (>= 99.9 % identical, none more than 1 LSB apart); the golden rows
then hold the program's padding lanes too, which no model outside the back end predicts."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.runtime.steps import TpuStep
from tpuasm.regression import toml



def sample_inputs(step: TpuStep, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in step.segment.inputs:
        # drawn in the tensor's own type: an int64 draw of a one-hot's (64, 2048, 257) batch
        # was 270 MB at the compile's peak
        out[t.name] = rng.integers(t.quant.qmin, t.quant.qmax + 1, size=(batch,) + t.shape,
                                   dtype=np.dtype(t.quant.dtype))
    return out


REFERENCE_SAMPLES = 8      # samples of the golden batch checked against reference.py


def check_against_reference(step: TpuStep, ours: dict, inputs: dict) -> None:
    """The emulator's outputs of the first REFERENCE_SAMPLES samples against reference.py's
    (every IR operator works on each sample alone, so a prefix of the batch is as good a
    check of the program, and the reference's int64 convolutions over a whole batch of long
    sequences cost seconds and hundreds of MiB)."""
    from tpuasm.compiler.ir import Elementwise, Pool
    from tpuasm.compiler.reference import run_segment
    k = min(REFERENCE_SAMPLES, len(next(iter(inputs.values()))))
    # VADD / VMUL and average pooling compute the exact value where onnxruntime (the
    # reference) rounds in float32: with "round" scale ratios (5/6, or the equal scales of
    # a model whose weights are all one value) exact ties are common and each is one LSB
    # apart, on up to a few per cent of the values; a Mul by a constant whose ratio is
    # above 1 (a decomposed BatchNormalization's scale) or two in a row grow one to a few
    # LSB (docs/compiler.md, Rounding); a back-end bug makes far more
    exact = any(isinstance(op, Elementwise) or (isinstance(op, Pool) and op.kind == "avg")
                for op in step.segment.operators)
    tie_share, worst = (0.05, 4) if exact else (0.001, 1)
    values = run_segment(step.segment, {name: x[:k] for name, x in inputs.items()},
                         every=True)
    made_by = {op.output.name: op for op in step.segment.operators}
    for name in (t.name for t in step.segment.outputs):
        want = values[name]
        got = np.asarray(ours[name])[:k].reshape(want.shape)
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        same = float(np.mean(diff == 0)) if diff.size else 1.0
        # rounding near-ties (docs/compiler.md, Rounding) are 1 LSB and rare: a small
        # sample batch may hold one or two of them, a back-end bug makes many
        off = diff != 0
        pool = made_by.get(name)
        if isinstance(pool, Pool) and pool.kind == "avg" and diff.max(initial=0) <= 1:
            # an average pool's exact ties (x.5: a 2x2 window of equal scales has one in
            # four sums) round where float32's error takes onnxruntime; the chip's exact
            # value rounds half to even: those may differ, and only those
            off &= ~_exact_ties(pool, values[pool.input.name])
        ties = int(np.count_nonzero(off)) <= max(2, int(tie_share * diff.size))
        if diff.size and (diff.max() > worst or not ties):
            raise CompileError(f"{step.name}: the generated program disagrees with the "
                               f"reference on '{name}': {same:.2%} identical, worst "
                               f"{int(diff.max())} LSB (a back-end bug)")


def _exact_ties(pool, x: np.ndarray) -> np.ndarray:
    """Where an average pool's exact value before rounding is a tie (x.5)."""
    from tpuasm.compiler.reference import average_before_rounding
    if pool.kernel == tuple(np.shape(x)[2:]) and not any(pool.pads):
        return np.zeros((), bool)                # global: an integer sum both ways
    value = average_before_rounding(pool, x)
    return np.abs(value - np.floor(value) - 0.5) <= 1e-6 * np.maximum(1.0, np.abs(value))


def write_regression(step: TpuStep, outdir: Path, model) -> None:
    program = step.program
    inputs = sample_inputs(step, program.batch)      # the program's rows (Segment.rows)
    image = outdir / f"{step.name}.host.npy"
    np.save(image, program.host_image(inputs))
    machine = step.machine(model.config)
    # the saved file, which the machine maps (copy on write): no second copy of a host
    # image in memory (Magika's first segment: 98 MB a batch)
    machine.load(step.binary(), host=image, weights=program.weights)
    # the data path: the same memories as the timed pipeline (tests/test_dataonly.py), whose
    # timing this program already proved (Machine.run_data) -- the timed run of a long
    # sequence CNN's golden batch was a tenth of its compile
    result = machine.run_data()
    if result.status != "halted":
        raise CompileError(f"{step.name}: the generated program did not halt on sample "
                           f"inputs: {result.fault or result.status}")
    check_against_reference(step, program.read_outputs(machine.host), inputs)
    folder = outdir / "regression" / step.name
    folder.mkdir(parents=True)
    expects = []
    for i, (name, layout) in enumerate(program.outputs.items()):
        rows = np.array(machine.host[layout.base:layout.base + layout.rows])
        if layout.tensor.quant.signed:
            rows = rows.view(np.int8)
        np.save(folder / f"output{i}.npy", rows)
        expects.append(toml.table("expect.rows", {
            "start": int(layout.base), "memory": "host", "expected": f"output{i}.npy",
            "tolerance": 0}, comment=f"{name}: {layout.layout}", array=True))
    stem = Path(model.report.model).stem
    parts = [toml.table("test", {
        "program": f"../../{step.name}.tasm", "name": f"{stem}-{step.name}",
        "description": f"compiled {stem}: {step.name}"},
        comment=f"Written by `tpuasm compile`: {step.name} of {model.report.model} on one "
                f"batch\nof sample inputs; expected rows recorded after agreeing with "
                f"reference.py.")]
    if model.config:
        parts.append(toml.table("machine", dict(model.config)))
    parts.append(toml.table("data", {"host": f"../../{step.name}.host.npy",
                                     "weights": f"../../{step.name}.weights.npy"}))
    text = "\n".join(parts + expects)
    (folder / "test.toml").write_text(text)
    step.release()        # one run: its memories go before the next segment's (ms to remake)


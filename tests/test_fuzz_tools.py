"""Resource-bounded fuzzing of every input a user hands tpuasm (the short mode).

Each case runs in a reused worker process under limits (tests/fuzzing/worker.py: 2 s of
CPU, the address space may grow 500 MB; a wall-clock limit on top) and must end with a
documented exit code, no traceback, no "internal error", no "out of memory" and bounded
output.  Targets: assembler text, .tbin binaries, OpenTPU binaries, .npy images,
regression manifests, debugger batch scripts, `fmt` (its code, errors, BOM and line
endings kept), `infer` on a tampered compiled model, `sweep` grid files and `--set`
arguments, the language server's frames (a client session of hostile requests),
`compile` on mutated ONNX models (bytes, shapes, attributes, initializers, opsets; a
refusal is one message and leaves no OUTDIR) and the debugger's command line (`debug ...
--batch SCRIPT` with mutated arguments and scripts; no file written but a --screenshot).  Hypothesis draws the generators'
random streams, so a failure is replayed and reported by its seed.

The long mode is `make fuzz` (tests/fuzzing/driver.py: 100,000 cases per target).
"""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzzing"))
from harness import Worker, check  # noqa: E402
from targets import SHORT_CASES, TARGETS  # noqa: E402

CASES = os.environ.get("FUZZ_SHORT_CASES")


@pytest.fixture(scope="module")
def workers():
    pool: dict[str, Worker] = {}
    yield pool
    for w in pool.values():
        w.stop()


@pytest.mark.parametrize("target", list(TARGETS))
def test_fuzz_short(target, workers):
    gen, _, allowed = TARGETS[target]
    worker = workers.setdefault(target, Worker(target))

    @settings(max_examples=int(CASES) if CASES else SHORT_CASES.get(target, 60),
              deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.integers(0, 2 ** 32 - 1))
    def one(seed):
        case = gen(random.Random(seed))
        _, problems = check(worker, case, allowed)
        assert not problems, f"{target} case from seed {seed} ({len(case)} bytes): " \
                             + "\n".join(problems)

    one()

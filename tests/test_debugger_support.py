"""Programs, data and an independent numpy oracle shared by the debugger tests.

The small programs run at N = 8 with a few UB rows so that every test is quick.
"""
from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

# Two layers: relu(x @ w0) then (h @ w1), int8 requantization with the reset registers.
# Line numbers matter: the tests break on them.
SMALL = """\
; a tiny two-layer program for the debugger tests
.config array_size=8, ub_rows=64, acc_rows=32
.host  x, 4
.host  y, 4
.ub    input, 4
.ub    hidden, 4
.acc   sums, 4
.tile  w, 2

    RHM  host.x, input, 4
    RW   tile.w
    RW   tile.w + 1
    TAG  7
    MMC.SO input, sums, 4
    ACT.R  sums, hidden, 4
    MMC.SO hidden, sums, 4
    ACT    sums, hidden, 4
    WHM  hidden, host.y, 4
    INT  3
    HLT
"""
LINE_RHM, LINE_TAG, LINE_MMC1, LINE_ACT1, LINE_MMC2, LINE_ACT2, LINE_WHM = 10, 13, 14, 15, 16, 17, 18

# A MatrixMultiply with no weight tile resident: a `no_tile` fault at run time.
FAULTY = """\
.config array_size=8, ub_rows=64, acc_rows=32
.ub    input, 4
.acc   sums, 4
    TAG  1
    MMC.O input, sums, 4
    HLT
"""

# Long enough to interrupt: thousands of back-to-back host reads.
LONG = """\
.config array_size=8, ub_rows=64, acc_rows=32
.host x, 4
.ub   input, 4
.rept 4000
    RHM host.x, input, 4
.endr
    HLT
"""


def small_data(rng_seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rng_seed)
    host = rng.integers(-6, 7, (8, 8)).astype(np.int8)
    weights = rng.integers(-4, 5, (2, 8, 8)).astype(np.int8)
    return host, weights


def oracle(host: np.ndarray, weights: np.ndarray) -> dict[str, np.ndarray]:
    """What SMALL computes, from spec/isa.md alone, in plain numpy."""
    x = host[0:4].astype(np.int64)
    acc1 = x @ weights[0].astype(np.int64)
    hidden1 = np.clip(np.maximum(acc1, 0), -128, 127)
    acc2 = hidden1 @ weights[1].astype(np.int64)
    hidden2 = np.clip(acc2, -128, 127)
    return {"acc1": acc1, "hidden1": hidden1, "acc2": acc2, "hidden2": hidden2}


def write_program(directory: Path, source: str = SMALL, name: str = "small.tasm",
                  seed: int = 1) -> Namespace:
    """Program and data files in `directory`; returns what the CLI would parse."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(source)
    host, weights = small_data(seed)
    np.save(directory / "host.npy", host)
    np.save(directory / "w.npy", weights)
    return Namespace(program=directory / name, host=directory / "host.npy",
                     weights=directory / "w.npy", config=[], host_array=host,
                     weights_array=weights)


def make_session(directory: Path, source: str = SMALL, name: str = "small.tasm"):
    """A Session on a relative program path (`directory` must be the cwd), so that file
    names in messages and screenshots do not depend on where the test runs."""
    from debugger.cli import load_session
    args = write_program(directory, source, name)
    args.program, args.host, args.weights = Path(name), Path("host.npy"), Path("w.npy")
    return load_session(args)


ROOT = Path(__file__).resolve().parents[1]
MATMUL_TILED = ROOT / "programs" / "matmul_tiled" / "matmul_tiled.tasm"
MATMUL_TILED_MMC2 = 26          # the second MMC.SO line of that program


def matmul_tiled_session(directory: Path):
    """programs/matmul_tiled at the real shape (N = 256, UB 98,304 x 256) with the data
    and expected output of its own generator (an independent numpy model)."""
    from debugger.cli import load_session
    from tpuasm.regression.runner import generate
    generate(MATMUL_TILED.parent / "gen.py", directory)
    session = load_session(Namespace(program=MATMUL_TILED, host=directory / "host.npy",
                                     weights=directory / "weights.npy", config=[]))
    return session, np.load(directory / "y.npy", allow_pickle=False)


# -- fixtures and helpers shared by the engine and the screen tests ---------------------------
@pytest.fixture
def here(tmp_path, monkeypatch):
    """A fresh cwd: the session's relative file names do not depend on where tests run."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def machine_state(m) -> dict:
    """Everything observable through the API, for exact comparisons."""
    return {"cycle": m.cycle, "status": m.status, "ub": m.ub.copy(), "acc": m.acc.copy(),
            "host": m.host.copy(), "counters": m.counters(), "pipeline": m.pipeline(),
            "registers": m.registers(), "fifo": m.fifo(), "shadow": m.shadow(),
            "active": m.active(), "events": list(m.events)}


def assert_same_state(a: dict, b: dict) -> None:
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert np.array_equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def fresh_state_at(here: Path, cycle: int, source: str = SMALL) -> dict:
    """An independent machine, never reversed, stepped to `cycle`."""
    from tpuasm.assembler import assemble_file
    from tpuasm.machine import Machine
    program = assemble_file(Path("small.tasm"))          # relative, like the session's
    m = Machine.for_program(program)
    m.load(program, host=here / "host.npy", weights=here / "w.npy")
    m.step(cycle)
    return machine_state(m)


@pytest.fixture
def engine(here):
    """A batch command engine over a session of the small program."""
    from debugger.commands import Engine
    return Engine(make_session(here))


def run(engine, line, ok=True):
    """Execute one command line, asserting it succeeds (or fails, with ok=False)."""
    r = engine.execute(line)
    assert r.ok is ok, r.text()
    return r


def commands(*lines):
    """A snapshot run_before callback that types command lines and waits for the machine."""
    async def run_before(pilot):
        await pilot.pause()
        for line in lines:
            pilot.app.execute(line)
            await pilot.app.workers.wait_for_complete()
            await pilot.pause()
    return run_before

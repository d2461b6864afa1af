"""Figure 11's machines, timing-only: every configuration of `python -m tpuasm.apps.figure11`
(array 64 x 64 to 1024 x 1024, the accumulator and bandwidth settings of each knob, TPU')
gives a small program the cycles and counters of a full run; and the apps' cached decoded
tables (apps/tables.py), which let a sweep point skip the assembler, run exactly as the
assembled program does."""
from __future__ import annotations

import numpy as np
import pytest

from tpuasm.machine import Machine, MachineConfig

from _machine_programs import I, program


def figure11_configs() -> list[dict]:
    """Every distinct MachineConfig of figure11's grids (its knobs x factors, and TPU')."""
    from tpuasm.apps.figure11 import FACTORS, KNOB_ORDER, tpu_prime_grids
    from tpuasm.sweep.grid import Grid, parse_set
    factors = ",".join(f"{f:g}" for f in FACTORS)
    grids = [Grid([parse_set(f"{k}={factors}") for k in KNOB_ORDER], {}, each=True),
             *tpu_prime_grids()]
    seen = {}
    for grid in grids:
        for _, config in grid.points({}):
            seen[repr(sorted(config.items()))] = config
    return list(seen.values())


CONFIGS = figure11_configs()


def small_program(config: MachineConfig):
    """RHM -> MMC.S (weight stall, input stall) -> ACT -> MMC reading the ACT's rows and
    more host rows (RAW and input stalls both) -> a 16-bit weight pair -> WHM."""
    n = config.array_size
    return program(
        I("RW", repeat=4, tile=0),
        I("RHM", host=0, ub=0, length=40),
        I("MMC", "SO", ub=0, acc=0, length=40),
        I("ACT", acc=0, ub=100, length=40),
        I("RHM", host=40, ub=140, length=60),
        I("MMC", "SO", ub=100, acc=64, length=100),
        I("ACT", acc=64, ub=300, length=100),
        I("MMC", "SOD", ub=300, acc=200, length=20),
        I("WHM", ub=300, host=0, length=20),
        I("HLT"),
        array_size=n, ub_rows=config.ub_rows, acc_rows=config.acc_rows,
        fifo_depth=config.fifo_depth)


def test_the_grid_covers_every_array_size_of_figure_11():
    sizes = {MachineConfig(**c).array_size for c in CONFIGS}
    assert sizes == {64, 128, 256, 512, 1024}
    assert len(CONFIGS) >= 20


@pytest.mark.parametrize("index", range(len(CONFIGS)))
def test_timing_only_equals_full_run_at_every_figure11_machine(index):
    config = MachineConfig(**CONFIGS[index])
    n = config.array_size
    g = np.random.default_rng(index)
    host = g.integers(-128, 128, (128, n)).astype(np.int8)
    weights = g.integers(-128, 128, (4, n, n)).astype(np.int8)
    prog = small_program(config)
    machines = []
    for timing_only in (False, True):
        m = Machine(config, timing_only=timing_only)
        m.load(prog, host=host, weights=weights)
        assert m.run().status == "halted"
        machines.append(m)
    full, fast = machines
    assert fast.cycle == full.cycle
    assert fast.counters() == full.counters()
    assert np.array_equal(fast.times, full.times)
    c = full.counters()
    # the program does wait on both kinds of producer somewhere
    assert c["input_stall_cycles"] > 0 and c["weight_stall_cycles"] > 0
    # without the tile scan: the same counters, the MAC-derived ones left out
    lean = fast.counters(useful_macs=False)
    assert lean["useful_macs"] is None and lean["tops"] is None
    assert {k: v for k, v in lean.items() if v is not None} == \
        {k: v for k, v in c.items() if k not in ("useful_macs", "tops", "mxu_utilization")}


@pytest.mark.parametrize("array_size", [64, 256])
def test_an_apps_cached_table_runs_as_its_assembled_program(array_size):
    """MLP1 from the table cache against MLP1 assembled from its source: the same table,
    the same cycles and counters timing-only and in a full run, and the instructions'
    text when asked for."""
    from tpuasm.apps.programs import app_program
    from tpuasm.machine.machine import _decoded
    ap = app_program("MLP1", array_size=array_size)
    fast_program, assembled = ap.program(), ap.assemble()
    table, invalid = _decoded(fast_program)
    want, want_invalid = _decoded(assembled)
    assert np.array_equal(table, want) and np.array_equal(invalid, want_invalid)
    assert fast_program.shape == assembled.shape
    assert len(fast_program.instructions) == len(assembled.instructions)
    assert fast_program.instructions[3] == assembled.instructions[3]
    assert fast_program.locations[3] == assembled.locations[3]
    config = MachineConfig.from_shape(assembled.shape)
    runs = []
    for prog, timing_only in ((assembled, False), (fast_program, True), (fast_program, False)):
        m = Machine(config, timing_only=timing_only)
        m.load(prog, *ap.data())
        assert m.run().status == "halted"
        runs.append((m.cycle, m.counters()))
    assert runs[0] == runs[1] == runs[2]


def test_a_damaged_table_file_is_rebuilt(tmp_path, monkeypatch):
    from tpuasm.apps import tables
    from tpuasm.apps.programs import app_program
    from tpuasm.machine.machine import _decoded
    ap = app_program("MLP1")
    path = tmp_path / "table.npz"
    monkeypatch.setattr(tables, "table_path", lambda *a, **k: path)
    path.write_bytes(b"not a table")
    table, _, shape = tables.decoded(ap)
    assert np.array_equal(table, _decoded(ap.assemble())[0])
    with np.load(path) as z:                      # written back, narrowed to int32
        assert z["table"].dtype == np.int32 and np.array_equal(z["table"], table)

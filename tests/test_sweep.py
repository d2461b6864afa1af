"""tpuasm sweep: grids, the Dask executor, the cache, failures and bad input.

Oracle: each point run directly on a Machine built by hand from the documented knob
formulas (spec: tpuasm/sweep/grid.py docstrings), not through the sweep's own code path.
"""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from tpuasm.assembler import assemble
from tpuasm.machine import Machine, MachineConfig
from tpuasm.sweep import cli
from tpuasm.sweep.cache import ResultCache
from tpuasm.sweep.engine import run_sweep
from tpuasm.sweep.grid import Grid, SweepError, config_for, load_toml, parse_set
from tpuasm.sweep.targets import resolve

PROGRAM = """\
.config array_size=16
.host x, 8
.ub a, 8
.acc s, 8
        RW 0, repeat=2
        RHM host.x, ub.a, 8
        MMC.SO ub.a, acc.s, 8
        MMC.S ub.a, acc.s, 8
        ACT.R acc.s, ub.a, 8
        WHM ub.a, host.x, 8
        HLT
"""


@pytest.fixture()
def program(tmp_path):
    src = tmp_path / "p.tasm"
    src.write_text(PROGRAM)
    np.save(tmp_path / "h.npy", np.arange(128, dtype=np.int8).reshape(8, 16))
    np.save(tmp_path / "w.npy", np.ones((2, 16, 16), np.int8))
    return src, tmp_path / "h.npy", tmp_path / "w.npy"


def direct_cycles(src, host, weights, **config) -> int:
    prog = assemble(src.read_text(), str(src))
    m = Machine(MachineConfig(array_size=16, **config))
    m.load(prog, host=host, weights=weights)
    assert m.run().status == "halted"
    return int(m.counters()["cycles"])


def collect(targets, grid, **kw):
    rows = []
    summary = run_sweep(targets, grid, rows.append, **kw)
    return rows, summary


def test_local_cluster_matches_direct_runs(program):
    src, host, weights = program
    from tpuasm.cluster import dask_client
    grid = Grid([parse_set("weight_bytes_per_cycle=x0.5,x2"), parse_set("memory=1,4"),
                 parse_set("host_latency_cycles=0,700")], {})
    targets = resolve([src], host, weights)
    with dask_client(workers=2, processes=False) as client:
        rows, summary = collect(targets, grid, client=client)
    assert summary.total == 8 and summary.by_status == {"ok": 8}
    base_bw = 34e9 / 700e6
    for r in rows:
        bw = base_bw * float(r["weight_bytes_per_cycle"][1:]) * float(r["memory"])
        want = direct_cycles(src, host, weights, weight_bytes_per_cycle=bw,
                             host_latency_cycles=int(r["host_latency_cycles"]))
        assert r["cycles"] == want, r


def test_resume_skips_finished_points(program, tmp_path):
    src, host, weights = program
    cache_path = tmp_path / "cache.sqlite"
    targets = resolve([src], host, weights)
    first = Grid([parse_set("fifo_depth=1,2")], {})
    rows1, s1 = collect(targets, first, cache=ResultCache(cache_path))
    assert s1.cached == 0 and s1.by_status == {"ok": 2}
    # the "interrupted" sweep did two of four points; the full one reruns only the others
    full = Grid([parse_set("fifo_depth=1,2,3,4")], {})
    rows2, s2 = collect(targets, full, cache=ResultCache(cache_path))
    assert s2.total == 4 and s2.cached == 2
    cached = {r["fifo_depth"]: r["cycles"] for r in rows2 if r.get("cached")}
    assert cached == {r["fifo_depth"]: r["cycles"] for r in rows1}
    assert {r["fifo_depth"] for r in rows2 if not r.get("cached")} == {"3", "4"}


def test_a_failing_point_is_reported_and_the_rest_complete(program):
    src, host, weights = program
    # 4 accumulator rows cannot hold `.acc s, 8`: that point cannot assemble
    grid = Grid([parse_set("acc_rows=4,64,128")], {})
    rows, summary = collect(resolve([src], host, weights), grid)
    by = {r["acc_rows"]: r for r in rows}
    assert by["4"]["status"] == "error" and "acc" in by["4"]["error"].lower()
    assert by["64"]["status"] == by["128"]["status"] == "ok"
    assert summary.failed == 1


def test_knobs_follow_their_formulas():
    base = MachineConfig()
    c = config_for({"clock": ("x", 2.0)}, {})
    assert c["clock_hz"] == 1.4e9
    assert c["weight_bytes_per_cycle"] == pytest.approx(base.weight_bandwidth / 2)
    assert c["host_latency_cycles"] == 1400
    m = config_for({"matrix": ("x", 2.0)}, {})
    assert (m["array_size"], m["acc_rows"], m["ub_rows"]) == (512, 2048, 49152)
    assert config_for({"clock+": ("x", 4.0)}, {})["acc_rows"] == 16384
    # matrix+: accumulators "with the square of the rise in one dimension" (section 7):
    # 32-bit accumulators per multiplier stay at TPU v1's 4096 x 256 / 256^2 = 16
    for s, n, rows in ((0.25, 64, 1024), (0.5, 128, 2048), (2.0, 512, 8192),
                       (4.0, 1024, 16384)):
        c = config_for({"matrix+": ("x", s)}, {})
        assert (c["array_size"], c["acc_rows"]) == (n, rows)
        assert c["acc_rows"] * n / n ** 2 == 16
        plain = config_for({"matrix": ("x", s)}, {})
        assert c["acc_rows"] == plain["acc_rows"] * s * s


@pytest.mark.parametrize("args, message", [
    (["--set", "warp_speed=1,2"], "unknown parameter 'warp_speed'"),
    (["--set", "array_size=0"], "array_size 0 out of range"),
    (["--set", "fifo_depth=x0"], "not a positive scale factor"),
    (["--set", "clock_hz=fast"], "not a number"),
    ([], "empty grid"),
    (["--set", "memory="], "no values"),
])
def test_bad_sweep_input_is_one_clear_error(program, tmp_path, capsys, args, message):
    src, host, weights = program
    code = cli.main([str(src), "--host", str(host), "--weights", str(weights),
                     "-o", str(tmp_path / "r.csv"), "--workers", "0", "--no-cache", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err and err.count("error:") == 1


@pytest.mark.parametrize("text, message", [
    ("[grid\nmemory = [1]", "not valid TOML"),
    ("[grid]\n", "empty grid"),
    ("[grid]\nmemory = []", "no values"),
    ("[grid]\nacc_rows = [0]", "out of range"),
    ("[base]\nbogus = 1\n[grid]\nmemory = [1]", "base.bogus"),
    ("colour = 1", "unknown key"),
])
def test_bad_grid_files(program, tmp_path, capsys, text, message):
    src, host, weights = program
    grid = tmp_path / "g.toml"
    grid.write_text(text)
    code = cli.main([str(src), "--host", str(host), "--weights", str(weights), "--grid",
                     str(grid), "-o", str(tmp_path / "r.csv"), "--workers", "0", "--no-cache"])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_writes_csv_table_and_plot(program, tmp_path, capsys):
    src, host, weights = program
    grid = tmp_path / "g.toml"
    grid.write_text('each = true\n[grid]\nmemory = [0.5, 1, 2]\n'
                    'host_latency_cycles = ["x0.5", "x1"]\n')
    out, png = tmp_path / "r.csv", tmp_path / "f.png"
    code = cli.main([str(src), "--host", str(host), "--weights", str(weights), "--grid",
                     str(grid), "-o", str(out), "--workers", "0", "--no-cache",
                     "--plot", str(png)])
    assert code == 0
    rows = list(csv.DictReader(out.open()))
    # one at a time: memory 0.5, 1, 2 with latency at base, then latency x0.5 (x1 = base)
    assert [(r["memory"], r["host_latency_cycles"]) for r in rows] == [
        ("0.5", "base"), ("1", "base"), ("2", "base"), ("1", "x0.5")]
    assert png.stat().st_size > 1000
    text = capsys.readouterr().out
    assert "sweep results" in text and "performance relative" in text
    # one target: both means are its own relative performance, side by side
    rel = direct_cycles(src, host, weights) / direct_cycles(
        src, host, weights, weight_bytes_per_cycle=2 * MachineConfig().weight_bandwidth)
    assert "geometric mean" in text
    assert any(line.split("│")[1:5] and [c.strip() for c in line.split("│")[1:5]] ==
               ["memory", "2", f"{rel:.3f}", f"{rel:.3f}"] for line in text.splitlines())


def test_toml_grid_parses(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('targets = ["MLP0"]\n[base]\nfifo_depth = 8\n[grid]\nmemory = [1, 2]\n')
    grid = load_toml(g)
    assert grid.targets == ("MLP0",) and grid.base == {"fifo_depth": 8}
    assert [s for s, _ in grid.points()] == [{"memory": "1"}, {"memory": "2"}]
    with pytest.raises(SweepError):
        Grid([], {}).validate()


def test_a_sweep_point_reruns_alone_with_run_config(program, tmp_path, capsys):
    """The CSV's row and `tpuasm run --config` of the same settings agree."""
    import json

    from tpuasm.cli import main as tpuasm_main
    src, host, weights = program
    out = tmp_path / "r.csv"
    assert cli.main([str(src), "--host", str(host), "--weights", str(weights), "-o", str(out),
                     "--workers", "0", "--no-cache", "--no-table",
                     "--set", "clock_hz=1.4e9", "--set", "host_latency_cycles=0,350"]) == 0
    for row in csv.DictReader(out.open()):
        stats = tmp_path / "s.json"
        assert tpuasm_main(["run", str(src), "--host", str(host), "--weights", str(weights),
                            "-q", "--stats", str(stats), "--config",
                            f"clock_hz={row['clock_hz']},"
                            f"host_latency_cycles={row['host_latency_cycles']}"]) == 0
        assert json.loads(stats.read_text())["cycles"] == int(row["cycles"])


@pytest.mark.parametrize("setting, message", [
    ("clock_hz=-5", "clock_hz must be positive"),
    ("shift_cycles=1.5", "shift_cycles must be an integer"),
    ("warp=9", "unknown setting 'warp'"),
    ("hazards=maybe", "hazards must be"),
])
def test_run_config_rejects_bad_machine_settings(program, capsys, setting, message):
    from tpuasm.cli import main as tpuasm_main
    src, host, weights = program
    code = tpuasm_main(["run", str(src), "--host", str(host), "--weights", str(weights),
                        "--config", setting])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_regression_runner_on_a_dask_cluster(tmp_path, capsys):
    """`tpuasm test --scheduler ADDR` gives the same verdicts as the local runner."""
    from dask.distributed import LocalCluster

    from tpuasm.regression.cli import main as test_main
    (tmp_path / "p.tasm").write_text(PROGRAM)
    np.save(tmp_path / "h.npy", np.ones((8, 16), np.int8))
    np.save(tmp_path / "w.npy", np.ones((2, 16, 16), np.int8))
    (tmp_path / "test.toml").write_text(
        '[test]\nprogram = "p.tasm"\n[data]\nhost = "h.npy"\nweights = "w.npy"\n'
        '[expect.counters]\narray_active_cycles = 16\n')
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        assert test_main([str(tmp_path), "--scheduler", cluster.scheduler_address, "-q"]) == 0
    assert "1 passed" in capsys.readouterr().out
    assert test_main([str(tmp_path), "--scheduler", "tcp://127.0.0.1:1", "-q"]) == 2


def test_relative_performance_and_weighted_mean_by_hand():
    from tpuasm.sweep.report import present, relative, weighted_mean
    rows = [{"target": "MLP0", "memory": "1", "status": "ok", "time_us": "100"},
            {"target": "MLP0", "memory": "4", "status": "ok", "time_us": "40"},
            {"target": "CNN0", "memory": "1", "status": "ok", "time_us": "10"},
            {"target": "CNN0", "memory": "4", "status": "ok", "time_us": "10"},
            {"target": "CNN0", "memory": "2", "status": "error", "time_us": ""},
            {"target": "MLP0", "memory": "2", "status": "ok", "time_us": "50"}]
    rel = relative(rows, ["memory"])
    assert rel[("MLP0", "memory")] == [(1.0, 1.0), (2.0, 2.0), (4.0, 2.5)]
    assert rel[("CNN0", "memory")] == [(1.0, 1.0), (4.0, 1.0)]
    mean = weighted_mean(rel, ["memory"])["memory"]
    # workload shares: MLP0 30.5, CNN0 2.5
    assert mean[1] == (4.0, pytest.approx((30.5 * 2.5 + 2.5 * 1.0) / 33.0))
    assert [x for x, _ in mean] == [1.0, 4.0]          # x2: CNN0 failed, no mean
    # partial: the mean of the apps a point has (Figure 11's marked means)
    partial = dict(weighted_mean(rel, ["memory"], partial=True)["memory"])
    assert partial[2.0] == pytest.approx(2.0) and present(rel, "memory", 2.0) == ["MLP0"]
    assert present(rel, "memory", 4.0) == ["CNN0", "MLP0"]


def test_geometric_mean_by_hand():
    """Every target counts once (the paper's geometric means); the same points as the
    weighted mean, with partial means over the targets a point has."""
    from tpuasm.sweep.report import geometric_mean, relative, weighted_mean
    rows = [{"target": t, "memory": m, "status": "ok", "time_us": str(us)}
            for t, m, us in (("MLP0", "1", 100), ("MLP0", "4", 40), ("CNN0", "1", 10),
                             ("CNN0", "4", 10), ("LSTM1", "1", 90), ("LSTM1", "4", 45),
                             ("MLP0", "2", 50))]
    rel = relative(rows, ["memory"])
    geo = dict(geometric_mean(rel, ["memory"])["memory"])
    assert set(geo) == {1.0, 4.0}                      # x2: only MLP0 has it
    assert geo[4.0] == pytest.approx((2.5 * 1.0 * 2.0) ** (1 / 3))
    assert geo[1.0] == pytest.approx(1.0)
    assert dict(geometric_mean(rel, ["memory"], partial=True)["memory"])[2.0] == \
        pytest.approx(2.0)
    wm = dict(weighted_mean(rel, ["memory"])["memory"])
    assert wm[4.0] == pytest.approx((30.5 * 2.5 + 2.5 * 1.0 + 14.5 * 2.0) / 47.5)


def test_figure11_runs_the_tpu_prime_point(tmp_path, capsys):
    """TPU' (section 7): clock 1050 MHz, GDDR5 (ridge 1350 -> 250: bandwidth x5.4), both.
    Oracle: MLP1 run directly on machines configured by hand from those numbers."""
    from tpuasm.apps import figure11
    from tpuasm.apps.programs import app_program
    out = tmp_path / "f11"
    assert figure11.main(["--apps", "MLP1", "--knobs", "memory,clock", "--factors", "1",
                          "--workers", "0", "--cache", str(tmp_path / "c.sqlite"),
                          "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert sorted((r["clock"], r["memory"]) for r in rows) == [
        ("1", "1"), ("1", "5.4"), ("1.5", "1"), ("1.5", "5.4")]
    ap = app_program("MLP1")
    base = MachineConfig()

    def seconds(**config):
        c = MachineConfig(**config)
        m = Machine(c, timing_only=True)
        m.load(ap.assemble(), *ap.data())
        m.run()
        return int(m.counters()["cycles"]) / c.clock_hz

    t0 = seconds()
    fast_clock = dict(clock_hz=1.05e9, weight_bytes_per_cycle=base.weight_bandwidth / 1.5,
                      host_bytes_per_cycle=base.host_bandwidth / 1.5,
                      host_latency_cycles=round(base.host_latency * 1.5))
    gddr5 = dict(weight_bytes_per_cycle=base.weight_bandwidth * 1350 / 250)
    both = dict(fast_clock, weight_bytes_per_cycle=base.weight_bandwidth * 5.4 / 1.5)
    text = capsys.readouterr().out
    for name, config in (("clock 1050 MHz (x1.5), DDR3", fast_clock),
                         ("GDDR5 (x5.4), 700 MHz", gddr5), ("GDDR5 and 1050 MHz", both)):
        r = t0 / seconds(**config)
        assert f"| {name} | {r:.2f}x | {r:.2f}x |" in text
    # memory-bound: GDDR5 helps, the clock alone does not
    assert t0 / seconds(**gddr5) > 2 and t0 / seconds(**fast_clock) < 1.05


RESULT_ONLY = ("wall_s", "key", "cached")


def test_timing_only_sweep_gives_the_full_sweeps_numbers(program):
    """Cycles and every counter equal with and without the arithmetic: a program with
    non-zero data, and an app (the compiled MLP1) on memory, clock and matrix points
    (each run directly by the emulator's own tests/test_timing_only.py as well)."""
    from tpuasm.sweep.targets import Target
    src, host, weights = program
    targets = resolve([src], host, weights) + [Target("app", "MLP1")]
    grid = Grid([parse_set("memory=0.5,2"), parse_set("clock=2"), parse_set("matrix=0.5")],
                {}, each=True)
    full, s1 = collect(targets, grid)
    fast, s2 = collect(targets, grid, timing_only=True)
    # the program's data images are 16 wide: at matrix x0.5 (8 x 8) it is skipped
    assert s1.by_status == s2.by_status == {"ok": 7, "skipped": 1}
    (skipped,) = [r for r in fast if r["status"] == "skipped"]
    assert skipped["target"] == "p.tasm" and "16-wide array, not 8" in skipped["error"]
    for a, b in zip(full, fast):
        assert a["key"] != b["key"]            # the mode is part of the cache key
        assert {k: v for k, v in a.items() if k not in RESULT_ONLY} == \
            {k: v for k, v in b.items() if k not in RESULT_ONLY}


def test_figure11_script_relative_performance(tmp_path, capsys):
    """python -m tpuasm.apps.figure11 on one app and two knobs: MLP1's relative performance
    at memory x2 is the ratio of two direct Machine runs (bandwidth doubled by hand)."""
    from tpuasm.apps import figure11
    from tpuasm.apps.programs import app_program
    out = tmp_path / "f11"
    assert figure11.main(["--apps", "MLP1", "--knobs",
                          "memory,matrix", "--factors", "1,2", "--workers", "0",
                          "--cache", str(tmp_path / "c.sqlite"), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    assert [(r["memory"], r["matrix"], r["status"]) for r in rows] == [
        ("1", "1", "ok"), ("2", "1", "ok"), ("1", "2", "ok")]
    ap = app_program("MLP1")
    cycles = []
    for bw in (34e9 / 700e6, 2 * 34e9 / 700e6):
        m = Machine(MachineConfig(weight_bytes_per_cycle=bw), timing_only=True)
        m.load(ap.assemble(), *ap.data())
        m.run()
        cycles.append(int(m.counters()["cycles"]))
    text = capsys.readouterr().out
    # one app: its weighted and geometric means are its own value
    r = cycles[0] / cycles[1]
    assert f"| memory | x2 | {r:.2f}x | {r:.2f}x |" in text
    assert "| LSTM1's 600x600 matrix on a 512x512 unit (hand) | 4 steps, 32 us |" in text
    assert out.with_suffix(".png").stat().st_size > 1000
    assert out.with_suffix(".svg").is_file()


@pytest.mark.parametrize("source", ["hand", "compiler"])
def test_lstm1_600x600_example_tiles_and_fragmentation(source):
    """ceil(600/256)^2 = 9 tiles vs ceil(600/512)^2 = 4, each 4x the bytes: weight-bound,
    so the 512 x 512 array takes longer, and at least the tiles' fetch time each."""
    from tpuasm.apps.figure11 import lstm1_example
    small, big = lstm1_example(256, source), lstm1_example(512, source)
    assert (small["steps"], big["steps"]) == (9, 4)
    assert small["fetch_cycles"] == math.ceil(256 * 256 / (34e9 / 700e6))   # 34 GB/s
    assert small["cycles"] >= 9 * small["fetch_cycles"]
    assert big["cycles"] >= 4 * big["fetch_cycles"] > small["cycles"]

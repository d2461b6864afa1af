"""tpuasm.cluster: distributed runs cannot mix code versions.  A worker whose code digest
differs from the client's is refused before it computes anything (up front, and by every
task for a worker that joins later); result-cache keys carry the digest and nothing about
the face that asked; a scheduler without workers is a warning after a few seconds."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from tpuasm.cluster import ClusterError, code_digest, dask_client, wait_for_workers
from tpuasm.sweep import engine
from tpuasm.sweep.cache import ResultCache
from tpuasm.sweep.engine import run_sweep, tasks
from tpuasm.sweep.grid import Grid, parse_set
from tpuasm.sweep.targets import Target, resolve

PROGRAM = """\
.config array_size=16
.host x, 8
.ub a, 8
.acc s, 8
        RW 0
        RHM host.x, ub.a, 8
        MMC.SO ub.a, acc.s, 8
        ACT.R acc.s, ub.a, 8
        WHM ub.a, host.x, 8
        HLT
"""


@pytest.fixture()
def program(tmp_path):
    src = tmp_path / "p.tasm"
    src.write_text(PROGRAM)
    np.save(tmp_path / "h.npy", np.arange(128, dtype=np.int8).reshape(8, 16))
    np.save(tmp_path / "w.npy", np.ones((1, 16, 16), np.int8))
    return resolve([src], tmp_path / "h.npy", tmp_path / "w.npy")


class OtherCodeClient:
    """A client whose one worker runs other code; records anything submitted."""
    def __init__(self):
        self.submitted = []

    def run(self, fn):
        return {"tcp://10.0.0.9:4000": "0" * 16}

    def submit(self, *args, **kw):
        self.submitted.append(args)
        raise AssertionError("submitted to a worker on other code")

    def nthreads(self):
        return {"tcp://10.0.0.9:4000": 1}


def test_sweep_refuses_workers_on_other_code_before_submitting(program, tmp_path):
    client = OtherCodeClient()
    cache = ResultCache(tmp_path / "c.sqlite")
    rows = []
    with pytest.raises(ClusterError, match=r"1 of 1 Dask workers run other tpuasm code.*"
                                           r"10\.0\.0\.9"):
        run_sweep(program, Grid([parse_set("fifo_depth=2,4")], {}), rows.append,
                  cache=cache, client=client)
    assert client.submitted == [] and rows == []
    assert cache.db.execute("SELECT COUNT(*) FROM points").fetchone()[0] == 0


def test_a_worker_on_other_code_refuses_each_task_and_nothing_is_cached(program, tmp_path,
                                                                       monkeypatch):
    # the client's tasks say "code fff..." (as if the client ran other code than the
    # worker, which passed the up-front check by joining later): every point is refused
    # by the worker, reported, and not cached
    monkeypatch.setattr(engine, "code_digest", lambda: "f" * 16)
    cache = ResultCache(tmp_path / "c.sqlite")
    rows = []
    with dask_client(workers=1, processes=False) as client:
        summary = run_sweep(program, Grid([parse_set("fifo_depth=2,4")], {}), rows.append,
                            cache=cache, client=client)
    assert summary.by_status == {"error": 2}
    assert all("runs other tpuasm code" in r["error"] and "ffff" in r["error"] for r in rows)
    assert cache.db.execute("SELECT COUNT(*) FROM points").fetchone()[0] == 0


def test_point_keys_carry_the_code_digest(program, monkeypatch):
    grid = Grid([parse_set("fifo_depth=2,4")], {})
    ours = [t["key"] for t in tasks(program, grid)]
    monkeypatch.setattr(engine, "code_digest", lambda: "0" * 16)
    other = [t["key"] for t in tasks(program, grid)]
    assert len(set(ours)) == 2 and not set(ours) & set(other)
    assert all(t["code"] == "0" * 16 for t in tasks(program, grid))


def test_figure11_and_sweep_apps_share_keys():
    # `tpuasm sweep MLP0 --set memory=0.5` and figure11's memory knob (its factors, one
    # knob at a time) name the same point with the same key
    from tpuasm.apps.figure11 import tpu_prime_grids
    sweep_keys = {t["key"]: t["settings"] for t in
                  tasks(resolve(["mlp0"]), Grid([parse_set("memory=0.5")], {}))}
    fig = Grid([parse_set("memory=0.25,0.5,1"), parse_set("clock=0.5,1")], {}, each=True)
    fig_keys = {t["key"] for t in tasks([Target("app", "MLP0")], fig)}
    assert len(sweep_keys) == 1 and set(sweep_keys) <= fig_keys
    prime = {t["key"] for g in tpu_prime_grids() for t in tasks([Target("app", "MLP0")], g)}
    both = {t["key"] for t in tasks(resolve(["MLP0"]),
                                     Grid([parse_set("clock=1.5"), parse_set("memory=5.4")],
                                          {}))}
    assert both <= prime


def test_no_workers_is_a_warning_after_a_few_seconds_then_the_run_goes_on():
    from dask.distributed import Client, LocalCluster
    warnings = []
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        timer = threading.Timer(1.0, lambda: cluster.scale(1))
        timer.start()
        try:
            count = wait_for_workers(client, warnings.append, after=0.3, address="tcp://x:1")
        finally:
            timer.cancel()
    assert count == 1
    assert len(warnings) == 1 and "tcp://x:1 has no Dask workers after 0.3 s" in warnings[0]


def test_workers_with_the_same_code_are_accepted_quietly():
    warnings = []
    with dask_client(workers=1, processes=False, warn=warnings.append) as client:
        assert client.run(code_digest) and warnings == []

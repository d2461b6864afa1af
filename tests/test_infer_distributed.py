"""`tpuasm infer --workers N / --scheduler ADDR`: rows spread over Dask workers give exactly
the single-process answer, in input order; a scheduler that cannot be reached, workers on
other code and a failing chunk are clear errors with nothing written."""
from __future__ import annotations

import socket

import numpy as np
import pytest

import float_models
from tpuasm.compiler import load
from tpuasm.compiler.cli import infer_main
from tpuasm.cluster import ClusterError, check_workers, code_digest
from tpuasm.compiler.runtime.distributed import chunk_ranges, outdir_files, run_on_cluster
from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.pipeline import compile_model

LAYERS = [("gemm", 12), ("relu",), ("gemm", 5)]


@pytest.fixture(scope="module")
def outdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    path = float_models.save(float_models.build(LAYERS, (7,)), d / "mlp.onnx")
    calib = np.random.default_rng(0).normal(0, 1, (40, 7)).astype(np.float32)
    compile_model(path, batch=4, calibration=calib, config={"array_size": 16}).save(d / "out")
    return d / "out"


@pytest.fixture(scope="module")
def rows():
    return np.random.default_rng(1).normal(0, 1, (37, 7)).astype(np.float32)


@pytest.fixture(scope="module")
def threads_client():
    from dask.distributed import Client, LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def test_chunks_are_whole_batches_covering_every_row():
    assert chunk_ranges(37, 4, 2, None) == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 37)]
    assert chunk_ranges(5, 4, 8, None) == [(0, 4), (4, 5)]
    assert chunk_ranges(10, 4, 1, 3) == [(0, 3), (3, 6), (6, 9), (9, 10)]


def test_cluster_run_equals_one_process_in_order(outdir, rows, threads_client):
    model = load(outdir)
    seen = []
    ours = run_on_cluster(outdir, model, {model.inputs[0].name: rows}, threads_client,
                          chunk_rows=4, progress=lambda done, total: seen.append(done))
    want = model.run(rows)
    assert ours.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(ours[name], want[name])
    assert seen[0] == 0 and seen[-1] == len(rows) and seen == sorted(seen)


def test_a_failing_chunk_names_its_rows(outdir, rows, threads_client):
    model = load(outdir)
    with pytest.raises(CompileError, match=r"rows \d+-\d+ failed on the cluster: ValueError: engine"):
        run_on_cluster(outdir, model, {model.inputs[0].name: rows[:8]}, threads_client,
                       engine="abacus")


def test_workers_on_other_code_are_refused():
    class Client:
        def run(self, fn):
            return {"tcp://10.0.0.7:4000": "0" * 16, "tcp://10.0.0.8:4000": code_digest()}
    with pytest.raises(ClusterError, match=r"1 of 2 Dask workers run other tpuasm code.*"
                                           r"10\.0\.0\.7"):
        check_workers(Client())


def test_only_what_a_run_reads_is_shipped(outdir):
    files = outdir_files(outdir)
    assert "manifest.json" in files and "model.qdq.onnx" in files
    assert not any(n.startswith("regression/") for n in files)


def test_infer_with_local_worker_processes(outdir, rows, tmp_path):
    np.save(tmp_path / "x.npy", rows)
    assert infer_main([str(outdir), str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                       "--workers", "2", "-q"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"),
                                  next(iter(load(outdir).run(rows).values())))


def test_an_unreachable_scheduler_touches_no_output(outdir, rows, tmp_path, capsys):
    with socket.socket() as s:              # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    np.save(tmp_path / "x.npy", rows)
    keep = tmp_path / "y.npy"
    keep.write_bytes(b"earlier results")
    code = infer_main([str(outdir), str(tmp_path / "x.npy"), "-o", str(keep), "-q",
                       "--scheduler", f"tcp://127.0.0.1:{port}"])
    assert code == 2
    assert "cannot reach the Dask scheduler" in capsys.readouterr().err
    assert keep.read_bytes() == b"earlier results"


@pytest.mark.parametrize("argv, words", [
    (["--workers", "0"], "must be at least 1"),
    (["--workers", "100000"], "at most"),
    (["--chunk-rows", "-3"], "must be at least 1"),
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], "not both"),
])
def test_cluster_options_are_checked(outdir, rows, tmp_path, capsys, argv, words):
    np.save(tmp_path / "x.npy", rows)
    code = infer_main([str(outdir), str(tmp_path / "x.npy"), "-o",
                       str(tmp_path / "y.npy"), "-q", *argv])
    assert code == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "y.npy").exists()


def test_inputs_cut_along_their_own_batch_axes_and_maps_chained(tmp_path, threads_client):
    # a sequence-first input (rows on axis 1) and a state passed whole; the cluster's
    # chunks follow the same axes as one process, and a ZipMap's maps come back as maps
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (6, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "h"],
                                                                        ["y"])],
        "seq", [helper.make_tensor_value_info("x", T.FLOAT, [3, "N", 6]),
                helper.make_tensor_value_info("h", T.FLOAT, [1, 1, 4])],
        [helper.make_tensor_value_info("y", T.FLOAT, [3, "N", 4])], [w])
    path = tmp_path / "seq.onnx"
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    import onnx
    onnx.save(onnx_model, str(path))
    calib = {"x": rng.normal(0, 1, (3, 20, 6)).astype(np.float32),
             "h": rng.normal(0, 1, (1, 1, 4)).astype(np.float32)}
    compile_model(path, batch=4, calibration=calib, config={"array_size": 16}).save(
        tmp_path / "out")
    model = load(tmp_path / "out")
    data = {"x": rng.normal(0, 1, (3, 11, 6)).astype(np.float32), "h": calib["h"]}
    ours = run_on_cluster(tmp_path / "out", model, data, threads_client, chunk_rows=4)
    np.testing.assert_array_equal(ours["y"], model.run(data)["y"])
    assert ours["y"].shape == (3, 11, 4)


def test_sequence_outputs_come_back_as_sequences(tmp_path, threads_client):
    skl2onnx = pytest.importorskip("skl2onnx")
    import onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    x, labels = load_iris(return_X_y=True)
    x = x.astype(np.float32)
    path = tmp_path / "lr.onnx"
    onnx.save(skl2onnx.to_onnx(LogisticRegression(max_iter=300).fit(x, labels), x[:1]),
              str(path))
    compile_model(path, batch=8, calibration=x).save(tmp_path / "out")
    model = load(tmp_path / "out")
    ours = run_on_cluster(tmp_path / "out", model, {"X": x}, threads_client, chunk_rows=16)
    want = model.run(x)
    np.testing.assert_array_equal(ours["output_label"], want["output_label"])
    assert isinstance(ours["output_probability"], list)
    assert ours["output_probability"] == want["output_probability"]


def test_a_worker_joining_on_other_code_refuses_its_chunk(outdir, rows, threads_client,
                                                         monkeypatch):
    # the up-front check passed; the chunks carry another digest than the workers' code
    from tpuasm.compiler.runtime import distributed
    monkeypatch.setattr(distributed, "code_digest", lambda: "e" * 16)
    model = load(outdir)
    with pytest.raises(CompileError, match=r"failed on the cluster: ClusterError: this Dask "
                                           r"worker runs other tpuasm code"):
        run_on_cluster(outdir, model, {model.inputs[0].name: rows[:8]}, threads_client)


def test_two_models_on_one_cluster_each_get_their_own_files(outdir, rows, tmp_path,
                                                             threads_client):
    # the files once travelled as a dict scattered under their names: a cluster that held
    # the first model's "manifest.json" handed it to the second model's run
    path = float_models.save(float_models.build([("gemm", 9), ("relu",), ("gemm", 3)], (7,)),
                             tmp_path / "other.onnx")
    calib = np.random.default_rng(2).normal(0, 1, (24, 7)).astype(np.float32)
    compile_model(path, batch=4, calibration=calib, config={"array_size": 16}).save(
        tmp_path / "other")
    for folder in (outdir, tmp_path / "other", outdir):
        model = load(folder)
        ours = run_on_cluster(folder, model, {model.inputs[0].name: rows}, threads_client,
                              chunk_rows=8)
        for name, want in model.run(rows).items():
            np.testing.assert_array_equal(ours[name], want)

"""Data-parallel inference on Dask: the rows of a run split into chunks, each chunk run by a
worker on its own copy of the compiled model, the outputs joined in input order.

The compiled model travels as the bytes of its OUTDIR (broadcast once to every worker), so a
cluster needs no shared disk; each worker process loads it once and keeps it for later chunks.
Before any chunk runs, every worker must hold the same tpuasm code as the client (a worker on
another version would compute other answers, or the same answers for other reasons:
tpuasm.cluster, shared with the sweep).  A chunk
whose worker dies is given to another worker by the scheduler; a chunk that fails names its
rows, and nothing is returned for the run.
"""
from __future__ import annotations

import hashlib
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

from tpuasm.cluster import check_workers, code_digest, refuse_other_code
from tpuasm.compiler.errors import CompileError

_SKIPPED = {"regression"}                  # OUTDIR folders a run never reads


def outdir_files(outdir) -> dict[str, bytes]:
    """The files a run of OUTDIR needs, {relative path: bytes}, read through tpuasm.files
    within limits.MAX_SHIPPED_MODEL_BYTES in all."""
    from tpuasm.files import read_input
    from tpuasm.limits import MAX_SHIPPED_MODEL_BYTES
    outdir = Path(outdir)
    files, total = {}, 0
    for path in sorted(outdir.rglob("*")):
        rel = path.relative_to(outdir)
        if rel.parts[0] in _SKIPPED or not path.is_file():
            continue
        data = read_input(path, what="compiled-model file",
                          limit=MAX_SHIPPED_MODEL_BYTES - total)
        total += len(data)
        files[rel.as_posix()] = data
    return files


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


_MODELS: dict[str, tuple] = {}    # per worker process: digest -> (CompiledModel, its folder)
_MODELS_LOCK = threading.Lock()   # a worker may run several tasks in threads


def _worker_model(key: str, files: dict[str, bytes]):
    with _MODELS_LOCK:
        return _loaded(key, files)


def _loaded(key: str, files: dict[str, bytes]):
    """The model of `key`, written into a folder of its own and loaded the first time (a
    loaded model holds everything it reads, so the previous model's folder can go)."""
    entry = _MODELS.get(key)
    if entry is None:
        from tpuasm.compiler.runtime.model import load
        from tpuasm.files import atomic_write
        folder = tempfile.TemporaryDirectory(prefix="tpuasm-model-")
        for name, data in files.items():
            target = Path(folder.name) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, data, what="compiled-model file")
        for _, old in _MODELS.values():    # one model at a time per worker: the last goes
            old.cleanup()
        _MODELS.clear()
        entry = _MODELS[key] = (load(folder.name), folder)
    return entry[0]


def _run_chunk(key: str, files: dict[str, bytes], chunk: dict, engine: str | None,
               code: str):
    refuse_other_code(code)               # a worker that joined after check_workers
    return _worker_model(key, files).run(chunk, engine=engine)


def chunk_ranges(rows: int, batch: int, workers: int, chunk_rows: int | None) -> list:
    """[(start, stop), ...]: whole batches per chunk, about four chunks per worker."""
    if chunk_rows is None:
        per = -(-rows // max(4 * workers, 1))
        chunk_rows = max(batch, -(-per // batch) * batch)
    return [(s, min(s + chunk_rows, rows)) for s in range(0, rows, chunk_rows)]


def run_on_cluster(outdir, model, data: dict, client, chunk_rows: int | None = None,
                   engine: str | None = None, progress=None) -> dict[str, np.ndarray]:
    """`model.run(data)` with the rows spread over `client`'s workers; `model` is OUTDIR
    loaded here (its inputs, outputs and batch).  Same result as one process, in order."""
    from dask.distributed import as_completed

    from tpuasm.compiler.runtime.steps import batch_axis_of, join_parts, prepare_inputs
    from tpuasm.compiler.front.samples import take_rows
    data, rows = prepare_inputs(model.inputs, data)
    axes = {i.name: i.batch_axis for i in model.inputs}
    check_workers(client)
    files = outdir_files(outdir)
    key = _digest(files)
    workers = max(len(client.scheduler_info().get("workers", {})), 1)
    batched = any(a is not None for a in axes.values())
    ranges = chunk_ranges(rows, model.batch, workers, chunk_rows) if batched else [(0, 1)]
    # one datum under a fresh key (a dict scattered as such is keyed by its file names, and a
    # cluster that held an earlier model's "manifest.json" sent that one)
    (shipped,) = client.scatter([files], broadcast=True, hash=False)
    futures = {}
    for i, (start, stop) in enumerate(ranges):
        # each input cut along its own batch axis; one without a batch axis goes whole
        chunk = {name: take_rows(x, axes.get(name, 0), start, stop) for name, x in data.items()}
        future = client.submit(_run_chunk, key, shipped, chunk, engine, code_digest(),
                               pure=False,
                               key=f"tpuasm-infer-{key[:8]}-{i}")
        futures[future] = i
    parts: list = [None] * len(ranges)
    done = 0
    total = rows if batched else 1
    if progress:
        progress(0, total)
    try:
        for future in as_completed(list(futures)):
            i = futures[future]
            start, stop = ranges[i]
            try:
                parts[i] = future.result()
            except Exception as e:      # noqa: BLE001 - the worker's error, named by chunk
                raise CompileError(f"rows {start}-{stop - 1} failed on the cluster: "
                                   f"{type(e).__name__}: {e}") from None
            future.release()
            done += stop - start
            if progress:
                progress(min(done, total), total)
    finally:
        for future in futures:
            future.cancel()
    rows0 = ranges[0][1] - ranges[0][0]
    joined = {}
    for o in model.outputs:
        pieces = [p[o.name] for p in parts]
        if batched and isinstance(pieces[0], np.ndarray):     # the axis its rows are on
            o = replace(o, batch_axis=batch_axis_of(pieces[0], o.batch_axis, rows0))
        joined[o.name] = join_parts(o, pieces)
    return joined

"""Run sweep points on a Dask client (tpuasm.cluster.dask_client: a LocalCluster on this
machine's cores by default, or the cluster at `--scheduler ADDR` / $TPUASM_SCHEDULER).

The client keeps at most `window` points in flight and hands every finished row to
`on_row` at once (the CLI streams it to CSV), so a 10,000-point sweep holds a few rows
in memory, not 10,000 futures or results.
"""
from __future__ import annotations


def run_tasks(tasks, client, on_row, window: int | None = None) -> None:
    """Submit `tasks` (an iterable of point dicts, consumed lazily) with at most `window`
    in flight; call on_row(row) for each as it finishes, in completion order."""
    from dask.distributed import as_completed

    from ..cluster import check_workers
    from .point import run_point
    check_workers(client)                # before any point is submitted
    if window is None:
        threads = sum(client.nthreads().values()) or 1
        window = 2 * threads
    it = iter(tasks)
    in_flight: dict = {}                 # future -> task (at most `window` of them)
    pending = as_completed()

    def submit(task):
        future = client.submit(run_point, task, key=f"point-{task['seq']}-{task['key']}",
                               pure=False)
        in_flight[future] = task
        pending.add(future)

    for task in _take(it, window):
        submit(task)
    for future in pending:
        task = in_flight.pop(future)
        try:
            row = future.result()
        except Exception as e:          # the worker died: report the point, go on
            row = {"target": task["target"].label, **task["settings"], "key": task["key"],
                   "status": "error", "error": f"worker failed: {type(e).__name__}: {e}"}
        future.release()
        on_row(row)
        for task in _take(it, 1):
            submit(task)


def run_tasks_here(tasks, on_row) -> None:
    """The same, in this process, one at a time (`--workers 0`: no Dask at all)."""
    from .point import run_point
    for task in tasks:
        on_row(run_point(task))


def _take(it, n):
    out = []
    for _ in range(n):
        try:
            out.append(next(it))
        except StopIteration:
            break
    return out

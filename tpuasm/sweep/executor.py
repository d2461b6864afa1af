"""Run sweep points on Dask: a LocalCluster on this machine's cores by default, or the
cluster at `--scheduler ADDR` / $TPUASM_SCHEDULER.

The client keeps at most `window` points in flight and hands every finished row to
`on_row` at once (the CLI streams it to CSV), so a 10,000-point sweep holds a few rows
in memory, not 10,000 futures or results.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

SCHEDULER_ENV = "TPUASM_SCHEDULER"


@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None,
                processes: bool = True):
    """A dask.distributed Client: to `scheduler` (or $TPUASM_SCHEDULER) when given, else a
    LocalCluster of `workers` single-threaded workers (default: every core)."""
    import logging

    from dask.distributed import Client, LocalCluster
    logging.getLogger("distributed").setLevel(logging.ERROR)
    address = scheduler or os.environ.get(SCHEDULER_ENV)
    if address:
        from .grid import SweepError
        probe_scheduler(address)          # <= PROBE_SECONDS; Dask's own connect may hang
        try:
            client = Client(address, timeout="10s")
        except (OSError, TimeoutError, ValueError) as e:
            raise SweepError(f"cannot reach the Dask scheduler at {address}: {e}") from None
        try:
            yield client
        finally:
            client.close()
        return
    n = workers or os.cpu_count() or 1
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=processes,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        yield client


# A Dask scheduler speaks first: on a new connection it sends its handshake, one message
# framed by an 8-byte little-endian length (distributed.comm.tcp).  Anything else at the
# address (an HTTP server, which waits for a request; ssh, which sends text) is told apart
# here within PROBE_SECONDS, before Dask reads a "length" of 3 EiB or waits for ever.
PROBE_SECONDS = 5.0
MAX_HANDSHAKE_BYTES = 1 << 20
DASK_SCHEMES = ("tcp", "tls", "inproc", "ucx", "ws", "wss")


def scheduler_host_port(address: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a scheduler address (`tcp://10.0.0.5:8786`, `host:8786`,
    `tcp://[::1]:8786`); SweepError for an address Dask could not use."""
    from .grid import SweepError
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme not in DASK_SCHEMES:
        raise SweepError(f"--scheduler {address!r}: unknown protocol {scheme!r} (a Dask "
                         f"scheduler address is tcp://HOST:PORT)")
    if scheme == "inproc":
        return scheme, rest, None
    host, port = rest, None
    if rest.startswith("["):                          # [IPv6]:port
        end = rest.find("]")
        host, tail = (rest[1:end], rest[end + 1:]) if end > 0 else ("", "!")
        if tail and not tail.startswith(":"):
            host = ""
        port_text = tail[1:] if tail else ""
    else:
        host, _, port_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
        if ":" in host:                               # a bare IPv6 address needs brackets
            host = ""
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise SweepError(f"--scheduler {address!r}: bad port {port_text!r}")
        port = int(port_text)
    if not host or any(c in host for c in "/ ?#@"):
        raise SweepError(f"--scheduler {address!r}: expected tcp://HOST:PORT "
                         "(an IPv6 HOST in brackets)")
    return scheme, host, port


def probe_scheduler(address: str, seconds: float | None = None) -> None:
    """SweepError unless something at `address` answers like a Dask scheduler within
    `seconds` (PROBE_SECONDS): it accepts a TCP connection and sends a handshake of a
    plausible length.  Only tcp:// is probed (the other protocols are Dask's to check)."""
    import socket
    import struct
    import time

    from .grid import SweepError
    seconds = PROBE_SECONDS if seconds is None else seconds
    scheme, host, port = scheduler_host_port(address)
    if scheme != "tcp":
        return
    port = 8786 if port is None else port           # Dask's default port
    deadline = time.monotonic() + seconds
    try:
        sock = socket.create_connection((host, port), timeout=seconds)
    except OSError as e:
        raise SweepError(f"cannot reach the Dask scheduler at {address}: "
                         f"{e.strerror or e}") from None
    try:
        head = b""
        while len(head) < 8:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout
            sock.settimeout(left)
            chunk = sock.recv(8 - len(head))
            if not chunk:
                raise SweepError(f"{address} closed the connection without a Dask "
                                 "handshake: not a Dask scheduler")
            head += chunk
    except (socket.timeout, TimeoutError):
        raise SweepError(f"{address} accepted a connection but sent no Dask handshake within "
                         f"{seconds:g} s: not a Dask scheduler (an HTTP server, or the "
                         "dashboard port?)") from None
    except OSError as e:
        raise SweepError(f"cannot reach the Dask scheduler at {address}: "
                         f"{e.strerror or e}") from None
    finally:
        sock.close()
    (length,) = struct.unpack("<Q", head)
    if not 0 < length <= MAX_HANDSHAKE_BYTES:
        raise SweepError(f"{address} does not speak Dask's protocol (its first bytes "
                         f"{head!r} are not a Dask handshake)")


def run_tasks(tasks, client, on_row, window: int | None = None) -> None:
    """Submit `tasks` (an iterable of point dicts, consumed lazily) with at most `window`
    in flight; call on_row(row) for each as it finishes, in completion order."""
    from dask.distributed import as_completed

    from .point import run_point
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

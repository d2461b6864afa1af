"""Everything a distributed run (`tpuasm sweep`, `figure11`, `infer --workers/--scheduler`,
`test --scheduler`) needs from Dask, in one place: the client (a LocalCluster on this
machine's cores, or the scheduler at `--scheduler ADDR` / $TPUASM_SCHEDULER, probed first so
that a port which does not speak Dask fails within seconds), a warning while a scheduler has
no workers, and the code check.

A worker running other tpuasm code would compute other answers (other cycles, other
outputs), and a cache would then keep them under this client's key.  So every worker's
`code_digest()` must equal the client's before anything is submitted (`check_workers`),
and every task carries the client's digest and is refused by a worker whose code differs
(`refuse_other_code`: a worker that joins later is caught too).
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from .environment import raw
from .errors import TpuasmError


class ClusterError(TpuasmError, ValueError):
    """A scheduler that cannot be used, or workers that must not be (exit status 2)."""


# What code_digest() covers: every file of the package that can change an answer.
_CODE_SUFFIXES = (".py", ".toml", ".lark", ".c", ".npz")


@lru_cache(maxsize=1)
def code_digest() -> str:
    """A digest of this tpuasm's code: every source, table and grammar of the package
    (16 hex digits).  Equal digests, same answers."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in _CODE_SUFFIXES and "__pycache__" not in path.parts:
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def refuse_other_code(expected: str) -> None:
    """On a worker, before a task computes anything: ClusterError unless this process runs
    the code whose digest the client sent."""
    ours = code_digest()
    if ours != expected:
        raise ClusterError(f"this Dask worker runs other tpuasm code (code {ours}) than the "
                           f"client (code {expected}); install the same version on every "
                           f"worker")


def check_workers(client) -> None:
    """Every worker runs this tpuasm's code, or a ClusterError names those that do not."""
    ours = code_digest()
    theirs = client.run(code_digest)
    if not theirs:
        raise ClusterError("the Dask cluster has no workers")
    other = sorted(w for w, d in theirs.items() if d != ours)
    if other:
        raise ClusterError(f"{len(other)} of {len(theirs)} Dask workers run other tpuasm "
                           f"code than this client (code {ours}): {', '.join(other[:4])}; "
                           f"install the same version on every worker")


SCHEDULER_ENV = "TPUASM_SCHEDULER"
NO_WORKERS_WARNING_SECONDS = 5.0


def _stderr_warning(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def wait_for_workers(client, warn=_stderr_warning, after: float = NO_WORKERS_WARNING_SECONDS,
                     poll: float = 0.2, address: str = "the scheduler") -> int:
    """Wait until the cluster has a worker (workers may join a scheduler at any time);
    `warn(message)` once when there is none after `after` seconds.  The number of workers."""
    start = time.monotonic()
    warned = False
    while True:
        count = len(client.scheduler_info().get("workers", {}))
        if count:
            return count
        if not warned and time.monotonic() - start >= after:
            warn(f"{address} has no Dask workers after {after:g} s; waiting for one "
                 f"(start `dask worker ADDRESS`, or press Ctrl-C)")
            warned = True
        time.sleep(poll)


@contextmanager
def dask_client(scheduler: str | None = None, workers: int | None = None,
                processes: bool = True, warn=_stderr_warning):
    """A dask.distributed Client whose every worker runs this code: to `scheduler` (or
    $TPUASM_SCHEDULER) when given, else a LocalCluster of `workers` single-threaded workers
    (default: every core).  Waits for a first worker (warning after a few seconds)."""
    import logging

    from dask.distributed import Client, LocalCluster
    logging.getLogger("distributed").setLevel(logging.ERROR)
    address = scheduler or raw("TPUASM_SCHEDULER")
    if address:
        probe_scheduler(address)          # <= PROBE_SECONDS; Dask's own connect may hang
        try:
            client = Client(address, timeout="10s")
        except (OSError, TimeoutError, ValueError) as e:
            raise ClusterError(f"cannot reach the Dask scheduler at {address}: {e}") from None
        try:
            wait_for_workers(client, warn, address=address)
            check_workers(client)
            yield client
        finally:
            client.close()
        return
    n = workers or os.cpu_count() or 1
    with LocalCluster(n_workers=n, threads_per_worker=1, processes=processes,
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        check_workers(client)
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
    `tcp://[::1]:8786`); ClusterError for an address Dask could not use."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme not in DASK_SCHEMES:
        raise ClusterError(f"--scheduler {address!r}: unknown protocol {scheme!r} (a Dask "
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
            raise ClusterError(f"--scheduler {address!r}: bad port {port_text!r}")
        port = int(port_text)
    if not host or any(c in host for c in "/ ?#@"):
        raise ClusterError(f"--scheduler {address!r}: expected tcp://HOST:PORT "
                         "(an IPv6 HOST in brackets)")
    return scheme, host, port


def probe_scheduler(address: str, seconds: float | None = None) -> None:
    """ClusterError unless something at `address` answers like a Dask scheduler within
    `seconds` (PROBE_SECONDS): it accepts a TCP connection and sends a handshake of a
    plausible length.  Only tcp:// is probed (the other protocols are Dask's to check)."""
    import socket
    import struct
    import time

    seconds = PROBE_SECONDS if seconds is None else seconds
    scheme, host, port = scheduler_host_port(address)
    if scheme != "tcp":
        return
    port = 8786 if port is None else port           # Dask's default port
    deadline = time.monotonic() + seconds
    try:
        sock = socket.create_connection((host, port), timeout=seconds)
    except OSError as e:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: "
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
                raise ClusterError(f"{address} closed the connection without a Dask "
                                 "handshake: not a Dask scheduler")
            head += chunk
    except (socket.timeout, TimeoutError):
        raise ClusterError(f"{address} accepted a connection but sent no Dask handshake within "
                         f"{seconds:g} s: not a Dask scheduler (an HTTP server, or the "
                         "dashboard port?)") from None
    except OSError as e:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: "
                         f"{e.strerror or e}") from None
    finally:
        sock.close()
    (length,) = struct.unpack("<Q", head)
    if not 0 < length <= MAX_HANDSHAKE_BYTES:
        raise ClusterError(f"{address} does not speak Dask's protocol (its first bytes "
                         f"{head!r} are not a Dask handshake)")

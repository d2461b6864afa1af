"""Chrome trace-event JSON and run statistics, built afterwards from the core's arrays.

The core records each instruction's issue/start/finish cycle and each weight tile's
request/fetch/shift/switch cycles; nothing is logged while running.  Timestamps in the trace
are microseconds at the configured clock (Chrome's unit), one track per stage plus the
weight-fetch engine and the front end, and a counter for Weight FIFO occupancy.  A
MatrixMultiply's slice on the matrix track ends when its last vector has entered (when the
stage is free for the next one, spec/timing.md 6); its drain, which overlaps the next
MatrixMultiplies, is an async slice of its own.
"""
from __future__ import annotations

import json

from . import core
from .decoded import COL_OP

_PID = 1
_TRACKS = {"front": 0, "input": 1, "matrix": 2, "activate": 3, "output": 4, "weights": 5,
           "weight port": 6}


def trace_events(m) -> list[dict]:
    c = m.cycle
    us = 1e6 / m.config.clock_hz
    ev = [{"ph": "M", "pid": _PID, "name": "process_name", "args": {"name": "TPU v1"}}]
    for name, tid in _TRACKS.items():
        ev.append({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_name",
                   "args": {"name": name if name != "weights" else "weight fetch"}})
        ev.append({"ph": "M", "pid": _PID, "tid": tid, "name": "thread_sort_index",
                   "args": {"sort_index": tid}})
    n = len(m.prog)
    times = m.times[:n]
    mmc = core.STAGE_MATRIX
    for i in range(n):
        issue, start, finish = (int(x) for x in times[i])
        if issue < 0 or issue >= c:
            continue
        stage = int(core.OP_STAGE[int(m.prog[i, COL_OP])])
        if stage >= 0:
            tid = _TRACKS[core.STAGE_NAMES[stage]]
        else:       # Read_Weights on the weight port's track; the front end's own ops on 0
            tid = _TRACKS["weight port"] if stage == core.PORT_WEIGHTS else 0
        # an MMC's finish is its last vector in + mmc_latency (spec/timing.md 6)
        free = finish - m.config.mmc_latency if stage == mmc else finish
        end = min(free, c)
        args = {"index": i, "issue": issue, "start": start, "finish": finish}
        loc = m.location(i)
        if loc is not None:
            args["source"] = f"{loc.file}:{loc.line}"
        ev.append({"ph": "X", "pid": _PID, "tid": tid, "name": m.text(i), "ts": issue * us,
                   "dur": max(end - issue, 1) * us, "cat": "instruction", "args": args})
        if stage == mmc and free < c:
            drain = {"pid": _PID, "tid": tid, "name": f"drain {m.text(i)}", "cat": "drain",
                     "id": i}
            ev.append({**drain, "ph": "b", "ts": free * us, "args": args})
            ev.append({**drain, "ph": "e", "ts": min(finish, c) * us})
    nreq = int(m.st[core.S_NREQ])
    tl = m.tl[:, :nreq]
    changes = []
    for q in range(nreq):
        tile = int(tl[core.T_TILE, q])
        req, fs, fe, ss = (int(tl[k, q]) for k in (core.T_REQ, core.T_FS, core.T_FE, core.T_SS))
        if req >= c:
            continue
        if fs < c:
            ev.append({"ph": "X", "pid": _PID, "tid": _TRACKS["weights"],
                       "name": f"fetch tile {tile}", "ts": fs * us,
                       "dur": max(min(fe, c) - fs, 1) * us, "cat": "weights",
                       "args": {"tile": tile, "requested": req, "arrived": fe}})
        changes.append((req, 1))
        if 0 <= ss < c:
            changes.append((ss, -1))
    occupancy = 0
    for cycle, delta in sorted(changes):
        occupancy += delta
        ev.append({"ph": "C", "pid": _PID, "name": "Weight FIFO", "ts": cycle * us,
                   "args": {"tiles": occupancy}})
    for e in m.events:
        ev.append({"ph": "i", "pid": _PID, "tid": 0, "s": "g", "name": f"{e.kind} {e.value}",
                   "ts": e.cycle * us, "args": {"index": e.index}})
    return ev


def write_trace(m, path) -> None:
    """Write the Chrome trace to `path`; a path that cannot be written raises TpuasmError."""
    data = {"traceEvents": trace_events(m), "displayTimeUnit": "ns",
            "otherData": {"clock_hz": m.config.clock_hz, "cycles": m.cycle}}
    from ..files import atomic_write
    atomic_write(path, json.dumps(data), what="the trace")        # temp file + rename; OutputFileError


def stats(m) -> dict:
    """What `tpuasm run --stats` writes: status, counters, fault, events, configuration."""
    fault = m.fault
    return {
        "status": m.status,
        "cycles": m.cycle,
        "seconds": m.cycle / m.config.clock_hz,
        "counters": m.counters(),
        "fault": None if fault is None else {
            "kind": fault.kind, "message": fault.message, "cycle": fault.cycle,
            "index": fault.index, "text": fault.text,
            "location": None if fault.location is None else str(fault.location)},
        "events": [{"cycle": e.cycle, "kind": e.kind, "index": e.index, "value": e.value}
                   for e in m.events],
        "config": {k: (v if isinstance(v, (int, float, str)) or v is None else str(v))
                   for k, v in m.config.as_dict().items()},
        "derived": {"fetch_cycles": m.config.fetch_cycles, "shift_cycles": m.config.shift,
                    "mmc_latency_cycles": m.config.mmc_latency,
                    "act_latency_cycles": m.config.act_latency,
                    "host_latency_cycles": m.config.host_latency,
                    "weight_bytes_per_cycle": m.config.weight_bandwidth,
                    "host_bytes_per_cycle": m.config.host_bandwidth},
    }


__all__ = ["trace_events", "write_trace", "stats"]

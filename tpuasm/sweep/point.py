"""One sweep point: build the target for a configuration, run it, return one tidy row.

`run_point` runs on a Dask worker (or in this process) and never raises: a point that
cannot be built for its shape is "skipped", a machine fault is "fault", anything else
that goes wrong is "error" with the message, so the other points always complete.
"""
from __future__ import annotations

import time
import traceback

from ..errors import TpuasmError

# Table 3's counters and the rest of what a row carries, in column order.
COUNTERS = ("instructions", "array_active_cycles", "weight_stall_cycles",
            "weight_shift_cycles", "non_matrix_cycles", "raw_stall_cycles",
            "input_stall_cycles", "useful_macs", "mxu_utilization")
RESULT_COLUMNS = ("status", "cycles", "time_us", "tops", "useful_pct", *COUNTERS,
                  "array", "clock_mhz", "weight_bw", "acc", "wall_s", "error", "key")


def run_point(task: dict) -> dict:
    from ..machine import Machine, MachineConfig
    from .targets import Skip, build
    from ..cluster import ClusterError, refuse_other_code
    row = {"target": task["target"].label, **task["settings"], "key": task["key"]}
    start = time.perf_counter()
    try:
        refuse_other_code(task["code"])   # other code, other cycles: never cached
        config = MachineConfig(**task["config"])
        # the values in force (columns of their own: a swept NAME keeps its given text)
        row.update(array=config.array_size, clock_mhz=round(config.clock_hz / 1e6, 3),
                   weight_bw=round(config.weight_bandwidth, 4), acc=config.acc_rows)
        program, host, weights, macs = build(task["target"], task["config"])
        # timing-only: the same cycles, counters and faults without the arithmetic
        # (the emulator's tests/test_timing_only.py; ours: tests/test_sweep.py)
        machine = Machine(config, timing_only=bool(task.get("timing_only", False)))
        machine.load(program, host=host, weights=weights)
        result = machine.run(max_cycles=task.get("max_cycles"))
        # the apps know their MACs from their shapes: no tile scan for useful_macs
        row.update(_measures(machine.counters(useful_macs=macs is None), config, macs))
        if result.fault is not None:
            row.update(status="fault", error=str(result.fault))
        else:
            row["status"] = "ok"
    except Skip as e:
        row.update(status="skipped", error=str(e))
    except ClusterError as e:
        row.update(status="error", error=str(e))
    except (TpuasmError, ValueError, OSError) as e:
        row.update(status="error", error=f"{type(e).__name__}: {e}")
    except Exception as e:           # a bug: say where, keep the sweep going
        tb = traceback.format_exc(limit=3).strip().splitlines()
        row.update(status="error", error=f"internal error: {type(e).__name__}: {e} "
                                         f"({tb[-3].strip() if len(tb) > 2 else ''})")
    row["wall_s"] = round(time.perf_counter() - start, 3)
    return row


def _measures(c: dict, config, macs) -> dict:
    cycles = int(c["cycles"])
    seconds = cycles / config.clock_hz
    out = {"cycles": cycles, "time_us": round(seconds * 1e6, 3)}
    if c["tops"] is not None:
        out["tops"] = round(float(c["tops"]), 4)
    for name in COUNTERS:
        v = c[name]
        if v is not None:           # None: not counted (the MACs come from `macs` below)
            out[name] = round(float(v), 6) if name == "mxu_utilization" else int(v)
    # Row 2 of Table 3 counts the network's own MACs.  The machine counts them from each
    # tile's non-zero extent (spec/timing.md 8), which a zero weight image (an app's
    # timing run) does not have: when the target knows its MACs, use those.  TOPS likewise.
    n2 = config.array_size ** 2
    useful = macs if macs is not None else int(c["useful_macs"])
    out["useful_pct"] = round(100.0 * useful / max(cycles * n2, 1), 4)
    if macs is not None:
        out["useful_macs"] = int(macs)
        out["mxu_utilization"] = round(macs / max(cycles * n2, 1), 6)
        out["tops"] = round(2.0 * macs / max(seconds, 1e-30) / 1e12, 4)
    return out

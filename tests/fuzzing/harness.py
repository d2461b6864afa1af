"""The parent side of the fuzz suite: a reusable worker per target and the verdict on
each case (spec/limits.md says what is promised).

    with Worker("asm") as w:
        result = w.run(case_bytes)          # a dict, see worker.py; "died"/"hang" added
        problems = verdict(result, allowed_codes)   # [] when the tool behaved

A worker that dies (SIGXCPU past the CPU limit, a crash) or exceeds the wall-clock
limit is restarted for the next case; the case is a finding.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve().parent / "worker.py"
WALL_SECONDS = float(os.environ.get("FUZZ_WALL_SECONDS", "60"))   # the machine is shared
RESTART_EVERY = 2000          # fresh worker now and then: no slow creep of its memory
# What a user must never see.
FORBIDDEN = ("Traceback (most recent call last)", "internal error", "out of memory")


class Worker:
    def __init__(self, target: str):
        self.target = target
        self.proc: subprocess.Popen | None = None
        self.cases = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> None:
        # The assembler's expansion budget lowered to what fits the per-case limits: what
        # is checked is that work stays proportional to the budget (at the default
        # 1,000,000 a legitimate assembly takes ~6 s, over the 2 s CPU limit).
        env = dict(os.environ, PYTHONHASHSEED="0", TPUASM_MAX_STATEMENTS="200000")
        self.proc = subprocess.Popen([sys.executable, str(WORKER), self.target],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env)
        ready = self._read(timeout=600)          # the warm-up may compile numba kernels
        if ready != b"ready":
            self.stop()
            raise RuntimeError(f"fuzz worker for {self.target} did not start")
        self.cases = 0

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self.proc = None

    def _read(self, timeout: float) -> bytes | None:
        """One frame from the worker, None when it died or the time ran out."""
        out = self.proc.stdout
        deadline = time.monotonic() + timeout
        buf = b""
        need = 4
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([out], [], [], left)
            if not ready:
                return None
            chunk = os.read(out.fileno(), need - len(buf))
            if not chunk:
                return None
            buf += chunk
            if need == 4 and len(buf) == 4:
                need = 4 + int.from_bytes(buf, "little")
        return buf[4:]

    def run(self, case: bytes) -> dict:
        if self.proc is None or self.cases >= RESTART_EVERY:
            self.stop()
            self.start()
        self.cases += 1
        try:
            self.proc.stdin.write(len(case).to_bytes(4, "little") + case)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        started = time.monotonic()
        frame = self._read(WALL_SECONDS)
        if frame is not None:
            return json.loads(frame)
        wall = time.monotonic() - started
        status = self.proc.poll()
        self.stop()
        if status is None:
            return {"hang": True, "wall": wall}
        how = (f"killed by {signal.Signals(-status).name}" if status < 0
               else f"exited with status {status}")
        return {"died": how, "wall": wall}


def check(worker: Worker, case: bytes, allowed: set[int]) -> tuple[dict, list[str]]:
    """Run one case and judge it.  A case that kills or stalls its worker is run once
    more on a fresh one: the first time a code path runs, numba may compile (or load)
    kernels for it, and that one-off cost is not the case's; a real finding repeats."""
    result = worker.run(case)
    problems = verdict(result, allowed)
    if problems and ("died" in result or result.get("hang")):
        result = worker.run(case)
        problems = verdict(result, allowed)
    return result, problems


def verdict(result: dict, allowed: set[int], cpu_limit: float | None = None) -> list[str]:
    """What is wrong with one case's outcome ([] when nothing)."""
    if result.get("hang"):
        return [f"no answer within {WALL_SECONDS:.0f} s (blocked or too slow)"]
    if "died" in result:
        why = result["died"]
        if "SIGXCPU" in why:
            return ["used more than the CPU-time limit (killed by SIGXCPU)"]
        return [f"the worker process {why} (a crash or the memory limit)"]
    problems = []
    if result.get("exc"):
        problems.append("an exception escaped the tool:\n" + result["exc"][-2000:])
    if result.get("code") not in allowed:
        problems.append(f"exit code {result.get('code')!r}, not one of {sorted(allowed)}")
    text = result.get("out", "")
    for word in FORBIDDEN:
        if word in text:
            problems.append(f"the output says {word!r}:\n{text[-1500:]}")
    if result.get("out_len", 0) > 1_000_000:
        problems.append(f"{result['out_len']:,} characters of output")
    return problems

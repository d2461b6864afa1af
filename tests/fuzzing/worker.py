"""`python worker.py TARGET`: run fuzz cases of one target under resource limits.

Protocol on stdin/stdout: the harness sends a frame (4-byte little-endian length, then
the case's bytes); the worker answers with a frame holding a JSON result:

    {"code": exit code | null, "exc": traceback text | null, "out": the end of what the
     tool printed, "cpu": CPU seconds, "rss_mb": the worker's peak RSS}

Limits, set after the imports and a warm-up case (numba's kernels load once):
- RLIMIT_AS: the address space may grow by at most MEMORY_MB beyond the warm worker's,
- RLIMIT_CPU: before each case the soft limit is set CPU_SECONDS past the CPU time used
  so far, so a case that spins is killed by SIGXCPU (the harness sees the worker die).
The harness adds a wall-clock limit (a case blocked on I/O uses no CPU).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import tempfile
import traceback
from pathlib import Path

CPU_SECONDS = float(os.environ.get("FUZZ_CPU_SECONDS", "2"))
MEMORY_MB = int(os.environ.get("FUZZ_MEMORY_MB", "500"))


def _read_frame(stream) -> bytes | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    n = int.from_bytes(head, "little")
    return stream.read(n)


def _write_frame(stream, data: bytes) -> None:
    stream.write(len(data).to_bytes(4, "little") + data)
    stream.flush()


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_case(run, case: bytes, tmp: Path) -> dict:
    out = io.StringIO()
    code = exc = None
    start = _cpu()
    soft = int(start + CPU_SECONDS) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = run(case, tmp)
    except SystemExit as e:                  # argparse: usage errors exit 2
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BaseException:                    # noqa: B036 - any escape is a finding
        exc = traceback.format_exc()
    text = out.getvalue()
    return {"code": code, "exc": exc, "out": text[-3000:], "out_len": len(text),
            "cpu": _cpu() - start,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(target: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from targets import TARGETS, warm_cases
    import random
    gen, run, _ = TARGETS[target]
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr                  # nothing but frames on the real stdout
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as d:
        tmp = Path(d)
        # warm up (imports, numba's cached kernels) before the limits are set
        warm = warm_cases(target) + [gen(random.Random(seed)) for seed in range(20)]
        for case in warm:
            with contextlib.suppress(BaseException):
                with contextlib.redirect_stdout(io.StringIO()), \
                        contextlib.redirect_stderr(io.StringIO()):
                    run(case, tmp)
        limit = _address_space() + MEMORY_MB * (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        _write_frame(stdout, b"ready")
        while True:
            case = _read_frame(stdin)
            if case is None:
                return
            result = run_case(run, case, tmp)
            _write_frame(stdout, json.dumps(result).encode())


if __name__ == "__main__":
    main(sys.argv[1])

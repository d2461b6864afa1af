"""The long fuzz run (`make fuzz`): many cases per target, figures at the end.

    python tests/fuzzing/driver.py [--cases 100000] [--targets asm,tbin,...] [--jobs 2]
                                   [--seed 0] [--out fuzz-findings] [--seconds S]

Cases are drawn from the targets' generators with a seeded random.Random per case
(`seed * 10**9 + index`), so a finding is reproduced by its index alone.  Each finding's
input and verdict are saved under --out.  Exit 0 when there were no findings, 1 otherwise.
"""
from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness import Worker, check  # noqa: E402
from targets import TARGETS  # noqa: E402


def fuzz_target(name: str, cases: int, seed: int, out: Path, report: dict, lock,
                seconds: float | None = None) -> None:
    gen, _, allowed = TARGETS[name]
    findings = 0
    max_cpu = peak_rss = 0.0
    started = time.monotonic()
    done = 0
    with Worker(name) as worker:
        for i in range(cases):
            if seconds is not None and time.monotonic() - started > seconds:
                break
            try:
                case = gen(random.Random(seed * 10 ** 9 + i))
            except Exception as e:           # the generator's bug, not the tool's
                print(f"  {name}: generator failed on case {i}: {e!r}", flush=True)
                continue
            result, problems = check(worker, case, allowed)
            max_cpu = max(max_cpu, result.get("cpu", 0.0))
            peak_rss = max(peak_rss, result.get("rss_mb", 0.0))
            if problems:
                findings += 1
                d = out / name
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{i}.bin").write_bytes(case)
                (d / f"{i}.txt").write_text("\n".join(problems) + "\n")
            done = i + 1
            if (i + 1) % 5000 == 0:
                with lock:
                    rate = (i + 1) / (time.monotonic() - started)
                    print(f"  {name}: {i + 1:,} cases, {findings} findings, {rate:,.0f}/s",
                          flush=True)
    report[name] = (done, time.monotonic() - started, findings, max_cpu, peak_rss)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=100_000)
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("fuzz-findings"))
    p.add_argument("--seconds", type=float, default=None,
                   help="stop each target after this long (the table says how many ran)")
    args = p.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        p.error(f"unknown targets {unknown}; choose from {', '.join(TARGETS)}")
    report: dict = {}
    lock = threading.Lock()
    pending = list(names)
    started = time.monotonic()

    def loop():
        while True:
            with lock:
                if not pending:
                    return
                name = pending.pop(0)
            fuzz_target(name, args.cases, args.seed, args.out, report, lock, args.seconds)

    threads = [threading.Thread(target=loop) for _ in range(max(1, args.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"\n{'target':<10}{'cases':>10}{'seconds':>10}{'cases/s':>10}{'findings':>10}"
          f"{'max CPU s':>11}{'peak RSS MB':>13}")
    total = 0
    for name in names:
        cases, seconds, findings, cpu, rss = report[name]
        total += findings
        print(f"{name:<10}{cases:>10,}{seconds:>10.0f}{cases / seconds:>10.0f}{findings:>10}"
              f"{cpu:>11.2f}{rss:>13.0f}")
    print(f"total wall time {time.monotonic() - started:,.0f} s; findings saved under {args.out}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())

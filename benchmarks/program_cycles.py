"""Cycle counts and the Table 3 breakdown of every regression program (programs/*/test.toml).

    python benchmarks/program_cycles.py [-k EXPR] [--json FILE]

One line per program that halts: cycles, then array active / weight stall / weight shift /
non-matrix as percentages of the cycles.  `--json` also writes {name: {cycles, counters}},
so two checkouts can be compared (benchmarks/compare_cycles.py-style diffs by hand).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tpuasm.regression.cli import run_all, select  # noqa: E402

PARTS = ("array_active_cycles", "weight_stall_cycles", "weight_shift_cycles",
         "non_matrix_cycles")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", dest="keyword", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("-j", "--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    manifests = select([ROOT / "programs"], a.keyword)
    results = run_all(manifests, jobs=a.jobs, check_golden=False, progress=False)
    out = {}
    print(f"{'program':28} {'cycles':>9}  active  wstall  wshift  nonmat  outcome")
    for r in results:
        if r.cycles is None or r.status != "halted":
            continue
        c = r.counters
        pct = [100.0 * c[k] / r.cycles for k in PARTS]
        print(f"{r.name:28} {r.cycles:9,}  " + "  ".join(f"{p:5.1f}%" for p in pct)
              + f"  {r.outcome}")
        out[r.name] = {"cycles": r.cycles, "counters": {k: int(v) for k, v in c.items()}}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m tpuasm.regression.generator_process GEN.py OUT_DIR`: run one data generator.

The regression runner starts this in a child process (runner.generate), so a generator
that calls sys.exit or os._exit, or crashes, ends only this process.  The last line on
stdout is DONE exactly when `generate(out_dir)` returned; anything else is a failure,
explained on stderr.  Importing this module imports nothing else of tpuasm.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

DONE = "tpuasm: generate() returned"


def main(argv: list[str]) -> int:
    generator, out_dir = argv[0], Path(argv[1])
    spec = importlib.util.spec_from_file_location("_tpuasm_generator", generator)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        if not hasattr(module, "generate"):
            print(f"{generator} defines no generate(out_dir) function", file=sys.stderr)
            return 3
        module.generate(out_dir)
    except SystemExit as e:
        print(f"generate() called sys.exit({e.code!r}) instead of returning", file=sys.stderr)
        return 3
    sys.stdout.write(f"\n{DONE}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

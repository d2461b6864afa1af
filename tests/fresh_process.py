"""Run a MatrixMultiply in a fresh Python process after `setup` (code that forces a
fallback: a missing library, an environment setting), checking it against a numpy int64
oracle.  The process prints "exact" on success; the caller asserts on the result."""
from __future__ import annotations

import subprocess
import sys
import textwrap

_CHECK = """
import numpy as np
from tpuasm.machine import kernels as K, decoded as D
s = K.make_scratch(16)
{assertion}
rng = np.random.default_rng(3)
ub = rng.integers(0, 256, (8, 16), dtype=np.uint8)
w = rng.integers(0, 256, (1, 16, 16), dtype=np.uint8)
acc = np.zeros((8, 16), np.int32)
row = np.zeros(D.NCOLS, np.int64)
row[D.COL_OP], row[D.COL_FLAGS], row[D.COL_REPEAT], row[D.COL_LEN] = \\
    D.OP_MMC, D.MMC_OVERWRITE | D.MMC_SWITCH, 1, 8
K.execute_instruction(row, D.reset_registers(), ub, acc, ub, w, np.zeros(1, np.int64),
                      np.array([-1, -1]), s, 0)
want = ub.view(np.int8).astype(np.int64) @ w[0].view(np.int8).astype(np.int64)
assert np.array_equal(acc, want)
print("exact")
"""


def exact_mmc_in_fresh_process(setup: str, scratch_assertion: str, env=None):
    """`scratch_assertion`: code about the default scratch `s` (which path it chose)."""
    code = textwrap.dedent(setup) + _CHECK.format(assertion=scratch_assertion)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)

"""The paper's LSTM1 worked example: 9 tile steps, batch 96, about 18 us (~12,600 cycles)."""
import numpy as np

from tpuasm.machine import Machine

from _machine_programs import lstm1_600x600

PAPER_CYCLES = 18e-6 * 700e6          # 12,600


def test_lstm1_600x600_within_ten_percent():
    rng = np.random.default_rng(7)
    w = rng.integers(-128, 128, (9, 256, 256)).astype(np.int8)
    m = Machine()
    m.load(lstm1_600x600(), weights=w)
    m.ub[:288] = rng.integers(0, 256, (288, 256)).astype(np.uint8)
    r = m.run()
    assert r.status == "halted"
    assert abs(m.cycle - PAPER_CYCLES) / PAPER_CYCLES < 0.10, m.cycle
    # weight-bound (spec/timing.md 6): the 9th tile arrives after 9 fetches, shifts (256),
    # its 96 rows stream, the drain (512), the Activate of 3 x 96 rows (16 + 288), HLT
    assert m.cycle == 9 * 1350 + 256 + 96 + 512 + 16 + 288 + 1          # 13,319
    c = m.counters()
    # weight-bound: the fetch engine is busy 9 x 1350 cycles, most time is weight stall
    assert c["busy_weights"] == 9 * 1350
    assert c["weight_stall_cycles"] / c["cycles"] > 0.5
    x = m.ub[:288].view(np.int8).astype(np.int64)
    for j in range(3):
        want = sum(x[96 * k:96 * k + 96] @ w[3 * j + k].astype(np.int64) for k in range(3))
        assert np.array_equal(m.acc[96 * j:96 * j + 96], want)

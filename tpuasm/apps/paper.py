"""The paper's numbers for the six apps (Jouppi et al. 2017; shared/TPU_FACTS.md), in one place.

TABLE3[row key][app]: percentages of cycles (rows 1, 4, 5, 6 sum to 100; rows 7, 8 overlap
row 6), row 2 in % of peak MACs, and TOPS.  Each row is paired with the machine counter that
measures it (spec/timing.md section 8).
"""
from __future__ import annotations

APPS = ("MLP0", "MLP1", "LSTM0", "LSTM1", "CNN0", "CNN1")

# (key, label, counter the emulator reports, unit)
ROWS = (
    ("active", "1 array active", "array_active_cycles", "%"),
    ("useful", "2 useful MACs (% of peak)", "useful_macs", "%"),
    ("weight_stall", "4 weight stall", "weight_stall_cycles", "%"),
    ("weight_shift", "5 weight shift", "weight_shift_cycles", "%"),
    ("non_matrix", "6 non-matrix", "non_matrix_cycles", "%"),
    ("raw", "7 RAW stalls", "raw_stall_cycles", "%"),
    ("input", "8 input (PCIe) stalls", "input_stall_cycles", "%"),
    ("tops", "TOPS (92 peak)", "tops", "TOPS"),
)

TABLE3 = {
    "active":       dict(zip(APPS, (12.7, 10.6, 8.2, 10.5, 78.2, 46.2))),
    "useful":       dict(zip(APPS, (12.5, 9.4, 8.2, 6.3, 78.2, 22.5))),
    "weight_stall": dict(zip(APPS, (53.9, 44.2, 58.1, 62.1, 0.0, 28.1))),
    "weight_shift": dict(zip(APPS, (15.9, 13.4, 15.8, 17.1, 0.0, 7.0))),
    "non_matrix":   dict(zip(APPS, (17.5, 31.9, 17.9, 10.3, 21.8, 18.7))),
    "raw":          dict(zip(APPS, (3.3, 8.4, 14.6, 10.6, 3.5, 22.8))),
    "input":        dict(zip(APPS, (6.1, 8.8, 5.1, 2.4, 3.4, 0.6))),
    "tops":         dict(zip(APPS, (12.3, 9.7, 3.7, 2.8, 86.0, 14.1))),
}

# Table 1: layers, weights, ops per weight byte, batch
TABLE1 = {
    "MLP0": ("5 FC", 20e6, 200, 200),
    "MLP1": ("4 FC", 5e6, 168, 168),
    "LSTM0": ("58: 24 FC + 34 vector", 52e6, 64, 64),
    "LSTM1": ("56: 37 FC + 19 vector", 34e6, 96, 96),
    "CNN0": ("16 conv", 8e6, 2888, 8),
    "CNN1": ("89: 72 conv + 13 pool + 4 FC", 100e6, 1750, 32),
}

# Figure 11 / section 7, as the paper states them
FIGURE11 = {
    "memory x4 (weighted mean)": "about 3x",
    "clock x4 (weighted mean)": "little gain, with or without more accumulators",
    "matrix 512x512 (weighted mean)": "slightly slower than 256x256",
    "LSTM1 600x600 at 256x256": "9 steps, about 18 us",
    "LSTM1 600x600 at 512x512": "4 steps, about 32 us",
}

# Table 8 (section 7): the most of the 24 MiB Unified Buffer each app used, in MiB, with
# the improved allocator; "a 14 MiB Unified Buffer is sufficient for these apps"
TABLE8_UB_MIB = dict(zip(APPS, (11.0, 2.3, 4.8, 4.5, 1.5, 13.9)))
TABLE8_SUFFICIENT_MIB = 14.0

# The weighted mean of Figure 11 weights each app by its share of the 2016 workload
# (Table 1's last column: MLPs 61 %, LSTMs 29 %, CNNs 5 %, split evenly within a kind).
WORKLOAD_SHARE = {"MLP0": 30.5, "MLP1": 30.5, "LSTM0": 14.5, "LSTM1": 14.5,
                  "CNN0": 2.5, "CNN1": 2.5}


def measured_row(key: str, counters: dict) -> float:
    """The emulator's value for one Table 3 row, in the paper's unit."""
    cycles = max(int(counters["cycles"]), 1)
    if key == "tops":
        return float(counters["tops"])
    if key == "useful":
        return 100.0 * float(counters["mxu_utilization"])
    counter = next(c for k, _, c, _ in ROWS if k == key)
    return 100.0 * int(counters[counter]) / cycles

"""The generated sections of spec/isa.md match spec/isa.toml, and the shipped
sigmoid/tanh tables match their exact decimal definition."""
import numpy as np

from tpuasm import docs, functions


def test_isa_md_is_in_sync_with_the_table():
    assert docs.main(["--check"]) == 0, "run `python -m tpuasm.docs`"


def test_every_instruction_and_register_is_documented():
    text = docs.SPEC.read_text()
    from tpuasm.isa import ISA_TABLE
    for spec in ISA_TABLE.instructions.values():
        assert f"### {spec.key}: " in text
    for name in ISA_TABLE.registers:
        assert f"`{name}`" in text


def test_shipped_function_tables_equal_the_definition():
    fresh = functions.compute_tables()
    assert np.array_equal(fresh["sigmoid"], functions.SIGMOID_Q15)
    assert np.array_equal(fresh["tanh"], functions.TANH_Q15)


def test_function_table_landmarks():
    # sigmoid(0) = 1/2, tanh(0) = 0, symmetric, saturating at the ends of (-16, 16).
    s, t = functions.SIGMOID_Q15, functions.TANH_Q15
    zero = -functions.T_MIN
    assert s[zero] == 16384 and t[zero] == 0
    assert s[0] == 0 and s[-1] == 32768 and t[0] == -32768 and t[-1] == 32768
    k = np.arange(1, 4096)
    assert np.array_equal(s[zero + k] + s[zero - k], np.full(k.size, 32768))
    assert np.array_equal(t[zero + k], -t[zero - k])
    assert functions.to_q8(3, 0) == 768 and functions.to_q8(-5, 10) == -1 and functions.to_q8(6, 10) == 2
    assert functions.to_q8(10**9, 0) == functions.T_MAX

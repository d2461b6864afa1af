# Quick start: `make demo` and `make test`.  Both create .venv on first use and are idempotent.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m tpuasm demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_assembler.py
	$(BIN)/python benchmarks/bench_emulator.py

clean:
	rm -rf $(VENV) build *.egg-info

# Long fuzz run (not part of `make test`): FUZZ_CASES cases per target, findings under
# fuzz-findings/.  spec/limits.md says what is checked.
FUZZ_CASES ?= 100000
.PHONY: fuzz
fuzz: $(STAMP)
	$(BIN)/python tests/fuzzing/driver.py --cases $(FUZZ_CASES) --jobs 2 --out fuzz-findings

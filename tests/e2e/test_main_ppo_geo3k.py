"""Multimodal GRPO end to end: ``python -m verl.trainer.main_ppo`` (the command ``python -m verl.trainer.quickstart
--task geo3k`` runs) on geo3k-format image rows, the tiny Qwen3.5 VL model, the HF rollout, the geo3k scorer.

Invariants:
* ``actor.freeze_vision_tower=True``: after training steps the saved vision-tower weights are bitwise equal to the
  initial ones; ``False``: they changed (and the language model changed in both). 2 steps in the default suite
  (frozen), and after the 40-step learning runs (slow).
* (slow) The run learns to read the colour from the image: mean score of the last 5 steps >= the first 5 + 0.2,
  with the vision tower trained (40 steps at the quickstart lr 2e-3; measured: first 5 steps 0.35, steps 32-36
  0.63) and frozen (60 steps at lr 1e-3, at which it does not collapse; measured: first 5 0.33, steps 56-60 0.68).
  Budget: 2.5-8 s per step on 2 shared CPU cores (measured 105 s and 160 s for the two runs, asset preparation
  included, on a lightly loaded machine); up to 20 s per step when other runs saturate it, hence the generous
  timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from verl.trainer import quickstart, quickstart_geo3k

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env.update(TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def _train(
    assets: Path, run_dir: Path, *overrides: str, timeout_s: int = 600, log_to: Path | None = None
) -> dict[int, dict]:
    """main_ppo on the geo3k task (``log_to``: where its stdout + stderr go); the per-step metrics."""
    command = quickstart.main_ppo_command(
        assets,
        [
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
            f"trainer.log_dir={run_dir / 'logs'}",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            *overrides,
        ],
        task="geo3k",
    )
    done = subprocess.run(command, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if log_to is not None:
        log_to.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    by_step: dict[int, dict] = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step


def _weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def _split(weights: dict) -> tuple[dict, dict]:
    vision = {k: v for k, v in weights.items() if ".visual." in f".{k}"}
    return vision, {k: v for k, v in weights.items() if k not in vision}


@pytest.fixture(scope="module")
def short_warmed_assets(tmp_path_factory):
    # A short format warm-up: the responses then score 0.1 or 1.0, so GRPO groups have non-zero advantages and the
    # steps have gradients (a random model scores 0 everywhere and its update is weight decay only).
    out = tmp_path_factory.mktemp("geo3k_short")
    quickstart_geo3k.prepare(out, warmup_steps=30)
    return out


@pytest.mark.parametrize("freeze", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_freeze_vision_tower_keeps_vision_weights_bitwise(short_warmed_assets, tmp_path, freeze):
    """Two GRPO steps with images and no weight decay (so every change is a gradient step): the saved HF weights'
    vision tower equals the initial one bitwise when frozen; when not, most of its tensors changed, zero-initialised
    biases included (which weight decay alone would never move). The language model trained either way."""
    metrics = _train(
        short_warmed_assets,
        tmp_path,
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "actor_rollout_ref.actor.checkpoint.save_contents=['model','hf_model']",
        f"actor_rollout_ref.actor.freeze_vision_tower={freeze}",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.optim.weight_decay=0",
    )
    assert any(metrics[s]["actor/grad_norm"] > 0 for s in metrics)
    _check_vision_weights(short_warmed_assets, tmp_path, 2, freeze)


def _check_vision_weights(assets: Path, run_dir: Path, step: int, freeze: bool) -> None:
    before_vision, before_text = _split(_weights(assets / "model_vl"))
    after_vision, after_text = _split(_weights(run_dir / "ckpt" / f"global_step_{step}" / "actor" / "huggingface"))
    assert before_vision and set(before_vision) == set(after_vision)
    same = [k for k in before_vision if before_vision[k].equal(after_vision[k])]
    if freeze:
        assert len(same) == len(before_vision), sorted(set(before_vision) - set(same))
    else:
        assert not before_vision["model.visual.patch_embed.proj.weight"].equal(
            after_vision["model.visual.patch_embed.proj.weight"]
        )
        assert len(same) < len(before_vision) // 4, same
        assert not before_vision["model.visual.blocks.0.attn.qkv.bias"].equal(
            after_vision["model.visual.blocks.0.attn.qkv.bias"]
        )
    assert any(not before_text[k].equal(after_text[k]) for k in before_text)


@pytest.fixture(scope="module")
def warmed_assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("geo3k")
    quickstart_geo3k.prepare(out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("freeze", "lr", "steps"),
    [
        (False, "2e-3", 40),  # the quickstart lr
        # Frozen tower: at 2e-3 (and 1.5e-3) the policy collapses after its 3rd update (measured): the `{` after
        # `\boxed` loses its probability (responses `\boxedred}`), every score is 0, GRPO advantages are 0 and no
        # gradient is left to recover. At 1e-3 it does not collapse and learns more slowly (measured: +0.07 by step
        # 40, steps 56-60 0.675 vs first 5 0.327).
        (True, "1e-3", 60),
    ],
)
def test_geo3k_grpo_learns_to_read_the_image(warmed_assets, tmp_path, freeze, lr, steps):
    """Mean geo3k score of the last 5 steps >= the first 5 + 0.2 (the format-warmed model guesses the colour
    uniformly: about 0.35; reading the image is the only way up), with the vision tower trained or frozen."""
    metrics = _train(
        warmed_assets,
        tmp_path,
        f"trainer.total_training_steps={steps}",
        "data.max_response_length=16",
        f"actor_rollout_ref.actor.freeze_vision_tower={freeze}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"trainer.save_freq={steps}",
        "actor_rollout_ref.actor.checkpoint.save_contents=['model','hf_model']",
        "actor_rollout_ref.actor.optim.weight_decay=0",
        timeout_s=1500,
    )
    _check_vision_weights(warmed_assets, tmp_path, steps, freeze)
    scores = [metrics[s]["critic/score/mean"] for s in sorted(metrics)]
    assert len(scores) == steps
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last >= first + 0.2, scores

"""Field-report item 8 on the worker's path: a Qwen3.5 checkpoint whose ``config.json`` carries
``text_config.ignore_keys_at_rope_validation`` as a JSON list loads through the config loaders the workers use
(``verl.utils.model.load_hf_config``, ``HFModelConfig.hf_config``) and trains one actor step.

On transformers 5.4.0 (``.venv-tf54``, marker ``tf_compat``) plain ``AutoConfig.from_pretrained`` raises
``TypeError: unsupported operand type(s) for -=: 'set' and 'list'`` on such a file (the control test below), so
these tests fail there when either loader goes back to plain AutoConfig."""

import json
import os

import pytest
import torch
import transformers
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from packaging.version import Version
from tensordict import TensorDict

import verl.trainer.config as trainer_config_pkg
from verl.models.tiny import save_tiny_checkpoint
from verl.protocol import DataProto
from verl.utils.testing.dist import run_on_ranks
from verl.utils.tokenizer import build_offline_tokenizer

pytestmark = pytest.mark.tf_compat

LIST_KEYS = ["mrope_section", "mrope_interleaved"]
PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 2, 2, 6, 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny Qwen3.5-MoE checkpoint whose text_config lists the rope-validation keys (as JSON can only)."""
    path = str(tmp_path_factory.mktemp("list_keys") / "tiny")
    tokenizer = build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(100)], vocab_size=300)
    save_tiny_checkpoint("qwen3_5_moe", tokenizer, path)
    config_file = os.path.join(path, "config.json")
    with open(config_file) as f:
        raw = json.load(f)
    text = raw.get("text_config", raw)  # the CausalLM kind stores a flat text config
    text["ignore_keys_at_rope_validation"] = LIST_KEYS
    with open(config_file, "w") as f:
        json.dump(raw, f)
    return path


def test_plain_autoconfig_fails_on_the_field_report_version(checkpoint):
    """Control: on transformers < 5.5 plain AutoConfig raises the field report's TypeError on this checkpoint, so
    the tests below exercise the fix there (later versions accept the list)."""
    if Version(transformers.__version__) >= Version("5.5"):
        pytest.skip("fixed upstream in transformers 5.5; the control applies to 5.4.0 only")
    with pytest.raises(Exception, match="unsupported operand"):  # a TypeError, wrapped by huggingface_hub
        transformers.AutoConfig.from_pretrained(checkpoint)


def test_worker_config_loaders_accept_list_typed_keys(checkpoint):
    """Both config loaders the workers call build the config, with the listed keys honoured as a set, and the
    tokenizers load from the same directory."""
    from verl.utils.model import load_hf_config
    from verl.workers.config.model import HFModelConfig

    for config in (
        load_hf_config(checkpoint, trust_remote_code=False, override_config={}, attn_implementation="sdpa"),
        HFModelConfig(path=checkpoint).hf_config,
    ):
        text = getattr(config, "text_config", None) or config
        assert set(LIST_KEYS) <= set(text.ignore_keys_at_rope_validation)
        assert text.hidden_size == 64
    from verl.utils.tokenizer import hf_tokenizer

    # the tokenizer loaders read the model config too (the driver's hf_tokenizer, the workers' HFModelConfig)
    assert hf_tokenizer(checkpoint).pad_token_id is not None
    assert HFModelConfig(path=checkpoint).tokenizer.pad_token_id is not None


def _config(model_path: str):
    overrides = [
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.model.path={model_path}",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    ]
    with initialize_config_dir(config_dir=os.path.dirname(trainer_config_pkg.__file__), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    OmegaConf.resolve(cfg)
    return cfg


def _one_step(cfg) -> dict:
    """Rank body: build the actor+rollout worker from the checkpoint, generate, and run one actor update."""
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor_rollout")
    worker.init_model()
    ids = torch.randint(5, 250, (PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, batch_size=[PROMPTS])
    gen = worker.generate_sequences(DataProto(batch=td, meta_info={"do_sample": True}).repeat(N, interleave=True))
    batch = DataProto(batch=gen.batch, meta_info={"temperature": 1.0})
    batch.batch["response_mask"] = batch.batch["attention_mask"][:, -RESPONSE_LEN:]
    old = worker.compute_log_prob(batch).batch["old_log_probs"]
    batch.batch["old_log_probs"] = old
    batch.batch["advantages"] = torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    metrics = worker.update_actor(batch).meta_info["metrics"]
    new = worker.compute_log_prob(batch).batch["old_log_probs"]
    return {"metrics": metrics, "moved": float((new - old).abs().max())}


def test_list_typed_checkpoint_trains_one_step_through_the_worker(checkpoint):
    """The worker builds the model from the checkpoint (its config through the fixed loader), and one PPO update
    runs: finite pg_loss and a policy that moved."""
    (result,) = run_on_ranks(_one_step, world_size=1, args=(_config(checkpoint),), timeout_s=600)
    pg_loss = result["metrics"]["actor/pg_loss"]
    pg_loss = pg_loss[0] if isinstance(pg_loss, list) else pg_loss
    assert torch.isfinite(torch.tensor(pg_loss))
    assert result["moved"] > 1e-4

#!/usr/bin/env bash
# CPU smoke test of the Qwen3.5 recipe shape: the same GRPO overrides as the Ascend recipes (remove padding,
# chunked entropy, KL loss, param/optimizer offload, one FSDP strategy key), on the tiny random-initialised
# Qwen3.5-MoE of `python -m verl.trainer.quickstart`, with the HF rollout instead of vLLM. Minutes on a laptop.
#
# Targets:  one CPU machine (2+ cores, 8 GB RAM); the project's .venv (`make venv`); no accelerator, no CANN.
# Data:     none to prepare: the quickstart writes its tokenizer, tiny model and synthetic parquet to QUICKSTART_DIR.
#
# STRATEGY=fsdp runs the same smoke through FSDP1. Extra overrides can be appended:
#   bash recipes/qwen3_5/run_qwen3_5_tiny_grpo_cpu_smoke.sh trainer.total_training_steps=10
set -euo pipefail
RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "${RECIPE_DIR}/common.sh"

QUICKSTART_DIR=${QUICKSTART_DIR:-.quickstart}
STRATEGY=${STRATEGY:-fsdp2}
STEPS=${STEPS:-2}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# >>> hydra overrides
OVERRIDES=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    data.train_batch_size=8
    data.max_prompt_length=128
    data.max_response_length=8
    data.filter_overlong_prompts=True
    data.dataloader_num_workers=0
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    "actor_rollout_ref.actor.strategy=${STRATEGY}"
    actor_rollout_ref.actor.optim.lr=1e-3
    actor_rollout_ref.actor.ppo_mini_batch_size=8
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.kl_loss_coef=0.01
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.use_torch_compile=False
    actor_rollout_ref.actor.entropy_from_logits_with_chunking=True
    actor_rollout_ref.actor.entropy_checkpointing=True
    actor_rollout_ref.actor.fsdp_config.param_offload=True
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
    actor_rollout_ref.ref.fsdp_config.param_offload=True
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.ref.entropy_from_logits_with_chunking=True
    actor_rollout_ref.rollout.name=hf
    actor_rollout_ref.rollout.n=4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    trainer.device=cpu
    trainer.use_legacy_worker_impl=auto
    trainer.nnodes=1
    trainer.n_gpus_per_node=1
    "trainer.logger=['console']"
    trainer.val_before_train=False
    trainer.save_freq=-1
    trainer.test_freq=-1
    "trainer.total_training_steps=${STEPS}"
)
# <<< hydra overrides

verl_launch verl.trainer.quickstart "--dir=${QUICKSTART_DIR}" "${OVERRIDES[@]}" "$@"

#!/usr/bin/env bash
# GRPO on Qwen3.5-35B-A3B with FSDP1 (actor.strategy=fsdp) and a vLLM rollout, text only (AIME-style math,
# scored by the DAPO rule: `Answer: <x>` or \boxed{}).
#
# Targets:  2 nodes x Atlas 800T A2 (8 x Ascend 910B, 64 GB HBM each) = 16 NPUs, CANN >= 8.5.1, the image of
#           docker/ascend/Dockerfile. Atlas 200T A2 Box16: NNODES=1 NPUS_PER_NODE=16.
# Start:    a Ray cluster with NPU resources on every node first (docs/ascend.md), then run this on the head node.
# Data:     python examples/data_preprocess/aime.py --input_jsonl train=<aime-format>.jsonl test=aime_2024.jsonl
#           (writes ~/data/aime/{train,test}.parquet; any AIME-format problem set works as the train split).
#
# FSDP1 has no CPUOffloadPolicy: parameters and optimizer state are moved to the host between phases
# (fsdp_config.param_offload / optimizer_offload). `actor.strategy` is the only FSDP-version knob: the reference
# model and the engine configs follow it (field-report item 9).
#
# Extra Hydra overrides can be appended: bash run_qwen3_5_35b_a3b_grpo_fsdp1_aime.sh trainer.total_epochs=1
set -euo pipefail
RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "${RECIPE_DIR}/common.sh"

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3.5-35B-A3B}
DATA_DIR=${DATA_DIR:-${HOME}/data}
TRAIN_FILES=${TRAIN_FILES:-${DATA_DIR}/aime/train.parquet}
VAL_FILES=${VAL_FILES:-${DATA_DIR}/aime/test.parquet}
NNODES=${NNODES:-2}
NPUS_PER_NODE=${NPUS_PER_NODE:-8}
DEVICE=${DEVICE:-npu}
ROLLOUT_TP=${ROLLOUT_TP:-4}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-16}
N_RESPONSES=${N_RESPONSES:-5}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-2048}
LOGGER=${LOGGER:-"['console','tensorboard']"}
PROJECT_NAME=${PROJECT_NAME:-verl_qwen3_5_grpo}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen3_5_35b_a3b_fsdp1_aime}
CKPT_DIR=${CKPT_DIR:-checkpoints/${PROJECT_NAME}/${EXPERIMENT_NAME}}

# >>> hydra overrides
OVERRIDES=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    "data.train_files=${TRAIN_FILES}"
    "data.val_files=${VAL_FILES}"
    "data.train_batch_size=${TRAIN_BATCH_SIZE}"
    "data.max_prompt_length=${MAX_PROMPT_LENGTH}"
    "data.max_response_length=${MAX_RESPONSE_LENGTH}"
    data.filter_overlong_prompts=True
    data.truncation=error
    "actor_rollout_ref.model.path=${MODEL_PATH}"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.strategy=fsdp
    actor_rollout_ref.actor.optim.lr=1e-6
    "actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE}"
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
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
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
    actor_rollout_ref.ref.entropy_from_logits_with_chunking=True
    actor_rollout_ref.rollout.name=vllm
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    "actor_rollout_ref.rollout.n=${N_RESPONSES}"
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    actor_rollout_ref.rollout.max_num_batched_tokens=8192
    actor_rollout_ref.rollout.free_cache_engine=True
    actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096
    "trainer.device=${DEVICE}"
    trainer.use_legacy_worker_impl=auto
    "trainer.nnodes=${NNODES}"
    "trainer.n_gpus_per_node=${NPUS_PER_NODE}"
    "trainer.logger=${LOGGER}"
    "trainer.project_name=${PROJECT_NAME}"
    "trainer.experiment_name=${EXPERIMENT_NAME}"
    "trainer.default_local_dir=${CKPT_DIR}"
    trainer.val_before_train=True
    trainer.save_freq=5
    trainer.test_freq=5
    trainer.total_epochs=15
)
# <<< hydra overrides

verl_check_files TRAIN_FILES VAL_FILES
verl_export_ascend_env
verl_launch verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"

#!/usr/bin/env bash
# Smoke test of an Ascend installation: GRPO on Qwen3.5-2B (dense, same hybrid Gated DeltaNet + gated attention
# layers as the 35B) with FSDP2 and the vLLM rollout, GSM8K, 5 steps, on ONE NPU. Run it before the 35B recipes:
# it exercises torch_npu, HCCL (one rank), vllm-ascend, the weight sync, the patch report and checkpointing in
# about the time it takes to load the model, and needs no second node.
#
# Targets:  1 x Ascend 910B (64 GB HBM) of an Atlas 800T A2 / 200T A2 Box16, the image of docker/ascend/Dockerfile.
# Data:     python examples/data_preprocess/gsm8k.py --hub     (real GSM8K -> ~/data/gsm8k/{train,test}.parquet;
#           needs `datasets`, in the image; without network: --input_jsonl train=... test=... of GSM8K's jsonl)
#
# Expected outcome (docs/recipes.md, "Smoke run on one NPU"): 5 steps and a final validation, exit 0; the start-up
# patch report lists every npu-* patch as `applied`; perf/max_memory_allocated_gb stays well under 64 GB with
# offload on; metrics.png and metrics.jsonl under $CKPT_DIR/logs.
#
# Extra Hydra overrides can be appended: bash run_qwen3_5_2b_grpo_fsdp2_gsm8k_npu_smoke.sh trainer.total_training_steps=2
set -euo pipefail
RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "${RECIPE_DIR}/common.sh"

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3.5-2B}
DATA_DIR=${DATA_DIR:-${HOME}/data}
TRAIN_FILES=${TRAIN_FILES:-${DATA_DIR}/gsm8k/train.parquet}
VAL_FILES=${VAL_FILES:-${DATA_DIR}/gsm8k/test.parquet}
NNODES=${NNODES:-1}
NPUS_PER_NODE=${NPUS_PER_NODE:-1}
DEVICE=${DEVICE:-npu}
STEPS=${STEPS:-5}
LOGGER=${LOGGER:-"['console','file']"}
PROJECT_NAME=${PROJECT_NAME:-verl_qwen3_5_smoke}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen3_5_2b_fsdp2_gsm8k_1npu}
CKPT_DIR=${CKPT_DIR:-checkpoints/${PROJECT_NAME}/${EXPERIMENT_NAME}}

# >>> hydra overrides
OVERRIDES=(
    algorithm.adv_estimator=grpo
    algorithm.use_kl_in_reward=False
    "data.train_files=${TRAIN_FILES}"
    "data.val_files=${VAL_FILES}"
    data.train_batch_size=16
    data.val_batch_size=128
    data.max_prompt_length=512
    data.max_response_length=512
    data.filter_overlong_prompts=True
    data.truncation=error
    "actor_rollout_ref.model.path=${MODEL_PATH}"
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
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
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.tensor_model_parallel_size=1
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5
    actor_rollout_ref.rollout.n=4
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
    actor_rollout_ref.rollout.enable_chunked_prefill=True
    actor_rollout_ref.rollout.max_num_batched_tokens=4096
    actor_rollout_ref.rollout.enable_prefix_caching=False
    actor_rollout_ref.rollout.free_cache_engine=True
    "trainer.device=${DEVICE}"
    trainer.use_legacy_worker_impl=auto
    "trainer.nnodes=${NNODES}"
    "trainer.n_gpus_per_node=${NPUS_PER_NODE}"
    "trainer.logger=${LOGGER}"
    "trainer.project_name=${PROJECT_NAME}"
    "trainer.experiment_name=${EXPERIMENT_NAME}"
    "trainer.default_local_dir=${CKPT_DIR}"
    "trainer.log_dir=${CKPT_DIR}/logs"
    trainer.val_before_train=True
    "trainer.save_freq=${STEPS}"
    "trainer.test_freq=${STEPS}"
    "trainer.total_training_steps=${STEPS}"
)
# <<< hydra overrides

verl_check_files TRAIN_FILES VAL_FILES
verl_export_ascend_env
verl_launch verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"

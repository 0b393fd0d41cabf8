#!/usr/bin/env bash
# GRPO on Qwen3.5-35B-A3B with the VeOmni training engine (engine workers, model_engine=veomni: FSDP2 full
# shard + expert parallelism built by VeOmni), vLLM rollout, text only (AIME-style math).
# The field report trained 2K -> 20K sequences with this backend using VeOmni's Ulysses SP: SP_SIZE sets
# veomni.ulysses_parallel_size (VeOmni's own SP: its collator shards the packed stream, its attention and Gated
# DeltaNet layers split heads over the group; text only, SP_SIZE must divide the GDN and attention head counts).
# Its wiring is checked on the CPU against a stand-in only (docs/veomni.md); the other route to 20K sequences is
# run_qwen3_5_35b_a3b_grpo_longseq.sh (FSDP2 + this repository's own Ulysses SP).
#
# Targets:  2 nodes x Atlas 800T A2 (8 x Ascend 910B, 64 GB HBM each) = 16 NPUs, CANN >= 8.5.1, the image of
#           docker/ascend/Dockerfile plus the `veomni` extra (pip install -e .[npu,veomni]) and VeOmni's NPU
#           Gated DeltaNet kernels (triton-ascend). Atlas 200T A2 Box16: NNODES=1 NPUS_PER_NODE=16.
# Start:    a Ray cluster with NPU resources on every node first (docs/ascend.md), then run this on the head node.
# Data:     as run_qwen3_5_35b_a3b_grpo_fsdp1_aime.sh (~/data/aime/{train,test}.parquet).
#
# Qwen3.5's three Gated DeltaNet ops have no automatic NPU choice in VeOmni: GDN_KERNELS selects them (npu =
# VeOmni's triton-ascend kernels). The reference model gets the same choice (its copies are not inherited).
#
# Extra Hydra overrides can be appended: bash run_qwen3_5_35b_a3b_grpo_veomni_aime.sh trainer.total_epochs=1
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
EP_SIZE=${EP_SIZE:-8}
SP_SIZE=${SP_SIZE:-1}
GDN_KERNELS=${GDN_KERNELS:-npu}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-16}
N_RESPONSES=${N_RESPONSES:-5}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-2048}
LOGGER=${LOGGER:-"['console','tensorboard']"}
PROJECT_NAME=${PROJECT_NAME:-verl_qwen3_5_grpo}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen3_5_35b_a3b_veomni_aime_ep${EP_SIZE}}
CKPT_DIR=${CKPT_DIR:-checkpoints/${PROJECT_NAME}/${EXPERIMENT_NAME}}

# >>> hydra overrides
OVERRIDES=(
    # Hydra config group: composes the veomni actor/ref/optim/engine yaml family
    model_engine=veomni
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
    actor_rollout_ref.actor.strategy=veomni
    actor_rollout_ref.actor.optim.lr=1e-6
    "actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE}"
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.kl_loss_coef=0.01
    actor_rollout_ref.actor.entropy_coeff=0
    actor_rollout_ref.actor.veomni.param_offload=True
    actor_rollout_ref.actor.veomni.optimizer_offload=True
    actor_rollout_ref.actor.veomni.enable_full_shard=True
    # VeOmni's own Ulysses SP (see the header); the reference follows this size
    "actor_rollout_ref.actor.veomni.ulysses_parallel_size=${SP_SIZE}"
    "actor_rollout_ref.actor.veomni.expert_parallel_size=${EP_SIZE}"
    actor_rollout_ref.actor.veomni.entropy_from_logits_with_chunking=True
    actor_rollout_ref.actor.veomni.entropy_checkpointing=True
    # HF routes flash_attention_2 to torch_npu.npu_fusion_attention on Ascend
    actor_rollout_ref.actor.veomni.attn_implementation=flash_attention_2
    "actor_rollout_ref.actor.veomni.rms_norm_gated_implementation=${GDN_KERNELS}"
    "actor_rollout_ref.actor.veomni.causal_conv1d_implementation=${GDN_KERNELS}"
    "actor_rollout_ref.actor.veomni.chunk_gated_delta_rule_implementation=${GDN_KERNELS}"
    "actor_rollout_ref.ref.veomni.rms_norm_gated_implementation=${GDN_KERNELS}"
    "actor_rollout_ref.ref.veomni.causal_conv1d_implementation=${GDN_KERNELS}"
    "actor_rollout_ref.ref.veomni.chunk_gated_delta_rule_implementation=${GDN_KERNELS}"
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
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
    # VeOmni exists only on the engine-worker path
    trainer.use_legacy_worker_impl=disable
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

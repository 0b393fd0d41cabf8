#!/usr/bin/env bash
# Long-sequence GRPO on Qwen3.5-35B-A3B: remove padding + Ulysses sequence parallelism + parameter/optimizer
# offload, FSDP2, vLLM rollout, text only (AIME-style math). Two profiles, the lengths of the field report:
#   SEQ_PROFILE=20k   prompt 2K + response 18K = 20,480 tokens, Ulysses SP 4   (the report's stable FSDP setting)
#   SEQ_PROFILE=128k  prompt 4K + response 124K = 131,072 tokens, Ulysses SP 8, + activation offload
#
# Targets:  2 nodes x Atlas 800T A2 (8 x Ascend 910B, 64 GB HBM each) = 16 NPUs, CANN >= 8.5.1, the image of
#           docker/ascend/Dockerfile. SP_SIZE must divide the 16 attention heads and the device count, and should
#           stay within one node (8) so the all-to-all runs on the intra-node links.
# Start:    a Ray cluster with NPU resources on every node first (docs/ascend.md), then run this on the head node.
# Data:     as run_qwen3_5_35b_a3b_grpo_fsdp1_aime.sh (~/data/aime/{train,test}.parquet).
#
# How it fits: sequences are packed without padding (cu_seqlens mark the boundaries; the Gated DeltaNet layers
# reset their recurrent state and conv window at each one), Ulysses splits every packed stream over SP_SIZE
# ranks, micro-batches are formed by token budget (use_dynamic_bsz), full-vocabulary logits never exist at once
# (chunked log-prob/entropy), and parameters + optimizer state stay on the host outside their phase.
#
# Extra Hydra overrides can be appended: SEQ_PROFILE=128k bash run_qwen3_5_35b_a3b_grpo_longseq.sh trainer.total_epochs=1
set -euo pipefail
RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "${RECIPE_DIR}/common.sh"

SEQ_PROFILE=${SEQ_PROFILE:-20k}
case "${SEQ_PROFILE}" in
    20k)
        : "${MAX_PROMPT_LENGTH:=2048}" "${MAX_RESPONSE_LENGTH:=18432}" "${SP_SIZE:=4}"
        : "${ACTIVATION_OFFLOAD:=False}" "${TRAIN_BATCH_SIZE:=32}" "${PPO_MINI_BATCH_SIZE:=16}" "${N_RESPONSES:=5}"
        # two whole sequences per rank-budget: fewer, fuller micro-batches
        : "${SEQS_PER_MICRO_BATCH:=2}"
        ;;
    128k)
        : "${MAX_PROMPT_LENGTH:=4096}" "${MAX_RESPONSE_LENGTH:=126976}" "${SP_SIZE:=8}"
        : "${ACTIVATION_OFFLOAD:=True}" "${TRAIN_BATCH_SIZE:=16}" "${PPO_MINI_BATCH_SIZE:=8}" "${N_RESPONSES:=4}"
        : "${SEQS_PER_MICRO_BATCH:=1}"
        ;;
    *)
        echo "error: SEQ_PROFILE=${SEQ_PROFILE} is not one of: 20k, 128k" >&2
        exit 2
        ;;
esac
MAX_SEQ_LENGTH=$((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH))
# Token budget per device per micro-batch. Ulysses gives each rank 1/SP of a sequence, so SP x budget must hold
# SEQS_PER_MICRO_BATCH whole sequences (validate_config checks budget x SP >= one sequence before Ray starts).
TOKENS_PER_DEVICE=${TOKENS_PER_DEVICE:-$(((MAX_SEQ_LENGTH * SEQS_PER_MICRO_BATCH + SP_SIZE - 1) / SP_SIZE))}

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3.5-35B-A3B}
DATA_DIR=${DATA_DIR:-${HOME}/data}
TRAIN_FILES=${TRAIN_FILES:-${DATA_DIR}/aime/train.parquet}
VAL_FILES=${VAL_FILES:-${DATA_DIR}/aime/test.parquet}
NNODES=${NNODES:-2}
NPUS_PER_NODE=${NPUS_PER_NODE:-8}
DEVICE=${DEVICE:-npu}
ROLLOUT_TP=${ROLLOUT_TP:-4}
LOGGER=${LOGGER:-"['console','tensorboard']"}
PROJECT_NAME=${PROJECT_NAME:-verl_qwen3_5_grpo}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen3_5_35b_a3b_longseq_${SEQ_PROFILE}_sp${SP_SIZE}}
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
    # packed (varlen) forward: the precondition of Ulysses SP and of the GDN boundary resets
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    "actor_rollout_ref.model.enable_activation_offload=${ACTIVATION_OFFLOAD}"
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.optim.lr=1e-6
    "actor_rollout_ref.actor.ppo_mini_batch_size=${PPO_MINI_BATCH_SIZE}"
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=${SP_SIZE}"
    actor_rollout_ref.actor.use_dynamic_bsz=True
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${TOKENS_PER_DEVICE}"
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
    actor_rollout_ref.ref.entropy_from_logits_with_chunking=True
    actor_rollout_ref.rollout.name=vllm
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP}"
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    "actor_rollout_ref.rollout.n=${N_RESPONSES}"
    "actor_rollout_ref.rollout.max_model_len=${MAX_SEQ_LENGTH}"
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
    trainer.val_before_train=False
    trainer.save_freq=5
    trainer.test_freq=10
    trainer.total_epochs=15
)
# <<< hydra overrides

verl_check_files TRAIN_FILES VAL_FILES
verl_export_ascend_env
verl_launch verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"

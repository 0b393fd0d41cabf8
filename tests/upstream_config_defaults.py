"""Upstream verl's config-dataclass defaults, recorded from upstream's source, and every deviation from them here.

``UPSTREAM_DEFAULTS`` holds, for each upstream config dataclass that also exists here, every field's default
as upstream's class declares it (``verl/workers/config/{actor,critic,engine,model,optimizer,rollout,reward}.py``,
``verl/trainer/config/{algorithm,config}.py``, ``verl/utils/profiler/config.py``; the HEAD snapshot of main, with
the v0.7.1 key set where HEAD added keys — those are marked HEAD below). Notation: ``MISSING`` = upstream's
``omegaconf.MISSING`` (must be given), ``"<Cls>"`` = a nested config of class ``Cls``, ``NOT_GIVEN`` = upstream's
"nothing configured" default (None or an empty node).

``DEVIATIONS`` gives, for every (class, field) whose default here differs from upstream's or that upstream has and
this distribution does not, the reason. ``tests/test_public_api_manifest.py`` checks that the two tables describe
the code exactly (no unrecorded drift, no stale row) and that ``docs/upstream_compat.md`` shows ``DEVIATIONS``.

Upstream itself keeps two homes for some defaults: the class and the YAML (e.g. ``OptimizerConfig.lr`` is 1e-3 in
the class and 1e-6 in ``optim/fsdp.yaml``). Here the class holds upstream's YAML value (category ``YAML``), so a
config built in Python trains exactly like the default run, except for upstream's "not configured" sentinels
(``min_lr_ratio=None``, ``pf_ppo`` empty), which mean the same value and are mirrored on both sides as upstream
has them: ``YAML_SPLIT_LEAVES`` lists those YAML leaves for the YAML-vs-dataclass test.
"""

from __future__ import annotations

MISSING = "???"
NOT_GIVEN = "<not given>"

# Reason categories shared by many rows.
YAML = (
    "upstream's class default differs from upstream's own YAML default; here the class holds the YAML value (one "
    "home per default), so a config built in Python trains like the default run"
)
REQUIRED = "upstream's class leaves it MISSING (must be given); here it defaults to upstream's YAML value"
HEAD = "added by upstream after v0.7.x (HEAD); this distribution keeps the v0.7.x key set"
FSDP_OPTIM = "the optimizer of every role here is FSDPOptimizerConfig (optim/fsdp.yaml), as upstream's YAML selects"
RUNTIME = "runtime state, not a config key: the workers load the tokenizer, processor and HF config themselves"
PER_CALL = (
    "per-call batch settings (dynamic bsz, token budgets, micro-batch sizes, remove-padding, fused kernels) travel "
    "in the batch plan (verl.workers.core.batch_plan.BatchPlan), not on the engine config"
)
LORA = "LoRA is not implemented (model.lora_rank > 0 is refused)"
NO_ROUTER_REPLAY = (
    "routing is replayed from the batch (routed_experts, recorded by the old-log-prob forward), never from files"
)
NO_COMPILE = (
    "torch.compile is not applied (the chunked log-prob/entropy kernels run eagerly); false by default so a default "
    "run is not reported, true is reported as having no effect (verl.utils.config_support)"
)

NO_QUANT = "quantization-aware training is not implemented"
NO_RM_ROLLOUT = "a generative / served reward model is not supported (reward.reward_model.enable is refused)"
NO_SERVER = "server-mode rollout features (SGLang server, Prometheus, tracing, skip) are not implemented"

UPSTREAM_DEFAULTS: dict[str, dict[str, object]] = {
    # verl/workers/config/actor.py
    "PolicyLossConfig": {
        "loss_mode": "vanilla",
        "clip_cov_ratio": 0.0002,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
        "kl_cov_ratio": 0.0002,
        "ppo_kl_coef": 0.1,
    },
    "RouterReplayConfig": {"mode": "disabled", "record_file": None, "replay_file": None},
    "ActorConfig": {
        "strategy": MISSING,
        "ppo_mini_batch_size": 256,
        "ppo_micro_batch_size": None,
        "ppo_micro_batch_size_per_gpu": None,
        "ppo_infer_micro_batch_size_per_gpu": None,
        "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 16384,
        "ppo_infer_max_token_len_per_gpu": 16384,
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "freeze_vision_tower": False,
        "policy_loss": "<PolicyLossConfig>",
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
        "loss_scale_factor": None,
        "entropy_coeff": 0,
        "tau_pos": 1.0,
        "tau_neg": 1.05,
        "calculate_entropy": False,
        "use_kl_loss": False,
        "use_prefix_grouper": False,
        "use_torch_compile": True,
        "kl_loss_coef": 0.001,
        "kl_loss_type": "low_var_kl",
        "ppo_epochs": 1,
        "shuffle": False,
        "data_loader_seed": 1,
        "checkpoint": "<CheckpointConfig>",
        "optim": "<OptimizerConfig>",
        "use_fused_kernels": False,
        "profiler": "<ProfilerConfig>",
        "engine": "<BaseConfig>",
        "rollout_n": MISSING,
        "model_config": "<BaseConfig>",
        "router_replay": "<RouterReplayConfig>",
        "global_batch_info": {},
    },
    "FSDPActorConfig": {
        "strategy": "fsdp",
        "grad_clip": 1.0,
        "ulysses_sequence_parallel_size": 1,
        "entropy_from_logits_with_chunking": False,
        "entropy_from_logits_chunk_size": 2048,  # HEAD; kept (Qwen3.5's vocabulary needs it)
        "entropy_checkpointing": False,
        "fsdp_config": "<FSDPEngineConfig>",
        "use_remove_padding": False,
        "use_rollout_log_probs": False,
        "calculate_sum_pi_squared": False,
        "sum_pi_squared_checkpointing": False,
    },
    "VeOmniActorConfig": {
        "strategy": "veomni",
        "veomni": "<VeOmniEngineConfig>",
        "use_remove_padding": False,
        "use_rollout_log_probs": False,
    },
    # verl/workers/config/critic.py
    "CriticConfig": {
        "strategy": MISSING,
        "ppo_micro_batch_size_per_gpu": None,
        "enable": None,
        "rollout_n": 1,
        "ppo_mini_batch_size": 1,
        "use_dynamic_bsz": False,
        "ppo_max_token_len_per_gpu": 32768,
        "forward_max_token_len_per_gpu": 32768,
        "ppo_infer_micro_batch_size_per_gpu": None,
        "ppo_infer_max_token_len_per_gpu": 32768,
        "ppo_epochs": 1,
        "data_loader_seed": 1,
        "shuffle": True,
        "cliprange_value": 0.5,
        "loss_agg_mode": "token-mean",
        "ppo_micro_batch_size": None,
        "engine": "<BaseConfig>",
        "optim": "<OptimizerConfig>",
        "model": "<BaseModelConfig>",
        "model_config": None,
        "checkpoint": "<CheckpointConfig>",
        "profiler": "<ProfilerConfig>",
    },
    "FSDPCriticConfig": {
        "strategy": "fsdp",
        "forward_micro_batch_size": 1,
        "forward_micro_batch_size_per_gpu": 1,
        "ulysses_sequence_parallel_size": 1,
        "grad_clip": 1.0,
    },
    "FSDPCriticModelCfg": {
        "path": "~/models/deepseek-llm-7b-chat",
        "tokenizer_path": None,
        "override_config": {},
        "external_lib": None,
        "trust_remote_code": False,
        "lora": {},  # HEAD
        "use_shm": False,
        "enable_activation_offload": False,
        "use_remove_padding": False,
        "enable_gradient_checkpointing": True,
        "fsdp_config": "<FSDPEngineConfig>",
        "lora_rank": 0,
        "lora_alpha": 16,
        "target_modules": "all-linear",
        "tiled_mlp": {"enabled": False, "num_shards": 4},
    },
    # verl/workers/config/engine.py
    "EngineConfig": {
        "param_offload": False,
        "optimizer_offload": False,
        "grad_offload": False,
        "forward_only": False,
        "strategy": None,
        "dtype": "bfloat16",
        "use_dynamic_bsz": True,
        "max_token_len_per_gpu": None,
        "micro_batch_size_per_gpu": None,
        "infer_max_token_len_per_gpu": None,
        "infer_micro_batch_size_per_gpu": None,
        "use_fused_kernels": False,
        "use_remove_padding": True,
        "seed": 42,
        "full_determinism": False,
        "router_replay": "<EngineRouterReplayConfig>",
    },
    "FSDPEngineConfig": {
        "wrap_policy": {},
        "offload_policy": False,
        "reshard_after_forward": True,
        "fsdp_size": -1,
        "forward_prefetch": False,
        "model_dtype": "fp32",
        "use_orig_params": False,
        "mixed_precision": None,
        "ulysses_sequence_parallel_size": 1,
        "entropy_from_logits_with_chunking": False,
        "entropy_from_logits_chunk_size": 2048,  # HEAD; kept
        "use_torch_compile": True,
        "entropy_checkpointing": False,
        "strategy": "fsdp",
        "qat": "<QATEngineConfig>",
        "dtype": "bfloat16",
    },
    "VeOmniEngineConfig": {
        "wrap_policy": {},
        "offload_policy": False,
        "reshard_after_forward": True,
        "forward_prefetch": False,
        "use_orig_params": False,
        "entropy_from_logits_with_chunking": False,
        "use_torch_compile": True,
        "entropy_checkpointing": False,
        "strategy": "veomni",
        "fsdp_size": -1,
        "ulysses_parallel_size": 1,
        "expert_parallel_size": 1,
        "seed": 42,
        "full_determinism": False,
        "mixed_precision": False,
        "init_device": "meta",
        "enable_full_shard": False,
        "ckpt_manager": "dcp",
        "load_checkpoint_path": None,
        "enable_fsdp_offload": False,
        "enable_reentrant": False,
        "attn_implementation": "flash_attention_2",
        "moe_implementation": "fused",
        "force_use_huggingface": False,
        "activation_gpu_limit": 0.0,
        "basic_modules": [],
    },
    # verl/workers/config/optimizer.py
    "OptimizerConfig": {
        "lr": 1e-3,
        "lr_warmup_steps_ratio": 0.0,
        "total_training_steps": -1,
        "weight_decay": 0.01,
        "lr_warmup_steps": -1,
        "betas": [0.9, 0.999],
        "clip_grad": 1.0,
        "grad_clip": None,
    },
    "FSDPOptimizerConfig": {
        "optimizer": "AdamW",
        "optimizer_impl": "torch.optim",
        "min_lr_ratio": None,
        "warmup_style": None,
        "lr_scheduler_type": "constant",
        "num_cycles": 0.5,
        "override_optimizer_config": None,
        "zero_indexed_step": True,
    },
    # verl/workers/config/model.py
    "HFModelConfig": {
        "path": MISSING,
        "local_path": None,
        "hf_config_path": None,
        "local_hf_config_path": None,
        "tokenizer_path": None,
        "local_tokenizer_path": None,
        "load_tokenizer": True,
        "hf_config": None,
        "generation_config": None,
        "tokenizer": None,
        "processor": None,
        "use_shm": False,
        "trust_remote_code": False,
        "custom_chat_template": None,
        "external_lib": None,
        "override_config": {},
        "enable_gradient_checkpointing": True,
        "enable_activation_offload": False,
        "use_remove_padding": True,
        "lora_rank": 0,
        "lora_alpha": 16,
        "target_modules": "all-linear",
        "target_parameters": None,
        "exclude_modules": None,
        "lora": {},
        "lora_adapter_path": None,
        "use_liger": False,
        "use_fused_kernels": False,
        "fused_kernel_options": {},
        "tiled_mlp": {"enabled": False, "num_shards": 4},
        "architectures": None,
        "mtp": "<MtpConfig>",  # HEAD
    },
    # verl/workers/config/rollout.py
    "SamplingConfig": {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True, "n": 1},
    "MultiTurnConfig": {
        "enable": False,
        "max_assistant_turns": None,
        "tool_config_path": None,
        "max_user_turns": None,
        "max_parallel_calls": 1,
        "max_tool_response_length": 256,
        "tool_response_truncate_side": "middle",
        "use_inference_chat_template": False,
        "tokenization_sanity_check_mode": "strict",
        "format": "hermes",
        "num_repeat_rollouts": None,
    },
    "CustomAsyncServerConfig": {"path": None, "name": None},
    "AgentLoopConfig": {
        "num_workers": 8,
        "default_agent_loop": "single_turn_agent",
        "agent_loop_config_path": None,
        "custom_async_server": "<CustomAsyncServerConfig>",
        "agent_loop_manager_class": None,  # HEAD
    },
    "CheckpointEngineConfig": {
        "backend": "naive",
        "update_weights_bucket_megabytes": 2048,
        "engine_kwargs": {},
        "custom_backend_module": None,  # HEAD
    },
    "RolloutConfig": {
        "name": MISSING,
        "mode": "async",
        "nnodes": 0,
        "n_gpus_per_node": 8,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "do_sample": True,
        "n": 1,
        "repetition_penalty": 1.0,
        "over_sample_rate": 0.0,
        "prompt_length": 512,
        "response_length": 512,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.5,
        "ignore_eos": False,
        "enforce_eager": True,
        "cudagraph_capture_sizes": None,
        "free_cache_engine": True,
        "data_parallel_size": 1,
        "expert_parallel_size": 1,
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1,
        "moe_tensor_parallel_size": 1,
        "max_num_batched_tokens": 8192,
        "logprobs_mode": "processed_logprobs",
        "scheduling_policy": "fcfs",
        "val_kwargs": "<SamplingConfig>",
        "max_model_len": None,
        "max_num_seqs": 1024,
        "log_prob_micro_batch_size": None,
        "log_prob_micro_batch_size_per_gpu": None,
        "log_prob_use_dynamic_bsz": False,
        "log_prob_max_token_len_per_gpu": 16384,
        "disable_log_stats": True,
        "multi_stage_wake_up": False,
        "engine_kwargs": {},
        "calculate_log_probs": False,
        "agent": "<AgentLoopConfig>",
        "trace": "<TraceConfig>",
        "multi_turn": "<MultiTurnConfig>",
        "server": "<ServerConfig>",
        "prometheus": "<PrometheusConfig>",
        "custom": None,
        "checkpoint_manager_class": None,
        "checkpoint_engine": "<CheckpointEngineConfig>",
        "skip": "<SkipConfig>",
        "profiler": None,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "load_format": "dummy",
        "layered_summon": False,
        "layer_name_map": {},
        "sglang_engine_mode": "local",
        "limit_images": None,
        "use_preprocessed_multimodal_input": True,
        "skip_tokenizer_init": False,
        "quantization": None,
        "quantization_config_file": None,
        "enable_rollout_routing_replay": False,
        "enable_sleep_mode": True,
        "mtp": "<MtpConfig>",
        "qat": None,
    },
    # verl/workers/config/reward.py
    "RewardManagerConfig": {"source": "register", "name": "naive", "module": "<ModuleConfig>"},
    "RewardManagerModuleConfig": {"path": None, "name": None},  # upstream's ModuleConfig
    "SandboxFusionConfig": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
    "RewardModelConfig": {
        "enable": False,
        "enable_resource_pool": False,
        "n_gpus_per_node": 8,
        "nnodes": 0,
        "model_path": None,
        "rollout": "<RolloutConfig>",
    },
    "RewardConfig": {
        "num_workers": 8,
        "num_cpus_per_worker": 0.25,  # HEAD
        "reward_manager": "<RewardManagerConfig>",
        "reward_model": "<RewardModelConfig>",
        "sandbox_fusion": "<SandboxFusionConfig>",
    },
    # verl/trainer/config/algorithm.py
    "KLControlConfig": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1},
    "RolloutCorrectionConfig": {
        "rollout_is": "sequence",
        "rollout_is_threshold": 2.0,
        "rollout_is_batch_normalize": False,
        "rollout_rs": None,
        "rollout_rs_threshold": None,
        "bypass_mode": False,
        "loss_type": "ppo_clip",
        "debug_rollout_actor_probs": False,  # HEAD
    },
    "AlgoConfig": {
        "gamma": 1.0,
        "lam": 1.0,
        "adv_estimator": "gae",
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
        "kl_penalty": "kl",
        "kl_ctrl": "<KLControlConfig>",
        "use_pf_ppo": False,
        "pf_ppo": NOT_GIVEN,
        "filter_groups": None,  # HEAD
        "rollout_correction": None,
        "gdpo_reward_keys": None,  # HEAD
        "gdpo_reward_weights": None,  # HEAD
    },
    # verl/trainer/config/config.py
    "CheckpointConfig": {
        "save_contents": ["model", "optimizer", "extra"],
        "load_contents": ["model", "optimizer", "extra"],
        "async_save": False,
        "strict": True,  # HEAD
        "hf_export_dtype": None,  # HEAD
        "save_lora_only": False,  # HEAD
    },
    "BaseModelConfig": {
        "path": "~/models/deepseek-llm-7b-chat",
        "tokenizer_path": None,
        "override_config": {},
        "external_lib": None,
        "trust_remote_code": False,
        "lora": {},  # HEAD
    },
    # verl/utils/profiler/config.py
    "ProfilerConfig": {
        "tool": MISSING,
        "enable": False,
        "all_ranks": False,
        "ranks": [],
        "save_path": MISSING,
        "tool_config": MISSING,
        "global_tool_config": None,
        "relocate_results": False,  # HEAD
        "finish_hook_cmd": None,  # HEAD
        "finish_hook_all_ranks": False,  # HEAD
        "finish_hook_ranks": [],  # HEAD
    },
    "NsightToolConfig": {"discrete": False, "name": "nsight"},
    "TorchProfilerToolConfig": {
        "contents": [],
        "discrete": False,
        "profile_token_start": None,  # HEAD
        "profile_token_end": None,  # HEAD
        "schedule": None,  # HEAD
        "name": "torch",
    },
    "TorchMemoryToolConfig": {
        "trace_alloc_max_entries": 100_000,
        "stack_depth": 32,
        "memory_snapshot_num_steps": 1,  # HEAD
        "name": "torch_memory",
    },
    "NPUToolConfig": {
        "discrete": False,
        "name": "npu",
        "contents": [],
        "level": "level0",
        "analysis": False,
        "profile_token_start": None,  # HEAD
        "profile_token_end": None,  # HEAD
    },
}

_HEAD_FIELDS = {
    ("RouterReplayConfig", "record_file"): NO_ROUTER_REPLAY,
    ("RouterReplayConfig", "replay_file"): NO_ROUTER_REPLAY,
    ("FSDPCriticModelCfg", "lora"): HEAD,
    ("BaseModelConfig", "lora"): HEAD,
    ("HFModelConfig", "mtp"): HEAD,
    ("AgentLoopConfig", "agent_loop_manager_class"): HEAD,
    ("CheckpointEngineConfig", "custom_backend_module"): HEAD,
    ("RewardConfig", "num_cpus_per_worker"): HEAD,
    ("RolloutCorrectionConfig", "debug_rollout_actor_probs"): HEAD,
    ("AlgoConfig", "filter_groups"): HEAD,
    ("AlgoConfig", "gdpo_reward_keys"): HEAD,
    ("AlgoConfig", "gdpo_reward_weights"): HEAD,
    ("CheckpointConfig", "strict"): HEAD,
    ("CheckpointConfig", "hf_export_dtype"): HEAD,
    ("CheckpointConfig", "save_lora_only"): HEAD,
    ("ProfilerConfig", "relocate_results"): HEAD,
    ("ProfilerConfig", "finish_hook_cmd"): HEAD,
    ("ProfilerConfig", "finish_hook_all_ranks"): HEAD,
    ("ProfilerConfig", "finish_hook_ranks"): HEAD,
    ("TorchProfilerToolConfig", "profile_token_start"): HEAD,
    ("TorchProfilerToolConfig", "profile_token_end"): HEAD,
    ("TorchProfilerToolConfig", "schedule"): HEAD,
    ("TorchMemoryToolConfig", "memory_snapshot_num_steps"): HEAD,
    ("NPUToolConfig", "profile_token_start"): HEAD,
    ("NPUToolConfig", "profile_token_end"): HEAD,
}

_ACTOR_FIELDS = {
    ("ActorConfig", "strategy"): REQUIRED + " (fsdp)",
    ("ActorConfig", "use_torch_compile"): NO_COMPILE,
    ("FSDPEngineConfig", "use_torch_compile"): NO_COMPILE,
    ("ActorConfig", "rollout_n"): REQUIRED + " (rollout.n, 1)",
    ("ActorConfig", "data_loader_seed"): YAML + " (42)",
    ("ActorConfig", "optim"): FSDP_OPTIM,
    ("ActorConfig", "ppo_infer_micro_batch_size_per_gpu"): "log-prob micro-batches are set by "
    "rollout.log_prob_micro_batch_size_per_gpu / ref.log_prob_micro_batch_size_per_gpu (v0.7.x keys)",
    ("ActorConfig", "ppo_infer_max_token_len_per_gpu"): "log-prob token budgets are set by "
    "rollout.log_prob_max_token_len_per_gpu / ref.log_prob_max_token_len_per_gpu (v0.7.x keys)",
    ("ActorConfig", "profiler"): "per-role profiler nodes are not part of the YAML here; build a "
    "verl.utils.profiler.DistProfiler in the worker",
    ("ActorConfig", "engine"): "the engine config is the role's fsdp_config / veomni node itself",
    ("ActorConfig", "model_config"): "the model config is actor_rollout_ref.model, handed to the workers directly",
    ("ActorConfig", "global_batch_info"): "runtime state, not a config key: the loss receives it as an argument "
    "(a config may still carry it as a runtime attribute)",
    ("FSDPActorConfig", "use_remove_padding"): YAML + " (model.use_remove_padding, true)",
    ("FSDPActorConfig", "use_rollout_log_probs"): "rollout log-probs as old log-probs are "
    "algorithm.rollout_correction.bypass_mode here (one key for the trainer and the actor)",
    ("VeOmniActorConfig", "use_remove_padding"): YAML + " (model.use_remove_padding, true)",
    ("VeOmniActorConfig", "use_rollout_log_probs"): "rollout log-probs as old log-probs are "
    "algorithm.rollout_correction.bypass_mode here (one key for the trainer and the actor)",
}

_CRITIC_FIELDS = {
    ("CriticConfig", "strategy"): REQUIRED + " (fsdp)",
    ("CriticConfig", "ppo_mini_batch_size"): YAML + " (the actor's, 256)",
    ("CriticConfig", "data_loader_seed"): YAML + " (42)",
    ("CriticConfig", "shuffle"): YAML + " (the actor's, false)",
    ("CriticConfig", "optim"): FSDP_OPTIM,
    ("CriticConfig", "ppo_infer_micro_batch_size_per_gpu"): "the critic's forward micro-batch is "
    "forward_micro_batch_size_per_gpu (v0.7.x key)",
    ("CriticConfig", "ppo_infer_max_token_len_per_gpu"): "the critic's forward token budget is "
    "forward_max_token_len_per_gpu (v0.7.x key)",
    ("CriticConfig", "engine"): "the engine config is critic.model.fsdp_config itself",
    ("CriticConfig", "model"): "the critic's model node is declared by FSDPCriticConfig (FSDPCriticModelCfg), the "
    "only critic family here",
    ("CriticConfig", "model_config"): "the critic model config is critic.model, handed to the workers directly",
    ("CriticConfig", "profiler"): "per-role profiler nodes are not part of the YAML here",
    ("FSDPCriticConfig", "forward_micro_batch_size"): YAML + " (follows ppo_micro_batch_size, null)",
    ("FSDPCriticConfig", "forward_micro_batch_size_per_gpu"): YAML + " (follows ppo_micro_batch_size_per_gpu, null)",
    ("FSDPCriticModelCfg", "tokenizer_path"): YAML + " (the v0.7.x YAML interpolates the actor's model path)",
    ("FSDPCriticModelCfg", "tiled_mlp"): "TiledMLP is inert here and declared only on actor_rollout_ref.model",
}

_ENGINE_FIELDS = {
    ("EngineConfig", "grad_offload"): "gradients are never offloaded separately (param_offload covers them)",
    ("EngineConfig", "dtype"): "declared on FSDPEngineConfig (fsdp_config.dtype) and VeOmniEngineConfig "
    "(model_dtype), the two engine families here",
    ("EngineConfig", "use_dynamic_bsz"): PER_CALL,
    ("EngineConfig", "max_token_len_per_gpu"): PER_CALL,
    ("EngineConfig", "micro_batch_size_per_gpu"): PER_CALL,
    ("EngineConfig", "infer_max_token_len_per_gpu"): PER_CALL,
    ("EngineConfig", "infer_micro_batch_size_per_gpu"): PER_CALL,
    ("EngineConfig", "use_fused_kernels"): PER_CALL,
    ("EngineConfig", "use_remove_padding"): PER_CALL,
    ("FSDPEngineConfig", "wrap_policy"): YAML + " ({min_num_params: 0})",
    ("FSDPEngineConfig", "strategy"): "null = follow the role's strategy, the one key that selects FSDP1/FSDP2 "
    "(field-report item 9); filled in when the role is built",
    ("FSDPEngineConfig", "qat"): NO_QUANT,
    ("VeOmniEngineConfig", "wrap_policy"): "VeOmni shards by its own module list (basic_modules), not by a wrap policy",
    ("VeOmniEngineConfig", "reshard_after_forward"): "VeOmni's FSDP2 always reshards after forward",
    ("VeOmniEngineConfig", "use_orig_params"): "an FSDP1 option; VeOmni is FSDP2",
    ("VeOmniEngineConfig", "forward_prefetch"): YAML + " (true)",
    ("VeOmniEngineConfig", "use_torch_compile"): YAML + " (false)",
    ("VeOmniEngineConfig", "full_determinism"): "not declared for VeOmni here (fsdp_config.full_determinism only)",
    ("VeOmniEngineConfig", "mixed_precision"): YAML + " (true)",
    ("VeOmniEngineConfig", "enable_full_shard"): YAML + " (true)",
    ("VeOmniEngineConfig", "load_checkpoint_path"): "checkpoints are resumed through trainer.resume_mode / "
    "resume_from_path",
}

_OPTIM_MODEL_FIELDS = {
    ("OptimizerConfig", "lr"): YAML + " (1e-6)",
    ("OptimizerConfig", "grad_clip"): "the role's grad_clip key is one setting with optim.clip_grad (declared "
    "on the role, as upstream's YAML does)",
    ("HFModelConfig", "path"): REQUIRED + " (~/models/deepseek-llm-7b-chat)",
    ("HFModelConfig", "local_path"): RUNTIME,
    ("HFModelConfig", "local_hf_config_path"): RUNTIME,
    ("HFModelConfig", "local_tokenizer_path"): RUNTIME,
    ("HFModelConfig", "load_tokenizer"): RUNTIME,
    ("HFModelConfig", "hf_config"): RUNTIME,
    ("HFModelConfig", "generation_config"): RUNTIME,
    ("HFModelConfig", "tokenizer"): RUNTIME,
    ("HFModelConfig", "processor"): RUNTIME,
    ("HFModelConfig", "architectures"): RUNTIME,
    ("HFModelConfig", "target_parameters"): LORA,
    ("HFModelConfig", "lora"): LORA + " (the Megatron-style lora block)",
    ("HFModelConfig", "fused_kernel_options"): "a typed node here (FusedKernelOptionsConfig, impl_backend=torch, "
    "upstream's YAML value) instead of a free dict",
    ("HFModelConfig", "tiled_mlp"): "a typed node here (TiledMLPConfig) with upstream's values",
}

_ROLLOUT_REWARD_FIELDS = {
    ("SamplingConfig", "temperature"): "this class is rollout.val_kwargs here, with upstream's YAML values "
    "(greedy: temperature 0)",
    ("SamplingConfig", "do_sample"): "this class is rollout.val_kwargs here, with upstream's YAML values "
    "(do_sample false)",
    ("RolloutConfig", "repetition_penalty"): HEAD,
    ("RolloutConfig", "enforce_eager"): YAML + " (false)",
    ("RolloutConfig", "moe_tensor_parallel_size"): "a TensorRT-LLM option; the TRT-LLM rollout is not supported",
    ("RolloutConfig", "engine_kwargs"): YAML + " ({vllm: {}, sglang: {}, trtllm: {}})",
    ("RolloutConfig", "trace"): NO_SERVER,
    ("RolloutConfig", "server"): NO_SERVER,
    ("RolloutConfig", "prometheus"): NO_SERVER,
    ("RolloutConfig", "custom"): HEAD,
    ("RolloutConfig", "checkpoint_manager_class"): HEAD,
    ("RolloutConfig", "skip"): NO_SERVER + " (v0.7.x rollout.skip_rollout is inert)",
    ("RolloutConfig", "profiler"): "per-role profiler nodes are not part of the YAML here",
    ("RolloutConfig", "layer_name_map"): "a Megatron weight-sync option; the Megatron backend is not supported",
    ("RolloutConfig", "sglang_engine_mode"): "the SGLang rollout is not supported",
    ("RolloutConfig", "limit_images"): HEAD,
    ("RolloutConfig", "use_preprocessed_multimodal_input"): HEAD,
    ("RolloutConfig", "skip_tokenizer_init"): YAML + " (true)",
    ("RolloutConfig", "enable_sleep_mode"): "the vLLM rollout always sleeps between generations (free_cache_engine)",
    ("RolloutConfig", "mtp"): HEAD,
    ("RolloutConfig", "qat"): NO_QUANT,
    ("RewardManagerConfig", "module"): "a typed node here (RewardManagerModuleConfig) for upstream's ModuleConfig",
    ("RewardManagerModuleConfig", "name"): YAML + " (custom_reward_manager)",
    ("RewardModelConfig", "rollout"): NO_RM_ROLLOUT,
    ("RolloutCorrectionConfig", "rollout_is"): YAML + " (null: no importance weights)",
    ("AlgoConfig", "rollout_correction"): "a typed node with the YAML's values (no weights, no rejection) instead "
    "of null; with rollout log-probs it still logs the rollout_corr/* diagnostics, as upstream's YAML default does",
    ("ProfilerConfig", "tool"): REQUIRED + " (null = no profiling)",
    ("ProfilerConfig", "save_path"): REQUIRED + " (null; the torch tool refuses to start without it)",
    ("ProfilerConfig", "tool_config"): REQUIRED + " (null = the tool's default options)",
}

DEVIATIONS: dict[tuple[str, str], str] = {
    **_HEAD_FIELDS,
    **_ACTOR_FIELDS,
    **_CRITIC_FIELDS,
    **_ENGINE_FIELDS,
    **_OPTIM_MODEL_FIELDS,
    **_ROLLOUT_REWARD_FIELDS,
}
"""(class, field) -> why the default here differs from upstream's class default, or why the field is absent."""

YAML_SPLIT_LEAVES: dict[str, object] = {
    "actor_rollout_ref.actor.optim.min_lr_ratio": 0.0,
    "critic.optim.min_lr_ratio": 0.0,
}
"""YAML leaf -> its YAML value, where the class default is upstream's "not configured" sentinel (None) while the
YAML writes the value it means, exactly as upstream has them (FSDPOptimizerConfig.min_lr_ratio)."""


YAML_OPTIONAL_NODES: dict[str, str] = {"algorithm.pf_ppo": "PFPPOConfig"}
"""Optional sub-configs that are None in the class (upstream's "not given") and written out in the YAML with their
class's defaults, as upstream's YAML does: key -> class name."""


def _with(config: object, dotted_key: str, value: object) -> object:
    """A copy of the frozen ``config`` with the (nested) field at ``dotted_key`` replaced."""
    import dataclasses

    head, _, rest = dotted_key.partition(".")
    if not rest:
        return dataclasses.replace(config, **{head: value})
    return dataclasses.replace(config, **{head: _with(getattr(config, head), rest, value)})


def with_yaml_side(config: object, prefix: str = "") -> object:
    """``config`` (the node at ``prefix`` of the ppo_trainer tree, the root by default) with every class/YAML
    split set to its YAML side: what building the same node from the composed YAML gives."""
    splits = {**YAML_SPLIT_LEAVES, **{k: resolve_class(cls)() for k, cls in YAML_OPTIONAL_NODES.items()}}
    start = f"{prefix}." if prefix else ""
    for key, value in splits.items():
        if key.startswith(start):
            config = _with(config, key[len(start) :], value)
    return config


ABSENT = "<absent>"
_MODULES = ("verl.workers.config", "verl.trainer.config", "verl.utils.profiler")


def resolve_class(name: str) -> type:
    """The config class of that name here (searched in the modules that hold config dataclasses)."""
    import importlib

    for module in _MODULES:
        cls = getattr(importlib.import_module(module), name, None)
        if cls is not None:
            return cls
    raise LookupError(f"no config class {name} in {_MODULES}")


def normalized(value: object) -> object:
    """Comparable form of a default: nested configs by class name, tuples as lists, empty "not configured"
    sentinels (None / empty dict) as NOT_GIVEN when upstream records NOT_GIVEN."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"<{type(value).__name__}>"
    if isinstance(value, tuple):
        return list(value)
    return value


def our_default(cls_name: str, field_name: str) -> object:
    """The declared default of ``cls_name.field_name`` here (normalized), or ABSENT."""
    from verl.base_config import field_default

    cls = resolve_class(cls_name)
    if field_name not in cls.__dataclass_fields__:
        return ABSENT
    value = normalized(field_default(cls, field_name))
    if UPSTREAM_DEFAULTS[cls_name][field_name] == NOT_GIVEN and value in (None, {}):
        return NOT_GIVEN
    return value


def drift() -> set[tuple[str, str]]:
    """Every (class, field) whose default here is not upstream's."""
    return {
        (cls, name)
        for cls, fields in UPSTREAM_DEFAULTS.items()
        for name, upstream in fields.items()
        if our_default(cls, name) != normalized(upstream)
    }


def render_markdown() -> str:
    """The table of ``DEVIATIONS`` for docs/upstream_compat.md."""
    rows = ["| class.field | upstream's class default | here | why |", "|---|---|---|---|"]
    for (cls, name), reason in sorted(DEVIATIONS.items()):
        here = our_default(cls, name)
        here_text = "absent" if here == ABSENT else f"`{here!r}`"
        why = reason.replace("|", "\\|")  # a bare | would start a new column
        rows.append(f"| `{cls}.{name}` | `{UPSTREAM_DEFAULTS[cls][name]!r}` | {here_text} | {why} |")
    return "\n".join(rows)

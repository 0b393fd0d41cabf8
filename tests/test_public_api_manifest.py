"""Compatibility manifest: every public name of upstream verl (v0.7.1 and HEAD) under the paths users import —
``verl``, ``verl.protocol``, ``verl.utils.*``, ``verl.workers.config``, ``verl.trainer.ppo.*``,
``verl.trainer.config``, ``verl.single_controller.*`` — that this distribution supports is importable from the
same module path (``MANIFEST``, the one list of supported names), and callables keep upstream's parameter names.
Every other upstream module or name is listed, with the reason, in ``verl.upstream_gaps`` (rendered into the
README); importing one raises ``UpstreamOnlyError`` carrying that reason. A missing or renamed name fails here
instead of in a user's script.

Also: `import verl` has no side effects beyond that import finder — it imports neither Ray, transformers nor vLLM.
"""

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl import upstream_gaps

MANIFEST = {
    "verl": ["DataProto"],
    "verl.utils": [
        "omega_conf_to_dataclass",
        "validate_config",
        "hf_tokenizer",
        "hf_processor",
        "set_pad_token_id",
        "as_torch_index",
        "group_mean_std",
    ],
    "verl.utils.groupwise": ["as_torch_index", "group_mean_std"],
    "verl.utils.tensordict_utils": [
        "assign_non_tensor_data",
        "assign_non_tensor_stack",
        "assign_non_tensor",
        "unwrap_non_tensor_data",
        "get_non_tensor_data",
        "nested_tensor_from_tensor_list",
        "concat_nested_tensors",
        "concat_tensordict_with_none_bsz",
        "concat_tensordict",
        "chunk_tensordict",
        "get_tensordict",
        "index_select_tensor_dict",
        "union_tensor_dict",
        "make_iterator",
        "assert_tensordict_eq",
        "get",
        "get_keys",
        "pop",
        "pop_keys",
        "pad_to_divisor",
        "unpad",
        "contiguous",
        "maybe_fix_3d_position_ids",
        "list_of_dict_to_tensordict",
    ],
    "verl.utils.profiler": [
        "GPUMemoryLogger",
        "log_gpu_memory_usage",
        "mark_start_range",
        "mark_end_range",
        "mark_annotate",
        "DistProfiler",
        "DistProfilerExtension",
        "ProfilerConfig",
        "simple_timer",
        "marked_timer",
        "reduce_timing",
        "gather_timing",
    ],
    "verl.utils.profiler.config": [
        "ProfilerConfig",
        "NsightToolConfig",
        "TorchProfilerToolConfig",
        "TorchMemoryToolConfig",
        "NPUToolConfig",
    ],
    "verl.utils.profiler.performance": ["GPUMemoryLogger", "log_gpu_memory_usage", "simple_timer", "marked_timer"],
    "verl.utils.profiler.profile": ["DistProfiler", "DistProfilerExtension"],
    "verl.utils.debug": ["calculate_rollout_probs_diff_metrics"],
    "verl.utils.import_utils": [
        "load_module",
        "load_extern_object",
        "load_extern_type",
        "load_class_from_fqn",
        "import_external_libs",
        "deprecated",
        "is_vllm_available",
        "is_sglang_available",
        "is_megatron_core_available",
        "is_nvtx_available",
        "is_trl_available",
        "is_msprobe_available",
    ],
    "verl.utils.ulysses": [
        "set_ulysses_sequence_parallel_group",
        "get_ulysses_sequence_parallel_group",
        "get_ulysses_sequence_parallel_world_size",
        "get_ulysses_sequence_parallel_rank",
        "gather_seq_scatter_heads",
        "gather_heads_scatter_seq",
        "all_to_all_tensor",
        "all_gather_tensor",
        "SeqAllToAll",
        "Gather",
        "slice_input_tensor",
        "ulysses_pad",
        "ulysses_pad_and_slice_inputs",
        "gather_outputs_and_unpad",
        "validate_ulysses_config",
        "FSDPUlyssesShardingManager",
    ],
    "verl.utils.fsdp_utils": [
        "get_fsdp_wrap_policy",
        "fsdp_version",
        "create_device_mesh",
        "offload_fsdp_model_to_cpu",
        "load_fsdp_model_to_gpu",
        "offload_fsdp_optimizer",
        "load_fsdp_optimizer",
        "fsdp2_clip_grad_norm_",
        "get_module_class_from_name",
        "MixedPrecisionPolicy",
        "CPUOffloadPolicy",
        "FSDPModule",
        "fully_shard",
    ],
    "verl.utils.seqlen_balancing": [
        "prepare_dynamic_batch",
        "restore_dynamic_batch",
        "get_seqlen_balanced_partitions",
        "karmarkar_karp",
        "greedy_partition",
        "rearrange_micro_batches",
        "get_reverse_idx",
        "log_seqlen_unbalance",
        "ceildiv",
        "roundup_divisible",
        "calculate_workload",
    ],
    "verl.utils.model": [
        "compute_position_id_with_mask",
        "update_model_config",
        "get_generation_config",
        "print_model_size",
        "get_model_size",
    ],
    "verl.utils.py_functional": [
        "union_two_dict",
        "append_to_dict",
        "temp_env_var",
        "convert_to_regular_types",
        "list_of_dict_to_dict_of_list",
        "DynamicEnum",
        "rename_dict",
        "flatten",
    ],
    "verl.utils.tokenizer": ["hf_tokenizer", "hf_processor", "set_pad_token_id"],
    "verl.utils.activation_offload": ["enable_activation_offloading"],
    "verl.utils.checkpoint.checkpoint_manager": [
        "BaseCheckpointManager",
        "find_latest_ckpt_path",
        "get_checkpoint_tracker_filename",
    ],
    "verl.utils.checkpoint.fsdp_checkpoint_manager": ["FSDPCheckpointManager"],
    "verl.protocol": [
        "DataProto",
        "DataProtoItem",
        "DataProtoConfig",
        "DataProtoFuture",
        "union_tensor_dict",
        "union_numpy_dict",
        "pad_dataproto_to_divisor",
        "unpad_dataproto",
        "fold_batch_dim",
        "unfold_batch_dim",
        "serialize_tensordict",
        "deserialize_tensordict",
        "collate_fn",
        "all_gather_data_proto",
    ],
    "verl.trainer.ppo.core_algos": [
        "POLICY_LOSS_REGISTRY",
        "register_policy_loss",
        "get_policy_loss_fn",
        "AdvantageEstimator",
        "ADV_ESTIMATOR_REGISTRY",
        "register_adv_est",
        "get_adv_estimator_fn",
        "compute_gae_advantage_return",
        "compute_grpo_outcome_advantage",
        "compute_grpo_vectorized_outcome_advantage",
        "compute_gdpo_outcome_advantage",
        "compute_grpo_passk_outcome_advantage",
        "compute_reinforce_plus_plus_baseline_outcome_advantage",
        "compute_rloo_outcome_advantage",
        "compute_opo_outcome_advantage",
        "compute_reinforce_plus_plus_outcome_advantage",
        "compute_remax_outcome_advantage",
        "compute_gpg_outcome_advantage",
        "compute_rloo_vectorized_outcome_advantage",
        "compute_optimal_token_baseline_advantage",
        "compute_multi_turn_optimal_token_baseline_advantage",
        "compute_policy_loss",
        "compute_policy_loss_reinforce",
        "agg_loss",
        "compute_value_loss",
        "compute_entropy_loss",
        "kl_penalty",
        "kl_penalty_forward",
        "compute_rewards",
        "compute_pf_ppo_reweight_data",
        "AdaptiveKLController",
        "FixedKLController",
        "get_kl_controller",
    ],
    "verl.trainer.ppo.ray_trainer": [
        "RayPPOTrainer",
        "ResourcePoolManager",
        "Role",
        "apply_kl_penalty",
        "compute_response_mask",
        "compute_advantage",
        "marked_timer",
    ],
    "verl.trainer.ppo.utils": ["Role", "need_reference_policy", "need_critic", "need_reward_model"],
    "verl.trainer.ppo.rollout_corr_helper": [
        "compute_rollout_correction_and_rejection_mask",
        "compute_rollout_correction_weights",
        "compute_rollout_rejection_mask",
        "compute_offpolicy_metrics",
        "compute_rollout_correction_and_add_to_batch",
        "apply_bypass_mode",
        "SAFETY_BOUND",
    ],
    "verl.trainer.ppo.metric_utils": [
        "compute_data_metrics",
        "compute_timing_metrics",
        "compute_throughout_metrics",
        "process_validation_metrics",
        "bootstrap_metric",
        "calc_maj_val",
        "reduce_metrics",
    ],
    "verl.trainer.ppo.reward": [
        "load_reward_manager",
        "compute_reward",
        "compute_reward_async",
        "get_custom_reward_fn",
    ],
    "verl.trainer.main_ppo": ["main", "run_ppo", "TaskRunner", "create_rl_dataset", "create_rl_sampler"],
    "verl.utils.torch_functional": [
        "gather_from_labels",
        "logprobs_from_logits",
        "logprobs_from_logits_flash_attn",
        "logprobs_from_logits_torch_npu",
        "logprobs_from_logits_naive",
        "logprobs_from_logits_v2",
        "clip_by_value",
        "entropy_from_logits",
        "entropy_from_logits_with_chunking",
        "masked_sum",
        "masked_mean",
        "masked_var",
        "masked_whiten",
        "get_response_mask",
        "compute_grad_norm",
        "broadcast_dict_tensor",
        "allgather_dict_tensors",
        "allgather_dict_into_dict",
        "split_dict_tensor_into_batches",
        "pad_2d_list_to_length",
        "pad_sequence_to_length",
        "postprocess_data",
        "tokenize_and_postprocess_data",
        "remove_pad_token",
        "log_probs_from_logits_response",
        "log_probs_from_logits_response_rmpad",
        "log_probs_from_logits_all_rmpad",
        "post_process_logits",
        "calculate_sum_pi_squared_from_logits",
        "get_cosine_schedule_with_warmup",
        "get_constant_schedule_with_warmup",
        "get_wsd_schedule_with_warmup",
        "prepare_decoder_attention_mask",
        "get_unpad_data",
        "check_device_is_available",
        "distributed_mean_max_min_std",
        "distributed_masked_mean",
        "expand_as_nested",
        "use_original_torch_compile",
    ],
    "verl.utils.experimental.torch_functional": ["FusedLinearForPPO", "FusedLinearForPPOFunction"],
    "verl.utils.reward_score": ["default_compute_score", "_default_compute_score"],
    "verl.workers.reward_manager": ["register", "get_reward_manager_cls", "NaiveRewardManager"],
    "verl.single_controller": ["Worker", "WorkerGroup", "ClassWithInitArgs", "ResourcePool"],
    "verl.single_controller.base": ["Worker", "WorkerGroup", "ClassWithInitArgs", "ResourcePool"],
    "verl.single_controller.base.decorator": [
        "Dispatch",
        "Execute",
        "register",
        "register_dispatch_mode",
        "update_dispatch_mode",
        "make_nd_compute_dataproto_dispatch_fn",
        "MAGIC_ATTR",
        "DISPATCH_MODE_FN_REGISTRY",
        "get_predefined_dispatch_fn",
        "get_predefined_execute_fn",
    ],
    "verl.single_controller.base.worker": ["Worker"],
    "verl.single_controller.ray": [
        "RayClassWithInitArgs",
        "RayResourcePool",
        "SubRayResourcePool",
        "RayWorkerGroup",
        "ResourcePoolManager",
        "create_colocated_worker_cls",
        "merge_resource_pool",
        "split_resource_pool",
        "MANAGED_WORKER_ENV",
    ],
    "verl.single_controller.ray.base": [
        "RayClassWithInitArgs",
        "RayResourcePool",
        "SubRayResourcePool",
        "RayWorkerGroup",
        "ResourcePoolManager",
        "create_colocated_worker_cls",
        "merge_resource_pool",
        "split_resource_pool",
        "sort_placement_group_by_node_ip",
        "get_random_string",
    ],
    "verl.utils.device": [
        "is_cuda_available",
        "is_npu_available",
        "is_torch_npu_available",
        "get_resource_name",
        "get_visible_devices_keyword",
        "get_device_name",
        "get_torch_device",
        "get_device_id",
        "get_nccl_backend",
        "set_expandable_segments",
        "auto_set_device",
        "get_device_capability",
        "get_npu_versions",
        "get_vendor",
        "is_device_available",
        "manual_seed",
        "manual_seed_all",
        "check_ipc_version_support",
        "is_support_ipc",
    ],
    "verl.utils.dataset.rl_dataset": ["RLHFDataset", "collate_fn"],
    "verl.utils.tracking": ["Tracking"],
    "verl.utils.config": ["omega_conf_to_dataclass", "validate_config"],
    "verl.base_config": ["BaseConfig"],
    "verl.workers.config": [
        "PolicyLossConfig",
        "RouterReplayConfig",
        "EngineRouterReplayConfig",
        "ActorConfig",
        "FSDPActorConfig",
        "McoreActorConfig",
        "VeOmniActorConfig",
        "CriticConfig",
        "FSDPCriticConfig",
        "McoreCriticConfig",
        "FSDPCriticModelCfg",
        "EngineConfig",
        "FSDPEngineConfig",
        "McoreEngineConfig",
        "MindSpeedEngineConfig",
        "VeOmniEngineConfig",
        "TrainingWorkerConfig",
        "OptimizerConfig",
        "FSDPOptimizerConfig",
        "McoreOptimizerConfig",
        "build_optimizer",
        "HFModelConfig",
        "RolloutConfig",
        "SamplingConfig",
        "MultiTurnConfig",
        "CustomAsyncServerConfig",
        "AgentLoopConfig",
        "CheckpointEngineConfig",
        "RewardConfig",
        "RewardManagerConfig",
        "RewardModelConfig",
        "SandboxFusionConfig",
        "CheckpointConfig",
    ],
    "verl.workers.config.reward_model": ["RewardModelConfig"],
    "verl.trainer.config": [
        "AlgoConfig",
        "KLControlConfig",
        "RolloutCorrectionConfig",
        "CheckpointConfig",
        "BaseModelConfig",
    ],
    "verl.workers.fsdp_workers": ["ActorRolloutRefWorker", "CriticWorker"],
    "verl.workers.actor": ["BasePPOActor", "DataParallelPPOActor"],
    "verl.workers.critic": ["BasePPOCritic", "DataParallelPPOCritic"],
    "verl.workers.rollout": ["BaseRollout"],
}

# Upstream parameter names of the functions users call with keywords (upstream's core_algos, torch_functional and
# reward_score modules).
SIGNATURES = {
    ("verl.trainer.ppo.core_algos", "compute_grpo_outcome_advantage"): [
        "token_level_rewards",
        "response_mask",
        "index",
        "epsilon",
        "norm_adv_by_std_in_grpo",
        "config",
    ],
    ("verl.trainer.ppo.core_algos", "compute_gae_advantage_return"): [
        "token_level_rewards",
        "values",
        "response_mask",
        "gamma",
        "lam",
    ],
    ("verl.trainer.ppo.core_algos", "agg_loss"): ["loss_mat", "loss_mask", "loss_agg_mode"],
    ("verl.trainer.ppo.rollout_corr_helper", "compute_rollout_correction_and_rejection_mask"): [
        "old_log_prob",
        "rollout_log_prob",
        "response_mask",
        "rollout_is",
        "rollout_is_threshold",
        "rollout_is_batch_normalize",
        "rollout_rs",
        "rollout_rs_threshold",
    ],
    ("verl.trainer.ppo.rollout_corr_helper", "compute_rollout_correction_weights"): [
        "log_ratio",
        "response_mask",
        "rollout_is",
        "rollout_is_threshold",
        "rollout_is_batch_normalize",
    ],
    ("verl.trainer.ppo.rollout_corr_helper", "compute_rollout_rejection_mask"): [
        "log_ratio",
        "response_mask",
        "rollout_rs",
        "rollout_rs_threshold",
    ],
    ("verl.trainer.ppo.rollout_corr_helper", "compute_offpolicy_metrics"): [
        "old_log_prob",
        "rollout_log_prob",
        "response_mask",
    ],
    ("verl.trainer.ppo.core_algos", "kl_penalty"): ["logprob", "ref_logprob", "kl_penalty"],
    ("verl.trainer.ppo.core_algos", "compute_value_loss"): [
        "vpreds",
        "returns",
        "values",
        "response_mask",
        "cliprange_value",
        "loss_agg_mode",
    ],
    ("verl.utils.torch_functional", "logprobs_from_logits"): ["logits", "labels"],
    ("verl.utils.torch_functional", "entropy_from_logits_with_chunking"): ["logits", "chunk_size"],
    ("verl.utils.torch_functional", "masked_mean"): ["values", "mask", "axis"],
    ("verl.utils.torch_functional", "get_response_mask"): ["response_id", "eos_token", "dtype"],
    ("verl.utils.reward_score", "default_compute_score"): [
        "data_source",
        "solution_str",
        "ground_truth",
        "extra_info",
    ],
}


@pytest.mark.parametrize("module_name", sorted(MANIFEST))
def test_public_names_importable(module_name):
    """Every listed name exists at its upstream import path."""
    module = importlib.import_module(module_name)
    missing = [name for name in MANIFEST[module_name] if not hasattr(module, name)]
    assert not missing, f"{module_name} lacks upstream names {missing}"


@pytest.mark.parametrize("module_name, name", sorted(SIGNATURES))
def test_upstream_parameter_names(module_name, name):
    """Keyword names are part of the API: the listed parameters come first, in upstream's order."""
    fn = getattr(importlib.import_module(module_name), name)
    params = list(inspect.signature(fn).parameters)
    expected = SIGNATURES[(module_name, name)]
    assert params[: len(expected)] == expected


def test_import_verl_has_no_side_effects():
    """`import verl` (and touching verl.DataProto) loads neither Ray, transformers nor vLLM, and sets no env var."""
    code = (
        "import os, sys; before = dict(os.environ); import verl; verl.DataProto; "
        "heavy = [m for m in ('ray', 'transformers', 'vllm', 'torch_npu') if m in sys.modules]; "
        "assert not heavy, heavy; assert dict(os.environ) == before, 'environment changed'; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


# ------------------------------------------------------------------------------------- upstream names not provided

README = Path(__file__).resolve().parents[1] / "README.md"
GAP_MARKERS = ("<!-- upstream-gaps:start -->", "<!-- upstream-gaps:end -->")


@pytest.mark.parametrize("module_name", sorted(upstream_gaps.MISSING_MODULES))
def test_missing_upstream_module_raises_with_its_reason(module_name):
    """Importing a listed upstream module fails with UpstreamOnlyError (an ImportError) carrying the table's reason.
    The finder answers only after every normal finder failed, so this also proves the module does not exist here
    (a module that lands must leave the table)."""
    reason = upstream_gaps.MISSING_MODULES[module_name]
    with pytest.raises(upstream_gaps.UpstreamOnlyError, match=re.escape(reason)):
        importlib.import_module(module_name)


def test_submodules_of_a_missing_package_raise_too():
    with pytest.raises(upstream_gaps.UpstreamOnlyError, match="Megatron backend"):
        importlib.import_module("verl.utils.megatron.tensor_parallel")
    with pytest.raises(upstream_gaps.UpstreamOnlyError, match="v1 trainer"):
        from verl.trainer.ppo.v1 import trainer_base  # noqa: F401


@pytest.mark.parametrize(
    "module_name, name", sorted((m, n) for m, names in upstream_gaps.MISSING_NAMES.items() for n in names)
)
def test_missing_upstream_name_raises_with_its_reason(module_name, name):
    """``from <module> import <name>`` of a listed name raises UpstreamOnlyError with the reason (not Python's bare
    "cannot import name"); the module itself exists."""
    reason = upstream_gaps.MISSING_NAMES[module_name][name]
    with pytest.raises(upstream_gaps.UpstreamOnlyError, match=re.escape(reason)):
        exec(f"from {module_name} import {name}", {})
    assert name not in MANIFEST.get(module_name, [])


def test_unknown_names_still_raise_attribute_error():
    """Names in no table keep the normal behaviour (hasattr False, AttributeError)."""
    import verl.utils.fsdp_utils as fsdp_utils

    assert not hasattr(fsdp_utils, "no_such_helper")
    with pytest.raises(ImportError, match="no_such_module"):
        importlib.import_module("verl.utils.no_such_module")


def test_readme_table_is_the_reviewed_list():
    """The README's "missing on purpose" table is rendered from verl.upstream_gaps (one reviewed list)."""
    text = README.read_text()
    start, end = (text.index(marker) for marker in GAP_MARKERS)
    assert text[start + len(GAP_MARKERS[0]) : end].strip() == upstream_gaps.render_markdown()


# ------------------------------------------------------------------------------------- config dataclass defaults

COMPAT_DOC = Path(__file__).resolve().parents[1] / "docs" / "upstream_compat.md"
DEFAULTS_MARKERS = ("<!-- config-defaults:start -->", "<!-- config-defaults:end -->")


def test_config_defaults_match_upstream_or_are_recorded(upstream_defaults):
    """Every default of every upstream config dataclass that exists here (UPSTREAM_DEFAULTS, recorded from
    upstream's source) equals upstream's, or its (class, field) is in DEVIATIONS with the reason; no recorded
    deviation is stale. Among them: FSDPOptimizerConfig().min_lr_ratio is None and AlgoConfig().pf_ppo is not
    given, as upstream's classes declare."""
    upstream = upstream_defaults
    assert sorted(upstream.drift() - set(upstream.DEVIATIONS)) == []  # unrecorded drift
    assert sorted(set(upstream.DEVIATIONS) - upstream.drift()) == []  # stale rows
    from verl.trainer.config import AlgoConfig
    from verl.workers.config import FSDPOptimizerConfig

    assert FSDPOptimizerConfig().min_lr_ratio is None and AlgoConfig().pf_ppo is None


def test_defaults_table_in_the_docs_is_the_recorded_one(upstream_defaults):
    upstream = upstream_defaults
    text = COMPAT_DOC.read_text()
    start, end = (text.index(marker) for marker in DEFAULTS_MARKERS)
    assert text[start + len(DEFAULTS_MARKERS[0]) : end].strip() == upstream.render_markdown()

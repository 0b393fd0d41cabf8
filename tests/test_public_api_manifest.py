"""Compatibility manifest: every public name of upstream verl that users and recipes touch
(verl_upstream_reference.md §2, §4) is importable from the same module path, and callables keep upstream's
parameter names. A missing or renamed name fails here instead of in a user's script.

Also: `import verl` has no side effects — it imports neither Ray, transformers nor vLLM, patches nothing.
"""

import importlib
import inspect
import subprocess
import sys

import pytest

MANIFEST = {
    "verl": ["DataProto"],
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
        "apply_kl_penalty",
        "compute_response_mask",
        "compute_advantage",
    ],
    "verl.trainer.ppo.utils": ["Role", "need_reference_policy", "need_critic"],
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
    "verl.single_controller.base": ["Worker", "WorkerGroup", "ClassWithInitArgs", "ResourcePool"],
    "verl.single_controller.base.decorator": [
        "Dispatch",
        "Execute",
        "register",
        "register_dispatch_mode",
        "update_dispatch_mode",
        "make_nd_compute_dataproto_dispatch_fn",
    ],
    "verl.single_controller.ray": [
        "RayClassWithInitArgs",
        "RayResourcePool",
        "SubRayResourcePool",
        "RayWorkerGroup",
        "ResourcePoolManager",
        "create_colocated_worker_cls",
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
    ],
    "verl.utils.dataset.rl_dataset": ["RLHFDataset", "collate_fn"],
    "verl.utils.tracking": ["Tracking"],
    "verl.utils.config": ["omega_conf_to_dataclass", "validate_config"],
    "verl.base_config": ["BaseConfig"],
    "verl.workers.config": [
        "ActorConfig",
        "FSDPActorConfig",
        "CriticConfig",
        "FSDPCriticConfig",
        "RolloutConfig",
        "HFModelConfig",
        "FSDPEngineConfig",
        "PolicyLossConfig",
    ],
    "verl.trainer.config": ["AlgoConfig", "KLControlConfig"],
    "verl.workers.fsdp_workers": ["ActorRolloutRefWorker", "CriticWorker"],
    "verl.workers.actor": ["BasePPOActor", "DataParallelPPOActor"],
    "verl.workers.critic": ["BasePPOCritic", "DataParallelPPOCritic"],
    "verl.workers.rollout": ["BaseRollout"],
}

# Upstream parameter names of the functions users call with keywords (§4.2, §4.3, §4.4).
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

"""The reviewed list of upstream verl's public modules and names that this distribution does not provide.

Upstream v0.7.1's and HEAD's public modules under ``verl.utils``, ``verl.workers.config``, ``verl.trainer.ppo``
and ``verl.single_controller`` were walked name by name; everything a user can import from them either exists
here under the same path (``tests/test_public_api_manifest.py`` imports each one) or is listed below with the
reason it is missing. Importing a listed module or name does not fail with a bare ``ModuleNotFoundError`` /
"cannot import name": it raises ``UpstreamOnlyError`` (an ``ImportError``) carrying the reason and what to use.

* ``MISSING_MODULES``: upstream module path -> reason (its submodules too). ``install_import_hook()`` (called by
  ``import verl``) appends a finder to ``sys.meta_path`` that answers only for these paths, and only after every
  normal finder has failed, so it can never shadow an existing module.
* ``MISSING_NAMES``: module -> {name: reason} for names missing from modules that exist; each such module ends
  with ``__getattr__ = missing_name_getattr(__name__)`` (PEP 562, consulted only for absent attributes).

The README's "Upstream API coverage" table is rendered from these tables (``render_markdown``) and a test keeps
the two equal; when something listed lands, delete its row and add it to the manifest.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "MISSING_MODULES",
    "MISSING_NAMES",
    "UpstreamOnlyError",
    "install_import_hook",
    "missing_name_getattr",
    "render_markdown",
]

_FSDP = "train with actor_rollout_ref.actor.strategy=fsdp or fsdp2, or model_engine=veomni"
MEGATRON = f"the Megatron backend (megatron-core / MindSpeed) is not part of verl-ascend; {_FSDP}"
V1_TRAINER = (
    "upstream HEAD's TransferQueue-based v1 trainer (trainer.use_v1) is not part of verl-ascend, which runs the "
    "v0.7.x RayPPOTrainer (verl.trainer.ppo.ray_trainer) on DataProto"
)
HEAD_ONLY = "added by upstream after v0.7.x (v0.8+ layout); verl-ascend follows the v0.7.x layout"
SFT_RM = "SFT and reward-model training are not part of verl-ascend (RL trainer only)"
NO_MULTI_TURN = "multi-turn / tool-calling rollouts (agent loops) are not implemented"
NO_QUANT = "quantization-aware training and FP8 / ModelOpt rollouts are not implemented"
FLASH_UNPAD = (
    "flash-attn style unpad helpers are not used: the one packed format is built by verl.utils.packing "
    "(pack_inputs / unpack) and verl.utils.torch_padding"
)
FSDP_ADAPTER = (
    "FSDP1/FSDP2 differences go through one adapter here: verl.utils.fsdp_utils.get_fsdp_adapter(strategy) / "
    "adapter_for(model) (wrap, load_full_state_dict, full_state_dict, offload_params, load_params)"
)

MISSING_MODULES: dict[str, str] = {
    # verl.utils
    "verl.utils.megatron_utils": MEGATRON,
    "verl.utils.megatron": MEGATRON,
    "verl.utils.megatron_peft_utils": MEGATRON,
    "verl.utils.checkpoint.megatron_checkpoint_manager": MEGATRON,
    "verl.utils.dynamic_cp_scheduler": MEGATRON,
    "verl.utils.transferqueue_utils": V1_TRAINER,
    "verl.utils.attention_utils": FLASH_UNPAD,
    "verl.utils.npu_flash_attn_utils": FLASH_UNPAD,
    "verl.utils.kernel": "the fused linear-cross-entropy kernels are replaced by the chunked / fused LM-head "
    "log-prob of verl.utils.logprob (and verl.utils.experimental.torch_functional.FusedLinearForPPO)",
    "verl.utils.flops_counter": "MFU is not computed (no perf/mfu/* metrics); throughput metrics are reported",
    "verl.utils.rollout_trace": "rollout tracing (weave / mlflow) is not implemented",
    "verl.utils.rollout_skip": "rollout dump/replay (rollout.skip_rollout) is not implemented; the key is inert",
    "verl.utils.chat_template": NO_MULTI_TURN,
    "verl.utils.continuous_token": NO_MULTI_TURN,
    "verl.utils.dataset.sft_dataset": SFT_RM,
    "verl.utils.dataset.multiturn_sft_dataset": SFT_RM,
    "verl.utils.dataset.rm_dataset": SFT_RM,
    "verl.utils.modelopt": NO_QUANT,
    "verl.utils.fp8_utils": NO_QUANT,
    "verl.utils.hdfs_io": "HDFS is not supported; copy data and checkpoints to a local or mounted path",
    "verl.utils.fs": "remote file systems are not supported; paths are read where they are (~ is expanded)",
    "verl.utils.memory_utils": "allocator snapshot helpers are not implemented; use verl.utils.profiler "
    "(tool=torch with contents=[memory]) and log_gpu_memory_usage",
    "verl.utils.logger": "use the standard logging module; verl.utils.tracking.Tracking for metrics",
    "verl.utils.net_utils": "network helpers are internal here (verl.single_controller.base.worker: get_node_ip, "
    "get_free_port)",
    "verl.utils.ray_utils": "use ray.put / ray.get directly (parallel_put is not provided)",
    "verl.utils.distributed": "workers initialise their process group from the worker group's environment "
    "(torch.distributed.init_process_group with verl.utils.device.get_nccl_backend())",
    "verl.utils.torch_dtypes": "dtype names are parsed by verl.utils.fsdp_utils.to_torch_dtype",
    "verl.utils.metric": "reduce_metrics lives in verl.trainer.ppo.metric_utils",
    "verl.utils.sglang": "the SGLang rollout is not supported (rollout.name=vllm or hf)",
    # verl.workers.config
    "verl.workers.config.distillation": HEAD_ONLY,
    "verl.workers.config.teacher": HEAD_ONLY,
    "verl.workers.config.checkpoint": HEAD_ONLY,
    "verl.workers.config.megatron_peft": MEGATRON,
    "verl.workers.config.disaggregation": HEAD_ONLY,
    # verl.trainer.ppo
    "verl.trainer.ppo.v1": V1_TRAINER,
    "verl.trainer.ppo.prefix_grouper_utils": "PrefixGrouper (actor.use_prefix_grouper) is not implemented; the "
    "key is inert (same maths)",
}
"""Upstream module -> why it is missing here (covers its submodules)."""

MISSING_NAMES: dict[str, dict[str, str]] = {
    "verl.protocol": {"BatchData": HEAD_ONLY},
    "verl.utils.ulysses": {
        "BaseShardingManager": "the Ulysses group is installed by the workers' shared core "
        "(verl.workers.core), not by a sharding-manager context",
    },
    "verl.utils.fsdp_utils": {
        "apply_fsdp2": FSDP_ADAPTER,
        "fsdp2_load_full_state_dict": FSDP_ADAPTER,
        "get_fsdp_full_state_dict": FSDP_ADAPTER,
        "get_init_weight_context_manager": "models are built on the CPU and sharded by the adapter's wrap",
        "init_fn": "models are built on the CPU and sharded by the adapter's wrap",
        "get_fsdp_state_ctx": FSDP_ADAPTER,
        "get_shard_placement_fn": FSDP_ADAPTER,
        "offload_fsdp2_model_to_cpu": "use offload_fsdp_model_to_cpu, which handles FSDP1 and FSDP2",
        "load_fsdp2_model_to_gpu": "use load_fsdp_model_to_gpu, which handles FSDP1 and FSDP2",
        "layered_summon_lora_params": "LoRA is not implemented",
        "collect_lora_params": "LoRA is not implemented",
    },
    "verl.utils.model": {
        "create_huggingface_actor": "models are built by the workers' shared core (verl.workers.core)",
        "create_huggingface_critic": "models are built by the workers' shared core (verl.workers.core)",
        "load_valuehead_model": "the critic's value head is attached by verl.utils.model.attach_value_head",
        "check_exclude_modules": "LoRA is not implemented",
        "check_target_modules": "LoRA is not implemented",
        "normalize_model_name": MEGATRON,
        "convert_weight_keys": "weights are exported by verl.utils.checkpoint.hf_export",
        "extract_multi_modal_inputs": NO_MULTI_TURN,
    },
    "verl.utils.checkpoint.checkpoint_manager": {
        "should_save_ckpt_esi": "the ESI-expiry save is decided by the trainer's checkpoint step "
        "(trainer.esi_redundant_time)",
    },
    "verl.utils.dataset.rl_dataset": {
        "get_dataset_class": "the dataset class is chosen by verl.trainer.main_ppo.create_rl_dataset "
        "(data.custom_cls.path / name, else RLHFDataset)",
    },
    "verl.utils.tokenizer": {"normalize_token_ids": HEAD_ONLY, "get_processor_token_id": HEAD_ONLY},
    "verl.utils.py_functional": {
        "timeout_limit": "reward scoring has its own per-call timeout (the reward manager's compute_score_timeout)"
    },
    "verl.single_controller.base.decorator": {
        "collect_dp_compute_data_proto": "dispatch functions live in verl.single_controller.base.dispatch",
        "dispatch_dp_compute_data_proto": "dispatch functions live in verl.single_controller.base.dispatch",
    },
    "verl.single_controller.base.worker": {
        "DistRankInfo": "rank information is read from the Worker properties (rank, world_size)",
        "DistGlobalInfo": "rank information is read from the Worker properties (rank, world_size)",
    },
    "verl.single_controller.ray": {
        "create_colocated_worker_cls_fused": "use create_colocated_worker_cls (roles share one actor process)",
    },
    "verl.single_controller.ray.base": {
        "create_colocated_worker_cls_fused": "use create_colocated_worker_cls (roles share one actor process)",
        "func_generator": "group methods are bound by RayWorkerGroup itself",
    },
    "verl.trainer.config": {
        "FilterGroupsConfig": HEAD_ONLY + " (algorithm.filter_groups, DAPO dynamic sampling)",
        "ProfileConfig": "superseded upstream by verl.utils.profiler.ProfilerConfig, which is provided",
    },
    "verl.workers.config": {
        "TorchtitanEngineConfig": "the TorchTitan engine is not part of verl-ascend; " + _FSDP,
        "TorchtitanOptimizerConfig": "the TorchTitan engine is not part of verl-ascend; " + _FSDP,
        "AutomodelEngineConfig": "the NeMo Automodel engine is not part of verl-ascend; " + _FSDP,
        "AutomodelOptimizerConfig": "the NeMo Automodel engine is not part of verl-ascend; " + _FSDP,
        "VeOmniOptimizerConfig": "the VeOmni family here takes FSDP's optimizer keys (optim/fsdp.yaml, "
        "FSDPOptimizerConfig)",
        "QATEngineConfig": NO_QUANT,
        "TraceConfig": "rollout tracing is not implemented",
        "ServerConfig": "the SGLang server rollout is not supported",
        "PrometheusConfig": HEAD_ONLY + " (rollout server metrics)",
        "SkipConfig": HEAD_ONLY + " (rollout dump/replay)",
        "MtpConfig": HEAD_ONLY + " (multi-token prediction)",
        "DistillationConfig": HEAD_ONLY,
        "FSDPDistillationConfig": HEAD_ONLY,
        "DiffusersModelConfig": HEAD_ONLY + " (diffusion models)",
        "DiffusionRolloutConfig": HEAD_ONLY + " (diffusion models)",
        "DiffusionSamplingConfig": HEAD_ONLY + " (diffusion models)",
    },
}
"""Module that exists here -> {upstream name missing from it: reason}."""


class UpstreamOnlyError(ImportError):
    """An upstream verl module or name this distribution does not provide (the message says why and what to
    use). An ``ImportError``, so ``try: import ... except ImportError`` fallbacks keep working."""


def _module_reason(fullname: str) -> str | None:
    for module, reason in MISSING_MODULES.items():
        if fullname == module or fullname.startswith(module + "."):
            return reason
    return None


class _UpstreamGapFinder(importlib.abc.MetaPathFinder):
    """Last entry of ``sys.meta_path``: reached only when no finder found ``fullname``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        reason = _module_reason(fullname)
        if reason is not None:
            raise UpstreamOnlyError(
                f"{fullname} is an upstream verl module that verl-ascend does not provide: {reason}.", name=fullname
            )
        return None


def install_import_hook() -> None:
    """Append the finder of ``MISSING_MODULES`` to ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _UpstreamGapFinder) for f in sys.meta_path):
        sys.meta_path.append(_UpstreamGapFinder())


def missing_name_getattr(module_name: str) -> Callable[[str], Any]:
    """A PEP 562 ``__getattr__`` for ``module_name``: UpstreamOnlyError for its ``MISSING_NAMES``, else the usual
    AttributeError."""
    missing = MISSING_NAMES.get(module_name, {})

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's required name
        if name in missing:
            raise UpstreamOnlyError(
                f"{module_name}.{name} is an upstream verl name that verl-ascend does not provide: {missing[name]}.",
                name=module_name,
            )
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__


def render_markdown() -> str:
    """The README table: one row per missing module or name, with its reason."""
    rows = ["| upstream module or name | why it is missing here |", "|---|---|"]
    rows += [f"| `{module}` (module) | {_cell(reason)} |" for module, reason in sorted(MISSING_MODULES.items())]
    for module, names in sorted(MISSING_NAMES.items()):
        rows += [f"| `{module}.{name}` | {_cell(reason)} |" for name, reason in sorted(names.items())]
    return "\n".join(rows)


def _cell(text: str) -> str:
    """``text`` as a Markdown table cell: a bare ``|`` would start a new column."""
    return text.replace("|", "\\|")

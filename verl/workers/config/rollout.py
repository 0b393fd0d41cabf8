"""Rollout (generation) settings: `actor_rollout_ref.rollout` (`rollout/rollout.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive
from verl.workers.config.batch import check_micro_batch_settings

__all__ = [
    "AgentLoopConfig",
    "CheckpointEngineConfig",
    "CustomAsyncServerConfig",
    "MultiTurnConfig",
    "RolloutConfig",
    "SamplingConfig",
]


@dataclass
class SamplingConfig(BaseConfig):
    """Sampling parameters (`rollout.val_kwargs`: validation defaults to greedy)."""

    top_k: int = -1
    """Top-k sampling; -1 = off."""

    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 = off."""

    temperature: float = 0.0
    """Sampling temperature; 0 = greedy (only with do_sample=False)."""

    n: int = 1
    """Responses per validation prompt."""

    do_sample: bool = False
    """Sample (true) or decode greedily (false)."""

    def __post_init__(self) -> None:
        require_positive("n", self.n)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top_p", f"must be in (0, 1], got {self.top_p}.")
        if self.do_sample and self.temperature <= 0:
            raise ConfigError(
                "temperature", f"({self.temperature}) must be > 0 when do_sample=True; set do_sample=False for greedy."
            )


@dataclass
class MultiTurnConfig(BaseConfig):
    """`rollout.multi_turn`: tool-calling / multi-turn agent rollouts."""

    enable: bool = False
    """Turn multi-turn rollouts on."""

    max_assistant_turns: Optional[int] = None
    """Maximum assistant turns per trajectory; null = unlimited (bounded by response_length)."""

    tool_config_path: Optional[str] = None
    """YAML file that declares the tools."""

    max_user_turns: Optional[int] = None
    """Maximum user turns per trajectory."""

    max_parallel_calls: int = 1
    """Tool calls executed in parallel per turn."""

    max_tool_response_length: int = 256
    """Characters kept from each tool response."""

    tool_response_truncate_side: str = "middle"
    """left | middle | right."""

    interaction_config_path: Optional[str] = None
    """YAML file that declares the interaction (simulated user)."""

    use_inference_chat_template: bool = False
    """Render the conversation with the inference chat template instead of the training one."""

    tokenization_sanity_check_mode: str = "strict"
    """strict | ignore_strippable | disable: how incremental and full tokenisation are compared."""

    format: str = "hermes"
    """Tool-call format of the chat template."""

    num_repeat_rollouts: Optional[int] = None
    """Repeat each multi-turn rollout this many times."""

    def __post_init__(self) -> None:
        require_choice("tool_response_truncate_side", self.tool_response_truncate_side, ("left", "middle", "right"))
        require_choice(
            "tokenization_sanity_check_mode",
            self.tokenization_sanity_check_mode,
            ("strict", "ignore_strippable", "disable"),
        )


@dataclass
class CustomAsyncServerConfig(BaseConfig):
    """`rollout.agent.custom_async_server`: a user-provided async server class."""

    path: Optional[str] = None
    """Python file that defines the class."""

    name: Optional[str] = None
    """Class name."""


@dataclass
class AgentLoopConfig(BaseConfig):
    """`rollout.agent`: the agent-loop workers that drive async generation."""

    num_workers: int = 8
    """Agent-loop worker processes."""

    default_agent_loop: str = "single_turn_agent"
    """Agent loop used when a dataset row names none."""

    agent_loop_config_path: Optional[str] = None
    """YAML file registering extra agent loops."""

    custom_async_server: CustomAsyncServerConfig = field(default_factory=CustomAsyncServerConfig)
    """User-provided async server."""

    def __post_init__(self) -> None:
        require_positive("num_workers", self.num_workers)


@dataclass
class CheckpointEngineConfig(BaseConfig):
    """`rollout.checkpoint_engine`: how trained weights reach the rollout engine."""

    backend: str = "naive"
    """naive = colocated in-process copy (the only backend this distribution ships)."""

    update_weights_bucket_megabytes: int = 2048
    """Size of the buckets weights are sent in."""

    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Backend-specific options."""

    def __post_init__(self) -> None:
        require_positive("update_weights_bucket_megabytes", self.update_weights_bucket_megabytes)


@dataclass
class RolloutConfig(BaseConfig):
    """Generation engine, sampling and log-prob recomputation settings."""

    # Servers may shrink max_model_len (batch sizes stay as configured: per-rank sizes are a BatchPlan).
    _mutable_fields = frozenset({"max_model_len", "load_format"})

    name: str = MISSING
    """Mandatory: hf (HF generate; CPU and tests) | vllm (GPU, and Ascend through vllm-ascend); the registered
    rollouts (``verl.workers.rollout.registered_rollouts``). Any other name (sglang, trtllm) is refused before Ray."""

    mode: str = "async"
    """async (server mode driven by agent loops) | sync (generate inside the worker)."""

    nnodes: int = 0
    """Nodes for standalone rollout servers; 0 = colocated with training (hybrid engine)."""

    n_gpus_per_node: int = 8
    """Devices per rollout node; follows trainer.n_gpus_per_node."""

    temperature: float = 1.0
    """Sampling temperature; also the divisor of the training logits (must be > 0)."""

    top_k: int = -1
    """Top-k sampling; -1 = off."""

    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 = off."""

    prompt_length: int = 512
    """Maximum prompt tokens; follows data.max_prompt_length."""

    response_length: int = 512
    """Maximum generated tokens; follows data.max_response_length."""

    dtype: str = "bfloat16"
    """Inference dtype."""

    gpu_memory_utilization: float = 0.5
    """Fraction of device memory the inference engine may take (weights + KV cache)."""

    ignore_eos: bool = False
    """Keep generating after EOS."""

    enforce_eager: bool = False
    """Disable CUDA/NPU graphs."""

    cudagraph_capture_sizes: Optional[list[int]] = None
    """Batch sizes to capture graphs for; null = engine default."""

    free_cache_engine: bool = True
    """Release the KV cache between rollouts (needed when colocated with training)."""

    tensor_model_parallel_size: int = 2
    """Tensor parallel size of the inference engine."""

    data_parallel_size: int = 1
    """Data parallel size of the inference engine."""

    expert_parallel_size: int = 1
    """Expert parallel size (MoE)."""

    pipeline_model_parallel_size: int = 1
    """Pipeline parallel size of the inference engine."""

    max_num_batched_tokens: int = 8192
    """Token budget per engine step (chunked prefill)."""

    max_model_len: Optional[int] = None
    """Context length of the engine; null = prompt_length + response_length."""

    max_num_seqs: int = 1024
    """Sequences per engine step."""

    enable_chunked_prefill: bool = True
    """Chunked prefill."""

    enable_prefix_caching: bool = True
    """Reuse KV cache across requests sharing a prefix."""

    logprobs_mode: str = "processed_logprobs"
    """What the engine returns per token: processed_logprobs (after temperature/top-k/top-p) | raw_logprobs |
    processed_logits | raw_logits."""

    scheduling_policy: str = "fcfs"
    """Engine request scheduling: fcfs | priority."""

    load_format: str = "dummy"
    """dummy = the engine starts with random weights and receives the actor's; auto = load from disk."""

    layered_summon: bool = False
    """Gather FSDP weights layer by layer when syncing to the engine (less peak memory)."""

    log_prob_micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size of the old-log-prob pass; use log_prob_micro_batch_size_per_gpu."""

    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    """RESPONSES per GPU per old-log-prob forward."""

    log_prob_use_dynamic_bsz: bool = False
    """Token-budget micro-batches; follows actor_rollout_ref.actor.use_dynamic_bsz."""

    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget per GPU; follows actor_rollout_ref.actor.ppo_max_token_len_per_gpu."""

    disable_log_stats: bool = True
    """Silence the engine's periodic statistics."""

    do_sample: bool = True
    """Sample (true) or decode greedily (false)."""

    n: int = 1
    """Responses per prompt (GRPO group size)."""

    over_sample_rate: float = 0.0
    """Extra requests issued and cancelled when enough finished (tail-latency cut); 0 = off."""

    multi_stage_wake_up: bool = False
    """Wake the engine in stages (weights, then KV cache) to lower peak memory."""

    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}, "sglang": {}, "trtllm": {}})
    """Extra keyword arguments per engine: {vllm: {...}, sglang: {...}, trtllm: {...}}."""

    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling for validation (greedy by default)."""

    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Multi-turn / tool rollouts."""

    calculate_log_probs: bool = False
    """Return the engine's log-probs of the sampled tokens (for rollout-correction diagnostics)."""

    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    """Agent-loop workers."""

    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    """Weight transfer from trainer to engine."""

    skip_tokenizer_init: bool = True
    """The engine receives token ids and does not load a tokenizer."""

    enable_rollout_routing_replay: bool = False
    """Record MoE routing in rollout for router replay in training."""

    quantization: Optional[str] = None
    """Inference quantization method (e.g. fp8); null = none."""

    quantization_config_file: Optional[str] = None
    """Quantization config file."""

    skip_rollout: bool = False
    """Debugging: dump the first rollout to skip_dump_dir and replay it afterwards."""

    skip_dump_dir: str = "/tmp/rollout_dump"
    """Where skip_rollout dumps and reads generations."""

    def __post_init__(self) -> None:
        require_choice("mode", self.mode, ("async", "sync"))
        require_positive("n", self.n)
        require_positive("prompt_length", self.prompt_length)
        require_positive("response_length", self.response_length)
        if self.temperature <= 0:
            raise ConfigError(
                "temperature",
                f"({self.temperature}) must be > 0: it also divides the training logits. For greedy validation "
                f"set {{node}}.val_kwargs.temperature=0 instead.",
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError("top_p", f"must be in (0, 1], got {self.top_p}.")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}.")
        require_choice(
            "logprobs_mode",
            self.logprobs_mode,
            ("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits"),
        )
        check_micro_batch_settings(
            "log_prob_micro_batch_size",
            self.log_prob_micro_batch_size,
            "log_prob_micro_batch_size_per_gpu",
            self.log_prob_micro_batch_size_per_gpu,
        )
        unknown = sorted(set(self.engine_kwargs) - {"vllm", "sglang", "trtllm", "hf"})
        if unknown:
            raise ConfigError(f"engine_kwargs.{unknown[0]}", "unknown engine; use vllm | sglang | trtllm | hf.")

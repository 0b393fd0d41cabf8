"""The policy model block (`actor_rollout_ref.model`, `model/hf_model.yaml`).

Building the config never touches the disk: the HF config, tokenizer and processor are loaded lazily on
first access of `hf_config`, `tokenizer` and `processor` (cached on the object), so a config can be
validated on a machine that does not hold the weights (the Ray head, CI).
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional, Union

from verl.base_config import BaseConfig, ConfigError, require_choice, require_positive

__all__ = ["FusedKernelOptionsConfig", "HFModelConfig", "TiledMLPConfig"]

logger = logging.getLogger(__name__)


@dataclass
class FusedKernelOptionsConfig(BaseConfig):
    """`model.fused_kernel_options`."""

    impl_backend: str = "torch"
    """Backend of the fused LM-head + log-prob kernel: torch (chunked, every device) | triton (CUDA only)."""

    def __post_init__(self) -> None:
        require_choice("impl_backend", self.impl_backend, ("torch", "triton"))


@dataclass
class TiledMLPConfig(BaseConfig):
    """`model.tiled_mlp`: run the MLP in sequence tiles to cut activation memory on long sequences."""

    enabled: bool = False
    """Turn tiled MLP on."""

    num_shards: int = 4
    """Number of sequence tiles."""

    def __post_init__(self) -> None:
        require_positive("num_shards", self.num_shards)


@dataclass
class HFModelConfig(BaseConfig):
    """A Hugging Face causal LM used by actor, reference policy and rollout."""

    path: str = "~/models/deepseek-llm-7b-chat"
    """Local directory or HF hub id of the model."""

    hf_config_path: Optional[str] = None
    """Where config.json is read from; null = `path`."""

    tokenizer_path: Optional[str] = None
    """Where the tokenizer is read from; null = `path`."""

    use_shm: bool = False
    """Upstream copies the model to /dev/shm first; accepted for compatibility, loading reads `path` directly."""

    trust_remote_code: bool = False
    """Allow HF remote code for model, tokenizer and processor."""

    custom_chat_template: Optional[str] = None
    """Jinja chat template that replaces the tokenizer's."""

    external_lib: Optional[str] = None
    """Python module imported before loading (registers custom model classes)."""

    override_config: dict[str, Any] = field(default_factory=dict)
    """Overrides applied to the HF model config when the model is built (e.g. {attn_implementation: sdpa})."""

    enable_gradient_checkpointing: bool = True
    """Recompute decoder-layer activations in backward."""

    enable_activation_offload: bool = False
    """Offload saved activations to CPU during forward (field report item 3 runs with this on)."""

    use_remove_padding: bool = True
    """Packed (remove-padding) forward with cu_seqlens; required for Ulysses sequence parallelism."""

    lora_rank: int = 0
    """LoRA rank; 0 = full fine-tuning."""

    lora_alpha: int = 16
    """LoRA scaling alpha."""

    target_modules: Union[str, list[str]] = "all-linear"
    """LoRA target modules: 'all-linear' or a list of module names."""

    exclude_modules: Optional[Union[str, list[str]]] = None
    """Modules excluded from LoRA."""

    lora_adapter_path: Optional[str] = None
    """Pretrained LoRA adapter to start from."""

    use_liger: bool = False
    """Liger kernels (CUDA only)."""

    use_fused_kernels: bool = False
    """Fused LM-head + log-prob/entropy forward that never materialises full-vocabulary logits."""

    fused_kernel_options: FusedKernelOptionsConfig = field(default_factory=FusedKernelOptionsConfig)
    """Options of the fused kernels."""

    tiled_mlp: TiledMLPConfig = field(default_factory=TiledMLPConfig)
    """Tiled-MLP options."""

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            raise ConfigError("lora_rank", f"must be >= 0 (0 disables LoRA), got {self.lora_rank}.")

    # ---- lazily loaded artefacts (not config fields; cached on first access) ----
    @cached_property
    def local_path(self) -> str:
        """`path` with `~` expanded (a hub id is returned unchanged)."""
        return os.path.expanduser(self.path)

    @cached_property
    def hf_config(self) -> Any:
        """The `transformers` PretrainedConfig read from `hf_config_path` (or `path`), through the package's one
        config loader (list-typed rope-validation keys accepted on transformers 5.4.0)."""
        from verl.utils.rope_utils import load_hf_config

        self._import_external_lib()
        source = os.path.expanduser(self.hf_config_path) if self.hf_config_path else self.local_path
        return load_hf_config(source, trust_remote_code=self.trust_remote_code)

    @cached_property
    def tokenizer(self) -> Any:
        """The tokenizer; pad token falls back to eos (with a warning), `custom_chat_template` applied."""
        from transformers import AutoTokenizer

        from verl.utils.rope_utils import config_kwarg

        self._import_external_lib()
        source = os.path.expanduser(self.tokenizer_path) if self.tokenizer_path else self.local_path
        trust = self.trust_remote_code
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust, **config_kwarg(source, trust))
        if tokenizer.pad_token_id is None:
            logger.warning("tokenizer at %s has no pad token; using eos_token %r", source, tokenizer.eos_token)
            tokenizer.pad_token = tokenizer.eos_token
        if self.custom_chat_template is not None:
            tokenizer.chat_template = self.custom_chat_template
        return tokenizer

    @cached_property
    def processor(self) -> Any:
        """The multimodal processor, or None for text-only models (whose 'processor' is just a tokenizer)."""
        from transformers import AutoProcessor

        from verl.utils.rope_utils import config_kwarg

        self._import_external_lib()
        source = os.path.expanduser(self.tokenizer_path) if self.tokenizer_path else self.local_path
        trust = self.trust_remote_code
        try:
            processor = AutoProcessor.from_pretrained(source, trust_remote_code=trust, **config_kwarg(source, trust))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            logger.info("no multimodal processor at %s (%s); treating the model as text-only", source, exc)
            return None
        if "Processor" not in type(processor).__name__:
            return None
        if self.custom_chat_template is not None:
            processor.chat_template = self.custom_chat_template
        return processor

    def _import_external_lib(self) -> None:
        if self.external_lib is not None:
            importlib.import_module(self.external_lib)

"""A fake vLLM Qwen3.5-MoE model in pure torch that reproduces vLLM's weight loading and field-report item 1.

It mirrors vLLM 0.17-0.24 ``model_executor/models/qwen3_5.py`` as described in docs/qwen3_5.md, "vLLM weight loading":

* vLLM's module tree and parameter names (``language_model.model.layers.N.linear_attn.in_proj_qkvz`` ...), tensor
  parallel size 1;
* stacked parameters with shard-aware ``weight_loader``: ``qkv_proj`` (q/k/v), ``gate_up_proj`` (0/1),
  ``in_proj_qkvz`` (in_proj_qkv as shards (0, 1, 2), in_proj_z as 3), ``in_proj_ba`` (b 0, a 1);
* a ``FusedMoE`` with ``w13_weight [E, 2I, H]`` (gate rows, then up rows) and ``w2_weight [E, H, I]`` whose
  per-expert ``weight_loader(param, w, weight_name, shard_id, expert_id, return_success)`` fills one expert;
* ``load_weights`` that calls ``param.weight_loader`` directly in the stacked and expert branches (fused HF 3-D
  ``experts.gate_up_proj`` / ``experts.down_proj`` and per-expert checkpoint names), and
  ``getattr(param, "weight_loader", default_weight_loader)`` for everything else;
* MoE methods whose ``process_weights_after_loading`` keeps the loader (vLLM >= 0.17 CUDA) or re-creates the expert
  Parameters WITHOUT it: transposed (vllm-ascend ``AscendUnquantizedFusedMoEMethod``), same layout (vLLM ~0.8
  CUDA) or emptied (vLLM's CPU oneDNN path);
* the multimodal wrapper ``Qwen3_5MoeForConditionalGeneration`` with ``visual`` and ``language_model`` and the
  ``model.language_model.`` / ``model.visual.`` / ``lm_head.`` name mapping.

Parameters start as NaN (a "dummy" engine), so an element that a load misses is visible.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn

MOE_METHODS = ("cuda", "ascend", "legacy_cuda", "cpu")


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """vLLM's ``model_loader.weight_utils.default_weight_loader``."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.fill_(loaded_weight.item())
        return
    assert param.size() == loaded_weight.size(), f"cannot load {loaded_weight.size()} into {param.size()}"
    param.data.copy_(loaded_weight)


def _param(*shape: int, loader=None) -> nn.Parameter:
    param = nn.Parameter(torch.full(shape, float("nan")), requires_grad=False)
    if loader is not None:
        param.weight_loader = loader
    return param


# ----------------------------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------------------------


class ReplicatedLinear(nn.Module):
    """Also stands for Row/ColumnParallelLinear, VocabParallelEmbedding and ParallelLMHead at TP 1."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = _param(out_features, in_features, loader=self.weight_loader)
        if bias:
            self.bias = _param(out_features, loader=self.weight_loader)

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        default_weight_loader(param, loaded_weight)


class MergedColumnParallelLinear(nn.Module):
    """Output rows are the concatenation of ``output_sizes``; a shard id picks one block (or a tuple of blocks)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False, shard_names=()) -> None:
        super().__init__()
        self.output_sizes = list(output_sizes)
        self.shard_index = {name: i for i, name in enumerate(shard_names)}
        self.weight = _param(sum(output_sizes), in_features, loader=self.weight_loader)
        if bias:
            self.bias = _param(sum(output_sizes), loader=self.weight_loader)

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, loaded_shard_id=None) -> None:
        if loaded_shard_id is None:
            default_weight_loader(param, loaded_weight)
            return
        if isinstance(loaded_shard_id, tuple):  # in_proj_qkv -> shards (0, 1, 2) of in_proj_qkvz
            pieces = loaded_weight.split([self.output_sizes[i] for i in loaded_shard_id], dim=0)
            for shard, piece in zip(loaded_shard_id, pieces, strict=True):
                self.weight_loader(param, piece, shard)
            return
        index = self.shard_index.get(loaded_shard_id, loaded_shard_id)
        offset, size = sum(self.output_sizes[:index]), self.output_sizes[index]
        if loaded_weight.shape[0] != size:
            raise ValueError(f"shard {loaded_shard_id}: {tuple(loaded_weight.shape)} does not have {size} rows")
        param.data.narrow(0, offset, size).copy_(loaded_weight)


class QKVParallelLinear(MergedColumnParallelLinear):
    def __init__(self, in_features: int, q_size: int, kv_size: int, bias: bool = False) -> None:
        super().__init__(in_features, [q_size, kv_size, kv_size], bias=bias, shard_names=("q", "k", "v"))


class RMSNorm(nn.Module):
    """Norm weights have no weight_loader in vLLM (loaded through the getattr default)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = _param(size)


class LayerNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = _param(size)
        self.bias = _param(size)


class PlainParams(nn.Module):
    """A module holding named loader-less parameters (vision Conv3d patch embedding, pos_embed)."""

    def __init__(self, **shapes: tuple[int, ...]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            setattr(self, name, _param(*shape))


# ----------------------------------------------------------------------------------------------------------------
# MoE
# ----------------------------------------------------------------------------------------------------------------


class UnquantizedFusedMoEMethod:
    """vLLM >= 0.17 on CUDA: ``replace_parameter`` keeps the loader; nothing to do here."""

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        pass


class AscendUnquantizedFusedMoEMethod:
    """vllm-ascend: fresh, transposed Parameters ``[E, H, 2I]`` / ``[E, I, H]`` without weight_loader."""

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        layer.w13_weight = nn.Parameter(layer.w13_weight.data.transpose(1, 2).contiguous(), requires_grad=False)
        layer.w2_weight = nn.Parameter(layer.w2_weight.data.transpose(1, 2).contiguous(), requires_grad=False)


class RecreatingFusedMoEMethod:
    """vLLM around 0.8 on CUDA: fresh Parameters in the same layout, without weight_loader."""

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        layer.w13_weight = nn.Parameter(layer.w13_weight.data.clone(), requires_grad=False)
        layer.w2_weight = nn.Parameter(layer.w2_weight.data.clone(), requires_grad=False)


class CPUFusedMoEMethod:
    """vLLM's CPU oneDNN path: the weights move into a packed handle, the Parameters are emptied."""

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        layer.w13_weight = nn.Parameter(torch.empty(0), requires_grad=False)
        layer.w2_weight = nn.Parameter(torch.empty(0), requires_grad=False)


_METHOD_CLASSES = {
    "cuda": UnquantizedFusedMoEMethod,
    "ascend": AscendUnquantizedFusedMoEMethod,
    "legacy_cuda": RecreatingFusedMoEMethod,
    "cpu": CPUFusedMoEMethod,
}


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, moe_method: str) -> None:
        super().__init__()
        self.local_num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size_per_partition = intermediate_size
        self.quant_method = _METHOD_CLASSES[moe_method]()
        self.w13_weight = _param(num_experts, 2 * intermediate_size, hidden_size, loader=self.weight_loader)
        self.w2_weight = _param(num_experts, hidden_size, intermediate_size, loader=self.weight_loader)

    def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        """Canonical layout only, like vLLM's: w1 -> rows [0, I), w3 -> rows [I, 2I) of the expert, w2 -> all."""
        expert = param.data[expert_id]
        inter = self.intermediate_size_per_partition
        if shard_id in ("w1", "w3"):
            target = expert.narrow(0, 0 if shard_id == "w1" else inter, inter)
        elif shard_id == "w2":
            target = expert
        else:
            raise ValueError(f"unknown shard_id {shard_id!r}")
        if target.shape != loaded_weight.shape:
            raise RuntimeError(f"{weight_name}: expert slot {tuple(target.shape)} vs {tuple(loaded_weight.shape)}")
        target.copy_(loaded_weight)
        return True if return_success else None

    @staticmethod
    def make_expert_params_mapping(num_experts: int) -> list[tuple[str, str, int, str]]:
        """``(param_name, checkpoint_weight_name, expert_id, shard_id)`` as vLLM's ``FusedMoE.make_expert_params_mapping``."""
        projections = (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))
        return [
            ("experts.w2_" if shard == "w2" else "experts.w13_", f"experts.{e}.{proj}.", e, shard)
            for e in range(num_experts)
            for shard, proj in projections
        ]


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg, moe_method: str) -> None:
        super().__init__()
        hidden, shared = cfg.hidden_size, cfg.shared_expert_intermediate_size
        self.gate = ReplicatedLinear(hidden, cfg.num_experts)
        self.experts = FusedMoE(cfg.num_experts, hidden, cfg.moe_intermediate_size, moe_method)
        self.shared_expert = nn.Module()
        self.shared_expert.gate_up_proj = MergedColumnParallelLinear(hidden, [shared, shared])
        self.shared_expert.down_proj = ReplicatedLinear(shared, hidden)
        self.shared_expert_gate = ReplicatedLinear(hidden, 1)


# ----------------------------------------------------------------------------------------------------------------
# decoder
# ----------------------------------------------------------------------------------------------------------------


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
        value_dim = cfg.linear_num_value_heads * cfg.linear_value_head_dim
        num_v = cfg.linear_num_value_heads
        self.in_proj_qkvz = MergedColumnParallelLinear(cfg.hidden_size, [key_dim, key_dim, value_dim, value_dim])
        self.in_proj_ba = MergedColumnParallelLinear(cfg.hidden_size, [num_v, num_v])
        # vLLM builds conv1d as a ColumnParallelLinear and unsqueezes its weight to [C, 1, K]
        self.conv1d = ReplicatedLinear(cfg.linear_conv_kernel_dim, 2 * key_dim + value_dim)
        self.conv1d.weight = _param(
            2 * key_dim + value_dim, 1, cfg.linear_conv_kernel_dim, loader=default_weight_loader
        )
        self.A_log = _param(num_v, loader=default_weight_loader)  # sharded_weight_loader(0) at TP 1
        self.dt_bias = _param(num_v, loader=default_weight_loader)
        self.norm = RMSNorm(cfg.linear_value_head_dim)
        self.out_proj = ReplicatedLinear(value_dim, cfg.hidden_size)


class Attention(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        head_dim = cfg.head_dim
        # attn_output_gate: q_proj emits query and gate
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, 2 * cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
        )
        self.o_proj = ReplicatedLinear(cfg.num_attention_heads * head_dim, cfg.hidden_size)
        self.q_norm = RMSNorm(head_dim)
        self.k_norm = RMSNorm(head_dim)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_type: str, moe_method: str) -> None:
        super().__init__()
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.mlp = SparseMoeBlock(cfg, moe_method)
        self.input_layernorm = RMSNorm(cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size)


_STACKED_PARAMS = (
    # (vllm param, hf weight, shard id)
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
    ("in_proj_qkvz", "in_proj_qkv", (0, 1, 2)),
    ("in_proj_qkvz", "in_proj_z", 3),
    ("in_proj_ba", "in_proj_b", 0),
    ("in_proj_ba", "in_proj_a", 1),
)


class Qwen3_5Model(nn.Module):
    def __init__(self, cfg, moe_method: str) -> None:
        super().__init__()
        self.num_experts = cfg.num_experts
        self.embed_tokens = ReplicatedLinear(cfg.hidden_size, cfg.vocab_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t, moe_method) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size)

    def _load_fused_experts(self, params: dict, name: str, weight: torch.Tensor) -> str:
        """HF 5.x fused 3-D experts: gate_up_proj [E, 2I, H] (chunk -> w1, w3), down_proj [E, H, I] -> w2."""
        if "experts.gate_up_proj" in name:
            name = name.replace("experts.gate_up_proj", "experts.w13_weight")
            shards = dict(zip(("w1", "w3"), weight.chunk(2, dim=-2), strict=True))
        else:
            name = name.replace("experts.down_proj", "experts.w2_weight")
            shards = {"w2": weight}
        param = params[name]
        for shard_id, stacked in shards.items():
            for expert_id in range(stacked.shape[0]):
                param.weight_loader(param, stacked[expert_id], name, shard_id, expert_id, return_success=True)
        return name

    def _load_stacked(self, params: dict, name: str, weight: torch.Tensor) -> str | None:
        for param_name, weight_name, shard_id in _STACKED_PARAMS:
            if weight_name not in name or "mlp.experts" in name:
                continue
            name = name.replace(weight_name, param_name)
            param = params[name]
            param.weight_loader(param, weight, shard_id)
            return name
        return None

    def _load_expert(self, params: dict, name: str, weight: torch.Tensor) -> str | None:
        for param_name, weight_name, expert_id, shard_id in FusedMoE.make_expert_params_mapping(self.num_experts):
            if weight_name not in name:
                continue
            name = name.replace(weight_name, param_name)
            param = params[name]
            param.weight_loader(param, weight, name, shard_id=shard_id, expert_id=expert_id)
            return name
        return None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, weight in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if "experts.gate_up_proj" in name or "experts.down_proj" in name:
                loaded.add(self._load_fused_experts(params, name, weight))
                continue
            done = self._load_stacked(params, name, weight) or self._load_expert(params, name, weight)
            if done is None:
                param = params[name]
                getattr(param, "weight_loader", default_weight_loader)(param, weight)
                done = name
            loaded.add(done)
        return loaded


def _load_children(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], skip=("mtp.",)) -> set[str]:
    """vLLM's ``AutoWeightsLoader``: route ``child.rest`` to ``child.load_weights`` if it has one, else load the
    parameter through its loader (default if none)."""
    params = dict(module.named_parameters())
    loaded = set()
    for name, weight in weights:
        if name.startswith(skip):
            continue
        child_name, _, rest = name.partition(".")
        child = getattr(module, child_name)
        if hasattr(child, "load_weights"):
            loaded |= {f"{child_name}.{n}" for n in child.load_weights([(rest, weight)])}
        else:
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, weight)
            loaded.add(name)
    return loaded


class Qwen3_5MoeForCausalLM(nn.Module):
    def __init__(self, cfg, moe_method: str = "ascend") -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3_5Model(cfg, moe_method)
        self.lm_head = ReplicatedLinear(cfg.hidden_size, cfg.vocab_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return _load_children(self, weights)


# ----------------------------------------------------------------------------------------------------------------
# vision and the multimodal wrapper
# ----------------------------------------------------------------------------------------------------------------


class VisionBlock(nn.Module):
    def __init__(self, vcfg) -> None:
        super().__init__()
        hidden = vcfg.hidden_size
        self.norm1, self.norm2 = LayerNorm(hidden), LayerNorm(hidden)
        self.attn = nn.Module()
        self.attn.qkv = QKVParallelLinear(hidden, hidden, hidden, bias=True)
        self.attn.proj = ReplicatedLinear(hidden, hidden, bias=True)
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = ReplicatedLinear(hidden, vcfg.intermediate_size, bias=True)
        self.mlp.linear_fc2 = ReplicatedLinear(vcfg.intermediate_size, hidden, bias=True)


class VisionModel(nn.Module):
    def __init__(self, vcfg) -> None:
        super().__init__()
        hidden, merged = vcfg.hidden_size, vcfg.hidden_size * vcfg.spatial_merge_size**2
        patch = (vcfg.in_channels, vcfg.temporal_patch_size, vcfg.patch_size, vcfg.patch_size)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = PlainParams(weight=(hidden, *patch), bias=(hidden,))
        self.pos_embed = PlainParams(weight=(vcfg.num_position_embeddings, hidden))
        self.blocks = nn.ModuleList(VisionBlock(vcfg) for _ in range(vcfg.depth))
        self.merger = nn.Module()
        self.merger.norm = LayerNorm(hidden)
        self.merger.linear_fc1 = ReplicatedLinear(merged, merged, bias=True)
        self.merger.linear_fc2 = ReplicatedLinear(merged, vcfg.out_hidden_size, bias=True)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, weight in weights:
            param = params[name]
            if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
                param.weight_loader(param, weight)  # fused qkv: loaded whole (shard id None)
            else:
                getattr(param, "weight_loader", default_weight_loader)(param, weight)
            loaded.add(name)
        return loaded


_HF_TO_VLLM_PREFIXES = (
    ("model.language_model.", "language_model.model."),
    ("model.visual.", "visual."),
    ("lm_head.", "language_model.lm_head."),
)


def hf_to_vllm_name(name: str) -> str:
    """``hf_to_vllm_mapper`` of ``Qwen3_5MoeForConditionalGeneration``."""
    for old, new in _HF_TO_VLLM_PREFIXES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


class Qwen3_5MoeForConditionalGeneration(nn.Module):
    def __init__(self, cfg, moe_method: str = "ascend") -> None:
        super().__init__()
        self.config = cfg
        self.visual = VisionModel(cfg.vision_config)
        self.language_model = Qwen3_5MoeForCausalLM(cfg.text_config, moe_method)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return _load_children(self, ((hf_to_vllm_name(n), w) for n, w in weights))


# ----------------------------------------------------------------------------------------------------------------
# building an engine-like model
# ----------------------------------------------------------------------------------------------------------------


def process_weights_after_loading(model: nn.Module) -> None:
    """What vLLM runs once after the initial (dummy) load: each MoE method post-processes its layer."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def build_fake_vllm_model(hf_config, moe_method: str = "ascend", *, record_layout: bool = False) -> nn.Module:
    """The fake vLLM model for an HF Qwen3.5-MoE config (text or multimodal), as a running engine holds it:
    dummy (NaN) weights, then ``process_weights_after_loading`` of ``moe_method`` (one of :data:`MOE_METHODS`).

    ``record_layout``: capture the canonical layout between loading and post-processing, as verl's vLLM model loader
    does for a real engine (verl.utils.vllm.loader), so syncs take the exact canonical-reload path."""
    if getattr(hf_config, "vision_config", None) is not None:
        model = Qwen3_5MoeForConditionalGeneration(hf_config, moe_method)
    else:
        model = Qwen3_5MoeForCausalLM(hf_config, moe_method)
    if record_layout:
        from verl.utils.vllm.canonical_reload import CANONICAL_LAYOUT_ATTR, CanonicalLayout

        setattr(model, CANONICAL_LAYOUT_ATTR, CanonicalLayout.capture(model))
    process_weights_after_loading(model)
    return model

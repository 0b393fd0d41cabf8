"""Predict the memory of a PPO/GRPO config per device and per host, and whether it fits a 64 GB Ascend NPU.

    python -m verl.tools.memory_plan <hydra overrides>            # the same overrides main_ppo takes
    python -m verl.tools.memory_plan --device-gib 80 <overrides>  # another device size
    python -m verl.tools.memory_plan $(VERL_PRINT_OVERRIDES=1 bash recipes/qwen3_5/<recipe>.sh)
    python -m verl.tools.memory_plan --recipes recipes/qwen3_5    # the table of docs/recipes.md

The config is composed from ``ppo_trainer`` with Hydra and checked with the validation ``main_ppo`` runs before Ray
(all of it except the device and logger-package checks: a plan is made on any machine, not on the cluster). The
model's shape comes from ``<model.path>/config.json`` when that is a local directory, else from a shipped table of
known architectures (Qwen3.5-35B-A3B), else the tool stops and asks for a local path.

What is counted, per device (FSDP shards over ``trainer.nnodes x trainer.n_gpus_per_node``, or ``fsdp_size``):

* parameters, gradients (the parameter dtype, ``fsdp_config.model_dtype``) and AdamW's two moments (fp32, 8 bytes
  per parameter; with fp32 parameters these are also the master weights, no separate copy), each divided by the
  FSDP size; ``param_offload`` moves parameters and gradients to the host between phases, ``optimizer_offload``
  the moments (the table's device/host columns say where they live between phases); the actor update loads them
  back onto the device for its whole duration (the workers' placement), so offload lowers the rollout phase, not
  the update;
* the unsharded working set of FSDP: the largest wrapped unit (one decoder layer, or the embedding / LM head) is
  all-gathered with its full gradient before the reduce-scatter: 2 x that unit;
* activations for the tokens one device holds in one micro-batch: the micro-batch is ``ppo_max_token_len_per_gpu x
  SP`` tokens with ``use_dynamic_bsz`` (the workers' rule), else ``ppo_micro_batch_size_per_gpu x
  (max_prompt_length + max_response_length)``, and each device holds 1 / SP of it (Ulysses). Per token and layer, the tensors autograd keeps are counted from the architecture
  (:func:`layer_activation_elems`: projections, norms, the GDN / attention intermediates, router logits and the
  top-k experts' intermediates), times :data:`AUTOGRAD_FACTOR` (2.7, measured) for the intermediates autograd keeps
  besides those. With gradient checkpointing a layer keeps only its input (``hidden`` values per token) and one
  layer at a time is recomputed in backward (its set, plus as much again for the gradients flowing through it);
  without, every layer keeps its full set; ``model.enable_activation_offload`` moves what the layers keep to the host;
* the log-prob chunk: the chunked LM head materialises about 2 x chunk x vocab x 4 bytes (the fp32 logits and their
  log-softmax / gradient; chunk = ``entropy_from_logits_chunk_size`` with ``entropy_from_logits_with_chunking``,
  else every token of the micro-batch);
* the reference model's sharded parameters (when a reference policy is used) unless ``ref.fsdp_config.param_offload``;
* vLLM's share, ``rollout.gpu_memory_utilization x device memory``. With ``free_cache_engine`` vLLM releases it while
  the actor trains, so the device peak is the larger of the rollout phase (vLLM + what stays resident) and the
  training phase (the actor's parameters, gradients and AdamW state, the reference model unless offloaded, the
  working set, activations and the log-prob chunk); without, both add up.

Per host: what the offload flags move there for every device of the node (``n_gpus_per_node``). Not counted:
framework and allocator overhead (CANN / HCCL workspaces, fragmentation: budget a few GiB), the vision tower's
activations and the image tensors, vLLM's own host buffers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

GIB = 1024**3
DEVICE_GIB = 64.0  # Atlas 800T A2: 8 x Ascend 910B with 64 GB HBM each
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}

# Qwen3.5-35B-A3B (text and vision fields of its config.json; 35.1 B parameters counted with this module).
QWEN3_5_35B_A3B = {
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],  # repeated over the 40 layers
    "vocab_size": 248320,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "attn_output_gate": True,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "vision_config": {
        "depth": 27,
        "hidden_size": 1152,
        "intermediate_size": 4304,
        "patch_size": 16,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "spatial_merge_size": 2,
        "out_hidden_size": 2048,
    },
}
KNOWN_ARCHITECTURES = {"Qwen3.5-35B-A3B": QWEN3_5_35B_A3B}
# What autograd really keeps per layer over the named tensors :func:`layer_activation_elems` counts (the elementwise
# intermediates: SiLU/sigmoid inputs, l2-normalised q/k, the GDN decay terms, routing weights and gather indices,
# the chunked delta-rule kernel's per-chunk matrices, the CPU attention's per-segment scores). Calibrated once on the
# CPU: one update of the wide tiny Qwen3.5-MoE (benchmarks/memory_plan_check.py, 4096 tokens, SP 1, no
# checkpointing) measured 1072 MiB of activations where the named tensors are 399 MiB, a ratio of 2.69. The other
# measured cases (checkpointing on, SP 2, 8192 tokens) are predicted with this factor, not fitted.
AUTOGRAD_FACTOR = 2.7


# ---- the model's shape -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The fields of a (Qwen3.5-style) config.json the plan needs; dense models use ``intermediate_size``."""

    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attn_output_gate: bool = True
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    intermediate_size: int = 0
    tie_word_embeddings: bool = False
    vision_params: int = 0

    @classmethod
    def from_config_dict(cls, config: dict) -> ModelShape:
        """From a config.json dict (a multimodal one keeps the text fields under ``text_config``)."""
        text = {**config, **config.get("text_config", {})}
        layers = int(text["num_hidden_layers"])
        types = list(text.get("layer_types") or ["full_attention"])
        types = (types * math.ceil(layers / len(types)))[:layers]
        names = {f for f in cls.__dataclass_fields__ if f not in ("layer_types", "vision_params")}
        values = {k: text[k] for k in names if text.get(k) is not None}
        values.setdefault("head_dim", text["hidden_size"] // text["num_attention_heads"])
        values.setdefault("num_key_value_heads", text["num_attention_heads"])
        values["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings")))
        return cls(layer_types=tuple(types), vision_params=vision_params(config.get("vision_config")), **values)

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


def vision_params(vision: dict | None) -> int:
    """Parameters of a Qwen3-VL-style vision tower: blocks (attention 4 h^2, MLP 2 h I), patch embedding, merger."""
    if not vision:
        return 0
    h, inter = vision["hidden_size"], vision["intermediate_size"]
    patch = vision.get("in_channels", 3) * vision.get("temporal_patch_size", 2) * vision["patch_size"] ** 2 * h
    merged = h * vision.get("spatial_merge_size", 2) ** 2
    return vision["depth"] * (4 * h * h + 2 * h * inter) + patch + merged * merged + merged * vision["out_hidden_size"]


def layer_params(shape: ModelShape, layer_type: str) -> int:
    """Weights of one decoder layer (biases and the 1-D norm/gate vectors included where they exist)."""
    h = shape.hidden_size
    if layer_type == "linear_attention":
        value = shape.linear_num_value_heads * shape.linear_value_head_dim
        qkv = 2 * shape.linear_num_key_heads * shape.linear_key_head_dim + value
        mixer = (qkv + value + 2 * shape.linear_num_value_heads) * h + qkv * shape.linear_conv_kernel_dim
        mixer += 2 * shape.linear_num_value_heads + shape.linear_value_head_dim + h * value
    else:
        q = shape.num_attention_heads * shape.head_dim
        kv = shape.num_key_value_heads * shape.head_dim
        mixer = (q * (2 if shape.attn_output_gate else 1) + 2 * kv) * h + h * q + 2 * shape.head_dim
    if shape.moe:
        mlp = shape.num_experts * 3 * h * shape.moe_intermediate_size + shape.num_experts * h
        if shape.shared_expert_intermediate_size:
            mlp += 3 * h * shape.shared_expert_intermediate_size + h
    else:
        mlp = 3 * h * shape.intermediate_size
    return mixer + mlp + 2 * h


def model_params(shape: ModelShape) -> dict[str, int]:
    """Parameter counts: total, embeddings, LM head and the largest FSDP unit (a layer or the embedding)."""
    embed = shape.vocab_size * shape.hidden_size
    head = 0 if shape.tie_word_embeddings else embed
    layers = [layer_params(shape, t) for t in shape.layer_types]
    total = embed + head + sum(layers) + shape.hidden_size + shape.vision_params
    return {"total": total, "largest_unit": max([embed, *layers])}


def layer_activation_elems(shape: ModelShape, layer_type: str) -> int:
    """Values per token that autograd keeps for one layer's backward (the per-layer activation factor x hidden).

    Counted tensors: the layer input and the two RMSNorm inputs/outputs (4 h); GDN: projected q/k/v (C), its
    causal-conv output (C), z, the core output and the gated-norm output (3 x value width), b and a; attention:
    the projected query(+gate), k and v, rotated q and k, the attention output and the gated output; MoE: the router
    logits, per chosen expert its input, gate/up output, activation and output, plus the shared expert's; dense MLP:
    gate/up output, activation and output.
    """
    h = shape.hidden_size
    elems = 4 * h
    if layer_type == "linear_attention":
        value = shape.linear_num_value_heads * shape.linear_value_head_dim
        qkv = 2 * shape.linear_num_key_heads * shape.linear_key_head_dim + value
        elems += 2 * qkv + 3 * value + 2 * shape.linear_num_value_heads
    else:
        q = shape.num_attention_heads * shape.head_dim
        kv = shape.num_key_value_heads * shape.head_dim
        elems += q * (2 if shape.attn_output_gate else 1) + 2 * kv + (q + kv) + 2 * q
    if shape.moe:
        k, inter = shape.num_experts_per_tok, shape.moe_intermediate_size
        elems += shape.num_experts + k * (2 * h + 3 * inter)
        if shape.shared_expert_intermediate_size:
            elems += 3 * shape.shared_expert_intermediate_size + h + 1
    else:
        elems += 3 * shape.intermediate_size + h
    return elems


def load_shape(model_path: str) -> ModelShape:
    """The model's shape from ``<model_path>/config.json``, or from the known-architecture table by name."""
    config_file = Path(os.path.expanduser(model_path)) / "config.json"
    if config_file.is_file():
        return ModelShape.from_config_dict(json.loads(config_file.read_text()))
    for name, config in KNOWN_ARCHITECTURES.items():
        if name.lower() in model_path.lower():
            return ModelShape.from_config_dict(config)
    raise ValueError(
        f"actor_rollout_ref.model.path={model_path!r}: no config.json there and not a known architecture "
        f"({', '.join(KNOWN_ARCHITECTURES)}). Point it at a local model directory (only config.json is read)."
    )


# ---- the plan --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInputs:
    """The config values the plan depends on (read from the composed config by :func:`inputs_from_config`)."""

    world_size: int
    gpus_per_node: int
    tokens_per_micro_batch: int
    sp: int = 1
    param_bytes: int = 4
    activation_bytes: int = 4
    param_offload: bool = False
    optimizer_offload: bool = False
    gradient_checkpointing: bool = True
    activation_offload: bool = False
    logprob_chunk: int | None = 2048  # None: the whole micro-batch at once
    use_reference: bool = False
    ref_param_offload: bool = False
    vllm_utilization: float = 0.0
    free_cache_engine: bool = True
    device_gib: float = DEVICE_GIB


@dataclass
class Plan:
    """Bytes per device (rollout and training phase) and per host; ``rows`` is the printed breakdown."""

    rows: list[tuple[str, float, float]] = field(default_factory=list)  # (item, device bytes, host bytes per device)
    device_peak: float = 0.0
    training_peak: float = 0.0
    host_per_node: float = 0.0
    device_bytes: float = 0.0

    @property
    def fits(self) -> bool:
        return self.device_peak <= self.device_bytes


def plan_memory(shape: ModelShape, inp: PlanInputs) -> Plan:
    """The arithmetic of the module docstring; every row is (item, on the device, on the host) per device."""
    counts = model_params(shape)
    shard = counts["total"] / inp.world_size
    params, grads = shard * inp.param_bytes, shard * inp.param_bytes
    moments = shard * 8  # AdamW exp_avg + exp_avg_sq in fp32
    # one unsharded unit + its full gradient; a single shard is the whole model already (nothing gathered)
    working = 2 * counts["largest_unit"] * inp.param_bytes if inp.world_size > 1 else 0.0
    tokens = math.ceil(inp.tokens_per_micro_batch / inp.sp)
    per_layer = [AUTOGRAD_FACTOR * layer_activation_elems(shape, t) for t in shape.layer_types]
    if inp.gradient_checkpointing:
        # every layer's input, plus the layer being recomputed: its saved set and the gradients flowing through it
        kept, working_elems = shape.num_hidden_layers * shape.hidden_size, 2 * max(per_layer)
    else:
        kept, working_elems = sum(per_layer), 0.0
    kept_bytes = tokens * kept * inp.activation_bytes
    activations = tokens * working_elems * inp.activation_bytes + (0.0 if inp.activation_offload else kept_bytes)
    offloaded_activations = kept_bytes if inp.activation_offload else 0.0
    chunk = min(tokens, inp.logprob_chunk) if inp.logprob_chunk else tokens
    logprob = 2 * chunk * shape.vocab_size * 4
    ref = shard * inp.param_bytes if inp.use_reference else 0.0
    vllm = inp.vllm_utilization * inp.device_gib * GIB

    def split(value: float, offloaded: bool) -> tuple[float, float]:
        return (0.0, value) if offloaded else (value, 0.0)

    plan = Plan(device_bytes=inp.device_gib * GIB)
    plan.rows = [
        ("parameters (sharded)", *split(params, inp.param_offload)),
        ("gradients (sharded)", *split(grads, inp.param_offload)),
        ("AdamW m+v fp32 (sharded)", *split(moments, inp.optimizer_offload)),
        ("reference parameters", *split(ref, inp.ref_param_offload)),
        ("FSDP unsharded unit + grad", working, 0.0),
        (f"activations ({tokens} tokens)", activations, offloaded_activations),
        (f"log-prob chunk ({chunk} tokens)", logprob, 0.0),
        ("vLLM share", vllm, 0.0),
    ]
    # between phases only what is not offloaded stays on the device; the actor update moves its offloaded
    # parameters, gradients and AdamW state back (the workers' placement), the reference model stays where it is
    resident = sum(row[1] for row in plan.rows[:4])
    ref_on_device = plan.rows[3][1]
    training = params + grads + moments + ref_on_device + working + activations + logprob
    rollout = resident + vllm
    plan.training_peak = training if inp.free_cache_engine else training + vllm
    plan.device_peak = max(rollout, plan.training_peak)
    plan.host_per_node = sum(row[2] for row in plan.rows) * inp.gpus_per_node
    return plan


# ---- from a composed config ------------------------------------------------------------------------------------


def compose_config(overrides: list[str]):
    """``ppo_trainer`` composed with ``overrides`` and validated as main_ppo does before Ray (device and logger
    package checks excluded: the plan is made on any machine)."""
    from hydra import compose, initialize_config_dir

    from verl.trainer.config.legacy_reward import migrate_legacy_reward_impl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config_dir = Path(__file__).resolve().parents[1] / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    config = migrate_legacy_reward_impl(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return config


def _dtype_bytes(value: str | None, key: str, default: int) -> int:
    if value is None:
        return default
    if str(value) not in DTYPE_BYTES:
        raise ValueError(f"{key}={value!r}: unknown dtype; use one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[str(value)]


def _engine_config(role, name: str):
    for key in ("fsdp_config", "veomni"):
        if role.get(key) is not None:
            return role[key]
    raise ValueError(f"actor_rollout_ref.{name}: neither fsdp_config nor veomni is set; the plan covers FSDP/VeOmni")


def inputs_from_config(config, device_gib: float = DEVICE_GIB) -> PlanInputs:
    """The plan's inputs from a composed (and validated) trainer config."""
    from verl.trainer.ppo.utils import need_reference_policy

    actor, rollout, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref
    fsdp = _engine_config(actor, "actor")  # the FSDP config, or VeOmni's (same offload/size keys)
    sp = int(
        actor.get("ulysses_sequence_parallel_size")
        or fsdp.get("ulysses_sequence_parallel_size")
        or fsdp.get("ulysses_parallel_size")
        or 1
    )
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    fsdp_size = int(fsdp.get("fsdp_size", -1) or -1)
    if actor.use_dynamic_bsz:  # a micro-batch holds ppo_max_token_len_per_gpu x SP tokens (upstream's rule)
        tokens = int(actor.ppo_max_token_len_per_gpu) * sp
    else:
        tokens = int(actor.ppo_micro_batch_size_per_gpu or 1) * (
            int(config.data.max_prompt_length) + int(config.data.max_response_length)
        )
    param_bytes = _dtype_bytes(fsdp.get("model_dtype"), "actor.fsdp_config.model_dtype", 4)
    mixed = fsdp.get("mixed_precision") or {}
    if isinstance(mixed, bool):  # VeOmni: mixed_precision=True computes in bf16
        act_bytes = 2
    else:
        act_bytes = _dtype_bytes(mixed.get("param_dtype"), "actor.fsdp_config.mixed_precision.param_dtype", param_bytes)
    chunked = actor.get("entropy_from_logits_with_chunking") or fsdp.get("entropy_from_logits_with_chunking")
    chunk = actor.get("entropy_from_logits_chunk_size") or fsdp.get("entropy_from_logits_chunk_size") or 2048
    return PlanInputs(
        world_size=fsdp_size if fsdp_size > 0 else world,
        gpus_per_node=int(config.trainer.n_gpus_per_node),
        tokens_per_micro_batch=tokens,
        sp=sp,
        param_bytes=param_bytes,
        activation_bytes=act_bytes,
        param_offload=bool(fsdp.param_offload),
        optimizer_offload=bool(fsdp.optimizer_offload),
        gradient_checkpointing=bool(config.actor_rollout_ref.model.enable_gradient_checkpointing),
        activation_offload=bool(config.actor_rollout_ref.model.get("enable_activation_offload")),
        logprob_chunk=int(chunk) if chunked else None,
        use_reference=need_reference_policy(config),
        ref_param_offload=bool(_engine_config(ref, "ref").param_offload),
        vllm_utilization=float(rollout.gpu_memory_utilization) if rollout.name == "vllm" else 0.0,
        free_cache_engine=bool(rollout.free_cache_engine),
        device_gib=device_gib,
    )


def format_plan(plan: Plan, inp: PlanInputs) -> str:
    """The printed table (GiB), the peak per device, the host RAM per node and the verdict."""
    lines = ["| item | per device (GiB) | on host, per device (GiB) |", "|---|---:|---:|"]
    lines += [f"| {name} | {dev / GIB:.2f} | {host / GIB:.2f} |" for name, dev, host in plan.rows]
    verdict = "fits" if plan.fits else "does NOT fit"
    lines += [
        "",
        f"Device peak {plan.device_peak / GIB:.1f} GiB of {inp.device_gib:g} GiB: {verdict} "
        f"(training phase {plan.training_peak / GIB:.1f} GiB) "
        f"(FSDP over {inp.world_size}, SP {inp.sp}, {inp.tokens_per_micro_batch} tokens per micro-batch); "
        f"host RAM for offloaded state {plan.host_per_node / GIB:.1f} GiB per node ({inp.gpus_per_node} devices).",
    ]
    return "\n".join(lines)


RECIPE_COLUMNS = ("params", "grads", "AdamW", "ref", "FSDP unit", "activations", "log-prob", "vLLM")


def recipe_overrides(script: Path, env: dict[str, str] | None = None) -> list[str]:
    """The overrides a recipe launches (``VERL_PRINT_OVERRIDES=1``), in a clean environment with its defaults."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as home:
        run_env = {"PATH": os.environ["PATH"], "HOME": home, "VERL_PRINT_OVERRIDES": "1", **(env or {})}
        done = subprocess.run(["bash", str(script)], env=run_env, capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise ValueError(f"{script}: VERL_PRINT_OVERRIDES=1 failed: {done.stderr.strip()[-500:]}")
    return done.stdout.splitlines()


def recipes_table(recipe_dir: Path, device_gib: float = DEVICE_GIB) -> str:
    """One markdown row per recipe of ``recipe_dir`` (and the long-sequence 128K profile): GiB per device
    (device + host where offloaded), the device peak, host RAM per node, and whether it fits."""
    cases = [(p, {}) for p in sorted(recipe_dir.glob("run_*.sh"))]
    cases += [(p, {"SEQ_PROFILE": "128k"}) for p, _ in list(cases) if "longseq" in p.name]
    head = ["recipe", *RECIPE_COLUMNS, "training phase", "device peak", "host / node", f"fits {device_gib:g} GiB"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for script, env in cases:
        label = script.name + "".join(f" ({k}={v})" for k, v in env.items())
        skip = "not planned: the CPU quickstart (a tiny model built at launch)"
        if "verl.trainer.main_ppo" in script.read_text():
            config = compose_config(recipe_overrides(script, env))
            path = str(config.actor_rollout_ref.model.path)
            try:
                shape = load_shape(path)
            except ValueError:
                shape, skip = None, f"not planned: `{path}` has no known architecture; run the tool with a local copy"
        if "verl.trainer.main_ppo" not in script.read_text() or shape is None:
            lines.append(f"| {label} | " + " | ".join(["–"] * (len(head) - 2)) + f" | {skip} |")
            continue
        inputs = inputs_from_config(config, device_gib)
        plan = plan_memory(shape, inputs)
        cells = [_cell(dev, host) for _, dev, host in plan.rows]
        cells += [
            f"{plan.training_peak / GIB:.1f}",
            f"{plan.device_peak / GIB:.1f}",
            f"{plan.host_per_node / GIB:.0f}",
            "yes" if plan.fits else "**no**",
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(device: float, host: float) -> str:
    if host:
        return f"{device / GIB:.1f} (+{host / GIB:.1f} host)" if device else f"host {host / GIB:.1f}"
    return f"{device / GIB:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-gib", type=float, default=DEVICE_GIB, help="device memory (default: 64, 910B)")
    parser.add_argument("--recipes", metavar="DIR", help="print the table of every run_*.sh recipe in DIR instead")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for verl.trainer.main_ppo")
    args = parser.parse_args(argv)
    if args.recipes:
        print(recipes_table(Path(args.recipes), args.device_gib))
        return 0
    try:
        config = compose_config(args.overrides)
        shape = load_shape(str(config.actor_rollout_ref.model.path))
    except ValueError as exc:
        print(f"memory_plan: {exc}", file=sys.stderr)
        return 2
    inputs = inputs_from_config(config, args.device_gib)
    print(format_plan(plan_memory(shape, inputs), inputs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

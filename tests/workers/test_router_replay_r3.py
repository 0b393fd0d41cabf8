"""MoE router replay R3 with the HF rollout on the tiny Qwen3.5-MoE (HF ``Qwen3_5MoeForCausalLM`` + the project's
CPU patches): the rollout records the routing of every prompt and generated token during ``generate`` and the
actor replays it.

Independent observers: HF's own full forward (no KV cache) is the reference for what the rollout should have
recorded, and a pre-hook on every ``Qwen3_5MoeExperts`` module reads the ``top_k_index`` the experts actually run
with in the actor's forwards (not the replay code's bookkeeping).
"""

import pytest
import torch
from tensordict import TensorDict

from verl.models.tiny import build_tiny_model
from verl.models.transformers.patch_registry import apply_patches
from verl.models.transformers.router_replay import RouterReplayError
from verl.protocol import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import FSDPActorConfig, RolloutConfig, RouterReplayConfig
from verl.workers.core.model_forward import LogProbOptions
from verl.workers.rollout.hf_rollout import HFRollout

PAD = 0
PROMPT_LEN = 6
RESPONSE_LEN = 7


@pytest.fixture
def moe():
    torch.manual_seed(0)
    model = build_tiny_model("qwen3_5_moe", vocab_size=128).float()
    apply_patches(model, platform="cpu", report=False)
    return model


class ExpertsObserver:
    """Collects, per forward, the (tokens, top-k) expert ids each MoE layer's experts are run with."""

    def __init__(self, model):
        self.calls: list[torch.Tensor] = []
        self.handles = [
            m.register_forward_pre_hook(self._hook) for m in model.modules() if type(m).__name__.endswith("MoeExperts")
        ]
        assert self.handles

    def _hook(self, module, args):
        self.calls.append(args[1].detach().clone())

    def forwards(self) -> list[torch.Tensor]:
        """One ``(T, L, k)`` tensor per forward (layers in call order)."""
        n = len(self.handles)
        return [torch.stack(self.calls[i : i + n], dim=1) for i in range(0, len(self.calls), n)]

    def remove(self):
        for handle in self.handles:
            handle.remove()


def _prompts(batch_size, seed=0, **meta) -> DataProto:
    """Left-padded prompts: row i has ``i % 3`` pads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 120, (batch_size, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    for i in range(batch_size):
        mask[i, : i % 3] = 0
    ids = ids.masked_fill(mask == 0, PAD)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, batch_size=[batch_size])
    meta_info = {"eos_token_id": 127, "pad_token_id": PAD, "do_sample": True, "validate": False, **meta}
    return DataProto(batch=td, meta_info=meta_info)


def _rollout(model, **overrides) -> HFRollout:
    config = dict(
        name="hf",
        response_length=RESPONSE_LEN,
        temperature=1.0,
        top_k=-1,
        top_p=1.0,
        max_num_seqs=3,
        calculate_log_probs=True,
        enable_rollout_routing_replay=True,
    )
    config.update(overrides)
    return HFRollout(model, RolloutConfig(**config))


def _hf_full_forward_routing(model, out: DataProto) -> torch.Tensor:
    """``(B, S, L, k)`` expert ids HF's own forward (whole sequences, no cache) runs the experts with."""
    observer = ExpertsObserver(model)
    td = out.batch
    with torch.no_grad():
        model(input_ids=td["input_ids"], attention_mask=td["attention_mask"], position_ids=td["position_ids"])
    observer.remove()
    (routing,) = observer.forwards()
    return routing.reshape(*td["input_ids"].shape, *routing.shape[1:])


@pytest.mark.tf_compat  # the last-token step uses generate's returned cache: `cache` (5.24) / `past_key_values` (5.4)
def test_hf_rollout_records_the_routing_of_every_token(moe):
    """routed_experts is (B, P + R, L, k) uint8 aligned with input_ids and equals, on every real token (prompt,
    response, the last sampled token and an early EOS) and every MoE layer, the experts HF's own full forward of
    the finished sequences routes to (fp32: the cached decoding routes like the full forward). 4 rows in chunks of
    max_num_seqs=3, so the chunks' routing is concatenated too."""
    torch.manual_seed(1)
    first = _rollout(moe).generate_sequences(_prompts(4, do_sample=False))
    eos = int(first.batch["responses"][0, 2])  # row 0 emits this at step 2 (greedy): it stops there
    out = _rollout(moe).generate_sequences(_prompts(4, do_sample=False, eos_token_id=eos))
    td = out.batch
    routing = td["routed_experts"]
    assert routing.dtype == torch.uint8
    assert routing.shape == (4, PROMPT_LEN + RESPONSE_LEN, moe.config.num_hidden_layers, moe.config.num_experts_per_tok)
    assert td["attention_mask"][0, PROMPT_LEN:].sum() <= 3  # the early EOS happened
    real = td["attention_mask"].bool()
    reference = _hf_full_forward_routing(moe, out)
    assert torch.equal(routing[real].long(), reference[real].long())


def test_validation_rollouts_record_no_routing(moe):
    """Validation responses are never trained on: no routing recorded, no routed_experts."""
    out = _rollout(moe).generate_sequences(_prompts(2, validate=True))
    assert "routed_experts" not in out.batch.keys()


def test_rollout_routing_refuses_a_dense_model(make_model):
    with pytest.raises(RouterReplayError, match="enable_rollout_routing_replay=False"):
        _rollout(make_model()).generate_sequences(_prompts(2))


def _actor(moe, mode: str, lr: float) -> DataParallelPPOActor:
    config = FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=8,
        ppo_epochs=3,
        use_torch_compile=False,
        router_replay=RouterReplayConfig(mode=mode),
    )
    optimizer = torch.optim.SGD(moe.parameters(), lr=lr)
    return DataParallelPPOActor(config, moe, optimizer, LogProbOptions(use_remove_padding=True))


def _training_batch(out: DataProto) -> DataProto:
    td = out.batch
    response_mask = td["attention_mask"][:, PROMPT_LEN:].clone()
    g = torch.Generator().manual_seed(0)
    td["response_mask"] = response_mask
    td["advantages"] = torch.randn(response_mask.shape, generator=g) * response_mask
    out.meta_info.update(temperature=1.0, micro_batch_size=8)
    return out


def _update_routing(moe, mode: str) -> tuple[DataProto, list[torch.Tensor]]:
    """HF rollout (recording the routing), old-log-prob pass, 3 PPO epochs over one mini-batch; returns the batch
    and the experts' ids of the 4 actor forwards (packed streams: the real tokens in row-major order)."""
    torch.manual_seed(2)
    batch = _training_batch(_rollout(moe).generate_sequences(_prompts(8)))
    actor = _actor(moe, mode, lr=20.0)  # large steps, so the native routing of later epochs moves
    observer = ExpertsObserver(moe)
    batch.batch["old_log_probs"] = actor.compute_log_prob(batch)["log_probs"]
    actor.update_policy(batch)
    observer.remove()
    return batch, observer.forwards()


def test_r3_actor_routes_like_the_hf_rollout(moe):
    """R3: the old-log-prob forward and the 3 update forwards run the experts with the routing the HF rollout
    recorded, on 100% of (token, layer) pairs of the real tokens."""
    batch, forwards = _update_routing(moe, "R3")
    real = batch.batch["attention_mask"].bool()
    recorded = batch.batch["routed_experts"][real].long()
    assert len(forwards) == 4
    for forward in forwards:
        assert torch.equal(forward, recorded)


def test_without_replay_the_actor_drifts_from_the_rollout_routing(moe):
    """Control: the same updates without replay route some (token, layer) pairs elsewhere once the weights moved."""
    batch, forwards = _update_routing(moe, "disabled")
    recorded = batch.batch["routed_experts"][batch.batch["attention_mask"].bool()].long()
    agree = (forwards[-1].sort(-1).values == recorded.sort(-1).values).all(-1).float().mean().item()
    assert agree < 1.0, "the routing never moved: the control cannot show what replay prevents"


def _mean_abs_delta(log_probs, rollout_log_probs, mask) -> float:
    return ((log_probs - rollout_log_probs).abs() * mask).sum().item() / mask.sum().item()


def test_r3_lowers_the_bf16_rollout_vs_fp32_actor_mismatch(moe, capsys):
    """bf16 rollout (a copy of the weights cast to bf16) vs the fp32 actor on the same weights: the mean |delta| of
    the sampled tokens' log-probs is lower when the actor replays the rollout's routing (R3) than when it routes
    natively, since tokens whose top-k flips between the dtypes no longer take another expert's output."""
    torch.manual_seed(3)
    engine = build_tiny_model("qwen3_5_moe", vocab_size=128)
    engine.load_state_dict(moe.state_dict())
    engine = engine.to(torch.bfloat16)
    apply_patches(engine, platform="cpu", report=False)
    batch = _training_batch(_rollout(engine, max_num_seqs=16).generate_sequences(_prompts(32)))
    mask = batch.batch["response_mask"].float()
    rollout_log_probs = batch.batch["rollout_log_probs"]
    batch.meta_info.update(micro_batch_size=32)
    native = _actor(moe, "disabled", lr=0.0).compute_log_prob(batch)["log_probs"]
    replayed = _actor(moe, "R3", lr=0.0).compute_log_prob(batch)["log_probs"]
    without_r3 = _mean_abs_delta(native, rollout_log_probs, mask)
    with_r3 = _mean_abs_delta(replayed, rollout_log_probs, mask)

    real = batch.batch["attention_mask"].bool()
    fp32_routing = _hf_full_forward_routing(moe, batch)[real].sort(-1).values
    flipped = (fp32_routing != batch.batch["routed_experts"][real].long().sort(-1).values).any(-1).float().mean()
    with capsys.disabled():
        print(
            f"\nR3 mismatch (bf16 HF rollout vs fp32 actor, {int(mask.sum())} sampled tokens, "
            f"{flipped.item():.1%} of (token, layer) pairs routed differently): mean |dlogp| without R3 "
            f"{without_r3:.6f}, with R3 {with_r3:.6f}, ratio {with_r3 / without_r3:.3f}"
        )
    assert flipped > 0, "bf16 and fp32 route alike here: the test cannot show what R3 fixes"
    assert with_r3 < without_r3

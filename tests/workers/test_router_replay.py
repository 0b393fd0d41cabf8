"""MoE router replay (R2) on the tiny Qwen3.5-MoE (HF ``Qwen3_5MoeForCausalLM`` + the project's CPU patches).

Independent observer: a pre-hook on every ``Qwen3_5MoeExperts`` module reads the ``top_k_index`` the experts are
actually run with, so "the update routes like the old-log-prob forward" is checked at the experts, not from the
replay code's own bookkeeping.
"""

import dataclasses

import pytest
import torch

from tests.workers.conftest import log_probs_of
from verl.models.tiny import build_tiny_model
from verl.models.transformers.patch_registry import apply_patches
from verl.models.transformers.router_replay import RouterReplayError, install_router_replay, moe_gates
from verl.protocol import DataProto
from verl.workers.actor.dp_actor import DataParallelPPOActor
from verl.workers.config import FSDPActorConfig, RouterReplayConfig
from verl.workers.core.model_forward import LogProbOptions, RoutingStep

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


def _log_probs(model, batch, remove_padding=True, routing=None):
    return log_probs_of(model, batch, RESPONSE_LEN, remove_padding=remove_padding, routing=routing)


def test_routing_layout_and_bytes_per_token(moe, make_batch):
    """routed_experts is (B, S, L, k) uint8 aligned with input_ids; tiny model: 4 MoE layers x top-2 = 8 B/token."""
    router = install_router_replay(moe)
    batch = make_batch(batch_size=4).batch
    out = _log_probs(moe, batch, routing=RoutingStep(router, "record"))
    assert out["routed_experts"].shape == (4, batch["input_ids"].shape[1], router.num_layers, router.top_k)
    assert out["routed_experts"].dtype == torch.uint8
    assert router.bytes_per_token == router.num_layers * router.top_k * 1 == 8
    assert router.num_layers == moe.config.num_hidden_layers


@pytest.mark.parametrize("remove_padding", [True, False], ids=["packed", "padded"])
def test_replay_of_the_own_routing_equals_the_native_forward(moe, make_batch, remove_padding):
    """Same weights: replaying the recorded routing gives the native log-probs (<= 1e-6; observed: equal), the
    experts run with the recorded ids on 100% of (token, layer) pairs; another batch's routing (rows permuted)
    changes them (control)."""
    router = install_router_replay(moe)
    batch = make_batch(batch_size=4).batch
    observer = ExpertsObserver(moe)
    native = _log_probs(moe, batch, remove_padding)["log_probs"]
    record = RoutingStep(router, "record")
    _log_probs(moe, batch, remove_padding, record)
    replayed = _log_probs(moe, batch, remove_padding, RoutingStep(router, "replay", record.recorded))
    torch.testing.assert_close(replayed["log_probs"], native, rtol=0, atol=1e-6)
    native_ids, recorded_ids, replayed_ids = observer.forwards()
    assert torch.equal(replayed_ids, recorded_ids) and torch.equal(recorded_ids, native_ids)

    other = record.recorded[torch.tensor([1, 0, 3, 2])]  # rows 0/1 and 2/3 swap their routing
    control = _log_probs(moe, batch, remove_padding, RoutingStep(router, "replay", other))["log_probs"]
    assert (control - native).abs().max() > 1e-3


def test_packed_equals_padded_with_replay(moe, make_batch):
    """The packed and padded forwards record the same routing on the real tokens and give the same log-probs when
    both replay it (<= 1e-5)."""
    router = install_router_replay(moe)
    batch = make_batch(batch_size=4).batch
    packed_rec, padded_rec = RoutingStep(router, "record"), RoutingStep(router, "record")
    _log_probs(moe, batch, True, packed_rec)
    _log_probs(moe, batch, False, padded_rec)
    real = batch["attention_mask"].bool()
    assert torch.equal(packed_rec.recorded[real], padded_rec.recorded[real])
    routing = packed_rec.recorded
    packed = _log_probs(moe, batch, True, RoutingStep(router, "replay", routing))["log_probs"]
    padded = _log_probs(moe, batch, False, RoutingStep(router, "replay", routing))["log_probs"]
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-5)


def test_replay_gradient_reaches_the_router(moe, make_batch):
    """The expert choice is forced, the routing weights come from the trained router: its weight gets a gradient."""
    router = install_router_replay(moe)
    batch = make_batch(batch_size=2).batch
    record = RoutingStep(router, "record")
    with torch.no_grad():
        _log_probs(moe, batch, True, record)
    out = _log_probs(moe, batch, True, RoutingStep(router, "replay", record.recorded))
    out["log_probs"].sum().backward()
    grads = [gate.weight.grad for gate in moe_gates(moe)]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


def test_clear_errors(moe, make_batch, make_model):
    router = install_router_replay(moe)
    batch = make_batch(batch_size=2).batch
    record = RoutingStep(router, "record")
    _log_probs(moe, batch, True, record)
    with pytest.raises(RouterReplayError, match="routed_experts has shape"):
        _log_probs(moe, batch, True, RoutingStep(router, "replay", record.recorded[:, :-1]))
    with pytest.raises(RouterReplayError, match="needs an MoE model"):
        install_router_replay(make_model())
    with pytest.raises(ValueError, match="the batch has no routed_experts"):
        RoutingStep(router, "replay", None)


# ------------------------------------------------------------------------------------------------ the actor (R2)
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


def _update_routing(moe, make_batch, mode: str) -> tuple[torch.Tensor, list[torch.Tensor], DataProto]:
    """Old-log-prob pass, then 3 PPO epochs over one mini-batch (one micro-batch each, so every forward sees the
    same packed stream); returns the experts' ids of the old pass and of the 3 update forwards."""
    actor = _actor(moe, mode, lr=20.0)  # large steps, so the native routing of later epochs moves
    batch = make_batch(batch_size=8)
    batch.meta_info.update(temperature=1.0, micro_batch_size=8)
    observer = ExpertsObserver(moe)
    out = actor.compute_log_prob(batch)
    batch.batch["old_log_probs"] = out["log_probs"]
    if "routed_experts" in out:
        batch.batch["routed_experts"] = out["routed_experts"]
    actor.update_policy(batch)
    old, *updates = observer.forwards()
    return old, updates, batch


def test_r2_update_routes_like_the_old_log_prob_forward(moe, make_batch):
    """R2: the routing recorded in compute_log_prob travels in the batch (routed_experts) and every update forward
    runs the experts with it: 100% of (token, layer) pairs, across 3 optimizer steps."""
    old, updates, batch = _update_routing(moe, make_batch, "R2")
    assert batch.batch["routed_experts"].shape[:2] == batch.batch["input_ids"].shape
    assert len(updates) == 3
    for update in updates:
        assert torch.equal(update, old)
    # replay ends with the update: the module's next forward (the rollout's, in the hybrid engine) routes natively
    # on tokens of any shape (regression: the gates kept forcing the update's routing and refused the shape)
    other = make_batch(batch_size=3, seed=1).batch
    _log_probs(moe, other)


def test_without_replay_the_update_routing_drifts(moe, make_batch):
    """Control: the same updates without replay route some (token, layer) pairs elsewhere once the weights moved."""
    old, updates, _ = _update_routing(moe, make_batch, "disabled")
    agree = (updates[-1].sort(-1).values == old.sort(-1).values).all(-1).float().mean().item()
    assert agree < 1.0, "the routing never moved: the control cannot show what replay prevents"


def test_r2_refuses_a_dense_model(make_model):
    config = FSDPActorConfig(
        strategy="fsdp2", ppo_micro_batch_size_per_gpu=1, router_replay=RouterReplayConfig(mode="R2")
    )
    with pytest.raises(RouterReplayError, match="router_replay.mode=disabled"):
        DataParallelPPOActor(dataclasses.replace(config), make_model(), None)


def test_trainer_config_refuses_what_r2_cannot_do():
    from verl.base_config import ConfigError
    from verl.trainer.config import AlgoConfig, RolloutCorrectionConfig
    from verl.trainer.config.ppo_trainer import ActorRolloutRefConfig, PPOTrainerConfig
    from verl.workers.config import HFModelConfig, RolloutConfig

    def build(actor_kwargs, corr=None):
        actor = FSDPActorConfig(router_replay=RouterReplayConfig(mode="R2"), **actor_kwargs)
        arr = ActorRolloutRefConfig(
            actor=actor, rollout=RolloutConfig(calculate_log_probs=True), model=HFModelConfig(use_remove_padding=True)
        )
        return PPOTrainerConfig(
            actor_rollout_ref=arr, algorithm=AlgoConfig(rollout_correction=corr or RolloutCorrectionConfig())
        )

    build({})
    with pytest.raises(ConfigError, match="bypass_mode"):
        build({}, RolloutCorrectionConfig.bypass_ppo_clip())
    # the FSDP engine's Ulysses SP slices the routing like the input ids (tests/workers/test_router_replay_dist.py)
    build({"ulysses_sequence_parallel_size": 2})


def test_routing_survives_dynamic_batch_size(moe, make_batch):
    """With use_dynamic_bsz (rows regrouped into token-budget micro-batches, then restored): the routing recorded
    equals the one recorded with fixed micro-batches on every real token, and replaying it (as R3's old-log-prob
    pass does) gives the native log-probs, while another row's routing does not."""
    batch = make_batch(batch_size=8)
    fixed, dynamic = batch.select(deepcopy=True), batch.select(deepcopy=True)
    fixed.meta_info.update(temperature=1.0, micro_batch_size=8)
    dynamic.meta_info.update(temperature=1.0, use_dynamic_bsz=True, max_token_len=30)
    recorder = _actor(moe, "R2", lr=0.0)
    by_fixed = recorder.compute_log_prob(fixed)
    by_dynamic = recorder.compute_log_prob(dynamic)
    real = batch.batch["attention_mask"].bool()
    assert torch.equal(by_fixed["routed_experts"][real], by_dynamic["routed_experts"][real])

    replayer = _actor(moe, "R3", lr=0.0)
    dynamic.batch["routed_experts"] = by_dynamic["routed_experts"]
    replayed = replayer.compute_log_prob(dynamic)["log_probs"]
    torch.testing.assert_close(replayed, by_fixed["log_probs"], rtol=0, atol=1e-6)
    dynamic.batch["routed_experts"] = by_dynamic["routed_experts"].roll(1, dims=0)
    assert (replayer.compute_log_prob(dynamic)["log_probs"] - by_fixed["log_probs"]).abs().max() > 1e-3

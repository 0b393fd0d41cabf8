"""Which forwards record and which replay the MoE routing (verl/workers/core/routing.py)."""

import pytest
import torch

from verl.models.transformers.router_replay import RouterReplayError
from verl.workers.config import FSDPActorConfig, FSDPRefConfig, RouterReplayConfig
from verl.workers.core.routing import ROUTED_EXPERTS, engine_routing_mode, replay_router, routing_keys


def _actor(mode: str) -> FSDPActorConfig:
    return FSDPActorConfig(router_replay=RouterReplayConfig(mode=mode))


@pytest.mark.parametrize(
    "mode, old_log_prob_pass, update",
    [
        ("disabled", (None, []), (None, [])),
        ("R2", ("record", []), ("replay", [ROUTED_EXPERTS])),  # R2 records in compute_log_prob, replays after
        ("R3", ("replay", [ROUTED_EXPERTS]), ("replay", [ROUTED_EXPERTS])),  # R3 replays the rollout's routing
    ],
)
def test_record_and_replay_per_phase(mode, old_log_prob_pass, update):
    cfg = _actor(mode)
    assert (engine_routing_mode(cfg, recording=True), routing_keys(cfg, recording=True)) == old_log_prob_pass
    assert (engine_routing_mode(cfg), routing_keys(cfg)) == update


def test_reference_config_has_no_routing_and_a_dense_model_refuses_replay(make_model):
    """The reference policy's config has no router_replay node: nothing recorded or replayed. Replay on a dense
    model (no MoE gates) raises instead of silently routing natively."""
    assert engine_routing_mode(FSDPRefConfig()) is None and routing_keys(FSDPRefConfig()) == []
    assert replay_router(_actor("disabled"), torch.nn.Linear(1, 1)) is None
    with pytest.raises(RouterReplayError, match="router replay needs an MoE model.*router_replay.mode=disabled"):
        replay_router(_actor("R2"), make_model())

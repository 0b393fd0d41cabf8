"""build_fsdp_model (verl/workers/core/fsdp_model.py): option checks that run before any model is loaded."""

import re

import pytest

from verl.workers.config import FSDPEngineConfig
from verl.workers.core.fsdp_model import build_fsdp_model


@pytest.mark.parametrize(
    "role, value_head, key",
    [
        ("actor_rollout_ref.actor", False, "actor_rollout_ref.actor.fsdp_config"),
        ("critic", True, "critic.model.fsdp_config"),
    ],
)
def test_offload_policy_with_fsdp1_is_refused_before_loading(role, value_head, key):
    """Invariant: an fsdp_config asking FSDP1 for offload_policy (an engine config bypasses the role-level check)
    raises a ValueError naming the role's full key, before the model path is even read (model_config=None)."""
    with pytest.raises(ValueError, match="^" + re.escape(f"{key}.offload_policy=True is FSDP2-only")):
        build_fsdp_model(
            None, FSDPEngineConfig(offload_policy=True), strategy="fsdp", mesh=None, value_head=value_head, role=role
        )

"""The offload rule of both worker paths (verl/workers/core/placement.py)."""

import pytest
import torch

from verl.workers.config import FSDPEngineConfig
from verl.workers.core import placement as placement_module
from verl.workers.core.placement import Placement


@pytest.mark.parametrize(
    "keys, forward_only, expected",
    [
        ({}, False, (False, False, True)),
        ({"param_offload": True, "optimizer_offload": True}, False, (True, True, True)),
        # FSDP2's CPUOffloadPolicy owns placement: the config switches manual offload off (upstream semantics) and
        # the parameters are never moved by hand
        ({"param_offload": True, "optimizer_offload": True, "offload_policy": True}, False, (False, False, False)),
        # a forward-only model is built with FSDP's own offload and has no optimizer
        ({"param_offload": True, "optimizer_offload": True}, True, (False, False, False)),
    ],
    ids=["no-offload", "manual-offload", "offload-policy", "forward-only"],
)
def test_rule_from_the_fsdp_config(keys, forward_only, expected):
    """Invariant: (param_offload, optimizer_offload, params_movable) of each fsdp_config / role combination."""
    rule = Placement.from_config(FSDPEngineConfig(**keys), forward_only=forward_only)
    assert (rule.param_offload, rule.optimizer_offload, rule.params_movable) == expected


@pytest.fixture
def moves(monkeypatch):
    """Records the fsdp_utils moves the placement makes (on the CPU they would all be no-ops)."""
    calls = []
    for name in (
        "offload_fsdp_model_to_cpu",
        "load_fsdp_model_to_gpu",
        "offload_fsdp_optimizer",
        "load_fsdp_optimizer",
    ):
        monkeypatch.setattr(placement_module, name, lambda *args, _name=name: calls.append(_name))
    return calls


def _placement(param_offload=True, optimizer_offload=True) -> Placement:
    module = torch.nn.Linear(2, 2)
    return Placement(param_offload, optimizer_offload).bind(module, torch.optim.SGD(module.parameters(), lr=0.1))


def test_on_device_loads_what_the_rule_offloads_and_offloads_it_again_even_on_error(moves):
    """Invariant: an update phase (optimizer=True) brings parameters and optimizer state and sends both back, also
    when the phase raises; a forward phase moves only the parameters."""
    placement = _placement()
    with pytest.raises(KeyError), placement.on_device(optimizer=True):
        raise KeyError("phase failed")
    loads = ["load_fsdp_model_to_gpu", "load_fsdp_optimizer"]
    assert moves == [*loads, "offload_fsdp_model_to_cpu", "offload_fsdp_optimizer"]
    moves.clear()
    with placement.on_device():
        pass
    assert moves == ["load_fsdp_model_to_gpu", "offload_fsdp_model_to_cpu"]


def test_nothing_moves_without_offload_or_when_fsdp_owns_the_parameters(moves):
    """Invariant: no offload configured → no move; params_movable=False → parameters never moved, even by an
    explicit ``to``."""
    with _placement(False, False).on_device(optimizer=True):
        pass
    fsdp_owned = _placement()
    fsdp_owned.params_movable = False
    fsdp_owned.to("cpu", model=True, optimizer=False)
    assert moves == []


def test_moving_before_the_model_is_built_raises():
    with pytest.raises(RuntimeError, match="not built yet"):
        Placement(True, True).offload()

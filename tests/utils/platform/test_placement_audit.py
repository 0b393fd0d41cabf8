"""The simulated Ascend's checkpoint device audit: state_dict / load_state_dict / torch.save see one device."""

import pytest
import torch
import torch.nn as nn

from verl.utils.platform.npu_sim.placement_audit import (
    DeviceDisciplineError,
    audit_state_dict_devices,
    saved_tensor_devices,
)

NPU0 = "npu:0"  # a torch.device only once the simulator names the backend "npu"
MIXED = "found at least two devices"


def _stepped(device: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A 2-layer model with AdamW state, on ``device``. Gradients are set by hand (no autograd: the simulated device
    joins the autograd engine only in processes where it was installed before the first backward)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def test_consistent_save_is_recorded_and_saved_on_one_device(npu_sim, tmp_path):
    """Everything on npu:0: model and optimizer state_dict pass, the audit records both calls on npu:0 only, and
    torch.save keeps the device, so the file reports npu:0 (AdamW's 0-dim CPU `step` is exempt, as in the device
    rule of real kernels)."""
    model, optimizer = _stepped("npu")
    with audit_state_dict_devices(model, optimizer, expect="npu:0") as audit:
        torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, tmp_path / "ckpt.pt")
    assert audit.events() == ["state_dict of Sequential", "state_dict of AdamW"]
    assert audit.devices() == {torch.device(NPU0)}
    assert saved_tensor_devices(tmp_path) == {"ckpt.pt": {torch.device(NPU0)}}


@pytest.mark.parametrize("left_behind, rest", [("cpu", "npu"), ("npu", "cpu")])
def test_one_parameter_on_the_other_device_raises(npu_sim, left_behind, rest):
    """A broken offload that leaves one parameter behind (on the host while the rest is on the npu, or vice versa)
    makes state_dict raise with the hardware's mixed-device wording, naming both tensors."""
    model, optimizer = _stepped(rest)
    model[1].bias.data = model[1].bias.data.to(left_behind)
    with audit_state_dict_devices(model, optimizer), pytest.raises(DeviceDisciplineError, match=MIXED) as info:
        model.state_dict()
    assert "1.bias" in str(info.value) and "0.weight" in str(info.value)


def test_state_never_reloaded_raises_against_the_expected_device(npu_sim):
    """Saving with everything still offloaded is consistent (all on the host) but violates the phase contract:
    with expect=npu:0 the audit says the offloaded state was not loaded back."""
    model, optimizer = _stepped("cpu")
    audit = audit_state_dict_devices(model, optimizer, expect="npu:0")
    with audit, pytest.raises(DeviceDisciplineError, match="expected npu:0"):
        model.state_dict()


def test_optimizer_state_left_on_host_raises_on_save_and_load(npu_sim):
    """Parameters reloaded but AdamW moments left on the host: optimizer.state_dict and load_state_dict raise."""
    model, optimizer = _stepped("npu")
    saved = optimizer.state_dict()
    for state in optimizer.state.values():
        state["exp_avg"] = state["exp_avg"].cpu()
    with audit_state_dict_devices(model, optimizer) as audit:
        model.state_dict()
        with pytest.raises(DeviceDisciplineError, match=MIXED):
            optimizer.state_dict()
        with pytest.raises(DeviceDisciplineError, match=MIXED):
            optimizer.load_state_dict(saved)
    assert audit.events() == ["state_dict of Sequential"]  # only the passing check is recorded


def test_module_load_is_audited_and_hooks_are_removed_afterwards(npu_sim):
    """load_state_dict into a mixed module raises inside the block; after the block no hook remains."""
    model, _ = _stepped("npu")
    state = {k: v.cpu() for k, v in model.state_dict().items()}  # a source on the host is fine: copy_ moves it
    with audit_state_dict_devices(model, expect="npu:0") as audit:
        model.load_state_dict(state)
        model[0].weight.data = model[0].weight.data.cpu()
        with pytest.raises(DeviceDisciplineError, match=MIXED):
            model.load_state_dict(state)
    assert audit.events() == ["load_state_dict of Sequential"]
    assert set(model.state_dict()) == set(state)  # no audit any more: the mixed module's state_dict works

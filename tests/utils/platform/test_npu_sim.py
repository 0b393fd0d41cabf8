"""The simulated Ascend behaves like a device: placement, device-mismatch errors, training, offload, checkpoints."""

import copy
import io

import pytest
import torch
import torch.nn as nn

from verl.utils.device import get_device_name, get_torch_device
from verl.utils.fsdp_utils import (
    load_fsdp_model_to_gpu,
    load_fsdp_optimizer,
    offload_fsdp_model_to_cpu,
    offload_fsdp_optimizer,
)

SAME_DEVICE = "Expected all tensors to be on the same device"


def test_placement_and_round_trip(npu_sim):
    """to("npu")/.npu()/.cpu() move values exactly and report npu:0; factories honour device="npu"."""
    x = torch.arange(6.0).view(2, 3)
    y = x.to("npu")
    assert y.device == torch.device("npu", 0) and x.npu().device.type == "npu"
    assert torch.equal(y.cpu(), x)
    assert torch.zeros(2, device="npu").device.type == "npu"
    # views, slicing and reshapes keep aliasing the device tensor
    v = y.t()[1:]  # y.t() = [[0,3],[1,4],[2,5]]; rows 1..2 alias y's columns 1 and 2
    v.mul_(10)
    assert torch.equal(y.cpu(), torch.tensor([[0.0, 10.0, 20.0], [3.0, 40.0, 50.0]]))


def test_mixing_cpu_and_npu_raises_like_hardware(npu_sim):
    """An op on an npu tensor and a non-scalar cpu tensor raises the hardware message; cpu scalars are allowed."""
    a = torch.ones(3, device="npu")
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        torch.matmul(torch.ones(2, 3, device="npu"), torch.ones(3, 2))
    assert torch.equal((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))  # 0-dim cpu tensor: allowed
    assert torch.equal(a[torch.tensor([0, 2])].cpu(), torch.ones(2))  # cpu indices: allowed, as on hardware


def test_module_with_one_parameter_left_on_cpu_fails_in_forward(npu_sim):
    """A parameter the device move missed makes the forward fail, instead of silently computing on the CPU."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to("npu")
    model[2].bias.data = model[2].bias.data.cpu()
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        model(torch.randn(3, 4, device="npu"))


def test_device_rng_is_separate_from_cpu_rng(npu_sim):
    """torch.manual_seed seeds the npu generator too; npu draws do not advance the CPU generator."""
    torch.manual_seed(7)
    a = torch.randn(4, device="npu").cpu()
    cpu_after = torch.randn(2)
    torch.manual_seed(7)
    b = torch.randn(4, device="npu").cpu()
    assert torch.equal(a, b)
    torch.manual_seed(7)
    assert torch.equal(torch.randn(2), cpu_after)  # the CPU stream did not move


def test_memory_statistics_follow_live_tensors(npu_sim):
    """memory_allocated counts live npu bytes: 1000 fp32 = 4000 bytes appear, then disappear when freed."""
    mod = get_torch_device()
    before = mod.memory_allocated()
    t = torch.empty(1000, device="npu")
    assert mod.memory_allocated() - before == 4000
    assert mod.max_memory_allocated() >= before + 4000
    del t
    assert mod.memory_allocated() == before


def test_streams_are_torch_streams_and_record_stream_is_a_no_op(npu_sim):
    """torch.npu.Stream() is a torch.Stream on npu:0 (the device's single in-order stream), so Tensor.record_stream
    accepts it as FSDP1 calls it after every reduce-scatter. It defers nothing: every kernel has finished when it
    returns and freed memory goes straight back to the host, so a recorded tensor's bytes are released at `del`
    (4000 bytes for 1000 fp32). A CPU tensor is refused, as stock torch refuses it."""
    mod = get_torch_device()
    stream = mod.Stream()
    assert isinstance(stream, torch.Stream) and stream.device == torch.device("npu", 0)
    assert stream == mod.current_stream() == mod.default_stream()
    before = mod.memory_allocated()
    t = torch.arange(1000.0, device="npu")
    t.record_stream(stream)
    assert torch.equal(t.cpu(), torch.arange(1000.0)) and mod.memory_allocated() - before == 4000
    del t
    assert mod.memory_allocated() == before
    with pytest.raises(NotImplementedError, match="record_stream"):
        torch.ones(2).record_stream(stream)


def _make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _train(model: nn.Module, device: str, offload: bool, steps: int = 3) -> tuple[nn.Module, list[float]]:
    """AdamW steps on fixed data; with offload, params and optimizer state go to cpu and back between steps."""
    torch.manual_seed(1)
    data = [(torch.randn(5, 8), torch.randn(5, 4)) for _ in range(steps)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for x, y in data:
        loss = ((model(x.to(device)) - y.to(device)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if offload:
            offload_fsdp_model_to_cpu(model)
            offload_fsdp_optimizer(optimizer)
            assert all(p.device.type == "cpu" for p in model.parameters())
            load_fsdp_model_to_gpu(model)
            load_fsdp_optimizer(optimizer)
    return model, losses


def test_training_step_with_offload_and_checkpoint_matches_cpu(npu_sim):
    """forward/backward/AdamW with param+optimizer offload and a state_dict round trip on npu equals the CPU run.

    The simulated kernels are the CPU kernels, so the results agree to fp32 round-off (1e-6 relative).
    """
    assert get_device_name() == "npu"
    cpu_model, cpu_losses = _train(_make_model(), "cpu", offload=False)
    npu_model, npu_losses = _train(_make_model().to("npu"), "npu", offload=True)
    assert all(p.device.type == "npu" for p in npu_model.parameters())
    assert npu_losses == pytest.approx(cpu_losses, rel=1e-6, abs=1e-6)

    buffer = io.BytesIO()
    torch.save(npu_model.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer)
    assert {t.device.type for t in state.values()} == {"npu"}  # saved from npu, restored on npu
    restored = copy.deepcopy(_make_model()).to("npu")
    restored.load_state_dict(state)
    for (name, p_cpu), p_npu in zip(cpu_model.named_parameters(), restored.parameters()):
        assert p_npu.device.type == "npu"
        torch.testing.assert_close(p_npu.cpu(), p_cpu, rtol=1e-5, atol=1e-6, msg=name)


def test_offload_that_forgets_optimizer_state_fails(npu_sim):
    """Reloading params but leaving AdamW state on the cpu makes optimizer.step raise (field-report item 10)."""
    model = _make_model().to("npu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 8, device="npu")).sum().backward()
    optimizer.step()
    offload_fsdp_model_to_cpu(model)
    offload_fsdp_optimizer(optimizer)
    load_fsdp_model_to_gpu(model)  # the buggy path: no load_fsdp_optimizer
    model(torch.randn(2, 8, device="npu")).sum().backward()
    with pytest.raises(RuntimeError, match="same device"):
        optimizer.step()


def test_uninstall_restores_cpu_platform(npu_sim):
    """Inside the fixture the platform is npu; torch_npu is importable as the fake module."""
    import torch_npu

    assert torch_npu.npu is torch.npu
    assert get_device_name() == "npu"


def test_without_fixture_platform_is_cpu():
    """Outside the fixture nothing of the simulation is usable: no torch_npu, no available accelerator, cpu platform,
    and a CPU optimizer step (which asks torch.accelerator) works."""
    with pytest.raises(ImportError):
        import torch_npu  # noqa: F401
    assert not torch.accelerator.is_available()
    assert not hasattr(torch, "npu") or torch.npu.device_count() == 0
    assert get_device_name() == "cpu"
    model = _make_model()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()


def test_device_count_follows_visible_devices(monkeypatch):
    """Like the runtime, the simulation sees as many devices as ASCEND_RT_VISIBLE_DEVICES lists."""
    from verl.utils.platform.npu_sim import simulated_ascend

    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2,3,5")
    with simulated_ascend():
        assert torch.npu.device_count() == 3
        assert torch.ones(1, device="npu:2").device == torch.device("npu", 2)
        with pytest.raises(RuntimeError, match="Invalid device ordinal npu:3"):
            torch.ones(1, device="npu:3")


def test_missing_compiler_is_a_clear_error(monkeypatch):
    """Without a C++ compiler the simulation says what it needs instead of failing in the middle of a build."""
    from verl.utils.platform.npu_sim import build

    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler"):
        build.library_path()

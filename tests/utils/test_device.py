"""The upstream-named device functions on a CPU-only machine, and the explicit device choice (trainer.device)."""

import types

import pytest
import torch
from omegaconf import OmegaConf

import verl.utils.device as device
from verl.utils.platform import reset_platform


@pytest.fixture(autouse=True)
def _fresh_platform(monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    reset_platform()
    yield
    reset_platform()


def test_cpu_machine_selects_cpu_platform():
    """With neither CUDA nor a loadable torch_npu the device is cpu (upstream HEAD would say cuda)."""
    assert not torch.cuda.is_available()
    assert device.get_device_name() == "cpu"
    assert device.get_nccl_backend() == "gloo"
    assert device.get_resource_name() == "CPU"
    assert device.get_device_id() == 0
    assert device.get_device_capability() == (None, None)
    assert device.is_cuda_available is False
    assert device.is_npu_available is False
    assert device.is_torch_npu_available() is False
    assert device.is_torch_npu_available(check_device=False) is False


def test_cpu_torch_module_has_accelerator_style_functions():
    """Code written against get_torch_device() (empty_cache, memory stats, seeding) runs on the CPU."""
    mod = device.get_torch_device()
    mod.empty_cache()
    mod.synchronize()
    assert mod.memory_allocated() == 0 and mod.max_memory_allocated() == 0
    free, total = mod.mem_get_info()
    assert 0 < free <= total
    assert mod.device_count() == 1 and mod.current_device() == 0
    assert mod.Stream is torch.cpu.Stream  # the real torch.cpu attributes are kept


def test_manual_seed_reproduces_cpu_random_numbers():
    """manual_seed seeds the RNG the CPU platform draws from: same seed → same numbers."""
    device.manual_seed(123)
    a = torch.rand(4)
    device.manual_seed_all(123)
    b = torch.rand(4)
    assert torch.equal(a, b)


def test_visible_devices_keyword_on_cpu_is_harmless_cuda_name():
    """Upstream workers export get_visible_devices_keyword(); on the CPU it must still be a valid env name."""
    assert device.get_visible_devices_keyword() == "CUDA_VISIBLE_DEVICES"


def test_verl_platform_env_overrides_detection(monkeypatch):
    """VERL_PLATFORM (set by the driver for worker processes) wins over detection; unknown names fail clearly."""
    monkeypatch.setenv("VERL_PLATFORM", "intel")
    assert device.get_device_name() == "cpu"
    reset_platform()
    monkeypatch.setenv("VERL_PLATFORM", "tpu")
    with pytest.raises(ValueError, match="VERL_PLATFORM"):
        device.get_device_name()


def test_validate_device_npu_without_torch_npu_names_the_fix():
    """trainer.device=npu without torch_npu/CANN: one RuntimeError naming torch_npu, the torch version and set_env.sh."""
    with pytest.raises(RuntimeError) as info:
        device.validate_device("npu")
    msg = str(info.value)
    assert "trainer.device=npu" in msg
    assert "torch_npu cannot be imported" in msg
    assert torch.__version__.split("+")[0] in msg
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in msg


def test_validate_device_cuda_and_unknown():
    """cuda on a CPU machine is a RuntimeError naming the alternatives; an unknown name is a ValueError."""
    with pytest.raises(RuntimeError, match="trainer.device=cpu"):
        device.validate_device("cuda")
    with pytest.raises(ValueError, match="one of"):
        device.validate_device("tpu")
    device.validate_device("cpu")


@pytest.mark.parametrize(
    "make",
    [
        lambda d: OmegaConf.create({"trainer": {"device": d}}),
        lambda d: types.SimpleNamespace(trainer=types.SimpleNamespace(device=d)),
    ],
)
def test_auto_set_device_default_cuda_falls_back_to_cpu(make):
    """upstream's default trainer.device=cuda follows the machine: on a CPU box it becomes cpu, written back."""
    config = make("cuda")
    assert device.auto_set_device(config) == "cpu"
    assert config.trainer.device == "cpu"
    assert device.get_device_name() == "cpu"


def test_auto_set_device_explicit_npu_fails_before_anything_is_built():
    """trainer.device=npu is explicit: without torch_npu it raises, and the platform stays unselected."""
    config = OmegaConf.create({"trainer": {"device": "npu"}})
    with pytest.raises(RuntimeError, match="torch_npu"):
        device.auto_set_device(config)
    assert config.trainer.device == "npu"


def test_auto_set_device_requires_trainer_section():
    """A config without `trainer` is a user error naming the key."""
    with pytest.raises(ValueError, match="trainer.device"):
        device.auto_set_device(OmegaConf.create({"data": {}}))


def test_importing_device_code_loads_neither_torch_npu_nor_the_simulator():
    """`import verl.utils.device` (and the NPU patch module) has no side effects: no torch_npu, no simulator."""
    import subprocess
    import sys

    code = (
        "import sys, verl.utils.device, verl.models.transformers.npu_patches; "
        "print(sorted(m for m in ('torch_npu', 'verl.utils.platform.npu_sim') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

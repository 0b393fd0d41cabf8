"""Each platform's contract values, the npu platform on the simulated Ascend, and a broken torch_npu install."""

import sys

import pytest
import torch
from omegaconf import OmegaConf

import verl.utils.device as device
from verl.utils.platform import PlatformRegistry, reset_platform, use_platform
from verl.utils.platform.npu import import_torch_npu


@pytest.fixture(autouse=True)
def _fresh_platform(monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    reset_platform()
    yield
    reset_platform()


@pytest.mark.parametrize(
    "name, backend, env, resource, options",
    [
        ("cpu", "gloo", None, "CPU", {}),
        ("cuda", "nccl", "CUDA_VISIBLE_DEVICES", "GPU", {"num_gpus": 2}),
        ("npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "NPU", {"resources": {"NPU": 2}}),
    ],
)
def test_contract_values(name, backend, env, resource, options):
    """Backend, visible-devices variable, Ray resource and Ray actor options per platform (upstream's values)."""
    platform = PlatformRegistry.create(name)
    assert (platform.device_name, platform.comm_backend) == (name, backend)
    assert platform.visible_devices_envvar == env
    assert platform.ray_resource_name == resource
    assert platform.ray_actor_options(2) == options


def test_npu_visible_devices_and_noset(monkeypatch):
    """ASCEND_RT_VISIBLE_DEVICES is parsed; Ray must be told not to rewrite it."""
    platform = PlatformRegistry.create("npu")
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4, 5,6")
    assert platform.visible_device_ids() == ["4", "5", "6"]
    assert platform.ray_noset_envvars == ("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",)
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES")
    assert platform.visible_device_ids() is None


def test_hccl_env_defaults_user_values_and_range(monkeypatch):
    """HCCL_CONNECT_TIMEOUT defaults to 1500 s, user-exported values win, out-of-range values are refused."""
    platform = PlatformRegistry.create("npu")
    for key in ("HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_HOST_SOCKET_PORT_RANGE"):
        monkeypatch.delenv(key, raising=False)
    env = platform.comm_env_vars()
    assert env["HCCL_CONNECT_TIMEOUT"] == "1500" and "HCCL_EXEC_TIMEOUT" not in env
    assert env["HCCL_HOST_SOCKET_PORT_RANGE"] == "auto"
    assert platform.comm_env_vars(exec_timeout_s=600)["HCCL_EXEC_TIMEOUT"] == "600"
    monkeypatch.setenv("HCCL_CONNECT_TIMEOUT", "3000")
    assert platform.comm_env_vars(connect_timeout_s=200)["HCCL_CONNECT_TIMEOUT"] == "3000"
    with pytest.raises(ValueError, match=r"HCCL_CONNECT_TIMEOUT must be in \[120, 7200\]"):
        platform.comm_env_vars(connect_timeout_s=60)
    assert PlatformRegistry.create("cpu").comm_env_vars() == {}


def test_npu_platform_on_simulated_ascend(npu_sim):
    """With torch_npu loadable and a device visible, detection picks npu and every adapter answers for it."""
    assert device.is_torch_npu_available() and device.is_npu_available
    assert device.get_device_name() == "npu"
    assert device.get_torch_device() is torch.npu
    assert device.get_nccl_backend() == "hccl"
    assert device.get_visible_devices_keyword() == "ASCEND_RT_VISIBLE_DEVICES"
    assert device.get_resource_name() == "NPU"
    assert device.get_device_id() == 0
    assert device.get_device_capability() == (None, None)
    device.validate_device("npu")
    device.set_expandable_segments(False)
    assert torch.npu.memory.allocator_settings[-1] == "expandable_segments:False"


def test_auto_set_device_on_npu_machine(npu_sim):
    """Upstream's default trainer.device=cuda becomes npu on an NPU machine; explicit cpu stays cpu."""
    config = OmegaConf.create({"trainer": {"device": "cuda"}})
    assert device.auto_set_device(config) == "npu" and config.trainer.device == "npu"
    config = OmegaConf.create({"trainer": {"device": "cpu"}})
    assert device.auto_set_device(config) == "cpu" and device.get_device_name() == "cpu"


def test_use_platform_restores_previous_selection(npu_sim):
    """use_platform selects inside the block only."""
    assert device.get_device_name() == "npu"
    with use_platform("cpu"):
        assert device.get_device_name() == "cpu"
    assert device.get_device_name() == "npu"


def _fork_draws(platform, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(draws inside fork_rng(seed), draws after it) on the platform's device."""
    device = platform.device() if platform.device_name != "cpu" else torch.device("cpu")
    with platform.fork_rng(seed):
        inside = torch.rand(4, device=device).cpu()
    return inside, torch.rand(4, device=device).cpu()


def test_fork_rng_seeds_inside_restores_after_and_is_device_independent(npu_sim):
    """fork_rng(seed): draws inside depend only on the seed (not on earlier draws), the generator continues after
    the block as if the block never ran, and the simulated npu draws what the CPU draws for the same seed (its
    generator has the CPU's algorithm) — what lets a simulated-npu run sample the tokens of the CPU run."""
    cpu, npu = PlatformRegistry.create("cpu"), PlatformRegistry.create("npu")
    results = {}
    for platform in (cpu, npu):
        torch.manual_seed(1)  # seeds the CPU generator and every device's
        device = platform.device() if platform.device_name != "cpu" else torch.device("cpu")
        undisturbed = torch.rand(4, device=device).cpu()
        torch.manual_seed(1)
        torch.rand(100, device=device)  # earlier draws do not change what the block draws
        results[platform.device_name] = _fork_draws(platform, seed=7)
        torch.manual_seed(1)
        inside, after = _fork_draws(platform, seed=7)
        assert torch.equal(after, undisturbed)  # the block left the generator where it was
    assert torch.equal(results["cpu"][0], results["npu"][0])
    assert torch.equal(results["cpu"][0], torch.rand(4, generator=torch.Generator().manual_seed(7)))


class _BrokenTorchNpuFinder:
    """Imitates torch_npu installed without CANN: importing it raises RuntimeError (seen via torch's autoload)."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch_npu":
            raise RuntimeError("Failed to load the backend extension: torch_npu (libhccl.so: cannot open)")
        return None


def test_torch_npu_that_raises_runtime_error_means_no_npu(monkeypatch):
    """find_spec is not enough: an import that raises RuntimeError is treated as 'no NPU', with a clear error."""
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchNpuFinder(), *sys.meta_path])
    module, error = import_torch_npu()
    assert module is None and isinstance(error, RuntimeError)
    assert not device.is_torch_npu_available(check_device=False)
    assert device.get_device_name() == "cpu"
    with pytest.raises(RuntimeError) as info:
        device.validate_device("npu")
    assert "RuntimeError: Failed to load the backend extension" in str(info.value)
    assert "set_env.sh" in str(info.value)


# ---- device decisions as Platform attributes / methods (no caller compares a device name) ----------------------


@pytest.mark.parametrize(
    "name, fla, plugin, fallback, ce_kernel, sleep_level",
    [
        # CPU: no fla kernels (importing fla with triton on a CPU-only host crashes), plain torch log-probs
        ("cpu", False, None, False, None, 2),
        # CUDA: upstream's default trainer.device, so a machine without a GPU falls back to detection
        ("cuda", True, None, True, "flash_attn", 2),
        # Ascend: vLLM needs the vllm-ascend plugin and sleeps at level 1 (vllm-ascend has no level 2)
        ("npu", True, "vllm_ascend", False, "torch_npu", 1),
    ],
)
def test_device_decision_attributes(monkeypatch, name, fla, plugin, fallback, ce_kernel, sleep_level):
    """Each family's answers to the decisions callers used to make by comparing device names."""
    monkeypatch.delenv("VERL_DISABLE_FLASH_ATTN_CE", raising=False)
    platform = PlatformRegistry.create(name)
    assert platform.fla_kernels is fla
    assert platform.vllm_platform_plugin == plugin
    assert platform.fallback_when_missing is fallback
    assert platform.cross_entropy_kernel() == ce_kernel
    assert platform.vllm_sleep_level == sleep_level


def test_cuda_flash_attn_switches(monkeypatch):
    """CUDA's defaults follow the flash-attn install; VERL_DISABLE_FLASH_ATTN_CE=1 turns its cross-entropy off."""
    import importlib.util

    import verl.utils.platform.cuda as cuda_module

    platform = PlatformRegistry.create("cuda")
    real_find_spec = importlib.util.find_spec
    for installed, attn in ((True, "flash_attention_2"), (False, "sdpa")):

        def find_spec(mod, *args, installed=installed):
            return (
                object()
                if mod == "flash_attn" and installed
                else (None if mod == "flash_attn" else real_find_spec(mod, *args))
            )

        monkeypatch.setattr(cuda_module.importlib.util, "find_spec", find_spec)
        assert platform.default_attn_implementation() == attn
    monkeypatch.setenv("VERL_DISABLE_FLASH_ATTN_CE", "1")
    assert platform.cross_entropy_kernel() is None
    monkeypatch.setenv("VERL_DISABLE_FLASH_ATTN_CE", "0")
    assert platform.cross_entropy_kernel() == "flash_attn"


def test_default_attention_and_ipc_on_cpu_and_npu(monkeypatch):
    """CPU: sdpa and IPC; NPU: flash_attention_2 (torch_npu's fused attention), IPC only from driver 25.3.rc1 and
    CANN 8.3.rc1 on (upstream's rule)."""
    import verl.utils.platform.npu as npu_module

    cpu, npu = PlatformRegistry.create("cpu"), PlatformRegistry.create("npu")
    assert cpu.default_attn_implementation() == "sdpa" and cpu.supports_ipc()
    assert npu.default_attn_implementation() == "flash_attention_2"
    monkeypatch.setattr(npu_module, "get_npu_versions", lambda: ("25.3.rc1", "8.3.RC1"))
    assert npu.supports_ipc()
    monkeypatch.setattr(npu_module, "get_npu_versions", lambda: ("25.2.0", "8.5.0"))
    assert not npu.supports_ipc()


def test_platform_of_device_type_follows_the_tensor(npu_sim):
    """Kernel choices follow the tensor's device: on the simulated Ascend an npu tensor gets the selected npu
    platform object, a CPU tensor the CPU platform, a meta tensor none (portable path)."""
    from verl.utils.platform import get_platform, platform_of_device_type

    assert platform_of_device_type(torch.zeros(1, device="npu").device.type) is get_platform()
    assert platform_of_device_type("cpu").device_name == "cpu"
    assert platform_of_device_type("meta") is None
    assert device.is_support_ipc() == get_platform().supports_ipc()


def test_vllm_plugin_requirement_names_the_plugin(monkeypatch):
    """require_vllm on npu without vllm_ascend raises naming the plugin; cpu/cuda need no plugin."""
    import importlib
    import types

    from verl.utils.vllm import utils as vllm_utils

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm_ascend", None)  # find_spec raises ValueError for a None entry
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        vllm_utils.importlib.util,
        "find_spec",
        lambda mod, *a: None if mod == "vllm_ascend" else real_find_spec(mod, *a),
    )
    assert vllm_utils.require_vllm("cpu") is sys.modules["vllm"]
    assert vllm_utils.require_vllm("cuda") is sys.modules["vllm"]
    with pytest.raises(
        ImportError, match=r"trainer.device=npu needs the vllm-ascend platform plugin \(module `vllm_ascend`\)"
    ):
        vllm_utils.require_vllm("npu")


def test_resolve_device_falls_back_only_for_the_default_family(monkeypatch):
    """trainer.device=cuda on a machine without CUDA follows detection; trainer.device=npu there stays npu (and
    validate_device then fails with the install hint)."""
    monkeypatch.setattr(PlatformRegistry._classes["cuda"], "is_available", lambda self: False)
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert device._resolve_device("cuda") == "cpu"
    assert device._resolve_device("npu") == "npu"

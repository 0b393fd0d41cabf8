"""Ascend NPU platform: ``torch.npu`` (registered by ``torch_npu``), hccl, ``ASCEND_RT_VISIBLE_DEVICES``, Ray ``NPU``.

``torch_npu`` is imported only when the NPU platform is asked a question, never at module import. Installed
without CANN it raises ``ImportError: libhccl.so ...`` on import (and ``RuntimeError: Failed to load the backend
extension`` from ``import torch`` when torch auto-loads it), and ``importlib.util.find_spec`` still finds it, so
the import itself is tried and both exception types mean "no NPU here".
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import torch

from verl.utils.platform.base import Platform
from verl.utils.platform.cann import SET_ENV_HINT, check_ipc_version_support, get_cann_version, get_npu_versions

logger = logging.getLogger(__name__)

HCCL_CONNECT_TIMEOUT_RANGE_S = (120, 7200)  # documented range of HCCL_CONNECT_TIMEOUT
DEFAULT_HCCL_CONNECT_TIMEOUT_S = 1500


_import_failure: BaseException | None = None


def import_torch_npu() -> tuple[Any, BaseException | None]:
    """(torch_npu module, None) on success, (None, the error) when it is missing or cannot load.

    A failure is remembered (upstream code reads ``is_npu_available`` in hot paths; a failed import rescans the
    filesystem every time) until :func:`forget_torch_npu_import` — called by ``reset_platform()``.
    """
    global _import_failure
    loaded = sys.modules.get("torch_npu")
    if loaded is not None:
        return loaded, None
    if _import_failure is not None:
        return None, _import_failure
    try:
        return importlib.import_module("torch_npu"), None
    except (ImportError, RuntimeError, OSError) as e:  # OSError: a CANN .so found but unloadable
        _import_failure = e
        return None, e


def forget_torch_npu_import() -> None:
    """Try the import again next time (after installing torch_npu, or a simulator, in this process)."""
    global _import_failure
    _import_failure = None


def _torch_npu_version(module: Any) -> str:
    return str(getattr(module, "__version__", "unknown"))


def _install_hint() -> str:
    base = torch.__version__.split("+")[0]
    return (
        f"install torch_npu built for torch {base} (`pip install torch-npu=={base}` or the .postN wheel for your "
        f"CANN) and load the CANN environment with `{SET_ENV_HINT}`"
    )


class NpuPlatform(Platform):
    device_name = "npu"
    vendor = "huawei"
    comm_backend = "hccl"
    visible_devices_envvar = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource_name = "NPU"
    vllm_sleep_level = 1  # vllm-ascend implements level 1 only
    profiler_activity = "PrivateUse1"
    # without torch_npu's fused attention (npu-fusion-attention patch skipped), the portable blocked kernel
    long_segment_attention = "chunked"
    ray_noset_envvars = ("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",)
    fla_kernels = True  # fla ships triton-ascend kernels
    vllm_platform_plugin = "vllm_ascend"

    def is_torch_npu_importable(self) -> bool:
        return import_torch_npu()[0] is not None

    def is_available(self) -> bool:
        module, _ = import_torch_npu()
        if module is None or not hasattr(torch, "npu"):
            return False
        try:
            return bool(torch.npu.is_available())
        except RuntimeError:  # driver present but broken
            return False

    def missing_reason(self) -> str | None:
        module, error = import_torch_npu()
        cann = get_cann_version()
        cann_text = f"CANN {cann} detected" if cann is not None else "no CANN toolkit detected"
        if module is None:
            return (
                f"torch_npu cannot be imported ({type(error).__name__}: {error}); {cann_text}. Fix: {_install_hint()}."
            )
        if not hasattr(torch, "npu"):
            return f"torch_npu {_torch_npu_version(module)} imported but did not register torch.npu; {_install_hint()}"
        if not self.is_available():
            visible = os.environ.get(self.visible_devices_envvar, "<unset>")
            return (
                f"torch_npu {_torch_npu_version(module)} imported ({cann_text}) but torch.npu.is_available() is "
                f"False: check `npu-smi info`, the Ascend driver, and ASCEND_RT_VISIBLE_DEVICES={visible}"
            )
        return None

    def torch_module(self) -> Any:
        module, error = import_torch_npu()
        if module is None or not hasattr(torch, "npu"):
            raise RuntimeError(self.missing_reason() or "torch.npu is unavailable") from error
        return torch.npu

    def default_attn_implementation(self) -> str:
        # transformers routes flash_attention_2 to torch_npu's fused attention on Ascend
        return "flash_attention_2"

    def cross_entropy_kernel(self) -> str | None:
        return "torch_npu"

    def supports_ipc(self) -> bool:
        # IPC weight sharing needs Ascend driver >= 25.3.rc1 and CANN >= 8.3.rc1
        return check_ipc_version_support(*get_npu_versions())

    def set_expandable_segments(self, enable: bool) -> None:
        memory = getattr(self.torch_module(), "memory", None)
        setter = getattr(memory, "_set_allocator_settings", None)
        if setter is None:  # torch_npu older than the setting: PYTORCH_NPU_ALLOC_CONF at launch still works
            logger.warning(
                "this torch_npu cannot change expandable_segments at run time; export "
                "PYTORCH_NPU_ALLOC_CONF=expandable_segments:%s before launch instead",
                enable,
            )
            return
        setter(f"expandable_segments:{enable}")

    def comm_env_vars(self, connect_timeout_s: int | None = None, exec_timeout_s: int | None = None) -> dict[str, str]:
        """HCCL settings for worker processes; values already exported by the user are kept.

        Args:
            connect_timeout_s: ``HCCL_CONNECT_TIMEOUT`` (link set-up), 120–7200 s per the HCCL docs; None means
                1500 s, upstream's Ascend scripts' value (large models take minutes before the first collective).
            exec_timeout_s: ``HCCL_EXEC_TIMEOUT`` (one collective); None leaves the HCCL default.
        """
        if connect_timeout_s is None:
            connect_timeout_s = DEFAULT_HCCL_CONNECT_TIMEOUT_S
        low, high = HCCL_CONNECT_TIMEOUT_RANGE_S
        if not low <= connect_timeout_s <= high:
            raise ValueError(f"HCCL_CONNECT_TIMEOUT must be in [{low}, {high}] s, got {connect_timeout_s}")
        wanted = {
            "HCCL_CONNECT_TIMEOUT": str(connect_timeout_s),
            "HCCL_HOST_SOCKET_PORT_RANGE": "auto",
            "HCCL_NPU_SOCKET_PORT_RANGE": "auto",
        }
        if exec_timeout_s is not None:
            if exec_timeout_s < 0:
                raise ValueError(f"HCCL_EXEC_TIMEOUT must be >= 0 s, got {exec_timeout_s}")
            wanted["HCCL_EXEC_TIMEOUT"] = str(exec_timeout_s)
        return {k: os.environ.get(k, v) for k, v in wanted.items()}

    def rollout_env_vars(self) -> dict[str, str]:
        # vLLM-Ascend: no CUDA-style cumem allocator, no quantisation probing of plain checkpoints.
        return {"NCCL_CUMEM_ENABLE": "0", "VLLM_ASCEND_AUTO_DETECT_QUANTIZATION": "0"}

"""A stand-in ``veomni`` package for CPU tests of the VeOmni engine's wiring.

The real VeOmni (0.1.12) installs and builds its Qwen3.5-MoE model on a CPU, but its packed forward stops in the
Gated DeltaNet, whose varlen kernels exist only in Triton (docs/veomni.md). The fake provides
the entry points the engine calls, with the keyword names of a recent release, and records what each received:

* ``veomni.distributed.parallel_state.init_parallel_state`` records its sizes;
* ``veomni.models.auto.build_foundation_model`` loads the checkpoint with HF ``from_pretrained`` in fp32;
* ``veomni.distributed.torch_parallelize.build_parallelize_model`` shards with this repo's FSDP2 adapter over all
  ranks (fp32), as VeOmni's FSDP2 full shard does;
* ``veomni.arguments`` holds ``OpsImplementationConfig`` (keeps its kwargs) and ``MixedPrecisionConfig``.

It proves the arguments and that the engine computes through the shared core; it says nothing about VeOmni's own
kernels, Ulysses or expert parallelism, and a result against it is not a VeOmni result.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

__all__ = ["VeOmniCalls", "install_fake_veomni"]

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}


class VeOmniCalls:
    """``calls[name]`` = the keyword arguments of the last call of entry point ``name``."""

    def __init__(self) -> None:
        self.calls: dict[str, dict[str, Any]] = {}


def _modules(recorder: VeOmniCalls) -> dict[str, Any]:
    def init_parallel_state(dp_size=1, dp_replicate_size=1, dp_shard_size=1, ulysses_size=1, dp_mode="fsdp2",
                            device_type=None, extra_parallel_sizes=(), extra_parallel_names=()):  # fmt: skip
        recorder.calls["init_parallel_state"] = dict(locals())

    class OpsImplementationConfig:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class MixedPrecisionConfig:
        def __init__(self, enable=True):
            self.enable = enable

    def build_foundation_model(config_path, weights_path, torch_dtype="bfloat16", init_device="meta",
                               ops_implementation=None, force_use_huggingface=False):  # fmt: skip
        from transformers import AutoModelForCausalLM

        recorder.calls["build_foundation_model"] = dict(locals())
        return AutoModelForCausalLM.from_pretrained(weights_path, dtype=torch.float32)

    def build_parallelize_model(model, weights_path=None, enable_reshard_after_forward=True, mixed_precision=None,
                                enable_gradient_checkpointing=True, basic_modules=None, **kwargs):  # fmt: skip
        import torch.distributed as dist

        from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter

        recorder.calls["build_parallelize_model"] = dict(locals(), **kwargs)
        mesh = create_device_mesh(dist.get_world_size(), -1)
        return get_fsdp_adapter("fsdp2").wrap(model, mesh=mesh, dtypes=_FP32, wrap_policy=None)

    return {
        "veomni": types.ModuleType("veomni"),
        "veomni.distributed": types.ModuleType("veomni.distributed"),
        "veomni.distributed.parallel_state": types.SimpleNamespace(init_parallel_state=init_parallel_state),
        "veomni.distributed.torch_parallelize": types.SimpleNamespace(build_parallelize_model=build_parallelize_model),
        "veomni.arguments": types.SimpleNamespace(
            OpsImplementationConfig=OpsImplementationConfig, MixedPrecisionConfig=MixedPrecisionConfig
        ),
        "veomni.models": types.ModuleType("veomni.models"),
        "veomni.models.auto": types.SimpleNamespace(build_foundation_model=build_foundation_model),
    }


def install_fake_veomni(monkeypatch: Any) -> VeOmniCalls:
    """Put the fake ``veomni`` modules into ``sys.modules`` through pytest's ``monkeypatch`` (undone after the
    test); returns the recorder of the entry points' arguments."""
    recorder = VeOmniCalls()
    for name, module in _modules(recorder).items():
        monkeypatch.setitem(sys.modules, name, module)
    return recorder

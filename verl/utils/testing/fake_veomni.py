"""A stand-in ``veomni`` package for CPU tests of the VeOmni engine's wiring.

The real VeOmni (0.1.12) installs and builds its Qwen3.5-MoE model on a CPU, but its packed forward stops in the
Gated DeltaNet, whose varlen kernels exist only in Triton (docs/veomni.md). The fake provides
the entry points the engine calls, with the keyword names of a recent release, and records what each received:

* ``veomni.distributed.parallel_state.init_parallel_state`` records its sizes and, for ``ulysses_size > 1``, builds
  a ``(dp, ulysses)`` device mesh (ulysses innermost, as VeOmni's); ``get_parallel_state`` returns that state;
* ``veomni.models.auto.build_foundation_model`` loads the checkpoint with HF ``from_pretrained`` in fp32;
* ``veomni.distributed.torch_parallelize.build_parallelize_model`` shards with this repo's FSDP2 adapter over all
  ranks (fp32), as VeOmni's FSDP2 full shard does;
* ``veomni.arguments`` holds ``OpsImplementationConfig`` (keeps its kwargs) and ``MixedPrecisionConfig``;
* ``veomni.data.data_collator.SequenceParallelCollator`` pads a packed row to a multiple of SP, computes the
  boundaries of the whole padded stream and keeps this rank's slice (the contract of VeOmni's collator, written
  here from its documented behaviour); ``veomni.distributed.sequence_parallel.gather_outputs`` all-gathers and
  unpads. Both record the shapes they saw in ``VeOmniCalls.sp_events``.

It proves the arguments, the SP shapes each rank feeds the model and that the engine computes through the shared
core; it says nothing about VeOmni's own kernels, Ulysses attention (the fake's HF model has no all-to-all, so its
SP > 1 numbers are not those of any model) or expert parallelism, and a result against it is not a VeOmni result.
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
        self.sp_events: list[tuple[str, dict[str, Any]]] = []
        self.state: Any = None


class _FakeParallelState:
    """The attributes of VeOmni's ``ParallelState`` the engine reads (dp/sp sizes, ranks and groups)."""

    def __init__(self, dp_size: int, ulysses_size: int, device_type: str | None) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        self.sp_size, self.sp_rank, self.dp_rank = ulysses_size, -1, dist.get_rank()
        self.dp_group = self.sp_group = None
        if ulysses_size > 1:
            mesh = init_device_mesh(device_type or "cpu", (dp_size, ulysses_size), mesh_dim_names=("dp", "ulysses"))
            self.dp_group, self.sp_group = mesh["dp"].get_group(), mesh["ulysses"].get_group()
            self.sp_rank, self.dp_rank = mesh.get_local_rank("ulysses"), mesh.get_local_rank("dp")


def _fake_collator(recorder: VeOmniCalls):
    """``SequenceParallelCollator``: pad (token 0, position 0) to a multiple of SP, boundaries of the whole padded
    stream from its position restarts, then this rank's contiguous slice of ids and positions (dim -1)."""

    class SequenceParallelCollator:
        def __init__(self, seq_classification: bool = False) -> None:
            self.seq_classification = seq_classification
            self.sp_size, self.sp_rank = recorder.state.sp_size, recorder.state.sp_rank

        def __call__(self, batch: dict) -> dict:
            ids, pos = batch["input_ids"], batch["position_ids"]
            total = ids.shape[-1]
            pad = -total % self.sp_size
            ids = torch.cat([ids, ids.new_zeros(*ids.shape[:-1], pad)], dim=-1)
            pos = torch.cat([pos, pos.new_zeros(*pos.shape[:-1], pad)], dim=-1)
            text = pos[0, 0] if pos.dim() == 3 else pos[0]
            starts = torch.nonzero(text == 0).flatten()
            cu = torch.cat([starts, starts.new_tensor([text.numel()])]).to(torch.int32)
            chunk = ids.shape[-1] // self.sp_size
            mine = slice(self.sp_rank * chunk, (self.sp_rank + 1) * chunk)
            out = dict(
                input_ids=ids[..., mine],
                position_ids=pos[..., mine],
                cu_seq_lens_q=cu,
                cu_seq_lens_k=cu,
                max_length_q=int(torch.diff(cu).max()),
                max_length_k=int(torch.diff(cu).max()),
                linear_attn_cu_seq_lens_q=cu,
            )
            recorder.sp_events.append(
                (
                    "collate",
                    {
                        "tokens": total,
                        "input_ids": tuple(out["input_ids"].shape),
                        "position_ids": tuple(out["position_ids"].shape),
                        "cu_seq_lens_q": cu.tolist(),
                    },
                )
            )
            return out

    return SequenceParallelCollator


def _fake_gather_outputs(recorder: VeOmniCalls):
    def gather_outputs(x, gather_dim, padding_dim=None, unpad_dim_size=None, scale_grad=False, group=None):
        import torch.distributed.nn.functional as dist_fn

        full = torch.cat(dist_fn.all_gather(x.contiguous(), group=group), dim=gather_dim)
        if padding_dim is not None:
            full = full.narrow(padding_dim, 0, unpad_dim_size)
        recorder.sp_events.append(("gather", {"local": tuple(x.shape), "full": tuple(full.shape)}))
        return full

    return gather_outputs


def _modules(recorder: VeOmniCalls) -> dict[str, Any]:
    def init_parallel_state(
        dp_size=1,
        dp_replicate_size=1,
        dp_shard_size=1,
        ulysses_size=1,
        dp_mode="fsdp2",
        device_type=None,
        extra_parallel_sizes=(),
        extra_parallel_names=(),
    ):
        recorder.calls["init_parallel_state"] = dict(locals())
        recorder.state = _FakeParallelState(dp_size, ulysses_size, device_type)
        return recorder.state

    class OpsImplementationConfig:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class MixedPrecisionConfig:
        def __init__(self, enable=True):
            self.enable = enable

    def build_foundation_model(
        config_path,
        weights_path,
        torch_dtype="bfloat16",
        init_device="meta",
        ops_implementation=None,
        force_use_huggingface=False,
    ):
        from transformers import AutoModelForCausalLM

        recorder.calls["build_foundation_model"] = dict(locals())
        return AutoModelForCausalLM.from_pretrained(weights_path, dtype=torch.float32)

    def build_parallelize_model(
        model,
        weights_path=None,
        enable_reshard_after_forward=True,
        mixed_precision=None,
        enable_gradient_checkpointing=True,
        basic_modules=None,
        **kwargs,
    ):
        import torch.distributed as dist

        from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter

        recorder.calls["build_parallelize_model"] = dict(locals(), **kwargs)
        mesh = create_device_mesh(dist.get_world_size(), -1)
        return get_fsdp_adapter("fsdp2").wrap(model, mesh=mesh, dtypes=_FP32, wrap_policy=None)

    return {
        "veomni": types.ModuleType("veomni"),
        "veomni.distributed": types.ModuleType("veomni.distributed"),
        "veomni.distributed.parallel_state": types.SimpleNamespace(
            init_parallel_state=init_parallel_state, get_parallel_state=lambda: recorder.state
        ),
        "veomni.distributed.sequence_parallel": types.SimpleNamespace(gather_outputs=_fake_gather_outputs(recorder)),
        "veomni.data": types.ModuleType("veomni.data"),
        "veomni.data.data_collator": types.SimpleNamespace(SequenceParallelCollator=_fake_collator(recorder)),
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

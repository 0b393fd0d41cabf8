"""Prove that every applied model patch is on the call path of the model as it will run.

"Applied" used to mean "the patch function returned". transformers 5.25 showed why that is not enough: its
``model.train()`` re-dispatches layer forwards through the hub-kernel layer and dropped the project's Gated
DeltaNet forward, while the start-up report still said *applied* and the run died at the first update (or, with fla
installed, would have trained on leaked recurrent states). So after patching, the model is *run*:

* the patched code calls :func:`record_call` with the patch's probe key whenever it executes (a context-variable
  read when no probe is running: nothing measurable on a training step);
* :func:`probe_patches` runs a tiny packed batch (two sequences, 3 + 2 tokens; for a vision-language model a second
  batch with a one-token image) through :func:`~verl.models.transformers.packed_forward.forward_packed` — the call
  the trainer makes — once in ``train()`` and once in ``eval()`` mode, without gradients, and then restores the mode;
* a patch whose code never ran with the packed boundaries in *both* modes is reported ``not on the call path``,
  with what was seen. A required patch then stops the run (:mod:`verl.models.transformers.patch_registry`).

The workers probe the model after FSDP wrapping, on the training device (every rank takes part, the forward
all-gathers like a training forward), so the check covers the model exactly as the worker built it; a plain
:func:`~verl.models.transformers.patch_registry.apply_patches` probes the unwrapped model where it is.
Gradient-checkpoint recomputation is not exercised by the probe (it runs without gradients); the Qwen3.5 tests cover
it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.nn as nn

__all__ = ["ProbeCalls", "probe_inputs", "record_call", "run_probe"]


@dataclass
class ProbeCalls:
    """What one probe saw: key -> number of good calls, the reasons of bad ones, and per mode (``"train"`` /
    ``"eval"``) the exception a probe forward raised, if any."""

    good: dict[str, int] = field(default_factory=dict)
    bad: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)

    def merge(self, other: ProbeCalls) -> None:
        for key, count in other.good.items():
            self.good[key] = self.good.get(key, 0) + count
        for key, reasons in other.bad.items():
            self.bad.setdefault(key, []).extend(reasons)
        for mode, error in other.errors.items():
            self.errors.setdefault(mode, error)


_ACTIVE: ContextVar[ProbeCalls | None] = ContextVar("verl_patch_probe", default=None)


def record_call(key: str, *, ok: bool = True, why: str = "") -> None:
    """Called by patched code each time it runs; records only while a probe runs.

    ``ok=False`` reports that the code ran but without what makes it correct (e.g. the packed boundaries), ``why``
    says what was missing.
    """
    calls = _ACTIVE.get()
    if calls is None:
        return
    if ok:
        calls.good[key] = calls.good.get(key, 0) + 1
    else:
        calls.bad.setdefault(key, []).append(why)


@contextmanager
def _recording() -> Iterator[ProbeCalls]:
    calls = ProbeCalls()
    token = _ACTIVE.set(calls)
    try:
        yield calls
    finally:
        _ACTIVE.reset(token)


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _token_ids(config, count: int, device: torch.device) -> torch.Tensor:
    """``count`` ordinary token ids: small ids below every special id of the config (image/video/vision markers)."""
    vocab = _text_config(config).vocab_size
    special = [getattr(config, n, None) for n in ("image_token_id", "video_token_id", "vision_start_token_id")]
    limit = min([vocab] + [s for s in special if isinstance(s, int)])
    return (torch.arange(count, device=device) * 7 + 1) % max(limit - 1, 1) + 1


def probe_inputs(model: nn.Module, device: torch.device) -> list[tuple[object, dict]]:
    """The probe batches of ``model`` (unwrapped HF model) on ``device``: ``[(PackedBatch, multimodal kwargs)]``.

    A text batch of two sequences (3 and 2 tokens); for a model with a vision tower, position ids in the 4-row
    M-RoPE form and a second batch whose first sequence holds one image of ``merge x merge`` patches (one token).
    """
    from verl.utils.model import find_vision_tower
    from verl.utils.packing import pack_padded_batch, pack_values

    config = model.config
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]], device=device)
    ids = torch.zeros_like(mask)
    ids[mask.bool()] = _token_ids(config, 5, device)
    if find_vision_tower(model) is None:
        return [(pack_padded_batch(ids, mask), {})]
    from verl.utils.rope_utils import get_packed_mrope_position_ids

    vision = config.vision_config
    merge = vision.spatial_merge_size
    text = pack_padded_batch(ids, mask, get_packed_mrope_position_ids(torch.zeros_like(mask), mask))
    image_ids = ids.clone()
    image_ids[0, 1] = config.image_token_id  # sequence 0: text, image, text
    types = (image_ids == config.image_token_id).long() * mask
    grid = torch.tensor([[1, merge, merge]], device=device)
    patch_values = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = torch.linspace(-1, 1, merge * merge * patch_values, device=device).reshape(merge * merge, patch_values)
    positions = get_packed_mrope_position_ids(types, mask, grid, spatial_merge_size=merge)
    image = pack_padded_batch(image_ids, mask, positions)
    extra = dict(
        pixel_values=pixels.to(next(model.parameters()).dtype),
        image_grid_thw=grid,
        mm_token_type_ids=pack_values(types, image),
    )
    return [(text, {}), (image, extra)]


def run_probe(model: nn.Module, device: torch.device) -> ProbeCalls:
    """Run the probe batches through ``model`` (possibly FSDP-wrapped) in train and eval mode; what was recorded.

    A forward that raises is recorded (``ProbeCalls.errors``), not propagated: the caller reports which patches ran
    before it. The model's mode is restored; no gradients are computed; the host RNG is left as it was.
    """
    from verl.models.transformers.packed_forward import _unwrap, forward_packed

    calls = ProbeCalls()
    batches = probe_inputs(_unwrap(model), device)
    was_training = model.training
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for training in (True, False):
                model.train(training)
                for packed, extra in batches:
                    with _recording() as seen:
                        try:
                            forward_packed(model, packed, return_hidden=True, **extra)
                        except Exception as error:  # reported with the patch statuses by the caller
                            seen.errors["train" if training else "eval"] = error
                    calls.merge(_mode_calls(seen, training))
    finally:
        model.train(was_training)
    return calls


def _mode_calls(seen: ProbeCalls, training: bool) -> ProbeCalls:
    # keys are suffixed with the mode, so "ran in both modes" can be checked by the caller
    suffix = "@train" if training else "@eval"
    return ProbeCalls(
        good={k + suffix: v for k, v in seen.good.items()},
        bad={k + suffix: v for k, v in seen.bad.items()},
        errors=seen.errors,
    )


def missing_reason(calls: ProbeCalls, key: str) -> str | None:
    """None when the code recorded under ``key`` ran correctly in both modes, else what went wrong (per mode)."""
    problems: dict[str, list[str]] = {}
    for mode in ("train", "eval"):
        mode_key = f"{key}@{mode}"
        if calls.good.get(mode_key):
            continue
        bad, error = calls.bad.get(mode_key), calls.errors.get(mode)
        if bad:
            problem = f"it ran {bad[0]}"
        elif error is not None:
            problem = f"the model raised before it ran ({type(error).__name__}: {_short(str(error))})"
        else:
            problem = "its code never ran"
        problems.setdefault(problem, []).append(f"{mode}()")
    return "; ".join(f"in {' and '.join(modes)} {problem}" for problem, modes in problems.items()) or None


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

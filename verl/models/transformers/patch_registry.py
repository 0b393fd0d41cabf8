"""The model patch registry: explicit, scoped, reported (docs/design.md "Model patches", field-report item 7).

A *patch* changes one model instance that the caller is building — never a class, never at import time. The
registry maps ``(model_type, platform)`` to patch objects. ``apply_patches(model, ...)`` applies every patch that
matches, each in isolation:

* a patch whose preconditions do not hold (target class missing in the installed transformers, transformers
  version outside its range, CANN too old, ...) raises :class:`PatchSkipped` and is reported as *skipped: reason*;
* an *optional* patch (a speed-up such as a fused NPU kernel) that raises anything else is reported as *failed*
  with the error, and the other patches still apply;
* a *required* patch (one without which training is silently wrong, e.g. varlen Gated DeltaNet) re-raises, because
  continuing would train on the wrong function.

*Applied* means *proven on the call path*: every built-in patch declares a ``probe_key`` that its code records when
it runs, and :func:`probe_patches` runs a tiny packed batch through the model in ``train()`` and ``eval()`` mode
(:mod:`verl.models.transformers.patch_probe`). A patch whose code did not run is reported ``not on the call path``
(a new transformers release routing around it, as 5.25's hub-kernel layer did); a required one stops the run,
naming the transformers version. :func:`apply_patches` probes the model where it is; the workers apply with
``probe=False`` and probe the wrapped model on the training device (``probe_patches``), then print the report.

The statuses are stored on the model (``get_patch_status(model)``) and printed once, one line per patch
(``format_patch_report``), so nobody greps logs to learn whether a patch took effect.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

logger = logging.getLogger(__name__)

_STATUS_ATTR = "_verl_patch_status"
APPLIED, SKIPPED, FAILED, NOT_ON_CALL_PATH = "applied", "skipped", "failed", "not on the call path"
ALL_PLATFORMS = ("cpu", "cuda", "npu")

# Modules that register built-in patches. They are imported on the first `apply_patches` call, never by
# `import verl`; importing them only registers objects, it patches nothing.
_BUILTIN_PATCH_MODULES = (
    "verl.models.transformers.qwen3_5",
    "verl.models.transformers.npu_patches",
    "verl.models.transformers.varlen_attention_patches",  # after npu_patches: a fused NPU attention takes precedence
)


class PatchSkipped(Exception):
    """Raised by a patch's ``apply`` when it does not apply here; the message is the reason shown to the user."""


@dataclass(frozen=True)
class ModelPatch:
    """One scoped change to a model instance.

    Attributes:
        name: unique, short, kebab-case (``"qwen3_5-varlen-gdn"``), shown in the start-up report.
        model_types: HF ``config.model_type`` values it targets (``"qwen3_5_moe"``; text sub-configs such as
            ``"qwen3_5_moe_text"`` match their parent type automatically).
        platforms: subset of ``("cpu", "cuda", "npu")``.
        apply: ``apply(model) -> None``; changes ``model`` in place, raises ``PatchSkipped(reason)`` when it
            does not apply.
        required: True when training is wrong without it; a failure then aborts instead of being isolated.
        transformers: PEP 440 range of transformers versions the patch was written and tested for.
        description: one line for the report.
        probe_key: what the patched code passes to :func:`verl.models.transformers.patch_probe.record_call` when it
            runs; None for a patch that cannot be probed (then its report says so). Every built-in patch has one.
    """

    name: str
    model_types: tuple[str, ...]
    platforms: tuple[str, ...]
    apply: Callable[[nn.Module], None]
    required: bool = False
    transformers: str = ">=5.4.0"
    description: str = ""
    probe_key: str | None = None

    def __post_init__(self):
        unknown = set(self.platforms) - set(ALL_PLATFORMS)
        if unknown:
            raise ValueError(f"patch {self.name!r}: unknown platforms {sorted(unknown)}; valid: {ALL_PLATFORMS}")
        try:
            SpecifierSet(self.transformers)
        except InvalidSpecifier as e:
            raise ValueError(f"patch {self.name!r}: invalid transformers range {self.transformers!r}") from e


@dataclass(frozen=True)
class PatchStatus:
    """Outcome of one patch on one model. ``probed``: its code was seen on the call path (``applied`` only)."""

    name: str
    state: str  # APPLIED | SKIPPED | FAILED | NOT_ON_CALL_PATH
    reason: str = ""
    required: bool = False
    probe_key: str | None = None
    probed: bool = False

    def line(self) -> str:
        state = self.state
        if state == APPLIED and not self.probed:
            state = "applied (call path not probed)"
        tail = f": {self.reason}" if self.reason else ""
        return f"[verl patch] {self.name:<36} {state}{tail}"


@dataclass
class PatchRegistry:
    patches: dict[str, ModelPatch] = field(default_factory=dict)

    def register(self, patch: ModelPatch) -> ModelPatch:
        existing = self.patches.get(patch.name)
        if existing is not None and existing is not patch:
            raise ValueError(f"a different patch is already registered as {patch.name!r}")
        self.patches[patch.name] = patch
        return patch

    def matching(self, model_type: str, platform: str) -> list[ModelPatch]:
        types = _model_type_family(model_type)
        return [p for p in self.patches.values() if platform in p.platforms and types & set(p.model_types)]


PATCH_REGISTRY = PatchRegistry()


def register_patch(patch: ModelPatch) -> ModelPatch:
    """Register a patch in the global registry (done by the patch modules when imported)."""
    return PATCH_REGISTRY.register(patch)


def _model_type_family(model_type: str) -> set[str]:
    # "qwen3_5_moe_text" is the text sub-config of "qwen3_5_moe": a patch for one applies to the other.
    family = {model_type}
    for suffix in ("_text", "_vision"):
        if model_type.endswith(suffix):
            family.add(model_type[: -len(suffix)])
    return family


def _load_builtin_patches() -> None:
    for module in _BUILTIN_PATCH_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # a real import error inside the patch module must not be hidden
                raise


def _transformers_version() -> Version:
    import transformers

    return Version(transformers.__version__)


def _apply_one(patch: ModelPatch, model: nn.Module, tf_version: Version) -> PatchStatus:
    if tf_version not in SpecifierSet(patch.transformers):
        reason = f"transformers {tf_version} is outside the supported range {patch.transformers}"
        if patch.required:
            raise RuntimeError(
                f"required model patch {patch.name!r} cannot be applied: {reason}. Install a supported version, "
                f"e.g. pip install 'transformers{patch.transformers}'"
            )
        return PatchStatus(patch.name, SKIPPED, reason, patch.required)
    try:
        detail = patch.apply(model)
    except PatchSkipped as e:
        return PatchStatus(patch.name, SKIPPED, str(e), patch.required)
    except Exception as e:
        if patch.required:
            raise RuntimeError(
                f"required model patch {patch.name!r} failed ({type(e).__name__}: {e}); training without it "
                "would be silently wrong, so the run stops here"
            ) from e
        logger.warning("optional model patch %r failed; the others still apply", patch.name, exc_info=True)
        return PatchStatus(patch.name, FAILED, f"{type(e).__name__}: {e}", patch.required)
    # a patch may return one line of what it chose (e.g. the kernel backend), appended to its description
    reason = f"{patch.description}; {detail}" if isinstance(detail, str) and detail else patch.description
    return PatchStatus(patch.name, APPLIED, reason, patch.required, probe_key=patch.probe_key)


def apply_patches(
    model: nn.Module,
    *,
    platform: str,
    model_type: str | None = None,
    disabled: Iterable[str] = (),
    registry: PatchRegistry | None = None,
    report: bool = True,
    probe: bool = True,
) -> list[PatchStatus]:
    """Apply every registered patch for ``(model_type, platform)`` to ``model``, each in isolation.

    Args:
        model: the model being built (patched in place).
        platform: ``"cpu" | "cuda" | "npu"`` (from the device contract).
        model_type: defaults to ``model.config.model_type``.
        disabled: patch names the user turned off; reported as skipped.
        registry: defaults to the global registry with the built-in patches loaded.
        report: print the one-line-per-patch report (rank 0 callers pass True).
        probe: run the model on a tiny packed batch to prove each applied patch is on the call path
            (:func:`probe_patches`), on the device of its parameters. Callers that wrap the model first pass False
            and call :func:`probe_patches` on the wrapped model.

    Returns:
        The statuses, also stored on the model for :func:`get_patch_status`.

    Raises:
        RuntimeError: a required patch failed, is outside its transformers range, or is not on the call path.
    """
    if platform not in ALL_PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; valid: {ALL_PLATFORMS}")
    if registry is None:
        _load_builtin_patches()
        registry = PATCH_REGISTRY
    if model_type is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type is None:
            raise ValueError("apply_patches: the model has no config.model_type; pass model_type= explicitly")
    disabled = set(disabled)
    tf_version = _transformers_version()
    statuses = []
    for patch in registry.matching(model_type, platform):
        if patch.name in disabled:
            statuses.append(PatchStatus(patch.name, SKIPPED, "disabled by the user", patch.required))
            continue
        statuses.append(_apply_one(patch, model, tf_version))
    previous = getattr(model, _STATUS_ATTR, [])
    object.__setattr__(model, _STATUS_ATTR, previous + statuses)
    parameter = next(model.parameters(), None) if probe else None
    if parameter is not None and parameter.device.type != "meta":
        return probe_patches(model, device=parameter.device, statuses=statuses, report=report, platform=platform)
    if report:
        print(format_patch_report(statuses, model_type=model_type, platform=platform), flush=True)
    return statuses


def probe_patches(
    model: nn.Module,
    *,
    device: torch.device | str,
    statuses: list[PatchStatus] | None = None,
    report: bool = False,
    platform: str = "",
) -> list[PatchStatus]:
    """Prove that the applied patches of ``model`` are on its call path (module docstring).

    ``model`` may be wrapped (FSDP1/FSDP2): every rank of its process groups must call this together. ``statuses``
    defaults to every status stored on the (unwrapped) model. The updated statuses are stored on the model and
    returned; ``report`` prints them.

    Raises:
        RuntimeError: a required patch is not on the call path.
    """
    from verl.models.transformers.packed_forward import _unwrap
    from verl.models.transformers.patch_probe import missing_reason, run_probe

    inner = _unwrap(model)
    stored = list(getattr(inner, _STATUS_ATTR, []))
    statuses = list(stored if statuses is None else statuses)
    pending = [s for s in statuses if s.state == APPLIED and s.probe_key and not s.probed]
    calls = None
    if pending:
        calls = run_probe(model, torch.device(device))
        proven = {}
        for status in pending:
            reason = missing_reason(calls, status.probe_key)
            if reason is None:
                proven[status.name] = replace(status, probed=True)
            else:
                proven[status.name] = replace(status, state=NOT_ON_CALL_PATH, reason=reason)
        statuses = [proven.get(s.name, s) for s in statuses]
        object.__setattr__(inner, _STATUS_ATTR, [proven.get(s.name, s) for s in stored])
    if report:
        model_type = getattr(getattr(inner, "config", None), "model_type", None) or "?"
        print(format_patch_report(statuses, model_type=model_type, platform=platform), flush=True)
    _stop_on_missing_required(inner, statuses, calls)
    if calls is not None and calls.errors:
        mode, error = next(iter(calls.errors.items()))
        raise RuntimeError(
            f"the start-up probe (a 5-token packed batch through {type(inner).__name__}) failed in {mode}() mode: "
            f"{type(error).__name__}: {error}. The first training step would fail the same way."
        ) from error
    return statuses


def _stop_on_missing_required(model: nn.Module, statuses: list[PatchStatus], calls) -> None:
    missing = [s for s in statuses if s.required and s.state == NOT_ON_CALL_PATH]
    if not missing:
        return
    import transformers

    details = "; ".join(f"{s.name!r}: {s.reason}" for s in missing)
    cause = next(iter(calls.errors.values()), None) if calls is not None else None
    raise RuntimeError(
        f"required model patch(es) not on the call path of {type(model).__name__} with transformers "
        f"{transformers.__version__} ({details}). The patch was applied but the model does not run it, so training "
        "would be silently wrong; the run stops before its first step. Install a transformers version this release "
        "was tested with (pip install -r envs/locks/main.lock, or see setup.py) and report the version that breaks."
    ) from cause


def get_patch_status(model: nn.Module) -> dict[str, PatchStatus]:
    """Which patches were applied to ``model``, which skipped or failed, and why (name → status)."""
    return {s.name: s for s in getattr(model, _STATUS_ATTR, [])}


def format_patch_report(statuses: list[PatchStatus], *, model_type: str, platform: str) -> str:
    header = f"[verl patch] model_type={model_type} platform={platform}: {len(statuses)} patch(es)"
    return "\n".join([header] + [s.line() for s in statuses])

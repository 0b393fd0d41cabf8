"""Names of the rollout engines (``actor_rollout_ref.rollout.name``) and where each lives, without importing any.

Kept apart from :mod:`verl.workers.rollout.base` (torch, ``DataProto``) so that the driver checks
``rollout.name`` before Ray starts without importing torch's tensordict stack on the critical path of start-up.
"""

from __future__ import annotations

# name -> (module, attribute, the engine package the module needs or None)
_ROLLOUT_REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "hf": ("verl.workers.rollout.hf_rollout", "HFRollout", None),
    "vllm": ("verl.workers.rollout.vllm_rollout", "vLLMRollout", "vllm"),
}
_MODES = ("async", "sync")


def register_rollout(name: str, module: str, attribute: str, requires: str | None = None) -> None:
    """Make ``rollout.name=<name>`` resolve to ``module.attribute`` (imported on first use)."""
    existing = _ROLLOUT_REGISTRY.get(name)
    if existing is not None and existing != (module, attribute, requires):
        raise ValueError(f"rollout {name!r} is already registered as {existing[0]}.{existing[1]}")
    _ROLLOUT_REGISTRY[name] = (module, attribute, requires)


def registered_rollouts() -> list[str]:
    """The values ``actor_rollout_ref.rollout.name`` accepts (the driver checks it against these before Ray)."""
    return sorted(_ROLLOUT_REGISTRY)

"""Exact weight updates of a running vLLM engine: load into the canonical layout, then post-process like a fresh engine.

Why. vLLM loads a checkpoint in two phases. The weight loaders write each tensor into parameters in vLLM's
*canonical* layout (e.g. fused experts ``w13_weight [E, 2I, H]``); then every layer's
``quant_method.process_weights_after_loading`` turns them into the layout its kernels read. Platforms do very
different things there: vLLM's CPU MoE experts prepack ``w13``/``w2`` into a grouped-GEMM layout (same shape,
different element order), the CPU linear path may hand the weight to oneDNN and replace the parameter by an empty
one, vllm-ascend re-creates the expert weights transposed, CUDA MoE backends shuffle them. A later weight push through
the loaders writes canonical values into kernel-format storage: the engine then computes with a policy that is
neither the old nor the new one, silently (measured on vLLM 0.32's CPU build: a push of the engine's *own* weights
moved prompt log-probs by up to 0.07 nats, all of it in the routed experts). vLLM's own in-place reload skips part of
that processing on updates (the CPU prepack runs only on the first call) and shows the same drift.

What this module does instead, for every layer that has a quant method:

```
 engine build (our model loader, after the checkpoint/dummy weights are loaded, BEFORE post-processing)
   capture: per layer, the canonical parameter layout (class, shape, dtype, attributes incl. weight_loader) and a
            pristine copy of its quant method (no kernel state yet)
 each sync, one decoder block (or the non-block tensors) at a time
   stage:   fresh canonical parameters (NaN-filled) replace the layer's kernel parameters
   load:    the model's own load_weights(...) -> the loaders write canonical values (the model code sees exactly
            what it sees on a fresh engine)
   check:   a staged layer untouched by this group is put back as it was; a touched layer whose canonical
            parameters were not completely written is an error (a partial sync would be silently wrong)
   process: a fresh copy of the pristine quant method runs process_weights_after_loading on the layer
   commit:  processed tensors are copied into the old kernel storage when shape/dtype/device match (addresses that
            captured graphs hold stay valid), else they replace it
```

The result is, by construction, what a fresh engine built from the same weights holds. Peak extra device memory is
one block's canonical weights (plus, for the non-block tensors, the embedding / LM head / vision merger layers).
Nothing is patched globally: the capture is a registered vLLM model loader (:mod:`verl.utils.vllm.loader`) and the
reload works on the model instance it is given.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

__all__ = [
    "CANONICAL_LAYOUT_ATTR",
    "CanonicalLayout",
    "LayerSnapshot",
    "ReloadReport",
    "block_key",
    "get_canonical_layout",
]

logger = logging.getLogger(__name__)

# Where the capture stores the layout on the engine's model (an attribute of that instance only).
CANONICAL_LAYOUT_ATTR = "_verl_canonical_layout"
# "<prefix>.layers.7." / ".blocks.3." -> one decoder or vision block
_BLOCK_RE = re.compile(r"(?:^|\.)(layers|blocks|h)\.(\d+)(?:\.|$)")
_TOWERS = ("visual", "vision_tower", "mtp")


def block_key(name: str) -> str | None:
    """The block a parameter/module name belongs to, comparable across the HF and vLLM naming, else None.

    HF ``model.language_model.layers.3.mlp.gate.weight`` and vLLM ``language_model.model.layers.3.mlp.gate`` are both
    ``"text/layers.3"``; ``model.visual.blocks.1.attn.qkv.weight`` / ``visual.blocks.1.attn.qkv`` are
    ``"visual/blocks.1"``; ``lm_head.weight`` is None (not in a block).
    """
    match = _BLOCK_RE.search(name)
    if match is None:
        return None
    prefix = name[: match.start()].split(".")
    tower = next((t for t in _TOWERS if t in prefix), "text")
    return f"{tower}/{match.group(1)}.{match.group(2)}"


@dataclass
class _ParamSpec:
    """A parameter as the loaders expect it: class, shape, dtype, device and attributes (weight_loader, dims...)."""

    cls: type
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    attrs: dict[str, Any]

    @classmethod
    def of(cls, param: torch.Tensor) -> _ParamSpec:
        return cls(type(param), tuple(param.shape), param.dtype, param.device, dict(vars(param)))

    def materialize(self) -> torch.Tensor:
        """A new parameter of this spec; floats are NaN so that unwritten elements can be found after the load."""
        data = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if data.is_floating_point():
            data.fill_(float("nan"))
        param = torch.Tensor._make_subclass(self.cls, data, False)
        param.__dict__.update(self.attrs)
        return param


@dataclass
class LayerSnapshot:
    """One layer's canonical parameters and its quant method before any post-processing."""

    name: str
    params: dict[str, _ParamSpec]
    quant_method: Any


@dataclass
class ReloadReport:
    """What one reload did (layer names are the engine's module names)."""

    processed: list[str] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)

    def merge(self, other: ReloadReport) -> None:
        self.processed += other.processed
        self.untouched += other.untouched


def _quant_method(module: nn.Module) -> Any:
    method = getattr(module, "quant_method", None)
    return method if callable(getattr(method, "process_weights_after_loading", None)) else None


class CanonicalLayout:
    """The canonical layout of every post-processed layer of one vLLM model, and the exact reload built on it."""

    def __init__(self, layers: dict[str, LayerSnapshot], vllm_config: Any = None) -> None:
        self.layers = layers
        self.vllm_config = vllm_config
        self._by_block: dict[str | None, list[str]] = {}
        for name in layers:
            self._by_block.setdefault(block_key(name), []).append(name)

    @classmethod
    def capture(cls, model: nn.Module, vllm_config: Any = None) -> CanonicalLayout:
        """Snapshot ``model`` (loaded, not yet post-processed): every module that has a quant method."""
        layers = {}
        for name, module in model.named_modules():
            method = _quant_method(module)
            params = dict(module.named_parameters(recurse=False))
            if method is None or not params:
                continue
            specs = {pname: _ParamSpec.of(param) for pname, param in params.items()}
            layers[name] = LayerSnapshot(name, specs, copy.copy(method))
        return cls(layers, vllm_config)

    def layers_of_block(self, key: str | None) -> list[str]:
        """Snapshot layers in block ``key`` (:func:`block_key`); ``None``: the layers outside every block."""
        return list(self._by_block.get(key, ()))

    # ------------------------------------------------------------------------------------------------ the reload
    def reload(self, model: nn.Module, key: str | None, load: Callable[[], Any]) -> ReloadReport:
        """Stage the layers of block ``key``, run ``load()`` (the model's own ``load_weights`` on this block's
        tensors), then check, post-process and commit each touched layer (module docstring)."""
        modules = dict(model.named_modules())
        staged = {name: _stage(modules[name], self.layers[name]) for name in self.layers_of_block(key)}
        try:
            with torch.no_grad():
                load()
            touched = [name for name in staged if _touched(modules[name], self.layers[name])]
            for name in touched:
                _check_complete(name, modules[name], self.layers[name])
        except BaseException:
            # the staged layers keep their kernel parameters (layers without post-processing, e.g. norms, take the
            # loaders' writes directly and are not rolled back: the error stops the sync)
            for name, kernel in staged.items():
                _put_back(modules[name], kernel)
            raise
        report = ReloadReport()
        for name, kernel in staged.items():
            module, snapshot = modules[name], self.layers[name]
            if name not in touched:
                _put_back(module, kernel)
                report.untouched.append(name)
                continue
            self._process(module, snapshot)
            _commit(module, kernel)
            report.processed.append(name)
        return report

    def _process(self, module: nn.Module, snapshot: LayerSnapshot) -> None:
        """Run the layer's post-load processing with a quant method in its pristine state (a fresh engine's)."""
        method = copy.copy(snapshot.quant_method)
        replace = getattr(module, "_replace_quant_method", None)
        if callable(replace):
            replace(method)
        else:
            module.quant_method = method
        with torch.no_grad(), self._config_scope():
            method.process_weights_after_loading(module)
        update_tp = getattr(module, "update_param_tp_status", None)
        if callable(update_tp):
            update_tp()  # what vLLM's loader does after processing, so a later reload narrows at the right offset

    def _config_scope(self):
        if self.vllm_config is None:
            return nullcontext()
        from vllm.config import set_current_vllm_config

        return set_current_vllm_config(self.vllm_config)


def get_canonical_layout(model: nn.Module) -> CanonicalLayout | None:
    """The layout captured when the engine loaded ``model`` (None when it was not built through our loader)."""
    return getattr(model, CANONICAL_LAYOUT_ATTR, None)


# ---------------------------------------------------------------------------------------------------------------
# staging one layer
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Kernel:
    """What a staged layer held before staging: its parameter table (``None`` entries such as ``bias`` included) and
    the plain attributes staging removed because post-processing had put them where a canonical parameter goes."""

    parameters: dict[str, torch.Tensor | None]
    attributes: dict[str, Any]


def _stage(module: nn.Module, snapshot: LayerSnapshot) -> _Kernel:
    """Replace the module's parameters by fresh canonical ones; returns what it had."""
    kernel = _Kernel(parameters=dict(module._parameters), attributes={})
    for pname, value in kernel.parameters.items():
        if value is not None and pname not in snapshot.params:
            del module._parameters[pname]  # created by post-processing; a fresh engine has none before processing
    for pname, spec in snapshot.params.items():
        if pname in module._parameters:
            del module._parameters[pname]
        elif pname in module.__dict__ or pname in module._buffers:
            kernel.attributes[pname] = getattr(module, pname)  # post-processing made it a plain tensor / buffer
            delattr(module, pname)
        module.register_parameter(pname, spec.materialize())
    return kernel


def _put_back(module: nn.Module, kernel: _Kernel) -> None:
    """Undo :func:`_stage`: the module's parameters (and moved attributes) are the kernel ones again, unchanged."""
    module._parameters.clear()
    module._parameters.update(kernel.parameters)
    for name, value in kernel.attributes.items():
        setattr(module, name, value)


def _floats(module: nn.Module, snapshot: LayerSnapshot) -> Iterable[tuple[str, torch.Tensor]]:
    for pname in snapshot.params:
        param = module._parameters[pname]
        if param is not None and param.is_floating_point() and param.numel():
            yield pname, param


def _touched(module: nn.Module, snapshot: LayerSnapshot) -> bool:
    """Whether the load wrote any element of the layer's staged parameters (they start all-NaN)."""
    return any(not bool(torch.isnan(param).all()) for _, param in _floats(module, snapshot))


def _check_complete(name: str, module: nn.Module, snapshot: LayerSnapshot) -> None:
    missing = []
    for pname, param in _floats(module, snapshot):
        unwritten = int(torch.isnan(param).sum())
        if unwritten:
            missing.append(f"{pname} ({unwritten} of {param.numel()} elements)")
    if missing:
        raise RuntimeError(
            f"weight sync into vLLM: layer {name!r} received only part of its weights; not written: "
            f"{', '.join(missing)}. A fresh engine would load them from the checkpoint, so the engine would compute "
            "with stale values. Every tensor of the trained model must be synced (check that the actor's state dict "
            "has them and that their names map to this engine)."
        )


def _commit(module: nn.Module, kernel: _Kernel) -> None:
    """Keep the processed values in the old kernel storage where the layout matches (the module docstring's why)."""
    for pname, processed in list(module._parameters.items()):
        old = kernel.parameters.get(pname)
        if processed is None or old is None or old is processed:
            continue
        if old.shape == processed.shape and old.dtype == processed.dtype and old.device == processed.device:
            old.data.copy_(processed.data)
            old.__dict__.update(vars(processed))  # the processed attributes (kernel flags), as a fresh engine has
            module._parameters[pname] = old

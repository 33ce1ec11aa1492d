"""The modules LoRA can adapt, read off the (meta) model's module tree at `recipekit model import`.

PEFT matches each name of ``target_modules`` against every module's dotted path (the path itself, or a path ending in
``.<name>``) and wraps those of a kind it supports; a name that matches nothing is dropped, and a list in which
nothing matches stops the run. What matches is a fact of the architecture: Phi-4's attention is one fused
``qkv_proj`` (there is no ``q_proj`` to adapt), Qwen3-MoE's routed experts are fused 3-D weights, not modules. So the
import records, for each kind of decoder layer (:mod:`recipekit.runtime.boundary.layerkinds`), the paths inside the
layer of the modules PEFT's LoRA wraps, and the fused experts' weights; ``build`` then checks a recipe's targets
against them without torch (:mod:`recipekit.plan.adapters`).

For the MoE families whose experts transformers 5 fused, PEFT (0.21) still accepts the transformers-4 names of the
expert projections and rewrites them to the fused weights (``gate_proj`` and ``up_proj`` together become
``gate_up_proj``, huggingface/peft#3711): those names are recorded too, read from PEFT's own table where PEFT is
installed. torch, transformers and peft are imported inside the functions.
"""

from __future__ import annotations

import re
from typing import Any

from recipekit.recipe.schema import validate
from recipekit.recipe.sections import ModuleTreeSpec
from recipekit.runtime.boundary.layerkinds import decoder_layers, decoder_layers_path, layer_kind

#: A list's index inside a path (``experts.0.w1``): recorded as ``*``, so a layer lists each kind of module once.
_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)")


def adaptable_types() -> tuple[type, ...]:
    """The module classes PEFT's LoRA wraps (peft.tuners.lora.layer.dispatch_default, PEFT 0.21): linear layers,
    embeddings, convolutions, multi-head attention, and transformers' GPT-2-style Conv1D."""
    import torch

    kinds: list[type] = [
        torch.nn.Linear,
        torch.nn.Embedding,
        torch.nn.Conv1d,
        torch.nn.Conv2d,
        torch.nn.Conv3d,
        torch.nn.MultiheadAttention,
    ]
    try:
        from transformers.pytorch_utils import Conv1D

        kinds.append(Conv1D)
    except ImportError:  # pragma: no cover - every transformers recipekit supports has it
        pass
    return tuple(kinds)


def generic(path: str) -> str:
    """``path`` with each list index as ``*`` (``experts.7.w1`` → ``experts.*.w1``)."""
    return _INDEX.sub("*", path)


def module_tree(model: Any) -> ModuleTreeSpec:
    """What LoRA can adapt in ``model``: per kind of decoder layer (in depth order, with its count) the modules PEFT
    wraps and the fused experts' 3-D weights; the adaptable modules outside the layers; PEFT's expert aliases."""
    kinds: dict[Any, dict[str, Any]] = {}
    for layer in decoder_layers(model):
        kind = layer_kind(layer)
        if kind not in kinds:
            kinds[kind] = {"count": 0, **_layer_modules(layer)}
        kinds[kind]["count"] += 1
    layers_path = decoder_layers_path(model)
    outside = sorted(
        {
            generic(name)
            for name, module in model.named_modules()
            if isinstance(module, adaptable_types()) and not _inside(name, layers_path)
        }
    )
    recorded = {
        "layers": list(kinds.values()),
        "outside": outside,
        "expert_names": peft_expert_names(model, {n for kind in kinds.values() for n in kind["experts"]}),
    }
    return validate(ModuleTreeSpec, recorded, root="model.modules")


def _inside(name: str, layers_path: str) -> bool:
    return bool(layers_path) and (name == layers_path or name.startswith(layers_path + "."))


def _layer_modules(layer: Any) -> dict[str, list[str]]:
    """One layer's adaptable modules and fused experts' weights, by their paths inside it."""
    linear = {generic(name) for name, module in layer.named_modules() if name and isinstance(module, adaptable_types())}
    experts = set()
    for name, module in layer.named_modules():
        if name.rsplit(".", 1)[-1] != "experts" and not type(module).__name__.endswith("Experts"):
            continue
        for parameter_name, parameter in module.named_parameters(recurse=False):
            if parameter.dim() == 3:
                experts.add(generic(f"{name}.{parameter_name}"))
    return {"linear": sorted(linear), "experts": sorted(experts)}


def peft_expert_names(model: Any, fused: set[str]) -> dict[str, str]:
    """The transformers-4 expert names PEFT rewrites for this architecture, each with the weight it adapts instead
    (only those whose weight the model has): PEFT's ``_MOE_TARGET_MODULE_MAPPING`` for the model type's conversion
    pattern, applied when transformers converts the model's checkpoints (PEFT's own condition). Empty without PEFT
    or for an architecture it does not rewrite."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not fused or not isinstance(model_type, str):
        return {}
    try:
        from peft.utils import transformers_weight_conversion as conversion
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:
        return {}
    if get_checkpoint_conversion_mapping(model_type) is None:
        return {}
    pattern = getattr(conversion, "_MODEL_TO_CONVERSION_PATTERN", {}).get(model_type)
    mapping: dict[str, str] = getattr(conversion, "_MOE_TARGET_MODULE_MAPPING", {}).get(pattern, {})
    leaves = {name.rsplit(".", 1)[-1] for name in fused}
    parameters = {generic(name) for name, _ in model.named_parameters()}
    return {
        old: new
        for old, new in sorted(mapping.items())
        if new in leaves or any(p.endswith("." + new) for p in parameters)
    }

"""A decoder's layers and each layer's kind, read off the module tree of any transformers causal LM.

Both sides need the same answer: the runtime's tiny twin keeps every kind of layer the full depth has
(``runtime/model/shrink.py``), and `recipekit model import` measures the activations of one layer of each kind and
scales them by how many layers of that kind the depth has (``recipe/measured/modelmemory.py``). A layer's kind is the
classes of its modules and its attention's window: dense and MoE layers, sliding and global attention,
linear-attention or state-space layers are different kinds.

torch is imported inside the functions (recipekit reads this module without it).
"""

from __future__ import annotations

import copy
from typing import Any

LayerKind = tuple[str, ...]


def decoder_layers_path(model: Any) -> str:
    """The dotted name of the longest list of modules in ``model``: its decoder layers ('' where it has none)."""
    import torch

    lists = [(len(m), name) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=lambda item: item[0])[1] if lists else ""


def decoder_layers(model: Any) -> list[Any]:
    """The longest list of modules in ``model``: its decoder layers."""
    path = decoder_layers_path(model)
    return list(model.get_submodule(path)) if path else []


def layer_kind(layer: Any) -> LayerKind:
    """One decoder layer's kind: its module classes, its attention's window and its attention type."""
    classes = sorted({type(m).__name__ for m in layer.modules()})
    windows = sorted({str(getattr(m, "sliding_window", None)) for m in layer.modules() if hasattr(m, "sliding_window")})
    return (*classes, *windows, str(getattr(layer, "attention_type", "")))


def layer_kinds(model: Any) -> list[LayerKind]:
    """Each decoder layer's kind, in depth order (the layer pattern)."""
    return [layer_kind(layer) for layer in decoder_layers(model)]


def depth_keeping_every_kind(kinds: list[LayerKind], times: int = 1) -> int:
    """The fewest first layers that hold every kind of layer the full depth has, each ``times`` times (or as many
    times as the full depth has it)."""
    wanted = {kind: min(times, kinds.count(kind)) for kind in set(kinds)}
    seen: dict[LayerKind, int] = {}
    for depth, kind in enumerate(kinds, start=1):
        seen[kind] = seen.get(kind, 0) + 1
        if all(seen.get(k, 0) >= n for k, n in wanted.items()):
            return depth
    return max(1, len(kinds))


def _attribute(config: Any, key: str) -> Any:
    """``config.key``; None for an attribute a heterogeneous config refuses to read globally."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 - transformers' AmbiguousGlobalPerLayerAttributeError
        return None


#: Other names configs give their depth, each set on its own (not an alias transformers maps to the first).
DEPTH_ALIASES = ("num_blocks", "n_layer", "n_layers", "num_layers")


def cut_depth(config: Any, depth: int, modules: int = 0) -> Any:
    """``config`` with its first ``depth`` decoder modules; every per-layer list, index list and per-layer override
    (transformers' ``per_layer_config``) cut to them, layer indices beyond them dropped.

    ``modules`` is how many decoder modules the full config builds. Where that differs from ``num_hidden_layers``
    (a module holding two of the config's layers, as LongCat-Flash's does), the config's count is cut in its own
    units, so that ``depth`` modules are still built.
    """
    small = copy.deepcopy(config)
    layers = int(getattr(small, "num_hidden_layers", 0) or 0)
    per_module = layers // modules if modules and layers and layers % modules == 0 else 1
    keep = depth * per_module
    as_dict = small.to_dict()
    for key in as_dict:
        value = _attribute(small, key)  # the config's own, not as serialized (Dory writes each layer as two)
        if not isinstance(value, list) or key.endswith("_token_id"):
            continue
        if layers and len(value) == layers:
            setattr(small, key, value[:keep])
        elif key.endswith("_layers") and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            setattr(small, key, [v for v in value if v < keep])
    overrides = as_dict.get("per_layer_config")
    if isinstance(overrides, dict) and overrides:
        small.per_layer_config = None  # checked against the depth it is set at: set again below, after the cut
    if layers:
        small.num_hidden_layers = keep
        for alias in DEPTH_ALIASES:  # a second name for the depth, not tied to the first (xLSTM's blocks)
            if _attribute(small, alias) == layers:
                setattr(small, alias, keep)
    if isinstance(overrides, dict) and overrides:
        kept = {index: value for index, value in overrides.items() if int(index) < keep}
        if kept:
            small.per_layer_config = kept
    return small

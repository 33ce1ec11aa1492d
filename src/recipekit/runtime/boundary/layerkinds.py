"""A decoder's layers and each layer's kind, read off the module tree of any transformers causal LM.

Both sides need the same answer: the runtime's tiny twin keeps every kind of layer the full depth has
(``runtime/model/shrink.py``), and `recipekit model import` measures the activations of one layer of each kind and
scales them by how many layers of that kind the depth has (``recipe/measured/modelmemory.py``). A layer's kind is the
classes of its modules, its attention's window and its modules' own flags (``is_sliding``, ``is_kv_shared_layer``):
dense and MoE layers, sliding and global attention, linear-attention or state-space layers, layers that reuse
another's key-value cache are different kinds.

torch is imported inside the functions (recipekit reads this module without it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
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
    """One decoder layer's kind: its module classes, its attention's window, its attention type and its modules'
    boolean ``is_*`` flags (a layer that reuses another's key-value cache skips its own projections: Gemma 3n)."""
    classes = sorted({type(m).__name__ for m in layer.modules()})
    windows = sorted({str(getattr(m, "sliding_window", None)) for m in layer.modules() if hasattr(m, "sliding_window")})
    flags = sorted(
        {f"{name}={value}" for m in layer.modules() for name, value in vars(m).items() if _is_flag(name, value)}
    )
    return (*classes, *windows, str(getattr(layer, "attention_type", "")), *flags)


def _is_flag(name: str, value: Any) -> bool:
    return name.startswith("is_") and isinstance(value, bool)


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
    _cut_layer_counts(small, layers, keep)
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


def _cut_layer_counts(config: Any, layers: int, keep: int) -> None:
    """Counts of layers other than the depth, cut with it. Sections that add up to the depth (Dory's input,
    recurrent and output layers) keep their shares, one layer each at least; a count of the depth's last layers that
    reuse another's state (Gemma 3n's ``num_kv_shared_layers``) keeps where they begin, so the layers kept share as
    they did."""
    counts = _layer_counts(config)
    if len(counts) > 1 and sum(counts.values()) == layers and keep >= len(counts):
        parts = {key: max(1, value * keep // layers) for key, value in counts.items()}
        parts[max(parts, key=lambda key: parts[key])] += keep - sum(parts.values())
        for key, value in parts.items():
            setattr(config, key, value)
        return
    for key, value in counts.items():
        if "shared" in key:
            setattr(config, key, max(0, value - (layers - keep)))


def _layer_counts(config: Any) -> dict[str, int]:
    """The config's counts of layers (``num_*_layers``, ``n_*_layers``) other than its depth."""
    counts = {}
    for key in config.to_dict():
        value = _attribute(config, key)
        named = key.startswith(("num_", "n_")) and key.endswith("_layers") and key != "num_hidden_layers"
        if named and key not in DEPTH_ALIASES and isinstance(value, int) and not isinstance(value, bool):
            counts[key] = value
    return counts


def shortest_cut(config: Any, kinds: list[LayerKind], builds: Callable[[Any], bool], least: int = 1) -> Any | None:
    """``config`` cut to the fewest first layers (``least`` at least) that hold every kind of ``kinds`` (each
    layer's kind over the full depth) and build (``builds``); where that does not, every kind twice (Zamba ties the
    shared attention block of its first hybrid layer to the others': it needs two). None where neither builds."""
    for times in (1, 2):
        depth = max(depth_keeping_every_kind(kinds, times=times), min(least, len(kinds)))
        cut = cut_depth(config, depth, modules=len(kinds))
        if builds(cut):
            return cut
    return None

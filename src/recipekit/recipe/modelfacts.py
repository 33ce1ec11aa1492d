"""Facts of a causal LM measured from its module tree on the meta device, for any architecture transformers builds.

No family switch: what a parameter is (embedding, attention, MLP, routed experts, router, norm, head) is read from the
module that holds it, and the architecture numbers from the modules themselves. Routed experts are the modules that
hold one slice per expert (a fused 3-D tensor whose first dimension is the expert count, or a list of expert MLPs);
the router is the module beside them that scores the experts and keeps the top k. The tied head is the embedding's own
tensor and is counted once (``named_parameters`` yields a shared tensor once). The attention geometry (heads,
key/value heads, the query-key and value head widths, MLA's included) comes from the first attention module.

torch is imported inside the functions: the plan reads the stored numbers only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: The parts of the option's ``params``, in the order a parameter is tested against them.
PARTS = ("embedding", "attention", "mlp", "experts", "router", "norms", "head", "other")
#: Module names that hold a layer's token mixer: attention, linear attention or a state-space mixer.
_ATTENTION_NAME = re.compile(r"(attn|attention|mixer|linear_attn|self_attention|mamba|ssm)$", re.IGNORECASE)
_NORM_NAME = re.compile(r"(norm|^ln_|^ln\d*$|layernorm)", re.IGNORECASE)
#: Config keys an architecture names the experts' top-k with (the router module is asked first).
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k", "num_selected_experts")


@dataclass(frozen=True)
class Experts:
    """The routed experts of one MoE layer: the expert count, its top-k and the parameters of all of them."""

    name: str
    count: int
    top_k: int
    params: int
    width: int  # one expert's hidden width (its down projection's input)


@dataclass(frozen=True)
class Attention:
    """One layer's attention geometry as the module holds it."""

    heads: int
    kv_heads: int
    head_dim: int  # the query-key width of one head (MLA: nope + rope)
    v_head_dim: int
    qk_norm: bool  # a norm on each head's queries and keys
    bias: bool  # the query projection carries a bias


def experts_of(model: Any, config: Any) -> list[Experts]:
    """Every routed-experts module of ``model`` (shared experts are not routed: they stay in the MLP)."""
    found: list[Experts] = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if not _holds_experts(name, module):
            continue
        if any(name.startswith(other.name + ".") for other in found):
            continue
        count = _expert_count(module)
        if not count:
            continue
        parent = modules.get(name.rpartition(".")[0], model)
        params = sum(p.numel() for p in module.parameters())
        width = _expert_width(module, count, int(getattr(config, "hidden_size", 0) or 0))
        found.append(Experts(name, count, _top_k(parent, config, count), params, width))
    return found


def uneven_experts(model: Any) -> list[str]:
    """Experts modules whose fused tensors disagree on how many experts they hold (LongCat-Flash's 768 gate/up
    slices beside 512 down slices: experts without weights, chosen by the router like the others), one line each.
    A token's active parameters then depend on where it is routed: no fixed active count exists."""
    uneven = []
    for name, module in model.named_modules():
        if not _holds_experts(name, module):
            continue
        firsts = {n: int(p.shape[0]) for n, p in module.named_parameters(recurse=False) if p.dim() == 3}
        if len(set(firsts.values())) > 1:
            uneven.append(f"{name} ({', '.join(f'{n} {count}' for n, count in firsts.items())})")
    return uneven


def _holds_experts(name: str, module: Any) -> bool:
    """Whether the module called ``name`` is an experts module: named ``experts``, or of a class named so."""
    return name.rsplit(".", 1)[-1] == "experts" or type(module).__name__.endswith("Experts")


def _expert_count(module: Any) -> int:
    """How many experts ``module`` holds: a list of expert MLPs, or fused tensors with one slice per expert."""
    import torch

    if isinstance(module, torch.nn.ModuleList):
        return len(module)
    count = getattr(module, "num_experts", None)
    tensors = [p for p in module.parameters(recurse=False) if p.dim() >= 2]
    if isinstance(count, int) and count > 1 and tensors and all(p.shape[0] == count for p in tensors):
        return count
    return 0


def _expert_width(module: Any, count: int, hidden: int) -> int:
    """One expert's hidden width: the smallest dimension of its weights that is not the model width."""
    widths = [
        int(size)
        for p in module.parameters()
        if p.dim() >= 2
        for size in (p.shape[1:] if p.dim() == 3 else p.shape)
        if int(size) != hidden
    ]
    return min(widths) if widths else 0


def _top_k(parent: Any, config: Any, count: int) -> int:
    """The experts a token is routed to: the router's own ``top_k`` beside the experts, else the config's."""
    for module in (parent, *parent.children()):
        for key in ("top_k", "num_experts_per_tok", "topk"):
            value = getattr(module, key, None)
            if isinstance(value, int) and 0 < value <= count:
                return value
    for key in TOP_K_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and 0 < value <= count:
            return value
    return 0  # not set: the importer refuses rather than guess which experts a token uses


def routers_of(model: Any, experts: list[Experts]) -> set[str]:
    """The router of each experts module: a sibling whose weight scores the experts (one row per expert)."""
    modules = dict(model.named_modules())
    routers = set()
    for group in experts:
        parent_name = group.name.rpartition(".")[0]
        parent = modules.get(parent_name, model)
        for child_name, child in parent.named_children():
            weight = getattr(child, "weight", None)
            if child_name != "experts" and weight is not None and weight.dim() == 2 and weight.shape[0] == group.count:
                routers.add(f"{parent_name}.{child_name}" if parent_name else child_name)
    return routers


def part_of(
    name: str, module: Any, *, embeddings: set[str], heads: set[str], experts: list[Experts], routers: set[str]
) -> str:
    """Which part the parameter ``name`` (held by ``module``) belongs to."""
    owner = name.rpartition(".")[0]
    if owner in embeddings or type(module).__name__.endswith("Embedding"):
        return "embedding"
    if owner in heads:
        return "head"
    path = owner.split(".")
    if any(_NORM_NAME.search(step) for step in path[-1:]) or "Norm" in type(module).__name__:
        return "norms"
    if any(owner == e.name or owner.startswith(e.name + ".") for e in experts):
        return "experts"
    if any(owner == r or owner.startswith(r + ".") for r in routers):
        return "router"
    if any(_ATTENTION_NAME.search(step) for step in path):
        return "attention"
    if in_layer(path):
        return "mlp"
    return "other"


def in_layer(path: list[str]) -> bool:
    """Whether a module path runs through a list of decoder layers (``layers.3``, ``h.0``, ``blocks.1``)."""
    return any(step.isdigit() for step in path[1:])


def attention_of(model: Any, config: Any) -> Attention | None:
    """The geometry of the first attention module (None for a model without one, e.g. a state-space model)."""
    for _name, module in model.named_modules():
        kind = type(module).__name__
        if "Attention" not in kind or not any(True for _ in module.parameters()):
            continue
        heads = _int(module, config, ("num_heads", "num_attention_heads", "n_heads"))
        if not heads:
            continue
        hidden = int(getattr(config, "hidden_size", 0) or 0)
        head_dim = _int(module, config, ("qk_head_dim", "head_dim")) or (hidden // heads if hidden else 0)
        groups = getattr(module, "num_key_value_groups", None)
        kv = heads // groups if isinstance(groups, int) and groups > 0 and heads % groups == 0 else 0
        kv = kv or _int(module, config, ("num_key_value_heads", "num_kv_heads")) or heads
        query = getattr(module, "q_proj", None)
        return Attention(
            heads=heads,
            kv_heads=kv,
            head_dim=head_dim,
            v_head_dim=_int(module, config, ("v_head_dim",)) or head_dim,
            qk_norm=any(n in dict(module.named_children()) for n in ("q_norm", "k_norm", "q_layernorm")),
            bias=bool(getattr(query, "bias", None) is not None),
        )
    return None


def _int(module: Any, config: Any, keys: tuple[str, ...]) -> int:
    """The first positive whole number among ``keys`` on the module, then on the config."""
    for source in (module, config):
        for key in keys:
            value = getattr(source, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def mlp_width(model: Any, hidden: int) -> int:
    """The widest linear dimension of the first decoder layer's MLP that is not the model width (0: none)."""
    import torch

    for name, module in model.named_modules():
        path = name.split(".")
        if not isinstance(module, torch.nn.Linear) or not in_layer(path):
            continue
        if any(_ATTENTION_NAME.search(step) for step in path) or "expert" in name:
            continue
        widths = [size for size in (module.in_features, module.out_features) if size != hidden]
        if widths:
            return max(widths)
    return 0

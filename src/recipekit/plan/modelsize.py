"""How many parameters a model has, from its architecture numbers alone.

The plan needs these counts for the FLOPs of a model without measured ones, the memory estimate for every byte it
predicts; both sides import them from here, so a model's size is counted one way. Pure arithmetic on
:class:`recipekit.recipe.sections.ModelSpec`, checked against transformers' own modules
(tests/unit/memory/test_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.recipe.measured import modelflops
from recipekit.recipe.sections import FlopsSpec, LoraSpec, ModelSpec

#: LoRA target names recipekit knows the shape of; "all-linear" is every one of them (PEFT leaves lm_head out).
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: The MLP's projections among them.
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------------------------- parameter counts
@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a decoder-only model: from its stored exact counts (``model.params``, written by
    ``recipekit model import``) or counted from its architecture numbers."""

    embedding: int
    head: int  # 0 when the head is tied to the embedding
    per_layer: int
    layers: int
    final_norm: int
    linear_per_layer: int  # weights of the decoder layer's nn.Linear projections (what QLoRA quantizes)
    largest_module: int  # parameters of the biggest single module: ZeRO-3 gathers it whole
    inactive: int = 0  # routed-expert parameters a token does not use (MoE): total − active
    experts: int = 0  # routed-expert parameters, all layers (MoE)

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.layers * self.per_layer + self.final_norm

    @property
    def active(self) -> int:
        """Parameters one token runs through: the MoE's top-k experts, not all of them. FLOPs and MFU count these;
        memory counts :attr:`total`."""
        return self.total - self.inactive


def mlp_width(model: ModelSpec) -> int:
    """The SwiGLU width a token passes through in one layer: the dense MLP's, or top-k experts plus a shared one."""
    if model.moe:
        return model.experts_per_token * model.moe_intermediate_size + model.shared_expert_intermediate_size
    return model.intermediate_size


def linear_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection one token passes through in a decoder layer (an MoE layer's
    MLP entries stand for its top-k experts together, see :func:`mlp_width`)."""
    h, q, kv, i = (
        model.hidden_size,
        model.num_attention_heads * model.head_dim,
        model.num_kv_heads * model.head_dim,
        mlp_width(model),
    )
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def _formula_counts(model: ModelSpec) -> ParamCounts:
    h = model.hidden_size
    shapes = linear_shapes(model)
    attention = sum(i * o for m, (i, o) in shapes.items() if m.endswith(("q_proj", "k_proj", "v_proj", "o_proj")))
    bias = (shapes["q_proj"][1] + shapes["k_proj"][1] + shapes["v_proj"][1]) if model.attention_bias else 0
    norms = 2 * h + (2 * model.head_dim if model.qk_norm else 0)
    if model.moe:
        expert = 3 * h * model.moe_intermediate_size
        experts = model.num_experts * expert
        shared = 3 * h * model.shared_expert_intermediate_size
        shared += h if model.shared_expert_intermediate_size else 0  # the shared expert's sigmoid gate
        router = model.num_experts * h
        mlp = experts + shared + router
        linear = attention + (3 * h * model.shared_expert_intermediate_size)
        inactive = (model.num_experts - model.experts_per_token) * expert * model.num_layers
        largest = max(experts, shared)
    else:
        mlp = 3 * h * model.intermediate_size
        experts = 0
        linear = attention + mlp
        inactive = 0
        largest = max(i * o for i, o in shapes.values())
    embedding = model.vocab_size * h
    return ParamCounts(
        embedding=embedding,
        head=0 if model.tie_word_embeddings else embedding,
        per_layer=attention + bias + mlp + norms,
        layers=model.num_layers,
        final_norm=h,
        linear_per_layer=linear,
        largest_module=max(embedding, largest),
        inactive=inactive,
        experts=experts * model.num_layers if model.moe else 0,
    )


def count_params(model: ModelSpec) -> ParamCounts:
    """The model's parameters: its stored exact counts when it has them, else counted from its numbers.

    The count from numbers: embeddings, untied head, attention q/k/v/o (GQA: k and v are kv_heads × head_dim wide;
    optional q/k/v bias; Qwen3's per-head q/k norms), SwiGLU MLP (gate, up, down) or MoE experts with their router,
    two RMSNorm weights per layer and a final norm. Matches the published sizes: Llama 3 8B 8.03 B, 70B 70.6 B;
    Qwen2.5 7B 7.62 B, 14B 14.8 B, 72B 72.7 B (tests/unit/memory/test_memory.py, tests/unit/recipe/test_models.py).
    """
    stored = model.params
    if stored is None:
        return _formula_counts(model)
    layers = model.num_layers
    final_norm = model.hidden_size
    in_layers = stored.total - stored.embedding - stored.head - final_norm
    return ParamCounts(
        embedding=stored.embedding,
        head=stored.head,
        per_layer=in_layers // layers,
        layers=layers,
        final_norm=final_norm + in_layers % layers,  # keeps total exact when the layers differ (dense-only layers)
        linear_per_layer=stored.linear // layers,
        largest_module=stored.largest_module,
        inactive=stored.total - stored.active,
        experts=stored.experts,
    )


def model_flops(model: ModelSpec) -> FlopsSpec:
    """The model's training FLOPs per token: the numbers `recipekit model import` measured with torch's FLOP counter,
    else (an option written by hand, a twin reshaped for TP) the same convention counted from the parameter counts:
    the active weights with the head (tied or not), without the embedding lookup, and attention over heads ×
    head_dim (:func:`recipekit.recipe.measured.modelflops.analytic`)."""
    if model.flops is not None:
        return model.flops
    counts = count_params(model)
    head = model.vocab_size * model.hidden_size
    return modelflops.analytic(
        matmul_params=counts.active - counts.embedding - counts.head + head,
        head_params=head,
        layers=model.num_layers,
        attention_width=2 * model.num_attention_heads * model.head_dim,
    )


def tensor_parallel_share(model: ModelSpec, tp: int) -> ParamCounts:
    """The parameters one rank holds under DeepSpeed AutoTP with ``tp`` ranks, as :class:`ParamCounts`.

    AutoTP follows the model's own TP plan: q/k/v and gate/up are column-parallel (their rows and biases split),
    o_proj and down_proj row-parallel (their columns split), the RMSNorm weights stay whole on every rank. An untied
    head is column-parallel over the vocabulary while the embedding stays whole; a tied pair is vocabulary-parallel
    together. A split that does not come out even (AutoTP partitions unevenly) is counted at its largest share.
    Checked against the shapes AutoTP produces (tests/unit/memory/test_memory.py).
    """
    counts = count_params(model)
    if tp == 1:
        return counts
    shapes = linear_shapes(model)
    h = model.hidden_size
    vocab_share = -(-model.vocab_size // tp) * h

    def split(n: int) -> int:
        return -(-n // tp)

    column = {m: split(o) * i for m, (i, o) in shapes.items() if m not in ("o_proj", "down_proj")}
    row = {m: o * split(i) for m, (i, o) in shapes.items() if m in ("o_proj", "down_proj")}
    linear = sum(column.values()) + sum(row.values())
    bias = sum(split(shapes[m][1]) for m in ("q_proj", "k_proj", "v_proj")) if model.attention_bias else 0
    embedding = vocab_share if model.tie_word_embeddings else counts.embedding
    head = 0 if model.tie_word_embeddings else vocab_share
    return ParamCounts(
        embedding=embedding,
        head=head,
        per_layer=linear + bias + 2 * h + (2 * model.head_dim if model.qk_norm else 0),
        layers=model.num_layers,
        final_norm=h,
        linear_per_layer=linear,
        largest_module=max(embedding, head, *column.values(), *row.values()),
    )


def lora_targets(lora: LoraSpec) -> tuple[str, ...]:
    """The adapted projections; names recipekit does not know are left out (and noted by :func:`estimate`)."""
    if lora.target_modules == "all-linear":
        return LORA_MODULES
    return tuple(m for m in LORA_MODULES if m in lora.target_modules)


#: Families whose MLP fuses gate and up into one gate_up_proj (PEFT adapts it as one module), for an option that
#: records no module tree; the tree says it for the others (``model.modules``).
FUSED_GATE_UP = ("glm4",)
#: Projections a module tree may hold fused, and the ones each holds (Phi-3/4's qkv_proj, GLM-4's gate_up_proj).
FUSED_MODULES = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def fused_modules(model: ModelSpec) -> list[str]:
    """The fused projections of ``model``'s layers (:data:`FUSED_MODULES`), from its recorded module tree."""
    tree = model.modules
    if tree is None:
        return ["gate_up_proj"] if model.family in FUSED_GATE_UP else []
    leaves = {path.rsplit(".", 1)[-1] for kind in tree.layers for path in kind.linear}
    return [name for name in FUSED_MODULES if name in leaves]


def lora_params(model: ModelSpec, lora: LoraSpec) -> int:
    """LoRA adds A (r × in) and B (out × r) to each adapted projection: r × (in + out) per module per layer.

    With ``all-linear`` the runtime adapts every attention and MLP projection the module tree has
    (``runtime/model/loader.lora_targets``; checked against the live adapters of every family's twin,
    tests/unit/recipe/test_models.py): a fused projection is one module, GLM-4's gate_up_proj r × (h + 2i), Phi-4's
    qkv_proj r × (h + q + 2 kv); an MoE layer's fused
    3-D experts get one adapter per expert through PEFT's target_parameters, r·E·(h + 2i) + r·E·(i + h) for the
    experts' width i; its router is left alone (adapting it would change the routing). Named targets adapt only the
    modules of those names (an MoE layer has no gate/up/down_proj)."""
    shapes = linear_shapes(model)
    h, r = model.hidden_size, lora.r
    fused = fused_modules(model)
    named = set(LORA_MODULES) | set(fused) if lora.target_modules == "all-linear" else set(lora.target_modules)
    parts = {part for name in fused for part in FUSED_MODULES[name]}
    targets = [m for m in lora_targets(lora) if not (model.moe and m in MLP_MODULES) and m not in parts]
    per_layer = sum(r * (shapes[m][0] + shapes[m][1]) for m in targets)
    for name in fused:
        held = FUSED_MODULES[name]
        if (name in named or set(held) <= named) and not (model.moe and held[0] in MLP_MODULES):
            per_layer += r * (shapes[held[0]][0] + sum(shapes[m][1] for m in held))
    if model.moe and lora.target_modules == "all-linear":
        e, i = model.num_experts, model.moe_intermediate_size
        per_layer += r * e * (h + 2 * i) + r * e * (i + h)
    return model.num_layers * per_layer

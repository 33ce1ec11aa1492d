"""How many parameters a model has, from its architecture numbers alone.

The plan needs these counts for the FLOPs it renders into the bundle, the memory estimate for every byte it
predicts; both sides import them from here, so a model's size is counted one way. Pure arithmetic on
:class:`recipekit.recipe.sections.ModelSpec`, checked against transformers' own modules (tests/unit/test_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.recipe.sections import LoraSpec, ModelSpec

#: LoRA target names recipekit knows the shape of; "all-linear" is every one of them (PEFT leaves lm_head out).
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------------------------- parameter counts
@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a decoder-only Llama/Qwen2 model, counted from its architecture numbers."""

    embedding: int
    head: int  # 0 when the head is tied to the embedding
    per_layer: int
    layers: int
    final_norm: int
    linear_per_layer: int  # weights of the seven projections (what QLoRA quantizes)
    largest_module: int  # parameters of the biggest single module: ZeRO-3 gathers it whole

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.layers * self.per_layer + self.final_norm

    @property
    def matmul(self) -> int:
        """Parameters that cost FLOPs: all but the input embedding (a lookup)."""
        return self.total - self.embedding


def linear_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection in one decoder layer."""
    h, kv, i = model.hidden_size, model.num_kv_heads * model.head_dim, model.intermediate_size
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def count_params(model: ModelSpec) -> ParamCounts:
    """Embeddings, untied head, attention q/k/v/o (GQA: k and v are kv_heads × head_dim wide; optional q/k/v bias),
    SwiGLU MLP (gate, up, down), two RMSNorm weights per layer and a final norm.

    Matches the published sizes: Llama 3 8B 8.03 B, 70B 70.6 B; Qwen2.5 7B 7.62 B, 14B 14.8 B, 72B 72.7 B.
    """
    shapes = linear_shapes(model)
    linear = sum(i * o for i, o in shapes.values())
    bias = (shapes["q_proj"][1] + shapes["k_proj"][1] + shapes["v_proj"][1]) if model.attention_bias else 0
    per_layer = linear + bias + 2 * model.hidden_size
    embedding = model.vocab_size * model.hidden_size
    head = 0 if model.tie_word_embeddings else embedding
    return ParamCounts(
        embedding=embedding,
        head=head,
        per_layer=per_layer,
        layers=model.num_layers,
        final_norm=model.hidden_size,
        linear_per_layer=linear,
        largest_module=max(embedding, *(i * o for i, o in shapes.values())),
    )


def tensor_parallel_share(model: ModelSpec, tp: int) -> ParamCounts:
    """The parameters one rank holds under DeepSpeed AutoTP with ``tp`` ranks, as :class:`ParamCounts`.

    AutoTP follows the model's own TP plan: q/k/v and gate/up are column-parallel (their rows and biases split),
    o_proj and down_proj row-parallel (their columns split), the RMSNorm weights stay whole on every rank. An untied
    head is column-parallel over the vocabulary while the embedding stays whole; a tied pair is vocabulary-parallel
    together. A split that does not come out even (AutoTP partitions unevenly) is counted at its largest share.
    Checked against the shapes AutoTP produces (tests/unit/test_memory.py).
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
        per_layer=linear + bias + 2 * h,
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


def lora_params(model: ModelSpec, lora: LoraSpec) -> int:
    """LoRA adds A (r × in) and B (out × r) to each adapted projection: r × (in + out) per module per layer."""
    shapes = linear_shapes(model)
    return model.num_layers * sum(lora.r * (shapes[m][0] + shapes[m][1]) for m in lora_targets(lora))

"""The ``model`` section: the architecture numbers the plan and the twin need, and the exact parameter counts."""

from __future__ import annotations

import math
import re
from collections.abc import Sized
from typing import Annotated, Any, Literal

from recipekit.recipe.domains import (
    LOCATION,
    MODULE_NAME,
    SHORT_NAME,
)
from recipekit.recipe.schema import Section, spec

#: Upper bounds that keep every derived number meaningful (and far above any real model, cluster or schedule).
MAX_DIM = 2**24
MAX_COUNT = 10**12


# --------------------------------------------------------------------------------------------------------- model
class ParamCountsSpec(Section):
    """Exact parameter counts of a model, per part, as transformers builds it (written by `recipekit model import`
    from the model instantiated on the meta device). Stored so the planner uses them without importing torch."""

    embedding: int = spec(ge=0, le=MAX_COUNT, description="Input embedding (a tied head is counted here, once).")
    attention: int = spec(ge=0, le=MAX_COUNT, description="q/k/v/o projections and their biases, all layers.")
    mlp: int = spec(ge=0, le=MAX_COUNT, description="Dense MLPs and shared experts, all layers.")
    experts: int = spec(0, ge=0, le=MAX_COUNT, description="Routed experts, all layers (MoE).")
    router: int = spec(0, ge=0, le=MAX_COUNT, description="Router (gate) weights, all layers (MoE).")
    norms: int = spec(ge=0, le=MAX_COUNT, description="Every norm weight, the final norm included.")
    head: int = spec(0, ge=0, le=MAX_COUNT, description="Output head; 0 when tied to the embedding.")
    other: int = spec(0, ge=0, le=MAX_COUNT, description="Parameters in none of the parts above.")
    total: int = spec(gt=0, le=MAX_COUNT, description="All parameters: what memory is counted from.")
    active: int = spec(
        gt=0,
        le=MAX_COUNT,
        description="Parameters one token uses (routed experts × top-k / "
        "experts): what FLOPs and MFU are counted from; equals total for a dense model.",
    )
    linear: int = spec(
        ge=0,
        le=MAX_COUNT,
        description="Weights of the decoder layers' nn.Linear modules (what LoRA can adapt and QLoRA quantizes).",
    )
    largest_module: int = spec(
        gt=0,
        le=MAX_COUNT,
        description="Parameters of the biggest single module (its own, not its children's): ZeRO-3 gathers it whole.",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        parts = self.embedding + self.attention + self.mlp + self.experts + self.router + self.norms + self.head
        broken: list[str | tuple[str, str]] = []
        if parts + self.other != self.total:
            broken.append(("total", f"the parts add up to {parts + self.other}, not {self.total}"))
        if self.active > self.total:
            broken.append(("active", f"{self.active} active parameters exceed the {self.total} in total"))
        return broken


#: Upper bound of a FLOP count per token (far above any model: 10**15 is a 100-trillion-parameter model's).
MAX_FLOPS = 10**15


class FlopsSpec(Section):
    """Training FLOPs per token as torch's FLOP counter counts them (``torch.utils.flop_counter.FlopCounterMode``)
    over the real transformers module, written by `recipekit model import`. The one FLOPs definition of recipekit:
    the plan's FLOPs per token, the runtime's MFU and HFU and the report's ratios all come from these numbers.

    Each count is a function of the sequence length S: ``X + X_per_position × S + X_per_sequence / S`` FLOPs per
    token, where ``X_per_position`` is the attention term (scores and weighted sum, dense S×S as the counter counts
    scaled dot-product attention, causal or not), ``X_per_sequence`` what a sequence costs once whatever its length
    (a causal convolution's padding, prompt tokens a model prepends; 0 for most models) and ``X`` everything else
    (every matmul, the output head included even when tied to the embedding; an MoE layer's top-k experts). The
    import measures three lengths and solves for the three terms, so every other length follows exactly.
    Recomputation is kept apart: MFU counts ``train``, HFU adds ``recompute`` when activation checkpointing is on.
    """

    counted_by: Literal["counter", "counter_cpu", "analytic"] = spec(
        description="counter: measured with FlopCounterMode on the meta device; counter_cpu: the same counter over "
        "the model built on the CPU with real tensors, where a module cannot run on meta (a Tensor.item(), a tensor "
        "made on the CPU); analytic: the same convention computed from the module tree where neither can count it "
        "(a model too large to build on the CPU)."
    )
    train: int = spec(ge=0, le=MAX_FLOPS, description="Forward + backward, every weight training: FLOPs per token.")
    train_per_position: int = spec(ge=0, le=MAX_FLOPS, description="Its attention term: FLOPs per token per position.")
    frozen: int = spec(
        ge=0,
        le=MAX_FLOPS,
        description="Forward + activation gradients, weights frozen (a LoRA run's base model): FLOPs per token.",
    )
    frozen_per_position: int = spec(ge=0, le=MAX_FLOPS, description="Its attention term, per position.")
    recompute: int = spec(
        ge=0,
        le=MAX_FLOPS,
        description="Forward of the decoder layers: what activation checkpointing runs again (HFU adds it).",
    )
    recompute_per_position: int = spec(ge=0, le=MAX_FLOPS, description="Its attention term, per position.")
    train_per_sequence: int = spec(
        0,
        ge=-MAX_FLOPS,
        le=MAX_FLOPS,
        description="What training costs once a sequence, whatever its length: FLOPs (negative where a kernel skips "
        "a position or chunk at the sequence's edge).",
    )
    frozen_per_sequence: int = spec(0, ge=-MAX_FLOPS, le=MAX_FLOPS, description="The frozen base's, once a sequence.")
    recompute_per_sequence: int = spec(
        0, ge=-MAX_FLOPS, le=MAX_FLOPS, description="The recomputation's, once a sequence."
    )

    def train_at(self, seq_len: int) -> float:
        """Training FLOPs per token at ``seq_len`` tokens a sequence."""
        return _per_token(self.train, self.train_per_position, self.train_per_sequence, seq_len)

    def frozen_at(self, seq_len: int) -> float:
        """FLOPs per token of the frozen base (forward + activation gradients) at ``seq_len``."""
        return _per_token(self.frozen, self.frozen_per_position, self.frozen_per_sequence, seq_len)

    def recompute_at(self, seq_len: int) -> float:
        """FLOPs per token activation checkpointing adds at ``seq_len``."""
        return _per_token(self.recompute, self.recompute_per_position, self.recompute_per_sequence, seq_len)


def _per_token(constant: int, per_position: int, per_sequence: int, seq_len: int) -> float:
    """``constant + per_position × seq_len + per_sequence / seq_len`` (a whole number where nothing is per sequence)."""
    return constant + per_position * seq_len + (per_sequence / seq_len if per_sequence else 0)


#: Upper bound of activation bytes per token (far above any model: a 10⁴-layer model of width 2²⁴ keeps less).
MAX_ACTIVATION_BYTES = 10**13


class ActivationsSpec(Section):
    """Activation memory per token as torch's memory tracker measures it (``MemTracker`` of
    ``torch.distributed._tools.mem_tracker``, under ``FakeTensorMode``) over one forward and backward pass of the real
    transformers decoder, written by `recipekit model import`: the architecture's own layers, whatever they are
    (attention of any geometry, dense or MoE MLPs, norms as transformers writes them).

    What is measured: the decoder stack (embedding output to final norm) of the model in bf16 with every weight training
    (DeepSpeed's 16-bit model; the layers of each kind from its second layer, scaled by their count), scaled dot-product
    attention as a device runs it (a fused kernel keeping a logsumexp, no S×S scores), MoE experts as grouped GEMMs; the
    logits and the loss are the memory estimate's own item. Bytes per token are linear in the sequence length S: ``X +
    X_per_position × S``, solved from three shapes with a per-step constant left out (a weight's gradient before the
    tracker files it as one: a model state). ``kept`` is what autograd holds at the end of forward; ``peak`` the most
    activation memory alive at once over forward and backward (kept activations, backward's temporaries and, under
    checkpointing, the layer rebuilt).
    """

    measured_by: Literal["tracker_per_layer_kind"] = spec(
        description="tracker_per_layer_kind: torch's MemTracker under FakeTensorMode, one layer of each kind scaled by "
        "the count of its kind."
    )
    kept: int = spec(ge=0, le=MAX_ACTIVATION_BYTES, description="Bytes per token kept at the end of forward.")
    kept_per_position: int = spec(ge=0, le=MAX_ACTIVATION_BYTES, description="Its term per position.")
    peak: int = spec(ge=0, le=MAX_ACTIVATION_BYTES, description="Peak bytes per token over forward + backward.")
    peak_per_position: int = spec(ge=0, le=MAX_ACTIVATION_BYTES, description="Its term per position.")
    checkpointed_kept: int = spec(
        ge=0, le=MAX_ACTIVATION_BYTES, description="Bytes per token kept with gradient checkpointing on."
    )
    checkpointed_kept_per_position: int = spec(ge=0, le=MAX_ACTIVATION_BYTES, description="Its term per position.")
    checkpointed_peak: int = spec(
        ge=0, le=MAX_ACTIVATION_BYTES, description="Peak bytes per token with gradient checkpointing on."
    )
    checkpointed_peak_per_position: int = spec(ge=0, le=MAX_ACTIVATION_BYTES, description="Its term per position.")

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        for kept in ("kept", "checkpointed_kept"):
            peak = kept.replace("kept", "peak")
            if getattr(self, kept) > getattr(self, peak):
                broken.append((kept, f"exceeds {peak}: the peak includes what is kept"))
        return broken

    def kept_at(self, seq_len: int, *, checkpointing: bool) -> int:
        """Bytes per token autograd keeps at the end of forward, at ``seq_len`` tokens a sequence."""
        prefix = "checkpointed_" if checkpointing else ""
        return int(getattr(self, f"{prefix}kept") + getattr(self, f"{prefix}kept_per_position") * seq_len)

    def peak_at(self, seq_len: int, *, checkpointing: bool) -> int:
        """Peak activation bytes per token over forward and backward, at ``seq_len`` tokens a sequence."""
        prefix = "checkpointed_" if checkpointing else ""
        return int(getattr(self, f"{prefix}peak") + getattr(self, f"{prefix}peak_per_position") * seq_len)


#: Upper bounds of the module tree an option records (a real decoder layer has a few dozen adaptable modules).
MAX_MODULE_NAMES = 512


class LayerModulesSpec(Section):
    """One kind of decoder layer (the runtime's layer kinds: dense or MoE, full or linear attention) and the modules
    of it LoRA can adapt, named by their path inside the layer, a list's index as ``*``."""

    count: int = spec(gt=0, le=10_000, description="How many decoder layers are of this kind.")
    linear: list[Annotated[str, MODULE_NAME]] = spec(
        default_factory=list,
        description="Modules PEFT's LoRA wraps (nn.Linear, nn.Embedding, convolutions), e.g. self_attn.qkv_proj.",
    )
    experts: list[Annotated[str, MODULE_NAME]] = spec(
        default_factory=list,
        description="Fused routed experts' 3-D weights (every expert in one tensor; PEFT adapts them as "
        "target_parameters), e.g. mlp.experts.gate_up_proj.",
    )


class ModuleTreeSpec(Section):
    """The modules of the model LoRA's ``target_modules`` can name, read off transformers' module tree by `recipekit
    model import`, so that ``build`` checks a recipe's targets without importing torch."""

    layers: list[LayerModulesSpec] = spec(
        description="Each kind of decoder layer, in the order the depth first has it."
    )
    outside: list[Annotated[str, MODULE_NAME]] = spec(
        default_factory=list,
        description="Adaptable modules outside the decoder layers, by their full path (the embedding, the head).",
    )
    expert_names: dict[Annotated[str, MODULE_NAME], Annotated[str, MODULE_NAME]] = spec(
        default_factory=dict,
        description="The expert projections' transformers-4 names PEFT still accepts in target_modules for this "
        "architecture, each with the fused weight it adapts instead (PEFT rewrites the targets: "
        "huggingface/peft#3711).",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        lists: dict[str, Sized] = {"layers": self.layers, "outside": self.outside, "expert_names": self.expert_names}
        lists |= {
            f"layers[{i}].{k}": getattr(kind, k) for i, kind in enumerate(self.layers) for k in ("linear", "experts")
        }
        return [
            (key, f"holds {len(v)} names (at most {MAX_MODULE_NAMES})")
            for key, v in lists.items()
            if len(v) > MAX_MODULE_NAMES
        ]


class ModelSpec(Section):
    """A decoder-only transformer, described by its architecture numbers so that no download is ever needed."""

    name: str = spec(domain=SHORT_NAME, description="Short name, used in bundle and job names.")
    description: str = spec("", description="One line shown by `recipekit list model`.")
    family: str = spec(
        pattern=r"[a-z][a-z0-9_-]{0,63}",
        description="Architecture (transformers' model_type, e.g. qwen3_moe); the tiny twin shares it.",
    )
    architecture: str = spec(
        "", domain=MODULE_NAME, description="transformers model class, e.g. Qwen3MoeForCausalLM ('' = the family's)."
    )
    name_or_path: str = spec(
        domain=LOCATION, description="Weights and tokenizer: a path on the shared volume (or a hub id); one line."
    )
    init: Literal["pretrained", "random"] = spec(
        "pretrained",
        description="random: build from these numbers with random weights and a locally trained tokenizer.",
    )
    num_layers: int = spec(gt=0, le=10_000, description="Decoder layers (num_hidden_layers).")
    hidden_size: int = spec(gt=0, le=MAX_DIM, description="Model width.")
    num_attention_heads: int = spec(gt=0, le=65_536, description="Query heads.")
    num_kv_heads: int = spec(gt=0, le=65_536, description="Key/value heads (grouped-query attention).")
    head_dim_override: int = spec(
        0,
        ge=0,
        le=65_536,
        description="Width of one head where it is not hidden_size / heads (Qwen3: 128); 0 = derived.",
    )
    qk_norm: bool = spec(False, description="RMSNorm on each head's queries and keys (Qwen3).")
    intermediate_size: int = spec(gt=0, le=MAX_DIM, description="SwiGLU MLP width (dense layers).")
    vocab_size: int = spec(gt=0, le=MAX_DIM, description="Tokenizer vocabulary (embedding rows).")
    max_position_embeddings: int = spec(gt=0, le=MAX_DIM, description="Longest sequence the model was trained for.")
    tie_word_embeddings: bool = spec(False, description="Output head shares the input embedding.")
    rope_theta: float = spec(500000.0, gt=0, le=1e12, description="RoPE base.")
    rms_norm_eps: float = spec(1e-5, ge=1e-12, le=1, description="RMSNorm epsilon.")
    attention_bias: bool = spec(False, description="q/k/v projections carry a bias (Qwen2 does).")
    num_experts: int = spec(0, ge=0, le=65_536, description="Routed experts per MoE layer; 0 = a dense model.")
    experts_per_token: int = spec(0, ge=0, le=65_536, description="Experts each token is routed to (top-k).")
    moe_intermediate_size: int = spec(0, ge=0, le=MAX_DIM, description="One routed expert's SwiGLU width.")
    shared_expert_intermediate_size: int = spec(
        0, ge=0, le=MAX_DIM, description="Width of the always-on shared expert (Qwen2-MoE style); 0 = none."
    )
    router_aux_loss_coef: float = spec(
        0.001, ge=0, le=100, description="Weight of the router's load-balancing loss, added to the loss in training."
    )
    router_aux_loss: bool = spec(
        True, description="Train with the load-balancing loss (transformers' output_router_logits) on MoE models."
    )
    min_transformers: str = spec(
        "", pattern=r"(\d+(\.\d+){0,2})?", description="Oldest transformers release with this architecture."
    )
    params: ParamCountsSpec | None = spec(
        None, description="Exact counts from `recipekit model import`; None: counted from the numbers above."
    )
    flops: FlopsSpec | None = spec(
        None,
        description="Training FLOPs per token from `recipekit model import` (torch's FLOP counter); None: computed "
        "from the counts in the counter's convention.",
    )
    activations: ActivationsSpec | None = spec(
        None,
        description="Activation memory per token from `recipekit model import` (torch's memory tracker); None: "
        "the Llama-shaped formula of the memory estimate.",
    )
    modules: ModuleTreeSpec | None = spec(
        None,
        description="The modules LoRA can adapt, per kind of layer, from `recipekit model import`; None: not "
        "recorded (the recipe's LoRA targets are then checked on the cluster only).",
    )
    trust_remote_code: bool = spec(False, description="Allow model code from the checkpoint; off unless needed.")
    config: dict[str, Any] | None = spec(
        None,
        description="The architecture's transformers config (config.json's keys, written by `recipekit model "
        "import`): what a random-weight model and the dry run's generic tiny twin are built from; None: built from "
        "the numbers above (family's own config class).",
    )

    def rules(self) -> list[str | tuple[str, str]]:
        broken: list[str | tuple[str, str]] = []
        if self.config is not None:
            broken += [("config", problem) for problem in config_problems(self.config)]
            if self.config.get("model_type") not in (None, self.family):
                broken.append(("config", f"model_type {self.config['model_type']!r} is not the family {self.family!r}"))
        if not self.head_dim_override and self.hidden_size % self.num_attention_heads:
            broken.append(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_kv_heads:
            broken.append(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts:
                broken.append(
                    (
                        "experts_per_token",
                        f"must be 1..num_experts ({self.num_experts}) for an MoE model (got {self.experts_per_token})",
                    )
                )
            if not self.moe_intermediate_size:
                broken.append(("moe_intermediate_size", "must be set for an MoE model (num_experts > 0)"))
        elif self.experts_per_token or self.moe_intermediate_size:
            broken.append(("num_experts", "is 0 (a dense model) but experts_per_token/moe_intermediate_size are set"))
        return broken

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_attention_heads

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


#: Bounds of ``model.config``, a transformers config as JSON data: a real config.json has a few dozen keys, a few
#: levels deep (rope scaling, a per-layer list of a few hundred entries).
CONFIG_MAX_DEPTH, CONFIG_MAX_ITEMS = 6, 20_000
#: A key is an identifier, or a layer index (transformers' ``per_layer_config`` is keyed by them: ``"05"``).
_CONFIG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}|[0-9]{1,6}")


def config_problems(config: dict[str, Any]) -> list[str]:
    """What makes ``config`` no JSON config a model can be built from: keys that are neither identifiers nor layer
    indices, values that are not JSON (strings one line, numbers finite), nesting deeper than :data:`CONFIG_MAX_DEPTH`
    or more than :data:`CONFIG_MAX_ITEMS` values. At most the first three."""
    problems: list[str] = []
    stack: list[tuple[str, Any, int]] = [(key, value, 1) for key, value in config.items()]
    seen = 0
    while stack and len(problems) < 3:
        where, value, depth = stack.pop()
        seen += 1
        if seen > CONFIG_MAX_ITEMS or depth > CONFIG_MAX_DEPTH:
            problems.append(f"is larger than a config.json ({CONFIG_MAX_ITEMS} values, {CONFIG_MAX_DEPTH} levels)")
            break
        if isinstance(value, dict):
            bad = next((k for k in value if not (isinstance(k, str) and _CONFIG_KEY.fullmatch(k))), None)
            if bad is not None:
                problems.append(f"{where}: key {str(bad)[:40]!r} is not an identifier or a layer index")
            stack += [(f"{where}.{k}", v, depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value)]
        elif not _json_scalar(value):
            problems.append(
                f"{where}: {str(value)[:40]!r} is not a one-line string, a finite number, a boolean or null"
            )
    bad_top = next((k for k in config if not (isinstance(k, str) and _CONFIG_KEY.fullmatch(k))), None)
    if bad_top is not None:
        problems.append(f"key {str(bad_top)[:40]!r} is not an identifier or a layer index")
    return problems[:3]


def _json_scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= 4096 and value.isprintable()

"""The bytes autograd keeps for backward: one decoder layer's activations as Hugging Face's Llama/Qwen2 block
saves them (Korthikanti et al. 2022, re-derived), the head's and the loss's, under checkpointing, TP and SP.

Split from :mod:`recipekit.memory.formulas` (whose :class:`~recipekit.memory.formulas.Regime` gives the byte
widths) because activations are their own derivation, checked on their own against autograd
(tests/unit/memory/test_memory.py). Pure: numbers and specs in, bytes out.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.memory.formulas import (
    FULL,
    HALF,
    LOGITS_SAVED_BYTES,
    Regime,
)
from recipekit.plan.modelsize import linear_shapes, lora_targets, mlp_width
from recipekit.recipe.sections import LoraSpec, ModelSpec

#: RMSNorm as Hugging Face writes it upcasts its input to fp32 and autograd keeps that copy (4 bytes per element).
NORM_FP32_BYTES = 4
#: A dropout mask is a bool tensor on CUDA and NPU.
DROPOUT_MASK_BYTES = 1


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes autograd keeps for backward on one device for one micro-batch in flight, by where they come from."""

    layers: float  # what every decoder layer keeps (its input only, under checkpointing)
    recomputed: float  # one layer's full activations, rebuilt during backward under checkpointing (else 0)
    head: float  # final norm (and the head's input when it trains)
    logits_saved: float  # fp32 log-softmax the loss keeps

    @property
    def saved(self) -> float:
        """What autograd holds at the end of forward (the recomputed layer exists only during backward)."""
        return self.layers + self.head + self.logits_saved


def _residual_bytes(reg: Regime, full_training: bool) -> int:
    """The residual stream's element: fp32 under AMP when the weights train (the embedding output is fp32)."""
    return FULL if reg.autocast and full_training else reg.element


def layer_activation_bytes(
    model: ModelSpec,
    reg: Regime,
    *,
    tokens: int,
    full_training: bool,
    lora: LoraSpec | None = None,
    tp: int = 1,
    sp: bool = False,
    fused: bool = False,
) -> float:
    """Bytes one decoder layer keeps for backward, for ``tokens`` = micro batch × sequence length.

    Korthikanti et al. count s·b·h·(34 + 5·a·s/h) bytes per GPT layer with fp16 (layer norms, QKV input, Q/K/V,
    softmax and dropout over the a·s² scores, MLP input, 4h GELU input and output, dropout masks). Re-derived for the
    Hugging Face Llama/Qwen2 layer, per token:

    * each RMSNorm keeps its fp32 upcast input (4h bytes) and, when its weight trains, its normalised input to the
      weight multiply, in the residual stream's dtype;
    * when q/k/v and gate/up train, their input (h each); Q after RoPE (h) and K, V (2·kv_dim) and the output (h)
      for the fused attention kernel, which keeps a logsumexp per head instead of the a·s² scores (so the 5as/h term
      drops out: SDPA's flash/memory-efficient path on CUDA, FlashAttentionScore on Ascend); no attention dropout;
    * SwiGLU: gate output, its SiLU, up output (3i) and, when down_proj trains, their product (i);
    * LoRA: each adapted module keeps its dropped-out input and mask (or shares the plain input when dropout is 0),
      and A's r-wide output.

    Full training in 16 bits (DeepSpeed casts the model): 20h + 4·kv_dim + 8i bytes per token (Llama 3 8B ≈ 49h,
    against GPT's 34h). Under the Trainer's AMP (the regime's ``autocast``) the residual stream is fp32 and every
    linear layer keeps its own 16-bit cast of its input: 30h + 4·kv_dim + 8i.

    Tensor parallelism without sequence parallelism (AutoTP's, and Korthikanti's s·b·h·(10 + 24/t)) divides what
    lies between a column-parallel projection and its row-parallel partner: Q, K, V, the attention output, the MLP's
    gate, SiLU, up and product. The norms and the inputs of the column-parallel projections (q/k/v, gate/up) are
    whole on every rank. LoRA's terms are counted whole (LoRA under TP is analysis only). Sequence parallelism
    (``sp``) splits those too: everything is divided by TP (Korthikanti's 34/t). ``fused``: Megatron-core's
    kernels keep less (:func:`fused_kernel_savings`).
    """
    h, i = model.hidden_size, model.intermediate_size
    kv = model.num_kv_heads * model.head_dim
    a = reg.element
    whole = 2 * NORM_FP32_BYTES * h + (2 * _residual_bytes(reg, full_training) * h if full_training else 0)
    sharded = a * (2 * h + 2 * kv) + 3 * a * i  # Q, K, V, attention output; gate, SiLU, up
    if full_training:
        copies_attn, copies_mlp = (3, 2) if reg.autocast else (1, 1)  # q/k/v and gate/up inputs
        whole += a * (copies_attn + copies_mlp) * h
        sharded += a * i  # down_proj's input; o_proj's is the attention output, counted above
    if lora is not None:
        shapes = linear_shapes(model)
        targets = lora_targets(lora)
        whole += a * lora.r * len(targets)
        if lora.dropout > 0:
            whole += sum((a + DROPOUT_MASK_BYTES) * shapes[m][0] for m in targets)
        elif reg.autocast:  # each adapter casts its own copy of the input
            whole += sum(a * shapes[m][0] for m in targets)
        else:  # the adapters keep the very input tensors: once per distinct input not already kept
            distinct = {
                "attn": h if {"q_proj", "k_proj", "v_proj"} & set(targets) else 0,
                "mlp": h if {"gate_proj", "up_proj"} & set(targets) else 0,
                "mid": i if "down_proj" in targets else 0,
            }
            whole += a * sum(distinct.values())
    kept_whole, kept_sharded = float(whole), float(sharded)
    if fused and full_training:
        saved_whole, saved_sharded = fused_kernel_savings(model)
        kept_whole, kept_sharded = kept_whole - saved_whole, kept_sharded - saved_sharded
    return tokens * ((kept_whole / tp if sp else kept_whole) + kept_sharded / tp)


def fused_kernel_savings(model: ModelSpec) -> tuple[float, float]:
    """Bytes per token per layer that Hugging Face's module keeps for backward and Megatron-core's fused kernels do
    not (16-bit training): (left whole by TP without SP, split by TP).

    Hugging Face's RMSNorm upcasts its input to fp32 and autograd keeps that copy (4h) and the normalised 16-bit
    input of the weight multiply (2h); a fused RMSNorm (Transformer Engine's, Apex's) keeps its 16-bit input (2h):
    4h less for each of a layer's two norms. A gated SiLU MLP keeps gate, SiLU(gate), up and their product; the
    fused SwiGLU (Megatron's bias_swiglu) recomputes SiLU(gate) in backward: 2 bytes less per element of the MLP's
    width a token passes through (the top-k experts' and a shared expert's in an MoE layer). Norms beyond the two
    (per-head q/k norms, Gemma's post-norms) are left as measured: the estimate stays above the fused kernels'.
    """
    config = model.config or {}
    gated = str(config.get("hidden_act", "silu")) in ("silu", "swish")
    return 2 * (NORM_FP32_BYTES * model.hidden_size), (HALF * mlp_width(model) if gated else 0.0)


def tp_activation_share(tp: int, sp: bool) -> float:
    """The share of a layer's activations one TP rank keeps: 1/t with sequence parallelism, (10 + 24/t)/34 without
    (Korthikanti et al. 2022, §4.2: of a layer's 34·s·b·h bytes, 10 lie outside the column/row-parallel pairs)."""
    if tp == 1:
        return 1.0
    return 1 / tp if sp else (10 + 24 / tp) / 34


def activation_bytes(
    model: ModelSpec,
    reg: Regime,
    *,
    micro_batch: int,
    seq_len: int,
    full_training: bool,
    checkpointing: bool,
    lora: LoraSpec | None = None,
    tp: int = 1,
    layers: int | None = None,
    in_flight: float = 1,
    sp: bool = False,
    fused: bool = False,
    vocab_parallel: bool | None = None,
) -> ActivationBytes:
    """Activations of ``layers`` decoder layers (default: all) with ``in_flight`` micro-batches alive at once.

    Without recomputation every layer keeps :func:`layer_activation_bytes`. With full gradient checkpointing (one
    checkpoint per decoder layer, Hugging Face's) each layer keeps only its input, 2·s·b·h bytes in 16 bits, and
    backward rebuilds one layer at a time. Pipeline parallelism (1F1B) keeps ``in_flight`` = min(p, m) micro-batches
    on its first stage. Under TP the loss's logits are vocabulary-parallel when the head is tied to the embedding
    (AutoTP shards the pair and computes a vocabulary-parallel loss); an untied head's output is gathered whole on
    every rank (:func:`vocab_parallel_logits`; Megatron-core's head is always vocabulary-parallel:
    ``vocab_parallel``). Under sequence parallelism (``sp``) the checkpointed layer inputs are split over TP too.
    """
    tokens = micro_batch * seq_len
    count = model.num_layers if layers is None else layers
    full_layer = layer_activation_bytes(
        model, reg, tokens=tokens, full_training=full_training, lora=lora, tp=tp, sp=sp, fused=fused
    )
    h = model.hidden_size
    residual = _residual_bytes(reg, full_training)
    if checkpointing:
        kept, recomputed = float(count * in_flight * tokens * residual * h / (tp if sp else 1)), full_layer
    else:
        kept, recomputed = count * in_flight * full_layer, 0.0
    head = tokens * (NORM_FP32_BYTES * h + ((residual + reg.element) * h if full_training else 0))
    split = vocab_parallel_logits(model) if vocab_parallel is None else vocab_parallel
    logits = tokens * model.vocab_size * LOGITS_SAVED_BYTES / (tp if split else 1)
    return ActivationBytes(layers=kept, recomputed=recomputed, head=head, logits_saved=logits)


def vocab_parallel_logits(model: ModelSpec) -> bool:
    """Whether AutoTP keeps the logits split over the vocabulary: for a head tied to the embedding (measured with
    deepspeed 0.19: a tied pair becomes VocabParallelEmbedding + VocabParallelLinear with a vocabulary-parallel
    loss; an untied head is a column-parallel layer whose output is gathered)."""
    return model.tie_word_embeddings

"""The arithmetic of a training step's memory and traffic: constants with their sources, and pure functions of numbers
and architecture specs (no recipe, no plan, no I/O), so each can be checked on its own against DeepSpeed's estimators
and the tensors autograd keeps (tests/unit/memory/test_memory.py).

Units: bytes here; :mod:`recipekit.memory.estimate` turns them into GiB (2**30 bytes, what ``nvidia-smi``/``npu-smi``
and ``hw.memory_gib`` use) and GB (10**9 bytes, what link bandwidths are quoted in).

Model states (weights, gradients, optimizer) follow DeepSpeed's own estimators so the two can be compared number for
number (``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``); activations follow Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", re-derived for the Llama/Qwen2 block as Hugging Face
implements it.

How many bytes a weight, a gradient or an optimizer state takes depends on the precision and on who trains (the
Trainer's AMP under DDP, or DeepSpeed): :func:`regime` decides that once, and every function below takes its answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.plan.modelsize import ParamCounts, linear_shapes, lora_targets, mlp_width
from recipekit.plan.parallelism import STAGE3_PREFETCH_FACTOR
from recipekit.recipe.sections import LoraSpec, ModelSpec
from recipekit.runtime.boundary import recipeview

GIB = 2**30
GB = 1e9

# ------------------------------------------------------------------------------------------------------ constants
#: Bytes of one element: bf16/fp16 and fp32.
HALF, FULL = 2, 4
#: AdamW's two moments, fp32. With 16-bit weights DeepSpeed adds a 4-byte fp32 master copy; its comment counts
#: "18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit", on top of the 16-bit weights.
ADAM_MOMENT_BYTES = 8
#: The fp32 gradient copy the optimizer steps on. ZeRO-1/2 keep a whole partition of it; ZeRO-3 builds it one
#: sub-group at a time, and DeepSpeed's ZeRO-3 estimator counts 18 bytes per parameter in all, i.e. 2 here.
FP32_GRAD_BYTES_ZERO3 = 2
#: Torch DDP keeps its flat gradient buckets beside the gradients (``gradient_as_bucket_view`` is off): gradients × 2
#: when there is more than one rank.
DDP_BUCKET_COPY = 2
#: DeepSpeed's ``additional_buffer_factor`` for host memory: pinned staging buffers around offloaded states.
HOST_BUFFER_FACTOR = 1.5

#: QLoRA's NF4 base weights: 4 bits per weight, plus block-wise quantization constants. One fp32 absmax per block
#: of 64 weights (4/64 byte per weight); with double quantization an 8-bit absmax per block plus one fp32 constant
#: per 256 blocks (QLoRA paper, Dettmers et al. 2023, section 3). Only the decoder's linear layers are quantized.
NF4_BYTES = 0.5
NF4_BLOCK = 64
NF4_DOUBLE_QUANT_BLOCK = 256

#: Loss at the start of backward: cross-entropy keeps the fp32 log-softmax (4 bytes per vocabulary entry); its
#: incoming gradient and the logits' gradient (fp32 each) exist at the same time: 12 bytes per entry at the peak.
#: Hugging Face upcasts logits to fp32 before the loss (``ForCausalLMLoss``: ``logits = logits.float()``).
LOGITS_SAVED_BYTES = 4
LOGITS_PEAK_BYTES = 12
#: RMSNorm as Hugging Face writes it upcasts its input to fp32 and autograd keeps that copy (4 bytes per element).
NORM_FP32_BYTES = 4
#: A dropout mask is a bool tensor on CUDA and NPU.
DROPOUT_MASK_BYTES = 1

#: Allowance for what no formula above counts: allocator fragmentation and caching, cuBLAS/CANN workspaces,
#: optimizer temporaries. A round figure, not a measurement.
ALLOCATOR_ALLOWANCE_GIB = 2.0
#: DeepSpeed ZeRO-1/2 with ``overlap_comm`` "uses 4.5x the allgather_bucket_size and reduce_bucket_size values"
#: (Hugging Face Transformers, DeepSpeed integration guide: 5e8 elements → 5e8 × 2 bytes × 2 × 4.5 = 9 GB).
ZERO12_OVERLAP_BUFFER_FACTOR = 4.5
#: Share of a training step's FLOPs spent in backward (2 of 6 × params per token are forward).
BACKWARD_SHARE = 2 / 3
#: Host ↔ device bandwidth for offload, GB/s per device (PCIe 4.0 x16 in practice).
PCIE_GBPS = 25.0
#: Local NVMe bandwidth for ZeRO-Infinity offload, GB/s per node (a few drives striped).
NVME_GBPS = 6.0
#: Host memory bandwidth one node's CPU Adam can use, GB/s: the host optimizer step is memory-bound.
HOST_MEMORY_GBPS = 100.0
#: Bytes CPU Adam moves per parameter: read fp32 weight, gradient and two moments, write them back plus a 16-bit copy.
HOST_ADAM_BYTES_PER_PARAM = 30


def dtype_name(size: float) -> str:
    """How the bases name an element width."""
    names: dict[float, str] = {HALF: "16-bit", FULL: "fp32"}
    return names.get(size, f"{size:g}-byte")


# --------------------------------------------------------------------------------------------------------- regime
@dataclass(frozen=True)
class Regime:
    """Bytes per parameter of each model state, and per element of activations and traffic, under one precision
    and one way of training. Decided once by :func:`regime`; the estimate's counts and its words both read it, so
    the text cannot say "16-bit" where the count uses 4 bytes.
    """

    precision: str
    zero_stage: int
    ddp: bool  # torch DDP under the Trainer (no DeepSpeed): its gradient buckets, its fp32 all-reduce
    weight: int  # a trainable weight as stored: 16-bit (DeepSpeed casts the model) or fp32
    autocast_copy: int  # AMP's 16-bit cast of each trainable weight, kept from forward to backward
    frozen_weight: int  # an untrained, unquantised weight (LoRA's base)
    gradient: int  # what backward writes and data parallelism reduces
    fp32_gradient: int  # the fp32 copy the optimizer steps on (0 where the gradient already is fp32)
    master_weight: int  # an fp32 master copy (0 where the stored weights are fp32 already)
    element: int  # an activation, or a weight or bucket element on the wire
    megatron: bool = False  # Megatron-core's mixed precision: 16-bit weights, fp32 main gradients, fp32 master
    distributed_optimizer: bool = False  # its optimizer states (and fp32 gradient copy) sharded over data parallel
    fp8_weight_cache: int = 0  # FP8 training: Transformer Engine's FP8 copy of each weight and its transpose

    @property
    def optimizer(self) -> int:
        """Optimizer bytes per trainable parameter: the master copy (if any) and Adam's moments."""
        return self.master_weight + ADAM_MOMENT_BYTES

    @property
    def autocast(self) -> bool:
        """The Trainer's AMP: fp32 weights, 16-bit compute, an fp32 residual stream."""
        return self.autocast_copy > 0

    @property
    def shards_optimizer(self) -> bool:
        """Whether optimizer states (and the fp32 gradient copy) are split over the data-parallel ranks."""
        return self.zero_stage >= 1 or self.distributed_optimizer

    def weight_words(self, kind: str) -> str:
        """The weights' dtypes as the basis text names them (``kind`` is the mode: LoRA has a base and adapters)."""
        copy = f" + {dtype_name(self.autocast_copy)} autocast copy" if self.autocast else ""
        copy += f" + {self.fp8_weight_cache} B FP8 copies" if self.fp8_weight_cache else ""
        if recipeview.trains_adapter(kind):
            base = "NF4" if kind == "qlora" else dtype_name(self.frozen_weight)
            return f"{base} base + {dtype_name(self.weight)} adapter{copy}"
        return dtype_name(self.weight) + copy

    @property
    def gradient_words(self) -> str:
        main = " (Megatron's main gradients)" if self.megatron and self.gradient == FULL else ""
        return dtype_name(self.gradient) + main + (f" + {dtype_name(FULL)} copy" if self.fp32_gradient else "")

    @property
    def optimizer_words(self) -> str:
        if self.master_weight:
            return f"{dtype_name(self.master_weight)} master + Adam m, v"
        return f"Adam m, v {dtype_name(FULL)} (the {dtype_name(self.weight)} weights are the master)"


def regime(
    precision: str, zero_stage: int, *, deepspeed: bool, megatron: bool = False, distributed_optimizer: bool = False
) -> Regime:
    """The byte widths of a run trained at ``precision`` under ``zero_stage``, with or without DeepSpeed (the plan
    says which: :attr:`recipekit.plan.plan.Plan.uses_deepspeed`; tensor parallelism runs DeepSpeed at stage 0 too).

    * fp32 (the CPU's, or asked for): everything fp32; the weights are their own master, no fp32 gradient copy.
    * stage 0 without DeepSpeed, in 16 bits: torch DDP under the Trainer's AMP (runtime/train.py ``weight_dtype``):
      fp32 weights are their own master copy, autocast keeps a 16-bit copy of each weight from forward to
      backward, gradients are fp32 (DDP's bucket copy depends on the ranks: :func:`model_states`). LoRA:
      a 16-bit base, fp32 adapters.
    * DeepSpeed in 16 bits (ZeRO 0-3): DeepSpeed casts the model to 16 bits and keeps an fp32 master copy, fp32
      gradients and Adam's moments: 2 + 2 + 4 + 12 bytes per parameter at ZeRO 0-2 (DeepSpeed's 2 + 18; stage 0
      is its BF16/FP16 optimizer, nothing partitioned), 2 + 2 + 2 + 12 at ZeRO-3.
    * Megatron-core (``megatron``, at ZeRO stage 0: a layout only it runs): 16-bit weights, fp32 main gradients for
      bf16 (Megatron-LM accumulates and reduces bf16 gradients in fp32), fp32 master and Adam's moments: 18 bytes,
      or 6 + 12/d with the distributed optimizer (fp16: 2-byte gradients and a sharded fp32 copy, 4 + 16/d),
      the table of Megatron-LM's docs/source/distrib_optimizer.md.
    * fp8 trains with bf16 byte widths and adds Transformer Engine's FP8 copy of each weight and its transpose.
    """
    cache = 2 if precision == "fp8" else 0
    precision_bytes = "bf16" if precision == "fp8" else precision
    if megatron and zero_stage == 0 and precision_bytes != "fp32":
        bf16 = precision_bytes == "bf16"
        return Regime(
            precision,
            zero_stage,
            ddp=False,
            weight=HALF,
            autocast_copy=0,
            frozen_weight=HALF,
            gradient=FULL if bf16 else HALF,
            fp32_gradient=0 if bf16 else FULL,
            master_weight=FULL,
            element=HALF,
            megatron=True,
            distributed_optimizer=distributed_optimizer,
            fp8_weight_cache=cache,
        )
    ddp = not deepspeed
    if precision_bytes == "fp32":
        return Regime(
            precision,
            zero_stage,
            ddp=ddp,
            weight=FULL,
            autocast_copy=0,
            frozen_weight=FULL,
            gradient=FULL,
            fp32_gradient=0,
            master_weight=0,
            element=FULL,
        )
    if ddp:
        return Regime(
            precision,
            zero_stage,
            ddp=True,
            weight=FULL,
            autocast_copy=HALF,
            frozen_weight=HALF,
            gradient=FULL,
            fp32_gradient=0,
            master_weight=0,
            element=HALF,
        )
    return Regime(
        precision,
        zero_stage,
        ddp=False,
        weight=HALF,
        autocast_copy=0,
        frozen_weight=HALF,
        gradient=HALF,
        fp32_gradient=FP32_GRAD_BYTES_ZERO3 if zero_stage == 3 else FULL,
        master_weight=FULL,
        element=HALF,
        fp8_weight_cache=cache,
    )


# ---------------------------------------------------------------------------------------------------- model states
@dataclass(frozen=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer states on one device, and what offload moved off it."""

    weights: float
    gradients: float
    optimizer: float
    host: float  # per device, offloaded to host memory
    nvme: float  # per device, offloaded to NVMe

    @property
    def device(self) -> float:
        return self.weights + self.gradients + self.optimizer


def qlora_base_bytes(counts: ParamCounts, *, double_quant: bool, other_bytes: int) -> float:
    """Bytes of a 4-bit base model: NF4 linear weights with their constants, everything else in ``other_bytes``."""
    constants = (1 / NF4_BLOCK + 4 / (NF4_BLOCK * NF4_DOUBLE_QUANT_BLOCK)) if double_quant else 4 / NF4_BLOCK
    linear = counts.layers * counts.linear_per_layer
    return linear * (NF4_BYTES + constants) + (counts.total - linear) * other_bytes


def model_states(
    params: float,
    reg: Regime,
    *,
    dp: int,
    trainable: float | None = None,
    frozen_weight_bytes: float | None = None,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    largest_layer: float = 0,
) -> ModelStates:
    """Weights, gradients and AdamW states per device under DDP or a ZeRO stage, counted as DeepSpeed counts them.

    ``params`` are the parameters one model replica holds on this device's slice (all of them without TP/PP;
    under TP, :func:`recipekit.plan.modelsize.tensor_parallel_share`);
    ``trainable`` of those get gradients and optimizer states (default: all); the frozen rest is stored at
    ``frozen_weight_bytes`` per parameter (QLoRA's 4-bit base; default: the regime's). Stage 0 under AMP is
    4 + 2 + 4 + 4 + 8 = 22 bytes per parameter with more than one rank.

    ZeRO-1 partitions optimizer states (and the fp32 gradient copy) over the ``dp`` ranks, ZeRO-2 also the
    gradients, ZeRO-3 also the weights, and gathers the largest layer's weights and gradients whole. Optimizer
    offload moves the optimizer states and fp32 gradients, and at ZeRO-2/3 the gradient partitions too, to the host
    (or NVMe); parameter offload (ZeRO-3) moves the weights. With ``trainable == params`` in 16 bits this equals
    DeepSpeed's ``estimate_zero2_model_states_mem_needs`` (2 + 18/N bytes per parameter) and
    ``estimate_zero3_model_states_mem_needs`` (18/N + 4 × largest layer) device figures.
    """
    trainable = params if trainable is None else trainable
    frozen = params - trainable
    frozen_b = reg.frozen_weight if frozen_weight_bytes is None else frozen_weight_bytes
    grad_b = reg.gradient * (DDP_BUCKET_COPY if reg.ddp and dp > 1 else 1)

    def share(stage: int) -> int:  # how many ranks a state is split over once ZeRO reaches ``stage``
        return dp if reg.zero_stage >= stage or (stage == 1 and reg.distributed_optimizer) else 1

    weights = (trainable * (reg.weight + reg.autocast_copy + reg.fp8_weight_cache) + frozen * frozen_b) / share(3)
    grads = trainable * grad_b / share(2)
    fp32_grads = trainable * reg.fp32_gradient / share(1)
    optimizer = trainable * reg.optimizer / share(1)
    gathered = largest_layer * reg.element if reg.zero_stage == 3 else 0.0  # once as weights, once as gradients

    moved = {"cpu": 0.0, "nvme": 0.0}
    if offload_optimizer != "none":
        if reg.zero_stage >= 2:
            moved[offload_optimizer] += grads
            grads = 0.0
        moved[offload_optimizer] += fp32_grads + optimizer
        fp32_grads = optimizer = 0.0
    if offload_param != "none":
        moved[offload_param] += weights
        weights = 0.0
    return ModelStates(
        weights=weights + gathered,
        gradients=grads + fp32_grads + gathered,
        optimizer=optimizer,
        host=moved["cpu"],
        nvme=moved["nvme"],
    )


# ----------------------------------------------------------------------------------------------------- activations
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


# --------------------------------------------------------------------------------------------------- ZeRO buffers
def zero_buffers(
    reg: Regime, *, reduce_bucket: int, overlap_comm: bool, trainable: float, hidden: int
) -> tuple[float, str]:
    """Bytes of DeepSpeed's communication buckets and how they were counted, bounded by the gradients they could
    ever hold. ZeRO-3 adds the prefetch bucket the plan's ds_config sets."""
    bucket = min(reduce_bucket, trainable)
    e = reg.element
    if reg.zero_stage in (1, 2):
        factor = ZERO12_OVERLAP_BUFFER_FACTOR if overlap_comm else 1.0
        return (
            2 * bucket * e * factor,
            f"reduce + all-gather buckets {bucket / 1e6:.0f} M elements × {e} B × {factor:g}",
        )
    if reg.zero_stage == 3:
        prefetch = STAGE3_PREFETCH_FACTOR * hidden**2
        return e * (
            bucket + prefetch
        ), f"reduce bucket {bucket / 1e6:.0f} M + prefetch {prefetch / 1e6:.0f} M elements × {e} B"
    return 0.0, "none without DeepSpeed" if reg.ddp else "none at ZeRO stage 0"


# ------------------------------------------------------------------------------------------------------- traffic
@dataclass(frozen=True)
class Traffic:
    """Data-parallel bytes one device sends in one optimizer step: what compute can hide and what it cannot."""

    pattern: str
    hideable: float  # bytes that overlap compute, when the engine overlaps
    exposed: float  # bytes after the step's compute (the weight all-gather after a ZeRO-1/2 step)
    window_share: float  # the share of the step's compute time they can hide behind


def dp_traffic(reg: Regime, *, dp: int, accum: int, params: float, trainable: float, checkpointing: bool) -> Traffic:
    """Per-device ring volume of one optimizer step, (n − 1)/n of the data per pass.

    DeepSpeed communicates 16-bit gradients and weights; DDP under AMP all-reduces fp32 gradients (the regime's
    ``gradient``). DDP all-reduces gradients once per step (no_sync on accumulation micro-steps): 2 passes. ZeRO-1
    reduce-scatters gradients and all-gathers updated weights at the step boundary. ZeRO-2 reduce-scatters at every
    micro-step. ZeRO-3 all-gathers weights for forward, backward (and recomputation) and reduce-scatters gradients
    every micro-step.

    Overlap: gradient traffic hides behind backward (DDP's buckets, ``overlap_comm``): for DDP and ZeRO-1 only the
    last micro-step's backward, for ZeRO-2 every backward; ZeRO-3's prefetch hides behind the whole step. Megatron's
    distributed optimizer reduce-scatters the fp32 main gradients behind the last micro-step's backward and
    all-gathers the updated 16-bit weights behind the next step's first forward (``overlap_grad_reduce``,
    ``overlap_param_gather``): one micro-step's compute hides them.
    """
    ring = (dp - 1) / dp
    grads = reg.gradient * trainable
    trained_weights, all_weights = reg.element * trainable, reg.element * params
    if reg.megatron and reg.distributed_optimizer:  # overlap_grad_reduce and overlap_param_gather
        return Traffic(
            "reduce-scatter gradients + all-gather weights once per step (distributed optimizer)",
            ring * (grads + trained_weights),
            0.0,
            1 / accum,
        )
    if reg.zero_stage == 0:
        return Traffic("all-reduce of gradients once per step", 2 * ring * grads, 0.0, BACKWARD_SHARE / accum)
    if reg.zero_stage == 1:
        return Traffic(
            "reduce-scatter gradients + all-gather weights once per step",
            ring * grads,
            ring * trained_weights,
            BACKWARD_SHARE / accum,
        )
    if reg.zero_stage == 2:
        return Traffic(
            "reduce-scatter gradients every micro-step + all-gather weights per step",
            accum * ring * grads,
            ring * trained_weights,
            BACKWARD_SHARE,
        )
    passes = 3 if checkpointing else 2
    return Traffic(
        f"all-gather weights ×{passes} + reduce-scatter gradients every micro-step",
        accum * ring * (passes * all_weights + grads),
        0.0,
        1.0,
    )


def offload_seconds(
    reg: Regime,
    *,
    offload_optimizer: str,
    offload_param: str,
    checkpointing: bool,
    dp: int,
    accum: int,
    devices_per_node: int,
    params: float,
    trainable: float,
) -> float:
    """Seconds per step offload adds, none of it hidden (rough: PCIe, NVMe and host-memory bandwidth bound).

    Optimizer offload: gradient partitions go down (every micro-step from ZeRO-2 on), updated weights come back, and
    CPU Adam streams the node's optimizer states through host memory (NVMe: read and written too). Parameter
    offload (ZeRO-3): each micro-step fetches the weight partition for forward, backward and recomputation.
    """
    seconds = 0.0
    if offload_optimizer != "none":
        part = trainable / dp
        downs = accum if reg.zero_stage >= 2 else 1
        seconds += (downs * reg.gradient + reg.element) * part / GB / PCIE_GBPS
        seconds += part * devices_per_node * HOST_ADAM_BYTES_PER_PARAM / GB / HOST_MEMORY_GBPS
        if offload_optimizer == "nvme":
            seconds += 2 * part * devices_per_node * (reg.fp32_gradient + reg.optimizer) / GB / NVME_GBPS
    if offload_param != "none":
        passes = 3 if checkpointing else 2
        fetched = accum * passes * reg.element * params / dp
        seconds += fetched / GB / PCIE_GBPS
        if offload_param == "nvme":
            seconds += fetched * devices_per_node / GB / NVME_GBPS
    return seconds


# ---------------------------------------------------------------------------------------------- 3D parallelism
def bubble_fraction(
    pipeline_parallel: int, micro_batches: int, virtual_stages: int = 1, *, schedule: str = "1f1b"
) -> float:
    """Idle share of a pipeline step: (p − 1)/(v·m + p − 1) for p stages, m micro-batches and v virtual stages per
    rank (1F1B and GPipe: v = 1; interleaved 1F1B divides the bubble's time by v, Narayanan et al. 2021, §2.2.2).

    DualPipe (DeepSeek-V3 report, Table 2): a bubble of (p/2 − 1)(F&B + B − 3W) against 1F1B's (p − 1)(F + B); with
    backward twice the forward and the weight gradient half the backward (B = 2F, W = F, F&B = F + B) that is
    (p/2 − 1)·2F against m micro-batches of 3F."""
    p, m, v = pipeline_parallel, micro_batches, virtual_stages
    if schedule == "dualpipe":
        idle = max(0.0, p / 2 - 1) * 2
        return idle / (3 * m + idle)
    return (p - 1) / (v * m + p - 1)


def layers_in_flight(
    stage: int, layers: int, *, stages: int, micro_batches: int, virtual_stages: int = 1, schedule: str = "1f1b"
) -> float:
    """Layer-micro-batches whose activations stage ``stage`` (0 first) of ``stages`` holds at once.

    Non-interleaved 1F1B: the stage runs p − stage forwards before its first backward, so that many micro-batches
    (at most m) of its layers are alive. Interleaved: Megatron-core's warm-up on rank r is 2(p − r − 1) + (v − 1)·p
    chunk forwards (``get_pp_rank_microbatches``, micro-batches in groups of p), one more before the first backward,
    each a chunk of layers / v: on the first stage L·(1 + (p − 1)/(p·v)) of an L-layer model, Korthikanti et al.'s
    figure. DualPipe: p + 1 micro-batches on every rank (DeepSeek-V3 report, Table 2). No pipeline: one micro-batch.
    """
    p, m, v = stages, micro_batches, virtual_stages
    if p == 1:
        return float(layers)
    if schedule == "dualpipe":
        return float(min(p + 1, m) * layers)
    if v == 1:
        return float(min(p - stage, m) * layers)
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    return chunks * layers / v


def tp_inside_node(tensor_parallel: int, devices_per_pod: int) -> bool:
    """TP all-reduces sit on the critical path every layer: they only pay off on the intra-node link."""
    return tensor_parallel <= devices_per_pod and devices_per_pod % tensor_parallel == 0


#: AutoTP's all-reduces of b·s·h activations per decoder layer (deepspeed.module_inject.layers): forward, the two
#: row-parallel outputs (o_proj, down_proj); backward, the input gradient of each column-parallel projection, which
#: AutoTP all-reduces one by one (q, k, v, gate, up: Megatron fuses them into one per block); recomputation under
#: gradient checkpointing runs the forward's two again.
AUTOTP_FORWARD_ALLREDUCES = 2
AUTOTP_BACKWARD_ALLREDUCES = 5


#: Megatron-core's per layer: one all-reduce after attention and one after the MLP in forward, one for the fused QKV
#: and one for the fused gate/up input gradient in backward (Shoeybi et al. 2019, figure 4: 4 per layer); under
#: sequence parallelism each is an all-gather and a reduce-scatter, the same bytes (Korthikanti et al. 2022, §4.2.2).
MEGATRON_FORWARD_ALLREDUCES = 2
MEGATRON_BACKWARD_ALLREDUCES = 2


def tp_allreduce_count(checkpointing: bool, *, megatron: bool = False) -> int:
    """All-reduces of b·s·h activations per decoder layer per micro-step under AutoTP (or Megatron-core)."""
    forward, backward = (
        (MEGATRON_FORWARD_ALLREDUCES, MEGATRON_BACKWARD_ALLREDUCES)
        if megatron
        else (AUTOTP_FORWARD_ALLREDUCES, AUTOTP_BACKWARD_ALLREDUCES)
    )
    return forward * (2 if checkpointing else 1) + backward


def tp_allreduce_bytes_per_layer(
    reg: Regime,
    *,
    tensor_parallel: int,
    micro_batch: int,
    seq_len: int,
    hidden: int,
    checkpointing: bool,
    megatron: bool = False,
) -> float:
    """Bytes one device moves for a layer's TP all-reduces in one micro-step (:func:`tp_allreduce_count` of them),
    each a ring all-reduce moving 2 (t − 1)/t of the b·s·h activations (``seq_len``: this rank's, after CP)."""
    t = tensor_parallel
    per_allreduce = 2 * (t - 1) / t * micro_batch * seq_len * hidden * reg.element
    return tp_allreduce_count(checkpointing, megatron=megatron) * per_allreduce


def tp_head_bytes(reg: Regime, model: ModelSpec, *, tensor_parallel: int, micro_batch: int, seq_len: int) -> float:
    """Bytes one device moves per micro-step for the embedding and head under AutoTP.

    An untied head is column-parallel with a gathered output: an all-gather of the b·s·V logits ((t − 1)/t of them
    arrive) in forward and an all-reduce of its b·s·h input gradient in backward. A tied pair is vocabulary-parallel:
    the embedding all-reduces its b·s·h output in forward, the head its input gradient in backward (the loss's own
    all-reduces are b·s scalars, left out).
    """
    t = tensor_parallel
    tokens, h = micro_batch * seq_len, model.hidden_size
    allreduce = 2 * (t - 1) / t * tokens * h * reg.element
    if vocab_parallel_logits(model):
        return 2 * allreduce
    return (t - 1) / t * tokens * model.vocab_size * reg.element + allreduce

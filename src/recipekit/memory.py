"""Memory, compute, time and cost of a recipe's plan, and the data-parallel layouts that fit.

Everything here is arithmetic on the recipe's architecture numbers and the plan's layout, so ``recipekit plan`` can
answer "does it fit, how long, how much" before anything is downloaded or scheduled. The estimators are pure; the one
read from disk is :func:`load_parallel_options`, because the parallel layouts are data (``recipes/parallel/*.yaml``),
never a list in code.

Units: memory in GiB (2**30 bytes, what ``nvidia-smi``/``npu-smi`` and ``hw.memory_gib`` use), network volumes in GB
(10**9 bytes, what link bandwidths are quoted in), time in seconds.

Model states (weights, gradients, optimizer) follow DeepSpeed's own estimators so the two can be compared number for
number (``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``); activations follow Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", re-derived for the Llama/Qwen2 block as Hugging Face
implements it (checked against the tensors autograd saves, see tests/unit/test_memory.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from recipekit.errors import Problem, RecipeError
from recipekit.images import ImageMatrix
from recipekit.modelsize import LORA_MODULES, ParamCounts, count_params, linear_shapes, lora_params, lora_targets
from recipekit.plan import STAGE3_PREFETCH_FACTOR, Plan, make_plan
from recipekit.recipe import LoraSpec, ModelSpec, ParallelSpec, Recipe
from recipekit.schema import to_data, validate

GIB = 2**30
GB = 1e9

# ------------------------------------------------------------------------------------------------------ constants
#: Bytes per parameter of mixed-precision AdamW, as DeepSpeed counts them (its comment: "18 = 2_grads_16bit +
#: 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit", on top of 2 bytes of 16-bit weights).
MIXED_WEIGHT_BYTES = 2
MIXED_GRAD_BYTES = 2
#: The fp32 gradient copy the optimizer steps on. ZeRO-1/2 keep a whole partition of it (4 bytes); ZeRO-3 builds it
#: one sub-group at a time, and DeepSpeed's ZeRO-3 estimator counts 18 bytes per parameter in all, i.e. 2 here.
FP32_GRAD_BYTES_ZERO12 = 4
FP32_GRAD_BYTES_ZERO3 = 2
#: fp32 master weights + Adam's two moments.
MIXED_OPTIMIZER_BYTES = 12
#: Plain fp32 training (CPU): weights, gradients, Adam moments; no master copy, no fp32 gradient copy.
FP32_WEIGHT_BYTES, FP32_GRAD_BYTES, FP32_OPTIMIZER_BYTES = 4, 4, 8
#: Torch DDP under the Trainer's AMP (the bundle without DeepSpeed, runtime/train.py ``weight_dtype``): fp32 weights
#: are their own master copy, autocast keeps a 16-bit copy of each weight from forward to backward, gradients are
#: fp32 and DDP's flat buckets hold a second copy of them (``gradient_as_bucket_view`` is off), Adam moments fp32.
AUTOCAST_WEIGHT_COPY_BYTES = 2
DDP_BUCKET_COPY = 2  # gradients × 2 when there is more than one rank
#: DeepSpeed's ZeRO-3 gathers the largest layer's 16-bit parameters and gradients whole: 4 bytes per parameter of it.
ZERO3_LARGEST_LAYER_BYTES = 4
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

#: fit_problem tries at most this many doublings of the node count.
MAX_NODE_DOUBLINGS = 6
#: The parallel options' fields that make a layout; every other field is a setting carried over unchanged.
_LAYOUT_FIELDS = ("zero_stage", "offload_optimizer", "offload_param")


def qlora_base_bytes(counts: ParamCounts, *, double_quant: bool, other_bytes: int) -> float:
    """Bytes of a 4-bit base model: NF4 linear weights with their constants, everything else in ``other_bytes``."""
    constants = (1 / NF4_BLOCK + 4 / (NF4_BLOCK * NF4_DOUBLE_QUANT_BLOCK)) if double_quant else 4 / NF4_BLOCK
    linear = counts.layers * counts.linear_per_layer
    return linear * (NF4_BYTES + constants) + (counts.total - linear) * other_bytes


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


def model_states(
    params: float,
    *,
    trainable: float | None = None,
    frozen_weight_bytes: float | None = None,
    zero_stage: int,
    dp: int,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    largest_layer: float = 0,
    precision: str = "bf16",
) -> ModelStates:
    """Weights, gradients and AdamW states per device under DDP or a ZeRO stage, counted as DeepSpeed counts them.

    ``params`` are the parameters one model replica holds on this device's slice (all of them without TP/PP);
    ``trainable`` of those get gradients and optimizer states (default: all); the frozen rest is stored at
    ``frozen_weight_bytes`` per parameter (QLoRA's 4-bit base; default: 16 bits, or 32 for fp32 training).
    Stage 0 is torch DDP under AMP (see ``AUTOCAST_WEIGHT_COPY_BYTES``): 6 + 8 + 8 = 22 bytes per parameter.

    ZeRO-1 partitions optimizer states (and the fp32 gradient copy) over the ``dp`` ranks, ZeRO-2 also the 16-bit
    gradients, ZeRO-3 also the weights, and adds DeepSpeed's gather allowance for the largest layer. Optimizer
    offload moves the optimizer states and fp32 gradients, and at ZeRO-2/3 the 16-bit gradient partitions too, to the
    host (or NVMe); parameter offload (ZeRO-3) moves the weights. With ``trainable == params`` this equals
    DeepSpeed's ``estimate_zero2_model_states_mem_needs`` (2 + 18/N bytes per parameter) and
    ``estimate_zero3_model_states_mem_needs`` (18/N + 4 × largest layer) device figures.
    """
    trainable = params if trainable is None else trainable
    frozen = params - trainable
    if precision == "fp32":
        weight_b, grad_b, fp32_grad_b, optim_b = FP32_WEIGHT_BYTES, FP32_GRAD_BYTES, 0, FP32_OPTIMIZER_BYTES
    elif zero_stage == 0:
        weight_b, grad_b = FP32_WEIGHT_BYTES + AUTOCAST_WEIGHT_COPY_BYTES, FP32_GRAD_BYTES
        fp32_grad_b, optim_b = 0, FP32_OPTIMIZER_BYTES
    else:
        weight_b, grad_b, optim_b = MIXED_WEIGHT_BYTES, MIXED_GRAD_BYTES, MIXED_OPTIMIZER_BYTES
        fp32_grad_b = FP32_GRAD_BYTES_ZERO3 if zero_stage == 3 else FP32_GRAD_BYTES_ZERO12
    if zero_stage == 0 and dp > 1:
        grad_b *= DDP_BUCKET_COPY
    frozen_b = (
        frozen_weight_bytes
        if frozen_weight_bytes is not None
        else (FP32_WEIGHT_BYTES if precision == "fp32" else MIXED_WEIGHT_BYTES)
    )

    def share(stage: int) -> int:  # how many ranks a state is split over once ZeRO reaches ``stage``
        return dp if zero_stage >= stage else 1

    weights = (trainable * weight_b + frozen * frozen_b) / share(3)
    grads = trainable * grad_b / share(2)
    fp32_grads = trainable * fp32_grad_b / share(1)
    optimizer = trainable * optim_b / share(1)
    gathered = largest_layer * ZERO3_LARGEST_LAYER_BYTES / 2 if zero_stage == 3 else 0.0

    moved = {"cpu": 0.0, "nvme": 0.0}
    if offload_optimizer != "none":
        if zero_stage >= 2:
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


def layer_activation_bytes(
    model: ModelSpec,
    *,
    tokens: int,
    act_bytes: int,
    full_training: bool,
    lora: LoraSpec | None = None,
    autocast: bool = False,
    tp: int = 1,
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
    against GPT's 34h). Under the Trainer's AMP ``autocast`` (DDP, fp32 weights) the residual stream is fp32 and every
    linear layer keeps its own 16-bit cast of its input: 30h + 4·kv_dim + 8i. Tensor parallelism (without sequence
    parallelism) splits everything but the norms, as in Korthikanti's 10 + 24/t.
    """
    h, i = model.hidden_size, model.intermediate_size
    kv = model.num_kv_heads * model.head_dim
    a = act_bytes
    residual = 4 if autocast and full_training else a
    norms = 2 * NORM_FP32_BYTES * h + (2 * residual * h if full_training else 0)  # replicated under TP
    sharded = a * (2 * h + 2 * kv) + 3 * a * i  # Q, K, V, attention output; gate, SiLU, up
    if full_training:
        copies_attn, copies_mlp = (3, 2) if autocast else (1, 1)  # q/k/v and gate/up inputs
        sharded += a * ((copies_attn + copies_mlp) * h + i)  # the o_proj input is the attention output
    if lora is not None:
        shapes = linear_shapes(model)
        targets = lora_targets(lora)
        sharded += a * lora.r * len(targets)
        if lora.dropout > 0:
            sharded += sum((a + DROPOUT_MASK_BYTES) * shapes[m][0] for m in targets)
        elif autocast:  # each adapter casts its own copy of the input
            sharded += sum(a * shapes[m][0] for m in targets)
        else:  # the adapters keep the very input tensors: once per distinct input not already kept
            distinct = {
                "attn": h if {"q_proj", "k_proj", "v_proj"} & set(targets) else 0,
                "mlp": h if {"gate_proj", "up_proj"} & set(targets) else 0,
                "mid": i if "down_proj" in targets else 0,
            }
            sharded += a * sum(distinct.values())
    return tokens * (norms + sharded / tp)


def activation_bytes(
    model: ModelSpec,
    *,
    micro_batch: int,
    seq_len: int,
    act_bytes: int,
    full_training: bool,
    checkpointing: bool,
    lora: LoraSpec | None = None,
    autocast: bool = False,
    tp: int = 1,
    layers: int | None = None,
    in_flight: int = 1,
) -> ActivationBytes:
    """Activations of ``layers`` decoder layers (default: all) with ``in_flight`` micro-batches alive at once.

    Without recomputation every layer keeps :func:`layer_activation_bytes`. With full gradient checkpointing (one
    checkpoint per decoder layer, Hugging Face's) each layer keeps only its input, 2·s·b·h bytes in 16 bits, and
    backward rebuilds one layer at a time. Pipeline parallelism (1F1B) keeps ``in_flight`` = min(p, m) micro-batches
    on its first stage. The loss's logits are vocabulary-parallel under TP.
    """
    tokens = micro_batch * seq_len
    count = model.num_layers if layers is None else layers
    full_layer = layer_activation_bytes(
        model, tokens=tokens, act_bytes=act_bytes, full_training=full_training, lora=lora, autocast=autocast, tp=tp
    )
    h = model.hidden_size
    residual = 4 if autocast and full_training else act_bytes
    if checkpointing:
        kept, recomputed = count * in_flight * tokens * residual * h, full_layer
    else:
        kept, recomputed = count * in_flight * full_layer, 0.0
    head = tokens * (NORM_FP32_BYTES * h + ((residual + act_bytes) * h if full_training else 0))
    logits = tokens * model.vocab_size * LOGITS_SAVED_BYTES / tp
    return ActivationBytes(layers=kept, recomputed=recomputed, head=head, logits_saved=logits)


# ----------------------------------------------------------------------------------------------------- the estimate
@dataclass(frozen=True)
class MemoryItem:
    """One named share of a device's memory and how it was counted."""

    name: str
    gib: float
    basis: str


@dataclass(frozen=True)
class Layout:
    """The layout the estimate is for, as the plan decided it."""

    parallel: str
    zero_stage: int
    offload_optimizer: str
    offload_param: str
    gradient_checkpointing: bool
    nodes: int
    devices_per_pod: int
    world_size: int
    dp_size: int
    tensor_parallel: int
    pipeline_parallel: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    global_batch_size: int
    seq_len: int
    precision: str

    def describe(self) -> str:
        offload = [
            f"{what} → {where}"
            for what, where in (("optimizer", self.offload_optimizer), ("params", self.offload_param))
            if where != "none"
        ]
        parts = [
            self.parallel + (f" ({', '.join(offload)})" if offload else ""),
            f"checkpointing {'on' if self.gradient_checkpointing else 'off'}",
        ]
        if self.tensor_parallel * self.pipeline_parallel > 1:
            parts.append(f"TP {self.tensor_parallel} × PP {self.pipeline_parallel}")
        parts.append(
            f"micro {self.micro_batch_size} × accum {self.gradient_accumulation_steps} × dp {self.dp_size}"
            f" = {self.global_batch_size} × {self.seq_len} tokens"
        )
        return ", ".join(parts)


@dataclass(frozen=True)
class Compute:
    """FLOPs and the step's compute time at the assumed utilisation."""

    params_total: int
    params_trainable: int
    flops_per_token: float
    tokens_per_step: int
    recompute_factor: float
    peak_tflops: float
    assumed_mfu: float
    time_s: float  # per optimizer step, pipeline bubble included, communication excluded


@dataclass(frozen=True)
class Communication:
    """Data-parallel traffic of one optimizer step, per device."""

    pattern: str
    volume_gb: float
    link: str
    crosses_nodes: bool
    bandwidth_gbps: float
    time_s: float
    exposed_s: float  # what backward (or ZeRO-3 prefetch) cannot hide


@dataclass(frozen=True)
class Offload:
    """Where offloaded states live and what moving them costs per step."""

    host_gib_per_node: float
    host_limit_gib: float  # cluster.memory_gib_per_pod
    nvme_gib_per_node: float
    time_s: float

    @property
    def host_fits(self) -> bool:
        return self.host_gib_per_node <= self.host_limit_gib


@dataclass(frozen=True)
class ThreeD:
    """Tensor and pipeline parallelism, analysed (the bundle's backend runs data parallelism only)."""

    tensor_parallel: int
    pipeline_parallel: int
    micro_batches: int
    bubble_fraction: float
    tp_allreduce_gb_per_layer: float  # per device, one micro-batch's forward and backward
    tp_volume_gb: float  # per device, per optimizer step
    tp_inside_node: bool
    tp_link: str
    tp_time_s: float
    note: str


@dataclass(frozen=True)
class Estimate:
    """Memory per device, compute, communication, time and cost of one recipe under one plan."""

    recipe_name: str
    model_name: str
    hw_name: str
    layout: Layout
    memory: tuple[MemoryItem, ...]
    total_gib: float
    device_gib: float
    headroom_gib: float
    offload: Offload
    compute: Compute
    communication: Communication
    parallel3d: ThreeD | None
    step_time_s: float
    total_steps: int | None
    total_time_s: float | None
    device_hours: float | None
    price_per_device_hour: float | None
    cost: float | None
    notes: tuple[str, ...]
    recipe: Recipe = field(compare=False, repr=False)
    plan: Plan = field(compare=False, repr=False)

    @property
    def fits_device(self) -> bool:
        return self.total_gib <= self.device_gib

    @property
    def fits(self) -> bool:
        """Device memory and, for offload, the pod's host memory both suffice."""
        return self.fits_device and self.offload.host_fits

    @property
    def largest_item(self) -> MemoryItem:
        return max(self.memory, key=lambda item: item.gib)

    def item(self, name: str) -> float:
        return next(item.gib for item in self.memory if item.name == name)


def estimate(recipe: Recipe, plan: Plan, *, price_per_device_hour: float | None = None) -> Estimate:
    """Estimate memory per device, compute, communication, time and cost of ``recipe`` laid out as ``plan``.

    ``price_per_device_hour`` defaults to ``recipe.hw.price_per_device_hour``; without either there is no cost.
    """
    model, hw, par, mode = recipe.model, recipe.hw, recipe.parallel, recipe.mode
    counts = count_params(model)
    lora = mode.lora if mode.kind in ("lora", "qlora") else None
    full_training = lora is None
    trainable_total = counts.total if full_training else lora_params(model, lora)
    tp, pp, dp = plan.layout.tensor_parallel, plan.layout.pipeline_parallel, plan.layout.dp_size
    micro, accum, seq = plan.layout.micro_batch_size, plan.layout.gradient_accumulation_steps, recipe.data.max_len
    act_bytes = 4 if plan.precision == "fp32" else 2
    # Without DeepSpeed the bundle trains under the Trainer's AMP: fp32 weights (LoRA: a 16-bit base, fp32
    # adapters) and autocast; DeepSpeed instead casts the model to 16 bits and keeps its own fp32 master copy.
    autocast = plan.zero_stage == 0 and plan.precision != "fp32"
    notes: list[str] = []

    # --- what one device holds of the model: the heaviest pipeline stage, split over TP
    if pp > 1:
        stage_layers = math.ceil(model.num_layers / pp)
        stage_params = stage_layers * counts.per_layer + max(counts.embedding, counts.head + counts.final_norm)
    else:
        stage_layers, stage_params = model.num_layers, counts.total
    params_dev = stage_params / tp
    trainable_dev = trainable_total * stage_params / counts.total / tp if not full_training else params_dev
    frozen_b: float | None = None
    if mode.kind == "qlora":
        frozen_b = qlora_base_bytes(counts, double_quant=mode.quant.double_quant, other_bytes=act_bytes) / counts.total
    states = model_states(
        params_dev + (0 if full_training else trainable_dev),
        trainable=trainable_dev,
        frozen_weight_bytes=frozen_b,
        zero_stage=plan.zero_stage,
        dp=dp,
        offload_optimizer=par.offload_optimizer,
        offload_param=par.offload_param,
        largest_layer=counts.largest_module / tp,
        precision=plan.precision,
    )

    # --- activations
    acts = activation_bytes(
        model,
        micro_batch=micro,
        seq_len=seq,
        act_bytes=act_bytes,
        full_training=full_training,
        checkpointing=par.gradient_checkpointing,
        lora=lora,
        autocast=autocast,
        tp=tp,
        layers=stage_layers,
        in_flight=min(pp, accum) if pp > 1 else 1,
    )
    logits_peak = acts.logits_saved * LOGITS_PEAK_BYTES / LOGITS_SAVED_BYTES
    if lora is not None and isinstance(lora.target_modules, list):
        unknown = sorted(set(lora.target_modules) - set(LORA_MODULES))
        if unknown:
            notes.append(f"LoRA targets {', '.join(unknown)} are not projections recipekit knows; not counted")

    # --- buffers and overhead
    buffers, buffer_basis = _zero_buffers(recipe, plan.zero_stage, trainable_dev)
    overhead = ALLOCATOR_ALLOWANCE_GIB + hw.runtime_context_gib

    shard = _shard_words(tp, pp)
    memory = (
        MemoryItem("weights", states.weights / GIB, _weights_basis(mode.kind, params_dev, par, shard)),
        MemoryItem("gradients", states.gradients / GIB, _gradients_basis(trainable_dev, par, dp)),
        MemoryItem("optimizer states", states.optimizer / GIB, _optimizer_basis(trainable_dev, par, dp)),
        MemoryItem(
            "activations",
            (acts.layers + acts.recomputed + acts.head) / GIB,
            _activation_basis(par.gradient_checkpointing, micro, seq, stage_layers, pp, accum),
        ),
        MemoryItem(
            "logits (loss)",
            logits_peak / GIB,
            f"{micro} × {seq} tokens × {model.vocab_size} vocab × {LOGITS_PEAK_BYTES} B fp32"
            + (f" / TP {tp}" if tp > 1 else ""),
        ),
        MemoryItem("ZeRO buffers", buffers / GIB, buffer_basis),
        MemoryItem(
            "framework overhead",
            overhead,
            f"{ALLOCATOR_ALLOWANCE_GIB:g} GiB allocator/workspaces + {hw.runtime_context_gib:g} GiB "
            f"{hw.vendor} runtime context",
        ),
    )
    total = sum(item.gib for item in memory)

    # --- offload
    per_node = plan.layout.devices_per_pod
    offload_s = _offload_time(recipe, plan, params_dev, trainable_dev)
    offload = Offload(
        host_gib_per_node=states.host * per_node * HOST_BUFFER_FACTOR / GIB,
        host_limit_gib=float(plan.pod_memory_gib),
        nvme_gib_per_node=states.nvme * per_node / GIB,
        time_s=offload_s,
    )

    # --- compute
    compute = _compute(recipe, plan, counts, trainable_total, full_training)
    comm = _dp_communication(recipe, plan, params_dev, trainable_dev, compute.time_s)
    three_d = _three_d(recipe, plan) if tp * pp > 1 else None
    if three_d is not None:
        notes.append(three_d.note)
    step = compute.time_s + comm.exposed_s + offload_s + (three_d.tp_time_s if three_d else 0.0)

    if not recipe.data.packing:
        notes.append(
            f"tokens per step assume every sequence is data.max_len = {seq} tokens long (an upper bound "
            "without packing)"
        )
    price = hw.price_per_device_hour if price_per_device_hour is None else price_per_device_hour
    total_steps = plan.total_steps
    total_time = step * total_steps if total_steps else None
    device_hours = total_time / 3600 * plan.layout.world_size if total_time is not None else None
    cost = device_hours * price if device_hours is not None and price is not None else None

    layout = Layout(
        parallel=par.name,
        zero_stage=plan.zero_stage,
        offload_optimizer=par.offload_optimizer,
        offload_param=par.offload_param,
        gradient_checkpointing=par.gradient_checkpointing,
        nodes=plan.layout.nodes,
        devices_per_pod=plan.layout.devices_per_pod,
        world_size=plan.layout.world_size,
        dp_size=dp,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batch_size=micro,
        gradient_accumulation_steps=accum,
        global_batch_size=plan.layout.global_batch_size,
        seq_len=seq,
        precision=plan.precision,
    )
    return Estimate(
        recipe_name=recipe.name,
        model_name=model.name,
        hw_name=hw.name,
        layout=layout,
        memory=memory,
        total_gib=total,
        device_gib=hw.memory_gib,
        headroom_gib=hw.memory_gib - total,
        offload=offload,
        compute=compute,
        communication=comm,
        parallel3d=three_d,
        step_time_s=step,
        total_steps=total_steps,
        total_time_s=total_time,
        device_hours=device_hours,
        price_per_device_hour=price,
        cost=cost,
        notes=tuple(notes),
        recipe=recipe,
        plan=plan,
    )


# ------------------------------------------------------------------------------------------- estimate's components
def _shard_words(tp: int, pp: int) -> str:
    parts = [f"TP {tp}"] if tp > 1 else []
    parts += [f"PP {pp} (heaviest stage)"] if pp > 1 else []
    return ", ".join(parts)


def _weights_basis(kind: str, params_dev: float, par: ParallelSpec, shard: str) -> str:
    if kind in ("lora", "qlora"):
        dtype = f"{'NF4' if kind == 'qlora' else '16-bit'} base + {'fp32' if par.zero_stage == 0 else '16-bit'} adapter"
    else:
        dtype = "fp32 + 16-bit autocast copy" if par.zero_stage == 0 else "16-bit"
    where = (
        "on host/NVMe"
        if par.offload_param != "none"
        else ("partitioned over dp + largest layer gathered" if par.zero_stage == 3 else "replicated")
    )
    return f"{params_dev / 1e9:.2f} B params, {dtype}, {where}" + (f"; {shard}" if shard else "")


def _gradients_basis(trainable: float, par: ParallelSpec, dp: int) -> str:
    zero, offload = par.zero_stage, par.offload_optimizer
    if zero == 0:
        return f"{trainable / 1e9:.3g} B trainable, fp32" + (" + DDP bucket copy" if dp > 1 else "") + ", replicated"
    if zero >= 2:
        where = f"offloaded to {offload}" if offload != "none" else f"partitioned over {dp} ranks"
    else:
        where = "16-bit replicated, fp32 copy " + (
            f"offloaded to {offload}" if offload != "none" else f"partitioned over {dp} ranks"
        )
    gathered = " + largest layer gathered" if zero == 3 else ""
    return f"{trainable / 1e9:.3g} B trainable, 16-bit + fp32 copy, {where}{gathered}"


def _optimizer_basis(trainable: float, par: ParallelSpec, dp: int) -> str:
    if par.zero_stage == 0:
        return f"{trainable / 1e9:.3g} B trainable, Adam m, v fp32 (the fp32 weights are the master), replicated"
    where = (
        f"offloaded to {par.offload_optimizer}" if par.offload_optimizer != "none" else f"partitioned over {dp} ranks"
    )
    return f"{trainable / 1e9:.3g} B trainable, fp32 master + Adam m, v, {where}"


def _activation_basis(checkpointing: bool, micro: int, seq: int, layers: int, pp: int, accum: int) -> str:
    kept = "layer inputs + one recomputed layer" if checkpointing else "all layers, no recomputation"
    flight = f", {min(pp, accum)} micro-batches in flight" if pp > 1 else ""
    return f"micro {micro} × seq {seq}, {layers} layers: {kept}{flight}"


def _zero_buffers(recipe: Recipe, zero: int, trainable_dev: float) -> tuple[float, str]:
    """DeepSpeed's communication buckets (16-bit elements), bounded by the gradients they could ever hold."""
    par = recipe.parallel
    bucket = min(par.reduce_bucket_size, trainable_dev)
    if zero in (1, 2):
        factor = ZERO12_OVERLAP_BUFFER_FACTOR if par.overlap_comm else 1.0
        basis = f"reduce + all-gather buckets {bucket / 1e6:.0f} M elements × 2 B × {factor:g}"
        return 2 * bucket * 2 * factor, basis
    if zero == 3:
        prefetch = STAGE3_PREFETCH_FACTOR * recipe.model.hidden_size**2  # plan's stage3_prefetch_bucket_size
        basis = f"reduce bucket {bucket / 1e6:.0f} M + prefetch {prefetch / 1e6:.0f} M elements × 2 B"
        return 2 * (bucket + prefetch), basis
    return 0.0, "none without DeepSpeed"


def _compute(recipe: Recipe, plan: Plan, counts: ParamCounts, trainable: int, full_training: bool) -> Compute:
    """Step time from the plan's FLOPs per token (defined once, in the runtime contract).

    ``hw.assumed_mfu`` is taken as the utilisation of the FLOPs actually executed (an HFU): activation checkpointing's
    recomputation therefore costs time. The pipeline bubble stretches the step by 1/(1 − bubble).
    """
    hw, flops, layout = recipe.hw, plan.flops, plan.layout
    tokens = layout.global_batch_size * recipe.data.max_len
    time_s = flops.hardware_per_token * tokens / (layout.world_size * flops.peak_tflops * 1e12 * hw.assumed_mfu)
    if layout.pipeline_parallel > 1:
        time_s /= 1 - bubble_fraction(layout.pipeline_parallel, layout.gradient_accumulation_steps)
    return Compute(
        params_total=counts.total,
        params_trainable=trainable,
        flops_per_token=flops.model_per_token,
        tokens_per_step=tokens,
        recompute_factor=flops.hardware_per_token / flops.model_per_token,
        peak_tflops=flops.peak_tflops,
        assumed_mfu=hw.assumed_mfu,
        time_s=time_s,
    )


def dp_group_crosses_nodes(plan: Plan) -> bool:
    """Megatron's rank order (TP innermost, then DP, PP outermost): a stage's TP × DP ranks are consecutive."""
    return plan.layout.world_size // plan.layout.pipeline_parallel > plan.layout.devices_per_pod


def _dp_communication(
    recipe: Recipe, plan: Plan, params_dev: float, trainable_dev: float, compute_s: float
) -> Communication:
    """Per-device ring volume of one optimizer step, (n − 1)/n of the data per pass.

    DeepSpeed communicates 16-bit gradients and weights; DDP under AMP all-reduces fp32 gradients.

    DDP all-reduces gradients once per step (no_sync on accumulation micro-steps): 2 passes. ZeRO-1 reduce-scatters
    gradients and all-gathers updated weights at the step boundary. ZeRO-2 reduce-scatters at every micro-step. ZeRO-3
    all-gathers weights for forward, backward (and recomputation) and reduce-scatters gradients every micro-step.
    When the group spans nodes the ring crosses each node's network once, so a node's NICs carry about what one device
    sends: the time is volume / inter-node bandwidth; inside a node, volume / per-device link bandwidth.

    Overlap: gradient traffic hides behind backward (DDP's buckets, ``overlap_comm``): for DDP and ZeRO-1 only the
    last micro-step's backward, for ZeRO-2 every backward; ZeRO-3's prefetch hides behind the whole step. The weight
    all-gather after a ZeRO-1/2 step is exposed.
    """
    hw, par = recipe.hw, recipe.parallel
    n, zero, accum = plan.layout.dp_size, plan.zero_stage, plan.layout.gradient_accumulation_steps
    crosses = dp_group_crosses_nodes(plan)
    link, gbps = (hw.inter_node_link, hw.inter_node_gbps) if crosses else (hw.intra_node_link, hw.intra_node_gbps)
    if n == 1:
        return Communication("none (one data-parallel rank)", 0.0, link, crosses, gbps, 0.0, 0.0)
    ring = (n - 1) / n
    grad_bytes = FP32_GRAD_BYTES if zero == 0 or plan.precision == "fp32" else MIXED_GRAD_BYTES  # AMP: fp32
    weight_bytes = FP32_WEIGHT_BYTES if plan.precision == "fp32" else MIXED_WEIGHT_BYTES
    grads = grad_bytes * trainable_dev
    trained_weights, all_weights = weight_bytes * trainable_dev, weight_bytes * params_dev
    backward = compute_s * BACKWARD_SHARE
    overlapped = par.overlap_comm or zero == 0
    if zero == 0:
        pattern = "all-reduce of gradients once per step"
        hidden_vol, exposed_vol, window = 2 * ring * grads, 0.0, backward / accum
    elif zero == 1:
        pattern = "reduce-scatter gradients + all-gather weights once per step"
        hidden_vol, exposed_vol, window = ring * grads, ring * trained_weights, backward / accum
    elif zero == 2:
        pattern = "reduce-scatter gradients every micro-step + all-gather weights per step"
        hidden_vol, exposed_vol, window = accum * ring * grads, ring * trained_weights, backward
    else:
        passes = 3 if par.gradient_checkpointing else 2
        pattern = f"all-gather weights ×{passes} + reduce-scatter gradients every micro-step"
        hidden_vol, exposed_vol, window = accum * ring * (passes * all_weights + grads), 0.0, compute_s
    volume = (hidden_vol + exposed_vol) / GB
    hidden_s, exposed_s = hidden_vol / GB / gbps, exposed_vol / GB / gbps
    exposed = exposed_s + max(0.0, hidden_s - (window if overlapped else 0.0))
    return Communication(pattern, volume, link, crosses, gbps, hidden_s + exposed_s, exposed)


def _offload_time(recipe: Recipe, plan: Plan, params_dev: float, trainable_dev: float) -> float:
    """Seconds per step offload adds, none of it hidden (rough: PCIe, NVMe and host-memory bandwidth bound).

    Optimizer offload: 16-bit gradient partitions go down (every micro-step from ZeRO-2 on), updated 16-bit weights
    come back, and CPU Adam streams the node's optimizer states through host memory (NVMe: read and written too).
    Parameter offload (ZeRO-3): each micro-step fetches the weight partition for forward, backward and recomputation.
    """
    par = recipe.parallel
    dp, accum, per_node = plan.layout.dp_size, plan.layout.gradient_accumulation_steps, plan.layout.devices_per_pod
    seconds = 0.0
    if par.offload_optimizer != "none":
        part = trainable_dev / dp
        downs = accum if plan.zero_stage >= 2 else 1
        seconds += (downs * 2 * part + 2 * part) / GB / PCIE_GBPS
        seconds += part * per_node * HOST_ADAM_BYTES_PER_PARAM / GB / HOST_MEMORY_GBPS
        if par.offload_optimizer == "nvme":
            fp32_grad = FP32_GRAD_BYTES_ZERO3 if plan.zero_stage == 3 else FP32_GRAD_BYTES_ZERO12
            fp32_state_bytes = fp32_grad + MIXED_OPTIMIZER_BYTES
            seconds += 2 * part * per_node * fp32_state_bytes / GB / NVME_GBPS
    if par.offload_param != "none":
        passes = 3 if par.gradient_checkpointing else 2
        fetched = accum * passes * 2 * params_dev / dp
        seconds += fetched / GB / PCIE_GBPS
        if par.offload_param == "nvme":
            seconds += fetched * per_node / GB / NVME_GBPS
    return seconds


def bubble_fraction(pipeline_parallel: int, micro_batches: int) -> float:
    """Idle share of a 1F1B/GPipe pipeline step: (p − 1)/(m + p − 1) for p stages and m micro-batches."""
    p, m = pipeline_parallel, micro_batches
    return (p - 1) / (m + p - 1)


def tp_inside_node(tensor_parallel: int, devices_per_pod: int) -> bool:
    """TP all-reduces sit on the critical path every layer: they only pay off on the intra-node link."""
    return tensor_parallel <= devices_per_pod and devices_per_pod % tensor_parallel == 0


def _three_d(recipe: Recipe, plan: Plan) -> ThreeD:
    """Megatron-style TP: 2 all-reduces of the b·s·h activations in forward and 2 in backward per layer (one more
    forward's worth under recomputation), none of them hidden."""
    model, hw = recipe.model, recipe.hw
    tp, pp, m = plan.layout.tensor_parallel, plan.layout.pipeline_parallel, plan.layout.gradient_accumulation_steps
    act = 4 if plan.precision == "fp32" else 2
    per_allreduce = 2 * (tp - 1) / tp * plan.layout.micro_batch_size * recipe.data.max_len * model.hidden_size * act
    count = 6 if recipe.parallel.gradient_checkpointing else 4
    per_layer = count * per_allreduce / GB
    step_volume = per_layer * math.ceil(model.num_layers / pp) * m
    inside = tp_inside_node(tp, plan.layout.devices_per_pod)
    link, gbps = (hw.intra_node_link, hw.intra_node_gbps) if inside else (hw.inter_node_link, hw.inter_node_gbps)
    return ThreeD(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batches=m,
        bubble_fraction=bubble_fraction(pp, m),
        tp_allreduce_gb_per_layer=per_layer,
        tp_volume_gb=step_volume,
        tp_inside_node=inside,
        tp_link=link,
        tp_time_s=step_volume / gbps if tp > 1 else 0.0,
        note="analysis only: the bundle's Trainer/DeepSpeed backend runs data parallelism only "
        "(TP/PP need Megatron-style model code)",
    )


# ------------------------------------------------------------------------------------------ candidates and advice
def load_parallel_options(extra_dirs: Sequence[Path] = ()) -> dict[str, ParallelSpec]:
    """The parallel group's options, typed, from the recipe trees on disk (skipping any that do not validate)."""
    import yaml

    from recipekit import yamlfile
    from recipekit.compose import group_options

    options: dict[str, ParallelSpec] = {}
    for name, path in group_options("parallel", extra_dirs).items():
        try:
            options[name] = validate(ParallelSpec, yamlfile.read(path))
        except (yaml.YAMLError, RecipeError):
            continue
    return options


@dataclass(frozen=True)
class Candidate:
    """A variation of a recipe and the Hydra overrides that, added to the recipe's own, compose to it."""

    recipe: Recipe
    overrides: tuple[str, ...]


def _bool(value: bool) -> str:
    return "true" if value else "false"


def candidate(
    recipe: Recipe,
    options: Mapping[str, ParallelSpec],
    *,
    parallel: str | None = None,
    gradient_checkpointing: bool | None = None,
    micro_batch_size: int | None = None,
    global_batch_size: int | None = None,
    nodes: int | None = None,
    tensor_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    explicit: bool = False,
) -> Candidate:
    """``recipe`` changed as asked, built the way Hydra would compose it, with the overrides that say so.

    Choosing ``parallel=NAME`` replaces the parallel section by that option's file, except for the keys the recipe
    set on top of its own option (the user's ``parallel.*`` overrides stay in force when composed again), which are
    carried over. ``global_batch_size`` keeps the batch fixed: when the recipe pins gradient accumulation (or sets
    no global batch) the accumulation is written out. ``explicit`` lists every varied setting (advice); otherwise only
    what changes (a fix to paste).
    """
    par, tr = recipe.parallel, recipe.train
    own = options.get(par.name)
    carried = {
        k: v
        for k, v in to_data(par).items()
        if own is not None and k not in ("name", "description", *_LAYOUT_FIELDS) and v != getattr(own, k)
    }
    out: list[str] = []
    new_par = par
    if parallel is not None and (explicit or parallel != par.name):
        new_par = replace(options[parallel], **carried)
        out.append(f"parallel={parallel}")
        if own is not None and any(getattr(par, k) != getattr(own, k) for k in _LAYOUT_FIELDS):
            # the recipe overrode a layout key of its own option; that override would outlive parallel=NAME
            out += [f"parallel.{k}={getattr(new_par, k)}" for k in _LAYOUT_FIELDS]
    for key, value in (
        ("gradient_checkpointing", gradient_checkpointing),
        ("tensor_parallel", tensor_parallel),
        ("pipeline_parallel", pipeline_parallel),
    ):
        if value is None:
            continue
        if explicit or value != getattr(new_par, key) or value != getattr(par, key):
            out.append(f"parallel.{key}={_bool(value) if isinstance(value, bool) else value}")
        new_par = replace(new_par, **{key: value})

    new_train = tr
    if micro_batch_size is not None and (explicit or micro_batch_size != tr.micro_batch_size):
        new_train = replace(new_train, micro_batch_size=micro_batch_size)
        out.append(f"train.micro_batch_size={micro_batch_size}")
    new_cluster = recipe.cluster
    if nodes is not None and nodes != recipe.cluster.nodes:
        new_cluster = replace(new_cluster, nodes=nodes)
        out.append(f"cluster.nodes={nodes}")
    if global_batch_size is not None and (tr.gradient_accumulation_steps is not None or tr.global_batch_size is None):
        devices = new_cluster.devices_per_pod or recipe.hw.devices_per_node
        dp = max(1, new_cluster.nodes * devices // (new_par.tensor_parallel * new_par.pipeline_parallel))
        accum = max(1, global_batch_size // (new_train.micro_batch_size * dp))
        if explicit or accum != tr.gradient_accumulation_steps:
            new_train = replace(new_train, gradient_accumulation_steps=accum)
            out.append(f"train.gradient_accumulation_steps={accum}")
    changed = replace(recipe, parallel=new_par, train=new_train, cluster=new_cluster)
    return Candidate(changed, tuple(out))


def _try(cand: Candidate, images: ImageMatrix, global_batch: int) -> Estimate | None:
    """The candidate's estimate, or None when make_plan rejects it or it changes the global batch."""
    try:
        plan = make_plan(cand.recipe, images, analysis_only=True)
    except RecipeError:
        return None
    if plan.layout.global_batch_size != global_batch:
        return None
    return estimate(cand.recipe, plan)


def _images_of(plan: Plan) -> ImageMatrix:
    """An image matrix holding just the family ``plan`` already validated, to re-plan variations of its recipe."""
    fam = plan.family
    table = {fam.torch_npu: (fam.torch, fam.cann or "")} if fam.torch_npu else {}
    return ImageMatrix(families={plan.image_family: fam}, torch_npu_table=table)


@dataclass(frozen=True)
class Advice:
    """One layout that fits, the overrides that select it, and its estimate."""

    overrides: tuple[str, ...]
    estimate: Estimate

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s


def _fits_line(est: Estimate) -> str:
    return f"≈ {est.total_gib:.1f} of {est.device_gib:g} GiB per device, step ≈ {est.step_time_s:.1f} s"


def fixes(
    est: Estimate, *, images: ImageMatrix | None = None, parallel_options: Mapping[str, ParallelSpec] | None = None
) -> list[Advice]:
    """Changes that make ``est`` fit, as overrides to paste: the cheapest first, then, when that one offloads, the
    fewest nodes that fit without offloading. Empty when ``est`` fits or nothing tried does.

    Tried in order, each re-estimated, first fit wins: gradient checkpointing on; a higher ZeRO stage (with the
    current checkpointing, then with it on); a smaller micro batch with checkpointing on (accumulation keeps the
    global batch); optimizer (and parameter) offload, host memory before NVMe; more nodes (doubling, with the highest
    ZeRO stage and checkpointing on).
    """
    if est.fits:
        return []
    recipe, plan = est.recipe, est.plan
    images = images or _images_of(plan)
    options = parallel_options if parallel_options is not None else load_parallel_options()
    gb, micro_now = plan.layout.global_batch_size, plan.layout.micro_batch_size
    gc_now = recipe.parallel.gradient_checkpointing
    zero_now = recipe.parallel.zero_stage

    def first_fit(tries: list[dict[str, object]]) -> Advice | None:
        for changes in tries:
            cand = candidate(recipe, options, global_batch_size=gb, **changes)  # type: ignore[arg-type]
            new = _try(cand, images, gb) if cand.overrides else None
            if new is not None and new.fits:
                return Advice(cand.overrides, new)
        return None

    plain = sorted(
        (
            o
            for o in options.values()
            if o.offload_optimizer == "none" and o.offload_param == "none" and o.zero_stage > zero_now
        ),
        key=lambda o: o.zero_stage,
    )
    offloads = sorted(
        (o for o in options.values() if o.offload_optimizer != "none" or o.offload_param != "none"),
        key=lambda o: (
            o.offload_optimizer == "nvme" or o.offload_param == "nvme",
            o.offload_param != "none",
            o.zero_stage,
        ),
    )
    smaller = [m for m in (micro_now // 2**k for k in range(1, micro_now.bit_length())) if m >= 1]
    tries: list[dict[str, object]] = [{"gradient_checkpointing": True}] if not gc_now else []
    tries += [{"parallel": o.name, "gradient_checkpointing": gc} for o in plain for gc in dict.fromkeys((gc_now, True))]
    tries += [{"micro_batch_size": m, "gradient_checkpointing": True} for m in smaller]
    tries += [
        {"parallel": o.name, "gradient_checkpointing": True, "micro_batch_size": m}
        for o in offloads
        for m in dict.fromkeys((micro_now, 1))
    ]
    more_nodes: list[dict[str, object]] = [
        {
            "nodes": recipe.cluster.nodes * 2**k,
            "gradient_checkpointing": True,
            **({"parallel": plain[-1].name} if plain else {}),
        }
        for k in range(1, MAX_NODE_DOUBLINGS + 1)
    ]
    found = first_fit(tries)
    if found is not None and found.estimate.offload.time_s == 0:
        return [found]  # no offload to avoid: more nodes would not be offered
    by_nodes = first_fit(more_nodes)
    if found is None:
        return [by_nodes] if by_nodes else []
    return [found, by_nodes] if by_nodes else [found]


def fit_problem(
    est: Estimate, *, images: ImageMatrix | None = None, parallel_options: Mapping[str, ParallelSpec] | None = None
) -> Problem | None:
    """None when ``est`` fits; otherwise what is too big (the largest item, or the host memory offload needs) and
    the cheapest change that fits (see :func:`fixes`), as overrides to paste."""
    if est.fits:
        return None
    if est.fits_device:
        message = (
            f"offloaded states need {est.offload.host_gib_per_node:.0f} GiB of host memory per node, the pod "
            f"asks for {est.offload.host_limit_gib:g} GiB (cluster.memory_gib_per_pod)"
        )
    else:
        largest = est.largest_item
        message = (
            f"needs ≈ {est.total_gib:.1f} GiB per device, one {est.hw_name} device has {est.device_gib:g} GiB; "
            f"largest item: {largest.name} {largest.gib:.1f} GiB ({largest.basis})"
        )
    found = fixes(est, images=images, parallel_options=parallel_options)
    if not found:
        return Problem(
            "memory",
            message,
            hint="no single change recipekit tried fits: a bigger accelerator, far more "
            "nodes or a smaller model is needed",
        )
    best, *alternative = found
    hint = f"cheapest change that fits: {' '.join(best.overrides)} ({_fits_line(best.estimate)})"
    if alternative:
        hint += f"; or without offload: {' '.join(alternative[0].overrides)} ({_fits_line(alternative[0].estimate)})"
    return Problem("memory", message, hint=hint)


def advise(
    recipe: Recipe,
    images: ImageMatrix,
    *,
    top: int = 5,
    search_tp_pp: bool = False,
    parallel_options: Mapping[str, ParallelSpec] | None = None,
) -> list[Advice]:
    """The ``top`` fastest layouts of ``recipe`` on its own cluster (nodes fixed) that fit, fastest first.

    Varies the parallel option (every ``recipes/parallel`` file: DDP, ZeRO stages, offload variants), the micro
    batch (powers of two), gradient checkpointing and, with ``search_tp_pp``, TP (powers of two within a node,
    dividing the attention and KV heads) and PP degrees (with ZeRO ≤ 1, which is what pipeline engines support).
    The global batch stays the recipe's: accumulation is derived and combinations it does not divide are skipped.
    Layouts whose estimate does not fit are dropped; ranking is by estimated step time (compute, exposed
    communication, offload), ties broken by :func:`_rank`. Each advice's overrides, added to the recipe's own,
    compose to it.
    """
    options = parallel_options if parallel_options is not None else load_parallel_options()
    base = make_plan(recipe, images, analysis_only=True)
    gb, model = base.layout.global_batch_size, recipe.model
    layouts: list[tuple[int, int]] = [(recipe.parallel.tensor_parallel, recipe.parallel.pipeline_parallel)]
    if search_tp_pp:
        tps = [
            t
            for t in _powers_of_two(base.layout.devices_per_pod)
            if model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0
        ]
        pps = [p for p in _powers_of_two(min(model.num_layers, base.layout.world_size))]
        layouts = [(t, p) for t in tps for p in pps if base.layout.world_size % (t * p) == 0]

    found: dict[tuple[str, ...], Estimate] = {}
    for tp, pp in layouts:
        dp = base.layout.world_size // (tp * pp)
        micros = [m for m in _powers_of_two(gb // dp) if gb % (m * dp) == 0]
        for option in options.values():
            if tp * pp > 1 and option.zero_stage > 1:
                continue
            for gc in (False, True):
                for micro in micros:
                    cand = candidate(
                        recipe,
                        options,
                        parallel=option.name,
                        gradient_checkpointing=gc,
                        micro_batch_size=micro,
                        global_batch_size=gb,
                        explicit=True,
                        **({"tensor_parallel": tp, "pipeline_parallel": pp} if search_tp_pp or tp * pp > 1 else {}),
                    )
                    est = _try(cand, images, gb)
                    if est is not None and est.fits:
                        found.setdefault(cand.overrides, est)
    ranked = sorted(found.items(), key=lambda kv: _rank(kv[1]) + (kv[0],))
    return [Advice(overrides, est) for overrides, est in ranked[:top]]


def _rank(est: Estimate) -> tuple[float, float, float, float]:
    """Fastest first; among equal step times (compute-bound layouts hide their traffic) the one that moves fewer
    bytes and offloads nothing, then the one with more headroom."""
    return (
        round(est.step_time_s, 6),
        round(est.offload.time_s, 6),
        round(est.communication.volume_gb, 6),
        -round(est.headroom_gib, 6),
    )


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(0, max(0, limit).bit_length()) if 2**k <= limit]

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

This module holds the constants, the regime, the model states and ZeRO's buffers; the rest of the arithmetic takes
the regime from here: :mod:`~recipekit.memory.activations` (what autograd keeps), :mod:`~recipekit.memory.traffic`
(what a step moves) and :mod:`~recipekit.memory.pipeline` (the schedule's bubble and micro-batches in flight).
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.plan.modelsize import ParamCounts
from recipekit.plan.parallelism import STAGE3_PREFETCH_FACTOR
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

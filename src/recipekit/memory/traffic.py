"""The bytes a training step moves between devices and to the host: data-parallel traffic under DDP and each ZeRO
stage, offload's PCIe and NVMe time, and tensor parallelism's all-reduces per layer and for the embedding and head.

Apart from the memory formulas because traffic turns into time, not into bytes held: the estimate puts each on the
link its group crosses (:mod:`recipekit.plan.nesting`). Pure: numbers and specs in, bytes (or seconds) out.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.memory.activations import vocab_parallel_logits
from recipekit.memory.formulas import (
    BACKWARD_SHARE,
    GB,
    HOST_ADAM_BYTES_PER_PARAM,
    HOST_MEMORY_GBPS,
    NVME_GBPS,
    PCIE_GBPS,
    Regime,
)
from recipekit.recipe.sections import ModelSpec


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

"""What one device holds, item by item: the model's share a device keeps and each memory item with how it was
counted (the breakdown ``recipekit plan`` prints and the estimate's total sums).

The numbers come from :mod:`~recipekit.memory.formulas` under the plan's one :class:`Regime`; the words of each
basis read the same regime, so a line cannot say "16-bit" where the count used 4 bytes. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.memory.formulas import (
    ALLOCATOR_ALLOWANCE_GIB,
    GIB,
    HALF,
    LOGITS_PEAK_BYTES,
    LOGITS_SAVED_BYTES,
    ModelStates,
    Regime,
    activation_bytes,
    dtype_name,
    model_states,
    pipeline_stage,
    qlora_base_bytes,
    vocab_parallel_logits,
    zero_buffers,
)
from recipekit.plan.modelsize import ParamCounts, tensor_parallel_share
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import ModelSpec, ParallelSpec, Recipe, adapter_of


@dataclass(frozen=True)
class MemoryItem:
    """One named share of a device's memory and how it was counted."""

    name: str
    gib: float
    basis: str


@dataclass(frozen=True)
class DeviceShare:
    """What one device holds of the model: the heaviest pipeline stage of its tensor-parallel share (AutoTP's
    shapes), and the bytes of its model states."""

    layers: int
    params: float
    trainable: float
    states: ModelStates


def device_share(recipe: Recipe, plan: Plan, reg: Regime, counts: ParamCounts) -> DeviceShare:
    """The share of ``recipe``'s model one device of ``plan`` holds, and its weights, gradients and optimizer states."""
    model, par, mode, tp, pp = (
        recipe.model,
        recipe.parallel,
        recipe.mode,
        plan.layout.tensor_parallel,
        plan.layout.pipeline_parallel,
    )
    full_training = adapter_of(mode) is None
    share = tensor_parallel_share(model, tp)
    stage_layers, params_dev = pipeline_stage(share, pp)
    stage_share = pipeline_stage(counts, pp)[1] / counts.total
    trainable_dev = params_dev if full_training else plan.flops.params_trainable * stage_share / tp
    frozen_b: float | None = None
    if mode.kind == "qlora":
        base = qlora_base_bytes(counts, double_quant=mode.quant.double_quant, other_bytes=reg.frozen_weight)
        frozen_b = base / counts.total
    states = model_states(
        params_dev + (0 if full_training else trainable_dev),
        reg,
        dp=plan.layout.dp_size,
        trainable=trainable_dev,
        frozen_weight_bytes=frozen_b,
        offload_optimizer=par.offload_optimizer,
        offload_param=par.offload_param,
        largest_layer=share.largest_module,
    )
    return DeviceShare(stage_layers, params_dev, trainable_dev, states)


def memory_items(recipe: Recipe, plan: Plan, reg: Regime, share: DeviceShare) -> tuple[MemoryItem, ...]:
    """Each share of one device's memory, in the order the plan prints them, with how it was counted."""
    model, hw, par, layout, seq = recipe.model, recipe.hw, recipe.parallel, plan.layout, recipe.data.max_len
    tp, pp, dp = layout.tensor_parallel, layout.pipeline_parallel, layout.dp_size
    micro, accum = layout.micro_batch_size, layout.gradient_accumulation_steps
    lora = adapter_of(recipe.mode)
    acts = activation_bytes(
        model,
        reg,
        micro_batch=micro,
        seq_len=seq,
        full_training=lora is None,
        checkpointing=par.gradient_checkpointing,
        lora=lora,
        tp=tp,
        layers=share.layers,
        in_flight=min(pp, accum) if pp > 1 else 1,
    )
    measured = measured_activations(recipe, plan, reg, share)
    if measured is not None:
        activations, activation_basis = measured, "measured by torch's memory tracker at import (model.activations)"
    else:
        activations = acts.layers + acts.recomputed + acts.head
        activation_basis = f"Llama-shaped formula ({_why_formula(recipe, plan, reg)})"
    logits_peak = acts.logits_saved * LOGITS_PEAK_BYTES / LOGITS_SAVED_BYTES
    buffers, buffer_basis = zero_buffers(
        reg,
        reduce_bucket=par.reduce_bucket_size,
        overlap_comm=par.overlap_comm,
        trainable=share.trainable,
        hidden=model.hidden_size,
    )
    overhead = ALLOCATOR_ALLOWANCE_GIB + hw.runtime_context_gib
    states, shard = share.states, _shard_words(tp, pp)
    return (
        MemoryItem("weights", states.weights / GIB, _weights_basis(recipe.mode.kind, share.params, reg, par, shard)),
        MemoryItem("gradients", states.gradients / GIB, _gradients_basis(share.trainable, reg, par, dp)),
        MemoryItem("optimizer states", states.optimizer / GIB, _optimizer_basis(share.trainable, reg, par, dp)),
        MemoryItem(
            "activations",
            activations / GIB,
            _activation_basis(par.gradient_checkpointing, micro, seq, share.layers, pp, accum)
            + f"; {activation_basis}",
        ),
        MemoryItem(
            "logits (loss)",
            logits_peak / GIB,
            f"{micro} × {seq} tokens × {model.vocab_size} vocab × {LOGITS_PEAK_BYTES} B fp32"
            + (_logits_tp_words(model, tp) if tp > 1 else ""),
        ),
        MemoryItem("ZeRO buffers", buffers / GIB, buffer_basis),
        MemoryItem(
            "framework overhead",
            overhead,
            f"{ALLOCATOR_ALLOWANCE_GIB:g} GiB allocator/workspaces + {hw.runtime_context_gib:g} GiB "
            f"{hw.vendor} runtime context",
        ),
    )


# ---------------------------------------------------------------------------------------- measured activations
def measured_activations(recipe: Recipe, plan: Plan, reg: Regime, share: DeviceShare) -> float | None:
    """Activation bytes on one device from the model option's measured numbers (``model.activations``: the peak
    torch's memory tracker saw over the decoder's forward and backward), or None where they do not describe the run
    (:func:`_why_formula`).

    What the tracker measured is DeepSpeed's 16-bit model, every weight training, one micro-batch on one device:
    ``tokens × peak``. Under pipeline parallelism the heaviest stage keeps its share of the layers' activations for
    each micro-batch in flight; the transient part (backward's temporaries, the layer rebuilt under checkpointing)
    is one micro-batch's.
    """
    spec = recipe.model.activations
    if spec is None or _why_formula(recipe, plan, reg) != "":
        return None
    layout, checkpointing, seq = plan.layout, recipe.parallel.gradient_checkpointing, recipe.data.max_len
    tokens = layout.micro_batch_size * seq
    kept = spec.kept_at(seq, checkpointing=checkpointing)
    transient = spec.peak_at(seq, checkpointing=checkpointing) - kept
    pp, accum = layout.pipeline_parallel, layout.gradient_accumulation_steps
    in_flight = min(pp, accum) if pp > 1 else 1
    return float(tokens * (kept * share.layers / recipe.model.num_layers * in_flight + transient))


def _why_formula(recipe: Recipe, plan: Plan, reg: Regime) -> str:
    """Why the option's measured activations do not describe this run ('' where they do)."""
    if recipe.model.activations is None:
        return "no model.activations: re-import the model to measure them"
    if adapter_of(recipe.mode) is not None:
        return "adapters: measured for full training"
    if plan.layout.tensor_parallel > 1:
        return "TP shards them: measured on one device"
    if reg.ddp or reg.element != HALF:
        return f"{reg.precision}{' under DDP' if reg.ddp else ''}: measured for DeepSpeed's 16-bit model"
    return ""


# --------------------------------------------------------------------------------------------------- the bases
def _shard_words(tp: int, pp: int) -> str:
    parts = [f"TP {tp}"] if tp > 1 else []
    parts += [f"PP {pp} (heaviest stage)"] if pp > 1 else []
    return ", ".join(parts)


def _spread(where: str, dp: int) -> str:
    """Where a ZeRO-partitioned state lives: offloaded, or split over the data-parallel ranks."""
    return f"offloaded to {where}" if where != "none" else f"partitioned over {dp} ranks"


def _weights_basis(kind: str, params_dev: float, reg: Regime, par: ParallelSpec, shard: str) -> str:
    if par.offload_param != "none":
        where = "on host/NVMe"
    else:
        where = "partitioned over dp + largest layer gathered" if reg.zero_stage == 3 else "replicated"
    return f"{params_dev / 1e9:.2f} B params, {reg.weight_words(kind)}, {where}" + (f"; {shard}" if shard else "")


def _gradients_basis(trainable: float, reg: Regime, par: ParallelSpec, dp: int) -> str:
    head = f"{trainable / 1e9:.3g} B trainable, {reg.gradient_words}"
    if reg.zero_stage == 0:
        return head + (" + DDP bucket copy" if reg.ddp and dp > 1 else "") + ", replicated"
    spread = _spread(par.offload_optimizer, dp)
    if reg.zero_stage >= 2:
        where = spread
    elif reg.fp32_gradient:
        where = f"{dtype_name(reg.gradient)} replicated, fp32 copy {spread}"
    else:
        where = "replicated"
    return f"{head}, {where}" + (" + largest layer gathered" if reg.zero_stage == 3 else "")


def _optimizer_basis(trainable: float, reg: Regime, par: ParallelSpec, dp: int) -> str:
    where = "replicated" if reg.zero_stage == 0 else _spread(par.offload_optimizer, dp)
    return f"{trainable / 1e9:.3g} B trainable, {reg.optimizer_words}, {where}"


def _logits_tp_words(model: ModelSpec, tp: int) -> str:
    if vocab_parallel_logits(model):
        return f" / TP {tp} (tied head: vocabulary-parallel)"
    return f", whole on each of the TP {tp} ranks (untied head: AutoTP gathers its output)"


def _activation_basis(checkpointing: bool, micro: int, seq: int, layers: int, pp: int, accum: int) -> str:
    kept = "layer inputs + one recomputed layer" if checkpointing else "all layers, no recomputation"
    flight = f", {min(pp, accum)} micro-batches in flight" if pp > 1 else ""
    return f"micro {micro} × seq {seq}, {layers} layers: {kept}{flight}"

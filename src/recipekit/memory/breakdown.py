"""What one device holds, item by item: the model's share a device keeps and each memory item with how it was
counted (the breakdown ``recipekit plan`` prints and the estimate's total sums).

The numbers come from :mod:`~recipekit.memory.formulas` under the plan's one :class:`Regime`; the words of each
basis read the same regime, so a line cannot say "16-bit" where the count used 4 bytes. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from recipekit.memory.activations import (
    activation_bytes,
    fused_kernel_savings,
    tp_activation_share,
    vocab_parallel_logits,
)
from recipekit.memory.formulas import (
    ALLOCATOR_ALLOWANCE_GIB,
    GIB,
    HALF,
    LOGITS_PEAK_BYTES,
    ModelStates,
    Regime,
    dtype_name,
    model_states,
    qlora_base_bytes,
    regime,
    zero_buffers,
)
from recipekit.memory.pipeline import layers_in_flight
from recipekit.plan.engines import engine_of
from recipekit.plan.layout import Layout
from recipekit.plan.layoutrules import megatron_features, stage_layers
from recipekit.plan.modelsize import ParamCounts, tensor_parallel_share
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import ParallelSpec, Recipe, adapter_of


@dataclass(frozen=True)
class MemoryItem:
    """One named share of a device's memory and how it was counted."""

    name: str
    gib: float
    basis: str


@dataclass(frozen=True)
class DeviceShare:
    """What one device of the heaviest pipeline stage holds of the model (its TP share of the stage's dense layers,
    the embedding on the first stage, the head on the last, its EP × expert-TP share of the stage's experts), the
    bytes of its model states, and its activations."""

    stage: int  # the heaviest stage, 0 first (0 without PP)
    layers: int  # its decoder layers
    params: float  # parameters on this device, experts included
    expert_params: float  # of them, routed experts
    trainable: float
    states: ModelStates
    in_flight: float  # layer-micro-batches of activations the stage holds at once
    activations: float  # bytes, kept and transient
    activation_basis: str
    logits: float  # bytes at the loss's peak (last stage only)


#: How the plan names each pipeline schedule.
SCHEDULE_WORDS = {"1f1b": "1F1B", "interleaved_1f1b": "interleaved 1F1B", "dualpipe": "DualPipe"}


def megatron_layout(recipe: Recipe, layout: Layout) -> bool:
    """Whether ``layout`` is costed as Megatron-core runs it (fused norms and SwiGLU, vocabulary-parallel embedding
    and head, its mixed precision at ZeRO stage 0): where the Megatron engine builds it, or where it uses what only
    Megatron-core runs (an analysis of what that engine would build). The one place the estimate asks which
    engine's kernels it counts."""
    return engine_of(recipe).megatron_kernels or bool(megatron_features(recipe, layout))


def plan_regime(recipe: Recipe, plan: Plan) -> Regime:
    """The byte widths of ``plan``: DeepSpeed's or DDP's as the plan runs them, Megatron-core's for its layouts."""
    return regime(
        plan.precision,
        plan.zero_stage,
        deepspeed=plan.uses_deepspeed,
        megatron=megatron_layout(recipe, plan.layout),
        distributed_optimizer=recipe.parallel.distributed_optimizer,
    )


def _stage_params(recipe: Recipe, plan: Plan, counts: ParamCounts, stage: int, layers: int) -> tuple[float, float]:
    """(dense, expert) parameters one device of ``stage`` holds. Megatron-core splits every layer's weights, the
    embedding and the head over TP (vocabulary-parallel; a tied embedding has a copy on the last stage) and the
    experts over EP × expert-TP; AutoTP's shapes (:func:`tensor_parallel_share`) where the Trainer's engine runs it."""
    layout = plan.layout
    if not megatron_layout(recipe, layout):
        return float(tensor_parallel_share(recipe.model, layout.tensor_parallel).total), 0.0
    tp, last = layout.tensor_parallel, stage == layout.pipeline_parallel - 1
    expert_layer = counts.experts / counts.layers
    dense = layers * (counts.per_layer - expert_layer) / tp
    dense += counts.embedding / tp if stage == 0 else 0
    dense += (counts.head or counts.embedding * (layout.pipeline_parallel > 1)) / tp if last else 0
    dense += counts.final_norm if last else 0
    return dense, layers * expert_layer / (layout.expert_parallel * layout.expert_tp)


def _stage_states(
    recipe: Recipe, plan: Plan, reg: Regime, counts: ParamCounts, dense: float, experts: float, layers: int
) -> tuple[float, ModelStates]:
    """(trainable, model states) of one device of a stage: the dense part sharded over the data-parallel ranks
    (× CP: its ranks hold the same weights), the experts over their own data-parallel ranks."""
    par, mode, layout = recipe.parallel, recipe.mode, plan.layout
    full_training = adapter_of(mode) is None
    share = tensor_parallel_share(recipe.model, layout.tensor_parallel)
    stage_share = 1.0 if layout.pipeline_parallel == 1 else (dense + experts) * layout.tensor_parallel / counts.total
    trainable = dense + experts if full_training else plan.flops.params_trainable * stage_share / layout.tensor_parallel
    frozen_b: float | None = None
    if mode.kind == "qlora":
        frozen_b = qlora_base_bytes(counts, double_quant=mode.quant.double_quant, other_bytes=reg.frozen_weight)
        frozen_b /= counts.total
    dense_trainable = trainable - (experts if full_training else 0)
    main = model_states(
        dense + (0 if full_training else trainable),
        reg,
        dp=layout.dp_size * layout.context_parallel,
        trainable=dense_trainable,
        frozen_weight_bytes=frozen_b,
        largest_layer=share.largest_module if layout.tensor_parallel > 1 else counts.largest_module,
        offload_optimizer=par.offload_optimizer,
        offload_param=par.offload_param,
    )
    if not experts:
        return trainable, main
    moe = model_states(
        experts,
        reg,
        dp=layout.expert_dp_size,
        trainable=experts if full_training else 0,
        offload_optimizer=par.offload_optimizer,
        offload_param=par.offload_param,
    )
    summed = ModelStates(*(a + b for a, b in zip(astuple(main), astuple(moe))))
    return trainable, summed


def device_share(recipe: Recipe, plan: Plan, reg: Regime, counts: ParamCounts) -> DeviceShare:
    """The heaviest stage's device: each stage's model states, activations (its micro-batches in flight under the
    schedule) and, on the last, the loss's logits; the stage that needs the most memory."""
    layout = plan.layout
    split = stage_layers(counts.layers, layout) or _even_split(counts.layers, layout.pipeline_parallel)
    shares = [_stage_share(recipe, plan, reg, counts, stage, layers) for stage, layers in enumerate(split)]
    return max(shares, key=lambda s: (s.states.device + s.activations + s.logits, -s.stage))


def _even_split(layers: int, stages: int) -> tuple[int, ...]:
    """A split for a layout the rules refuse (a plan reports those first): the heaviest stage's ceiling."""
    return (-(-layers // stages),) * stages


def _stage_share(recipe: Recipe, plan: Plan, reg: Regime, counts: ParamCounts, stage: int, layers: int) -> DeviceShare:
    layout = plan.layout
    dense, experts = _stage_params(recipe, plan, counts, stage, layers)
    if layout.schedule == "dualpipe":  # two copies of the parameters (DeepSeek-V3 report, Table 2)
        dense, experts = 2 * dense, 2 * experts
    trainable, states = _stage_states(recipe, plan, reg, counts, dense, experts, layers)
    in_flight = layers_in_flight(
        stage,
        layers,
        stages=layout.pipeline_parallel,
        micro_batches=layout.gradient_accumulation_steps,
        virtual_stages=layout.virtual_stages,
        schedule=layout.schedule,
    )
    acts, basis = _activations(recipe, plan, reg, layers, in_flight)
    last = stage == layout.pipeline_parallel - 1
    return DeviceShare(
        stage,
        layers,
        dense + experts,
        experts,
        trainable,
        states,
        in_flight,
        acts,
        basis,
        _logits(recipe, plan) if last else 0.0,
    )


def _logits(recipe: Recipe, plan: Plan) -> float:
    """The loss's peak over the logits of one micro-batch: vocabulary-parallel under Megatron-core or a tied AutoTP
    head, whole on every TP rank for an untied AutoTP head."""
    layout, model = plan.layout, recipe.model
    tokens = layout.micro_batch_size * recipe.data.max_len / layout.context_parallel
    split = megatron_layout(recipe, layout) or vocab_parallel_logits(model)
    return tokens * model.vocab_size * LOGITS_PEAK_BYTES / (layout.tensor_parallel if split else 1)


def memory_items(recipe: Recipe, plan: Plan, reg: Regime, share: DeviceShare) -> tuple[MemoryItem, ...]:
    """Each share of one device's memory, in the order the plan prints them, with how it was counted."""
    model, hw, par, layout, seq = recipe.model, recipe.hw, recipe.parallel, plan.layout, recipe.data.max_len
    dp = layout.dp_size * layout.context_parallel
    micro = layout.micro_batch_size
    buffers, buffer_basis = zero_buffers(
        reg,
        reduce_bucket=par.reduce_bucket_size,
        overlap_comm=par.overlap_comm,
        trainable=share.trainable,
        hidden=model.hidden_size,
    )
    overhead = ALLOCATOR_ALLOWANCE_GIB + hw.runtime_context_gib
    states, shard = share.states, _shard_words(layout, share)
    logits_split = megatron_layout(recipe, layout) or vocab_parallel_logits(model)
    return (
        MemoryItem("weights", states.weights / GIB, _weights_basis(recipe.mode.kind, share, reg, par, shard)),
        MemoryItem("gradients", states.gradients / GIB, _gradients_basis(share.trainable, reg, par, dp)),
        MemoryItem("optimizer states", states.optimizer / GIB, _optimizer_basis(share.trainable, reg, par, dp)),
        MemoryItem(
            "activations",
            share.activations / GIB,
            _activation_basis(recipe, layout, share) + f"; {share.activation_basis}",
        ),
        MemoryItem(
            "logits (loss)",
            share.logits / GIB,
            f"{micro} × {seq // layout.context_parallel} tokens × {model.vocab_size} vocab × {LOGITS_PEAK_BYTES} B fp32"
            + (_logits_tp_words(layout.tensor_parallel, logits_split) if layout.tensor_parallel > 1 else "")
            + ("" if share.logits else " (on the last stage)"),
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
def _activations(recipe: Recipe, plan: Plan, reg: Regime, layers: int, in_flight: float) -> tuple[float, str]:
    """Activation bytes on one device of a stage with ``in_flight`` layer-micro-batches alive, and how counted."""
    measured = measured_activations(recipe, plan, reg, in_flight)
    if measured is not None:
        return measured, "measured by torch's memory tracker at import (model.activations)"
    layout, par = plan.layout, recipe.parallel
    lora = adapter_of(recipe.mode)
    megatron = megatron_layout(recipe, layout)
    acts = activation_bytes(
        recipe.model,
        reg,
        micro_batch=layout.micro_batch_size,
        seq_len=recipe.data.max_len // layout.context_parallel,
        full_training=lora is None,
        checkpointing=_full_recompute(par),
        lora=lora,
        tp=layout.tensor_parallel,
        layers=layers,
        in_flight=in_flight / layers if layers else 0,
        sp=layout.sequence_parallel,
        fused=megatron,
        vocab_parallel=megatron or None,
    )
    return acts.layers + acts.recomputed + acts.head, f"Llama-shaped formula ({_why_formula(recipe, plan, reg)})"


def _full_recompute(par: ParallelSpec) -> bool:
    """Whether each layer keeps only its input: full recomputation. Selective recomputation rebuilds the attention
    core, which a fused attention kernel keeps nothing of beyond what the layer keeps anyway (no S×S scores)."""
    return par.gradient_checkpointing and par.recompute_granularity == "full"


def measured_activations(recipe: Recipe, plan: Plan, reg: Regime, in_flight: float) -> float | None:
    """Activation bytes on one device from the model option's measured numbers (``model.activations``: the peak
    torch's memory tracker saw over the decoder's forward and backward), or None where they do not describe the run
    (:func:`_why_formula`).

    What the tracker measured is DeepSpeed's 16-bit model, every weight training, one micro-batch on one device:
    ``tokens × peak``. A stage keeps its share of the layers' activations for each of its ``in_flight``
    layer-micro-batches; the transient part (backward's temporaries, the layer rebuilt under checkpointing) is one
    micro-batch's. Context parallelism divides the tokens; TP divides what it splits (all of it under sequence
    parallelism, Korthikanti's 24 of 34 parts without: :func:`tp_activation_share`); Megatron-core's fused kernels
    keep less than the Hugging Face module measured (:func:`fused_kernel_savings`).
    """
    spec, model = recipe.model.activations, recipe.model
    if spec is None or _why_formula(recipe, plan, reg) != "":
        return None
    layout, seq = plan.layout, recipe.data.max_len
    full = _full_recompute(recipe.parallel)
    tokens = layout.micro_batch_size * seq / layout.context_parallel
    kept, peak = spec.kept_at(seq, checkpointing=full), spec.peak_at(seq, checkpointing=full)
    per_layer = kept / model.num_layers
    if megatron_layout(recipe, layout) and not full:
        per_layer = max(0.0, per_layer - sum(fused_kernel_savings(model)))
    tp, sp = layout.tensor_parallel, layout.sequence_parallel
    share = (1 / tp if sp else 1.0) if full else tp_activation_share(tp, sp)
    return float(tokens * share * (per_layer * in_flight + (peak - kept)))


def _why_formula(recipe: Recipe, plan: Plan, reg: Regime) -> str:
    """Why the option's measured activations do not describe this run ('' where they do)."""
    if recipe.model.activations is None:
        return "no model.activations: re-import the model to measure them"
    if adapter_of(recipe.mode) is not None:
        return "adapters: measured for full training"
    if reg.ddp or reg.element != HALF:
        return f"{reg.precision}{' under DDP' if reg.ddp else ''}: measured for DeepSpeed's 16-bit model"
    return ""


# --------------------------------------------------------------------------------------------------- the bases
def _shard_words(layout: Layout, share: DeviceShare) -> str:
    parts = [f"TP {layout.tensor_parallel}"] if layout.tensor_parallel > 1 else []
    pp = layout.pipeline_parallel
    parts += [f"PP {pp} (stage {share.stage + 1}: {share.layers} layers, the heaviest)"] if pp > 1 else []
    if share.expert_params:
        parts += [f"{share.expert_params / 1e9:.2f} B of experts: EP {layout.expert_parallel}"]
    return ", ".join(parts)


def _spread(where: str, dp: int) -> str:
    """Where a ZeRO-partitioned state lives: offloaded, or split over the data-parallel ranks."""
    return f"offloaded to {where}" if where != "none" else f"partitioned over {dp} ranks"


def _weights_basis(kind: str, share: DeviceShare, reg: Regime, par: ParallelSpec, shard: str) -> str:
    if par.offload_param != "none":
        where = "on host/NVMe"
    else:
        where = "partitioned over dp + largest layer gathered" if reg.zero_stage == 3 else "replicated"
    words = f"{share.params / 1e9:.2f} B params, {reg.weight_words(kind)}, {where}"
    return words + (f"; {shard}" if shard else "")


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
    where = _spread(par.offload_optimizer, dp) if reg.shards_optimizer else "replicated"
    return f"{trainable / 1e9:.3g} B trainable, {reg.optimizer_words}, {where}"


def _logits_tp_words(tp: int, split: bool) -> str:
    if split:
        return f" / TP {tp} (vocabulary-parallel)"
    return f", whole on each of the TP {tp} ranks (untied head: AutoTP gathers its output)"


def _activation_basis(recipe: Recipe, layout: Layout, share: DeviceShare) -> str:
    par = recipe.parallel
    if not par.gradient_checkpointing:
        kept = "all layers, no recomputation"
    elif par.recompute_granularity == "selective":
        kept = "all layers, the attention core recomputed (selective)"
    else:
        kept = "layer inputs + one recomputed layer"
    cuts = [f"CP {layout.context_parallel}"] if layout.context_parallel > 1 else []
    cuts += ["SP" if layout.sequence_parallel else f"TP {layout.tensor_parallel}"] if layout.tensor_parallel > 1 else []
    flight = ""
    if layout.pipeline_parallel > 1:
        schedule = SCHEDULE_WORDS[layout.schedule]
        flight = f", {share.in_flight / max(1, share.layers):.3g} micro-batches in flight ({schedule})"
    split = f" split by {' and '.join(cuts)}" if cuts else ""
    return f"micro {layout.micro_batch_size} × seq {recipe.data.max_len}{split}, {share.layers} layers: {kept}{flight}"

"""One recipe under one plan: memory per device, compute, communication, time and cost, as the :class:`Estimate`.

Every layout number (world, data-parallel size, micro batch, accumulation, global batch) and the FLOPs per token come
from the plan, which derives them once; the byte widths come from the one :class:`~recipekit.memory.formulas.Regime`
the plan's precision and ZeRO stage select. This module only applies the formulas to them and names what it counted.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from recipekit.memory.breakdown import DeviceShare, MemoryItem, device_share, memory_items
from recipekit.memory.formulas import (
    GB,
    GIB,
    HOST_BUFFER_FACTOR,
    Regime,
    bubble_fraction,
    dp_traffic,
    model_states,
    offload_seconds,
    regime,
    tp_allreduce_bytes_per_layer,
    tp_allreduce_count,
    tp_head_bytes,
    tp_inside_node,
)
from recipekit.plan.layout import Layout
from recipekit.plan.modelsize import FUSED_MODULES, LORA_MODULES, ParamCounts, count_params
from recipekit.plan.parallelism import EXPERTS_NEED, PIPELINE_NEEDS, model_parallel_problems
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import ParallelSpec, Recipe, adapter_of
from recipekit.runtime.boundary import recipeview


# --------------------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Compute:
    """FLOPs and the step's compute time at the assumed utilisation."""

    params_total: int
    params_active: int  # an MoE model's top-k experts; FLOPs and MFU are counted from these
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
    host_limit_gib: float  # what each pod asks for: plan.pod_memory_gib
    nvme_gib_per_node: float
    time_s: float

    @property
    def host_fits(self) -> bool:
        return self.host_gib_per_node <= self.host_limit_gib


@dataclass(frozen=True)
class ThreeD:
    """Tensor and pipeline parallelism: the bubble, TP's traffic and its link, and whether the bundle runs it (TP
    through DeepSpeed AutoTP; PP is analysis only)."""

    tensor_parallel: int
    pipeline_parallel: int
    micro_batches: int
    bubble_fraction: float
    tp_allreduces_per_layer: int  # AutoTP's b·s·h all-reduces per layer per micro-step
    tp_allreduce_gb_per_layer: float  # per device, one micro-batch's forward and backward
    tp_head_gb: float  # per device, one micro-batch: the embedding and head's TP traffic
    tp_volume_gb: float  # per device, per optimizer step
    tp_inside_node: bool
    tp_link: str
    tp_time_s: float
    buildable: bool  # the bundle runs this layout
    note: str


@dataclass(frozen=True)
class ExpertParallel:
    """An MoE model's experts: total against active parameters, and what expert parallelism would save and cost.

    The bundle runs no EP (analysis only, :data:`recipekit.plan.parallelism.EXPERTS_NEED`): every rank holds its ZeRO
    share of all experts. With EP the experts of a layer are split over ``expert_parallel`` ranks, whose ZeRO share is
    then taken over the dp / EP ranks that hold the same experts; tokens travel to their experts and back by
    all-to-all."""

    num_experts: int
    experts_per_token: int
    params_total: int
    params_active: int
    expert_params: int  # routed-expert parameters, all layers
    expert_parallel: int  # the recipe's EP, or the one analysed when the recipe has none
    expert_gib: float  # the experts' weights, gradients and optimizer states per device without EP
    expert_gib_with_ep: float  # the same with ``expert_parallel``
    dp_gb: float  # the experts' data-parallel traffic per device per step without EP (ZeRO's gathers, reductions)
    dp_gb_with_ep: float  # the same with EP: only the experts' own dp / EP replicas exchange them
    alltoall_gb: float  # per device per optimizer step, with EP
    alltoall_time_s: float
    link: str
    buildable: bool
    note: str

    @property
    def saved_gib(self) -> float:
        return self.expert_gib - self.expert_gib_with_ep


@dataclass(frozen=True)
class Estimate:
    """Memory per device, compute, communication, time and cost of one recipe under one plan.

    What it is for: the plan's ``layout`` (its numbers, as the plan derived them), the recipe's ``parallel`` choice
    (option, ZeRO stage, offloads, checkpointing), the sequence length and the plan's precision.
    """

    recipe_name: str
    model_name: str
    hw_name: str
    layout: Layout
    parallel: ParallelSpec
    seq_len: int
    precision: str
    memory: tuple[MemoryItem, ...]
    total_gib: float
    device_gib: float
    headroom_gib: float
    offload: Offload
    compute: Compute
    communication: Communication
    parallel3d: ThreeD | None
    experts: ExpertParallel | None
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


# -------------------------------------------------------------------------------------------------------- estimate
def estimate(recipe: Recipe, plan: Plan, *, price_per_device_hour: float | None = None) -> Estimate:
    """Estimate memory per device, compute, communication, time and cost of ``recipe`` laid out as ``plan``.

    ``price_per_device_hour`` defaults to ``recipe.hw.price_per_device_hour``; without either there is no cost.
    """
    model, hw, layout = recipe.model, recipe.hw, plan.layout
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    reg = regime(plan.precision, plan.zero_stage, deepspeed=plan.uses_deepspeed)
    counts = count_params(model)
    share = device_share(recipe, plan, reg, counts)
    memory = memory_items(recipe, plan, reg, share)
    total = sum(item.gib for item in memory)
    notes = _lora_target_notes(recipe)
    offload = _offload(recipe, plan, reg, share)

    compute = _compute(recipe, plan)
    comm = _dp_communication(recipe, plan, reg, share.params, share.trainable, compute.time_s)
    three_d = _three_d(recipe, plan, reg, share.layers) if tp * pp > 1 else None
    if three_d is not None:
        notes.append(three_d.note)
    step = compute.time_s + comm.exposed_s + offload.time_s + (three_d.tp_time_s if three_d else 0.0)
    notes += _token_notes(recipe, plan, compute)

    price = hw.price_per_device_hour if price_per_device_hour is None else price_per_device_hour
    total_steps = plan.total_steps
    total_time = step * total_steps if total_steps else None
    device_hours = total_time / 3600 * layout.world_size if total_time is not None else None
    cost = device_hours * price if device_hours is not None and price is not None else None

    return Estimate(
        recipe_name=recipe.name,
        model_name=model.name,
        hw_name=hw.name,
        layout=layout,
        parallel=recipe.parallel,
        seq_len=recipe.data.max_len,
        precision=plan.precision,
        memory=memory,
        total_gib=total,
        device_gib=hw.memory_gib,
        headroom_gib=hw.memory_gib - total,
        offload=offload,
        compute=compute,
        communication=comm,
        parallel3d=three_d,
        experts=_experts(recipe, plan, reg, counts) if model.moe else None,
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


def _lora_target_notes(recipe: Recipe) -> list[str]:
    """A note for LoRA targets that are not projections recipekit counts (their adapters are left out)."""
    lora = adapter_of(recipe.mode)
    if lora is None or not isinstance(lora.target_modules, list):
        return []
    unknown = sorted(set(lora.target_modules) - set(LORA_MODULES) - set(FUSED_MODULES))
    return [f"LoRA targets {', '.join(unknown)} are not projections recipekit knows; not counted"] if unknown else []


def _offload(recipe: Recipe, plan: Plan, reg: Regime, share: DeviceShare) -> Offload:
    """Host and NVMe memory per node of what offload moved off the devices, and the step time it adds."""
    par, per_node = recipe.parallel, plan.layout.devices_per_pod
    time_s = offload_seconds(
        reg,
        offload_optimizer=par.offload_optimizer,
        offload_param=par.offload_param,
        checkpointing=par.gradient_checkpointing,
        dp=plan.layout.dp_size,
        accum=plan.layout.gradient_accumulation_steps,
        devices_per_node=per_node,
        params=share.params,
        trainable=share.trainable,
    )
    return Offload(
        host_gib_per_node=share.states.host * per_node * HOST_BUFFER_FACTOR / GIB,
        host_limit_gib=float(plan.pod_memory_gib),
        nvme_gib_per_node=share.states.nvme * per_node / GIB,
        time_s=time_s,
    )


def _token_notes(recipe: Recipe, plan: Plan, compute: Compute) -> list[str]:
    """What the tokens per step assume: the mean row of data.num_tokens, or every row at data.max_len."""
    if plan.data.tokens_from == "data.num_tokens":
        return [
            f"tokens per step: {compute.tokens_per_step / plan.layout.global_batch_size:,.0f} per row, the mean of "
            f"data.num_tokens over {plan.data.rows:,} rows ({plan.data.rows_from})"
            + ("; padding to a micro batch's longest row adds to it" if not recipe.data.packing else "")
        ]
    if not recipe.data.packing:
        return [
            f"tokens per step assume every sequence is data.max_len = {recipe.data.max_len} tokens long (an upper "
            "bound without packing)"
        ]
    return []


# ------------------------------------------------------------------------------------------- compute and traffic
def _compute(recipe: Recipe, plan: Plan) -> Compute:
    """Step time from the plan's FLOPs per token (defined once, in the runtime contract).

    ``hw.assumed_mfu`` is taken as the utilisation of the FLOPs actually executed (an HFU): activation checkpointing's
    recomputation therefore costs time. The pipeline bubble stretches the step by 1/(1 − bubble).
    """
    hw, flops, layout = recipe.hw, plan.flops, plan.layout
    # the mean row when the data's tokens are known (plan.data), else every row at max_len
    per_row = min(plan.data.tokens_per_row or recipe.data.max_len, recipe.data.max_len)
    tokens = round(layout.global_batch_size * per_row)
    time_s = flops.hardware_per_token * tokens / (layout.world_size * flops.peak_tflops * 1e12 * hw.assumed_mfu)
    if layout.pipeline_parallel > 1:
        time_s /= 1 - bubble_fraction(layout.pipeline_parallel, layout.gradient_accumulation_steps)
    return Compute(
        params_total=flops.params_total,
        params_active=flops.params_active,
        params_trainable=flops.params_trainable,
        flops_per_token=flops.model_per_token,
        tokens_per_step=tokens,
        recompute_factor=flops.hardware_per_token / flops.model_per_token,
        peak_tflops=flops.peak_tflops,
        assumed_mfu=hw.assumed_mfu,
        time_s=time_s,
    )


def dp_group_crosses_nodes(layout: Layout) -> bool:
    """Megatron's rank order (TP innermost, then DP, PP outermost): a stage's TP × DP ranks are consecutive."""
    return layout.world_size // layout.pipeline_parallel > layout.devices_per_pod


def _dp_communication(
    recipe: Recipe, plan: Plan, reg: Regime, params_dev: float, trainable_dev: float, compute_s: float
) -> Communication:
    """The step's data-parallel traffic (:func:`~recipekit.memory.formulas.dp_traffic`) on the link it crosses.

    When the group spans nodes the ring crosses each node's network once, so a node's NICs carry about what one
    device sends: the time is volume / inter-node bandwidth; inside a node, volume / per-device link bandwidth.
    What compute cannot hide (everything, without ``overlap_comm`` under ZeRO) is exposed.
    """
    hw, par, layout = recipe.hw, recipe.parallel, plan.layout
    crosses = dp_group_crosses_nodes(layout)
    link, gbps = (hw.inter_node_link, hw.inter_node_gbps) if crosses else (hw.intra_node_link, hw.intra_node_gbps)
    if layout.dp_size == 1:
        return Communication("none (one data-parallel rank)", 0.0, link, crosses, gbps, 0.0, 0.0)
    traffic = dp_traffic(
        reg,
        dp=layout.dp_size,
        accum=layout.gradient_accumulation_steps,
        params=params_dev,
        trainable=trainable_dev,
        checkpointing=par.gradient_checkpointing,
    )
    hidden_s, exposed_s = traffic.hideable / GB / gbps, traffic.exposed / GB / gbps
    window = compute_s * traffic.window_share if par.overlap_comm or reg.zero_stage == 0 else 0.0
    exposed = exposed_s + max(0.0, hidden_s - window)
    volume = (traffic.hideable + traffic.exposed) / GB
    return Communication(traffic.pattern, volume, link, crosses, gbps, hidden_s + exposed_s, exposed)


#: All-to-alls of an MoE layer per micro-step under EP: dispatch and combine in forward, their gradients in backward.
EP_ALLTOALLS = 4


def _expert_state_bytes(recipe: Recipe, reg: Regime, expert_params: int, dp: int, ep: int) -> float:
    """Device bytes of the experts' model states with ``ep``-way expert parallelism (1: none)."""
    share = expert_params / ep
    full = not recipeview.trains_adapter(recipe.mode.kind)  # PEFT does not adapt fused experts: they stay frozen
    states = model_states(
        share,
        reg,
        dp=max(1, dp // ep),
        trainable=share if full else 0,
        offload_optimizer=recipe.parallel.offload_optimizer,
        offload_param=recipe.parallel.offload_param,
    )
    return states.device


def _expert_traffic_gb(recipe: Recipe, reg: Regime, layout: Layout, expert_params: int, ep: int) -> float:
    """The experts' share of the data-parallel traffic per device per step with ``ep``-way EP (1: none)."""
    dp = max(1, layout.dp_size // ep)
    if dp == 1:
        return 0.0
    full = not recipeview.trains_adapter(recipe.mode.kind)
    share = expert_params / ep
    traffic = dp_traffic(
        reg,
        dp=dp,
        accum=layout.gradient_accumulation_steps,
        params=share,
        trainable=share if full else 0,
        checkpointing=recipe.parallel.gradient_checkpointing,
    )
    return (traffic.hideable + traffic.exposed) / GB


def _experts(recipe: Recipe, plan: Plan, reg: Regime, counts: ParamCounts) -> ExpertParallel:
    """Total and active parameters, and EP's saving and all-to-all cost (the recipe's EP, else the widest EP inside
    a pod that divides the experts and the data-parallel ranks)."""
    model, hw, layout = recipe.model, recipe.hw, plan.layout
    dp = layout.dp_size
    ep = recipe.parallel.expert_parallel
    if ep == 1:
        fits = [d for d in range(1, layout.devices_per_pod + 1) if model.num_experts % d == 0 and dp % d == 0]
        ep = max(fits)
    tokens = layout.micro_batch_size * recipe.data.max_len
    passes = EP_ALLTOALLS + (2 if recipe.parallel.gradient_checkpointing else 0)
    per_layer = passes * tokens * model.experts_per_token * model.hidden_size * reg.element * (ep - 1) / ep
    volume = per_layer * model.num_layers * layout.gradient_accumulation_steps / GB
    inside = ep <= layout.devices_per_pod
    link, gbps = (hw.intra_node_link, hw.intra_node_gbps) if inside else (hw.inter_node_link, hw.inter_node_gbps)
    problems = model_parallel_problems(recipe, layout) if recipe.parallel.expert_parallel > 1 else []
    chosen = "the recipe's" if recipe.parallel.expert_parallel > 1 else "analysed (parallel.expert_parallel is 1)"
    note = f"EP {ep} {chosen}: {EXPERTS_NEED}" if ep > 1 else "no EP inside a pod divides the experts and the ranks"
    return ExpertParallel(
        num_experts=model.num_experts,
        experts_per_token=model.experts_per_token,
        params_total=counts.total,
        params_active=counts.active,
        expert_params=counts.experts,
        expert_parallel=ep,
        expert_gib=_expert_state_bytes(recipe, reg, counts.experts, dp, 1) / GIB,
        expert_gib_with_ep=_expert_state_bytes(recipe, reg, counts.experts, dp, ep) / GIB,
        dp_gb=_expert_traffic_gb(recipe, reg, layout, counts.experts, 1),
        dp_gb_with_ep=_expert_traffic_gb(recipe, reg, layout, counts.experts, ep),
        alltoall_gb=volume,
        alltoall_time_s=volume / gbps,
        link=link,
        buildable=not problems and ep == 1,
        note=note,
    )


def _three_d(recipe: Recipe, plan: Plan, reg: Regime, stage_layers: int) -> ThreeD:
    """TP's all-reduces over the heaviest stage's layers and its embedding/head traffic (none of it hidden: every
    all-reduce sits between two layers' compute) on the link TP crosses, and the pipeline's bubble."""
    model, hw, layout = recipe.model, recipe.hw, plan.layout
    tp, pp, m = layout.tensor_parallel, layout.pipeline_parallel, layout.gradient_accumulation_steps
    checkpointing = recipe.parallel.gradient_checkpointing
    shape = dict(tensor_parallel=tp, micro_batch=layout.micro_batch_size, seq_len=recipe.data.max_len)
    per_layer = tp_allreduce_bytes_per_layer(reg, hidden=model.hidden_size, checkpointing=checkpointing, **shape) / GB
    head = tp_head_bytes(reg, model, **shape) / GB if tp > 1 else 0.0
    step_volume = (per_layer * stage_layers + head) * m
    inside = tp_inside_node(tp, layout.devices_per_pod)
    link, gbps = (hw.intra_node_link, hw.intra_node_gbps) if inside else (hw.inter_node_link, hw.inter_node_gbps)
    problems = model_parallel_problems(recipe, layout)
    if not problems:
        note = (
            f"TP {tp} runs in the bundle as DeepSpeed AutoTP (ds_config tensor_parallel.autotp_size = {tp}): "
            f"{layout.dp_size} TP groups of {tp} ranks, data-parallel over the groups"
        )
    elif pp > 1:
        note = f"analysis only: {PIPELINE_NEEDS}"
    else:
        note = "analysis only: " + "; ".join(p.message for p in problems)
    return ThreeD(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batches=m,
        bubble_fraction=bubble_fraction(pp, m),
        tp_allreduces_per_layer=tp_allreduce_count(checkpointing) if tp > 1 else 0,
        tp_allreduce_gb_per_layer=per_layer,
        tp_head_gb=head,
        tp_volume_gb=step_volume,
        tp_inside_node=inside,
        tp_link=link,
        tp_time_s=step_volume / gbps if tp > 1 else 0.0,
        buildable=not problems,
        note=note,
    )

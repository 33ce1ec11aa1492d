"""One recipe under one plan: memory per device, compute, communication, time and cost, as the :class:`Estimate`.

Every layout number (world, data-parallel size, micro batch, accumulation, global batch) and the FLOPs per token come
from the plan, which derives them once; the byte widths come from the one :class:`~recipekit.memory.formulas.Regime`
the plan's precision and ZeRO stage select. This module only applies the formulas to them and names what it counted.
Pure: no I/O.

Time as the field states it: MFU is the model FLOPs of a step (the counter's, no recomputation) over the step's
whole time × devices × peak, bubbles and exposed communication included. The step is the model FLOPs at
``hw.assumed_mfu``: a published MFU gives the published step. The breakdown (:class:`TimeItem`: compute at the
kernels' utilisation, the pipeline bubble, the TP, EP, CP and DP traffic compute cannot hide, offload) explains
where that time goes; the kernels' utilisation is what is left for compute, and the layout search
(:func:`recipekit.memory.advise.advise`) predicts other layouts' MFU at the same utilisation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from recipekit.memory.breakdown import (
    DeviceShare,
    MemoryItem,
    device_share,
    memory_items,
    plan_regime,
)
from recipekit.memory.experts import ExpertParallel, alltoall_overlaps, experts_of
from recipekit.memory.formulas import GB, GIB, HOST_BUFFER_FACTOR, Regime
from recipekit.memory.overlap import Overlap, exposed, solve_compute
from recipekit.memory.parallel3d import ThreeD, three_d_of, three_d_overlaps
from recipekit.memory.pipeline import bubble_fraction
from recipekit.memory.traffic import (
    dp_traffic,
    offload_seconds,
)
from recipekit.plan.layout import Layout
from recipekit.plan.modelsize import FUSED_MODULES, LORA_MODULES, count_params
from recipekit.plan.nesting import Group, groups
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import ParallelSpec, Recipe, adapter_of
from recipekit.runtime.boundary import flopcount


# --------------------------------------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Compute:
    """FLOPs, the step's MFU and HFU, and the utilisation its compute runs at."""

    params_total: int
    params_active: int  # an MoE model's top-k experts; FLOPs and MFU are counted from these
    params_trainable: int
    flops_per_token: float
    tokens_per_step: int
    recompute_factor: float
    peak_tflops: float
    assumed_mfu: float  # hw.assumed_mfu as the recipe states it
    mfu_attention: str  # how it counts attention: "dense" (recipekit's) or "causal" (converted)
    mfu: float  # the step's MFU in recipekit's count: model FLOPs / (step × devices × peak)
    hfu: float  # the same with the recomputation's FLOPs
    efficiency: float  # hardware FLOPs over the busy compute time × devices × peak: the kernels' utilisation
    attainable: bool  # the assumed MFU leaves time for the layout's bubble and exposed traffic
    time_s: float  # per optimizer step: compute only (the bubble and the traffic are their own items)


@dataclass(frozen=True)
class TimeItem:
    """One share of a step's time and how it was counted."""

    name: str
    seconds: float
    basis: str


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
    time: tuple[TimeItem, ...]  # where the step goes; the items sum to step_time_s
    overlaps: tuple[Overlap, ...]  # the traffic the step may wait for, and what of it compute can hide
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

    def seconds(self, name: str) -> float:
        """The seconds of the time item ``name`` (0 when the step has none)."""
        return next((item.seconds for item in self.time if item.name == name), 0.0)

    @property
    def exposed_s(self) -> float:
        """What the step spends on traffic and offload that compute does not hide."""
        return sum(item.seconds for item in self.time if item.name not in ("compute", "pipeline bubble"))


# -------------------------------------------------------------------------------------------------------- estimate
def estimate(recipe: Recipe, plan: Plan, *, price_per_device_hour: float | None = None) -> Estimate:
    """Estimate memory per device, compute, communication, time and cost of ``recipe`` laid out as ``plan``.

    ``price_per_device_hour`` defaults to ``recipe.hw.price_per_device_hour``; without either there is no cost.
    """
    model, hw, layout = recipe.model, recipe.hw, plan.layout
    reg = plan_regime(recipe, plan)
    counts = count_params(model)
    share = device_share(recipe, plan, reg, counts)
    memory = memory_items(recipe, plan, reg, share)
    total = sum(item.gib for item in memory)
    notes = _lora_target_notes(recipe)
    offload = _offload(recipe, plan, reg, share)
    found = groups(layout, hw)
    bubble = bubble_fraction(
        layout.pipeline_parallel, layout.gradient_accumulation_steps, layout.virtual_stages, schedule=layout.schedule
    )
    comm, dp_overlaps = _dp_communication(recipe, plan, reg, share, found)
    three_d = three_d_of(recipe, plan, reg, share, found, bubble) if layout.model_parallel > 1 else None
    experts = experts_of(recipe, plan, reg, counts, found, share) if model.moe else None
    overlaps = (
        *three_d_overlaps(three_d, plan),
        *alltoall_overlaps(recipe, plan, experts),
        *dp_overlaps,
        Overlap("offload", offload.time_s, 0.0, 0.0),
    )
    compute, waits = _compute(recipe, plan, bubble, overlaps)
    comm = replace(comm, exposed_s=waits.get("DP traffic", 0.0))
    if three_d is not None:
        three_d = replace(three_d, cp_exposed_s=waits.get("CP traffic", 0.0))
        notes.append(three_d.note)
    items = _time_items(compute, bubble, waits)
    if not compute.attainable:
        notes.append(_unattainable_note(compute, sum(waits.values()), bubble))
    notes += _token_notes(recipe, plan, compute)
    step = sum(item.seconds for item in items)

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
        experts=experts,
        step_time_s=step,
        time=items,
        overlaps=overlaps,
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


# ------------------------------------------------------------------------------------------------------- the step
def tokens_per_step(recipe: Recipe, plan: Plan) -> int:
    """Tokens of one optimizer step: the mean row when the data's tokens are known (plan.data), else every row at
    max_len."""
    per_row = min(plan.data.tokens_per_row or recipe.data.max_len, recipe.data.max_len)
    return round(plan.layout.global_batch_size * per_row)


def model_mfu(recipe: Recipe, plan: Plan) -> float:
    """``hw.assumed_mfu`` in recipekit's count: a causal count's MFU (``hw.assumed_mfu_attention: causal``) divided
    by the share of the FLOPs it counts (:func:`~recipekit.runtime.boundary.flopcount.causal_share`)."""
    hw, flops = recipe.hw, plan.flops
    if hw.assumed_mfu_attention == "dense":
        return hw.assumed_mfu
    return hw.assumed_mfu / flopcount.causal_share(flops.attention_per_token, flops.model_per_token)


def _mfu_step(recipe: Recipe, plan: Plan) -> float:
    """The step's seconds at the assumed MFU: the model FLOPs over devices × peak × MFU."""
    flops, layout = plan.flops, plan.layout
    capacity = layout.world_size * flops.peak_tflops * 1e12
    return flops.model_per_token * tokens_per_step(recipe, plan) / (capacity * model_mfu(recipe, plan))


def _compute(
    recipe: Recipe, plan: Plan, bubble: float, overlaps: tuple[Overlap, ...]
) -> tuple[Compute, dict[str, float]]:
    """The step at the assumed MFU, split into compute, the bubble and what traffic compute cannot hide.

    The step is the model FLOPs at the assumed MFU (its definition). What the bubble (a share of the pipelined time)
    and the waiting for traffic leave of it is compute (:func:`~recipekit.memory.overlap.solve_compute`); the
    kernels' utilisation is the hardware FLOPs (recomputation included) over that time. Where nothing would be left,
    or compute would run above the peak, the assumed MFU cannot be reached on this layout: the MFU is then read as
    the kernels' utilisation of the model FLOPs (what a layout without bubble or exposed traffic would reach) and the
    step is that compute plus the bubble and the traffic, longer than the MFU says."""
    flops, layout = plan.flops, plan.layout
    tokens = tokens_per_step(recipe, plan)
    capacity = layout.world_size * flops.peak_tflops * 1e12
    hardware = flops.hardware_per_token * tokens
    at_mfu = _mfu_step(recipe, plan)
    compute_s = solve_compute(at_mfu, bubble, overlaps)
    attainable = compute_s > 0 and hardware / capacity <= compute_s
    if not attainable:
        compute_s = max(at_mfu * flops.hardware_per_token / flops.model_per_token, hardware / capacity)
    waits = exposed(overlaps, compute_s)
    step = compute_s / (1 - bubble) + sum(waits.values())
    compute = Compute(
        params_total=flops.params_total,
        params_active=flops.params_active,
        params_trainable=flops.params_trainable,
        flops_per_token=flops.model_per_token,
        tokens_per_step=tokens,
        recompute_factor=flops.hardware_per_token / flops.model_per_token,
        peak_tflops=flops.peak_tflops,
        assumed_mfu=recipe.hw.assumed_mfu,
        mfu_attention=recipe.hw.assumed_mfu_attention,
        mfu=flops.model_per_token * tokens / (capacity * step),
        hfu=hardware / (capacity * step),
        efficiency=hardware / (capacity * compute_s),
        attainable=attainable,
        time_s=compute_s,
    )
    return compute, waits


def _time_items(compute: Compute, bubble: float, waits: dict[str, float]) -> tuple[TimeItem, ...]:
    items = [
        TimeItem(
            "compute",
            compute.time_s,
            f"hardware FLOPs at {compute.efficiency:.0%} of the peak (the kernels' utilisation the MFU leaves)",
        )
    ]
    if bubble:
        items.append(
            TimeItem("pipeline bubble", compute.time_s * bubble / (1 - bubble), f"{bubble:.1%} of the pipelined time")
        )
    items += [TimeItem(name, seconds, "not hidden by compute") for name, seconds in waits.items() if seconds > 0]
    return tuple(items)


def _unattainable_note(compute: Compute, waiting: float, bubble: float) -> str:
    return (
        f"hw.assumed_mfu {compute.assumed_mfu:g} cannot be reached on this layout: its exposed traffic "
        f"({waiting:.3g} s) and bubble ({bubble:.0%}) leave compute too little time at that MFU; the step is its "
        f"compute at that utilisation plus them: {compute.mfu:.1%} MFU"
    )


# ------------------------------------------------------------------------------------------------------- traffic
def dp_group_crosses_nodes(layout: Layout) -> bool:
    """Megatron's rank order (TP innermost, then CP, DP, PP outermost): a stage's TP × CP × DP ranks are
    consecutive."""
    return layout.world_size // layout.pipeline_parallel > layout.devices_per_pod


def _dp_communication(
    recipe: Recipe, plan: Plan, reg: Regime, share: DeviceShare, found: dict[str, Group]
) -> tuple[Communication, tuple[Overlap, ...]]:
    """The step's data-parallel traffic (:func:`~recipekit.memory.traffic.dp_traffic`) of the dense weights over
    the data-parallel (× CP) group and of the experts over theirs, each on the link its group crosses
    (:mod:`recipekit.plan.nesting`: a group spanning pods shares their network), and what of it compute can hide
    (nothing without ``overlap_comm`` under ZeRO). The record's exposed seconds are filled in once the compute
    time is known."""
    par, layout = recipe.parallel, plan.layout
    dense_group = found["DP×CP"] if "DP×CP" in found else found["DP"]
    full = adapter_of(recipe.mode) is None
    parts = [(dense_group, share.params - share.expert_params, share.trainable - (share.expert_params * full))]
    if share.expert_params and "expert DP" in found:
        parts.append((found["expert DP"], share.expert_params, share.expert_params if full else 0.0))
    volume = time_s = 0.0
    pattern = "none (one data-parallel rank)"
    overlaps: list[Overlap] = []
    for group, params, trainable in parts:
        if group.size == 1:
            continue
        traffic = dp_traffic(
            reg,
            dp=group.size,
            accum=layout.gradient_accumulation_steps,
            params=params,
            trainable=trainable,
            checkpointing=par.gradient_checkpointing,
        )
        pattern = traffic.pattern
        hide, show = traffic.hideable / GB / group.gbps, traffic.exposed / GB / group.gbps
        overlapped = par.overlap_comm or reg.zero_stage == 0
        overlaps.append(
            Overlap(
                "DP traffic", show + (0.0 if overlapped else hide), hide if overlapped else 0.0, traffic.window_share
            )
        )
        time_s += hide + show
        volume += (traffic.hideable + traffic.exposed) / GB
    comm = Communication(pattern, volume, dense_group.link, dense_group.crosses_nodes, dense_group.gbps, time_s, 0.0)
    return comm, tuple(overlaps)

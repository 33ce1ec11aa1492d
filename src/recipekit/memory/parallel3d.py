"""Tensor, context and pipeline parallelism in the estimate: the schedule's bubble, TP's collectives and CP's ring
on the links their groups cross, and whether the recipe's engine runs the layout (the :class:`ThreeD` record).

Apart from :mod:`recipekit.memory.estimate` because a layout beyond data parallelism is its own count (per stage,
per link), made only when the plan's layout has model parallelism; the estimate takes its record and its traffic
as :class:`~recipekit.memory.overlap.Overlap` items. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.memory.breakdown import DeviceShare, megatron_layout
from recipekit.memory.formulas import GB, Regime
from recipekit.memory.overlap import Overlap
from recipekit.memory.traffic import tp_allreduce_bytes_per_layer, tp_allreduce_count, tp_head_bytes
from recipekit.plan.engines import engine_of, engine_problems
from recipekit.plan.layoutrules import stage_layers
from recipekit.plan.nesting import Group, describe
from recipekit.plan.parallelism import PIPELINE_NEEDS
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import Recipe


@dataclass(frozen=True)
class ThreeD:
    """Tensor, context and pipeline parallelism: the schedule's bubble, TP's and CP's traffic and the links they
    cross, and whether the bundle runs it (TP through DeepSpeed AutoTP; the rest is analysis only)."""

    tensor_parallel: int
    pipeline_parallel: int
    micro_batches: int
    bubble_fraction: float
    tp_allreduces_per_layer: int  # b·s·h all-reduces (or all-gather + reduce-scatter pairs) per layer per micro-step
    tp_allreduce_gb_per_layer: float  # per device, one micro-batch's forward and backward
    tp_head_gb: float  # per device, one micro-batch: the embedding and head's TP traffic
    tp_volume_gb: float  # per device, per optimizer step
    tp_inside_node: bool
    tp_link: str
    tp_time_s: float
    buildable: bool  # the bundle runs this layout
    note: str
    context_parallel: int = 1
    virtual_stages: int = 1
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] = ()
    cp_volume_gb: float = 0.0  # per device per step: keys and values passed around the ring
    cp_time_s: float = 0.0
    cp_exposed_s: float = 0.0  # what the attention's own compute cannot hide
    groups: str = ""  # where each group lies (plan.nesting.describe)


def three_d_overlaps(three_d: ThreeD | None, plan: Plan) -> tuple[Overlap, ...]:
    """TP's collectives sit between two layers' compute: all waited for. CP's ring runs behind the attention
    computed on the chunk already there: its share of the compute."""
    if three_d is None:
        return ()
    flops = plan.flops
    attention = flops.attention_per_token / flops.hardware_per_token
    return (
        Overlap("TP traffic", three_d.tp_time_s, 0.0, 0.0),
        Overlap("CP traffic", 0.0, three_d.cp_time_s, attention),
    )


def three_d_of(
    recipe: Recipe,
    plan: Plan,
    reg: Regime,
    share: DeviceShare,
    found: dict[str, Group],
    bubble: float,
) -> ThreeD:
    """TP's collectives over the heaviest stage's layers and its embedding/head traffic (none of it hidden: every
    one sits between two layers' compute) on the link TP crosses; CP's ring (hidden behind the attention's own
    compute where it can be); the schedule's bubble."""
    model, layout = recipe.model, plan.layout
    tp, pp, m = layout.tensor_parallel, layout.pipeline_parallel, layout.gradient_accumulation_steps
    checkpointing = recipe.parallel.gradient_checkpointing and recipe.parallel.recompute_granularity == "full"
    megatron = megatron_layout(recipe, layout)
    shape = dict(
        tensor_parallel=tp, micro_batch=layout.micro_batch_size, seq_len=recipe.data.max_len // layout.context_parallel
    )
    per_layer = tp_allreduce_bytes_per_layer(
        reg, hidden=model.hidden_size, checkpointing=checkpointing, megatron=megatron, **shape
    )
    ends = share.stage in (0, pp - 1)
    head = tp_head_bytes(reg, model, **shape) / GB if tp > 1 and ends else 0.0
    step_volume = (per_layer / GB * share.layers + head) * m
    tp_group = found["TP"]
    cp_volume, cp_time = _cp_traffic(recipe, plan, reg, share, found)
    problems = engine_problems(recipe, layout)
    if not problems:
        note = engine_of(recipe).runs(recipe, layout)
    elif pp > 1:
        note = f"analysis only: {PIPELINE_NEEDS}"
    else:
        note = "analysis only: " + "; ".join(p.message for p in problems)
    return ThreeD(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        micro_batches=m,
        bubble_fraction=bubble,
        tp_allreduces_per_layer=tp_allreduce_count(checkpointing, megatron=megatron) if tp > 1 else 0,
        tp_allreduce_gb_per_layer=per_layer / GB,
        tp_head_gb=head,
        tp_volume_gb=step_volume,
        tp_inside_node=not tp_group.crosses_nodes,
        tp_link=tp_group.link,
        tp_time_s=step_volume / tp_group.gbps if tp > 1 else 0.0,
        buildable=not problems,
        note=note,
        context_parallel=layout.context_parallel,
        virtual_stages=layout.virtual_stages,
        schedule=layout.schedule,
        sequence_parallel=layout.sequence_parallel,
        stage_layers=stage_layers(model.num_layers, layout) or (),
        cp_volume_gb=cp_volume,
        cp_time_s=cp_time,
        cp_exposed_s=0.0,  # known once the compute time is
        groups=describe(found),
    )


#: Ring attention's passes of one rank's keys and values around the CP ring per layer and micro-step: forward, and
#: in backward the keys and values again with their gradients (Megatron-core's attention with cp_comm_type p2p).
CP_RING_PASSES = 3


def _cp_traffic(
    recipe: Recipe, plan: Plan, reg: Regime, share: DeviceShare, found: dict[str, Group]
) -> tuple[float, float]:
    """(GB per device per step, seconds) of context parallelism's ring over the heaviest stage: each rank's keys
    and values (seq / CP tokens × 2 × kv width, its TP share) travel CP − 1 hops."""
    layout, model = plan.layout, recipe.model
    cp = layout.context_parallel
    if cp == 1:
        return 0.0, 0.0
    kv = 2 * model.num_kv_heads * model.head_dim * reg.element / max(1, layout.tensor_parallel)
    tokens = layout.micro_batch_size * recipe.data.max_len / cp
    passes = CP_RING_PASSES + (1 if recipe.parallel.gradient_checkpointing else 0)
    volume = passes * (cp - 1) * tokens * kv * share.layers * layout.gradient_accumulation_steps / GB
    return volume, volume / found["CP"].gbps

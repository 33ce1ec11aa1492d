"""An MoE model's experts in the estimate: total against active parameters, and what expert parallelism saves in
memory and costs in all-to-all traffic (the :class:`ExpertParallel` record).

Apart from :mod:`recipekit.memory.estimate` because only an MoE model has it and its count (tokens routed to
their top-k experts across ranks and nodes, the experts' own data-parallel group) is its own. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from recipekit.memory.breakdown import DeviceShare
from recipekit.memory.formulas import GB, GIB, Regime, model_states
from recipekit.memory.overlap import Overlap
from recipekit.memory.traffic import dp_traffic
from recipekit.plan.engines import engine_of, engine_problems
from recipekit.plan.layout import Layout
from recipekit.plan.modelsize import ParamCounts
from recipekit.plan.nesting import Group
from recipekit.plan.parallelism import EXPERTS_NEED
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import Recipe
from recipekit.runtime.boundary import recipeview


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


def alltoall_overlaps(recipe: Recipe, plan: Plan, experts: ExpertParallel | None) -> tuple[Overlap, ...]:
    """The experts' all-to-all: all of it waited for, or with ``parallel.overlap_moe_alltoall`` (or DualPipe, which
    pairs one micro-batch's forward with another's backward for this) behind another micro-batch's compute."""
    if experts is None or plan.layout.expert_parallel == 1:
        return ()
    if recipe.parallel.overlap_moe_alltoall or plan.layout.schedule == "dualpipe":
        return (Overlap("EP all-to-all", 0.0, experts.alltoall_time_s, 1.0),)
    return (Overlap("EP all-to-all", experts.alltoall_time_s, 0.0, 0.0),)


def token_copies(recipe: Recipe, layout: Layout, ep: int) -> float:
    """Copies of a token the all-to-all sends off its rank, per direction.

    Inside a node, each of its top-k experts on another rank gets one: k × (EP − 1)/EP. Where the EP group spans
    nodes, what crosses the network is one copy per other node that holds one of its experts, forwarded inside the
    node over its own links (DeepEP's dispatch, DeepSeek-V3's, §3.2.2): of n nodes, k random experts fall in
    n × (1 − (1 − 1/n)^k) of them, at most the groups node-limited routing allows (``topk_group`` of a config with
    ``n_group`` > 1), the own node's not counted."""
    k = recipe.model.experts_per_token
    nodes = max(1, layout.expert_tp * ep // layout.devices_per_pod)
    if nodes == 1:
        return k * (ep - 1) / ep
    config = recipe.model.config or {}
    reached = nodes * (1 - (1 - 1 / nodes) ** k)
    if isinstance(config.get("n_group"), int) and config["n_group"] > 1 and isinstance(config.get("topk_group"), int):
        reached = min(reached, config["topk_group"])
    return reached * (nodes - 1) / nodes


def _alltoall_gb(recipe: Recipe, plan: Plan, reg: Regime, ep: int, layers: int) -> float:
    """Token all-to-all volume per device per step with ``ep``-way EP over ``layers`` MoE layers: each rank's tokens
    (after CP, and SP's split) go to their experts (:func:`token_copies`) and back: dispatch and combine in forward,
    their gradients in backward, the forward's again under full recomputation. FP8 training dispatches in FP8 (one
    byte an element; the combine and the gradients stay 16-bit), as DeepSeek-V3 does (§3.3.2)."""
    model, layout = recipe.model, plan.layout
    tokens = layout.micro_batch_size * recipe.data.max_len / layout.context_parallel
    tokens /= layout.tensor_parallel if layout.sequence_parallel else 1
    dispatch = 1 if plan.precision == "fp8" else reg.element
    forward = dispatch + reg.element
    recomputed = recipe.parallel.gradient_checkpointing and recipe.parallel.recompute_granularity == "full"
    element_passes = forward + 2 * reg.element + (forward if recomputed else 0)
    per_layer = element_passes * tokens * token_copies(recipe, layout, ep) * model.hidden_size
    return per_layer * layers * layout.gradient_accumulation_steps / GB


def _expert_state_bytes(recipe: Recipe, reg: Regime, expert_params: float, ranks: int, ep: int) -> float:
    """Device bytes of the experts' model states with ``ep``-way expert parallelism (1: none)."""
    share = expert_params / ep
    full = not recipeview.trains_adapter(recipe.mode.kind)  # PEFT does not adapt fused experts: they stay frozen
    states = model_states(
        share,
        reg,
        dp=max(1, ranks // ep),
        trainable=share if full else 0,
        offload_optimizer=recipe.parallel.offload_optimizer,
        offload_param=recipe.parallel.offload_param,
    )
    return states.device


def _expert_traffic_gb(recipe: Recipe, reg: Regime, layout: Layout, expert_params: float, ranks: int, ep: int) -> float:
    """The experts' share of the data-parallel traffic per device per step with ``ep``-way EP (1: none)."""
    group = max(1, ranks // ep)
    if group == 1:
        return 0.0
    full = not recipeview.trains_adapter(recipe.mode.kind)
    share = expert_params / ep
    traffic = dp_traffic(
        reg,
        dp=group,
        accum=layout.gradient_accumulation_steps,
        params=share,
        trainable=share if full else 0,
        checkpointing=recipe.parallel.gradient_checkpointing,
    )
    return (traffic.hideable + traffic.exposed) / GB


def experts_of(
    recipe: Recipe, plan: Plan, reg: Regime, counts: ParamCounts, found: dict[str, Group], share: DeviceShare
) -> ExpertParallel:
    """Total and active parameters, and EP's saving and all-to-all cost over the heaviest stage's layers (the
    recipe's EP, else the widest EP inside a pod that divides the experts and the ranks that could hold them)."""
    model, hw, layout = recipe.model, recipe.hw, plan.layout
    ranks = layout.world_size // (layout.expert_tp * layout.pipeline_parallel)  # EP × expert-DP
    ep = layout.expert_parallel
    if ep == 1:
        fits = [d for d in range(1, layout.devices_per_pod + 1) if model.num_experts % d == 0 and ranks % d == 0]
        ep = max(fits)
    stage_experts = counts.experts * share.layers / counts.layers / layout.expert_tp
    group = found.get("EP")
    if group is not None:
        link, gbps = group.link, group.alltoall_gbps
    else:
        inside = ep <= layout.devices_per_pod
        link, gbps = (
            (hw.intra_node_link, hw.intra_node_gbps)
            if inside
            else (hw.inter_node_link, hw.inter_node_gbps / layout.devices_per_pod)
        )
    volume = _alltoall_gb(recipe, plan, reg, ep, share.layers) if ep > 1 else 0.0
    problems = engine_problems(recipe, layout) if layout.expert_parallel > 1 else []
    chosen = "the recipe's" if layout.expert_parallel > 1 else "analysed (parallel.expert_parallel is 1)"
    if ep == 1:
        note = "no EP inside a pod divides the experts and the ranks"
    elif layout.expert_parallel > 1 and not problems:
        note = f"EP {ep} {chosen}: {engine_of(recipe).runs(recipe, layout)}"
    else:
        note = f"EP {ep} {chosen}: {EXPERTS_NEED}"
    return ExpertParallel(
        num_experts=model.num_experts,
        experts_per_token=model.experts_per_token,
        params_total=counts.total,
        params_active=counts.active,
        expert_params=counts.experts,
        expert_parallel=ep,
        expert_gib=_expert_state_bytes(recipe, reg, stage_experts, ranks, 1) / GIB,
        expert_gib_with_ep=_expert_state_bytes(recipe, reg, stage_experts, ranks, ep) / GIB,
        dp_gb=_expert_traffic_gb(recipe, reg, layout, stage_experts, ranks, 1),
        dp_gb_with_ep=_expert_traffic_gb(recipe, reg, layout, stage_experts, ranks, ep),
        alltoall_gb=volume,
        alltoall_time_s=volume / gbps,
        link=link,
        buildable=not problems and (ep == 1 or layout.expert_parallel == ep),
        note=note,
    )

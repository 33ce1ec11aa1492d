"""Layouts that fit: variations of a recipe, each planned and estimated, and the Hydra overrides that select them.

``fixes``/``fit_problem`` find the cheapest change that makes a recipe fit (what a refused ``build`` proposes);
``advise`` ranks every layout of the recipe's cluster that fits (``plan --advise``). The parallel options to try are
passed in by the caller (they are data, ``recipes/parallel/*.yaml`` and the team's trees: see
:mod:`recipekit.recipe.paralleloptions`); nothing here reads from disk, but for the built-in ``engine=megatron``
option a candidate moved to Megatron-core composes to (read when a candidate first needs it, never at import). The
layouts tried come from :mod:`recipekit.memory.layoutsearch`. Each variation is planned by
:func:`recipekit.plan.plan.make_plan` (numbers only, no bundle documents), so its layout numbers come from the
plan's own derivation.

Time: the recipe's ``hw.assumed_mfu`` is the MFU of its own layout. Its estimate says at what utilisation the
kernels then run (:attr:`~recipekit.memory.estimate.Compute.efficiency`); another layout at that utilisation, with
its own recomputation, bubble and exposed traffic, reaches another MFU, which its overrides carry
(``hw.assumed_mfu=…``): the layout pasted is planned with the MFU it was ranked at.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from recipekit.base.errors import Problem, RecipeError
from recipekit.image.matrix import ImageMatrix
from recipekit.memory.estimate import Estimate, estimate
from recipekit.memory.layoutsearch import layouts, options_for
from recipekit.memory.overlap import exposed
from recipekit.plan.engines import buildable
from recipekit.plan.layout import recipe_layout
from recipekit.plan.layoutrules import megatron_features
from recipekit.plan.plan import Plan, make_plan
from recipekit.recipe.schema import to_data
from recipekit.recipe.sections import ParallelSpec, Recipe
from recipekit.runtime.boundary import flopcount

#: fit_problem tries at most this many doublings of the node count.
MAX_NODE_DOUBLINGS = 6
#: The parallel options' fields that make a layout; every other field is a setting carried over unchanged.
_LAYOUT_FIELDS = ("zero_stage", "offload_optimizer", "offload_param", "distributed_optimizer")
#: The layout keys of the parallel section a candidate may set, in the order its overrides name them.
SHAPE_KEYS = (
    "tensor_parallel",
    "sequence_parallel",
    "pipeline_parallel",
    "virtual_pipeline_stages",
    "first_stage_layers",
    "last_stage_layers",
    "context_parallel",
    "expert_parallel",
)
#: Significant digits of an advised layout's MFU (its ``hw.assumed_mfu=`` override): 0.1 % of the step.
MFU_DIGITS = 3


# ------------------------------------------------------------------------------------------------------ candidates
@dataclass(frozen=True)
class Candidate:
    """A variation of a recipe and the Hydra overrides that, added to the recipe's own, compose to it."""

    recipe: Recipe
    overrides: tuple[str, ...]


def _value(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


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
    shape: Mapping[str, int | bool] | None = None,
    assumed_mfu: float | None = None,
    explicit: bool = False,
) -> Candidate:
    """``recipe`` changed as asked, built the way Hydra would compose it, with the overrides that say so.

    Choosing ``parallel=NAME`` replaces the parallel section by that option's file, except for the keys the recipe
    set on top of its own option (the user's ``parallel.*`` overrides stay in force when composed again), which are
    carried over. ``shape`` sets the layout's keys (:data:`SHAPE_KEYS`); each one that differs from the recipe's is
    written out. ``global_batch_size`` keeps the batch fixed: when the recipe pins gradient accumulation (or sets no
    global batch) the accumulation the plan derives for the new layout is written out. ``assumed_mfu`` sets the MFU
    the layout is planned at. ``explicit`` lists every varied setting (advice); otherwise only what changes.
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
            out += [f"parallel.{k}={_value(getattr(new_par, k))}" for k in _LAYOUT_FIELDS]
    keys: dict[str, int | bool] = (
        {"gradient_checkpointing": gradient_checkpointing} if gradient_checkpointing is not None else {}
    )
    keys |= {"tensor_parallel": tensor_parallel} if tensor_parallel is not None else {}
    keys |= {"pipeline_parallel": pipeline_parallel} if pipeline_parallel is not None else {}
    keys |= dict(shape or {})
    for key, value in keys.items():
        if (explicit and key in ("gradient_checkpointing", "tensor_parallel", "pipeline_parallel")) or (
            value != getattr(new_par, key) or value != getattr(par, key)
        ):
            out.append(f"parallel.{key}={_value(value)}")
        new_par = replace(new_par, **{key: value})  # type: ignore[arg-type]  # a key of the parallel section

    new_train = tr
    if micro_batch_size is not None and (explicit or micro_batch_size != tr.micro_batch_size):
        new_train = replace(new_train, micro_batch_size=micro_batch_size)
        out.append(f"train.micro_batch_size={micro_batch_size}")
    new_cluster = recipe.cluster
    if nodes is not None and nodes != recipe.cluster.nodes:
        new_cluster = replace(new_cluster, nodes=nodes)
        out.append(f"cluster.nodes={nodes}")
    changed = replace(recipe, parallel=new_par, train=new_train, cluster=new_cluster)
    if global_batch_size is not None and (tr.gradient_accumulation_steps is not None or tr.global_batch_size is None):
        asked = replace(new_train, gradient_accumulation_steps=None, global_batch_size=global_batch_size)
        accum = recipe_layout(replace(changed, train=asked))[0].gradient_accumulation_steps
        if explicit or accum != tr.gradient_accumulation_steps:
            changed = replace(changed, train=replace(new_train, gradient_accumulation_steps=accum))
            out.append(f"train.gradient_accumulation_steps={accum}")
    if assumed_mfu is not None and assumed_mfu != recipe.hw.assumed_mfu:
        changed = replace(changed, hw=replace(changed.hw, assumed_mfu=assumed_mfu))
        out.append(f"hw.assumed_mfu={assumed_mfu:g}")
    if changed.engine.kind == "trainer" and megatron_features(changed, recipe_layout(changed)[0]):
        # a layout only Megatron-core runs is proposed with the engine that builds it (plan/engines); the built-in
        # engine option is read only here, when a candidate needs it, so importing the estimators reads no recipe tree
        from recipekit.recipe.paralleloptions import builtin_engine

        changed = replace(changed, engine=builtin_engine("megatron"))
        out.insert(0, "engine=megatron")
    return Candidate(changed, tuple(out))


def _try(cand: Candidate, images: ImageMatrix, global_batch: int) -> Estimate | None:
    """The candidate's estimate, or None when make_plan rejects it or it changes the global batch.

    A plan holds numbers only (the bundle's documents are built later, once): an estimate reads just those.
    """
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


# ------------------------------------------------------------------------------------------------------- the MFU
def _floor_significant(value: float, digits: int) -> float:
    """``value`` rounded down to ``digits`` significant digits (an MFU rounded down never asks for a step shorter
    than the one predicted, which a layout bound by its traffic could not reach)."""
    if value <= 0:
        return value
    scale = 10 ** (digits - 1 - math.floor(math.log10(value)))
    return float(f"{math.floor(value * scale * (1 + 1e-12)) / scale:.{digits}g}")


def predicted_mfu(est: Estimate, efficiency: float) -> float:
    """The MFU ``est``'s layout reaches with its kernels at ``efficiency`` (another layout's, the recipe's own):
    its hardware FLOPs at that utilisation, stretched by its bubble, plus the traffic it cannot hide; in the count
    the recipe states its MFU in (``hw.assumed_mfu_attention``), rounded down to :data:`MFU_DIGITS` significant
    digits."""
    flops, layout = est.plan.flops, est.layout
    capacity = layout.world_size * flops.peak_tflops * 1e12
    mfu = flops.model_per_token * est.compute.tokens_per_step / (capacity * _step_at(est, efficiency))
    if est.recipe.hw.assumed_mfu_attention == "causal":
        mfu *= flopcount.causal_share(flops.attention_per_token, flops.model_per_token)
    return min(1.0, _floor_significant(mfu, MFU_DIGITS))


def _at_predicted_mfu(cand: Candidate, est: Estimate, efficiency: float) -> Advice:
    """The candidate with the MFU its layout reaches at ``efficiency`` in its overrides, re-estimated."""
    mfu = predicted_mfu(est, efficiency)
    if mfu == cand.recipe.hw.assumed_mfu:
        return Advice(cand.overrides, est)
    moved = replace(cand.recipe, hw=replace(cand.recipe.hw, assumed_mfu=mfu))
    again = estimate(moved, est.plan)  # the MFU is no number of the plan's
    return Advice((*cand.overrides, f"hw.assumed_mfu={mfu:g}"), again)


# ----------------------------------------------------------------------------------------------------------- fixes
@dataclass(frozen=True)
class Advice:
    """One layout that fits, the overrides that select it, and its estimate."""

    overrides: tuple[str, ...]
    estimate: Estimate

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s

    @property
    def buildable(self) -> bool:
        """Whether ``build`` accepts this layout with the recipe's engine (:func:`recipekit.plan.engines.buildable`:
        the Megatron engine builds Megatron-core's layouts, the Trainer's only DP, ZeRO and AutoTP)."""
        return buildable(self.estimate.recipe, self.estimate.layout)


def _fits_line(est: Estimate) -> str:
    return f"≈ {est.total_gib:.1f} of {est.device_gib:g} GiB per device, step ≈ {est.step_time_s:.1f} s"


def fixes(
    est: Estimate, *, parallel_options: Mapping[str, ParallelSpec], images: ImageMatrix | None = None
) -> list[Advice]:
    """Changes that make ``est`` fit, as overrides to paste: the cheapest first, then, when that one offloads, the
    fewest nodes that fit without offloading. Empty when ``est`` fits or nothing tried does.

    Tried in order, each re-estimated, first fit wins: gradient checkpointing on; a higher ZeRO stage (with the
    current checkpointing, then with it on); a smaller micro batch with checkpointing on (accumulation keeps the
    global batch); optimizer (and parameter) offload, host memory before NVMe; more nodes (doubling, with the highest
    ZeRO stage and checkpointing on). Each fix carries the MFU its layout reaches at the recipe's kernels'
    utilisation.
    """
    if est.fits:
        return []
    recipe, plan, options = est.recipe, est.plan, parallel_options
    images = images or _images_of(plan)
    gb, micro_now = plan.layout.global_batch_size, plan.layout.micro_batch_size
    gc_now = recipe.parallel.gradient_checkpointing
    zero_now = recipe.parallel.zero_stage
    efficiency = est.compute.efficiency

    def first_fit(tries: list[dict[str, Any]]) -> Advice | None:
        for changes in tries:
            cand = candidate(recipe, options, global_batch_size=gb, **changes)
            new = _try(cand, images, gb) if cand.overrides else None
            if new is not None and new.fits:
                return _at_predicted_mfu(cand, new, efficiency)
        return None

    plain = sorted(
        (
            o
            for o in options.values()
            if o.offload_optimizer == "none"
            and o.offload_param == "none"
            and o.zero_stage > zero_now
            and not o.distributed_optimizer
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
    tries: list[dict[str, Any]] = [{"gradient_checkpointing": True}] if not gc_now else []
    tries += [{"parallel": o.name, "gradient_checkpointing": gc} for o in plain for gc in dict.fromkeys((gc_now, True))]
    tries += [{"micro_batch_size": m, "gradient_checkpointing": True} for m in smaller]
    tries += [
        {"parallel": o.name, "gradient_checkpointing": True, "micro_batch_size": m}
        for o in offloads
        for m in dict.fromkeys((micro_now, 1))
    ]
    more_nodes: list[dict[str, Any]] = [
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
    est: Estimate, *, parallel_options: Mapping[str, ParallelSpec], images: ImageMatrix | None = None
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
    found = fixes(est, parallel_options=parallel_options, images=images)
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


# ---------------------------------------------------------------------------------------------------------- advise
def advise(
    recipe: Recipe,
    images: ImageMatrix,
    *,
    parallel_options: Mapping[str, ParallelSpec],
    top: int = 5,
    search_pp: bool = False,
) -> list[Advice]:
    """The ``top`` fastest layouts of ``recipe`` on its own cluster (nodes fixed) that fit, fastest first.

    Varies the parallel option (each of ``parallel_options``: DDP, ZeRO stages, offload variants), the micro batch
    (powers of two), gradient checkpointing and the TP degree (powers of two that divide the devices of a pod and
    the heads, with ZeRO ≤ 2, which is what AutoTP trains with). Only layouts ``build`` accepts are kept, unless
    ``search_pp``: then Megatron-core's layouts are searched too, within its rules (:mod:`recipekit.plan.layoutrules`)
    and the topology (TP inside a pod, with sequence parallelism), with its distributed optimizer (or ZeRO ≤ 1):
    PP (uneven first and last stages where the layers need them) with virtual stages, EP for an MoE model, CP for
    sequences of 16K tokens and more; they stay as analysis (:attr:`Advice.buildable` says which). The global batch
    stays the recipe's: layouts whose accumulation it does not divide are skipped. Each layout is planned at the
    MFU it reaches with the kernels at the recipe's utilisation (:func:`predicted_mfu`); ranked fastest first, ties
    broken by :func:`_rank`. Each advice's overrides, added to the recipe's own, compose to it.
    """
    base_plan = make_plan(recipe, images, analysis_only=True)
    efficiency = estimate(recipe, base_plan).compute.efficiency
    gb = base_plan.layout.global_batch_size
    found: dict[tuple[str, ...], tuple[Candidate, Estimate]] = {}
    for layout, keys in layouts(recipe, base_plan.layout, search_pp):
        for option in options_for(recipe, layout, parallel_options, search_pp):
            for gc in (False, True):
                cand = candidate(
                    recipe,
                    parallel_options,
                    parallel=option.name,
                    gradient_checkpointing=gc,
                    micro_batch_size=layout.micro_batch_size,
                    global_batch_size=gb,
                    shape=keys,
                    explicit=True,
                )
                est = _try(cand, images, gb)
                if est is None or not est.fits:
                    continue
                if search_pp or buildable(est.recipe, est.layout):
                    found.setdefault(cand.overrides, (cand, est))
    guessed = sorted(found.values(), key=lambda ce: (_step_at(ce[1], efficiency), ce[0].overrides))
    advices = [_at_predicted_mfu(cand, est, efficiency) for cand, est in guessed[: max(3 * top, 10)]]
    ranked = sorted(advices, key=lambda a: (_rank(a.estimate), a.overrides))
    return ranked[:top]


def _step_at(est: Estimate, efficiency: float) -> float:
    """The step ``est``'s layout takes with its kernels at ``efficiency`` (what the first ordering uses)."""
    flops, layout = est.plan.flops, est.layout
    capacity = layout.world_size * flops.peak_tflops * 1e12
    bubble = est.parallel3d.bubble_fraction if est.parallel3d else 0.0
    compute = flops.hardware_per_token * est.compute.tokens_per_step / (capacity * efficiency)
    return compute / (1 - bubble) + sum(exposed(est.overlaps, compute).values())


def shown_step(seconds: float) -> float:
    """A step time to the precision ``plan`` shows it (hundredths of a second below 10 s, seconds below a minute,
    tenths of a minute below an hour, tenths of an hour after): steps shown alike are a tie."""
    if seconds < 10:
        return round(seconds, 2)
    if seconds < 60:
        return float(round(seconds))
    if seconds < 3600:
        return round(seconds / 60, 1) * 60
    return round(seconds / 3600, 1) * 3600


def _rank(est: Estimate) -> tuple[float, ...]:
    """Fastest first (steps shown alike tie: :func:`shown_step`); among ties the one with more headroom, then fewer
    devices, then the simpler layout (fewer parallel dimensions, then a lower ZeRO stage), then less offload."""
    lay, par = est.layout, est.parallel
    dims = (
        (lay.tensor_parallel > 1)
        + (lay.pipeline_parallel > 1)
        + (lay.virtual_stages > 1)
        + (lay.context_parallel > 1)
        + (lay.expert_parallel > 1)
        + lay.sequence_parallel
        + par.gradient_checkpointing
        + (par.offload_optimizer != "none")
        + (par.offload_param != "none")
    )
    return (
        shown_step(est.step_time_s),
        -round(est.headroom_gib, 1),
        lay.world_size,
        dims,
        par.zero_stage,
        round(est.offload.time_s, 6),
    )


def why_first(advices: list[Advice]) -> str:
    """Why the first layout is first, against the second: faster, or as fast with more headroom, fewer devices or
    a simpler layout."""
    if not advices:
        return ""
    if len(advices) == 1:
        return "1 is the only layout that fits"
    one, two = advices[0].estimate, advices[1].estimate
    first, second = _rank(one), _rank(two)
    if first[0] < second[0]:
        faster = two.step_time_s - one.step_time_s
        return f"1 is first: the fastest, {faster:.3g} s ({faster / two.step_time_s:.1%}) a step faster than 2"
    if first[1] < second[1]:
        return f"1 is first: as fast as 2, with more headroom ({one.headroom_gib:.1f} vs {two.headroom_gib:.1f} GiB)"
    if first[2] < second[2]:
        return f"1 is first: as fast as 2 with as much headroom, on fewer devices ({one.layout.world_size})"
    return "1 is first: as fast as 2 with as much headroom, and the simpler layout"

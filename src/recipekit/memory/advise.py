"""Layouts that fit: variations of a recipe, each planned and estimated, and the Hydra overrides that select them.

``fixes``/``fit_problem`` find the cheapest change that makes a recipe fit (what a refused ``build`` proposes);
``advise`` ranks every layout of the recipe's cluster that fits (``plan --advise``). The parallel options to try are
passed in by the caller (they are data, ``recipes/parallel/*.yaml`` and the team's trees: see
:mod:`recipekit.recipe.paralleloptions`); nothing here reads from disk. Each variation is planned by
:func:`recipekit.plan.plan.make_plan` (numbers only, no bundle documents), so its layout numbers come from the
plan's own derivation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from recipekit.base.errors import Problem, RecipeError
from recipekit.image.matrix import ImageMatrix
from recipekit.memory.estimate import Estimate, estimate
from recipekit.plan.layout import Layout, derive_layout, recipe_layout
from recipekit.plan.plan import Plan, make_plan
from recipekit.recipe.schema import to_data
from recipekit.recipe.sections import ParallelSpec, Recipe

#: fit_problem tries at most this many doublings of the node count.
MAX_NODE_DOUBLINGS = 6
#: The parallel options' fields that make a layout; every other field is a setting carried over unchanged.
_LAYOUT_FIELDS = ("zero_stage", "offload_optimizer", "offload_param")


# ------------------------------------------------------------------------------------------------------ candidates
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
    no global batch) the accumulation the plan derives for the new layout is written out. ``explicit`` lists every
    varied setting (advice); otherwise only what changes (a fix to paste).
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
        new_par = replace(new_par, **{key: value})  # type: ignore[arg-type]  # a key of the list above

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
        """Whether ``build`` accepts this layout (pipeline parallelism, and TP the bundle cannot run, are analysis
        only)."""
        d = self.estimate.parallel3d
        return d is None or d.buildable


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
    ZeRO stage and checkpointing on).
    """
    if est.fits:
        return []
    recipe, plan, options = est.recipe, est.plan, parallel_options
    images = images or _images_of(plan)
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
    the attention and KV heads, with ZeRO ≤ 2, which is what AutoTP trains with). Only layouts ``build`` accepts are
    kept, unless ``search_pp``: then PP degrees (with ZeRO ≤ 1, what pipeline engines support) are tried too, and
    the layouts the bundle cannot run are kept as analysis (:attr:`Advice.buildable` says which). The global batch
    stays the recipe's: layouts whose accumulation it does not divide are skipped. Layouts whose estimate does not
    fit are dropped; ranking is by estimated step time (compute, exposed communication, offload, TP all-reduces),
    ties broken by :func:`_rank`. Each advice's overrides, added to the recipe's own, compose to it.
    """
    base = make_plan(recipe, images, analysis_only=True).layout
    gb = base.global_batch_size
    own_tp, own_pp = recipe.parallel.tensor_parallel, recipe.parallel.pipeline_parallel
    found: dict[tuple[str, ...], Estimate] = {}
    for layout in _layouts(recipe, base, search_pp):
        tp, pp = layout.tensor_parallel, layout.pipeline_parallel
        shape: dict[str, int] = {}
        if tp > 1 or own_tp > 1:
            shape["tensor_parallel"] = tp
        if search_pp or pp > 1 or own_pp > 1:
            shape["pipeline_parallel"] = pp
        for option in parallel_options.values():
            if (pp > 1 and option.zero_stage > 1) or (tp > 1 and option.zero_stage > 2):
                continue
            for gc in (False, True):
                cand = candidate(
                    recipe,
                    parallel_options,
                    parallel=option.name,
                    gradient_checkpointing=gc,
                    micro_batch_size=layout.micro_batch_size,
                    global_batch_size=gb,
                    explicit=True,
                    **shape,
                )
                est = _try(cand, images, gb)
                if est is None or not est.fits:
                    continue
                if search_pp or est.parallel3d is None or est.parallel3d.buildable:
                    found.setdefault(cand.overrides, est)
    ranked = sorted(found.items(), key=lambda kv: _rank(kv[1]) + (kv[0],))
    return [Advice(overrides, est) for overrides, est in ranked[:top]]


def _layouts(recipe: Recipe, base: Layout, search_pp: bool) -> list[Layout]:
    """Every layout of ``base``'s devices that keeps its global batch: each TP dividing the heads within a pod (and,
    searching PP, each PP up to the layers) × each micro batch, as the plan derives them."""
    model = recipe.model
    tps = [
        t
        for t in _powers_of_two(base.devices_per_pod)
        if base.devices_per_pod % t == 0 and model.num_attention_heads % t == 0 and model.num_kv_heads % t == 0
    ]
    if base.tensor_parallel not in tps:
        tps.append(base.tensor_parallel)  # the recipe's own, analysed even where the bundle cannot run it
    pps = _powers_of_two(min(model.num_layers, base.world_size)) if search_pp else [base.pipeline_parallel]
    found = []
    for tp in tps:
        for pp in pps:
            for micro in _powers_of_two(base.global_batch_size):
                layout, problems = derive_layout(
                    base.nodes,
                    base.devices_per_pod,
                    tensor_parallel=tp,
                    pipeline_parallel=pp,
                    micro_batch_size=micro,
                    global_batch_size=base.global_batch_size,
                )
                if not problems:
                    found.append(layout)
    return found


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

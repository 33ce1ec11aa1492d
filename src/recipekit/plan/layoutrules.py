"""Megatron-core's rules for a layout: what its process groups, its model build and its schedules refuse, with the
arithmetic of each refusal.

These are the rules of the engine that runs tensor, sequence, pipeline (with virtual stages), context and expert
parallelism together: Megatron-core (``megatron/core/parallel_state.py`` builds the groups,
``transformer/transformer_config.py`` checks the model against them, ``pipeline_parallel/schedules.py`` runs the
micro-batches). A layout that breaks one cannot be planned at all, whichever engine would build it; which layouts
today's bundle (the Transformers Trainer on DeepSpeed) builds is :mod:`recipekit.plan.parallelism`'s question, not this
module's. Pure: numbers in, problems out.
"""

from __future__ import annotations

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout
from recipekit.recipe.sections import ModelSpec, Recipe


# --------------------------------------------------------------------------------------------- pipeline stages
def stage_layers(num_layers: int, layout: Layout) -> tuple[int, ...] | None:
    """Decoder layers of each pipeline stage, first to last, as Megatron-core splits them; None where it cannot.

    Without a first or last stage count the layers split evenly (``num_layers`` divisible by PP); with one, the
    remaining layers split evenly over the remaining stages (``num_layers_in_first_pipeline_stage`` and
    ``..._last_...``), each stage at least one layer.
    """
    pp, first, last = layout.pipeline_parallel, layout.first_stage_layers, layout.last_stage_layers
    if pp == 1:
        return (num_layers,)
    middle_stages = pp - bool(first) - bool(last)
    middle = num_layers - first - last
    if middle_stages == 0:
        return (first, last) if middle == 0 else None
    if middle < middle_stages or middle % middle_stages:
        return None
    each = middle // middle_stages
    return ((first,) if first else ()) + (each,) * middle_stages + ((last,) if last else ())


def _split_hint(num_layers: int, pp: int) -> str:
    """Stage counts that split ``num_layers`` over ``pp`` stages: an even split, a lighter first stage, or lighter
    first and last stages (what the Llama 3 paper did: one layer fewer on each end)."""
    if pp > num_layers:
        return f"at most PP {num_layers}"
    each = -(-num_layers // pp)
    for edge in range(each, 0, -1):
        if pp > 1 and (num_layers - edge) % (pp - 1) == 0 and (num_layers - edge) // (pp - 1) >= edge:
            return f"parallel.first_stage_layers={edge}"
        if pp > 2 and (num_layers - 2 * edge) % (pp - 2) == 0 and (num_layers - 2 * edge) // (pp - 2) >= edge:
            return f"parallel.first_stage_layers={edge} parallel.last_stage_layers={edge}"
    fits = [d for d in range(1, num_layers + 1) if num_layers % d == 0 and d <= pp]
    return f"PP {fits[-1]}"


def depth_problems(model: ModelSpec, pipeline_parallel: int) -> list[Problem]:
    """More stages than layers: a stage needs at least one. Asked of a layout whose devices did not even divide
    (whose other rules are not checked: their numbers would mislead), so that both problems are reported."""
    if pipeline_parallel <= model.num_layers:
        return []
    return [
        Problem(
            "parallel.pipeline_parallel",
            f"{pipeline_parallel} pipeline stages for {model.name}'s {model.num_layers} layers: a stage needs at "
            "least one layer",
            hint=f"at most {model.num_layers}",
        )
    ]


def pipeline_problems(model: ModelSpec, layout: Layout, micro_batches: int) -> list[Problem]:
    """The stage split, the virtual stages and the interleaved schedule's micro-batch groups."""
    pp, vpp, layers = layout.pipeline_parallel, layout.virtual_stages, model.num_layers
    problems: list[Problem] = []
    split = stage_layers(layers, layout)
    if split is None:
        first, last = layout.first_stage_layers, layout.last_stage_layers
        given = f" (first stage {first})" * bool(first) + f" (last stage {last})" * bool(last)
        middle = pp - bool(first) - bool(last)
        rest = layers - first - last
        arithmetic = f"{rest} layers over {middle} stages = {rest / middle:.3g}" if middle else f"{rest} left over"
        problems.append(
            Problem(
                "parallel.pipeline_parallel",
                f"{model.name}'s {layers} layers do not split over PP {pp}{given}: {arithmetic}; Megatron-core gives "
                "every stage a whole, equal number of layers besides an uneven first and last stage",
                hint=_split_hint(layers, pp),
            )
        )
    if pp == 1 and (layout.first_stage_layers or layout.last_stage_layers):
        problems.append(
            Problem("parallel.first_stage_layers", "a first or last stage's layers without pipeline stages (PP 1)")
        )
    if vpp > 1 and pp == 1:
        problems.append(Problem("parallel.virtual_pipeline_stages", f"{vpp} virtual stages without pipeline stages"))
    elif vpp > 1 and split is not None:
        uneven = sorted({n for n in split if n % vpp})
        if uneven:
            problems.append(
                Problem(
                    "parallel.virtual_pipeline_stages",
                    f"stages of {', '.join(map(str, uneven))} layers do not split into {vpp} virtual stages "
                    f"({uneven[0]} / {vpp} = {uneven[0] / vpp:.3g}): each holds a whole number of layers",
                    hint="virtual stages that divide every stage's layers",
                )
            )
    if layout.schedule == "dualpipe" and (pp % 2 or micro_batches % 2 or micro_batches < pp):
        problems.append(
            Problem(
                "parallel.pipeline_schedule",
                f"DualPipe with PP {pp} and {micro_batches} micro-batches: it feeds micro-batches from both ends of "
                "the pipeline, so both must be even and there must be as many micro-batches as stages "
                "(DeepSeek-V3 report, §3.2.1)",
            )
        )
    if layout.schedule == "interleaved_1f1b" and pp > 1 and (micro_batches < pp or micro_batches % pp):
        problems.append(
            Problem(
                "train.gradient_accumulation_steps",
                f"{micro_batches} micro-batches per step under interleaved 1F1B with PP {pp}: Megatron-core runs "
                f"them in groups of PP (microbatch_group_size_per_vp_stage), so they must be a multiple of {pp}",
                hint=f"a global batch whose micro-batches per pipeline are a multiple of {pp}",
            )
        )
    return problems


# ---------------------------------------------------------------------------------------- tensor and sequence
def _words(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:-1]) + (" or " if len(values) > 1 else "") + str(values[-1])


def tensor_problems(model: ModelSpec, layout: Layout) -> list[Problem]:
    """Heads split whole over TP; sequence parallelism needs TP, and an MoE model under TP needs it."""
    tp, problems = layout.tensor_parallel, []
    heads, kv = model.num_attention_heads, model.num_kv_heads
    if tp > 1 and (heads % tp or kv % tp):
        both = [d for d in range(2, kv + 1) if kv % d == 0 and heads % d == 0 and d <= layout.devices_per_pod]
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"TP {tp} does not divide {model.name}'s heads: {heads} attention heads / {tp} = {heads / tp:g}, "
                f"{kv} key/value heads / {tp} = {kv / tp:g}; each rank computes whole heads and key/value groups",
                hint=f"TP {_words(both or [1])}",
            )
        )
    if layout.sequence_parallel and tp == 1:
        problems.append(
            Problem(
                "parallel.sequence_parallel",
                "sequence parallelism with TP 1: it splits over the tensor-parallel ranks, and there is one",
                hint="parallel.tensor_parallel > 1, or parallel.sequence_parallel=false",
            )
        )
    if model.moe and tp > 1 and not layout.sequence_parallel:
        problems.append(
            Problem(
                "parallel.sequence_parallel",
                f"the MoE model {model.name} with TP {tp} and no sequence parallelism: Megatron-core refuses MoE "
                "layers under tensor parallelism without it",
                hint="parallel.sequence_parallel=true",
            )
        )
    return problems


def context_problems(layout: Layout, seq_len: int) -> list[Problem]:
    """A sequence splits into 2 × CP chunks (each rank takes one from each end, for causal balance); sequence
    parallelism then splits a rank's tokens over TP."""
    cp, tp, problems = layout.context_parallel, layout.tensor_parallel, []
    if cp > 1 and seq_len % (2 * cp):
        problems.append(
            Problem(
                "data.max_len",
                f"{seq_len} tokens do not split into 2 × CP {cp} = {2 * cp} chunks ({seq_len / (2 * cp):g}): "
                "Megatron-core gives each context-parallel rank two chunks, one from each end, for causal balance",
                hint=f"a sequence length divisible by {2 * cp}",
            )
        )
    elif layout.sequence_parallel and (seq_len // cp) % tp:
        problems.append(
            Problem(
                "data.max_len",
                f"{seq_len // cp} tokens per context-parallel rank do not split over TP {tp} "
                f"({seq_len // cp / tp:g}): sequence parallelism gives each tensor-parallel rank a whole share",
                hint=f"a sequence length divisible by {cp * tp}",
            )
        )
    return problems


# -------------------------------------------------------------------------------------------------------- experts
def expert_problems(model: ModelSpec, layout: Layout) -> list[Problem]:
    """Experts split evenly over EP; expert-TP × EP × PP ranks must tile the world (Megatron-core's expert rank
    generator); expert-TP splits each expert's width."""
    ep, etp, pp, world = layout.expert_parallel, layout.expert_tp, layout.pipeline_parallel, layout.world_size
    if ep == 1 and not layout.expert_tensor_parallel:
        return []
    if not model.moe:
        return [Problem("parallel.expert_parallel", f"EP {ep} for {model.name}, a dense model: it has no experts")]
    problems = []
    experts = model.num_experts
    if experts % ep:
        fits = [d for d in range(2, experts + 1) if experts % d == 0 and world % (d * etp * pp) == 0]
        problems.append(
            Problem(
                "parallel.expert_parallel",
                f"EP {ep} does not divide {model.name}'s {experts} experts ({experts} / {ep} = {experts / ep:g})",
                hint="EP " + ", ".join(map(str, fits[:6])) if fits else "EP 1",
            )
        )
    if world % (etp * ep * pp):
        problems.append(
            Problem(
                "parallel.expert_parallel",
                f"world size {world} is not divisible by expert-TP {etp} × EP {ep} × PP {pp} = {etp * ep * pp}: "
                "Megatron-core draws the expert groups from all ranks of a pipeline stage",
            )
        )
    if model.moe_intermediate_size % etp:
        problems.append(
            Problem(
                "parallel.expert_tensor_parallel",
                f"expert-TP {etp} does not divide an expert's width {model.moe_intermediate_size}",
            )
        )
    return problems


# ------------------------------------------------------------------------------------------------------- all
def overlap_problems(recipe: Recipe, layout: Layout) -> list[Problem]:
    """Megatron-core's EP all-to-all overlap (``overlap_moe_expert_parallel_comm``) runs on its combined 1F1B
    schedule: it needs EP, interleaved stages where there is a pipeline, and recomputation other than full."""
    par = recipe.parallel
    if not par.overlap_moe_alltoall:
        return []
    needs = []
    if layout.expert_parallel == 1:
        needs.append("expert parallelism (EP 1)")
    if layout.pipeline_parallel > 1 and layout.virtual_stages == 1:
        needs.append(f"virtual pipeline stages under PP {layout.pipeline_parallel}")
    if par.gradient_checkpointing and par.recompute_granularity == "full":
        needs.append("no full recomputation")
    if not needs:
        return []
    return [
        Problem(
            "parallel.overlap_moe_alltoall",
            "Megatron-core overlaps the experts' all-to-all only with " + ", ".join(needs),
            hint="parallel.overlap_moe_alltoall=false",
        )
    ]


def layout_rule_problems(recipe: Recipe, layout: Layout) -> list[Problem]:
    """Every Megatron-core rule ``layout`` breaks for ``recipe`` (its model, sequence length and batch)."""
    model = recipe.model
    return (
        tensor_problems(model, layout)
        + pipeline_problems(model, layout, layout.gradient_accumulation_steps)
        + context_problems(layout, recipe.data.max_len)
        + expert_problems(model, layout)
        + overlap_problems(recipe, layout)
    )


def megatron_features(recipe: Recipe, layout: Layout) -> tuple[str, ...]:
    """What of ``recipe``'s layout only Megatron-core runs (empty: the Trainer's own engine can): the planner costs
    such a layout with Megatron-core's kernels and sharding (fused norms and SwiGLU, a vocabulary-parallel
    embedding), the engine seam decides who builds it."""
    par = recipe.parallel
    found = [
        ("PP", layout.pipeline_parallel > 1),
        ("virtual stages", layout.virtual_stages > 1),
        ("DualPipe", layout.schedule == "dualpipe"),
        ("CP", layout.context_parallel > 1),
        ("EP", layout.expert_parallel > 1),
        ("SP", layout.sequence_parallel),
        ("distributed optimizer", par.distributed_optimizer),
        ("FP8", recipe.train.precision == "fp8"),
        ("selective recomputation", par.gradient_checkpointing and par.recompute_granularity == "selective"),
    ]
    return tuple(name for name, used in found if used)

"""The layouts ``plan --advise`` tries: every split of a recipe's devices into TP, PP (with its stage split and
virtual stages), CP and EP that keeps its global batch and obeys Megatron-core's rules, each with the micro batches
and the parallel options it can train with, and the parallel section's keys that select it.

Apart from :mod:`recipekit.memory.advise`, which plans, estimates and ranks what this yields, because what to try
is a question of the layout rules (:mod:`recipekit.plan.layoutrules`) and the topology alone. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from recipekit.plan.layout import Layout, Shape, derive_layout
from recipekit.plan.layoutrules import layout_rule_problems, megatron_features, stage_layers
from recipekit.recipe.sections import ParallelSpec, Recipe


def options_for(
    recipe: Recipe, layout: Layout, options: Mapping[str, ParallelSpec], search_pp: bool
) -> list[ParallelSpec]:
    """The parallel options a layout can train with: AutoTP's ZeRO ≤ 2 under TP; a Megatron-core layout its
    distributed optimizer (or, without one among the options, ZeRO ≤ 1 as pipeline engines support); without the
    Megatron-core search, no distributed optimizer."""
    megatron = bool(megatron_features(recipe, layout))
    if megatron:
        dist = [o for o in options.values() if o.distributed_optimizer]
        return dist or [o for o in options.values() if o.zero_stage <= 1 and o.offload_optimizer == "none"]
    return [
        o
        for o in options.values()
        if not o.distributed_optimizer and (layout.tensor_parallel == 1 or o.zero_stage <= 2)
    ]


def layouts(recipe: Recipe, base: Layout, search_pp: bool) -> Iterator[tuple[Layout, dict[str, int | bool]]]:
    """Every layout of ``base``'s devices that keeps its global batch and obeys Megatron-core's rules, with the
    shape keys that select it: each TP dividing the heads within a pod × (searching Megatron-core's layouts) each
    PP, virtual stages, CP and EP × each micro batch, as the plan derives them."""
    seen: set[Layout] = set()
    for tp, shape in _shapes(recipe, base, search_pp):
        micros = _powers_of_two(base.global_batch_size)
        if shape.context_parallel > 1 or shape.expert_parallel > 1 or shape.sequence_parallel or shape.pp > 1:
            micros = [m for m in micros if m <= 2]
        for micro in micros:
            layout, problems = derive_layout(
                base.nodes,
                base.devices_per_pod,
                tensor_parallel=tp,
                pipeline_parallel=shape.pp,
                micro_batch_size=micro,
                global_batch_size=base.global_batch_size,
                shape=shape.shape,
            )
            if problems or layout in seen or layout_rule_problems(recipe, layout):
                continue
            seen.add(layout)
            yield layout, _shape_keys(recipe, tp, shape)


@dataclass(frozen=True)
class _Dims:
    """One combination of the dimensions beyond TP the search tries."""

    pp: int
    shape: Shape

    @property
    def context_parallel(self) -> int:
        return self.shape.context_parallel

    @property
    def expert_parallel(self) -> int:
        return self.shape.expert_parallel

    @property
    def sequence_parallel(self) -> bool:
        return self.shape.sequence_parallel


def _shape_keys(recipe: Recipe, tp: int, dims: _Dims) -> dict[str, int | bool]:
    """The parallel section's keys of a layout: TP and PP always (what advice lists), the rest where they differ
    from the recipe's."""
    shape, par = dims.shape, recipe.parallel
    values: dict[str, int | bool] = {
        "tensor_parallel": tp,
        "sequence_parallel": shape.sequence_parallel,
        "pipeline_parallel": dims.pp,
        "virtual_pipeline_stages": shape.virtual_stages,
        "first_stage_layers": shape.first_stage_layers,
        "last_stage_layers": shape.last_stage_layers,
        "context_parallel": shape.context_parallel,
        "expert_parallel": shape.expert_parallel,
    }
    always = [
        key
        for key, shown in (
            ("tensor_parallel", tp > 1 or par.tensor_parallel > 1),
            ("pipeline_parallel", dims.pp > 1 or par.pipeline_parallel > 1),
        )
        if shown
    ]
    return {k: v for k, v in values.items() if k in always or v != getattr(par, k)}


def _shapes(recipe: Recipe, base: Layout, search_pp: bool) -> Iterator[tuple[int, _Dims]]:
    """(TP, the other dimensions) to try: the recipe's own dimensions, or (searching Megatron-core's layouts) every
    PP with its split and virtual stages, CP where sequences are long, EP where the model has experts."""
    model, par = recipe.model, recipe.parallel
    per_pod = base.devices_per_pod
    tps = [t for t in _powers_of_two(per_pod) if per_pod % t == 0 and _heads_split(recipe, t)]
    if base.tensor_parallel not in tps:
        tps.append(base.tensor_parallel)  # the recipe's own, analysed even where the bundle cannot run it
    own = Shape(
        context_parallel=base.context_parallel,
        expert_parallel=base.expert_parallel,
        expert_tensor_parallel=base.expert_tensor_parallel,
        virtual_stages=base.virtual_stages,
        sequence_parallel=base.sequence_parallel,
        schedule=base.schedule,
        first_stage_layers=base.first_stage_layers,
        last_stage_layers=base.last_stage_layers,
    )
    if not search_pp:
        for tp in tps:
            yield tp, _Dims(base.pipeline_parallel, replace(own, sequence_parallel=own.sequence_parallel and tp > 1))
        return
    seq = recipe.data.max_len
    cps = [c for c in _powers_of_two(64) if c == 1 or (seq % (2 * c) == 0 and seq // c >= 8192)]
    eps = [
        e for e in _powers_of_two(min(model.num_experts, base.world_size)) if model.moe and model.num_experts % e == 0
    ]
    for tp in tps:
        for pp in _powers_of_two(min(model.num_layers, base.world_size // tp)):
            for first, last in _splits(model.num_layers, pp):
                for vpp in (1, 2, 4) if pp > 1 else (1,):
                    for cp in cps:
                        for ep in eps or [1]:
                            yield (
                                tp,
                                _Dims(
                                    pp,
                                    Shape(
                                        context_parallel=cp,
                                        expert_parallel=ep,
                                        expert_tensor_parallel=par.expert_tensor_parallel,
                                        virtual_stages=vpp,
                                        sequence_parallel=tp > 1 and (pp > 1 or cp > 1 or ep > 1 or model.moe),
                                        schedule="interleaved_1f1b" if vpp > 1 else "1f1b",
                                        first_stage_layers=first,
                                        last_stage_layers=last,
                                    ),
                                ),
                            )


def _splits(layers: int, pp: int) -> list[tuple[int, int]]:
    """How to split ``layers`` over ``pp`` stages: evenly where they divide, else with lighter (or one lighter)
    first and last stages, the split Megatron-core accepts that is closest to even."""
    probe = Layout(1, 1, pipeline_parallel=pp)
    if stage_layers(layers, probe) is not None:
        return [(0, 0)]
    each = -(-layers // pp)
    for edge in range(each, 0, -1):
        for first, last in ((edge, edge), (edge, 0)):
            if stage_layers(layers, replace(probe, first_stage_layers=first, last_stage_layers=last)) is not None:
                return [(first, last)]
    return []


def _heads_split(recipe: Recipe, tp: int) -> bool:
    model = recipe.model
    return model.num_attention_heads % tp == 0 and model.num_kv_heads % tp == 0


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(0, max(0, limit).bit_length()) if 2**k <= limit]

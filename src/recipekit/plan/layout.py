"""How a recipe uses its devices and how big a step is: the numbers every bundle file and every estimate share.

A leaf of the planning stage: the plan derives the bundle's layout here, and the planner's layout search (memory's
advise) derives each candidate's with the same function, so world size, data-parallel size, accumulation and global
batch are computed one way. Errors show their arithmetic (torchtitan's parallel_dims style).

The one layout model of recipekit: tensor parallelism (with or without sequence parallelism), pipeline stages (with
virtual stages, the schedule and an uneven first or last stage), context and expert parallelism (with the experts'
own tensor parallelism), data parallelism over what is left. The dimensions nest as Megatron-core orders its ranks
(``megatron/core/parallel_state.py``, ``order="tp-cp-ep-dp-pp"``): TP innermost, then CP, then DP, PP outermost;
the experts' groups are drawn from the same ranks in the order expert-TP, EP, expert-DP, PP
(:mod:`recipekit.plan.nesting` says which group stays inside a node or a SuperPoD; :mod:`recipekit.plan.layoutrules`
holds Megatron-core's rules for them; which engine builds a layout is not this module's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from recipekit.base.errors import Problem
from recipekit.recipe.sections import ParallelSpec, Recipe
from recipekit.runtime.boundary import recipeview


@dataclass(frozen=True)
class Layout:
    """How the devices are used and how big a step is: the numbers every bundle file and every estimate share.

    The derived numbers are properties, so world size, data-parallel size and global batch cannot disagree with the
    numbers they come from. Megatron's order: TP innermost, then CP, DP, PP outermost; a model replica is TP × CP ×
    PP ranks (CP's ranks hold the same weights and split each sequence), the data-parallel ranks are the rest.
    """

    nodes: int
    devices_per_pod: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    context_parallel: int = 1
    expert_parallel: int = 1
    expert_tensor_parallel: int = 0  # 0: the tensor-parallel degree (Megatron's default)
    virtual_stages: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"  # "1f1b" or "interleaved_1f1b" (parallel.pipeline_schedule, resolved)
    first_stage_layers: int = 0  # 0: an even split
    last_stage_layers: int = 0

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_pod

    @property
    def model_parallel(self) -> int:
        """Ranks of one model replica: TP × CP × PP."""
        return self.tensor_parallel * self.context_parallel * self.pipeline_parallel

    @property
    def dp_size(self) -> int:
        return recipeview.data_parallel_size(self.world_size, self.model_parallel)

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree."""
        return self.expert_tensor_parallel or self.tensor_parallel

    @property
    def expert_dp_size(self) -> int:
        """Ranks holding the same experts: the world over expert-TP × EP × PP (Megatron's expert data parallel)."""
        return max(1, self.world_size // max(1, self.expert_tp * self.expert_parallel * self.pipeline_parallel))

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.dp_size

    def numbers(self) -> dict[str, int]:
        """Every number, given and derived, under the names the bundle files use."""
        return {
            "nodes": self.nodes,
            "devices_per_pod": self.devices_per_pod,
            "world_size": self.world_size,
            "dp_size": self.dp_size,
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "context_parallel": self.context_parallel,
            "expert_parallel": self.expert_parallel,
            "virtual_pipeline_stages": self.virtual_stages,
            "micro_batch_size": self.micro_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "global_batch_size": self.global_batch_size,
        }


#: The plan's numbers as recipe.yaml carries them, with their types (validate checks recipe.yaml against this).
LAYOUT_KEYS = tuple(Layout(1, 1).numbers())


@dataclass(frozen=True)
class Shape:
    """The layout's dimensions beyond TP and PP, as :class:`Layout` names them (its defaults: none of them)."""

    context_parallel: int = 1
    expert_parallel: int = 1
    expert_tensor_parallel: int = 0
    virtual_stages: int = 1
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    first_stage_layers: int = 0
    last_stage_layers: int = 0


def derive_layout(
    nodes: int,
    devices_per_pod: int,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    micro_batch_size: int = 1,
    gradient_accumulation_steps: int | None = None,
    global_batch_size: int | None = None,
    shape: Shape | None = None,
) -> tuple[Layout, list[Problem]]:
    """The layout for these choices, with every problem of the arithmetic (each showing its numbers).

    Accumulation is given, or derived from the global batch (which must then divide evenly), or 1. ``shape`` holds
    the dimensions beyond TP and PP (context, expert, virtual stages, sequence parallelism, the stage split).
    """
    problems: list[Problem] = []
    base = Layout(
        nodes, devices_per_pod, tensor_parallel, pipeline_parallel, micro_batch_size, **vars(shape or Shape())
    )
    world, model_parallel = base.world_size, base.model_parallel
    if world % model_parallel:
        cp = f" × CP {base.context_parallel}" if base.context_parallel > 1 else ""
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"world size {world} (nodes {nodes} × devices per pod {devices_per_pod}) is not divisible "
                f"by TP {tensor_parallel}{cp} × PP {pipeline_parallel} = {model_parallel}",
            )
        )
    dp, micro = base.dp_size, micro_batch_size
    per_step = micro * dp
    if problems:  # no data-parallel size follows from an impossible split: its batch arithmetic would mislead
        return replace(base, gradient_accumulation_steps=gradient_accumulation_steps or 1), problems
    if global_batch_size is not None and gradient_accumulation_steps is not None:
        accum = gradient_accumulation_steps
        if micro * accum * dp != global_batch_size:
            problems.append(
                Problem(
                    "train.global_batch_size",
                    f"{global_batch_size} != micro_batch_size ({micro}) × gradient_accumulation_steps ({accum}) "
                    f"× data-parallel size ({dp}) = {micro * accum * dp}",
                    hint="set only one of them: unset the other with train.global_batch_size=null or "
                    "train.gradient_accumulation_steps=null",
                )
            )
    elif global_batch_size is not None:
        accum = max(1, global_batch_size // per_step)
        if global_batch_size % per_step:
            lower, upper = (global_batch_size // per_step) * per_step, (global_batch_size // per_step + 1) * per_step
            problems.append(
                Problem(
                    "train.global_batch_size",
                    f"{global_batch_size} is not divisible by micro_batch_size ({micro}) × data-parallel size "
                    f"({dp}) = {per_step}",
                    hint="nearest that divide: " + " or ".join(str(v) for v in (lower, upper) if v > 0),
                )
            )
    else:
        accum = gradient_accumulation_steps or 1
    return replace(base, gradient_accumulation_steps=accum), problems


def shape_of(par: ParallelSpec) -> Shape:
    """The dimensions of ``par`` beyond TP and PP, as a layout takes them."""
    return Shape(
        context_parallel=par.context_parallel,
        expert_parallel=par.expert_parallel,
        expert_tensor_parallel=par.expert_tensor_parallel,
        virtual_stages=par.virtual_pipeline_stages,
        sequence_parallel=par.sequence_parallel,
        schedule=par.schedule,
        first_stage_layers=par.first_stage_layers,
        last_stage_layers=par.last_stage_layers,
    )


def recipe_layout(recipe: Recipe) -> tuple[Layout, list[Problem]]:
    """The layout a recipe asks for (devices per pod default to a whole node)."""
    cl, par, tr = recipe.cluster, recipe.parallel, recipe.train
    return derive_layout(
        cl.nodes,
        cl.devices_per_pod or recipe.hw.devices_per_node,
        tensor_parallel=par.tensor_parallel,
        pipeline_parallel=par.pipeline_parallel,
        micro_batch_size=tr.micro_batch_size,
        gradient_accumulation_steps=tr.gradient_accumulation_steps,
        global_batch_size=tr.global_batch_size,
        shape=shape_of(par),
    )

"""How a recipe uses its devices and how big a step is: the numbers every bundle file and every estimate share.

A leaf of the planning stage: the plan derives the bundle's layout here, and the planner's layout search (memory's
advise) derives each candidate's with the same function, so world size, data-parallel size, accumulation and global
batch are computed one way. Errors show their arithmetic (torchtitan's parallel_dims style).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from recipekit.base.errors import Problem
from recipekit.recipe.sections import Recipe
from recipekit.runtime.boundary import recipeview


@dataclass(frozen=True)
class Layout:
    """How the devices are used and how big a step is: the numbers every bundle file and every estimate share.

    The derived numbers are properties, so world size, data-parallel size and global batch cannot disagree with the
    numbers they come from. Megatron's order: TP innermost, then DP, PP outermost.
    """

    nodes: int
    devices_per_pod: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_pod

    @property
    def model_parallel(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def dp_size(self) -> int:
        return recipeview.data_parallel_size(self.world_size, self.model_parallel)

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
            "micro_batch_size": self.micro_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "global_batch_size": self.global_batch_size,
        }


#: The plan's numbers as recipe.yaml carries them, with their types (validate checks recipe.yaml against this).
LAYOUT_KEYS = tuple(Layout(1, 1).numbers())


def derive_layout(
    nodes: int,
    devices_per_pod: int,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    micro_batch_size: int = 1,
    gradient_accumulation_steps: int | None = None,
    global_batch_size: int | None = None,
) -> tuple[Layout, list[Problem]]:
    """The layout for these choices, with every problem of the arithmetic (each showing its numbers).

    Accumulation is given, or derived from the global batch (which must then divide evenly), or 1.
    """
    problems: list[Problem] = []
    base = Layout(nodes, devices_per_pod, tensor_parallel, pipeline_parallel, micro_batch_size)
    world, model_parallel = base.world_size, base.model_parallel
    if world % model_parallel:
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                f"world size {world} (nodes {nodes} × devices per pod {devices_per_pod}) is not divisible "
                f"by TP {tensor_parallel} × PP {pipeline_parallel} = {model_parallel}",
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
    )

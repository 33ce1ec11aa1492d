"""The same run on another number of nodes: the global batch kept, accumulation raised or lowered to hold it.

A node that will not come back leaves a run two choices: wait, or continue on the nodes that are left. Continuing
is the same run when every step still consumes the same samples in the same order, and it does when the global
batch is kept: the order is a keyed permutation of positions (runtime/boundary/order.py) and step *s* takes positions
[(s-1)·G, s·G) whatever the data-parallel size, so only which rank sees which sample of a step changes. The run
identity is keyed on the global batch, not on its factors (plan/identity.py TRAJECTORY_LAYOUT_KEYS), so the rescaled
bundle has the same run id, Job name and output directory, and its first start resumes the old checkpoints (re-sharding
ZeRO partitions first, runtime/volume/reshard.py).

This module says what to change (overrides) and why it cannot be done (problems with the arithmetic). It is pure:
``recipekit rescale`` reads the bundle and rebuilds, the dry run re-plans its work copy with :func:`rescaled`. An
elastic run (``cluster.min_nodes``, :func:`elastic_of`) is the same rule decided at build for every size the run may
continue on, so that nobody has to rebuild.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from recipekit.base.errors import Problem
from recipekit.plan.layout import Layout, derive_layout, recipe_layout
from recipekit.recipe.overrides import merge
from recipekit.recipe.sections import Recipe
from recipekit.recipe.sections.cluster import ClusterSpec
from recipekit.runtime.boundary.resume import resumechoice
from recipekit.runtime.volume.reshard import reshard_refusal

#: The most nodes a run may be rescaled to, and the most node counts searched for ones that keep the global batch:
#: ``cluster.nodes``' own bound in the recipe schema (a plan claiming 10¹² nodes must not start a 2×10¹² search).
MAX_NODES = int(next(f for f in fields(ClusterSpec) if f.name == "nodes").metadata["bounds"]["le"])


def rescale_overrides(overrides: Sequence[str], *, nodes: int, global_batch_size: int) -> list[str]:
    """``overrides`` with the node count replaced and the global batch pinned (accumulation unset, so derived)."""
    return merge(
        overrides,
        [
            f"cluster.nodes={nodes}",
            f"train.global_batch_size={global_batch_size}",
            "train.gradient_accumulation_steps=null",
        ],
    )


def rescaled(recipe: Recipe, nodes: int) -> tuple[Recipe, list[Problem]]:
    """``recipe`` on ``nodes`` nodes at its own global batch, with every reason that cannot be (empty: it can)."""
    layout, problems = recipe_layout(recipe)
    if problems:
        return recipe, problems
    target = replace(
        recipe,
        cluster=replace(recipe.cluster, nodes=nodes),
        train=replace(recipe.train, global_batch_size=layout.global_batch_size, gradient_accumulation_steps=None),
    )
    par = recipe.parallel
    states = States(par.zero_stage, par.offload_optimizer, par.offload_param)
    return target, rescale_problems(layout, nodes, streaming=recipe.data.streaming, states=states)


@dataclass(frozen=True)
class States:
    """How the run's optimizer states are laid out: what decides whether its checkpoints can be re-sharded."""

    zero_stage: int = 0
    offload_optimizer: str = "none"
    offload_param: str = "none"


def rescale_problems(layout: Layout, nodes: int, *, streaming: bool, states: States = States()) -> list[Problem]:
    """Why a run laid out as ``layout`` cannot continue on ``nodes`` nodes at the same global batch: the same
    refusals the runtime makes when it resumes (runtime/volume/reshard.py), said before anything is submitted."""
    problems: list[Problem] = []
    if not 1 <= nodes <= MAX_NODES:
        return [Problem("--nodes", f"{nodes}: from 1 to {MAX_NODES}")]
    if not 1 <= layout.nodes <= MAX_NODES:
        return [Problem("plan.nodes", f"{layout.nodes}: from 1 to {MAX_NODES}")]
    if layout.tensor_parallel > 1:
        problems.append(
            Problem(
                "parallel.tensor_parallel",
                resumechoice.TP_RESIZE_REFUSAL,
                hint="continue on the node count it was saved with",
            )
        )
    elif states.zero_stage:
        refusal = reshard_refusal(
            states.zero_stage,
            offload_optimizer=states.offload_optimizer,
            offload_param=states.offload_param,
            tensor_parallel=layout.tensor_parallel,
        )
        if refusal:
            problems.append(
                Problem(
                    "parallel.zero_stage",
                    f"ZeRO-{states.zero_stage} checkpoints are re-sharded for another world size through DeepSpeed's "
                    f"universal checkpoint, and {refusal}",
                    hint="continue on the node count it was saved with",
                )
            )
    if streaming:
        problems.append(
            Problem(
                "data.streaming",
                "a streamed run keeps its position in the stream per rank, so another world size cannot continue "
                "it exactly",
                hint="prepare the data ahead (data.streaming=false) for runs that may change size",
            )
        )
    _, arithmetic = layout_at(layout, nodes)
    if arithmetic:
        limit = min(max(2 * layout.nodes, nodes, 8), MAX_NODES)
        kept = ", ".join(str(n) for n in nodes_keeping_batch(layout, limit=limit))
        for problem in arithmetic:
            problems.append(
                Problem(
                    "--nodes",
                    f"{nodes} cannot keep global batch {layout.global_batch_size}: {problem.message}",
                    hint=f"node counts that keep it: {kept}" if kept else "no node count keeps it",
                )
            )
    return problems


def nodes_keeping_batch(layout: Layout, limit: int) -> list[int]:
    """Node counts up to ``limit`` (at most :data:`MAX_NODES`) at which ``layout``'s global batch divides into whole
    micro-batches per rank."""
    return [n for n in range(1, min(limit, MAX_NODES) + 1) if not layout_at(layout, n)[1]]


def layout_at(layout: Layout, nodes: int) -> tuple[Layout, list[Problem]]:
    """``layout`` on ``nodes`` nodes at its own global batch, with why the arithmetic does not hold there."""
    return derive_layout(
        nodes,
        layout.devices_per_pod,
        tensor_parallel=layout.tensor_parallel,
        pipeline_parallel=layout.pipeline_parallel,
        micro_batch_size=layout.micro_batch_size,
        global_batch_size=layout.global_batch_size,
    )


# -------------------------------------------------------------------------------------------------------- elastic
# An elastic run: the node counts its Job may continue on (``cluster.min_nodes`` to ``cluster.nodes``), each with
# the accumulation that keeps the global batch.
#
# A node lost for good leaves the run on fewer nodes; with ``cluster.min_nodes`` set nobody has to act. torchrun's own
# elastic agent (``--nnodes MIN:MAX`` over its c10d rendezvous) restarts the workers on the nodes that are left, and
# Volcano's job controller recreates the lost pod, which waits in Pending until capacity returns and then joins the
# rendezvous, and the agents restart the workers at full size (runtime/launch.py says how the pod starts torchrun,
# bundle/documents.py what the Job asks of Volcano). Each new world resumes the newest checkpoint at the same global
# batch: the rule ``recipekit rescale`` applies by hand (above), decided here for every size at once, so a
# size the run cannot continue on is refused at build, not discovered at three in the morning.
#
# The table is data in recipe.yaml (``plan.elastic``); train.py takes its accumulation from it for the world it finds
# (runtime/boundary/recipeview.py :func:`~recipekit.runtime.boundary.recipeview.elastic_accumulation`).

#: Where an elastic run's sizes come from.
ELASTIC_KEY = "cluster.min_nodes"


@dataclass(frozen=True)
class Elastic:
    """The sizes an elastic run continues on: ``min_nodes`` to ``max_nodes`` pods, and per world size the gradient
    accumulation that keeps the plan's global batch."""

    min_nodes: int
    max_nodes: int
    accumulation: dict[int, int]  # world size → gradient_accumulation_steps

    def summary(self) -> dict[str, Any]:
        """As recipe.yaml's ``plan.elastic`` carries it (and train.py reads it)."""
        return {
            "min_nodes": self.min_nodes,
            "max_nodes": self.max_nodes,
            "accumulation": [
                {"world_size": world, "gradient_accumulation_steps": steps}
                for world, steps in sorted(self.accumulation.items())
            ],
        }


def elastic_of(recipe: Recipe, layout: Layout, resize_refusal: str | None) -> tuple[Elastic | None, list[Problem]]:
    """The recipe's elastic sizes (None: ``cluster.min_nodes`` unset), with every reason a size cannot be continued
    on; ``resize_refusal``: the engine's reason it never continues a run at another world size."""
    low = recipe.cluster.min_nodes
    if low is None:
        return None, []
    if low > layout.nodes:
        more = f"{low} is more than cluster.nodes ({layout.nodes})"
        return None, [Problem(ELASTIC_KEY, more, hint=f"1 to {layout.nodes}")]
    if resize_refusal:
        return None, [Problem(ELASTIC_KEY, resize_refusal, hint="unset cluster.min_nodes")]
    par = recipe.parallel
    states = States(par.zero_stage, par.offload_optimizer, par.offload_param)
    problems: list[Problem] = []
    for nodes in range(low, layout.nodes):
        for problem in rescale_problems(layout, nodes, streaming=recipe.data.streaming, states=states):
            if problem.key == "--nodes":  # this size's arithmetic
                found = Problem(ELASTIC_KEY, f"on {nodes} node(s): {problem.message}", hint=problem.hint)
            else:  # the same at every size: said once
                found = Problem(ELASTIC_KEY, f"{problem.key}: {problem.message}", hint=problem.hint)
            if found not in problems:
                problems.append(found)
    if problems:
        return None, problems
    sizes = {nodes: layout_at(layout, nodes)[0] for nodes in range(low, layout.nodes + 1)}
    table = {size.world_size: size.gradient_accumulation_steps for size in sizes.values()}
    return Elastic(low, layout.nodes, table), []

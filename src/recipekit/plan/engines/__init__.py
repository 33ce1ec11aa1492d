"""The plan's side of the training-engine seam: which engine builds a recipe, and what each one cannot run.

recipekit compiles for training engines; it never trains by itself. Each engine is a room of its own: one module
here (the layouts, modes and optimizer sharding it runs, each refusal a :class:`~recipekit.base.errors.Problem`
with its reason), one in :mod:`recipekit.bundle.engines` (the documents it reads), and its files in the runtime
package (what runs in the pod). The stages ask their engine through these registries and never test an engine's
name themselves, so a new engine is a new room, not edits across the stages (as torchx's schedulers or NeMo-Run's
executors are one class each behind one interface).
"""

from __future__ import annotations

from typing import Protocol

from recipekit.base.errors import Problem
from recipekit.plan.engines.megatron import MegatronEngine
from recipekit.plan.engines.trainer import TrainerEngine
from recipekit.plan.layout import Layout
from recipekit.recipe.sections import Recipe


class PlanEngine(Protocol):
    """What the plan asks of a training engine."""

    kind: str
    #: The engine trains for a number of iterations fixed at build (Megatron's ``train_iters``), not for epochs.
    needs_step_count: bool
    #: Its bundles run Megatron-core's layers and sharding, which the estimate counts for them whatever the layout
    #: (fused norms and SwiGLU, a vocabulary-parallel embedding, its mixed precision).
    megatron_kernels: bool
    #: Why the engine never continues a run at another world size (an elastic run, ``recipekit rescale``); None:
    #: it resumes its checkpoints at any size the rescale rules allow (plan/rescale.py).
    resize_refusal: str | None

    def problems(self, recipe: Recipe, layout: Layout, *, analysis_only: bool, tp_across_pods: bool) -> list[Problem]:
        """Why this engine cannot build ``recipe`` laid out as ``layout``; empty when it can.

        ``analysis_only`` (``recipekit plan``) keeps only the refusals no analysis could be made of: a layout the
        engine does not run is still worth estimating. ``tp_across_pods`` lets a TP group span pods (the dry run,
        whose pods are processes of one machine)."""
        ...

    def uses_deepspeed(self, recipe: Recipe, layout: Layout) -> bool:
        """Whether the bundle trains under DeepSpeed (its memory regime, its launcher variables, its image pins)."""
        ...

    def runs(self, recipe: Recipe, layout: Layout) -> str:
        """How the bundle runs a model-parallel ``layout`` it can build, in one sentence (the estimate's note)."""
        ...


#: Every engine, by the name a recipe gives it.
ENGINES: dict[str, PlanEngine] = {engine.kind: engine for engine in (TrainerEngine(), MegatronEngine())}


def engine_of(recipe: Recipe) -> PlanEngine:
    """The engine that builds ``recipe``."""
    return ENGINES[recipe.engine.kind]


def engine_problems(recipe: Recipe, layout: Layout) -> list[Problem]:
    """What ``recipe``'s engine cannot build of ``layout`` (the check a bundle gets; ``plan`` analyses it anyway)."""
    return engine_of(recipe).problems(recipe, layout, analysis_only=False, tp_across_pods=False)


def buildable(recipe: Recipe, layout: Layout) -> bool:
    """Whether ``recipe``'s engine builds ``layout`` (what ``plan`` marks as analysis only if not)."""
    return not engine_problems(recipe, layout)

"""The bundle's side of the training-engine seam: each engine's documents and how it says what it runs, asked by the
engine the plan chose.

One class per engine (the plan's rules for the same engine are in :mod:`recipekit.plan.engines`). The Job,
launch.json and recipe.yaml's common sections are the same for every engine (:mod:`recipekit.bundle.documents`).
"""

from __future__ import annotations

from typing import Protocol

from recipekit.bundle.engines.documents import EngineDocuments
from recipekit.bundle.engines.megatron import MegatronBundle
from recipekit.bundle.engines.trainer import TrainerBundle
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import Recipe


class BundleEngine(Protocol):
    """What the bundle asks of a training engine."""

    kind: str

    def documents(self, recipe: Recipe, plan: Plan) -> EngineDocuments:
        """What the engine's entrypoint reads besides the documents every bundle shares."""
        ...

    def parallelism(self, recipe: Recipe, plan: Plan) -> str:
        """How the run is split, in one phrase (the build's line, the README, validate's verdict)."""
        ...


#: Every engine, by the name a recipe gives it (:data:`recipekit.plan.engines.ENGINES` has the same keys).
ENGINES: dict[str, BundleEngine] = {engine.kind: engine for engine in (TrainerBundle(), MegatronBundle())}


def bundle_engine(plan: Plan) -> BundleEngine:
    """The engine ``plan`` runs."""
    return ENGINES[plan.engine]


__all__ = ["BundleEngine", "EngineDocuments", "bundle_engine"]

"""The bundle's side of the training-engine seam: each engine's documents, asked by the engine the plan chose.

One module per engine (the plan's rules for the same engine are in :mod:`recipekit.plan.engines`); each has a
``documents(recipe, plan) -> EngineDocuments``. The Job, launch.json and recipe.yaml's common sections are the same
for every engine (:mod:`recipekit.bundle.documents`).
"""

from __future__ import annotations

from collections.abc import Callable

from recipekit.bundle.engines import trainer
from recipekit.bundle.engines.documents import EngineDocuments
from recipekit.plan.plan import Plan
from recipekit.recipe.sections import Recipe

#: Each engine's documents, by the engine's name (:data:`recipekit.plan.engines.ENGINES` has the same keys).
DOCUMENTS: dict[str, Callable[[Recipe, Plan], EngineDocuments]] = {"trainer": trainer.documents}


def engine_documents(recipe: Recipe, plan: Plan) -> EngineDocuments:
    """The documents of the engine ``plan`` runs."""
    return DOCUMENTS[plan.engine](recipe, plan)


__all__ = ["EngineDocuments", "engine_documents"]

"""One difference between a bundle and its dry run's work copy, and the collector of the recipe's substitutions.

A leaf of the work directory: the substitutions (:mod:`.substitutions`), the work copy and each engine's explicit
edits (:mod:`.engines`) record their changes in these, so none of them imports another for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from recipekit.bundle.files import RECIPE
from recipekit.recipe.schema import to_data
from recipekit.recipe.sections import Recipe


@dataclass
class Substitution:
    """One difference between the bundle and its work copy: a recipe substitution (with its reason) or a file
    value that follows from them."""

    file: str
    field: str
    old: Any
    new: Any
    why: str
    derived: bool = False  # a consequence of the substitutions, found by comparing the two bundles

    def __str__(self) -> str:
        return f"{self.file} {self.field}: {_short(self.old)} → {_short(self.new)} ({self.why})"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "field": self.field,
            "old": self.old,
            "new": self.new,
            "why": self.why,
            "derived": self.derived,
        }


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Substituter:
    """Collects recipe substitutions, each with its reason, as dotted recipe keys."""

    def __init__(self) -> None:
        self.found: list[Substitution] = []

    def section(self, recipe: Recipe, name: str, why: str, **changes: Any) -> Recipe:
        """``recipe`` with ``changes`` applied to section ``name``, each change that changes something recorded."""
        old = getattr(recipe, name)
        real = {k: v for k, v in changes.items() if getattr(old, k) != v}
        for key, value in real.items():
            self.found.append(
                Substitution(RECIPE, f"recipe.{name}.{key}", _plain(getattr(old, key)), _plain(value), why)
            )
        return replace(recipe, **{name: replace(old, **real)}) if real else recipe

    def whole(self, recipe: Recipe, name: str, new: Any, why: str) -> Recipe:
        old = getattr(recipe, name)
        if old == new:
            return recipe
        self.found.append(Substitution(RECIPE, f"recipe.{name}", old.name, new.name, why))
        return replace(recipe, **{name: new})


def _plain(value: Any) -> Any:
    return to_data(value) if hasattr(value, "__dataclass_fields__") else value

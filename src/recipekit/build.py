"""The build pipeline, end to end: overrides → compose → Recipe → Plan → files → bundle on disk.

Each step lives in its own module; this one only strings them together, so the CLI and the tests drive exactly
the same path. Nothing here imports torch, transformers or deepspeed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from recipekit.bundle import write_bundle
from recipekit.compose import Composed, compose
from recipekit.images import ImageMatrix, load_images
from recipekit.plan import Plan, make_plan
from recipekit.recipe import Recipe, parse_recipe
from recipekit.render import render

#: Where bundles go when no -o is given: ./bundles/<recipe name>.
DEFAULT_OUTPUT_ROOT = Path("bundles")


@dataclass(frozen=True)
class Resolved:
    """A recipe taken as far as the plan: what ``show`` prints and ``build`` renders."""

    composed: Composed
    recipe: Recipe
    plan: Plan
    images: ImageMatrix


def resolve(overrides: Sequence[str], extra_dirs: Sequence[Path] = (), *, analysis_only: bool = False) -> Resolved:
    """Compose, validate and plan; raises RecipeError with every problem of the first stage that has any."""
    composed = compose(overrides, extra_dirs)
    recipe = parse_recipe(composed.raw)
    images = load_images()
    return Resolved(composed, recipe, make_plan(recipe, images, analysis_only=analysis_only), images)


@dataclass(frozen=True)
class Built:
    resolved: Resolved
    path: Path
    files: dict[str, bytes]


def build(overrides: Sequence[str], output: Path | None = None, *, extra_dirs: Sequence[Path] = (),
          force: bool = False) -> Built:
    """Build the bundle for ``overrides`` into ``output`` (default ./bundles/<name>), atomically."""
    resolved = resolve(overrides, extra_dirs)
    files = render(resolved.recipe, resolved.plan, resolved.composed)
    target = output if output is not None else DEFAULT_OUTPUT_ROOT / resolved.recipe.name
    return Built(resolved, write_bundle(files, target, force=force), files)

"""recipe.yaml as the Megatron room reads it: the runtime's ``recipe``, ``plan`` and ``operations`` sections (the same
typed views the Trainer's entry reads, boundary/recipeview.py) and the engine's ``megatron`` document
(boundary/megatronview.py). A Trainer bundle's ``training_arguments`` are neither needed nor read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..boundary.common import RunError
from ..boundary.megatronview import MegatronDoc, MegatronDocError, read_megatron
from ..boundary.recipeview import MissingKey, OperationsView, RecipeView, RunPlan, read_section

#: The sections this room reads; the build side writes each into a Megatron bundle's recipe.yaml.
SECTIONS = ("recipe", "plan", "operations", "megatron")


@dataclass(frozen=True)
class EngineRun:
    """A Megatron bundle's recipe.yaml, typed."""

    recipe: RecipeView
    plan: RunPlan
    operations: OperationsView
    megatron: MegatronDoc
    bundle_dir: Path

    @property
    def output_dir(self) -> Path:
        return Path(self.megatron.output_dir)

    @property
    def seed(self) -> int:
        return int(self.megatron.get("rng", "seed"))


def load_engine_run(path: Path) -> EngineRun:
    """Read the bundle's recipe.yaml; anything missing or misshapen is one RunError listing every problem."""
    try:
        raw: Any = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunError(f"cannot read recipe {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RunError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    except (ValueError, RecursionError) as exc:
        raise RunError(f"{path} is not a recipe ({exc.__class__.__name__})") from None
    raw = raw if isinstance(raw, dict) else {}
    missing = [key for key in SECTIONS if not isinstance(raw.get(key), dict)]
    if missing:
        raise RunError(f"{path} lacks section(s) {', '.join(missing)}: not a bundle of the Megatron engine")
    try:
        recipe = read_section(RecipeView, raw["recipe"], "recipe")
        plan = read_section(RunPlan, raw["plan"], "plan")
        operations = read_section(OperationsView, raw["operations"], "operations")
    except MissingKey as exc:
        raise RunError(f"{path}: {exc}: rebuild the bundle with this recipekit's `recipekit build`") from None
    try:
        megatron = read_megatron(raw["megatron"])
    except MegatronDocError as exc:
        raise RunError(f"{path}: " + "; ".join(exc.problems)) from None
    return EngineRun(recipe, plan, operations, megatron, Path(path).resolve().parent)

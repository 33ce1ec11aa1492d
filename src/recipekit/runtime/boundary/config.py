"""recipe.yaml: the resolved recipe, the plan's numbers and the Trainer arguments the bundle was built with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .common import RunError
from .recipeview import MissingKey, OperationsView, RecipeView, RunPlan, read_section

#: The sections the runtime reads; recipekit writes every one of them into every bundle's recipe.yaml.
SECTIONS = ("recipe", "plan", "training_arguments", "operations")


@dataclass(frozen=True, slots=True)
class RunConfig:
    """recipe.yaml, split into the typed parts the runtime uses (training_arguments go to the Trainer as they are)."""

    recipe: RecipeView
    plan: RunPlan
    training_arguments: dict[str, Any]
    bundle_dir: Path
    operations: OperationsView

    @property
    def uses_deepspeed(self) -> bool:
        """Whether this run trains under DeepSpeed: the bundle's Trainer arguments name its ds_config (recipekit's
        Plan.uses_deepspeed decided it: ZeRO, or AutoTP at any stage). The one answer on the runtime's side."""
        return bool(self.training_arguments.get("deepspeed"))

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage this run partitions at: the plan's under DeepSpeed, 0 without it."""
        return self.plan.zero_stage if self.uses_deepspeed else 0


def load_run_config(path: Path) -> RunConfig:
    """Read the bundle's recipe.yaml; a missing or foreign file, or a key the runtime needs and it lacks, is a
    one-line RunError."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunError(f"cannot read recipe {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RunError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    except ValueError as exc:  # UnicodeDecodeError
        raise RunError(f"{path} is not UTF-8 text ({exc.__class__.__name__})") from None
    except RecursionError:
        raise RunError(f"{path} is nested too deeply to be a recipe") from None
    raw = raw if isinstance(raw, dict) else {}
    missing = [key for key in SECTIONS if not isinstance(raw.get(key), dict)]
    if missing:
        raise RunError(f"{path} lacks section(s) {', '.join(missing)}: rebuild the bundle with `recipekit build`")
    try:
        return RunConfig(
            read_section(RecipeView, raw["recipe"], "recipe"),
            read_section(RunPlan, raw["plan"], "plan"),
            dict(raw["training_arguments"]),
            path.resolve().parent,
            read_section(OperationsView, raw["operations"], "operations"),
        )
    except MissingKey as exc:
        raise RunError(f"{path}: {exc}: rebuild the bundle with this recipekit's `recipekit build`") from None

"""The whole typed Recipe, one field per section, and its parsing: every problem of a document at once."""

from __future__ import annotations

from typing import Any

from recipekit.recipe.schema import Section, spec, validate
from recipekit.recipe.sections.cluster import ClusterSpec
from recipekit.recipe.sections.data import DataSpec
from recipekit.recipe.sections.engine import EngineSpec, TrainerEngine
from recipekit.recipe.sections.evaluation import EvalSpec
from recipekit.recipe.sections.hardware import HardwareSpec
from recipekit.recipe.sections.mode import ModeSpec
from recipekit.recipe.sections.model import ModelSpec
from recipekit.recipe.sections.ops import OpsSpec
from recipekit.recipe.sections.parallel import ParallelSpec
from recipekit.recipe.sections.train import TrainSpec


# -------------------------------------------------------------------------------------------------------- recipe
class Recipe(Section):
    """A complete, resolved recipe: one option of each group plus the training settings."""

    name: str = spec(
        pattern=r"[a-z]([a-z0-9._-]*[a-z0-9])?",
        max_length=200,
        description="Bundle name: lower case, starting with a letter (the Job's Service name, made from it, must be "
        "a DNS-1035 label).",
    )
    description: str = spec("", description="One line about this recipe.")
    model: ModelSpec = spec(description="The network (group `model`).")
    mode: ModeSpec = spec(description="What is trained and how (group `mode`), chosen by its `kind`.")
    hw: HardwareSpec = spec(description="The accelerator and its node (group `hw`).")
    parallel: ParallelSpec = spec(description="Data-parallel layout (group `parallel`).")
    engine: EngineSpec = spec(
        default_factory=lambda: TrainerEngine(kind="trainer"),
        description="The training engine the bundle starts (group `engine`), chosen by its `kind`.",
    )
    data: DataSpec = spec(description="Training data (group `data`).")
    cluster: ClusterSpec = spec(description="Where the Volcano Job runs (group `cluster`).")
    train: TrainSpec = spec(default_factory=TrainSpec, description="Optimisation and bookkeeping.")
    ops: OpsSpec = spec(
        default_factory=OpsSpec, description="Preflight, hang watchdog, metrics and alerts (the operations layer)."
    )
    eval: EvalSpec = spec(
        default_factory=EvalSpec,
        omit_default=True,
        description="A benchmark run on the trained model after training (lm-evaluation-harness); off by default.",
    )


def parse_recipe(raw: dict[str, Any]) -> Recipe:
    """Validate a plain dict into a Recipe; :class:`RecipeError` lists *every* problem found."""
    return validate(Recipe, raw)

"""The parallel group's options (and the engines'), read from the recipe trees: what ``plan --advise`` and a refused
build's fix try.

The layouts recipekit may suggest are data (``recipes/parallel/*.yaml`` and the same folder of each team tree passed
with ``--recipes``), never a list in code. They are read here, by the callers that orchestrate (the CLI and
:mod:`recipekit.bundle.build`), and handed to :mod:`recipekit.memory`, whose estimators stay pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import RecipeError
from recipekit.recipe.compose import group_options
from recipekit.recipe.schema import validate
from recipekit.recipe.sections import MegatronEngine, ParallelSpec, TrainerEngine


def load_parallel_options(extra_dirs: Sequence[Path] = ()) -> dict[str, ParallelSpec]:
    """The parallel group's options, typed, from the recipe trees on disk (skipping any that do not validate)."""
    options: dict[str, ParallelSpec] = {}
    for name, path in group_options("parallel", extra_dirs).items():
        try:
            options[name] = validate(ParallelSpec, yamlfile.read(path))
        except (yaml.YAMLError, RecipeError):
            continue
    return options


@cache
def builtin_engine(kind: str) -> TrainerEngine | MegatronEngine:
    """The built-in ``engine`` option of ``kind`` (``recipes/engine/<kind>.yaml``), typed: what an advice that moves
    a recipe to another engine composes to, so that pasting ``engine=<kind>`` gives the very recipe it planned."""
    record: type[TrainerEngine | MegatronEngine] = {"trainer": TrainerEngine, "megatron": MegatronEngine}[kind]
    return validate(record, yamlfile.read(group_options("engine")[kind]), root="engine")

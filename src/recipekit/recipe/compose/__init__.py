"""The only package that imports Hydra: command-line overrides → a plain recipe dict and its group choices.

Its rooms: ``options`` (the recipe trees and their options on disk), ``untrusted`` (what is refused before Hydra
sees it), ``composition`` (Hydra's compose API, and the files a composition read) and ``sweep`` (matrix builds).
The names the other stages use are imported here, so callers say ``from recipekit.recipe.compose import compose``.
"""

from recipekit.recipe.compose.composition import (
    HYDRA_VERSION_BASE,
    Composed,
    ConfigFile,
    PartialComposition,
    compose,
    default_name,
    loaded_configs,
    preload,
)
from recipekit.recipe.compose.options import OPTION_NAME, describe_option, group_options, option_files, recipe_dirs
from recipekit.recipe.compose.sweep import Sweep, compose_variants, expand_sweep
from recipekit.recipe.compose.untrusted import (
    MAX_INTERPOLATIONS,
    MAX_OVERRIDE_DEPTH,
    MAX_OVERRIDE_DIGITS,
    MAX_REFERENCE_DEPTH,
    MAX_RESOLVED_BYTES,
    check_overrides,
    check_team_trees,
    refuse_hostile,
    resolution_problem,
)

__all__ = [
    "HYDRA_VERSION_BASE",
    "MAX_INTERPOLATIONS",
    "MAX_OVERRIDE_DEPTH",
    "MAX_OVERRIDE_DIGITS",
    "MAX_REFERENCE_DEPTH",
    "MAX_RESOLVED_BYTES",
    "OPTION_NAME",
    "Composed",
    "ConfigFile",
    "PartialComposition",
    "Sweep",
    "check_overrides",
    "check_team_trees",
    "compose",
    "compose_variants",
    "default_name",
    "describe_option",
    "expand_sweep",
    "group_options",
    "loaded_configs",
    "option_files",
    "preload",
    "recipe_dirs",
    "refuse_hostile",
    "resolution_problem",
]

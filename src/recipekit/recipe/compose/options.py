"""The recipe trees and their options, discovered from disk: recipekit's own tree first, then the team layers, a
later layer's option shadowing an earlier one's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from recipekit.base import yamlfile
from recipekit.base.paths import RECIPES_DIR


def recipe_dirs(extra: Sequence[Path] = ()) -> list[Path]:
    """The recipe trees (layers) searched, recipekit's own first; ``extra`` are team trees, later ones winning."""
    return [RECIPES_DIR, *(Path(p).resolve() for p in extra)]


def option_files(group: str, extra: Sequence[Path] = ()) -> dict[str, list[Path]]:
    """Each option of ``group`` → its files in every layer that has one, the winning (last) layer's last."""
    found: dict[str, list[Path]] = {}
    for root in recipe_dirs(extra):
        for path in sorted((root / group).glob("*.yaml")):
            found.setdefault(path.stem, []).append(path)
    return dict(sorted(found.items()))


def group_options(group: str, extra: Sequence[Path] = ()) -> dict[str, Path]:
    """Every option of ``group``, discovered from the recipe trees on disk (never from a list in code).

    A team layer's option shadows a same-named one of an earlier layer, as Hydra resolves it (see hydra_session).
    """
    return {option: paths[-1] for option, paths in option_files(group, extra).items()}


def describe_option(path: Path) -> str:
    """The option's one-line ``description`` key (empty when it has none or it is not one line of text)."""
    try:
        data = yamlfile.read(path) or {}
    except (OSError, yaml.YAMLError):
        return "(unreadable YAML)"
    description = data.get("description", "") if isinstance(data, dict) else ""
    return description if isinstance(description, str) and description.isprintable() else ""


#: What an option's file name may be: a name, never a path (``...yaml`` would be the option ``..``).
OPTION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+@-]*$(?<!\.)")

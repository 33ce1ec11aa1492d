"""Where recipekit's own data lives: the recipe tree, the templates and the image matrix.

In a wheel they are packaged under ``recipekit/_data``; in a source checkout (editable install, tests) they are the
top-level folders of the repository. Either way the rest of the code asks here and never guesses.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
_DATA = _PACKAGE / "_data"
_ROOT = _DATA if (_DATA / "recipes").is_dir() else _PACKAGE.parents[1]

RECIPES_DIR = _ROOT / "recipes"
TEMPLATES_DIR = _ROOT / "templates"
IMAGES_DIR = _ROOT / "images"
RUNTIME_DIR = _PACKAGE / "runtime"


def cache_dir(*parts: str) -> Path:
    """recipekit's per-user cache (``$XDG_CACHE_HOME/recipekit``, else ``~/.cache/recipekit``), read at call time
    so a changed environment (tests, CI) is honoured."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root, "recipekit", *parts)


#: The config groups of a recipe, in the order they are listed and composed.
GROUPS = ("model", "mode", "hw", "parallel", "engine", "data", "cluster", "recipe")

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


#: How many entries of a directory a did-you-mean looks at (a bundles/ folder holds a few dozen).
_NEAR_MISS_SCAN = 2000


def near_misses(path: Path, limit: int = 3) -> list[str]:
    """Paths beside ``path`` (which does not exist) whose names are close to its name: ``bundles/phi4_lora`` for
    ``bundles/phi4-lora``. Names compare with ``-`` and ``_`` alike and case ignored; at most ``limit``, closest
    first; none when the parent cannot be read. For "did you mean" on a path the user typed."""
    import difflib

    parent = path.parent
    try:
        with os.scandir(parent) as entries:
            names = [entry.name for _, entry in zip(range(_NEAR_MISS_SCAN), entries) if not entry.name.startswith(".")]
    except OSError:
        return []

    def plain(name: str) -> str:
        return name.lower().replace("-", "_")

    wanted = plain(path.name)
    same = [name for name in names if plain(name) == wanted]
    close = difflib.get_close_matches(wanted, [plain(n) for n in names], n=limit, cutoff=0.75)
    found = same + [name for key in close for name in names if plain(name) == key and name not in same]
    return [str(parent / name) if str(parent) != "." else name for name in dict.fromkeys(found)][:limit]


def did_you_mean(path: Path) -> str:
    """`` (did you mean X?)`` for a path that does not exist and has near misses beside it, else ''."""
    found = near_misses(path)
    return f" (did you mean {' or '.join(found)}?)" if found else ""

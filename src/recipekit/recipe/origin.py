"""Where a bundle's team recipes came from: each layer's path, its repo's name, git commit and dirty flag.

Recorded in the manifest so a bundle handed to another team says which checkout it was built from. Git is asked
with plain ``git status`` (no index refresh written: ``GIT_OPTIONAL_LOCKS=0``); a layer outside a git checkout,
or a machine without git, records null for both. Only the layer's own directory decides "dirty": an edited CI
script elsewhere in the repo does not change what the recipes compose to.

Determinism: the origin is an input of the bundle like the recipe files are. The same checkout at the same commit
and state gives the same bytes; a clone at another path differs only in manifest.json's ``origin``. ``verify``
rebuilds with the origin recorded in the package instead of detecting its own, so it passes anywhere.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recipekit.errors import RecipeError
from recipekit.recipe.team import find_config, read_config


def layer_origin(directory: Path) -> dict[str, Any]:
    """``{"path", "repo", "repo_path", "git_commit", "git_dirty"}`` for one team layer: the layer's directory, the
    name and root of the team repo (the recipekit.toml at or above it; null for a bare ``--recipes`` tree), and the
    state of the git checkout it is in (null outside one)."""
    directory = Path(directory).resolve()
    repo = repo_path = None
    config = find_config(directory)
    if config is not None:
        try:
            repo, repo_path = read_config(config).name, str(config.parent.resolve())
        except RecipeError:
            repo = repo_path = None
    commit, dirty = _git_state(directory)
    return {"path": str(directory), "repo": repo, "repo_path": repo_path, "git_commit": commit, "git_dirty": dirty}


def origin(extra_dirs: Sequence[Path]) -> tuple[dict[str, Any], ...]:
    """The origin of every team layer, in search order (empty when only built-in recipes are used)."""
    return tuple(layer_origin(Path(d)) for d in extra_dirs)


def _git_state(directory: Path) -> tuple[str | None, bool | None]:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        proc = subprocess.run(
            [
                "git",
                "-C",
                str(directory),
                "status",
                "--porcelain=v2",
                "--branch",
                "--untracked-files=normal",
                "--",
                ".",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    if proc.returncode != 0:
        return None, None
    commit = None
    dirty = False
    for line in proc.stdout.splitlines():
        if line.startswith("# branch.oid "):
            oid = line.split()[-1]
            commit = None if oid == "(initial)" else oid
        elif line and not line.startswith("#"):
            dirty = True
    return commit, dirty

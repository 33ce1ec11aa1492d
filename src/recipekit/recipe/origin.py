"""Where a bundle's team recipes came from: each layer's path, its repo's name, git commit and dirty flag.

Recorded in the manifest so a bundle handed to another team says which checkout it was built from. The commit is
read from ``.git`` directly (HEAD, then the loose or packed ref). The dirty flag needs ``git status``, which would
run what the layer's repo configures (``core.fsmonitor``, hooks): it is asked only in a repository the current
user owns (as git's safe.directory), with ``core.fsmonitor`` and hooks switched off, no system or global config and
no index refresh written (``--no-optional-locks``); elsewhere it is null. A layer outside a git checkout, or a
machine without git, records null for both. Only the layer's own directory decides "dirty": an edited CI
script elsewhere in the repo does not change what the recipes compose to.

Determinism: the origin is an input of the bundle like the recipe files are. The same checkout at the same commit
and state gives the same bytes; a clone at another path differs only in manifest.json's ``origin``. ``verify``
rebuilds with the origin recorded in the package instead of detecting its own, so it passes anywhere.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recipekit.base.errors import RecipeError
from recipekit.recipe.team import find_config, read_config


def layer_origin(directory: Path) -> dict[str, Any]:
    """``{"path", "repo", "repo_path", "git_commit", "git_dirty"}`` for one team layer: the layer's directory, the
    name and root of the team repo (the recipekit.toml at or above it; null for a bare ``--recipes`` tree), and the
    state of the git checkout it is in (null outside one)."""
    directory = Path(directory).resolve()
    repo = repo_path = None
    try:
        config = find_config(directory)
        if config is not None:
            repo, repo_path = read_config(config).name, str(config.parent.resolve())
    except RecipeError:
        repo = repo_path = None
    commit, dirty = _git_state(directory)
    return {"path": str(directory), "repo": repo, "repo_path": repo_path, "git_commit": commit, "git_dirty": dirty}


def origin(extra_dirs: Sequence[Path]) -> tuple[dict[str, Any], ...]:
    """The origin of every team layer, in search order (empty when only built-in recipes are used)."""
    return tuple(layer_origin(Path(d)) for d in extra_dirs)


def _git_dir(directory: Path) -> Path | None:
    """The ``.git`` directory of the checkout ``directory`` is in (a ``.git`` file's ``gitdir:`` followed)."""
    for parent in (directory, *directory.parents):
        dot = parent / ".git"
        if dot.is_dir():
            return dot
        if dot.is_file():
            try:
                text = dot.read_text(encoding="utf-8", errors="replace")[:4096].strip()
            except OSError:
                return None
            if text.startswith("gitdir:"):
                found = (parent / text[len("gitdir:") :].strip()).resolve()
                return found if found.is_dir() else None
            return None
    return None


def _head_commit(git_dir: Path) -> str | None:
    """HEAD's commit, read from the files (a detached HEAD, a loose ref, or packed-refs); None when unborn."""
    try:
        head = (git_dir / "HEAD").read_text(encoding="ascii", errors="replace")[:1024].strip()
        if not head.startswith("ref: "):
            return head if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head) else None
        ref = head[len("ref: ") :]
        if ".." in ref or not ref.startswith("refs/"):
            return None
        common = git_dir
        commondir = git_dir / "commondir"  # a worktree keeps its branches in the main repository
        if commondir.is_file():
            common = (git_dir / commondir.read_text(encoding="utf-8").strip()).resolve()
        for base in (git_dir, common):
            loose = base / ref
            if loose.is_file():
                value = loose.read_text(encoding="ascii", errors="replace")[:256].strip()
                return value if re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", value) else None
        packed = common / "packed-refs"
        if packed.is_file() and packed.stat().st_size < 64 << 20:
            for line in packed.read_text(encoding="ascii", errors="replace").splitlines():
                parts = line.split(" ")
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    except OSError:
        return None
    return None


#: git with everything a repository's own config could make it run switched off.
_SAFE_GIT = [
    "git",
    "--no-optional-locks",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.untrackedCache=false",
    "-c",
    "status.submoduleSummary=false",
]


def _git_state(directory: Path) -> tuple[str | None, bool | None]:
    git_dir = _git_dir(directory)
    if git_dir is None:
        return None, None
    commit = _head_commit(git_dir)
    if hasattr(os, "geteuid") and git_dir.stat().st_uid != os.geteuid():
        return commit, None  # another user's repository: its config is not run, so its state is unknown
    env = {
        **os.environ,
        "GIT_OPTIONAL_LOCKS": "0",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    try:
        proc = subprocess.run(
            [
                *_SAFE_GIT,
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
        return commit, None
    dirty = False
    for line in proc.stdout.splitlines():
        if line and not line.startswith("#"):
            dirty = True
    return commit, dirty

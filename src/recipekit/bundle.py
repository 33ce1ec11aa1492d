"""Bundle on disk: written whole or not at all.

Files are written into a temporary directory beside the target and renamed into place, so a failed or interrupted
build never leaves a half-written bundle, and an existing directory is replaced only when it is a recipekit bundle
(it has our manifest) or the user passed ``--force``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from recipekit.bundlefiles import EXECUTABLE, MANIFEST
from recipekit.errors import Problem, RecipeError


def is_bundle(directory: Path) -> bool:
    """A directory recipekit wrote: its manifest names a recipekit version."""
    try:
        return "recipekit_version" in json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def write_bundle(files: dict[str, bytes], target: Path, *, force: bool = False) -> Path:
    """Write ``files`` to ``target`` atomically; refuse to replace a directory that is not a bundle."""
    target = target.resolve()
    if target.exists():
        if not target.is_dir():
            raise RecipeError([Problem(str(target), "exists and is not a directory")])
        if any(target.iterdir()) and not is_bundle(target) and not force:
            raise RecipeError(
                [
                    Problem(
                        str(target),
                        "exists and is not a recipekit bundle",
                        hint="choose another -o directory, or pass --force to replace it",
                    )
                ]
            )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, data in files.items():
            path = staging / name
            if path.parent != staging:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.parent.chmod(0o755)
            path.write_bytes(data)
            path.chmod(0o755 if name in EXECUTABLE else 0o644)
        staging.chmod(0o755)
        if target.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, retired / "bundle")
            os.replace(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target

"""``recipekit init NAME``: scaffold a team recipe repo that builds and passes its own CI from the first minute.

The files are data, under ``templates/init/`` (shipped in the wheel with the bundle templates): recipekit.toml,
one example per group a team changes first (a model on its storage, its cluster option, a preset), a README, a
.gitignore and ci.sh. Three placeholders are filled in — ``{{name}}``, ``{{slug}}`` (the name as a Kubernetes
label, for namespace/queue/registry/PVC) and ``{{version_range}}`` (this recipekit's minor series) — by plain
replacement: the files contain shell and YAML whose own ``${...}`` must stay as written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from recipekit.base.errors import Problem, RecipeError
from recipekit.base.paths import TEMPLATES_DIR
from recipekit.recipe.team import CONFIG_FILE, REPO_NAME, version_range

SCAFFOLD_DIR = TEMPLATES_DIR / "init"
#: Template file → file in the new repo, where they differ (a dotfile would be dropped by some packagers).
_RENAMED = {"gitignore": ".gitignore"}
_EXECUTABLE = frozenset({"ci.sh"})


def scaffold_files(name: str) -> dict[str, bytes]:
    """The new repo's files (relative path → bytes), in memory."""
    from recipekit.recipe.k8snames import k8s_name

    values = {"{{name}}": name, "{{slug}}": k8s_name(name), "{{version_range}}": version_range()}
    files: dict[str, bytes] = {}
    for path in sorted(SCAFFOLD_DIR.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(SCAFFOLD_DIR).as_posix()
        text = path.read_text(encoding="utf-8")
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        if "{{" in text:
            raise RecipeError([Problem(f"templates/init/{relative}", "unfilled placeholder")])
        files[_RENAMED.get(relative, relative)] = text.encode()
    return files


def init(target: Path) -> Path:
    """Create the repo at ``target`` (named after its last component), atomically; refuse a non-empty directory."""
    target = Path(target)
    name = target.resolve().name
    if not REPO_NAME.match(name):
        raise RecipeError(
            [
                Problem(
                    "NAME",
                    f"{name!r} is not a repo name",
                    hint="letters, digits, '.', '_' or '-', e.g. team-nlp-recipes",
                )
            ]
        )
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RecipeError([Problem(str(target), "already exists and is not empty", hint="choose a new directory")])
    files = scaffold_files(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=target.parent))
    try:
        for relative, data in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(0o755 if relative in _EXECUTABLE else 0o644)
        staging.chmod(0o755)
        if target.exists():
            target.rmdir()
        os.replace(staging, target)
    finally:
        if staging.exists():
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return target / CONFIG_FILE

"""``recipekit init NAME``: scaffold a team recipe repo that builds and passes its own CI from the first minute; and
``recipekit cp GROUP/OPTION [NAME]``: copy a built-in option or preset into it to edit (:func:`copy_option`).

The files are data, under ``templates/init/`` (shipped in the wheel with the bundle templates): recipekit.toml,
one example per group a team changes first (a model on its storage, its cluster option, a preset), a README, a
.gitignore and ci.sh. Three placeholders are filled in — ``{{name}}``, ``{{slug}}`` (the name as a Kubernetes
label, for namespace/queue/registry/PVC) and ``{{version_range}}`` (this recipekit's minor series) — by plain
replacement: the files contain shell and YAML whose own ``${...}`` must stay as written.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from recipekit import __version__
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.paths import GROUPS, RECIPES_DIR, TEMPLATES_DIR
from recipekit.recipe.team import CONFIG_FILE, REPO_NAME, find_config, read_config, version_range

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


# ----------------------------------------------------------------------------------------------- recipekit cp
#: An option's name: what a file name in a group may be (compose.options.OPTION_NAME, without dots at the ends).
_OPTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@-]*(?<!\.)")
#: The option's own ``name:`` line (top level, unquoted or quoted), rewritten when the copy is renamed.
_NAME_LINE = re.compile(r"^name:[ \t]*\S.*$", re.MULTILINE)
#: Hydra reads a package directive only from the file's first comment lines: it stays first in a copy.
_PACKAGE = "# @package"


@dataclass(frozen=True)
class CopiedOption:
    """Where ``recipekit cp`` wrote the copy, from what, and whether it takes the built-in option's place."""

    source: Path
    target: Path
    shadows: bool


def copy_option(spec: str, name: str | None = None, to: Path | None = None, *, force: bool = False) -> CopiedOption:
    """Copy built-in ``GROUP/OPTION`` into the team repo as ``GROUP/NAME.yaml`` (NAME: the option's own by default,
    which then shadows the built-in one), its origin noted in a comment at the top.

    ``to``: the recipe tree to copy into; default the first ``search_path`` entry of the ``recipekit.toml`` found in
    the current directory or a parent. The copy is the built-in file's text with comments kept; only its ``name:``
    line follows a new NAME. An existing file is kept unless ``force``; a link is never written through.
    """
    group, _, option = spec.partition("/")
    problems = []
    if group not in GROUPS:
        problems.append(
            Problem("GROUP/OPTION", f"{spec!r}: unknown group {group!r}", hint="groups: " + ", ".join(GROUPS))
        )
    elif not _OPTION.fullmatch(option) or not (RECIPES_DIR / group / f"{option}.yaml").is_file():
        options = sorted(p.stem for p in (RECIPES_DIR / group).glob("*.yaml"))
        close = difflib.get_close_matches(option, options, n=1)
        hint = (
            f"did you mean {group}/{close[0]}? " if close else ""
        ) + f"built-in {group} options: recipekit list {group}"
        problems.append(Problem("GROUP/OPTION", f"{spec!r}: no built-in {group} option {option!r}", hint=hint))
    if name is not None and not _OPTION.fullmatch(name):
        problems.append(
            Problem("NAME", f"{name!r} is not an option name", hint="letters, digits, '_', '.', '-', '+', '@'")
        )
    if problems:
        raise RecipeError(problems)
    source = RECIPES_DIR / group / f"{option}.yaml"
    target = _team_tree(to) / group / f"{name or option}.yaml"
    if os.path.islink(target) or (target.exists() and not force):
        what = "is a link" if os.path.islink(target) else "exists"
        raise RecipeError([Problem(str(target), f"{what}: not overwritten", hint="--force replaces a file")])
    _write(target, _copy_text(source, group, option, name))
    return CopiedOption(source, target, shadows=(name or option) == option)


def _team_tree(to: Path | None) -> Path:
    if to is not None:
        return Path(to)
    config = find_config(Path.cwd())
    if config is None:
        raise RecipeError(
            [
                Problem(
                    "recipekit cp",
                    f"no {CONFIG_FILE} in this directory or a parent: not inside a team recipe repo",
                    hint="run it in one (recipekit init NAME makes one), or give --to RECIPES_DIR",
                )
            ]
        )
    return read_config(config).search_path[0]


def _copy_text(source: Path, group: str, option: str, name: str | None) -> str:
    """The built-in file's text behind a comment naming where it came from, renamed when ``name`` differs."""
    data = source.read_bytes()
    text = data.decode("utf-8")
    package = ""
    if text.startswith(_PACKAGE):
        package, _, text = text.partition("\n")
        package += "\n"
    if name and name != option:
        text = _NAME_LINE.sub(f"name: {name}", text, count=1)
    how = f"recipekit cp {group}/{option}" + (f" {name}" if name and name != option else "")
    origin = (
        f"# Copied from recipekit {__version__}'s built-in {group}/{option}.yaml "
        f"(sha256 {hashlib.sha256(data).hexdigest()[:16]}) by `{how}`.\n"
        f"# Edit freely: this copy is what builds; `recipekit list {group}` shows where each option comes from.\n"
    )
    return package + origin + text


def _write(target: Path, text: str) -> None:
    """``text`` into ``target`` atomically (a temporary file beside it, then a rename that replaces no link)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(staging, 0o644)
        os.replace(staging, target)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)

"""Point a recipe problem at the team YAML file and line that set the key.

The typed recipe reports dotted keys (``cluster.queue: must be a string``); a team that wrote that value in
``recipes/cluster/ours.yaml`` wants ``recipes/cluster/ours.yaml:9: cluster.queue: ...``. Hydra's defaults list
gives the files composed, in merge order, with the package each lands in (``cluster`` for a cluster option, the
root for a ``# @package _global_`` preset); the last file whose YAML holds the key set it, and the YAML node's mark
gives the line. A problem with a key set on the command line (or with a section in which the command line set a
key: ``model: hidden_size (100) must be divisible ...`` after ``model.hidden_size=100``) names the command line
(``command line: model: ...``), never a file that does not hold the value; one set last by a built-in file keeps its
plain form: built-in recipes are tested, so the team's file or the command line is where the fix goes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from recipekit.base.errors import Problem, RecipeError
from recipekit.base.paths import GROUPS
from recipekit.recipe.compose import ConfigFile, loaded_configs
from recipekit.recipe.overrides import override_key

_PART = re.compile(r"[^.\[\]]+|\[\d+\]")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def locate(problems: Sequence[Problem], overrides: Sequence[str], extra_dirs: Sequence[Path]) -> list[Problem]:
    """``problems`` with ``file:line: `` in front of each key a team layer file set (unchanged without layers)."""
    if not extra_dirs:
        return list(problems)
    try:
        files = loaded_configs(overrides, extra_dirs)
    except RecipeError:
        return list(problems)
    if not any(f.layer > 0 for f in files):
        return list(problems)
    # value overrides only: `cluster=team` chooses the file, it does not set cluster.queue
    on_command_line = {key for key in map(override_key, overrides) if key not in GROUPS}
    cache: dict[Path, yaml.Node | None] = {}
    located = []
    for problem in problems:
        if _set_on_command_line(problem.key, on_command_line):
            located.append(Problem(f"{COMMAND_LINE}: {problem.key}", problem.message, problem.hint))
            continue
        where = _where(problem.key, files, cache)
        located.append(Problem(f"{where}: {problem.key}", problem.message, _file_hint(problem)) if where else problem)
    return located


#: Where a problem's value came from when the user typed it.
COMMAND_LINE = "command line"


def _file_hint(problem: Problem) -> str:
    """A hint phrased for the command line (``key='5'``), rephrased for the YAML file the value is in."""
    prefix = f"quote it to keep it as text: {problem.key}="
    if problem.hint.startswith(prefix):
        return f"quote it to keep it as text: {_PART.findall(problem.key)[-1]}: {problem.hint[len(prefix) :]}"
    return problem.hint


def _set_on_command_line(key: str, keys: set[str]) -> bool:
    """Whether the command line set ``key``, a section holding it, or a key inside the section ``key`` names."""
    return any(key == k or key.startswith(f"{k}.") or key.startswith(f"{k}[") or k.startswith(f"{key}.") for k in keys)


def _where(key: str, files: Sequence[ConfigFile], cache: dict[Path, yaml.Node | None]) -> str | None:
    """``path:line`` of the last team file holding ``key``, else of the last one holding its nearest parent section
    (a missing key is reported where the section it belongs to was written)."""
    parts = _PART.findall(key)
    for depth in range(len(parts), 0, -1):
        for config in reversed(files):
            line = _line(config, parts[:depth], cache)
            if line is None:
                continue
            if config.layer == 0:
                return None
            return f"{_display(config.path)}:{line}"
    return None


def _line(config: ConfigFile, parts: list[str], cache: dict[Path, yaml.Node | None]) -> int | None:
    """The 1-based line of the key ``parts`` (rooted at the recipe) in ``config``, or None if it does not set it."""
    package = _PART.findall(config.package) if config.package else []
    if parts[: len(package)] != package and package[: len(parts)] != parts:
        return None
    if config.path not in cache:
        try:
            cache[config.path] = yaml.compose(config.path.read_text(encoding="utf-8"), Loader=_LOADER)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            cache[config.path] = None
    node = cache[config.path]
    if not isinstance(node, yaml.MappingNode):
        return None
    if len(parts) <= len(package):  # the whole file is (inside) the section asked for
        keys = [k for k, _ in node.value if k.value != "defaults"]
        return keys[0].start_mark.line + 1 if keys else None
    mark = None
    for part in parts[len(package) :]:
        mark, node = _child(node, part)
        if mark is None:
            return None
    return mark


def _child(node: yaml.Node | None, part: str) -> tuple[int | None, yaml.Node | None]:
    if part.startswith("[") and isinstance(node, yaml.SequenceNode):
        index = int(part[1:-1])
        if index < len(node.value):
            item = node.value[index]
            return item.start_mark.line + 1, item
        return None, None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == part and part != "defaults":
                return key.start_mark.line + 1, value
    return None, None


def _display(path: Path) -> str:
    """A path relative to the current directory when it is below it (what an editor or terminal link wants)."""
    try:
        return Path(os.path.relpath(path)).as_posix() if path.is_relative_to(Path.cwd()) else str(path)
    except (ValueError, OSError):  # another drive, or a current directory that no longer exists
        return str(path)

"""What Hydra must never see: overrides that would overflow its parser or set its own settings, team recipe files
with alias bombs, resolvers or paths out of the trees, and interpolations that would expand to gigabytes. All
checked here, before any composition.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.paths import GROUPS
from recipekit.recipe.compose.options import OPTION_NAME, recipe_dirs
from recipekit.recipe.overrides import Override

#: The most text the recipe's interpolations may expand to, and the longest chain of references.
MAX_RESOLVED_BYTES = 1 << 20
MAX_REFERENCE_DEPTH = 64
_REFERENCE = re.compile(r"\$\{(\.*)([^${}:]*)\}")


def resolution_problem(data: Any) -> Problem | None:
    """A recipe whose plain references (``${a}``) would expand past :data:`MAX_RESOLVED_BYTES` or chain deeper than
    :data:`MAX_REFERENCE_DEPTH`: ``b: ${a}${a}``, ``c: ${b}${b}``, ... doubles at each key, so 1 KiB of YAML would
    resolve to gigabytes. Sizes are computed from the references alone, before OmegaConf resolves anything."""
    values: dict[tuple[str, ...], Any] = {}
    stack: list[tuple[tuple[str, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        values[path] = value
        if isinstance(value, dict):
            stack.extend(((*path, str(k)), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, str(i)), v) for i, v in enumerate(value))
    sizes: dict[tuple[str, ...], int] = {}

    def size(path: tuple[str, ...], depth: int) -> int:
        if path in sizes:
            return sizes[path]
        if depth > MAX_REFERENCE_DEPTH:
            raise _TooLarge(path, f"references chain more than {MAX_REFERENCE_DEPTH} deep")
        sizes[path] = 0  # a cycle counts nothing here; OmegaConf reports it
        value = values.get(path)
        if isinstance(value, str):
            total = len(value)
            for match in _REFERENCE.finditer(value):
                dots, key = match.group(1), match.group(2)
                base = path[: len(path) - len(dots)] if dots else ()
                target = (*base, *key.replace("[", ".").replace("]", "").split(".")) if key else base
                total += size(tuple(t for t in target if t), depth + 1) - len(match.group(0))
        elif isinstance(value, (dict, list)):
            children = [p for p in values if len(p) == len(path) + 1 and p[: len(path)] == path]
            total = sum(size(child, depth + 1) for child in children)
        else:
            total = len(str(value))
        if total > MAX_RESOLVED_BYTES:
            raise _TooLarge(path, f"would resolve to more than {MAX_RESOLVED_BYTES >> 20} MiB of text")
        sizes[path] = total
        return total

    try:
        for path in sorted(values, key=len, reverse=True):
            if isinstance(values[path], str):
                size(path, 0)
    except _TooLarge as exc:
        return Problem(
            ".".join(exc.path) or "recipe",
            exc.message,
            "interpolations that repeat each other multiply; write the value out or reference it once",
        )
    except RecursionError:
        return Problem("recipe", f"references chain more than {MAX_REFERENCE_DEPTH} deep")
    return None


class _TooLarge(Exception):
    def __init__(self, path: tuple[str, ...], message: str):
        super().__init__(message)
        self.path, self.message = path, message


# ---------------------------------------------------------------------------------------------- hostile input
#: Deepest nesting of ``[ ]`` and ``{ }`` in an override value; Hydra's parser recurses per level (a recipe needs 2).
MAX_OVERRIDE_DEPTH = 32
#: Longest run of digits outside quotes in an override (Python refuses to convert integers over 4300 digits).
MAX_OVERRIDE_DIGITS = 100
#: Most ``${`` in one value: OmegaConf's interpolation parser recurses into each nested one.
MAX_INTERPOLATIONS = 32
RESOLVER_HINT = (
    "only references to other recipe keys, ${section.key}, keep a bundle reproducible; write the value itself"
)


def check_overrides(overrides: Sequence[str]) -> list[tuple[str, Problem]]:
    """(override, problem) for each override refused before Hydra parses it.

    * ``hydra.*`` (and ``hydra/...`` groups): recipekit owns Hydra's configuration — a run directory, a launcher
      or a job name mean nothing in a bundle and were silently ignored.
    * nesting deeper than :data:`MAX_OVERRIDE_DEPTH`: Hydra's parser would overflow Python's stack.
    * a number with more than :data:`MAX_OVERRIDE_DIGITS` digits: Python's int() refuses it with a traceback.
    """
    found = []
    for override in overrides:
        parsed = Override.parse(override)
        name = parsed.key
        if name == "hydra" or name.startswith(("hydra.", "hydra/")):
            found.append(
                (
                    override,
                    Problem(
                        name,
                        "Hydra's own settings are not part of a recipe (recipekit configures Hydra itself)",
                        "remove the override; recipe sections: " + ", ".join(GROUPS[:-1]) + ", train",
                    ),
                )
            )
            continue
        depth, digits = _nesting_and_digits(parsed.value or "")
        if depth > MAX_OVERRIDE_DEPTH:
            found.append(
                (override, Problem(name, f"value nested {depth} levels deep", f"at most {MAX_OVERRIDE_DEPTH}"))
            )
        elif digits > MAX_OVERRIDE_DIGITS:
            found.append(
                (
                    override,
                    Problem(name, f"a number of {digits} digits", f"at most {MAX_OVERRIDE_DIGITS}; quote it for text"),
                )
            )
    return found


def refuse_hostile(overrides: Sequence[str]) -> None:
    """Raise :class:`RecipeError` for every override :func:`check_overrides` refuses: for the entry points that hand
    overrides to Hydra's parser without composing first (sweeps, the list of files a composition reads)."""
    refused = check_overrides(overrides)
    if refused:
        raise RecipeError([problem for _, problem in refused])


def _nesting_and_digits(value: str) -> tuple[int, int]:
    """Deepest ``[``/``{`` nesting and longest digit run of an override value, outside quoted strings."""
    depth = deepest = run = longest = 0
    quote = ""
    escaped = False
    for char in value:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
            continue
        run = run + 1 if char.isdigit() else 0
        longest = max(longest, run)
        if char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest, longest


def check_team_trees(extra_dirs: Sequence[Path]) -> list[Problem]:
    """Every problem of the YAML files of the team recipe trees, each naming its file (and line).

    Hydra reads these files itself, with no defence against alias bombs, deep nesting, huge numbers or non-UTF-8
    bytes (a hang or a traceback), and would resolve ``${oc.env:...}`` in them into the bundle. So every file Hydra
    could read — ``config.yaml`` and ``<group>/**/*.yaml`` — is read here first with
    :func:`recipekit.base.yamlfile.read`, and its text values checked for interpolations that are not plain references.
    """
    problems: list[Problem] = []
    for root in recipe_dirs(extra_dirs)[1:]:
        for path in _yaml_files(root):
            where = _shown(path)
            if not OPTION_NAME.match(path.stem):  # the name becomes an option and a bundle directory name
                problems.append(Problem(where, f"{path.stem!r} is not an option name (letters, digits, '_', '-', '.')"))
                continue
            if not path.is_file():  # a directory named *.yaml, a FIFO (opening it would wait for a writer forever)
                problems.append(Problem(where, "is not a regular file"))
                continue
            try:
                data = yamlfile.read(path)
            except OSError as exc:
                problems.append(Problem(where, f"cannot be read: {exc.strerror or exc}"))
                continue
            except yamlfile.UnsafeYAML as exc:
                line = f"line {exc.line}: " if exc.line else ""
                problems.append(Problem(where, line + exc.message))
                continue
            except yaml.YAMLError as exc:
                problems.append(Problem(where, f"not valid YAML: {yamlfile.one_line(exc)}"))
                continue
            for key, value in strings_of(data):
                problems.extend(
                    Problem(f"{where}: {key}", message, RESOLVER_HINT) for message in interpolation_problems(value)
                )
            problems.extend(Problem(where, message) for message in _reach_problems(data))
    return problems


def _reach_problems(data: Any) -> list[str]:
    """What in a team file would make Hydra read files this scan never saw: a ``searchpath`` (``hydra.searchpath``
    adds any directory of the machine) and a defaults-list entry that leaves the recipe trees (``..``, a scheme)."""
    found = []
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if "searchpath" in value:
                found.append("sets a Hydra searchpath: team layers are given with recipekit.toml or --recipes only")
            defaults = value.get("defaults")
            if isinstance(defaults, list):
                found.extend(
                    f"defaults entry {text!r} leaves the recipe trees ('..', '//', or a scheme)"
                    for text in _default_texts(defaults)
                    if ".." in text.split("/") or "://" in text or "\\" in text or text.startswith("//")
                )
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return sorted(set(found))


def _default_texts(defaults: list[Any]) -> list[str]:
    """Every group path and option name a defaults list names (``- group: option`` and ``- /path/option``)."""
    texts = []
    for entry in defaults:
        if isinstance(entry, str):
            texts.append(entry)
        elif isinstance(entry, dict):
            for key, value in entry.items():
                texts.append(str(key).split("@")[0])
                texts.extend(str(v) for v in (value if isinstance(value, list) else [value]))
    return texts


def _yaml_files(root: Path) -> list[Path]:
    """The YAML files of a recipe tree Hydra may read: every one below it (a defaults-list entry may name any
    folder of the tree, not only the groups), symlinked folders not followed (a symlink loop would never end)."""
    files: list[Path] = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        files.extend(Path(folder, name) for name in sorted([*names, *dirs]) if name.endswith(".yaml"))
    return files


def _shown(path: Path) -> str:
    """``path`` as text that can be printed (a file name of non-UTF-8 bytes is shown with escapes)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return ascii(text)
    return text


def strings_of(data: Any, key: str = "") -> list[tuple[str, str]]:
    """(dotted key, text) of every string in plain data (keys too), found without recursion."""
    found = []
    stack = [(key, data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            found.append((where or "<root>", value))
        elif isinstance(value, dict):
            for child, item in value.items():
                path = f"{where}.{child}" if where else str(child)
                if isinstance(child, str):
                    found.append((path, child))
                stack.append((path, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{index}]", item) for index, item in enumerate(value))
    return sorted(found)


def interpolation_problems(text: str) -> list[str]:
    """What is wrong with the interpolations in ``text``: every resolver call (``${oc.env:HOME}``, ``${now:...}``,
    any ``${name:...}``) — they copy the builder's environment or clock into the bundle — and text OmegaConf cannot
    parse. Plain references (``${model.name}``, ``${.sibling}``) are fine: they only repeat what the recipe says."""
    if "${" not in text:
        return []
    if text.count("${") > MAX_INTERPOLATIONS:
        return [f"more than {MAX_INTERPOLATIONS} interpolations in one value"]
    from omegaconf import grammar_parser
    from omegaconf.errors import GrammarParseError
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser

    try:
        tree = grammar_parser.parse(text)
    except GrammarParseError as exc:
        return [f"not a valid interpolation: {' '.join(str(exc).split())}"]
    resolvers = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            resolvers.append(node.resolverName().getText())
        stack.extend(node.getChild(i) for i in range(node.getChildCount()))
    return [
        f"uses the resolver {name!r} (${{{name}:...}}): resolvers can copy this machine's environment, clock or "
        "files into the bundle, so none is resolved"
        for name in sorted(set(resolvers))
    ]

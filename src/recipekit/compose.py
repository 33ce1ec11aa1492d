"""Command-line overrides → a plain recipe dict, through Hydra's compose API. The only module that imports Hydra.

Hydra stops at the first bad override; recipekit wants every problem at once. So group choices are checked against
the options found on disk before composing (with close matches); plain key overrides are applied with ``++`` and
judged by the typed schema afterwards, which reports every unknown key with the keys its section accepts.
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from recipekit import yamlfile
from recipekit.errors import Collector, Problem, RecipeError
from recipekit.paths import GROUPS, RECIPES_DIR

#: Hydra's version semantics, pinned so a Hydra upgrade cannot silently change composition.
HYDRA_VERSION_BASE = "1.3"
#: Hydra's own config groups for running applications (logging, help, launcher, sweeper, output dirs, env). recipekit
#: only composes, so they are left out of the composition: about a quarter of its time.
_HYDRA_APP_GROUPS = tuple(
    f"~hydra/{group}"
    for group in ("help", "hydra_help", "job_logging", "hydra_logging", "output", "launcher", "sweeper", "env")
)

_GROUP_OVERRIDE = re.compile(r"^(?P<group>[A-Za-z_]+)=(?P<option>[^=\s]+)$")


@dataclass(frozen=True)
class Composed:
    """What composition produced: the raw recipe dict and how it was chosen (for the manifest)."""

    raw: dict[str, Any]
    choices: dict[str, str | None]
    overrides: list[str] = field(default_factory=list)


def recipe_dirs(extra: Sequence[Path] = ()) -> list[Path]:
    """The recipe trees searched, recipekit's own first; ``extra`` are a team's recipe repos."""
    return [RECIPES_DIR, *(Path(p).resolve() for p in extra)]


def group_options(group: str, extra: Sequence[Path] = ()) -> dict[str, Path]:
    """Every option of ``group``, discovered from the recipe trees on disk (never from a list in code)."""
    found: dict[str, Path] = {}
    for root in recipe_dirs(extra):
        for path in sorted((root / group).glob("*.yaml")):
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def describe_option(path: Path) -> str:
    """The option's one-line ``description`` key (empty when it has none or it is not one line of text)."""
    try:
        data = yamlfile.read(path) or {}
    except (OSError, yaml.YAMLError):
        return "(unreadable YAML)"
    description = data.get("description", "") if isinstance(data, dict) else ""
    return description if isinstance(description, str) and description.isprintable() else ""


def compose(overrides: Sequence[str], extra_dirs: Sequence[Path] = ()) -> Composed:
    """Compose recipekit's config with ``overrides`` (Hydra grammar) into a plain dict.

    Defaults live in the typed records, and option files spell only what differs from them, so a plain
    ``section.key=value`` may name a key the composed YAML lacks: it is applied with Hydra's ``++`` (add or
    override), and whether the key exists is the schema's to say (``recipekit.recipe``, with close matches). The
    recorded overrides stay as the user wrote them. Raises :class:`RecipeError` listing every unknown group option
    and malformed override.
    """
    problems = Collector()
    for directory in extra_dirs:
        if not Path(directory).is_dir():
            problems.add(f"--recipes {directory}", "not a directory")
    problems.raise_if_any()
    problems.extend(check_team_trees(extra_dirs))
    problems.raise_if_any()
    refused = [*check_overrides(overrides), *_check_group_choices(overrides, extra_dirs)]
    problems.extend([problem for _, problem in refused])
    unknown = {override for override, _ in refused}
    remaining = [o for o in overrides if o not in unknown]
    try:
        composed = _compose_once([_forced(o) for o in remaining], extra_dirs)
    except RecipeError as err:
        problems.extend(err.problems)
    problems.raise_if_any()
    return replace(composed, overrides=list(remaining))


def _forced(override: str) -> str:
    """``key=value`` → ``++key=value`` for a plain key override; group choices and ``+``/``~`` forms unchanged."""
    key, sep, _ = override.partition("=")
    if not sep or key[:1] in "+~" or key.startswith("hydra.") or _GROUP_OVERRIDE.match(override) and key in GROUPS:
        return override
    return "++" + override


def _check_group_choices(overrides: Sequence[str], extra_dirs: Sequence[Path]) -> list[tuple[str, Problem]]:
    """(override, problem) for every ``group=option`` naming an option that is not on disk."""
    problems = []
    for override in overrides:
        match = _GROUP_OVERRIDE.match(override)
        if not match or match["group"] not in GROUPS:
            continue
        group, option = match["group"], match["option"]
        if option == "null" and group == "recipe":
            continue
        options = group_options(group, extra_dirs)
        if option not in options:
            close = difflib.get_close_matches(option, list(options), n=3, cutoff=0.5)
            hint = (f"did you mean {' or '.join(close)}? " if close else "") + "options: " + ", ".join(options)
            problems.append((override, Problem(group, f"unknown option {option!r}", hint)))
    return problems


def _compose_once(overrides: list[str], extra_dirs: Sequence[Path]) -> Composed:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    team_trees = recipe_dirs(extra_dirs)[1:]
    search = [f"hydra.searchpath=[{','.join(f'file://{d}' for d in team_trees)}]"] if team_trees else []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(RECIPES_DIR), version_base=HYDRA_VERSION_BASE):
                cfg = hydra_compose(
                    config_name="config", overrides=[*overrides, *search, *_HYDRA_APP_GROUPS], return_hydra_config=True
                )
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        # Resolve only what keeps the bundle reproducible: references to other recipe keys, never resolvers.
        refused = [
            Problem(key, message, _RESOLVER_HINT)
            for key, value in _strings(OmegaConf.to_container(cfg, resolve=False))
            for message in _interpolation_problems(value)
        ]
        if refused:
            raise RecipeError(refused)
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OverrideParseException as exc:
        first_line = str(exc).splitlines()
        raise RecipeError([Problem("override", first_line[0], " ".join(first_line[1:2]))]) from None
    except MissingConfigException as exc:
        raise RecipeError([Problem("recipe", str(exc).splitlines()[0])]) from None
    except ConfigCompositionException as exc:
        # Hydra sometimes wraps OmegaConf's error without a message of its own (a YAML key that is null, say)
        cause = exc.__cause__
        if not str(exc).strip() and cause is not None:
            key = getattr(cause, "full_key", None) or "recipe"
            first = (str(getattr(cause, "msg", None) or cause).strip().splitlines() or ["invalid"])[0]
            raise RecipeError([Problem(str(key), " ".join(first.split()))]) from None
        raise RecipeError([Problem("override", " ".join(str(exc).split()))]) from None
    except OmegaConfBaseException as exc:
        # full_key names the value whose interpolation failed (a reference to a key that does not exist, ...)
        key = getattr(exc, "full_key", None) or "recipe"
        message = getattr(exc, "msg", None) or str(exc)
        first = (str(message).strip().splitlines() or ["cannot be resolved"])[0]
        raise RecipeError([Problem(str(key), " ".join(first.split()))]) from None
    except (HydraException, yaml.YAMLError) as exc:
        raise RecipeError([Problem("recipe", " ".join(str(exc).split()))]) from None

    group_choices = {g: choices.get(g) for g in GROUPS}
    if raw.get("name") is None:
        raw["name"] = default_name(group_choices)
    return Composed(raw=raw, choices=group_choices, overrides=list(overrides))


def default_name(choices: dict[str, str | None]) -> str:
    """A recipe without a preset is named after its model and mode, e.g. ``llama3_8b_lora``."""
    return f"{choices.get('model')}_{choices.get('mode')}".lower()


# ---------------------------------------------------------------------------------------------- hostile input
#: Deepest nesting of ``[ ]`` and ``{ }`` in an override value; Hydra's parser recurses per level (a recipe needs 2).
MAX_OVERRIDE_DEPTH = 32
#: Longest run of digits outside quotes in an override (Python refuses to convert integers over 4300 digits).
MAX_OVERRIDE_DIGITS = 100
#: Most ``${`` in one value: OmegaConf's interpolation parser recurses into each nested one.
MAX_INTERPOLATIONS = 32
_RESOLVER_HINT = (
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
        key, sep, value = override.partition("=")
        name = key.lstrip("+~")
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
        depth, digits = _nesting_and_digits(value if sep else "")
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
    could read — ``config.yaml`` and ``<group>/**/*.yaml`` — is read here first with :func:`recipekit.yamlfile.read`,
    and its text values checked for interpolations that are not plain references.
    """
    problems: list[Problem] = []
    for root in recipe_dirs(extra_dirs)[1:]:
        for path in _yaml_files(root):
            where = _shown(path)
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
            for key, value in _strings(data):
                problems.extend(
                    Problem(f"{where}: {key}", message, _RESOLVER_HINT) for message in _interpolation_problems(value)
                )
    return problems


def _yaml_files(root: Path) -> list[Path]:
    """The YAML files of a recipe tree Hydra may read: top level and every group folder, symlinked folders not
    followed (a symlink loop would never end)."""
    files = sorted(root.glob("*.yaml"))
    for group in GROUPS:
        for folder, dirs, names in os.walk(root / group):
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


def _strings(data: Any, key: str = "") -> list[tuple[str, str]]:
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


def _interpolation_problems(text: str) -> list[str]:
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

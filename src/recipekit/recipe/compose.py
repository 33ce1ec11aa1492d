"""Command-line overrides → a plain recipe dict, through Hydra's compose API. The only module that imports Hydra.

Besides composing, it answers the other questions only Hydra can: which files a composition read (packages, error
locations), what a multirun sweep expands to, and how to share one composition between matrix combinations.

Hydra stops at the first bad override; recipekit wants every problem at once. So group choices are checked against
the options found on disk before composing (with close matches); plain key overrides are applied with ``++`` and
judged by the typed schema afterwards, which reports every unknown key with the keys its section accepts.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import math
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Collector, Problem, RecipeError
from recipekit.base.limits import MATRIX_BUNDLES
from recipekit.base.paths import GROUPS, RECIPES_DIR

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
    #: Where the team layers came from (path, repo, git commit, dirty), for the manifest; empty for built-ins only.
    origin: tuple[dict[str, Any], ...] = ()


def recipe_dirs(extra: Sequence[Path] = ()) -> list[Path]:
    """The recipe trees (layers) searched, recipekit's own first; ``extra`` are team trees, later ones winning."""
    return [RECIPES_DIR, *(Path(p).resolve() for p in extra)]


def option_files(group: str, extra: Sequence[Path] = ()) -> dict[str, list[Path]]:
    """Each option of ``group`` → its files in every layer that has one, the winning (last) layer's last."""
    found: dict[str, list[Path]] = {}
    for root in recipe_dirs(extra):
        for path in sorted((root / group).glob("*.yaml")):
            found.setdefault(path.stem, []).append(path)
    return dict(sorted(found.items()))


def group_options(group: str, extra: Sequence[Path] = ()) -> dict[str, Path]:
    """Every option of ``group``, discovered from the recipe trees on disk (never from a list in code).

    A team layer's option shadows a same-named one of an earlier layer, as Hydra resolves it (see _hydra_session).
    """
    return {option: paths[-1] for option, paths in option_files(group, extra).items()}


def describe_option(path: Path) -> str:
    """The option's one-line ``description`` key (empty when it has none or it is not one line of text)."""
    try:
        data = yamlfile.read(path) or {}
    except (OSError, yaml.YAMLError):
        return "(unreadable YAML)"
    description = data.get("description", "") if isinstance(data, dict) else ""
    return description if isinstance(description, str) and description.isprintable() else ""


def preload() -> None:
    """Import Hydra's composition machinery now (a matrix build does, before forking its workers to share it)."""
    import hydra.compose  # noqa: F401 - the import is the point
    from hydra._internal.config_loader_impl import ConfigLoaderImpl  # noqa: F401


def compose(overrides: Sequence[str], extra_dirs: Sequence[Path] = ()) -> Composed:
    """Compose recipekit's config with ``overrides`` (Hydra grammar) into a plain dict.

    Defaults live in the typed records, and option files spell only what differs from them, so a plain
    ``section.key=value`` may name a key the composed YAML lacks: it is applied with Hydra's ``++`` (add or
    override), and whether the key exists is the schema's to say (``recipe.sections``, with close matches). The
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
    if problems.problems:  # the rest composed: the caller may still report the recipe's own problems
        raise PartialComposition(list(problems.problems), composed=composed, refused_keys={p.key for _, p in refused})
    return replace(composed, overrides=list(remaining))


class PartialComposition(RecipeError):
    """Some overrides were refused (``refused_keys``: their groups or keys) and the rest composed (``composed``)."""

    def __init__(self, problems: list[Problem], *, composed: Composed, refused_keys: set[str]) -> None:
        super().__init__(problems)
        self.composed = composed
        self.refused_keys = refused_keys


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
    from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with warnings.catch_warnings(), _hydra_session(extra_dirs):
            warnings.simplefilter("ignore")
            cfg = hydra_compose(
                config_name="config", overrides=[*overrides, *_HYDRA_APP_GROUPS], return_hydra_config=True
            )
        return _finish(cfg, overrides)
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


def _finish(cfg: Any, overrides: Sequence[str]) -> Composed:
    """A composed config (with its ``hydra`` node) as a plain dict, its group choices and the name it defaults to."""
    from omegaconf import OmegaConf, open_dict

    choices = _plain(cfg.hydra.runtime.choices)
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
    problem = resolution_problem(_plain(cfg))
    if problem:
        raise RecipeError([problem])
    return _composed(_plain(cfg, resolve=True), choices, overrides)


def _plain(cfg: Any, *, resolve: bool = False) -> dict[str, Any]:
    """A DictConfig as plain data (its container is a dict with string keys: config keys are names)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=resolve)
    assert isinstance(data, dict)
    return cast(dict[str, Any], data)


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


def _composed(raw: dict[str, Any], choices: dict[str, Any], overrides: Sequence[str]) -> Composed:
    group_choices = {g: choices.get(g) for g in GROUPS}
    if raw.get("name") is None:
        raw["name"] = default_name(group_choices)
    return Composed(raw=raw, choices=group_choices, overrides=list(overrides))


@contextmanager
def _hydra_session(extra_dirs: Sequence[Path]) -> Iterator[Any]:
    """Hydra initialised on the recipe layers, each team layer searched before the layers it follows.

    Hydra takes the first match along its search path, and ``hydra.searchpath`` only appends behind the primary
    config directory: a team option could never shadow a built-in one that way. So the search path is built here
    with Hydra's own objects, exactly as ``initialize_config_dir`` builds it, then each team layer is prepended
    before recipekit's recipes: (Hydra's configs,) last team layer, ..., first team layer, recipekit's recipes.
    Lookup, defaults lists and merging stay Hydra's; a team layer may even ship its own ``config.yaml``. The two
    ``hydra._internal`` imports are what ``initialize_config_dir`` calls (hydra-core is pinned to 1.3.x; the tests
    that a team option shadows a built-in one break if that changes).
    """
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    version.setbase(HYDRA_VERSION_BASE)
    search_path = create_config_search_path(search_path_dir=str(RECIPES_DIR))
    for layer in reversed(recipe_dirs(extra_dirs)[1:]):
        search_path.prepend("recipekit-layer", f"file://{layer}", anchor=SearchPathQuery(provider="main"))
    Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)
    try:
        yield GlobalHydra.instance()
    finally:
        restore_gh_from_backup(backup)


# ---------------------------------------------------------------------------------------- what a composition read
@dataclass(frozen=True)
class ConfigFile:
    """One YAML file a composition merged, in merge order: which layer it came from and where its keys land."""

    path: Path
    layer: int
    #: Dotted key its content is merged under ("" for the root, e.g. a preset with ``# @package _global_``).
    package: str


def loaded_configs(overrides: Sequence[str], extra_dirs: Sequence[Path] = ()) -> list[ConfigFile]:
    """Every recipe file the composition of ``overrides`` merges, in Hydra's merge order (a later one wins).

    From Hydra's own defaults list, so nested defaults (a team option that extends a built-in one) are included;
    each file is found in the layers the way Hydra finds it, the last layer first. Raises :class:`RecipeError` when
    the overrides do not compose.
    """
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    layers = recipe_dirs(extra_dirs)
    refuse_hostile(overrides)
    try:
        with warnings.catch_warnings(), _hydra_session(extra_dirs) as hydra:
            warnings.simplefilter("ignore")
            defaults = hydra.config_loader().compute_defaults_list(
                "config", [*overrides, *_HYDRA_APP_GROUPS], RunMode.RUN
            )
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as exc:
        raise RecipeError([Problem("recipe", " ".join(str(exc).split()))]) from None
    found: list[ConfigFile] = []
    for default in defaults.defaults:
        if default.config_path is None:
            continue
        for index in reversed(range(len(layers))):
            path = layers[index] / f"{default.config_path}.yaml"
            if path.is_file():
                package = "" if default.package in (None, "_global_") else str(default.package)
                found.append(ConfigFile(path, index, package))
                break
    return found


# ------------------------------------------------------------------------------------------------ matrix builds
@dataclass(frozen=True)
class Sweep:
    """A multirun sweep expanded: every combination's overrides, position by position as given on the command line.

    ``swept[i]`` says whether argument ``i`` varies across combinations; ``group[i]`` whether it chooses a config
    group option (or otherwise changes which files are composed) rather than setting a value.
    """

    combinations: list[list[str]]
    swept: list[bool]
    group: list[bool]


def expand_sweep(arguments: Sequence[str], extra_dirs: Sequence[Path] = ()) -> Sweep:
    """Hydra's multirun grammar (``a=1,2``, ``choice(...)``, ``range(1,4)``, ``glob(*)`` over a group's options)
    expanded to the cartesian product, in argument order, as Hydra's basic sweeper does.

    Parsed with Hydra's override parser. Every problem is reported at once: a malformed argument, a key given
    twice, and sweeps that cannot be listed reproducibly (``interval``, ``shuffle``).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    from hydra.errors import OverrideParseException

    problems = Collector()
    refuse_hostile(arguments)
    problems.extend(check_team_trees(extra_dirs))  # glob(*) lists the trees' option names: they are checked first
    problems.raise_if_any()
    try:
        parsed = OverridesParser.create().parse_overrides(list(arguments))
    except OverrideParseException as exc:
        lines = str(exc).splitlines()
        raise RecipeError([Problem("override", lines[0], " ".join(lines[1:2]))]) from None
    axes: list[list[str]] = []
    seen: set[str] = set()
    for override in parsed:
        key = override.get_key_element()
        bare = override.key_or_group
        if bare in seen:
            problems.add(bare, "given twice in one sweep", hint="list all its values in one argument: key=a,b")
        seen.add(bare)
        value = override.value()
        if not override.is_sweep_override():
            axes.append([str(override.input_line)])
        elif override.is_interval_sweep():
            problems.add(key, "interval() is a continuous range", hint="list the values, or use range(start,stop,step)")
            axes.append([])
        elif getattr(value, "shuffle", False):
            problems.add(key, "shuffle() gives a different order each run", hint="list the values in order")
            axes.append([])
        elif isinstance(value, Glob):
            if bare not in GROUPS:
                problems.add(key, "glob() selects options of a config group", hint="groups: " + ", ".join(GROUPS))
                axes.append([])
            else:
                axes.append([f"{key}={option}" for option in value.filter(list(group_options(bare, extra_dirs)))])
        else:  # at most one more than the limit is drawn: range(0,10**12) is never listed
            items = itertools.islice(override.sweep_string_iterator(), MATRIX_BUNDLES.value + 1)
            axes.append([f"{key}={item}" for item in items])
        if not axes[-1] and not problems.problems:
            problems.add(key, "the sweep selects nothing")
    problems.raise_if_any()
    total = math.prod(len(axis) for axis in axes)
    if total > MATRIX_BUNDLES.value:
        sizes = " × ".join(str(len(a)) if len(a) <= MATRIX_BUNDLES.value else f">{MATRIX_BUNDLES.value}" for a in axes)
        raise MATRIX_BUNDLES.refuse("sweep", f"{sizes} combinations")
    group = [_is_group(override.key_or_group) for override in parsed]
    swept = [len(axis) > 1 or override.is_sweep_override() for axis, override in zip(axes, parsed)]
    return Sweep([list(c) for c in itertools.product(*axes)], swept, group)


def _is_group(key: str) -> bool:
    """An override of a config group (or of Hydra itself) changes what is composed, not just a value."""
    return key in GROUPS or "/" in key or key == "hydra" or key.startswith("hydra.")


def compose_variants(
    base: Sequence[str], variants: Sequence[tuple[Sequence[str], Sequence[str]]], extra_dirs: Sequence[Path] = ()
) -> list[Composed | None]:
    """Compose ``base`` once, then give each variant ``(overrides, tail)`` its own copy with ``tail`` applied.

    ``tail`` holds value overrides only, the last ones of the variant's ``overrides``; Hydra itself applies
    command-line value overrides after merging the defaults list, with this same function, so the result equals
    ``compose(overrides)`` — at the cost of a copy instead of a composition (``_set_values`` for plain values,
    else a copy of the config and Hydra's private ``_apply_overrides_to_config``, pinned like ``_hydra_session``'s
    imports). A variant is None where the base or its tail does not compose: the caller composes it in full, which
    reports the problems as a single build does.
    """
    from hydra import compose as hydra_compose
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    failures = (HydraException, OmegaConfBaseException, yaml.YAMLError, RecipeError)
    try:
        with warnings.catch_warnings(), _hydra_session(extra_dirs):
            warnings.simplefilter("ignore")
            cfg = hydra_compose(config_name="config", overrides=[*base, *_HYDRA_APP_GROUPS], return_hydra_config=True)
        choices = _plain(cfg.hydra.runtime.choices)
        plain: dict[str, Any] | None = _plain(cfg)
    except failures:
        return [None] * len(variants)
    assert plain is not None
    plain.pop("hydra", None)
    if _has_interpolation(plain):
        plain = None  # a changed value could change another through ${...}: let OmegaConf resolve every copy
    parser = OverridesParser.create()
    results: list[Composed | None] = []
    for overrides, tail in variants:
        try:
            parsed = parser.parse_overrides([_forced(o) for o in tail])
            raw = _set_values(plain, parsed) if plain is not None else None
            if raw is not None:
                results.append(_composed(raw, choices, overrides))
                continue
            variant = copy.deepcopy(cfg)
            ConfigLoaderImpl._apply_overrides_to_config(parsed, variant)
            results.append(_finish(variant, overrides))
        except failures:
            results.append(None)
    return results


def _set_values(base: dict[str, Any], overrides: Sequence[Any]) -> dict[str, Any] | None:
    """``base`` (plain data, no interpolation) with each override applied, when every one sets a plain value
    (text, number, bool, null) on a key that holds no mapping or list: what ``OmegaConf.update`` does on such a
    config, for a hundredth of the cost of copying a DictConfig. ``++`` (compose's form of a plain key override)
    may create the key and the sections above it, as Hydra's force-add does. None for anything else (``+``, ``~``,
    a mapping or list, an interpolation): the caller lets Hydra apply those.
    """
    raw = copy.deepcopy(base)
    for override in overrides:
        value = override.value()
        kind = override.type.name
        if kind not in ("CHANGE", "FORCE_ADD") or override.package is not None:
            return None
        if not (value is None or isinstance(value, (str, int, float, bool))) or "${" in str(value):
            return None
        *path, leaf = override.key_or_group.split(".")
        node: Any = raw
        for part in path:
            if kind == "FORCE_ADD" and isinstance(node, dict) and part not in node:
                node[part] = {}
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or isinstance(node.get(leaf), (dict, list)):
            return None
        if kind == "CHANGE" and leaf not in node:
            return None
        node[leaf] = value
    return raw


def _has_interpolation(data: Any) -> bool:
    if isinstance(data, dict):
        return any(_has_interpolation(v) for v in data.values())
    if isinstance(data, list):
        return any(_has_interpolation(v) for v in data)
    return isinstance(data, str) and "${" in data


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
            for key, value in _strings(data):
                problems.extend(
                    Problem(f"{where}: {key}", message, _RESOLVER_HINT) for message in _interpolation_problems(value)
                )
            problems.extend(Problem(where, message) for message in _reach_problems(data))
    return problems


#: What an option's file name may be: a name, never a path (``...yaml`` would be the option ``..``).
OPTION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+@-]*$(?<!\.)")


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

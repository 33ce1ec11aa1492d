"""Command-line overrides → a plain recipe dict and its group choices, through Hydra's compose API; and the files a
composition read.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import yaml

from recipekit.base.errors import Collector, Problem, RecipeError
from recipekit.base.paths import GROUPS, RECIPES_DIR
from recipekit.recipe.compose.options import group_options, recipe_dirs
from recipekit.recipe.compose.untrusted import (
    RESOLVER_HINT,
    check_overrides,
    check_team_trees,
    interpolation_problems,
    refuse_hostile,
    resolution_problem,
    strings_of,
)
from recipekit.recipe.overrides import Override

#: Hydra's version semantics, pinned so a Hydra upgrade cannot silently change composition.
HYDRA_VERSION_BASE = "1.3"
#: Hydra's own config groups for running applications (logging, help, launcher, sweeper, output dirs, env). recipekit
#: only composes, so they are left out of the composition: about a quarter of its time.
HYDRA_APP_GROUPS = tuple(
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
        composed = _compose_once([forced(o) for o in remaining], extra_dirs)
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


def forced(override: str) -> str:
    """``key=value`` → ``++key=value`` for a plain key override; group choices and ``+``/``~`` forms unchanged."""
    parsed = Override.parse(override)
    key = parsed.key
    if (
        parsed.value is None
        or parsed.prefix
        or key.startswith("hydra.")
        or _GROUP_OVERRIDE.match(override)
        and key in GROUPS
    ):
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
        with warnings.catch_warnings(), hydra_session(extra_dirs):
            warnings.simplefilter("ignore")
            cfg = hydra_compose(
                config_name="config", overrides=[*overrides, *HYDRA_APP_GROUPS], return_hydra_config=True
            )
        return finish_composition(cfg, overrides)
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


def finish_composition(cfg: Any, overrides: Sequence[str]) -> Composed:
    """A composed config (with its ``hydra`` node) as a plain dict, its group choices and the name it defaults to."""
    from omegaconf import OmegaConf, open_dict

    choices = plain_data(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    # Resolve only what keeps the bundle reproducible: references to other recipe keys, never resolvers.
    refused = [
        Problem(key, message, RESOLVER_HINT)
        for key, value in strings_of(OmegaConf.to_container(cfg, resolve=False))
        for message in interpolation_problems(value)
    ]
    if refused:
        raise RecipeError(refused)
    problem = resolution_problem(plain_data(cfg))
    if problem:
        raise RecipeError([problem])
    return composed_from(plain_data(cfg, resolve=True), choices, overrides)


def plain_data(cfg: Any, *, resolve: bool = False) -> dict[str, Any]:
    """A DictConfig as plain data (its container is a dict with string keys: config keys are names)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=resolve)
    assert isinstance(data, dict)
    return cast(dict[str, Any], data)


def composed_from(raw: dict[str, Any], choices: dict[str, Any], overrides: Sequence[str]) -> Composed:
    group_choices = {g: choices.get(g) for g in GROUPS}
    if raw.get("name") is None:
        raw["name"] = default_name(group_choices)
    return Composed(raw=raw, choices=group_choices, overrides=list(overrides))


@contextmanager
def hydra_session(extra_dirs: Sequence[Path]) -> Iterator[Any]:
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
        with warnings.catch_warnings(), hydra_session(extra_dirs) as hydra:
            warnings.simplefilter("ignore")
            defaults = hydra.config_loader().compute_defaults_list(
                "config", [*overrides, *HYDRA_APP_GROUPS], RunMode.RUN
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


def default_name(choices: dict[str, str | None]) -> str:
    """A recipe without a preset is named after its model and mode, e.g. ``llama3_8b_lora``."""
    return f"{choices.get('model')}_{choices.get('mode')}".lower()

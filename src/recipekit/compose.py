"""Command-line overrides → a plain recipe dict, through Hydra's compose API. The only module that imports Hydra.

Hydra stops at the first bad override; recipekit wants every problem at once. So group choices are checked against
the options found on disk before composing (with close matches); plain key overrides are applied with ``++`` and
judged by the typed schema afterwards, which reports every unknown key with the keys its section accepts.
"""

from __future__ import annotations

import difflib
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
    """The option's one-line ``description`` key (empty when it has none)."""
    try:
        data = yamlfile.read(path) or {}
    except yaml.YAMLError:
        return "(unreadable YAML)"
    return str(data.get("description", "")) if isinstance(data, dict) else ""


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
    bad_choices = _check_group_choices(overrides, extra_dirs)
    problems.extend([problem for _, problem in bad_choices])
    unknown = {override for override, _ in bad_choices}
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
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OverrideParseException as exc:
        first_line = str(exc).splitlines()
        raise RecipeError([Problem("override", first_line[0], " ".join(first_line[1:2]))]) from None
    except MissingConfigException as exc:
        raise RecipeError([Problem("recipe", str(exc).splitlines()[0])]) from None
    except ConfigCompositionException as exc:
        raise RecipeError([Problem("override", " ".join(str(exc).split()))]) from None
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as exc:
        raise RecipeError([Problem("recipe", " ".join(str(exc).split()))]) from None

    group_choices = {g: choices.get(g) for g in GROUPS}
    if raw.get("name") is None:
        raw["name"] = default_name(group_choices)
    return Composed(raw=raw, choices=group_choices, overrides=list(overrides))


def default_name(choices: dict[str, str | None]) -> str:
    """A recipe without a preset is named after its model and mode, e.g. ``llama3_8b_lora``."""
    return f"{choices.get('model')}_{choices.get('mode')}".lower()

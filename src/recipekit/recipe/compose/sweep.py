"""Matrix builds: Hydra's multirun grammar expanded into combinations, each composed as a copy of one composition
where only plain values differ.
"""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recipekit.base.errors import Collector, Problem, RecipeError
from recipekit.base.limits import MATRIX_BUNDLES
from recipekit.base.paths import GROUPS
from recipekit.recipe.compose.composition import (
    HYDRA_APP_GROUPS,
    Composed,
    composed_from,
    finish_composition,
    forced,
    hydra_session,
    plain_data,
)
from recipekit.recipe.compose.options import group_options
from recipekit.recipe.compose.untrusted import check_team_trees, refuse_hostile


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
    else a copy of the config and Hydra's private ``_apply_overrides_to_config``, pinned like ``hydra_session``'s
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
        with warnings.catch_warnings(), hydra_session(extra_dirs):
            warnings.simplefilter("ignore")
            cfg = hydra_compose(config_name="config", overrides=[*base, *HYDRA_APP_GROUPS], return_hydra_config=True)
        choices = plain_data(cfg.hydra.runtime.choices)
        plain: dict[str, Any] | None = plain_data(cfg)
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
            parsed = parser.parse_overrides([forced(o) for o in tail])
            raw = _set_values(plain, parsed) if plain is not None else None
            if raw is not None:
                results.append(composed_from(raw, choices, overrides))
                continue
            variant = copy.deepcopy(cfg)
            ConfigLoaderImpl._apply_overrides_to_config(parsed, variant)
            results.append(finish_composition(variant, overrides))
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

"""What ``recipekit list`` shows: each group's options, its default, and the layer each option comes from.

A team sees at a glance which options are its own and which of its options replace a built-in one of the same name
(a shadow is deliberate — the team's ``cluster/default.yaml`` — or a surprise worth seeing before a build).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import click
import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import RecipeError
from recipekit.cli.common import SETTINGS, recipes_option, rich_console, user_errors
from recipekit.recipe.compose import describe_option, option_files, recipe_dirs
from recipekit.recipe.team import Layer

if TYPE_CHECKING:
    from recipekit.recipe.sections import ModeSpec

BUILT_IN = "built-in"


@dataclass(frozen=True)
class OptionRow:
    group: str
    option: str
    default: bool
    #: The label of the layer the option is taken from (the last one that has it).
    origin: str
    #: Labels of the earlier layers whose same-named option this one replaces.
    shadows: tuple[str, ...]
    description: str
    #: (hw option, reason) for each hardware option whose image ``build`` refuses this option on (mode options only):
    #: the same check build runs (:func:`recipekit.image.matrix.mode_problems`), so list and build cannot disagree.
    unsupported: tuple[tuple[str, str], ...] = ()


def unsupported_note(row: OptionRow) -> str:
    """The short note `list` adds to an option's description: the hardware options build refuses it on."""
    return "not on hw " + ", ".join(hw for hw, _ in row.unsupported) if row.unsupported else ""


def mode_refusals(path: Path, extra: Sequence[Path] = ()) -> tuple[tuple[str, str], ...]:
    """(hw option, reason) for each hardware option whose image family cannot run the mode option at ``path``.

    A mode file that is not a plain, valid mode section (a team file that extends another) gets no note.
    """
    from recipekit.base.errors import RecipeError
    from recipekit.image.matrix import load_images, mode_problems
    from recipekit.recipe.schema import field_types, sections_in, validate
    from recipekit.recipe.sections import Recipe

    try:
        data = yamlfile.read(path)
    except (OSError, yaml.YAMLError):
        return ()
    members: list[Any] = sections_in(field_types(Recipe)["mode"])
    by_kind = {str(get_args(field_types(member)["kind"])[0]): member for member in members}
    if not isinstance(data, dict) or str(data.get("kind")) not in by_kind:
        return ()
    try:
        mode: ModeSpec = validate(by_kind[str(data["kind"])], data, root="mode")
        families = load_images().families
    except RecipeError:
        return ()
    refused = []
    for hw, paths in option_files("hw", extra).items():
        try:
            hw_data = yamlfile.read(paths[-1])
        except (OSError, yaml.YAMLError):
            continue
        family = hw_data.get("image_family") if isinstance(hw_data, dict) else None
        if isinstance(family, str) and family in families:
            problems = mode_problems(family, families[family], mode)
            if problems:
                refused.append((hw, problems[0].message))
    return tuple(sorted(refused))


def group_defaults(extra_dirs: Sequence[Path] = ()) -> dict[str, str | None]:
    """Each group's default option, from the defaults list of the ``config.yaml`` Hydra would load.

    That is the last layer's that has one: a team layer may replace recipekit's root config.
    """
    roots = [root / "config.yaml" for root in recipe_dirs(extra_dirs)]
    config = next((path for path in reversed(roots) if path.is_file()), None)
    try:
        data = yamlfile.read(config) if config else {}
    except yaml.YAMLError:
        return {}
    found: dict[str, str | None] = {}
    for entry in (data or {}).get("defaults", []) if isinstance(data, dict) else []:
        if isinstance(entry, dict):
            for group, option in entry.items():
                found[str(group).removeprefix("override ").strip()] = None if option is None else str(option)
    return found


def option_rows(groups: Sequence[str], layers: Sequence[Layer]) -> list[OptionRow]:
    """One row per option of each group, in group order then option order."""
    extra = [layer.path for layer in layers]
    labels = {root: label for root, label in zip(recipe_dirs(extra), [BUILT_IN, *(layer.label for layer in layers)])}
    defaults = group_defaults(extra)
    rows = []
    for group in groups:
        for option, paths in option_files(group, extra).items():
            origins = [labels.get(path.parent.parent, str(path.parent.parent)) for path in paths]
            rows.append(
                OptionRow(
                    group=group,
                    option=option,
                    default=defaults.get(group) == option,
                    origin=origins[-1],
                    shadows=tuple(origins[:-1]),
                    description=describe_option(paths[-1]),
                    unsupported=mode_refusals(paths[-1], extra) if group == "mode" else (),
                )
            )
    return rows


#: The prefix of the test twins' options (random-weight tiny models and the preset training one): the dry run and
#: the tests use them; `list` shows them with --all.
TWIN_PREFIX = "tiny_"


@click.command(name="list", context_settings=SETTINGS)
@click.argument("group", required=False)
@click.option("--all", "show_all", is_flag=True, help="Also list the test twins (tiny_*), hidden otherwise.")
@recipes_option
@user_errors
def list_(group: str | None, show_all: bool, extra_dirs: tuple[Path, ...]) -> None:
    """List config groups and their options: descriptions, each group's default (*), where each option comes from.

    An option from a team layer (recipekit.toml, --recipes, $RECIPEKIT_RECIPES) that replaces a same-named option of
    an earlier layer is marked "shadows ...". The test twins (tiny_*: random-weight tiny models the dry run and the
    tests train) are listed with --all.

    \b
    Examples:
      recipekit list
      recipekit list hw
      recipekit list model --all
      recipekit list cluster --recipes team-recipes/recipes
    """
    from recipekit.base.errors import Problem
    from recipekit.base.paths import GROUPS
    from recipekit.recipe.compose import check_team_trees
    from recipekit.recipe.team import search_layers

    if group is not None and group not in GROUPS:
        raise RecipeError([Problem("group", f"unknown group {group!r}", hint="groups: " + ", ".join(GROUPS))])
    layers = search_layers(extra_dirs)
    problems = check_team_trees([layer.path for layer in layers])
    if problems:
        raise RecipeError(problems)
    rows = option_rows([group] if group else GROUPS, layers)
    hidden = [row for row in rows if row.option.startswith(TWIN_PREFIX) and not show_all]
    print_groups([row for row in rows if row not in hidden], hidden)


def print_groups(rows: list[OptionRow], hidden: list[OptionRow]) -> None:
    """One table per group: option, where it comes from, description. Option names are never cut (they are what
    `build group=option` takes); where a table is wider than the terminal the "from" column goes first, and is said
    to be gone. Plain text: a team's names and descriptions show as written, never read as rich markup."""
    from recipekit.cli.terminal import fitted_columns, word_table

    console = rich_console()
    headers = ["option", "from", "description"]
    dropped = False
    for group in dict.fromkeys(row.group for row in rows):
        cells = []
        for row in (r for r in rows if r.group == group):
            origin = row.origin + (f" (shadows {', '.join(row.shadows)})" if row.shadows else "")
            note = unsupported_note(row)
            description = row.description + (f" ({note})" if note else "")
            cells.append([row.option + (" *" if row.default else ""), origin, description])
        keep, _ = fitted_columns(headers, cells, width=console.width, drop=(1,))
        dropped = dropped or 1 not in keep
        console.print(word_table(headers, cells, title=group, whole=(0,), width=console.width, drop=(1,)))
    notes = ["* the group's default"]
    if dropped:
        notes.append("where a table was too wide, the from column is left out")
    if hidden:
        notes.append(f"{len(hidden)} test twins (tiny_*) not shown: --all")
    for note in notes:
        console.print(note, markup=False, highlight=False)

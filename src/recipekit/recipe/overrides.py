"""Command-line overrides as a person types them: slips said plainly, and override lists merged key by key.

Hydra's parser answers a ``--nodes 2`` with ``LexerNoViableAltException`` and a bare ``llama3_8b_sft`` with
``missing EQUAL at '<EOF>'``: true, but not what the user meant. :func:`slips` finds those arguments before Hydra
sees them and names the override that was meant (``cluster.nodes=2``, ``recipe=llama3_8b_sft``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Sequence
from functools import cache

from recipekit.base.errors import Problem

_BARE_WORD = re.compile(r"^[A-Za-z0-9_.\-]+$")


@cache
def recipe_keys() -> tuple[str, ...]:
    """Every dotted leaf key the Recipe accepts (for ``mode``, those of every kind)."""
    from recipekit.recipe.schema import field_types, sections_in
    from recipekit.recipe.sections import Recipe

    keys: list[str] = []

    def walk(sections: list[type], prefix: str) -> None:
        for section in sections:
            for name, annotation in field_types(section).items():
                inner = sections_in(annotation)
                if inner:
                    walk(inner, f"{prefix}{name}.")
                elif f"{prefix}{name}" not in keys:
                    keys.append(f"{prefix}{name}")

    walk([Recipe], "")
    return tuple(keys)


def slips(
    arguments: Sequence[str], options_of: Callable[[str], Iterable[str]], groups: Sequence[str]
) -> tuple[list[str], list[Problem]]:
    """``arguments`` less the slips, and a problem for each slip saying which override was meant.

    * ``--name VALUE`` / ``--name=VALUE``: the recipe key whose last part is ``name`` (dashes as underscores);
    * a bare word (no ``=``, no ``~``): ``group=word`` for every group that has an option of that name.
    ``options_of(group)`` lists a group's options (recipekit's and the team layers').
    """
    kept: list[str] = []
    found: list[Problem] = []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        index += 1
        if argument.startswith("-"):
            name, sep, value = argument.lstrip("-").partition("=")
            if not sep and index < len(arguments) and "=" not in arguments[index] and not arguments[index][:1] == "-":
                value, index = arguments[index], index + 1
            found.append(_flag_problem(argument.partition("=")[0], name.replace("-", "_"), value))
        elif "=" not in argument and not argument.startswith("~") and _BARE_WORD.match(argument):
            found.append(_word_problem(argument, options_of, groups))
        else:
            kept.append(argument)
    return kept, found


def _flag_problem(flag: str, name: str, value: str) -> Problem:
    keys = recipe_keys()
    matches = [key for key in keys if key.rsplit(".", 1)[-1] == name]
    if not matches:
        leaves = sorted({key.rsplit(".", 1)[-1] for key in keys})
        close = difflib.get_close_matches(name, leaves, n=1, cutoff=0.75)
        matches = [key for key in keys if close and key.rsplit(".", 1)[-1] == close[0]]
    shown = value or "VALUE"
    if matches:
        meant = " or ".join(f"{key}={shown}" for key in matches)
        return Problem(flag, "not a flag of this command: recipe settings are overrides", hint=f"did you mean {meant}?")
    every = "recipe settings are key=value overrides: recipekit show --compact lists every key"
    return Problem(flag, "not a flag of this command", hint=every)


def _word_problem(word: str, options_of: Callable[[str], Iterable[str]], groups: Sequence[str]) -> Problem:
    meant = [f"{group}={word}" for group in groups if word in set(options_of(group))]
    if meant:
        return Problem(word, "a bare word is not an override", hint=f"did you mean {' or '.join(meant)}?")
    if word in groups:
        return Problem(word, "a group needs an option", hint=f"{word}=OPTION (recipekit list {word})")
    return Problem(word, "not an override", hint="write group=option or key=value (recipekit list, recipekit show)")


def override_key(override: str) -> str:
    """The key an override sets or deletes: ``++a.b=1``, ``~a.b`` and ``a.b=2`` all name ``a.b``."""
    return override.partition("=")[0].lstrip("+~")


def merge(*lists: Sequence[str]) -> list[str]:
    """The overrides of ``lists`` in order, a later one of a key replacing the earlier one in its place.

    What a paste line needs: ``parallel=zero2`` then ``parallel=zero3`` compose to zero3 anyway, but a line that says
    both reads as a contradiction.
    """
    merged: dict[str, str] = {}
    for overrides in lists:
        for override in overrides:
            merged[override_key(override)] = override
    return list(merged.values())

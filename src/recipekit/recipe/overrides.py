"""Command-line overrides as a person types them: each split once, slips said plainly, keys no section has named,
and override lists merged key by key.

Hydra's parser answers a ``--nodes 2`` with ``LexerNoViableAltException`` and a bare ``llama3_8b_sft`` with
``missing EQUAL at '<EOF>'``: true, but not what the user meant. :func:`slips` finds those arguments before Hydra
sees them and names the override that was meant (``cluster.nodes=2``, ``recipe=llama3_8b_sft``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from recipekit.base.errors import Problem

_BARE_WORD = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Override:
    """One override in Hydra's grammar, ``[+|++|~]key[=value]``, split once: every reader of an override's key or
    value asks here."""

    prefix: str  # "", "+" (add), "++" (add or set) or "~" (delete)
    key: str  # the key it sets, adds or deletes: ``++a.b=1``, ``~a.b`` and ``a.b=2`` all name ``a.b``
    value: str | None  # None without "=": a deletion (``~key``) or a bare word

    @classmethod
    def parse(cls, text: str) -> Override:
        head, sep, value = text.partition("=")
        key = head.lstrip("+~")
        return cls(head[: len(head) - len(key)], key, value if sep else None)


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
    return Override.parse(override).key


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


def _section_fields(path: list[str]) -> set[str] | None:
    """The keys the section at ``path`` accepts (for ``mode``, those of every kind); None past a leaf or a dict."""
    from recipekit.recipe.schema import field_types, sections_in
    from recipekit.recipe.sections import Recipe

    sections: list[Any] = [Recipe]
    for part in path:
        found = [field_types(section)[part] for section in sections if part in field_types(section)]
        sections = [inner for annotation in found for inner in sections_in(annotation)]
        if not sections:
            return None
    return {name for section in sections for name in field_types(section)}


def unknown_override_keys(overrides: Sequence[str], groups: Sequence[str]) -> list[tuple[str, Problem]]:
    """(override, problem) for each plain ``key=value`` override whose key no recipe section has.

    Checked against the schema before composing, so a typo is reported with the keys that section does accept, and
    all typos cost no extra composition. ``+key`` (add) and ``~key`` (delete) are left to Hydra and the model, as
    are group choices.
    """
    from recipekit.recipe.schema import unknown_key_hint

    found = []
    for override in overrides:
        parsed = Override.parse(override)
        key = parsed.key
        if parsed.value is None or parsed.prefix or key in groups or re.split(r"[./]", key)[0] == "hydra":
            continue
        path = key.split(".")
        fields = _section_fields(path[:-1])
        if fields is not None and path[-1] not in fields:
            found.append((override, Problem(key, "unknown key", hint=unknown_key_hint(path[-1], list(fields)))))
    return found
